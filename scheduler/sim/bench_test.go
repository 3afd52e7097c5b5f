package sim_test

import (
	"os"
	"testing"
	"time"

	"github.com/mdag/mdag/scheduler"
	"github.com/mdag/mdag/scheduler/sim"
)

// BenchmarkSimSpeed reports virtual seconds simulated per wall second on the
// 64-GPU mixed zoo at 30000 r/s (Symphony scheduler).
//
//	go test ./scheduler/sim -run '^$' -bench BenchmarkSimSpeed -count 5
func BenchmarkSimSpeed(b *testing.B) {
	data, err := os.ReadFile("../../examples/sim/zoo-64gpu.yaml")
	if err != nil {
		b.Fatal(err)
	}
	w, err := sim.ParseWorkload("zoo.yaml", []byte(replaceLine(string(data), "duration:", "duration: 5s")))
	if err != nil {
		b.Fatal(err)
	}
	var virtual float64
	var events int
	start := time.Now()
	for b.Loop() {
		r, err := sim.Run(w, scheduler.Symphony, 30000)
		if err != nil {
			b.Fatal(err)
		}
		virtual += r.VirtualSeconds
		events += r.Events
	}
	wall := time.Since(start).Seconds()
	b.ReportMetric(virtual/wall, "virtual-s/s")
	b.ReportMetric(float64(events)/wall, "events/s")
}
