package placement_test

import (
	"context"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"pgregory.net/rapid"

	"github.com/mdag/mdag/allocator"
	"github.com/mdag/mdag/allocator/milp"
	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/examples"
	"github.com/mdag/mdag/placement"
	"github.com/mdag/mdag/profile"
)

var t0 = time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)

func demandsFor(t testing.TB, name string, rate float64, exclude ...profile.WorkerTypeID) ([]placement.Demand, map[profile.WorkerTypeID]float64) {
	t.Helper()
	g, cat, err := examples.Load(name)
	if err != nil {
		t.Fatal(err)
	}
	a, err := allocator.Allocate(context.Background(), allocator.Request{Graph: g, Catalog: cat, Rate: rate, Exclude: exclude, MILPSolver: milp.Solver{}})
	if err != nil || !a.Feasible {
		t.Fatalf("allocate %s: %v %v", name, err, a)
	}
	prices := map[profile.WorkerTypeID]float64{}
	for _, w := range cat.Workers() {
		prices[w.Type] = w.Price
	}
	return placement.Demands(g.App(), a), prices
}

// TestScroogeExample: A's partial (Y, 20/81) and B's partial (Y, 120/200)
// share one Y instance: X + Y + Y, $8/h in whole instances.
func TestScroogeExample(t *testing.T) {
	demands, prices := demandsFor(t, "scrooge-example", 80)
	plan := placement.Place(placement.Snapshot{Now: t0, Prices: prices}, demands)
	var got []string
	for _, in := range plan.Instances {
		s := string(in.Type) + ":"
		for _, l := range in.Loads {
			s += fmt.Sprintf(" %s(%.4f)", l.Module, l.Fraction)
		}
		got = append(got, s)
	}
	want := []string{"X: A(1.0000)", "Y: B(1.0000)", "Y: B(0.6000) A(0.2469)"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("instances (-want +got):\n%s", diff)
	}
	if plan.CostWhole != 8 || math.Abs(plan.CostFractional-7.5407) > 1e-4 {
		t.Errorf("cost whole %v, fractional %v; want 8 and 7.5407", plan.CostWhole, plan.CostFractional)
	}
}

// TestIncrementalUnchanged: placing the same demands on the plan's own
// result moves nothing.
func TestIncrementalUnchanged(t *testing.T) {
	for _, name := range []string{"scrooge-example", "traffic", "actdet"} {
		rate := 80.0
		if name != "scrooge-example" {
			rate = 120
		}
		demands, prices := demandsFor(t, name, rate)
		first := placement.Place(placement.Snapshot{Now: t0, Prices: prices}, demands)
		again := placement.Place(placement.Snapshot{Now: t0.Add(time.Second), Prices: prices, Instances: first.Instances}, demands)
		if len(again.Moves) != 0 {
			t.Errorf("%s: unchanged input moved: %+v", name, again.Moves)
		}
		if again.CostWhole != first.CostWhole {
			t.Errorf("%s: cost %v then %v", name, first.CostWhole, again.CostWhole)
		}
	}
}

// TestWarmPool: when load drops an instance goes warm for the turn-off
// delay; when load returns within it the warm instance is reused; after it
// the instance is released.
func TestWarmPool(t *testing.T) {
	high, prices := demandsFor(t, "tracker", 15*24)
	low, _ := demandsFor(t, "tracker", 15*4)
	snap := placement.Snapshot{Now: t0, Prices: prices, TurnOffDelay: 30 * time.Second}
	p1 := placement.Place(snap, high)
	snap.Now, snap.Instances = t0.Add(time.Minute), p1.Instances
	p2 := placement.Place(snap, low)
	warm := 0
	for _, in := range p2.Instances {
		if in.State == placement.Warm {
			warm++
			if !in.ReleaseAt.Equal(snap.Now.Add(30 * time.Second)) {
				t.Errorf("%s release at %v, want now + 30s", in.ID, in.ReleaseAt)
			}
		}
	}
	if warm == 0 || count(p2.Moves, placement.StopInstance) != warm {
		t.Fatalf("load dropped: %d warm instances, moves %+v", warm, p2.Moves)
	}
	snap.Now, snap.Instances = snap.Now.Add(10*time.Second), p2.Instances
	p3 := placement.Place(snap, high)
	if count(p3.Moves, placement.ReuseWarm) == 0 || count(p3.Moves, placement.StartInstance) > count(p1.Moves, placement.StartInstance)-warm {
		t.Errorf("load back within the delay: moves %+v, want warm instances reused first", p3.Moves)
	}
	snap.Now, snap.Instances = snap.Now.Add(time.Minute), p2.Instances
	p4 := placement.Place(snap, low)
	if count(p4.Moves, placement.ReleaseInstance) != warm {
		t.Errorf("after the delay: %d releases, want %d", count(p4.Moves, placement.ReleaseInstance), warm)
	}
	for _, in := range p4.Instances {
		if in.State == placement.Warm {
			t.Errorf("%s still warm after its delay", in.ID)
		}
	}
}

func count(moves []placement.Move, k placement.MoveKind) int {
	n := 0
	for _, m := range moves {
		if m.Kind == k {
			n++
		}
	}
	return n
}

// TestLimitsShortage: a type at its limit is reported, and re-allocating
// without it places everything.
func TestLimitsShortage(t *testing.T) {
	demands, prices := demandsFor(t, "scrooge-example", 80)
	snap := placement.Snapshot{Now: t0, Prices: prices, Limits: map[profile.WorkerTypeID]int{"Y": 1}}
	plan := placement.Place(snap, demands)
	if len(plan.Shortages) != 1 || plan.Shortages[0].Type != "Y" || plan.Shortages[0].Needed != 1 {
		t.Fatalf("shortages %+v, want Y short by 1", plan.Shortages)
	}
	demands, _ = demandsFor(t, "scrooge-example", 80, "Y")
	plan = placement.Place(snap, demands)
	if len(plan.Shortages) != 0 || plan.CostWhole != 2*4+2 && plan.CostWhole == 0 {
		t.Errorf("without Y: shortages %+v cost %v", plan.Shortages, plan.CostWhole)
	}
}

// TestStatefulMigration: moving a stateful module says so.
func TestStatefulMigration(t *testing.T) {
	demands, prices := demandsFor(t, "tracker", 180)
	first := placement.Place(placement.Snapshot{Now: t0, Prices: prices}, demands)
	// Another app fills the instance that holds "track": track must move.
	var snapInst []placement.Instance
	for _, in := range first.Instances {
		for _, l := range in.Loads {
			if l.Module == "track" {
				in.Loads = append(in.Loads, placement.Load{App: "other", Module: "big", Fraction: 1 - l.Fraction + 0.001})
				break
			}
		}
		snapInst = append(snapInst, in)
	}
	plan := placement.Place(placement.Snapshot{Now: t0.Add(time.Second), Prices: prices, Instances: snapInst}, demands)
	found := false
	for _, m := range plan.Moves {
		if m.Kind == placement.MigrateState && m.Module == "track" && m.From != "" {
			found = true
		}
	}
	if !found {
		t.Errorf("stateful track moved without a migrate move: %+v", plan.Moves)
	}
}

// TestOtherAppsUntouched: loads of apps not being placed stay as they are
// and their share of an instance is respected.
func TestOtherAppsUntouched(t *testing.T) {
	demands, prices := demandsFor(t, "scrooge-example", 80)
	other := placement.Instance{ID: "Y-7", Type: "Y", State: placement.Active,
		Loads: []placement.Load{{App: "other", Module: "m", Rate: 50, Fraction: 0.7}}}
	plan := placement.Place(placement.Snapshot{Now: t0, Prices: prices, Instances: []placement.Instance{other}}, demands)
	for _, in := range plan.Instances {
		if in.ID == "Y-7" {
			if len(in.Loads) < 1 || in.Loads[0].App != "other" || in.Used() > 1+1e-9 {
				t.Errorf("Y-7 = %+v", in)
			}
		}
	}
}

// TestPlaceProperties: on random demands over several apps, no instance is
// over capacity, every module's rate is fully placed, the plan is
// deterministic, and re-placing it moves nothing.
func TestPlaceProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		types := []profile.WorkerTypeID{"X", "Y", "Z"}
		prices := map[profile.WorkerTypeID]float64{"X": 1, "Y": 2, "Z": 3}
		var demands []placement.Demand
		want := map[string]float64{}
		for a := 0; a < rapid.IntRange(1, 3).Draw(t, "apps"); a++ {
			for m := 0; m < rapid.IntRange(1, 4).Draw(t, "modules"); m++ {
				cfg := func(label string) profile.Config {
					return profile.Config{Worker: rapid.SampledFrom(types).Draw(t, label+"type"),
						Batch: rapid.IntRange(1, 8).Draw(t, label+"batch"), Concurrency: 1,
						Latency: time.Millisecond, Cap: float64(rapid.IntRange(10, 200).Draw(t, label+"cap"))}
				}
				ch := profile.Choice{N: rapid.IntRange(0, 3).Draw(t, "n")}
				ch.Full = cfg("full")
				if ch.N == 0 || rapid.Bool().Draw(t, "partial") {
					ch.Partial = cfg("partial")
					ch.T = ch.Partial.Cap * rapid.Float64Range(0.01, 1).Draw(t, "frac")
				}
				d := placement.Demand{App: dag.AppID(fmt.Sprint("app", a)), Module: dag.ModuleID(fmt.Sprint("m", m)), Choice: ch}
				demands = append(demands, d)
				want[string(d.App)+"/"+string(d.Module)] = float64(ch.N)*ch.Full.Cap + ch.T
			}
		}
		snap := placement.Snapshot{Now: t0, Prices: prices}
		plan := placement.Place(snap, demands)
		got := map[string]float64{}
		for _, in := range plan.Instances {
			if in.Used() > 1+1e-9 {
				t.Fatalf("%s over capacity: %v", in.ID, in.Used())
			}
			for _, l := range in.Loads {
				got[string(l.App)+"/"+string(l.Module)] += l.Rate
				if l.Full && len(in.Loads) != 1 {
					t.Fatalf("%s: a full allocation shares the instance: %+v", in.ID, in.Loads)
				}
			}
		}
		for k, r := range want {
			if math.Abs(got[k]-r) > 1e-6*math.Max(1, r) {
				t.Fatalf("%s: placed %v of %v", k, got[k], r)
			}
		}
		if diff := cmp.Diff(plan, placement.Place(snap, demands)); diff != "" {
			t.Fatalf("not deterministic:\n%s", diff)
		}
		snap.Instances = plan.Instances
		if again := placement.Place(snap, demands); len(again.Moves) != 0 {
			t.Fatalf("unchanged input moved: %+v", again.Moves)
		}
	})
}

// TestPlaceIdleApp: an app with no streams loses its loads (its instances
// stop and wait warm), while an app left out of the demands keeps them.
func TestPlaceIdleApp(t *testing.T) {
	now := time.Unix(0, 0)
	snap := placement.Snapshot{Now: now, Prices: map[profile.WorkerTypeID]float64{"G": 1}, Instances: []placement.Instance{
		{ID: "g1", Type: "G", State: placement.Active, Loads: []placement.Load{{App: "idle", Module: "m", Full: true, Fraction: 1}}},
		{ID: "g2", Type: "G", State: placement.Active, Loads: []placement.Load{{App: "other", Module: "m", Full: true, Fraction: 1}}},
	}}
	snap.Idle = []dag.AppID{"idle"}
	p := placement.Place(snap, nil)
	for _, in := range p.Instances {
		switch in.ID {
		case "g1":
			if in.State != placement.Warm || len(in.Loads) != 0 {
				t.Errorf("idle app's instance: %s with %v, want warm and empty", in.State, in.Loads)
			}
		case "g2":
			if in.State != placement.Active || len(in.Loads) != 1 {
				t.Errorf("unplanned app's instance: %s with %v, want it kept", in.State, in.Loads)
			}
		}
	}
	if p.CostWhole != 1 {
		t.Errorf("cost %v, want 1 (only the kept instance)", p.CostWhole)
	}
}

// TestPlacementCostRatio prints Scrooge placement's whole-instance cost over
// the allocator's fractional cost for every example at 12 streams:
//
//	go test ./placement -run TestPlacementCostRatio -v
func TestPlacementCostRatio(t *testing.T) {
	for _, name := range examples.Names() {
		g, cat, err := examples.Load(name)
		if err != nil {
			t.Fatal(err)
		}
		rate := 12 * g.App().FPS
		if name == "scrooge-example" {
			rate = g.App().FPS
		}
		a, err := allocator.Allocate(context.Background(), allocator.Request{Graph: g, Catalog: cat, Rate: rate, MILPSolver: milp.Solver{}})
		if err != nil || !a.Feasible {
			t.Fatalf("%s: %v %v", name, err, a)
		}
		prices := map[profile.WorkerTypeID]float64{}
		for _, w := range cat.Workers() {
			prices[w.Type] = w.Price
		}
		plan := placement.Place(placement.Snapshot{Now: time.Unix(0, 0), Prices: prices}, placement.Demands(g.App(), a))
		active := 0
		for _, in := range plan.Instances {
			if in.State != placement.Warm {
				active++
			}
		}
		if plan.CostWhole < plan.CostFractional-1e-9 {
			t.Errorf("%s: whole-instance cost %v below the fractional %v", name, plan.CostWhole, plan.CostFractional)
		}
		t.Logf("| %s | %d | %.4f | %.4f | %.3f |", name, active, plan.CostFractional, plan.CostWhole, plan.CostWhole/plan.CostFractional)
	}
}

// partial is a demand for a partial allocation of rate on a CPU instance
// of capacity 100/s.
func partial(module dag.ModuleID, stateful bool, rate float64) placement.Demand {
	return placement.Demand{App: "a", Module: module, Stateful: stateful,
		Choice: profile.Choice{T: rate, Partial: profile.Config{Module: module, Worker: "CPU", Batch: 1, Concurrency: 1, Cap: 100}}}
}

// TestStatefulKeptFirst: when two modules shared an instance and only one
// still fits there, the stateful one stays (moving it moves its streams'
// state) and the stateless one, though larger, moves.
func TestStatefulKeptFirst(t *testing.T) {
	before := []placement.Instance{{ID: "CPU-0", Type: "CPU", State: placement.Active, Loads: []placement.Load{
		{App: "a", Module: "track", Fraction: 0.4, Rate: 40, Batch: 1, Concurrency: 1, Stateful: true},
		{App: "a", Module: "crop", Fraction: 0.5, Rate: 50, Batch: 1, Concurrency: 1}}, Loaded: []dag.ModuleID{"track", "crop"}}}
	plan := placement.Place(placement.Snapshot{Now: t0, Instances: before, Prices: map[profile.WorkerTypeID]float64{"CPU": 1}},
		[]placement.Demand{partial("track", true, 40), partial("crop", false, 70)})
	where := map[dag.ModuleID]placement.InstanceID{}
	for _, in := range plan.Instances {
		for _, l := range in.Loads {
			where[l.Module] = in.ID
		}
	}
	if where["track"] != "CPU-0" || where["crop"] == "CPU-0" || where["crop"] == "" {
		t.Fatalf("track on %q, crop on %q: want track kept on CPU-0 and crop moved", where["track"], where["crop"])
	}
	for _, m := range plan.Moves {
		if m.Kind == placement.MigrateState {
			t.Errorf("a migrate move: %+v", m)
		}
	}
}

// TestDrainingInstance: a draining instance takes no loads; its loads move
// (the stateful one with a migrate move), it stays in the plan, draining,
// and counts towards its type's limit.
func TestDrainingInstance(t *testing.T) {
	before := []placement.Instance{{ID: "CPU-0", Type: "CPU", State: placement.Draining, Loads: []placement.Load{
		{App: "a", Module: "track", Fraction: 0.4, Rate: 40, Batch: 1, Concurrency: 1, Stateful: true}}, Loaded: []dag.ModuleID{"track"}}}
	snap := placement.Snapshot{Now: t0, Instances: before, Prices: map[profile.WorkerTypeID]float64{"CPU": 1}}
	plan := placement.Place(snap, []placement.Demand{partial("track", true, 40)})
	var kinds []placement.MoveKind
	for _, m := range plan.Moves {
		kinds = append(kinds, m.Kind)
	}
	if len(plan.Instances) != 2 || plan.Instances[0].State != placement.Draining || len(plan.Instances[0].Loads) != 0 ||
		len(plan.Instances[1].Loads) != 1 {
		t.Fatalf("instances %+v (moves %v): want CPU-0 draining and empty, track on a new one", plan.Instances, kinds)
	}
	if fmt.Sprint(kinds) != "[start load migrate unload]" {
		t.Errorf("moves %v", kinds)
	}
	if plan.CostWhole != 1 {
		t.Errorf("whole cost %v: a draining instance serves nothing", plan.CostWhole)
	}
	snap.Limits = map[profile.WorkerTypeID]int{"CPU": 1}
	if plan := placement.Place(snap, []placement.Demand{partial("track", true, 40)}); len(plan.Shortages) != 1 {
		t.Errorf("with a limit of 1 the draining instance leaves no room: shortages %+v", plan.Shortages)
	}
}

// TestNextID: a new instance's ID numbers from Snapshot.NextID when that
// is past the snapshot's own highest (IDs of instances gone are not given
// again), from one past the highest otherwise.
func TestNextID(t *testing.T) {
	cpu1 := []placement.Instance{{ID: "CPU-1", Type: "CPU", State: placement.Active}}
	cases := []struct {
		name   string
		before []placement.Instance
		next   map[profile.WorkerTypeID]int
		want   placement.InstanceID
	}{
		{"none", nil, nil, "CPU-0"},
		{"past the snapshot", cpu1, nil, "CPU-2"},
		{"NextID higher", cpu1, map[profile.WorkerTypeID]int{"CPU": 7}, "CPU-7"},
		{"NextID lower", cpu1, map[profile.WorkerTypeID]int{"CPU": 1}, "CPU-2"},
		{"NextID of another type", nil, map[profile.WorkerTypeID]int{"GPU": 7}, "CPU-0"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// The existing instance is full: the demand needs a new one.
			before := slices.Clone(c.before)
			for i := range before {
				before[i].Loads = []placement.Load{{App: "b", Module: "x", Fraction: 1, Rate: 100, Batch: 1, Concurrency: 1}}
			}
			plan := placement.Place(placement.Snapshot{Now: t0, Instances: before, NextID: c.next, Prices: map[profile.WorkerTypeID]float64{"CPU": 1}},
				[]placement.Demand{partial("crop", false, 50)})
			var started []placement.InstanceID
			for _, m := range plan.Moves {
				if m.Kind == placement.StartInstance {
					started = append(started, m.Instance)
				}
			}
			if len(started) != 1 || started[0] != c.want {
				t.Fatalf("started %v, want [%s]", started, c.want)
			}
		})
	}
}
