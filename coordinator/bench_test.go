package coordinator

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/mdag/mdag/allocator/milp"
	"github.com/mdag/mdag/internal/testapps"
	"github.com/mdag/mdag/media"
	"github.com/mdag/mdag/observe/metrics"
	"github.com/mdag/mdag/profile"
)

func startChain(b *testing.B, n int, onFrame func(FrameResult), mx *metrics.Metrics) *Engine {
	app, prof, err := testapps.NoopChain(n)
	if err != nil {
		b.Fatal(err)
	}
	e, _ := mustEmbedded(b, Config{MILPSolver: milp.Solver{}, OnFrame: onFrame, Observer: Observe(mx)}, map[profile.WorkerTypeID]int{"CPU": 1})
	e.Start()
	if err := e.Deploy(app, prof); err != nil {
		b.Fatal(err)
	}
	if err := e.Join("chain", "s"); err != nil {
		b.Fatal(err)
	}
	return e
}

// BenchmarkHopLatency sends one frame at a time through chains of 1 and 5
// no-op modules in one process; the difference per extra module is the
// cost of one in-process hop (coordinator loop -> worker pool -> loop).
func BenchmarkHopLatency(b *testing.B) {
	for _, n := range []int{1, 5} {
		b.Run(fmt.Sprintf("modules-%d", n), func(b *testing.B) {
			done := make(chan time.Duration, 1)
			e := startChain(b, n, func(r FrameResult) { done <- r.Latency }, nil)
			defer e.Close()
			f := media.NewFrame(32, 32)
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := range b.N {
				if err := e.Ingest("s", uint64(i), time.Now(), f, nil); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, <-done)
			}
			b.StopTimer()
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-us")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-us")
		})
	}
}

// BenchmarkWorkerThroughput pushes frames through a 3-module no-op chain
// on one in-process worker as fast as they are accepted: the frame rate
// one worker (and the coordinator loop) sustains, without and with the
// Prometheus metrics (their cost on the loop's hot path).
func BenchmarkWorkerThroughput(b *testing.B) {
	for _, on := range []bool{false, true} {
		b.Run(fmt.Sprintf("metrics=%v", on), func(b *testing.B) {
			var mx *metrics.Metrics
			if on {
				mx = metrics.New(false)
			}
			workerThroughput(b, mx)
		})
	}
}

func workerThroughput(b *testing.B, mx *metrics.Metrics) {
	done := make(chan struct{}, 1<<20)
	e := startChain(b, 3, func(r FrameResult) { done <- struct{}{} }, mx)
	defer e.Close()
	f := media.NewFrame(32, 32)
	b.ResetTimer()
	start := time.Now()
	for i := range b.N {
		if err := e.Ingest("s", uint64(i), time.Now(), f, nil); err != nil {
			b.Fatal(err)
		}
	}
	for range b.N {
		<-done
	}
	el := time.Since(start).Seconds()
	st := e.Status().Sessions[0].Total
	b.ReportMetric(float64(st.Finished)/el, "finished-frames/s")
	b.ReportMetric(float64(st.Dropped)/float64(st.Sent), "drop-fraction") // back-pressure: full queues
}

// The workload tests run on the fake clock and check behaviour; their
// speed figures are these benchmarks, each iteration one run of the test's
// workload live (a workload from live: the real clock, seconds of live
// streams). Run one on demand, e.g.
//
//	go test -run '^$' -bench BenchmarkStreamsJoinAndLeave -benchtime 1x -count 5 ./coordinator

// BenchmarkEveryFrame is TestEveryFrameAccounted's figure: the finish rate
// of three pattern streams of 30 frames at 10 fps on emulated GPUs.
func BenchmarkEveryFrame(b *testing.B) {
	for range b.N {
		st := runEveryFrame(b, live(b), nil)
		b.ReportMetric(st.Total.FinishRate()*100, "finish-%")
		b.ReportMetric(st.P99MS, "p99-ms")
	}
}

// BenchmarkStreamsJoinAndLeave is TestStreamsJoinAndLeave's figure: the
// finish rate of 12 streams joining and leaving at 2-5 fps (Scrooge 4.2's
// shape; >= 97% on an idle machine).
func BenchmarkStreamsJoinAndLeave(b *testing.B) {
	for range b.N {
		st, _ := runJoinAndLeave(b, live(b))
		b.ReportMetric(st.Total.FinishRate()*100, "finish-%")
		b.ReportMetric(st.P99MS, "p99-ms")
	}
}

// BenchmarkAdaptation is TestAdaptation's figures per jump: how long the
// re-plan took after it (<= 2 s expected) and the finish rate of the three
// complete windows starting a second after the re-plan (>= 95% expected).
func BenchmarkAdaptation(b *testing.B) {
	for _, tc := range adaptCases {
		b.Run(tc.expect, func(b *testing.B) {
			for range b.N {
				a := runAdaptation(b, live(b), tc, nil)
				b.ReportMetric(float64(a.delay.Milliseconds()), "replan-ms")
				b.ReportMetric(a.finishRate()*100, "finish-%")
			}
		})
	}
}

// BenchmarkFactorsLeaveWithStreams is TestFactorsLeaveWithStreams's
// figure: the finish rate of the 30 frames of the stream that joins after
// the one that taught stale factors left (>= 90% expected).
func BenchmarkFactorsLeaveWithStreams(b *testing.B) {
	for range b.N {
		f := runFactorsLeave(b, live(b), nil)
		b.ReportMetric(f.next.FinishRate()*100, "finish-%")
	}
}

// BenchmarkMigrationPause is TestStatefulMigrationOnDrain's figure on the
// real clock: how long each stream's frames wait at the tracker while its
// state (4 KiB) moves between in-process instances after a drain: p50 and
// p99 over the streams (pause-ms).
func BenchmarkMigrationPause(b *testing.B) {
	for _, n := range []int{4, 16} {
		b.Run(fmt.Sprintf("streams=%d", n), func(b *testing.B) {
			var all []time.Duration
			for range b.N {
				m := runMigration(b, live(b), &ledger{pad: 4 << 10}, n)
				all = append(all, m.pauses...)
			}
			slices.Sort(all)
			b.ReportMetric(float64(all[len(all)/2].Microseconds())/1000, "p50-pause-ms")
			b.ReportMetric(float64(all[len(all)*99/100].Microseconds())/1000, "p99-pause-ms")
		})
	}
}
