package dag_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/internal/yamlx"
)

const validApp = `app: t
slo: 400ms
modules:
  - name: detect
    kind: gpu
    model: ssd
    inputs: [source]
    scale: 4
  - name: crop
    kind: cpu
    op: crop
    inputs: [detect]
`

func TestParseValid(t *testing.T) {
	app, err := dag.Parse("app.yaml", []byte(validApp))
	if err != nil {
		t.Fatal(err)
	}
	if app.Media != dag.Video {
		t.Errorf("media default = %q, want video", app.Media)
	}
	crop, _ := app.Module("crop")
	if crop.Scale != 1 {
		t.Errorf("scale default = %g, want 1", crop.Scale)
	}
}

// TestParseErrors checks every problem the loader and validator report, with
// file, line and field path, and that all problems come at once.
func TestParseErrors(t *testing.T) {
	tests := []struct {
		name string
		doc  string
		want []string // each must appear as one line of the error
	}{
		{"unknown top-level key", "app: t\nslo: 1s\nmodulez: []\n", []string{
			`app.yaml:3: modulez: unknown field "modulez" (did you mean "modules"?)`,
			"app.yaml:1: modules: required: at least one module"}},
		{"unknown module key", "app: t\nslo: 1s\nmodules:\n  - name: a\n    kind: cpu\n    op: count\n    inputs: [source]\n    colour: red\n",
			[]string{`app.yaml:8: modules[0].colour: unknown field "colour" (known fields: name, kind, model, op, inputs, scale, stateful, params)`}},
		{"wrong type", "app: t\nslo: 1s\nmodules:\n  - name: a\n    kind: cpu\n    op: count\n    inputs: source\n",
			[]string{`app.yaml:7: modules[0].inputs: want a list, got "source"`}},
		{"bad duration", "app: t\nslo: fast\nmodules:\n  - {name: a, kind: cpu, op: count, inputs: [source]}\n",
			[]string{`app.yaml:2: slo: want a duration such as 400ms or 1.5s, got "fast"`}},
		{"duration without unit", "app: t\nslo: 400\nmodules:\n  - {name: a, kind: cpu, op: count, inputs: [source]}\n",
			[]string{`app.yaml:2: slo: want a duration with a unit such as 400ms, got 400`}},
		{"scale not a number", "app: t\nslo: 1s\nmodules:\n  - {name: a, kind: cpu, op: count, inputs: [source], scale: lots}\n",
			[]string{`app.yaml:4: modules[0].scale: want a number, got "lots"`}},
		{"duplicate key", "app: t\napp: u\nslo: 1s\nmodules:\n  - {name: a, kind: cpu, op: count, inputs: [source]}\n",
			[]string{`app.yaml:2: app: duplicate field "app"`}},
		{"syntax error", "app: t\nslo: 1s\n  modules: x\n",
			[]string{"app.yaml:3: invalid YAML: mapping values are not allowed in this context"}},
		{"empty", "", []string{"app.yaml: empty document"}},
		{"warm without fps", "app: t\nslo: 1s\nwarm: 2\nmodules:\n  - {name: a, kind: cpu, op: count, inputs: [source]}\n",
			[]string{"app.yaml:3: warm: needs fps: the rate each stream kept warm is planned at"}},
		{"warm negative", "app: t\nslo: 1s\nfps: 5\nwarm: -1\nmodules:\n  - {name: a, kind: cpu, op: count, inputs: [source]}\n",
			[]string{"app.yaml:4: warm: must be 0 to 1000 streams, got -1"}},
		{"two documents", "app: t\n---\napp: u\n", []string{"app.yaml:2: more than one YAML document; put one document per file"}},
		{"missing required", "media: film\n", []string{
			"app.yaml:1: media: must be video or audio, got \"film\"",
			"app.yaml:1: app: required: the application name",
			"app.yaml:1: slo: required: the end-to-end latency objective, e.g. 400ms",
			"app.yaml:1: modules: required: at least one module"}},
		{"slo negative and bad name", "app: Traffic_1\nslo: -1s\nmodules:\n  - {name: a, kind: cpu, op: count, inputs: [source]}\n", []string{
			`app.yaml:1: app: name "Traffic_1" must match [a-z0-9-]+`,
			"app.yaml:2: slo: must be positive, got -1s"}},
		{"duplicate module", validApp + "  - name: crop\n    kind: cpu\n    op: count\n    inputs: [detect]\n",
			[]string{`app.yaml:13: modules[2].name: duplicate module name "crop" (first defined at modules[1])`}},
		{"unknown input", strings.Replace(validApp, "inputs: [detect]", "inputs: [detector]", 1),
			[]string{`app.yaml:12: modules[1].inputs[0]: unknown module "detector" (did you mean "detect"?)`}},
		{"gpu without model, cpu without op, unknown kind", `app: t
slo: 1s
modules:
  - {name: a, kind: gpu, inputs: [source]}
  - {name: b, kind: cpu, inputs: [a]}
  - {name: c, kind: cpu, op: blur, inputs: [a]}
  - {name: d, kind: tpu, inputs: [a]}
`, []string{
			"app.yaml:4: modules[0].model: required for gpu modules: the model whose profiles apply",
			"app.yaml:5: modules[1].op: required for cpu modules: one of activity, annotate, count, crop, haar-face, hog-people, letterbox, motion, place, resize, segment, sequence, sink, text-crop, track, window",
			`app.yaml:6: modules[2].op: unknown op "blur" (known: activity, annotate, count, crop, haar-face, hog-people, letterbox, motion, place, resize, segment, sequence, sink, text-crop, track, window)`,
			`app.yaml:7: modules[3].kind: must be cpu or gpu, got "tpu"`}},
		{"op and model on the wrong kind", `app: t
slo: 1s
modules:
  - {name: a, kind: gpu, model: m, op: crop, inputs: [source]}
  - {name: b, kind: cpu, op: count, model: m, inputs: [a]}
`, []string{
			"app.yaml:4: modules[0].op: only cpu modules name an op; gpu modules name a model",
			"app.yaml:5: modules[1].model: only gpu modules name a model; cpu modules name an op"}},
		{"unknown param", strings.Replace(validApp, "inputs: [detect]\n", "inputs: [detect]\n    params: {padding: 3}\n", 1),
			[]string{`app.yaml:13: modules[1].params.padding: op crop takes no param "padding" (known: pad, classes, min_score)`}},
		{"negative scale", strings.Replace(validApp, "scale: 4", "scale: -2", 1),
			[]string{"app.yaml:8: modules[0].scale: must be >= 0 (items emitted per input item), got -2"}},
		{"cycle", `app: t
slo: 1s
modules:
  - {name: a, kind: cpu, op: count, inputs: [source, c]}
  - {name: b, kind: cpu, op: count, inputs: [a]}
  - {name: c, kind: cpu, op: count, inputs: [b]}
  - {name: d, kind: cpu, op: count, inputs: [b]}
`, []string{"app.yaml:4: modules[0].inputs: cycle: a -> b -> c -> a"}},
		{"cycle without sink", `app: t
slo: 1s
modules:
  - {name: a, kind: cpu, op: count, inputs: [source, b]}
  - {name: b, kind: cpu, op: count, inputs: [a]}
`, []string{
			"app.yaml:3: modules: no sink: every module feeds another, so no result leaves the graph",
			"app.yaml:4: modules[0].inputs: cycle: a -> b -> a"}},
		{"self loop", "app: t\nslo: 1s\nmodules:\n  - {name: a, kind: cpu, op: count, inputs: [source, a]}\n",
			[]string{"app.yaml:4: modules[0].inputs[1]: cycle: a -> a (a module cannot consume its own output)"}},
		{"nothing reads source", "app: t\nslo: 1s\nmodules:\n  - {name: a, kind: cpu, op: count, inputs: [b]}\n  - {name: b, kind: cpu, op: count, inputs: [a]}\n",
			[]string{`app.yaml:3: modules: no module reads "source": nothing would receive the client stream`}},
		{"unreachable island", `app: t
slo: 1s
modules:
  - {name: a, kind: cpu, op: count, inputs: [source]}
  - {name: b, kind: cpu, op: count, inputs: []}
`, []string{
			`app.yaml:5: modules[1].inputs: required: "source" for the client stream, or names of modules`,
			`app.yaml:5: modules[1]: module "b" is not reachable from "source"`}},
		{"reserved and bad names", "app: t\nslo: 1s\nmodules:\n  - {name: source, kind: cpu, op: count, inputs: [source]}\n  - {name: 'a b', kind: cpu, op: count, inputs: [source]}\n", []string{
			`app.yaml:4: modules[0].name: "source" is reserved for the client stream`,
			`app.yaml:5: modules[1].name: name "a b" must match [A-Za-z0-9_-]+`}},
		{"input listed twice", "app: t\nslo: 1s\nmodules:\n  - {name: a, kind: cpu, op: count, inputs: [source, source]}\n",
			[]string{`app.yaml:4: modules[0].inputs[1]: input "source" listed twice`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := dag.Parse("app.yaml", []byte(tt.doc))
			if err == nil {
				t.Fatal("Parse succeeded, want errors")
			}
			var list yamlx.ErrorList
			if !errors.As(err, &list) {
				t.Fatalf("error %T is not a yamlx.ErrorList: %v", err, err)
			}
			got := strings.Split(err.Error(), "\n")
			for _, w := range tt.want {
				found := false
				for _, g := range got {
					if g == w {
						found = true
					}
				}
				if !found {
					t.Errorf("missing error line\n  %s\ngot:\n  %s", w, strings.Join(got, "\n  "))
				}
			}
			if len(got) != len(tt.want) {
				t.Errorf("got %d problems, want %d:\n  %s", len(got), len(tt.want), strings.Join(got, "\n  "))
			}
		})
	}
}

func TestValidateInCode(t *testing.T) {
	app := &dag.App{Name: "x", SLO: 0, Media: dag.Video, Modules: []dag.Module{{Name: "a", Kind: dag.CPU, Op: "count", Inputs: []dag.ModuleID{dag.Source}, Scale: 1}}}
	err := app.Validate()
	if err == nil || err.Error() != "slo: required: the end-to-end latency objective, e.g. 400ms" {
		t.Fatalf("Validate() = %v", err)
	}
	if _, err := dag.NewGraph(app); !errors.Is(err, dag.ErrInvalid) {
		t.Fatalf("NewGraph error = %v, want ErrInvalid", err)
	}
}
