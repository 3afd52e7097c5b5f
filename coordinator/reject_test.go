package coordinator

import (
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/mdag/mdag/allocator/milp"
	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/gpu"
	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/media"
	"github.com/mdag/mdag/profile"
	"github.com/mdag/mdag/worker"
)

// rejectingGPU is a registered instance that refuses its first GPU batches
// (as a worker does when a batch cannot start inside its window) and runs
// the rest at once.
type rejectingGPU struct {
	e      *Engine
	id     string
	mu     sync.Mutex
	refuse int
	seen   int
}

func (g *rejectingGPU) Load([]worker.ModuleSpec) error { return nil }
func (g *rejectingGPU) Close()                         {}
func (g *rejectingGPU) Submit(t worker.Task) {
	g.mu.Lock()
	g.seen++
	refuse := g.seen <= g.refuse
	g.mu.Unlock()
	r := worker.Result{Task: t.ID, Measured: time.Millisecond}
	if refuse {
		r.Outcome = worker.Rejected
	} else {
		for _, it := range t.Items {
			r.Outputs = append(r.Outputs, []*media.Item{it.Derive()})
		}
	}
	go g.e.Result(g.id, r)
}

// TestRejectedBatchesRequeue: requests of a batch the GPU refused go back to
// the scheduler and are dispatched again (or dropped with a reason): every
// frame ends, none is left for the lost-frame sweep.
func TestRejectedBatchesRequeue(t *testing.T) { synctest.Test(t, rejectedBatchesRequeue) }

func rejectedBatchesRequeue(t *testing.T) {
	app, err := dag.Parse("g.yaml", []byte("app: g\nslo: 500ms\nfps: 20\nmodules:\n  - {name: det, kind: gpu, model: m, inputs: [source]}\n"))
	if err != nil {
		t.Fatal(err)
	}
	prof, err := profile.Parse("g-profiles.yaml", []byte("workers:\n  - {type: G, price: 1, gpu: T4, gpus: 1}\nprofiles:\n"+
		"  - {target: m, worker: G, points: [{batch: 1, concurrency: 1, latency: 5ms}, {batch: 2, concurrency: 1, latency: 8ms}]}\n"))
	if err != nil {
		t.Fatal(err)
	}
	e := mustNew(t, Config{MILPSolver: milp.Solver{}})
	e.Start()
	defer e.Close()
	if err := e.Deploy(app, prof); err != nil {
		t.Fatal(err)
	}
	g := &rejectingGPU{e: e, id: "g0", refuse: 3}
	e.AddInstance("g0", "G", g)
	if err := e.Join("g", "s"); err != nil {
		t.Fatal(err)
	}
	bubbleUntil(t, "a plan", 10*time.Second, func() bool { return e.Status().Sessions[0].Planned })
	f := media.NewFrame(8, 8)
	for i := range 10 {
		if err := e.Ingest("s", uint64(i), time.Now(), f, nil); err != nil {
			t.Fatal(err)
		}
	}
	bubbleUntil(t, "every frame to end", 5*time.Second, func() bool { return e.Status().Sessions[0].Open == 0 })
	st := e.Status().Sessions[0]
	if st.Total.Sent != 10 || st.Total.Finished != 10 {
		t.Errorf("totals %+v, drops %v: want all 10 finished after 3 refused batches", st.Total, st.Drops)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.seen <= g.refuse {
		t.Errorf("%d batches submitted; the test needs more than the %d refused", g.seen, g.refuse)
	}
}

// TestUnloadFinishesGPUBatches: a GPU module unloaded while batches are
// queued or running finishes them on the emulated GPU (its profile still
// times them) instead of failing them.
func TestUnloadFinishesGPUBatches(t *testing.T) { synctest.Test(t, unloadFinishesGPUBatches) }

func unloadFinishesGPUBatches(t *testing.T) {
	clk := clock.NewFake(time.Unix(1e9, 0))
	results := make(chan worker.Result, 4)
	w := worker.NewWorker("w", "G", clk, nil, nil, func(r worker.Result) { results <- r })
	defer w.Close()
	w.SetExecutor(gpu.NewEmulated(clk, w.Latency))
	spec := worker.ModuleSpec{App: "g", Module: "det", Kind: dag.GPU, Model: "m", Concurrency: 1, Latency: []time.Duration{10 * time.Millisecond}}
	if err := w.Load([]worker.ModuleSpec{spec}); err != nil {
		t.Fatal(err)
	}
	f := media.NewFrame(8, 8)
	for id := range uint64(2) {
		w.Submit(worker.Task{ID: id + 1, App: "g", Module: "det", Items: []*media.Item{{Stream: "s", Seq: id, Frame: f}}})
	}
	synctest.Wait() // the device loop has taken the first batch
	if clk.Pending() == 0 {
		t.Fatal("the first batch did not start")
	}
	if err := w.Load(nil); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		var r worker.Result
		for got := false; !got; {
			clk.Advance(10 * time.Millisecond)
			synctest.Wait()
			select {
			case r = <-results:
				got = true
			default:
			}
		}
		if r.Outcome != worker.Done || len(r.Outputs) != 1 {
			t.Errorf("task %d after unload: %s %q, %d outputs", r.Task, r.Outcome, r.Detail, len(r.Outputs))
		}
	}
}
