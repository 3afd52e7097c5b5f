package coordinator

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/mdag/mdag/allocator/milp"
	"github.com/mdag/mdag/coordinator/why"
	"github.com/mdag/mdag/internal/testapps"
	"github.com/mdag/mdag/media"
	"github.com/mdag/mdag/worker"
)

// answering is a registered instance that answers every task at once with
// what answer makes of it.
type answering struct {
	e      *Engine
	id     string
	answer func(worker.Task) worker.Result
}

func (a *answering) Load([]worker.ModuleSpec) error { return nil }
func (a *answering) Close()                         {}
func (a *answering) Submit(t worker.Task) {
	r := a.answer(t)
	go a.e.Result(a.id, r) // Submit runs on the engine loop: post, not inline
}

// TestResultOutcomes: a worker's Outcome decides a frame's end, and a
// failure's drop reason is the outcome's code, exactly the strings metrics
// labels and status JSON carry.
func TestResultOutcomes(t *testing.T) {
	pass := func(t worker.Task) [][]*media.Item {
		out := make([][]*media.Item, len(t.Items))
		for i, it := range t.Items {
			out[i] = []*media.Item{it.Derive()}
		}
		return out
	}
	for _, tc := range []struct {
		name   string
		answer func(worker.Task) worker.Result
		reason why.Drop // "" for a finished frame
	}{
		{"done", func(t worker.Task) worker.Result { return worker.Result{Task: t.ID, Outputs: pass(t)} }, ""},
		{"queue full", func(t worker.Task) worker.Result {
			return worker.Result{Task: t.ID, Outcome: worker.QueueFull, Detail: "the stream to worker c0 is backed up or closed"}
		}, "queue-full"},
		{"not loaded", func(t worker.Task) worker.Result { return worker.Result{Task: t.ID, Outcome: worker.NotLoaded} }, "module-not-loaded"},
		{"unloaded", func(t worker.Task) worker.Result { return worker.Result{Task: t.ID, Outcome: worker.Unloaded} }, "unloaded"},
		{"module error", func(t worker.Task) worker.Result {
			return worker.Result{Task: t.ID, Outcome: worker.ModuleError, Detail: "boom"}
		}, "module-error"},
		{"executor", func(t worker.Task) worker.Result {
			return worker.Result{Task: t.ID, Outcome: worker.ExecutorError, Detail: "boom"}
		}, "executor"},
		{"bad result", func(t worker.Task) worker.Result {
			return worker.Result{Task: t.ID, Outcome: worker.BadResult, Detail: "output 0: no frame"}
		}, "bad-result"},
		{"bad task", func(t worker.Task) worker.Result {
			return worker.Result{Task: t.ID, Outcome: worker.BadTask, Detail: "no frame"}
		}, "bad-task"},
		{"done without outputs", func(t worker.Task) worker.Result { return worker.Result{Task: t.ID} }, "bad-result"},
		{"rejected without a window", func(t worker.Task) worker.Result { return worker.Result{Task: t.ID, Outcome: worker.Rejected} }, "bad-result"},
		{"unknown outcome", func(t worker.Task) worker.Result {
			return worker.Result{Task: t.ID, Outcome: worker.Outcome(200), Outputs: pass(t)}
		}, "bad-result"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				app, prof, err := testapps.NoopChain(1)
				if err != nil {
					t.Fatal(err)
				}
				frames := make(chan FrameResult, 1)
				e := mustNew(t, Config{MILPSolver: milp.Solver{}, OnFrame: func(r FrameResult) { frames <- r }})
				e.Start()
				defer e.Close()
				if err := e.Deploy(app, prof); err != nil {
					t.Fatal(err)
				}
				e.AddInstance("c0", "CPU", &answering{e: e, id: "c0", answer: tc.answer})
				if err := e.Join("chain", "s"); err != nil {
					t.Fatal(err)
				}
				bubbleUntil(t, "a plan", 10*time.Second, func() bool { return e.Status().Sessions[0].Planned })
				if err := e.Ingest("s", 0, time.Now(), media.NewFrame(8, 8), nil); err != nil {
					t.Fatal(err)
				}
				var r FrameResult
				select {
				case r = <-frames:
				case <-time.After(10 * time.Second):
					t.Fatal("timed out waiting for the frame to end")
				}
				want := Finished
				if tc.reason != "" {
					want = Dropped
				}
				if r.Outcome != want || r.Reason != tc.reason || tc.reason != "" && r.Module != "m0" {
					t.Errorf("frame %s at %q with reason %q; want %s, reason %q", r.Outcome, r.Module, r.Reason, want, tc.reason)
				}
			})
		})
	}
}
