package scheduler_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/mdag/mdag/scheduler"
)

// BenchmarkThroughput measures the scheduler alone, in-process, with no
// simulator: requests arrive every interval; every action completes at its
// expected time. One op is one request.
//
//	go test ./scheduler -run '^$' -bench BenchmarkThroughput -count 5
func BenchmarkThroughput(b *testing.B) {
	for _, tc := range []struct {
		models, gpus int
	}{{1, 8}, {8, 16}, {35, 64}} {
		for _, p := range []scheduler.Policy{scheduler.Symphony, scheduler.Clockwork} {
			b.Run(fmt.Sprintf("%s/models=%d/gpus=%d", p, tc.models, tc.gpus), func(b *testing.B) {
				cfg := scheduler.Config{}
				for g := 0; g < tc.gpus; g++ {
					cfg.GPUs = append(cfg.GPUs, scheduler.GPUID(g))
				}
				for m := 0; m < tc.models; m++ {
					cfg.Models = append(cfg.Models, scheduler.Model{ID: scheduler.ModelID(fmt.Sprint("m", m)), SLO: 25 * time.Millisecond,
						Latency: scheduler.LinearLatency(1053*time.Microsecond, 5072*time.Microsecond, 32), Rate: 1000})
				}
				s, err := scheduler.New(p, cfg)
				if err != nil {
					b.Fatal(err)
				}
				// Offered load near the cluster's capacity: 8 GPUs carry about
				// 5800 r/s of this model at batch 16.
				interval := time.Duration(float64(time.Second) / (700 * float64(tc.gpus)))
				type running struct {
					a   *scheduler.Action
					end scheduler.Time
				}
				var busy []running
				var now scheduler.Time
				var id uint64
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					now += interval
					for len(busy) > 0 && busy[0].end <= now {
						s.Finished(busy[0].end, busy[0].a, busy[0].a.Expected)
						busy = busy[1:]
					}
					if nx := s.Next(); nx <= now {
						s.Tick(nx)
					}
					id++
					m := cfg.Models[int(id)%tc.models]
					s.Arrive(now, scheduler.Request{ID: id, Model: m.ID, Arrival: now, Deadline: now + m.SLO})
					acts, _ := s.Take()
					for _, a := range acts {
						end := a.Earliest + a.Expected
						j := len(busy)
						for j > 0 && busy[j-1].end > end {
							j--
						}
						busy = append(busy, running{})
						copy(busy[j+1:], busy[j:])
						busy[j] = running{a, end}
					}
				}
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "requests/s")
			})
		}
	}
}
