package coordinator

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/mdag/mdag/ingest/synth"
)

// TestStreamsJoinAndLeave is Scrooge Section 4.2's traffic workload shape:
// 12 streams join and leave at random times, each at 2-5 fps, on emulated
// GPUs, on the fake clock. It checks behaviour, not speed: every frame is
// accounted for (sent = finished + late + dropped, none open), no frame is
// dropped for want of a route while streams come and go (only deadline
// drops), and most complete. The finish rate on the real clock (>= 97% on
// an idle machine) is BenchmarkStreamsJoinAndLeave's figure.
func TestStreamsJoinAndLeave(t *testing.T) {
	synctest.Test(t, streamsJoinAndLeave)
}

func streamsJoinAndLeave(t *testing.T) {
	st, replans := runJoinAndLeave(t, onFakeClock(t))
	tot := st.Total
	if tot.Finished+tot.Late+tot.Dropped != tot.Sent || tot.Sent == 0 {
		t.Fatalf("accounting: %+v", tot)
	}
	checkMostComplete(t, "totals", tot)
	checkRouted(t, "totals", st.Drops)
	t.Logf("%d frames, finish rate %.4f, p50 %.1f ms, p99 %.1f ms, %d re-plans, drops %v",
		tot.Sent, tot.FinishRate(), st.P50MS, st.P99MS, replans, st.Drops)
}

// runJoinAndLeave runs TestStreamsJoinAndLeave's workload (a fixed seed)
// until every frame has ended; it returns the session's status and the
// number of re-plans.
func runJoinAndLeave(tb testing.TB, start starter) (SessionStatus, int) {
	app, prof := loadExample(tb, "traffic")
	w := start(Config{}, everyType)
	defer w.close()
	e := w.engine()
	if err := e.Deploy(app, prof); err != nil {
		tb.Fatal(err)
	}
	pat, _ := synth.NewPattern(320, 240, 3)
	rng := rand.New(rand.NewPCG(42, 7))
	const span = 6 * time.Second
	var mu sync.Mutex
	left := 0
	for i := range 12 {
		join := time.Duration(rng.Int64N(int64(span / 2)))
		stay := span/4 + time.Duration(rng.Int64N(int64(span/2)))
		fps := float64(2 + rng.IntN(4))
		id := fmt.Sprintf("cam-%02d", i)
		w.after(join, func() {
			w.stream(app.Name, id, i, pat, fps, 0)
			w.after(stay, func() {
				w.stop(id)
				if err := e.Leave(id); err != nil {
					tb.Error(err)
				}
				mu.Lock()
				left++
				mu.Unlock()
			})
		})
	}
	w.until("every stream to leave", 2*span, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return left == 12
	})
	w.until("every frame to end", 20*time.Second, func() bool { return e.Status().Sessions[0].Open == 0 })
	return e.Status().Sessions[0], len(e.Replans())
}
