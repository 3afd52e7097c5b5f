package scheduler_test

import (
	"strings"
	"testing"
	"time"

	"github.com/mdag/mdag/scheduler"
)

// With placement's sub-clusters (every model names its GPUs), the nexus
// policy packs each model only onto its own GPUs, and sends each GPU the
// share of the rate placement sized it for (Shares), not an even split.
func TestNexusSubClustersAndShares(t *testing.T) {
	lat := scheduler.LinearLatency(time.Millisecond, 2*time.Millisecond, 8)
	cfg := scheduler.Config{GPUs: []scheduler.GPUID{0, 1, 2}, Models: []scheduler.Model{
		{ID: "a", SLO: 100 * time.Millisecond, Latency: lat, GPUs: []scheduler.GPUID{0, 1}, Rate: 200, Shares: []float64{20, 180}},
		{ID: "b", SLO: 100 * time.Millisecond, Latency: lat, GPUs: []scheduler.GPUID{2}, Rate: 50},
	}}
	s, err := scheduler.New(scheduler.Nexus, cfg)
	if err != nil {
		t.Fatal(err)
	}
	perGPU := map[string]map[scheduler.GPUID]int{"a": {}, "b": {}}
	var running []*scheduler.Action
	id := uint64(0)
	step := time.Millisecond
	for now := time.Duration(0); now < 2*time.Second; now += step {
		for i := 0; i < len(running); i++ { // batches end at earliest + expected
			if a := running[i]; a.Earliest+a.Expected <= now {
				s.Finished(now, a, a.Expected)
				running = append(running[:i], running[i+1:]...)
				i--
			}
		}
		if now%(5*time.Millisecond) == 0 { // a: 200/s
			id++
			s.Arrive(now, scheduler.Request{ID: id, Model: "a", Arrival: now, Deadline: now + 100*time.Millisecond})
		}
		if now%(20*time.Millisecond) == 0 { // b: 50/s
			id++
			s.Arrive(now, scheduler.Request{ID: id, Model: "b", Arrival: now, Deadline: now + 100*time.Millisecond})
		}
		s.Tick(now)
		acts, _ := s.Take()
		for _, a := range acts {
			perGPU[string(a.Model)][a.GPU] += len(a.Requests)
			running = append(running, a)
		}
	}
	a, b := perGPU["a"], perGPU["b"]
	if a[2] != 0 || b[0] != 0 || b[1] != 0 || b[2] == 0 {
		t.Fatalf("requests per GPU: a %v, b %v: each model must stay on its own GPUs", a, b)
	}
	if a[0] == 0 || a[1] < 6*a[0] {
		t.Fatalf("model a's requests per GPU %v: want about 1:9 as placement sized them", a)
	}
	bad := cfg
	bad.Models = []scheduler.Model{cfg.Models[0]}
	bad.Models[0].Shares = []float64{1}
	if _, err := scheduler.New(scheduler.Nexus, bad); err == nil || !strings.Contains(err.Error(), "1 shares for 2 GPUs") {
		t.Fatalf("shares of the wrong length: %v", err)
	}
}
