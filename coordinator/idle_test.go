package coordinator

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/mdag/mdag/dag"
)

// startTraffic starts an embedded engine on the fake clock (a fakeRun:
// call it inside synctest.Test) with the traffic app deployed.
func startTraffic(t *testing.T, cfg Config) (*fakeRun, *dag.App) {
	t.Helper()
	app, prof := loadExample(t, "traffic")
	f := startFake(t, cfg, everyType)
	if err := f.e.Deploy(app, prof); err != nil {
		t.Fatal(err)
	}
	return f, app
}

// TestIdleSessionReleasesInstances: once the last stream leaves, the
// session costs nothing at once and its instances are given back when the
// turn-off delay ends (issue 18: $5.80/h with no streams two minutes after
// the last client left).
func TestIdleSessionReleasesInstances(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const turnOff = 30 * time.Second
		f, app := startTraffic(t, Config{TurnOff: turnOff, Epoch: time.Hour})
		e := f.e
		for _, id := range []string{"a", "b"} {
			if err := e.Join(app.Name, id); err != nil {
				t.Fatal(err)
			}
		}
		f.settle()
		rs := e.Replans()
		if last := rs[len(rs)-1]; len(last.Sessions) == 0 || last.Sessions[0].Rate != 2*app.FPS {
			t.Fatalf("the last re-plan is not for two streams: %+v", last)
		}
		st := e.Status()
		if st.Sessions[0].CostWhole == 0 || len(st.Instances) == 0 {
			t.Fatalf("two streams: cost %v, %d instances; want a plan that costs", st.Sessions[0].CostWhole, len(st.Instances))
		}
		for _, id := range []string{"a", "b"} {
			if err := e.Leave(id); err != nil {
				t.Fatal(err)
			}
		}
		f.settle()
		rs = e.Replans()
		if last := rs[len(rs)-1]; len(last.Sessions) == 0 || last.Sessions[0].Reason != "no streams" {
			t.Fatalf("the last re-plan is not the plan for no streams: %+v", last)
		}
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
		f.advance(turnOff - time.Second)
		if n := len(e.Status().Instances); n == 0 {
			t.Fatal("instances released before the turn-off delay")
		}
		f.advance(2 * time.Second)
		if n := len(e.Status().Instances); n != 0 {
			t.Fatalf("%d instances left a second after the turn-off delay", n)
		}
		rs = e.Replans()
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
	})
}

// TestEpochThatChangesNothing: a periodic check that finds nothing to
// change is not recorded as a re-plan; an event-driven one that changes
// nothing is marked Unchanged.
func TestEpochThatChangesNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, app := startTraffic(t, Config{Epoch: time.Second})
		if err := f.e.Join(app.Name, "a"); err != nil {
			t.Fatal(err)
		}
		f.settle()
		n := len(f.e.Replans())
		for range 5 {
			f.advance(time.Second) // an epoch check, planned and applied
		}
		if n := f.rec.triggered("epoch"); n != 5 {
			t.Errorf("%d epoch checks in 5 s, want 5", n)
		}
		rs := f.e.Replans()
		if len(rs) != n {
			for _, r := range rs[n:] {
				t.Errorf("recorded: %+v", r)
			}
		}
		if rs[len(rs)-1].Unchanged {
			t.Errorf("the join's plan is marked unchanged")
		}
	})
}
