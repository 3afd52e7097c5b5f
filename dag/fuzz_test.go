package dag_test

import (
	"io/fs"
	"strings"
	"testing"

	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/examples"
)

// FuzzParseApp feeds arbitrary documents to the app loader: it must never
// panic, and whatever it accepts must validate and index as a graph.
func FuzzParseApp(f *testing.F) {
	err := fs.WalkDir(examples.FS(), ".", func(path string, d fs.DirEntry, err error) error {
		if err == nil && strings.HasSuffix(path, "app.yaml") {
			data, _ := fs.ReadFile(examples.FS(), path)
			f.Add(data)
		}
		return err
	})
	if err != nil {
		f.Fatal(err)
	}
	f.Add([]byte("app: a\nslo: 1s\nmodules:\n  - {name: x, kind: cpu, op: count, inputs: [source, x]}\n"))
	f.Add([]byte("a: &a [*a]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		app, err := dag.Parse("fuzz.yaml", data)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("empty error message")
			}
			return
		}
		g, err := dag.NewGraph(app)
		if err != nil {
			t.Fatalf("Parse accepted an app NewGraph rejects: %v", err)
		}
		if len(g.Order()) != len(app.Modules) {
			t.Fatalf("order has %d modules, app %d", len(g.Order()), len(app.Modules))
		}
		_, _ = g.Paths()
		_ = g.Shape()
		_ = g.Rates(10, nil)
	})
}
