package scheduler_test

import (
	"testing"
	"time"

	"github.com/mdag/mdag/scheduler"
)

func TestEstimatorAndBallooning(t *testing.T) {
	m := scheduler.Model{ID: "m", SLO: time.Second, Latency: scheduler.LinearLatency(time.Millisecond, 5*time.Millisecond, 8)}
	s, err := scheduler.New(scheduler.Symphony, scheduler.Config{Models: []scheduler.Model{m}, GPUs: []scheduler.GPUID{0}})
	if err != nil {
		t.Fatal(err)
	}
	e := s.Estimator()
	if got := e.Estimate("m", 4); got != 9*time.Millisecond {
		t.Fatalf("unmeasured estimate = %v, want the profile's 9ms", got)
	}
	// Ten measurements at batch 4: the p99 of the last 10 is their maximum.
	for i := 0; i < 10; i++ {
		e.Record("m", 4, time.Duration(10+i)*time.Millisecond)
	}
	if got := e.Estimate("m", 4); got != 19*time.Millisecond {
		t.Errorf("estimate = %v, want 19ms (p99 of the last 10)", got)
	}
	// An unmeasured batch size follows the model's ballooning ratio.
	if r := e.Ratio("m"); r < 1.5 || r > 1.7 {
		t.Errorf("ratio = %v, want about 14.5/9", r)
	}
	if got := e.Estimate("m", 2); got < 10*time.Millisecond || got > 13*time.Millisecond {
		t.Errorf("estimate at batch 2 = %v, want 7ms x ratio", got)
	}
	// Older measurements leave the window.
	for i := 0; i < 10; i++ {
		e.Record("m", 4, 9*time.Millisecond)
	}
	if got := e.Estimate("m", 4); got != 9*time.Millisecond {
		t.Errorf("after 10 new measurements: %v, want 9ms", got)
	}
}

func TestNewErrors(t *testing.T) {
	good := scheduler.Model{ID: "m", SLO: time.Second, Latency: []time.Duration{time.Millisecond}}
	for name, cfg := range map[string]scheduler.Config{
		"no gpus":       {Models: []scheduler.Model{good}},
		"duplicate":     {Models: []scheduler.Model{good, good}, GPUs: []scheduler.GPUID{0}},
		"no slo":        {Models: []scheduler.Model{{ID: "m", Latency: []time.Duration{1}}}, GPUs: []scheduler.GPUID{0}},
		"decreasing":    {Models: []scheduler.Model{{ID: "m", SLO: 1, Latency: []time.Duration{2, 1}}}, GPUs: []scheduler.GPUID{0}},
		"nexus no rate": {Models: []scheduler.Model{good}, GPUs: []scheduler.GPUID{0}},
	} {
		p := scheduler.Symphony
		if name == "nexus no rate" {
			p = scheduler.Nexus
		}
		if _, err := scheduler.New(p, cfg); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := scheduler.New("fifo", scheduler.Config{Models: []scheduler.Model{good}, GPUs: []scheduler.GPUID{0}}); err == nil {
		t.Error("unknown policy accepted")
	}
}

// TestEstimateLeavesOutOneStall: the p99 of the window is its largest
// measurement, unless that one is a stall (more than 1.5x the median):
// then the next largest. Two stalls stay in; a lone measurement is itself.
func TestEstimateLeavesOutOneStall(t *testing.T) {
	m := scheduler.Model{ID: "m", SLO: time.Second, Latency: scheduler.LinearLatency(10*time.Millisecond, 0, 4)}
	s, err := scheduler.New(scheduler.Symphony, scheduler.Config{Models: []scheduler.Model{m}, GPUs: []scheduler.GPUID{0}})
	if err != nil {
		t.Fatal(err)
	}
	e := s.Estimator()
	e.Record("m", 1, 30*time.Millisecond)
	if got := e.Estimate("m", 1); got != 30*time.Millisecond {
		t.Errorf("one measurement: %v, want it (30ms)", got)
	}
	for _, d := range []time.Duration{10, 11, 10, 12} {
		e.Record("m", 1, d*time.Millisecond)
	}
	if got := e.Estimate("m", 1); got != 12*time.Millisecond {
		t.Errorf("one 3x stall among 10-12ms: %v, want 12ms", got)
	}
	e.Record("m", 1, 14*time.Millisecond) // within 1.5x the median: spread, kept
	if got := e.Estimate("m", 1); got != 14*time.Millisecond {
		t.Errorf("a 14ms run: %v, want 14ms", got)
	}
	e.Record("m", 1, 33*time.Millisecond) // a second stall: the model is slow, not unlucky
	if got := e.Estimate("m", 1); got != 30*time.Millisecond {
		t.Errorf("two stalls: %v, want the smaller (30ms)", got)
	}
}
