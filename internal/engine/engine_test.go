package engine

import (
	"context"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/examples"
	"github.com/mdag/mdag/ingest"
	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/profile"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// loadExample parses an embedded example's app and profiles.
func loadExample(t testing.TB, name string) (*dag.App, *profile.File) {
	t.Helper()
	app, pf, err := examples.Parse(name)
	if err != nil {
		t.Fatal(err)
	}
	return app, pf
}

var everyType = map[profile.WorkerTypeID]int{"P100": 8, "V100": 8, "CPU": 8}

// waitFor polls cond on the real clock until it holds or the test's
// deadline nears. It waits for the system under test, not for time to
// pass: cond is the thing being waited on.
func waitFor(t *testing.T, what string, limit time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", limit, what)
		}
		<-time.After(5 * time.Millisecond)
	}
}

// feed streams n synthetic pattern streams into app for count frames each.
func feed(t *testing.T, ctx context.Context, e *Engine, app dag.AppID, n int, fps float64, count uint64, pat *ingest.Pattern) {
	t.Helper()
	var wg sync.WaitGroup
	for i := range n {
		id := string(app) + "-" + string(rune('a'+i))
		if err := e.Join(app, id); err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := pat.Generate(ctx, clock.Real{}, i, id, fps, count, e.Ingest); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
}

func TestEveryFrameAccounted(t *testing.T) {
	app, prof := loadExample(t, "traffic")
	e, _ := NewEmbedded(Config{}, everyType)
	e.Start()
	defer e.Close()
	if err := e.Deploy(app, prof); err != nil {
		t.Fatal(err)
	}
	pat, err := ingest.NewPattern(320, 240, 3)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	feed(t, ctx, e, app.Name, 3, 10, 30, pat)
	waitFor(t, "every frame to end", 10*time.Second, func() bool {
		st := e.Status().Sessions[0]
		return st.Total.Sent == 90 && st.Open == 0
	})
	st := e.Status().Sessions[0]
	tot := st.Total
	if tot.Finished+tot.Late+tot.Dropped != tot.Sent {
		t.Fatalf("accounting: %+v", tot)
	}
	if fr := tot.FinishRate(); fr < 0.9 {
		t.Errorf("finish rate %.3f < 0.9: %+v drops %v", fr, tot, st.Drops)
	}
	t.Logf("totals %+v drops %v p50 %.1f ms p99 %.1f ms; modules %+v", tot, st.Drops, st.P50MS, st.P99MS, st.Modules)
}
