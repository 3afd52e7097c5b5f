package coordinator

import (
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/gpu"
	"github.com/mdag/mdag/ingest/synth"
	"github.com/mdag/mdag/profile"
)

// bridgeExecs makes one coldExec per instance (warmProfiles' G: 2 ms an
// item, the first batch 150 ms against a 100 ms SLO), recorded.
type bridgeExecs struct {
	mu sync.Mutex
	by map[string]*coldExec
}

func (b *bridgeExecs) ran(id string) []string {
	b.mu.Lock()
	x := b.by[id]
	b.mu.Unlock()
	if x == nil {
		return nil
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	return slices.Clone(x.streams)
}

func startBridge(t *testing.T, app string, limits map[profile.WorkerTypeID]int) (*fakeRun, *bridgeExecs) {
	t.Helper()
	a, err := dag.Parse("bridge.yaml", []byte(app))
	if err != nil {
		t.Fatal(err)
	}
	prof, err := profile.Parse("warm-profiles.yaml", []byte(warmProfiles))
	if err != nil {
		t.Fatal(err)
	}
	bx := &bridgeExecs{by: map[string]*coldExec{}}
	var f *fakeRun
	cfg := Config{Warmup: true, Executor: func(id string, _ profile.WorkerTypeID) (gpu.Executor, error) {
		bx.mu.Lock()
		defer bx.mu.Unlock()
		x := &coldExec{clk: f.clk, per: 2 * time.Millisecond, cold: 150 * time.Millisecond}
		bx.by[id] = x
		return x, nil
	}}
	f = startFake(t, cfg, limits)
	if err := f.e.Deploy(a, prof); err != nil {
		t.Fatal(err)
	}
	return f, bx
}

// TestMakeBeforeBreak: the plan for the third stream moves det from S-0
// to L-0, which must warm up first. S-0 keeps det loaded and routed (a
// bridge) until L-0 is warm: the frames of the warm-up go to S-0, none
// waits out L-0's cold batch, and once L-0 is warm S-0 serves nothing
// more and is released. Without the bridge the frames of those 150 ms
// waited for L-0 and were late or dropped.
func TestMakeBeforeBreak(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, bx := startBridge(t, strings.Replace(warmApp, "app: warm", "app: bridge", 1), map[profile.WorkerTypeID]int{"G": 2, "CPU": 1})
		f.until("G-0 warm", 2*time.Second, func() bool { return f.e.Ready("bridge") })
		pat, err := synth.NewPattern(64, 48, 1)
		if err != nil {
			t.Fatal(err)
		}
		f.stream("bridge", "a", 0, pat, 20, 60)
		f.advance(time.Second)
		if err := f.e.Drain("G-0"); err != nil {
			t.Fatal(err)
		}
		f.settle()
		rps := f.e.Status().Replans
		last := rps[len(rps)-1]
		if !slices.Contains(last.Bridges, "G-0 keeps bridge/detect") {
			t.Fatalf("plan %d (%s): bridges %v, want G-0 keeping bridge/detect while its new instance warms (moves %v)", last.N, last.Trigger, last.Bridges, last.Moves)
		}
		before := len(bx.ran("G-0"))
		f.advance(4 * time.Second)
		st := f.e.Status()
		sess := st.Sessions[0]
		if sess.Total.Sent != 60 || sess.Total.Finished != sess.Total.Sent {
			t.Errorf("totals %+v, drops %v: want all 60 frames finished", sess.Total, sess.Drops)
		}
		onG0 := bx.ran("G-0")
		if len(onG0) <= before {
			t.Errorf("G-0 ran nothing after the drain's plan (%d items before): the bridge served no frame", before)
		}
		onG1 := bx.ran("G-1")
		if len(onG1) == 0 || onG1[0] != "warm-up" || !slices.Contains(onG1, "a") {
			t.Fatalf("G-1 ran %v: want its warm-up first, then a's frames", onG1)
		}
		for _, in := range st.Instances {
			if in.ID == "G-0" {
				t.Errorf("G-0 still up (%+v) after G-1 warmed: the bridge did not end", in)
			}
		}
	})
}

// TestParkedReuse: an instance the plan keeps idle (Warm, within its
// turn-off delay) keeps the GPU modules it hosted. A stream that comes back
// within the delay is served there at once: no warm-up batch, no frame late
// behind a cold one.
func TestParkedReuse(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, bx := startBridge(t, strings.Replace(strings.Replace(warmApp, "app: warm", "app: park", 1), "warm: 1\n", "", 1), map[profile.WorkerTypeID]int{"G": 1, "CPU": 1})
		pat, err := synth.NewPattern(64, 48, 1)
		if err != nil {
			t.Fatal(err)
		}
		f.stream("park", "a", 0, pat, 10, 10)
		f.until("a's frames", 5*time.Second, func() bool { return f.e.Status().Sessions[0].Total.Sent == 10 })
		f.advance(time.Second)
		f.stop("a")
		if err := f.e.Leave("a"); err != nil {
			t.Fatal(err)
		}
		f.advance(2 * time.Second)
		warmUps := strings.Count(strings.Join(bx.ran("G-0"), " "), "warm-up")
		before := f.e.Status().Sessions[0].Total
		f.stream("park", "b", 1, pat, 10, 20)
		f.advance(4 * time.Second)
		st := f.e.Status()
		after := st.Sessions[0].Total
		if got := after.Finished - before.Finished; got != 20 || after.Sent-before.Sent != 20 {
			t.Errorf("b: %d of %d frames finished (drops %v): want all 20 (its instance kept det warm)", got, after.Sent-before.Sent, st.Sessions[0].Drops)
		}
		if n := strings.Count(strings.Join(bx.ran("G-0"), " "), "warm-up"); n != warmUps {
			t.Errorf("%d warm-up items ran for b on the parked instance, want none", n-warmUps)
		}
		if len(bx.by) != 2 { // G-0, CPU-0
			t.Errorf("instances made: %v, want G-0 reused", slices.Sorted(maps.Keys(bx.by)))
		}
	})
}
