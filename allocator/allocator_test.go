package allocator_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/mdag/mdag/allocator"
	"github.com/mdag/mdag/allocator/milp"
	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/examples"
	"github.com/mdag/mdag/profile"
)

func loadExample(t testing.TB, name string) (*dag.Graph, *profile.Catalog) {
	t.Helper()
	g, cat, err := examples.Load(name)
	if err != nil {
		t.Fatal(err)
	}
	return g, cat
}

func allocate(t testing.TB, req allocator.Request) *allocator.Allocation {
	t.Helper()
	a, err := allocator.Allocate(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func describe(m allocator.ModuleAllocation) string {
	var parts []string
	for _, in := range m.Allocations {
		kind := "full"
		if in.Partial {
			kind = "partial"
		}
		parts = append(parts, fmt.Sprintf("%s<%d,%d> %s %g", in.Worker, in.Batch, in.Concurrency, kind, in.Rate))
	}
	return strings.Join(parts, " + ")
}

// TestScroogeWorkedExample is Scrooge Section 3.3: $7.5407/h at 273 ms.
func TestScroogeWorkedExample(t *testing.T) {
	g, cat := loadExample(t, "scrooge-example")
	for _, m := range []allocator.Method{allocator.MILP, allocator.BruteForce} {
		a := allocate(t, allocator.Request{Graph: g, Catalog: cat, Rate: 80, Method: m, MILPSolver: milp.Solver{}})
		want := 2 + 3*20.0/81 + 3 + 3*0.6
		if !a.Feasible || math.Abs(a.Cost-want) > 1e-9 || a.CostPerHour != 7.5407 {
			t.Fatalf("%s: cost %v (feasible %v), want %v", m, a.Cost, a.Feasible, want)
		}
		if a.CriticalLatencyMS != 273 || a.SLOMS != 300 {
			t.Errorf("%s: critical %v ms of %v, want 273 of 300", m, a.CriticalLatencyMS, a.SLOMS)
		}
		got := []string{describe(a.Modules[0]), describe(a.Modules[1])}
		want2 := []string{"X<4,2> full 60 + Y<2,1> partial 20", "Y<4,2> full 200 + Y<4,2> partial 120"}
		if got[0] != want2[0] || got[1] != want2[1] {
			t.Errorf("%s: allocations %q, want %q", m, got, want2)
		}
		if in := a.Modules[0].Allocations[1]; in.Instances != 0.2469 || in.LatencyMS != 125 {
			t.Errorf("%s: A's partial %+v, want 0.2469 instances at 125 ms", m, in)
		}
	}
}

// TestNexusLatencySplit is Nexus Figures 3 and 4: X then Y with a 100 ms SLO;
// each model's per-GPU throughput depends on its latency budget. The best
// split depends on gamma, Y's requests per X request.
func TestNexusLatencySplit(t *testing.T) {
	// Figure 3: budget (worst latency) -> throughput. A config with batch b
	// and throughput T has worst latency d + b/T; d is chosen to make that
	// the budget exactly.
	points := func(tput map[int]float64) string {
		var b strings.Builder
		for i, lat := range []int{40, 50, 60} {
			batch := 2 << i
			d := float64(lat) - float64(batch)*1000/tput[lat]
			fmt.Fprintf(&b, "      - {batch: %d, latency: %.6fms, throughput: %g}\n", batch, d, tput[lat])
		}
		return b.String()
	}
	prof := "workers: [{type: G, price: 1}]\nprofiles:\n  - target: X\n    worker: G\n    points:\n" +
		points(map[int]float64{40: 200, 50: 250, 60: 300}) +
		"  - target: Y\n    worker: G\n    points:\n" + points(map[int]float64{40: 300, 50: 400, 60: 500})
	pf, err := profile.Parse("nexus.yaml", []byte(prof))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		gamma   float64
		splitX  float64 // ms
		avgTput float64 // Figure 4
	}{
		{0.1, 60, 272.7},
		{1, 50, 153.8},
		{10, 40, 40.0},
	}
	for _, tt := range tests {
		app, err := dag.Parse("nexus.yaml", []byte(fmt.Sprintf(
			"app: nexus\nslo: 100ms\nmodules:\n  - {name: X, kind: gpu, model: x, inputs: [source], scale: %g}\n  - {name: Y, kind: gpu, model: y, inputs: [X]}\n", tt.gamma)))
		if err != nil {
			t.Fatal(err)
		}
		g, _ := dag.NewGraph(app)
		cat, err := profile.Bind(app, pf)
		if err != nil {
			t.Fatal(err)
		}
		// 60000 requests/s makes every rate an exact multiple of every
		// throughput, so no partial instance blurs the comparison: GPUs =
		// R/T_X + gamma*R/T_Y exactly as in Nexus's analysis.
		const rate = 60000
		for _, m := range []allocator.Method{allocator.NexusDP, allocator.MILP} {
			a := allocate(t, allocator.Request{Graph: g, Catalog: cat, Rate: rate, Method: m, MILPSolver: milp.Solver{}})
			if !a.Feasible {
				t.Fatalf("gamma %g %s: infeasible: %s", tt.gamma, m, a.Reason)
			}
			if a.Modules[0].LatencyMS != tt.splitX || a.Modules[1].LatencyMS != 100-tt.splitX {
				t.Errorf("gamma %g %s: split %v/%v ms, want %v/%v", tt.gamma, m,
					a.Modules[0].LatencyMS, a.Modules[1].LatencyMS, tt.splitX, 100-tt.splitX)
			}
			if avg := rate / a.Cost; math.Abs(avg-tt.avgTput) > 0.05 {
				t.Errorf("gamma %g %s: average throughput %.1f, want %.1f (Figure 4)", tt.gamma, m, avg, tt.avgTput)
			}
		}
	}
}

// TestMonotone re-runs allocation with a worker type excluded (Scrooge
// Section 3.4) and with ballooning: cost never falls.
func TestMonotone(t *testing.T) {
	for _, name := range []string{"traffic", "tracker", "actdet", "scrooge-example"} {
		g, cat := loadExample(t, name)
		rate := g.App().FPS * 12
		if name == "scrooge-example" {
			rate = 80
		}
		base := allocate(t, allocator.Request{Graph: g, Catalog: cat, Rate: rate, MILPSolver: milp.Solver{}})
		if !base.Feasible {
			t.Fatalf("%s: base infeasible: %s", name, base.Reason)
		}
		for _, w := range cat.Workers() {
			a := allocate(t, allocator.Request{Graph: g, Catalog: cat, Rate: rate, Exclude: []profile.WorkerTypeID{w.Type}, MILPSolver: milp.Solver{}})
			if a.Feasible && a.Cost < base.Cost*(1-1e-9) {
				t.Errorf("%s without %s: cost %v below %v", name, w.Type, a.Cost, base.Cost)
			}
		}
		prev := base.Cost
		for _, f := range []float64{1.1, 1.25, 1.5, 2} {
			balloon := map[dag.ModuleID]float64{}
			for _, m := range g.Order() {
				balloon[m] = f
			}
			a := allocate(t, allocator.Request{Graph: g, Catalog: cat, Rate: rate, Balloon: balloon, MILPSolver: milp.Solver{}})
			if !a.Feasible {
				break // so are all larger factors
			}
			if a.Cost < prev*(1-1e-9) {
				t.Errorf("%s ballooned %g: cost %v below %v at the smaller factor", name, f, a.Cost, prev)
			}
			prev = a.Cost
		}
	}
}

// TestBudget: a latency budget below the SLO (the runtime's SLO less the
// ingest delay) binds every path to it and costs no less; one above the SLO
// changes nothing.
func TestBudget(t *testing.T) {
	g, cat := loadExample(t, "traffic")
	full := allocate(t, allocator.Request{Graph: g, Catalog: cat, Rate: 120, MILPSolver: milp.Solver{}})
	tight := allocate(t, allocator.Request{Graph: g, Catalog: cat, Rate: 120, Budget: 300 * time.Millisecond, MILPSolver: milp.Solver{}})
	loose := allocate(t, allocator.Request{Graph: g, Catalog: cat, Rate: 120, Budget: time.Hour, MILPSolver: milp.Solver{}})
	if !full.Feasible || !tight.Feasible {
		t.Fatalf("feasible: full %v (%s), tight %v (%s)", full.Feasible, full.Reason, tight.Feasible, tight.Reason)
	}
	if tight.CriticalLatencyMS > 300 || tight.SLOMS != 300 || tight.Cost < full.Cost {
		t.Errorf("300 ms budget: critical %.2f ms, SLO %.0f ms, cost %.4f (full SLO: %.4f)", tight.CriticalLatencyMS, tight.SLOMS, tight.Cost, full.Cost)
	}
	if loose.Cost != full.Cost || loose.SLOMS != 400 {
		t.Errorf("budget above the SLO: cost %.4f vs %.4f, SLO %.0f", loose.Cost, full.Cost, loose.SLOMS)
	}
	if a := allocate(t, allocator.Request{Graph: g, Catalog: cat, Rate: 120, Budget: 50 * time.Millisecond, MILPSolver: milp.Solver{}}); a.Feasible ||
		!strings.Contains(a.Reason, "above the 50 ms SLO") {
		t.Errorf("50 ms budget: feasible %v, reason %q", a.Feasible, a.Reason)
	}
}

func TestInfeasibleAndBadRequests(t *testing.T) {
	g, cat := loadExample(t, "traffic")
	a := allocate(t, allocator.Request{Graph: g, Catalog: cat, Rate: 5, MILPSolver: milp.Solver{}})
	if a.Feasible || !strings.Contains(a.Reason, "the fastest configurations give 629.73 ms on source->detect->crop-people->face, above the 400 ms SLO") {
		t.Errorf("infeasible reason = %q", a.Reason)
	}
	a = allocate(t, allocator.Request{Graph: g, Catalog: cat, Rate: 100, Exclude: []profile.WorkerTypeID{"P100", "V100"}, MILPSolver: milp.Solver{}})
	if a.Feasible || !strings.Contains(a.Reason, "no configuration left can carry the rate of detect, classify, face") {
		t.Errorf("all GPUs excluded: reason = %q", a.Reason)
	}
	for _, req := range []allocator.Request{
		{Graph: g, Catalog: cat, Rate: 0, MILPSolver: milp.Solver{}},
		{Graph: g, Catalog: cat, Rate: 10, Scale: map[dag.ModuleID]float64{"nope": 2}, MILPSolver: milp.Solver{}},
		{Graph: g, Catalog: cat, Rate: 10, Balloon: map[dag.ModuleID]float64{"detect": 0}, MILPSolver: milp.Solver{}},
		{Graph: g, Catalog: cat, Rate: 10, Exclude: []profile.WorkerTypeID{"TPU"}, MILPSolver: milp.Solver{}},
		{Graph: g, Catalog: cat, Rate: 10, Method: "simplex", MILPSolver: milp.Solver{}},
		{Graph: g, Catalog: cat, Rate: 10, Budget: -time.Millisecond, MILPSolver: milp.Solver{}},
	} {
		if _, err := allocator.Allocate(context.Background(), req); !errors.Is(err, allocator.ErrBadRequest) {
			t.Errorf("request %+v: error %v, want ErrBadRequest", req, err)
		}
	}
	// Eight modules with rich profiles: far more combinations than bruteforce searches.
	var app, prof strings.Builder
	app.WriteString("app: big\nslo: 2s\nmodules:\n")
	prof.WriteString("workers: [{type: X, price: 2}, {type: Y, price: 3}]\nprofiles:\n")
	for i := 0; i < 8; i++ {
		in := "source"
		if i > 0 {
			in = fmt.Sprintf("m%d", i-1)
		}
		fmt.Fprintf(&app, "  - {name: m%d, kind: gpu, model: x, inputs: [%s]}\n", i, in)
	}
	for _, w := range []string{"X", "Y"} {
		fmt.Fprintf(&prof, "  - target: x\n    worker: %s\n    points:\n", w)
		for _, b := range []int{1, 2, 4, 8, 16} {
			for e := 1; e <= 2; e++ {
				fmt.Fprintf(&prof, "      - {batch: %d, concurrency: %d, latency: %dms}\n", b, e, 5+b*3*e+len(w))
			}
		}
	}
	bigApp, err := dag.Parse("big.yaml", []byte(app.String()))
	if err != nil {
		t.Fatal(err)
	}
	bigProf, err := profile.Parse("big-profiles.yaml", []byte(prof.String()))
	if err != nil {
		t.Fatal(err)
	}
	bigCat, err := profile.Bind(bigApp, bigProf)
	if err != nil {
		t.Fatal(err)
	}
	bigG, _ := dag.NewGraph(bigApp)
	_, err = allocator.Allocate(context.Background(), allocator.Request{Graph: bigG, Catalog: bigCat, Rate: 900, Method: allocator.BruteForce})
	if !errors.Is(err, allocator.ErrTooLarge) {
		t.Errorf("bruteforce on 8 modules: %v, want ErrTooLarge", err)
	}
	if a := allocate(t, allocator.Request{Graph: bigG, Catalog: bigCat, Rate: 900, MILPSolver: milp.Solver{}}); !a.Feasible {
		t.Errorf("milp on 8 modules: infeasible: %s", a.Reason)
	}
}

// TestExamples allocates every example with every method at its planning
// rate: milp matches bruteforce wherever bruteforce runs, and no heuristic
// beats milp.
func TestExamples(t *testing.T) {
	for _, name := range examples.Names() {
		t.Run(name, func(t *testing.T) {
			g, cat := loadExample(t, name)
			rate := g.App().FPS * 12
			if name == "scrooge-example" {
				rate = 80
			}
			opt := allocate(t, allocator.Request{Graph: g, Catalog: cat, Rate: rate, MILPSolver: milp.Solver{}})
			if !opt.Feasible {
				t.Fatalf("milp infeasible: %s", opt.Reason)
			}
			if opt.Critical > g.App().SLO {
				t.Fatalf("milp critical latency %v over SLO", opt.Critical)
			}
			for _, m := range allocator.Methods[1:] {
				a, err := allocator.Allocate(context.Background(), allocator.Request{Graph: g, Catalog: cat, Rate: rate, Method: m})
				if errors.Is(err, allocator.ErrTooLarge) {
					continue
				}
				if err != nil {
					t.Fatal(err)
				}
				if !a.Feasible {
					continue
				}
				if a.Critical > g.App().SLO+time.Microsecond {
					t.Errorf("%s breaks the SLO: %v", m, a.Critical)
				}
				if a.Cost < opt.Cost*(1-1e-9) {
					t.Errorf("%s beats milp: %v < %v", m, a.Cost, opt.Cost)
				}
				if m == allocator.BruteForce && math.Abs(a.Cost-opt.Cost) > 1e-9*opt.Cost {
					t.Errorf("bruteforce %v != milp %v", a.Cost, opt.Cost)
				}
			}
		})
	}
}

// usedBy sums the instances of worker type w an allocation takes.
func usedBy(a *allocator.Allocation, w profile.WorkerTypeID) float64 {
	var n float64
	for _, m := range a.Modules {
		for _, in := range m.Allocations {
			if in.Worker == w {
				n += in.Instances
			}
		}
	}
	return n
}

// TestLimits: a capped pool gets the cheapest allocation that fits it, or a
// reason naming the limits; never one that uses more than the pool has.
func TestLimits(t *testing.T) {
	g, cat := loadExample(t, "traffic")
	free := allocate(t, allocator.Request{Graph: g, Catalog: cat, Rate: 80, MILPSolver: milp.Solver{}})
	if !free.Feasible {
		t.Fatalf("unlimited: %s", free.Reason)
	}
	for _, tc := range []struct {
		name     string
		limits   map[profile.WorkerTypeID]float64
		feasible bool
	}{
		{"generous", map[profile.WorkerTypeID]float64{"P100": 100, "V100": 100, "CPU": 100}, true},
		{"one of each", map[profile.WorkerTypeID]float64{"P100": 1, "V100": 1, "CPU": 1}, true},
		{"no P100", map[profile.WorkerTypeID]float64{"P100": 0}, true},
		{"no GPU", map[profile.WorkerTypeID]float64{"P100": 0, "V100": 0}, false},
	} {
		for _, method := range []allocator.Method{allocator.MILP, allocator.Greedy} {
			t.Run(tc.name+"/"+string(method), func(t *testing.T) {
				a := allocate(t, allocator.Request{Graph: g, Catalog: cat, Rate: 80, Limits: tc.limits, Method: method, MILPSolver: milp.Solver{}})
				if method == allocator.MILP && a.Feasible != tc.feasible {
					t.Fatalf("feasible = %v, want %v (%s)", a.Feasible, tc.feasible, a.Reason)
				}
				if !a.Feasible {
					if !strings.Contains(a.Reason, "limit") && !strings.Contains(a.Reason, "exclusions") {
						t.Errorf("reason %q does not say why", a.Reason)
					}
					return
				}
				for w, n := range tc.limits {
					if u := usedBy(a, w); u > n+1e-6 {
						t.Errorf("%s: uses %.3f instances, limit %v", w, u, n)
					}
				}
				if a.Cost < free.Cost-1e-9 {
					t.Errorf("cost %.4f below the unlimited optimum %.4f", a.Cost, free.Cost)
				}
				for _, m := range a.Modules {
					// The MILP is optimal within the limits: no explanation
					// may claim a cheaper option fit both.
					if method == allocator.MILP && strings.Contains(m.Why, "which fits the SLO") {
						t.Errorf("%s: %s", m.Module, m.Why)
					}
				}
			})
		}
	}
	if _, err := allocator.Allocate(context.Background(), allocator.Request{Graph: g, Catalog: cat, Rate: 80,
		Limits: map[profile.WorkerTypeID]float64{"P100": -1}, MILPSolver: milp.Solver{}}); !errors.Is(err, allocator.ErrBadRequest) {
		t.Errorf("negative limit: err = %v, want ErrBadRequest", err)
	}
}

// TestLargestShare: the share found is feasible, a little more is not, and
// a pool with no GPU carries nothing.
func TestLargestShare(t *testing.T) {
	g, cat := loadExample(t, "traffic")
	req := allocator.Request{Graph: g, Catalog: cat, Rate: 120, Limits: map[profile.WorkerTypeID]float64{"P100": 1, "V100": 1, "CPU": 1}, MILPSolver: milp.Solver{}}
	if a := allocate(t, req); a.Feasible {
		t.Fatal("120 frames/s fits one of each: pick a harder case")
	}
	f, a, err := allocator.LargestShare(context.Background(), req, 12)
	if err != nil || a == nil || !a.Feasible || f <= 0 || f >= 1 {
		t.Fatalf("share %v, allocation %v, err %v", f, a, err)
	}
	more := req
	more.Rate = req.Rate * (f + 2.0/4096)
	if a := allocate(t, more); a.Feasible {
		t.Errorf("share %v: %v frames/s is feasible too", f, more.Rate)
	}
	none := req
	none.Limits = map[profile.WorkerTypeID]float64{"P100": 0, "V100": 0}
	if f, a, err := allocator.LargestShare(context.Background(), none, 12); err != nil || f != 0 || a != nil {
		t.Errorf("no GPU: share %v, allocation %v, err %v", f, a, err)
	}
}

// TestNoMILPSolver: the allocator links no MILP solver; a milp request
// without one handed in is an error naming the fix, never a panic, and the
// other methods need none.
func TestNoMILPSolver(t *testing.T) {
	g, cat := loadExample(t, "traffic")
	for _, m := range []allocator.Method{"", allocator.MILP} {
		a, err := allocator.Allocate(context.Background(), allocator.Request{Graph: g, Catalog: cat, Rate: 80, Method: m})
		if !errors.Is(err, allocator.ErrNoMILPSolver) || a != nil {
			t.Fatalf("method %q without a MILP solver: %v, %v; want ErrNoMILPSolver", m, a, err)
		}
		if !strings.Contains(err.Error(), "milp.Solver{}") {
			t.Errorf("the error does not name the fix: %v", err)
		}
	}
	if _, _, err := allocator.LargestShare(context.Background(), allocator.Request{Graph: g, Catalog: cat, Rate: 80}, 4); !errors.Is(err, allocator.ErrNoMILPSolver) {
		t.Errorf("LargestShare without a MILP solver: %v", err)
	}
	for _, m := range allocator.Methods[1:] {
		if _, err := allocator.Allocate(context.Background(), allocator.Request{Graph: g, Catalog: cat, Rate: 80, Method: m}); err != nil {
			t.Errorf("%s without a MILP solver: %v", m, err)
		}
	}
}
