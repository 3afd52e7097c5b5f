package worker

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/gpu/queue"
	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/media"
	"github.com/mdag/mdag/modules"
)

// TestOutcomeString pins every outcome's code: the coordinator records it
// as the drop reason (metrics labels, status JSON, golden files), so a
// change here is a change of those.
func TestOutcomeString(t *testing.T) {
	for _, tc := range []struct {
		o     Outcome
		want  string
		valid bool
	}{
		{Done, "ok", true},
		{Rejected, "rejected", true},
		{QueueFull, "queue-full", true},
		{NotLoaded, "module-not-loaded", true},
		{Unloaded, "unloaded", true},
		{ModuleError, "module-error", true},
		{ExecutorError, "executor", true},
		{BadResult, "bad-result", true},
		{BadTask, "bad-task", true},
		{PeerLost, "peer-lost", true},
		{numOutcomes, "outcome(10)", false},
		{Outcome(200), "outcome(200)", false},
	} {
		if got := tc.o.String(); got != tc.want || tc.o.Valid() != tc.valid {
			t.Errorf("Outcome(%d): String %q, Valid %v; want %q, %v", uint8(tc.o), got, tc.o.Valid(), tc.want, tc.valid)
		}
	}
	var zero Result
	if zero.Outcome != Done {
		t.Errorf("a zero Result's outcome is %s, want ok", zero.Outcome)
	}
}

// testOp is a CPU op whose behaviour a test picks: fail every item, or
// say it started (on started) and wait for gate before passing each one
// through.
type testOp struct {
	err     error
	started chan struct{}
	gate    chan struct{}
}

func (o testOp) Process(it *media.Item) ([]*media.Item, error) {
	if o.err != nil {
		return nil, o.err
	}
	if o.gate != nil {
		o.started <- struct{}{}
		<-o.gate
	}
	return []*media.Item{it}, nil
}

func (testOp) Close() {}

// testExec is a GPU executor that fails with err, or passes items through.
type testExec struct{ err error }

func (x testExec) Run(_ context.Context, _ string, items []*media.Item) ([][]*media.Item, error) {
	if x.err != nil {
		return nil, x.err
	}
	out := make([][]*media.Item, len(items))
	for i, it := range items {
		out[i] = []*media.Item{it}
	}
	return out, nil
}

func (testExec) Kind() string { return "test" }

// TestWorkerOutcomes: each way a task can end comes back as its Outcome,
// with the error's text as Detail.
func TestWorkerOutcomes(t *testing.T) {
	boom := errors.New("boom")
	cpu := ModuleSpec{App: "a", Module: "c", Kind: dag.CPU, Op: "sink", Concurrency: 1}
	gpuSpec := ModuleSpec{App: "a", Module: "g", Kind: dag.GPU, Model: "m", Latency: []time.Duration{time.Millisecond}, Concurrency: 1}
	gated := testOp{started: make(chan struct{}, QueuePerSlot+16), gate: make(chan struct{})} // room for every queued task's start
	item := func() []*media.Item { return []*media.Item{{Stream: "s", Frame: media.NewFrame(4, 4)}} }
	for _, tc := range []struct {
		name    string
		op      testOp
		exec    testExec
		spec    ModuleSpec
		run     func(w *Worker, clk *clock.Fake) uint64 // submits; returns the task to check
		want    Outcome
		detail  string
		outputs int
	}{
		{name: "done", spec: cpu, want: Done, outputs: 1,
			run: func(w *Worker, _ *clock.Fake) uint64 {
				w.Submit(Task{ID: 1, App: "a", Module: "c", Items: item()})
				return 1
			}},
		{name: "not loaded", spec: cpu, want: NotLoaded,
			run: func(w *Worker, _ *clock.Fake) uint64 {
				w.Submit(Task{ID: 1, App: "a", Module: "other", Items: item()})
				return 1
			}},
		{name: "module error", spec: cpu, op: testOp{err: boom}, want: ModuleError, detail: "boom",
			run: func(w *Worker, _ *clock.Fake) uint64 {
				w.Submit(Task{ID: 1, App: "a", Module: "c", Items: item()})
				return 1
			}},
		{name: "queue full", spec: cpu, op: gated, want: QueueFull,
			run: func(w *Worker, _ *clock.Fake) uint64 {
				// Task 1 runs (held at the gate), the next QueuePerSlot
				// fill the queue a pool of one has: the one after finds
				// it full.
				w.Submit(Task{ID: 1, App: "a", Module: "c", Items: item()})
				<-gated.started
				last := uint64(QueuePerSlot + 2)
				for id := uint64(2); id <= last; id++ {
					w.Submit(Task{ID: id, App: "a", Module: "c", Items: item()})
				}
				return last
			}},
		{name: "executor error", spec: gpuSpec, exec: testExec{err: boom}, want: ExecutorError, detail: "boom",
			run: func(w *Worker, _ *clock.Fake) uint64 {
				w.Submit(Task{ID: 1, App: "a", Module: "g", Items: item()})
				return 1
			}},
		{name: "rejected", spec: gpuSpec, want: Rejected,
			run: func(w *Worker, clk *clock.Fake) uint64 {
				w.Submit(Task{ID: 1, App: "a", Module: "g", Items: item(), Latest: clk.Now().Add(-time.Millisecond)})
				return 1
			}},
		{name: "unloaded", spec: gpuSpec, want: Unloaded,
			run: func(w *Worker, clk *clock.Fake) uint64 {
				// It waits for a window that never comes: closing fails it.
				w.Submit(Task{ID: 1, App: "a", Module: "g", Items: item(), Earliest: clk.Now().Add(time.Hour)})
				w.Close()
				return 1
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := clock.NewFake(time.Unix(1e9, 0))
			ops := modules.NewRegistry()
			op := tc.op
			if err := ops.Register("sink", func(modules.Params) (modules.Processor, error) { return op, nil }); err != nil {
				t.Fatal(err)
			}
			results := make(chan Result, QueuePerSlot+16)
			w := NewWorker("w", "T", clk, tc.exec, ops, func(r Result) { results <- r })
			if err := w.Load([]ModuleSpec{tc.spec}); err != nil {
				t.Fatal(err)
			}
			id := tc.run(w, clk)
			var got Result
			for found := false; !found; {
				select {
				case got = <-results:
					found = got.Task == id
				case <-time.After(10 * time.Second):
					t.Fatalf("no result for task %d", id)
				}
			}
			if tc.op.gate != nil {
				close(tc.op.gate)
			}
			w.Close()
			if got.Outcome != tc.want || got.Detail != tc.detail || len(got.Outputs) != tc.outputs {
				t.Errorf("task %d: %s %q with %d outputs; want %s %q with %d", id, got.Outcome, got.Detail, len(got.Outputs), tc.want, tc.detail, tc.outputs)
			}
		})
	}
}

// queueExec is an executor that waits queue for a slot (reported with
// queue.Add), then runs for run, on the fake clock.
type queueExec struct {
	clk        *clock.Fake
	queue, run time.Duration
}

func (x queueExec) Run(ctx context.Context, _ string, items []*media.Item) ([][]*media.Item, error) {
	x.clk.Advance(x.queue)
	queue.Add(ctx, x.queue)
	x.clk.Advance(x.run)
	return testExec{}.Run(ctx, "", items)
}

func (queueExec) Kind() string { return "queue" }

// TestMeasuredLeavesOutQueue: a batch that waited inside the executor for
// one of its slots (ONNX Runtime's sessions, a KServe model's slots) is
// measured without the wait: the model ran 10 ms, not 30. Counted in, the
// wait read as ballooning when instances sharing one executor sent it more
// batches than it has sessions.
func TestMeasuredLeavesOutQueue(t *testing.T) {
	clk := clock.NewFake(time.Unix(1e9, 0))
	results := make(chan Result, 1)
	w := NewWorker("w", "T", clk, queueExec{clk: clk, queue: 20 * time.Millisecond, run: 10 * time.Millisecond}, modules.NewRegistry(), func(r Result) { results <- r })
	defer w.Close()
	spec := ModuleSpec{App: "a", Module: "g", Kind: dag.GPU, Model: "m", Latency: []time.Duration{time.Millisecond}, Concurrency: 1}
	if err := w.Load([]ModuleSpec{spec}); err != nil {
		t.Fatal(err)
	}
	w.Submit(Task{ID: 1, App: "a", Module: "g", Items: []*media.Item{{Stream: "s", Frame: media.NewFrame(4, 4)}}})
	select {
	case r := <-results:
		if r.Outcome != Done || r.Measured != 10*time.Millisecond {
			t.Fatalf("%s, measured %v: want ok, 10ms (30 ms less the 20 ms queued)", r.Outcome, r.Measured)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no result")
	}
}
