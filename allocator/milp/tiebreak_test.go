package milp_test

import (
	"context"
	"testing"

	"github.com/mdag/mdag/allocator"
	"github.com/mdag/mdag/allocator/milp"
	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/profile"
)

// TestTieBreakLowerLatency: A -> B where {A 10 ms $1, B 15 ms $0.5} and
// {A 20 ms $0.5, B 10 ms $1} both cost $1.5/h; the SLO (30 ms) admits both.
// The allocation must take the one with the lower critical latency (25 ms).
func TestTieBreakLowerLatency(t *testing.T) {
	app, err := dag.Parse("tie.yaml", []byte(`app: tie
slo: 30ms
modules:
  - {name: A, kind: gpu, model: a, inputs: [source]}
  - {name: B, kind: gpu, model: b, inputs: [A]}
`))
	if err != nil {
		t.Fatal(err)
	}
	// Batch 1 at 200/s waits 5 ms for its batch: worst latency d + 5 ms.
	pf, err := profile.Parse("tie-profiles.yaml", []byte(`workers: [{type: X, price: 1}, {type: Y, price: 0.5}]
profiles:
  - {target: A, worker: X, points: [{batch: 1, latency: 5ms, throughput: 200}]}
  - {target: A, worker: Y, points: [{batch: 1, latency: 15ms, throughput: 200}]}
  - {target: B, worker: X, points: [{batch: 1, latency: 5ms, throughput: 200}]}
  - {target: B, worker: Y, points: [{batch: 1, latency: 10ms, throughput: 200}]}
`))
	if err != nil {
		t.Fatal(err)
	}
	cat, err := profile.Bind(app, pf)
	if err != nil {
		t.Fatal(err)
	}
	g, _ := dag.NewGraph(app)
	for _, m := range []allocator.Method{allocator.MILP, allocator.BruteForce} {
		a, err := allocator.Allocate(context.Background(), allocator.Request{Graph: g, Catalog: cat, Rate: 200, Method: m, MILPSolver: milp.Solver{}})
		if err != nil {
			t.Fatal(err)
		}
		if a.CostPerHour != 1.5 || a.CriticalLatencyMS != 25 {
			t.Errorf("%s: $%v/h at %v ms, want $1.5/h at 25 ms (the faster of the two cheapest)", m, a.CostPerHour, a.CriticalLatencyMS)
		}
	}
}
