package milp_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/mdag/mdag/allocator"
	"github.com/mdag/mdag/allocator/milp"
	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/profile"
)

// genProblem draws a random chain or fork-join of 2-4 modules over 2-3
// worker types with 2-5 configurations per module and worker type.
func genProblem(t *rapid.T) (*dag.Graph, *profile.Catalog, float64) {
	n := rapid.IntRange(2, 4).Draw(t, "modules")
	forkJoin := n >= 3 && rapid.Bool().Draw(t, "forkJoin")
	slo := rapid.IntRange(60, 600).Draw(t, "sloMS")
	var app strings.Builder
	fmt.Fprintf(&app, "app: prop\nslo: %dms\nmodules:\n", slo)
	inputs := make([]string, n)
	for i := range inputs {
		inputs[i] = fmt.Sprintf("m%d", i-1)
	}
	inputs[0] = "source"
	if forkJoin {
		if n == 3 { // source -> m0, source -> m1, (m0, m1) -> m2
			inputs[1], inputs[2] = "source", "m0, m1"
		} else { // m0 -> m1, m0 -> m2, (m1, m2) -> m3
			inputs[2], inputs[3] = "m0", "m1, m2"
		}
	}
	for i := 0; i < n; i++ {
		scale := rapid.SampledFrom([]float64{0.5, 1, 2, 4}).Draw(t, fmt.Sprintf("scale%d", i))
		fmt.Fprintf(&app, "  - {name: m%d, kind: gpu, model: x%d, inputs: [%s], scale: %g}\n", i, i, inputs[i], scale)
	}
	var prof strings.Builder
	workers := rapid.IntRange(2, 3).Draw(t, "workers")
	prof.WriteString("workers:\n")
	for w := 0; w < workers; w++ {
		fmt.Fprintf(&prof, "  - {type: W%d, price: %g}\n", w, float64(rapid.IntRange(100, 400).Draw(t, fmt.Sprintf("price%d", w)))/100)
	}
	prof.WriteString("profiles:\n")
	for i := 0; i < n; i++ {
		for w := 0; w < workers; w++ {
			fmt.Fprintf(&prof, "  - target: m%d\n    worker: W%d\n    points:\n", i, w)
			seen := map[[2]int]bool{}
			for k := 0; k < rapid.IntRange(2, 5).Draw(t, fmt.Sprintf("configs%d.%d", i, w)); k++ {
				b := rapid.SampledFrom([]int{1, 2, 4, 8}).Draw(t, "batch")
				e := rapid.IntRange(1, 2).Draw(t, "concurrency")
				if seen[[2]int{b, e}] {
					continue
				}
				seen[[2]int{b, e}] = true
				lat := rapid.IntRange(2, 80).Draw(t, "latencyMS")
				fmt.Fprintf(&prof, "      - {batch: %d, concurrency: %d, latency: %dms}\n", b, e, lat*b/2+lat)
			}
		}
	}
	a, err := dag.Parse("prop.yaml", []byte(app.String()))
	if err != nil {
		t.Fatalf("%v\n%s", err, app.String())
	}
	pf, err := profile.Parse("prop-profiles.yaml", []byte(prof.String()))
	if err != nil {
		t.Fatalf("%v\n%s", err, prof.String())
	}
	cat, err := profile.Bind(a, pf)
	if err != nil {
		t.Fatal(err)
	}
	g, err := dag.NewGraph(a)
	if err != nil {
		t.Fatal(err)
	}
	return g, cat, float64(rapid.IntRange(5, 300).Draw(t, "rate"))
}

// TestPropertyMILPMatchesBruteForce: on random small chains and fork-joins
// milp's cost equals bruteforce's (1e-6 relative) and meets the SLO on every
// path; greedy, nexus-dp and even never beat milp.
func TestPropertyMILPMatchesBruteForce(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		g, cat, rate := genProblem(t)
		run := func(m allocator.Method) *allocator.Allocation {
			a, err := allocator.Allocate(context.Background(), allocator.Request{Graph: g, Catalog: cat, Rate: rate, Method: m, MILPSolver: milp.Solver{}})
			if errors.Is(err, allocator.ErrTooLarge) {
				return nil
			}
			if err != nil {
				t.Fatalf("%s: %v", m, err)
			}
			return a
		}
		opt := run(allocator.MILP)
		if opt.Feasible {
			checkPaths(t, g, opt)
		}
		if bf := run(allocator.BruteForce); bf != nil {
			if bf.Feasible != opt.Feasible {
				t.Fatalf("bruteforce feasible %v (%s), milp %v (%s)", bf.Feasible, bf.Reason, opt.Feasible, opt.Reason)
			}
			if opt.Feasible && math.Abs(bf.Cost-opt.Cost) > 1e-6*opt.Cost {
				t.Fatalf("bruteforce $%v/h, milp $%v/h", bf.Cost, opt.Cost)
			}
		}
		for _, m := range []allocator.Method{allocator.Greedy, allocator.NexusDP, allocator.Even} {
			a := run(m)
			if !a.Feasible {
				continue
			}
			if !opt.Feasible {
				t.Fatalf("%s found an allocation, milp none: %s", m, opt.Reason)
			}
			checkPaths(t, g, a)
			if a.Cost < opt.Cost*(1-1e-9) {
				t.Fatalf("%s $%v/h beats milp $%v/h", m, a.Cost, opt.Cost)
			}
		}
	})
}

// checkPaths recomputes every path's latency from the allocated instances.
func checkPaths(t *rapid.T, g *dag.Graph, a *allocator.Allocation) {
	lat := map[dag.ModuleID]time.Duration{}
	for _, m := range a.Modules {
		var l time.Duration
		ch := m.Choice
		if ch.N > 0 {
			l = ch.Full.Worst()
		}
		if ch.T > 0 {
			l = max(l, ch.Partial.WorstAt(ch.T))
			if ch.T > ch.Partial.Cap*(1+1e-9) {
				t.Fatalf("%s: partial carries %v over its capacity %v", m.Module, ch.T, ch.Partial.Cap)
			}
		}
		if got := float64(ch.N)*ch.Full.Cap + ch.T; math.Abs(got-m.Rate) > 1e-3*math.Max(1, m.Rate) {
			t.Fatalf("%s: instances carry %v, rate is %v", m.Module, got, m.Rate)
		}
		lat[m.Module] = l
	}
	paths, _ := g.Paths()
	for _, p := range paths {
		var sum time.Duration
		for _, m := range p {
			sum += lat[m]
		}
		if sum > g.App().SLO+time.Microsecond {
			t.Fatalf("%s: path %s takes %v, over the SLO %v", a.Method, p, sum, g.App().SLO)
		}
	}
}
