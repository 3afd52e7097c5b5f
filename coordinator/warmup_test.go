package coordinator

import (
	"context"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/gpu"
	"github.com/mdag/mdag/ingest/synth"
	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/media"
	"github.com/mdag/mdag/profile"
)

// coldExec is an executor whose first batch takes cold (a model just
// loaded: a CUDA context, an allocator, kernel choice) and every later one
// per x b. It records the streams of the items it ran, in order.
type coldExec struct {
	clk  *clock.Fake
	per  time.Duration
	cold time.Duration

	mu      sync.Mutex
	ran     bool
	streams []string
}

func (x *coldExec) Kind() string { return "cold-first" }

func (x *coldExec) Run(ctx context.Context, _ string, items []*media.Item) ([][]*media.Item, error) {
	x.mu.Lock()
	d := x.per * time.Duration(len(items))
	if !x.ran {
		x.ran, d = true, x.cold
	}
	for _, it := range items {
		x.streams = append(x.streams, it.Stream)
	}
	x.mu.Unlock()
	select {
	case <-x.clk.After(d):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return gpu.EmulatedOutputs(items), nil
}

const warmApp = `app: warm
slo: 100ms
fps: 10
warm: 1
modules:
  - {name: detect, kind: gpu, model: det, inputs: [source]}
  - {name: count, kind: cpu, op: count, inputs: [detect]}
`

const warmProfiles = `workers:
  - {type: G, price: 1, gpu: T4, gpus: 1, cpus: 2}
  - {type: CPU, price: 0.1, cpus: 2}
profiles:
  - {target: det, worker: G, points: [{batch: 1, latency: 2ms}, {batch: 2, latency: 4ms}, {batch: 4, latency: 8ms}]}
  - {target: count, worker: CPU, points: [{batch: 1, latency: 100us}]}
`

// TestWarmup: an app kept warm for one stream is planned at deploy; its
// GPU module's instance runs the warm-up batches (sizes 1, 2, ...) before
// any frame, and the app is Ready only once they are done. The model's
// first batch takes 150 ms against a 100 ms SLO: warmed up, every frame of
// the stream that joins then finishes; without warm-up the first frame
// meets the cold batch and is late.
func TestWarmup(t *testing.T) {
	for _, warmup := range []bool{true, false} {
		name := map[bool]string{true: "warm-up", false: "none"}[warmup]
		t.Run(name, func(t *testing.T) { synctest.Test(t, func(t *testing.T) { warmupRun(t, warmup) }) })
	}
}

func warmupRun(t *testing.T, warmup bool) {
	app, err := dag.Parse("warm.yaml", []byte(warmApp))
	if err != nil {
		t.Fatal(err)
	}
	prof, err := profile.Parse("warm-profiles.yaml", []byte(warmProfiles))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var execs []*coldExec
	var f *fakeRun
	cfg := Config{Warmup: warmup, Executor: func(string, profile.WorkerTypeID) (gpu.Executor, error) {
		mu.Lock()
		defer mu.Unlock()
		x := &coldExec{clk: f.clk, per: 2 * time.Millisecond, cold: 150 * time.Millisecond}
		execs = append(execs, x)
		return x, nil
	}}
	f = startFake(t, cfg, map[profile.WorkerTypeID]int{"G": 1, "CPU": 1})
	if err := f.e.Deploy(app, prof); err != nil {
		t.Fatal(err)
	}
	f.advance(10 * time.Millisecond)
	if st := f.e.Status(); len(st.Instances) == 0 {
		t.Fatalf("warm: 1 planned nothing at deploy (status %+v)", st)
	}
	if warmup && f.e.Ready("warm") {
		t.Errorf("ready at +%v, while the cold warm-up batch (150 ms) runs", f.since())
	}
	f.advance(300 * time.Millisecond)
	if !f.e.Ready("warm") {
		t.Fatalf("not ready at +%v", f.since())
	}
	pat, err := synth.NewPattern(64, 48, 1)
	if err != nil {
		t.Fatal(err)
	}
	f.stream("warm", "a", 0, pat, 10, 20)
	f.advance(3 * time.Second)
	st := f.e.Status().Sessions[0]
	mu.Lock()
	defer mu.Unlock()
	var got []string
	for _, x := range execs { // one per instance: the GPU one ran
		got = append(got, x.streams...)
	}
	if !warmup {
		if st.Total.Finished == st.Total.Sent {
			t.Errorf("totals %+v without warm-up: want the first frame late (its batch was the cold one)", st.Total)
		}
		return
	}
	if st.Total.Sent != 20 || st.Total.Finished != 20 {
		t.Errorf("totals %+v, drops %v: want all 20 frames finished", st.Total, st.Drops)
	}
	warm := 0
	for i, s := range got {
		switch {
		case s == "warm-up" && i > warm:
			t.Fatalf("item %d was a warm-up item after a frame's (items %v)", i, got)
		case s == "warm-up":
			warm++
		}
	}
	if warm < 3 { // batches of 1 and 2: l(2) = 4 ms fits any budget here
		t.Errorf("%d warm-up items ran first, want at least 3 (batches of 1 and 2): %v", warm, got)
	}
}

func TestWarmSizes(t *testing.T) {
	ms := func(v ...int) []time.Duration {
		var out []time.Duration
		for _, x := range v {
			out = append(out, time.Duration(x)*time.Millisecond)
		}
		return out
	}
	for _, c := range []struct {
		lat    []time.Duration
		budget time.Duration
		want   []int
	}{
		{ms(1), 0, []int{1}},
		{ms(1, 2, 3, 4, 5, 6, 7, 8), 0, []int{1, 2, 4, 8}},
		{ms(1, 2, 3, 4, 5, 6), 0, []int{1, 2, 4, 6}},
		{ms(33, 57, 80, 105, 130, 150, 175, 200), 110 * time.Millisecond, []int{1, 2, 4}}, // l(5) = 130 > 110
		{ms(33, 57, 80, 105, 130, 150, 175, 200), 160 * time.Millisecond, []int{1, 2, 4, 6}},
		{ms(900, 1500), 100 * time.Millisecond, []int{1}}, // even b = 1 misses: warmed all the same
	} {
		if got := warmSizes(c.lat, c.budget); !slices.Equal(got, c.want) {
			t.Errorf("warmSizes(%v, %v) = %v, want %v", c.lat, c.budget, got, c.want)
		}
	}
}
