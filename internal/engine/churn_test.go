package engine

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/mdag/mdag/ingest"
	"github.com/mdag/mdag/internal/clock"
)

// TestStreamsJoinAndLeave is Scrooge Section 4.2's traffic workload shape:
// 12 streams join and leave at random times, each at 2-5 fps, on emulated
// GPUs; every frame is accounted for and >= 97% finish within the SLO.
func TestStreamsJoinAndLeave(t *testing.T) {
	if testing.Short() {
		t.Skip("runs ~8 s of live streams")
	}
	app, prof := loadExample(t, "traffic")
	e, _ := NewEmbedded(Config{}, everyType)
	e.Start()
	defer e.Close()
	if err := e.Deploy(app, prof); err != nil {
		t.Fatal(err)
	}
	pat, _ := ingest.NewPattern(320, 240, 3)
	rng := rand.New(rand.NewPCG(42, 7))
	const span = 6 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	start := time.Now()
	for i := range 12 {
		join := time.Duration(rng.Int64N(int64(span / 2)))
		stay := span/4 + time.Duration(rng.Int64N(int64(span/2)))
		fps := float64(2 + rng.IntN(4))
		id := fmt.Sprintf("cam-%02d", i)
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case <-time.After(join):
			case <-ctx.Done():
				return
			}
			if err := e.Join(app.Name, id); err != nil {
				t.Error(err)
				return
			}
			sctx, stop := context.WithTimeout(ctx, stay)
			defer stop()
			if err := pat.Generate(sctx, clock.Real{}, i, id, fps, 0, e.Ingest); err != nil {
				t.Error(err)
			}
			if err := e.Leave(id); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	waitFor(t, "every frame to end", 10*time.Second, func() bool { return e.Status().Sessions[0].Open == 0 })
	st := e.Status().Sessions[0]
	tot := st.Total
	if tot.Finished+tot.Late+tot.Dropped != tot.Sent || tot.Sent == 0 {
		t.Fatalf("accounting: %+v", tot)
	}
	if fr := tot.FinishRate(); fr < 0.97 {
		t.Errorf("finish rate %.3f < 0.97 over %d frames: drops %v", fr, tot.Sent, st.Drops)
	}
	t.Logf("%v: %d frames, finish rate %.4f, p50 %.1f ms, p99 %.1f ms, %d re-plans, drops %v",
		time.Since(start).Round(time.Millisecond), tot.Sent, tot.FinishRate(), st.P50MS, st.P99MS, len(e.Replans()), st.Drops)
}
