package coordinator

import (
	"testing"
	"time"

	"github.com/mdag/mdag/allocator/milp"
	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/internal/clock"
)

// startTraffic starts an embedded engine on a fake clock with the traffic
// app deployed (closed when the test ends).
func startTraffic(t *testing.T, cfg Config) (*Engine, *clock.Fake, *dag.App) {
	t.Helper()
	app, prof := loadExample(t, "traffic")
	clk := clock.NewFake(time.Unix(1e9, 0))
	cfg.Clock, cfg.MILPSolver = clk, milp.Solver{}
	e, _ := MustEmbedded(cfg, everyType)
	e.Start()
	t.Cleanup(e.Close)
	if err := e.Deploy(app, prof); err != nil {
		t.Fatal(err)
	}
	return e, clk, app
}

// TestIdleSessionReleasesInstances: once the last stream leaves, the
// session costs nothing at once and its instances are given back when the
// turn-off delay ends (issue 18: $5.80/h with no streams two minutes after
// the last client left).
func TestIdleSessionReleasesInstances(t *testing.T) {
	const turnOff = 30 * time.Second
	e, clk, app := startTraffic(t, Config{TurnOff: turnOff, Epoch: time.Hour})
	for _, id := range []string{"a", "b"} {
		if err := e.Join(app.Name, id); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the plan for two streams", 10*time.Second, func() bool {
		rs := e.Replans()
		return len(rs) > 0 && len(rs[len(rs)-1].Sessions) > 0 && rs[len(rs)-1].Sessions[0].Rate == 2*app.FPS
	})
	st := e.Status()
	if st.Sessions[0].CostWhole == 0 || len(st.Instances) == 0 {
		t.Fatalf("two streams: cost %v, %d instances; want a plan that costs", st.Sessions[0].CostWhole, len(st.Instances))
	}
	for _, id := range []string{"a", "b"} {
		if err := e.Leave(id); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the plan for no streams", 10*time.Second, func() bool {
		rs := e.Replans()
		return len(rs[len(rs)-1].Sessions) > 0 && rs[len(rs)-1].Sessions[0].Reason == "no streams"
	})
	st = e.Status()
	if s := st.Sessions[0]; s.CostWhole != 0 || s.CostFractional != 0 || s.Planned {
		t.Errorf("no streams: session cost %v whole, %v allocated, planned %v; want 0, 0, false", s.CostWhole, s.CostFractional, s.Planned)
	}
	for _, in := range st.Instances {
		if in.State != "warm" || len(in.Modules) > 0 {
			t.Errorf("instance %s is %s with %v after the last stream left", in.ID, in.State, in.Modules)
		}
	}
	// Just before the turn-off delay they are still there (warm, free);
	// just after it they are gone, without waiting for an epoch.
	clk.Advance(turnOff - time.Second)
	e.call(func() {})
	if n := len(e.Status().Instances); n == 0 {
		t.Fatal("instances released before the turn-off delay")
	}
	clk.Advance(2 * time.Second)
	waitFor(t, "the instances to be released", 10*time.Second, func() bool { return len(e.Status().Instances) == 0 })
	rs := e.Replans()
	if last := rs[len(rs)-1]; len(last.Kinds) != 1 || last.Kinds[0] != "turn-off" {
		t.Errorf("release came from %v, want the turn-off trigger", last.Kinds)
	}
	// A stream joining again gets a fresh plan before its frames flow.
	if err := e.Join(app.Name, "c"); err != nil {
		t.Fatal(err)
	}
	if !e.Status().Sessions[0].Planned {
		t.Error("a stream joining an idle session returned before the session had a plan")
	}
}

// TestEpochThatChangesNothing: a periodic check that finds nothing to
// change is not recorded as a re-plan; an event-driven one that changes
// nothing is marked Unchanged.
func TestEpochThatChangesNothing(t *testing.T) {
	e, clk, app := startTraffic(t, Config{Epoch: time.Second})
	if err := e.Join(app.Name, "a"); err != nil {
		t.Fatal(err)
	}
	n := len(e.Replans())
	for range 5 {
		clk.Advance(time.Second)
		waitFor(t, "the epoch check to be applied", 10*time.Second, func() bool {
			var planning bool
			e.call(func() { planning = e.planning || len(e.replanDue) > 0 })
			return !planning
		})
	}
	rs := e.Replans()
	if len(rs) != n {
		for _, r := range rs[n:] {
			t.Errorf("recorded: %+v", r)
		}
	}
	if rs[len(rs)-1].Unchanged {
		t.Errorf("the join's plan is marked unchanged")
	}
}
