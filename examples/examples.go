// Package examples embeds the example applications: the seven Scrooge mDAGs
// of its Figure 1 (traffic, face, tracker, pose, caption, audio, actdet),
// Nexus's traffic and game queries, and Scrooge's worked allocation example
// (scrooge-example). Each lives in examples/<name>/ as app.yaml, profiles.yaml
// and a README.md that says where every number comes from.
package examples

import (
	"embed"
	"io/fs"
	"sort"
	"strings"

	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/profile"
)

//go:embed */app.yaml */profiles.yaml */README.md traces/*.csv
var files embed.FS

// FS holds every example as <name>/app.yaml, <name>/profiles.yaml and
// <name>/README.md.
func FS() fs.FS { return files }

// Names lists the examples, sorted.
func Names() []string {
	entries, _ := fs.ReadDir(files, ".")
	var out []string
	for _, e := range entries {
		if _, err := fs.Stat(files, e.Name()+"/app.yaml"); e.IsDir() && err == nil {
			out = append(out, e.Name())
		}
	}
	sort.Strings(out)
	return out
}

// App returns the app.yaml of an example.
func App(name string) ([]byte, error) { return files.ReadFile(name + "/app.yaml") }

// Traces lists the committed objects-per-frame traces (examples/traces,
// made by `mdag trace`), by file name without ".csv", sorted.
func Traces() []string {
	entries, _ := fs.ReadDir(files, "traces")
	var out []string
	for _, e := range entries {
		if n := e.Name(); strings.HasSuffix(n, ".csv") {
			out = append(out, strings.TrimSuffix(n, ".csv"))
		}
	}
	sort.Strings(out)
	return out
}

// Trace returns a committed trace's CSV (see Traces).
func Trace(name string) ([]byte, error) { return files.ReadFile("traces/" + name + ".csv") }

// Profiles returns the profiles.yaml of an example.
func Profiles(name string) ([]byte, error) { return files.ReadFile(name + "/profiles.yaml") }

// Parse parses an example's app and profiles, with the example's own file
// names in any error.
func Parse(name string) (*dag.App, *profile.File, error) {
	appData, err := App(name)
	if err != nil {
		return nil, nil, err
	}
	app, err := dag.Parse(name+"/app.yaml", appData)
	if err != nil {
		return nil, nil, err
	}
	profData, err := Profiles(name)
	if err != nil {
		return nil, nil, err
	}
	pf, err := profile.Parse(name+"/profiles.yaml", profData)
	return app, pf, err
}

// Load parses an example (Parse), binds it and indexes the graph:
// everything a planner needs.
func Load(name string) (*dag.Graph, *profile.Catalog, error) {
	app, pf, err := Parse(name)
	if err != nil {
		return nil, nil, err
	}
	cat, err := profile.Bind(app, pf)
	if err != nil {
		return nil, nil, err
	}
	g, err := dag.NewGraph(app)
	if err != nil {
		return nil, nil, err
	}
	return g, cat, nil
}
