package coordinator

import (
	"context"
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

// realExec is an executor that, like a real one, does not take its
// profiled time: each batch takes per*b, and the first run of each batch
// size takes cold (ONNX Runtime's first run of a shape).
type realExec struct {
	clk  *clock.Fake
	per  time.Duration
	cold time.Duration

	mu   sync.Mutex
	seen map[int]bool
	runs int
}

func (x *realExec) Kind() string { return "real-like" }

func (x *realExec) Run(ctx context.Context, _ string, items []*media.Item) ([][]*media.Item, error) {
	x.mu.Lock()
	d := x.per * time.Duration(len(items))
	if !x.seen[len(items)] {
		x.seen[len(items)] = true
		d = x.cold
	}
	x.runs++
	x.mu.Unlock()
	select {
	case <-x.clk.After(d):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return gpu.EmulatedOutputs(items), nil
}

const slackApp = `app: slack
slo: 300ms
fps: 10
modules:
  - {name: detect, kind: gpu, model: det, inputs: [source]}
  - {name: count, kind: cpu, op: count, inputs: [detect]}
`

const slackProfiles = `workers:
  - {type: G, price: 1, gpu: T4, gpus: 1, cpus: 2}
  - {type: CPU, price: 0.1, cpus: 2}
profiles:
  - {target: det, worker: G, points: [{batch: 1, latency: 1ms}, {batch: 2, latency: 1500us}, {batch: 4, latency: 2500us}]}
  - {target: count, worker: CPU, points: [{batch: 1, latency: 100us}]}
`

// TestSlackIsUsed: the SLO bounds a frame, not the plan's latency split.
// The detector's profile says 1 ms; on the "device" a batch takes 8x that
// and the first run of each batch size takes 60 ms. The plan's split gives
// detect a budget of a few ms out of 300; the frames that run behind it
// still have the SLO's room, so every one finishes, none is dropped
// cannot-finish, and the cold runs teach the scheduler nothing.
func TestSlackIsUsed(t *testing.T) { synctest.Test(t, slackIsUsed) }

func slackIsUsed(t *testing.T) {
	app, err := dag.Parse("slack.yaml", []byte(slackApp))
	if err != nil {
		t.Fatal(err)
	}
	prof, err := profile.Parse("slack-profiles.yaml", []byte(slackProfiles))
	if err != nil {
		t.Fatal(err)
	}
	var execs []*realExec
	var mu sync.Mutex
	var f *fakeRun
	cfg := Config{Executor: func(id string, typ profile.WorkerTypeID) (gpu.Executor, error) {
		mu.Lock()
		defer mu.Unlock()
		x := &realExec{clk: f.clk, per: 8 * time.Millisecond, cold: 60 * time.Millisecond, seen: map[int]bool{}}
		execs = append(execs, x)
		return x, nil
	}}
	f = startFake(t, cfg, map[profile.WorkerTypeID]int{"G": 1, "CPU": 1})
	if err := f.e.Deploy(app, prof); err != nil {
		t.Fatal(err)
	}
	pat, err := synth.NewPattern(64, 48, 1)
	if err != nil {
		t.Fatal(err)
	}
	f.stream("slack", "a", 0, pat, 10, 50)
	f.stream("slack", "b", 1, pat, 10, 50)
	f.advance(8 * time.Second)
	st := f.e.Status().Sessions[0]
	if st.Total.Sent != 100 || st.Total.Finished != 100 {
		t.Errorf("totals %+v, drops %v: want all 100 frames finished (the SLO has room)", st.Total, st.Drops)
	}
	est := f.e.sched.Estimator()
	if got := est.Estimate("slack/detect", 1); got >= 60*time.Millisecond {
		t.Errorf("estimate of a batch of 1 = %v: a cold run taught the scheduler", got)
	}
	mu.Lock()
	defer mu.Unlock()
	runs := 0
	for _, x := range execs {
		runs += x.runs
	}
	if runs == 0 {
		t.Fatalf("no batch ran on the executor")
	}
}
