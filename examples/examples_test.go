package examples_test

import (
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/examples"
	"github.com/mdag/mdag/examples/internal/zoo"
	"github.com/mdag/mdag/profile"
)

var update = flag.Bool("update", false, "regenerate the zoo examples' profiles.yaml and README.md")

// TestZooFilesUpToDate regenerates every zoo example's profiles and README
// from examples/internal/zoo and fails if the committed files differ.
func TestZooFilesUpToDate(t *testing.T) {
	for name, meta := range zoo.Examples {
		t.Run(name, func(t *testing.T) {
			app, err := dag.Load(filepath.Join(name, "app.yaml"))
			if err != nil {
				t.Fatal(err)
			}
			prof, err := zoo.Profiles(app)
			if err != nil {
				t.Fatal(err)
			}
			want := map[string]string{
				"profiles.yaml": prof,
				"README.md":     zoo.Readme(app, meta.Title, meta.About),
			}
			for file, content := range want {
				path := filepath.Join(name, file)
				if *update {
					if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
						t.Fatal(err)
					}
					continue
				}
				got, err := os.ReadFile(path)
				if err != nil {
					t.Fatalf("%v (run go test ./examples -update)", err)
				}
				if diff := cmp.Diff(content, string(got)); diff != "" {
					t.Errorf("%s is stale; run go test ./examples -update (-generated +file):\n%s", path, diff)
				}
			}
		})
	}
}

// TestExamplesLoadAndAreFeasible loads every embedded example, binds its
// profiles and checks the fastest configurations meet its SLO at its fps.
func TestExamplesLoadAndAreFeasible(t *testing.T) {
	names := examples.Names()
	if len(names) != len(zoo.Examples)+4 {
		t.Fatalf("examples %v: want the %d zoo examples, scrooge-example, face-live, gpu-check and text-reader", names, len(zoo.Examples))
	}
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			g, cat, err := examples.Load(name)
			if err != nil {
				t.Fatal(err)
			}
			app := g.App()
			if app.FPS <= 0 {
				t.Fatalf("example %s sets no fps", name)
			}
			// Feasible for one stream and for a session of PlanningStreams streams
			// (scrooge-example's fps already is its session's 80 frames/s).
			// gpu-check is for many streams (50 ms SLO at 30 frames/s: one
			// stream's frames are 33 ms apart, more than a module may wait
			// to gather a batch): its check's smallest load is 8.
			for _, streams := range []float64{1, zoo.PlanningStreams} {
				if name == "scrooge-example" && streams > 1 {
					continue
				}
				if name == "gpu-check" && streams < 8 {
					streams = 8
				}
				rates := g.Rates(streams*app.FPS, nil)
				lat := map[dag.ModuleID]time.Duration{}
				for _, m := range g.Order() {
					ch, ok := profile.Fastest(cat.Configs(m), rates[m])
					if !ok {
						t.Fatalf("%g streams: module %s cannot carry %g/s", streams, m, rates[m])
					}
					lat[m] = ch.Latency
				}
				path, crit := g.CriticalPath(func(m dag.ModuleID) time.Duration { return lat[m] })
				if crit > app.SLO {
					t.Errorf("%g streams: fastest critical path %v on %s exceeds SLO %v", streams, crit, path, app.SLO)
				}
			}
		})
	}
}
