package engine

import (
	"strings"
	"testing"
	"time"

	"github.com/mdag/mdag/dag"
)

func TestDetector(t *testing.T) {
	t0 := time.Unix(1000, 0)
	win := 250 * time.Millisecond
	type step struct {
		obs  map[dag.ModuleID]Observation
		want string // substring of the trigger's reason; "" = no trigger
	}
	crop := func(done, out int) map[dag.ModuleID]Observation {
		return map[dag.ModuleID]Observation{"crop": {In: done, Done: done, Out: out}}
	}
	gpu := func(b float64) map[dag.ModuleID]Observation {
		return map[dag.ModuleID]Observation{"detect": {In: 10, Done: 10, Out: 10, Balloon: b}}
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"steady: no trigger", []step{{crop(10, 40), ""}, {crop(10, 41), ""}, {crop(10, 39), ""}, {crop(10, 40), ""}, {crop(10, 40), ""}}},
		{"one odd window is noise (hysteresis)", []step{{crop(10, 40), ""}, {crop(10, 40), ""}, {crop(10, 80), ""}, {crop(10, 40), ""}, {crop(10, 40), ""}}},
		{"sustained jump triggers after two windows", []step{{crop(10, 40), ""}, {crop(10, 40), ""}, {crop(10, 80), ""}, {crop(10, 80), "crop scale 4 -> "}}},
		{"too few items do not count", []step{{crop(3, 30), ""}, {crop(3, 30), ""}, {crop(3, 30), ""}, {crop(3, 30), ""}, {crop(3, 30), ""}}},
		{"no objects to eight", []step{{crop(10, 40), ""}, {crop(10, 40), ""}, {crop(10, 0), ""}, {crop(10, 0), "crop scale 4 -> "}}},
		{"not before the minimum interval", []step{{crop(10, 80), ""}, {crop(10, 80), ""}, {crop(10, 80), ""}, {crop(10, 80), "crop scale"}}},
		{"faster than profiled is not ballooning", []step{{gpu(0.3), ""}, {gpu(0.3), ""}, {gpu(0.3), ""}, {gpu(0.3), ""}, {gpu(0.3), ""}}},
		{"1.5x slower balloons", []step{{gpu(1), ""}, {gpu(1), ""}, {gpu(1.5), ""}, {gpu(1.5), "detect balloon 1 -> "}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := NewDetector(AdaptConfig{Window: win})
			d.Planned(t0, map[dag.ModuleID]float64{"crop": 4, "detect": 1}, nil)
			now := t0
			for i, s := range tc.steps {
				now = now.Add(win)
				tr, ok := d.Observe(now, s.obs)
				if s.want == "" && ok {
					t.Fatalf("step %d: unexpected trigger %q", i, tr.Reason)
				}
				if s.want != "" && (!ok || !strings.Contains(tr.Reason, s.want)) {
					t.Fatalf("step %d: got %v %q, want a trigger containing %q", i, ok, tr.Reason, s.want)
				}
			}
		})
	}
}

func TestDetectorTriggerCarriesFactors(t *testing.T) {
	t0 := time.Unix(1000, 0)
	d := NewDetector(AdaptConfig{})
	d.Planned(t0, map[dag.ModuleID]float64{"crop": 4}, nil)
	var tr Trigger
	var ok bool
	for i := 1; i <= 8 && !ok; i++ {
		tr, ok = d.Observe(t0.Add(time.Duration(i)*250*time.Millisecond), map[dag.ModuleID]Observation{"crop": {In: 10, Done: 10, Out: 80}})
	}
	if !ok || tr.Scale["crop"] < 7 || tr.Scale["crop"] > 8 {
		t.Fatalf("trigger %v %+v: want crop scale near 8", ok, tr)
	}
}

// TestDetectorRideAlong: a slowdown reaches two modules a window apart. The
// re-plan the first one triggers carries the second's factor too, and the
// factor planned for a slowdown is the worst window, not the mean.
func TestDetectorRideAlong(t *testing.T) {
	t0 := time.Unix(1000, 0)
	d := NewDetector(AdaptConfig{})
	d.Planned(t0, map[dag.ModuleID]float64{"detect": 1, "face": 1}, nil)
	obs := func(detect, face float64) map[dag.ModuleID]Observation {
		return map[dag.ModuleID]Observation{"detect": {In: 10, Done: 10, Out: 10, Balloon: detect}, "face": {In: 10, Done: 10, Out: 10, Balloon: face}}
	}
	steps := []map[dag.ModuleID]Observation{obs(1, 1), obs(1, 1), obs(1, 1), obs(1.3, 1), obs(1.5, 1.5)}
	var tr Trigger
	var ok bool
	for i, o := range steps {
		tr, ok = d.Observe(t0.Add(time.Duration(i+1)*250*time.Millisecond), o)
		if ok && i < len(steps)-1 {
			t.Fatalf("step %d: early trigger %q", i, tr.Reason)
		}
	}
	if !ok {
		t.Fatal("no trigger")
	}
	if tr.Balloon["detect"] != 1.5 || tr.Balloon["face"] != 1.5 {
		t.Errorf("balloon %v: want detect 1.5 (worst of 1.3, 1.5) and face 1.5 (riding along)", tr.Balloon)
	}
	if !strings.Contains(tr.Reason, "detect balloon 1 -> 1.5") || !strings.Contains(tr.Reason, "with face balloon -> 1.5 (1 window)") {
		t.Errorf("reason %q", tr.Reason)
	}
}
