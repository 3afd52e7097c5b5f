package coordinator

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/mdag/mdag/allocator/milp"
	"github.com/mdag/mdag/ingest/synth"
	"github.com/mdag/mdag/internal/clock"
)

// TestStreamsJoinAndLeave is Scrooge Section 4.2's traffic workload shape:
// 12 streams join and leave at random times, each at 2-5 fps, on emulated
// GPUs. It checks behaviour, not speed: every frame is accounted for (sent
// = finished + late + dropped, none open), no frame is dropped for want of
// a route while streams come and go (only deadline drops), and most
// complete. The finish rate (>= 97% on an idle machine) is
// BenchmarkStreamsJoinAndLeave's figure.
func TestStreamsJoinAndLeave(t *testing.T) {
	if testing.Short() {
		t.Skip("runs ~8 s of live streams")
	}
	start := time.Now()
	st, replans := runJoinAndLeave(t)
	tot := st.Total
	if tot.Finished+tot.Late+tot.Dropped != tot.Sent || tot.Sent == 0 {
		t.Fatalf("accounting: %+v", tot)
	}
	checkMostComplete(t, "totals", tot)
	checkRouted(t, "totals", st.Drops)
	t.Logf("%v: %d frames, finish rate %.4f, p50 %.1f ms, p99 %.1f ms, %d re-plans, drops %v",
		time.Since(start).Round(time.Millisecond), tot.Sent, tot.FinishRate(), st.P50MS, st.P99MS, replans, st.Drops)
}

// runJoinAndLeave runs TestStreamsJoinAndLeave's workload (a fixed seed)
// until every frame has ended; it returns the session's status and the
// number of re-plans.
func runJoinAndLeave(tb testing.TB) (SessionStatus, int) {
	app, prof := loadExample(tb, "traffic")
	e, _ := MustEmbedded(Config{MILPSolver: milp.Solver{}}, everyType)
	e.Start()
	defer e.Close()
	if err := e.Deploy(app, prof); err != nil {
		tb.Fatal(err)
	}
	pat, _ := synth.NewPattern(320, 240, 3)
	rng := rand.New(rand.NewPCG(42, 7))
	const span = 6 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for i := range 12 {
		join := time.Duration(rng.Int64N(int64(span / 2)))
		stay := span/4 + time.Duration(rng.Int64N(int64(span/2)))
		fps := float64(2 + rng.IntN(4))
		id := fmt.Sprintf("cam-%02d", i)
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case <-time.After(join): // the workload's schedule, not a wait for logic
			case <-ctx.Done():
				return
			}
			if err := e.Join(app.Name, id); err != nil {
				tb.Error(err)
				return
			}
			sctx, stop := context.WithTimeout(ctx, stay)
			defer stop()
			if err := pat.Generate(sctx, clock.Real{}, i, id, fps, 0, e.Ingest); err != nil {
				tb.Error(err)
			}
			if err := e.Leave(id); err != nil {
				tb.Error(err)
			}
		}()
	}
	wg.Wait()
	waitFor(tb, "every frame to end", 20*time.Second, func() bool { return e.Status().Sessions[0].Open == 0 })
	return e.Status().Sessions[0], len(e.Replans())
}
