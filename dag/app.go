// Package dag holds the mDAG model: the application YAML schema, its strict
// loading with file:line errors, validation that reports every problem at
// once, and the graph algorithms the planners build on (topological order,
// source-to-sink paths, tree and fork-join structure, critical path and rate
// propagation).
//
// The package is a leaf: it imports no other mdag package except the op
// registry in modules and the YAML helper in internal/yamlx.
package dag

import (
	"os"
	"time"

	"github.com/mdag/mdag/internal/yamlx"
)

// AppID names an application.
type AppID string

// ModuleID names a module within an application.
type ModuleID string

// Source is the reserved input name meaning "the client stream".
const Source ModuleID = "source"

// Kind says where a module runs.
type Kind string

const (
	CPU Kind = "cpu"
	GPU Kind = "gpu"
)

// Media is the kind of stream an application consumes.
type Media string

const (
	Video Media = "video"
	Audio Media = "audio"
)

// App is one media DAG as declared in YAML.
type App struct {
	Name  AppID         `yaml:"app" json:"app"`
	SLO   time.Duration `yaml:"slo" json:"slo"`
	Media Media         `yaml:"media" json:"media"`
	FPS   float64       `yaml:"fps" json:"fps,omitempty"`
	// Warm is how many streams the app keeps capacity planned, loaded
	// and warmed up for while fewer are connected (each at FPS): the
	// first camera finds warm instances instead of waiting out a model's
	// cold first batches. 0 (the default): instances start with the
	// streams and stop after them.
	Warm    int      `yaml:"warm" json:"warm,omitempty"`
	Modules []Module `yaml:"modules" json:"modules"`
	// Outputs are where the app's results go besides the stream's own
	// client: MQTT, NATS, webhooks (outputs.go).
	Outputs []Output `yaml:"outputs" json:"outputs,omitempty"`
	// Clips writes MP4 clips of each stream around its events (clips.go).
	Clips *Clips `yaml:"clips" json:"clips,omitempty"`

	// File is the path the app was loaded from ("" when built in code).
	File string `yaml:"-" json:"-"`
	pos  *yamlx.Positions
}

// SetDefaults implements yamlx.Defaulter.
func (a *App) SetDefaults() { a.Media = Video }

// Module is one vertex of the mDAG.
type Module struct {
	Name     ModuleID       `yaml:"name" json:"name"`
	Kind     Kind           `yaml:"kind" json:"kind"`
	Model    string         `yaml:"model" json:"model,omitempty"`
	Op       string         `yaml:"op" json:"op,omitempty"`
	Inputs   []ModuleID     `yaml:"inputs" json:"inputs"`
	Scale    float64        `yaml:"scale" json:"scale"`
	Stateful bool           `yaml:"stateful" json:"stateful,omitempty"`
	Params   map[string]any `yaml:"params" json:"params,omitempty"`
}

// SetDefaults implements yamlx.Defaulter.
func (m *Module) SetDefaults() { m.Scale = 1 }

// Module returns the module with the given name.
func (a *App) Module(name ModuleID) (*Module, bool) {
	for i := range a.Modules {
		if a.Modules[i].Name == name {
			return &a.Modules[i], true
		}
	}
	return nil, false
}

// Positions returns where each field path of the app was found in its file
// (nil for apps built in code).
func (a *App) Positions() *yamlx.Positions { return a.pos }

// Load reads, decodes and validates an application file.
func Load(path string) (*App, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(path, data)
}

// Parse decodes and validates an application document. On failure the error
// is a yamlx.ErrorList holding every problem found, decoding and validation
// alike, each with file:line and field path.
func Parse(file string, data []byte) (*App, error) {
	var app App
	pos, errs := yamlx.Decode(file, data, &app)
	app.File, app.pos = file, pos
	if len(errs) > 0 && len(app.Modules) == 0 && app.Name == "" && app.SLO == 0 {
		return nil, errs.Err() // nothing usable was decoded; validation would only add noise
	}
	errs = errs.Merge(app.validate(len(errs) > 0))
	if err := errs.Err(); err != nil {
		return nil, err
	}
	return &app, nil
}
