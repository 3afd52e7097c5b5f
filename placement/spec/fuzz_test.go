package spec_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/mdag/mdag/placement/spec"
	"github.com/mdag/mdag/placement/squishy"
	"github.com/mdag/mdag/profile"
)

func seed(f *testing.F, files ...string) {
	for _, name := range files {
		data, err := os.ReadFile(filepath.Join("..", "..", "examples", "placement", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
}

// FuzzParseSessions: the sessions loader never panics, and what it accepts
// packs without panicking into GPUs whose batches fit their duty cycles.
func FuzzParseSessions(f *testing.F) {
	seed(f, "nexus-table2.yaml", "symphony-zoo.yaml")
	f.Fuzz(func(t *testing.T, data []byte) {
		sessions, opt, err := spec.ParseSessions("fuzz.yaml", data)
		if err != nil || len(sessions) > 50 {
			return
		}
		for _, s := range sessions {
			if s.Rate > 1e6 || len(s.Profile.Batches) > 256 {
				return
			}
		}
		res := squishy.Pack(sessions, opt)
		for _, g := range res.GPUs {
			var sum time.Duration
			for _, a := range g.Sessions {
				sum += a.Latency
			}
			if !g.Saturated && sum > g.DutyCycle {
				t.Fatalf("GPU %d: batches %v over duty cycle %v", g.ID, sum, g.DutyCycle)
			}
		}
	})
}

// FuzzParseCluster: the cluster loader never panics and rejects instances
// over capacity.
func FuzzParseCluster(f *testing.F) {
	seed(f, "cluster.yaml", "cluster-short.yaml")
	workers := []profile.WorkerType{{Type: "X", Price: 2}, {Type: "Y", Price: 3}}
	f.Fuzz(func(t *testing.T, data []byte) {
		snap, err := spec.ParseCluster("fuzz.yaml", data, time.Unix(0, 0), workers)
		if err != nil {
			return
		}
		for _, in := range snap.Instances {
			if in.Used() > 1+1e-9 {
				t.Fatalf("accepted %s over capacity: %v", in.ID, in.Used())
			}
		}
	})
}

// FuzzParseModels: the models loader never panics.
func FuzzParseModels(f *testing.F) {
	seed(f, "symphony-models.yaml")
	f.Fuzz(func(t *testing.T, data []byte) {
		req, err := spec.ParseModels("fuzz.yaml", data)
		if err != nil {
			return
		}
		for _, m := range req.Models {
			if m.Rate < 0 || m.Current < -1 {
				t.Fatalf("accepted %+v", m)
			}
		}
	})
}
