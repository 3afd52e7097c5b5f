// Package worker is the data plane: a Worker hosts modules and runs tasks,
// CPU ops on bounded goroutine pools (built from a modules.Registry the
// binary fills) and GPU batches on a device loop that honours the central
// scheduler's action windows through a gpu.Executor. The same Worker runs
// in-process (embedded) and behind gRPC (`mdag worker`). Its contract with
// the coordinator is ModuleSpec (what to host), Task (what to run) and
// Result (what came of it, with a typed Outcome). It imports media,
// modules, gpu, dag and clock only: no planners, no OpenCV.
package worker

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/gpu"
	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/media"
	"github.com/mdag/mdag/modules"
)

// ModuleSpec tells a worker how to host one module of one app.
type ModuleSpec struct {
	App         dag.AppID
	Module      dag.ModuleID
	Kind        dag.Kind
	Op          string         // CPU modules
	Params      map[string]any // CPU modules
	Model       string         // GPU modules
	Latency     []time.Duration
	Concurrency int // CPU: pool size; GPU: batches in flight on the device
}

// Key names the module across apps.
func (s ModuleSpec) Key() string { return string(s.App) + "/" + string(s.Module) }

// Task is one unit of work sent to a worker: one item through a CPU module,
// or a batch through a GPU module inside its action window.
type Task struct {
	ID       uint64
	App      dag.AppID
	Module   dag.ModuleID
	Items    []*media.Item
	Earliest time.Time // GPU tasks: start no earlier than this
	Latest   time.Time // GPU tasks: reject if it cannot start by then
}

// Result is what came of a task. Anything but Done is a failure: the
// coordinator puts a Rejected GPU batch back in line and drops the items of
// any other, recording Outcome.String() as the drop reason and Detail as its
// detail.
type Result struct {
	Task     uint64
	Outputs  [][]*media.Item // Done: one list per input item
	Outcome  Outcome
	Detail   string        // why it failed, for logs (empty when Done)
	Measured time.Duration // execution time, queueing excluded
}

// Outcome is how a task ended. The zero value is Done. Its String is the
// drop reason code the coordinator records (metrics labels, status JSON), so
// those strings must not change.
type Outcome uint8

// The outcomes a worker (or the transport standing in for it) reports.
const (
	Done          Outcome = iota // ran; Outputs has one list per input item
	Rejected                     // a GPU task could not start inside its window
	QueueFull                    // the module's queue was full (back-pressure)
	NotLoaded                    // the task's module is not loaded on this worker
	Unloaded                     // the module was unloaded (or the worker closed) before the task ran
	ModuleError                  // a CPU op failed on an item
	ExecutorError                // the GPU executor failed on the batch
	BadResult                    // the result could not be used (undecodable, wrong output count, unknown outcome)
	BadTask                      // the worker could not decode the task
	numOutcomes
)

var outcomeNames = [numOutcomes]string{
	Done:          "ok",
	Rejected:      "rejected",
	QueueFull:     "queue-full",
	NotLoaded:     "module-not-loaded",
	Unloaded:      "unloaded",
	ModuleError:   "module-error",
	ExecutorError: "executor",
	BadResult:     "bad-result",
	BadTask:       "bad-task",
}

// String is the outcome's reason code ("outcome(N)" for a value that is
// not one of the constants).
func (o Outcome) String() string {
	if o.Valid() {
		return outcomeNames[o]
	}
	return fmt.Sprintf("outcome(%d)", uint8(o))
}

// Valid says whether o is one of the declared outcomes.
func (o Outcome) Valid() bool { return o < numOutcomes }

// Worker hosts modules and runs tasks: CPU ops on bounded goroutine pools,
// GPU batches on a device loop that honours action windows. The same Worker
// runs in-process (embedded) and behind gRPC (`mdag worker`).
type Worker struct {
	ID   string
	Type string

	clk  clock.Clock
	exec gpu.Executor
	ops  *modules.Registry
	emit func(Result)

	mu       sync.Mutex
	mods     map[string]*hosted
	retiring map[*hosted]bool // unloaded GPU modules still finishing their queue
	ctx      context.Context
	stop     context.CancelFunc
	wg       sync.WaitGroup
	stats    WorkerStats
}

// WorkerStats are a worker's counters, sent with heartbeats.
type WorkerStats struct {
	Tasks    uint64 `json:"tasks"`
	Rejected uint64 `json:"rejected"`
	Failed   uint64 `json:"failed"`
	Full     uint64 `json:"queue_full"`
	Modules  int    `json:"modules"`
}

type hosted struct {
	spec ModuleSpec
	proc modules.Processor // CPU
	q    chan Task
	stop context.CancelFunc
}

// NewWorker returns a worker that builds CPU modules from ops and reports
// results through emit (called from the worker's goroutines; it must not
// block for long).
func NewWorker(id, typ string, clk clock.Clock, exec gpu.Executor, ops *modules.Registry, emit func(Result)) *Worker {
	ctx, stop := context.WithCancel(context.Background())
	return &Worker{ID: id, Type: typ, clk: clk, exec: exec, ops: ops, emit: emit, mods: map[string]*hosted{}, retiring: map[*hosted]bool{}, ctx: ctx, stop: stop}
}

// Load makes the worker host exactly specs: new modules start, removed ones
// stop (their queued tasks fail with Unloaded), changed ones restart.
func (w *Worker) Load(specs []ModuleSpec) error {
	want := map[string]ModuleSpec{}
	for _, s := range specs {
		want[s.Key()] = s
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ctx.Err() != nil {
		return fmt.Errorf("worker %s is closed", w.ID)
	}
	for k, h := range w.mods {
		s, ok := want[k]
		switch {
		case !ok || !sameSpec(s, h.spec):
			// Unload gracefully: no new tasks; what is queued or running
			// finishes (a moved module's in-flight frames are not lost).
			close(h.q)
			delete(w.mods, k)
			if h.spec.Kind == dag.GPU {
				w.retiring[h] = true // its profile still times what it finishes
			}
		default:
			h.spec.Latency = s.Latency // a new profile needs no restart
		}
	}
	keys := make([]string, 0, len(want))
	for k := range want {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var errs []error
	for _, k := range keys {
		if _, ok := w.mods[k]; ok {
			continue
		}
		h, err := w.start(want[k])
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", k, err))
			continue
		}
		w.mods[k] = h
	}
	w.stats.Modules = len(w.mods)
	if len(errs) > 0 {
		return fmt.Errorf("worker %s: %v", w.ID, errs)
	}
	return nil
}

func sameSpec(a, b ModuleSpec) bool {
	return a.Kind == b.Kind && a.Op == b.Op && a.Model == b.Model && a.Concurrency == b.Concurrency &&
		fmt.Sprint(a.Params) == fmt.Sprint(b.Params)
}

func (w *Worker) start(s ModuleSpec) (*hosted, error) {
	n := max(1, s.Concurrency)
	ctx, stop := context.WithCancel(w.ctx)
	h := &hosted{spec: s, stop: stop}
	switch s.Kind {
	case dag.CPU:
		p, err := w.ops.New(modules.OpID(s.Op), s.Params)
		if err != nil {
			stop()
			return nil, err
		}
		h.proc = p
		h.q = make(chan Task, 8*n)
		w.pool(n, func() { w.cpuLoop(ctx, h) }, p.Close)
	case dag.GPU:
		if w.exec == nil {
			stop()
			return nil, fmt.Errorf("GPU module on a worker without an executor")
		}
		// Actions queue in arrival order (the scheduler's order); a device
		// runs n batches at a time.
		h.q = make(chan Task, 1024)
		w.pool(n, func() { w.gpuLoop(ctx, h) }, func() {
			w.mu.Lock()
			delete(w.retiring, h)
			w.mu.Unlock()
		})
	default:
		stop()
		return nil, fmt.Errorf("unknown module kind %q", s.Kind)
	}
	return h, nil
}

// pool runs n copies of loop on the worker's goroutines and then, once all
// have returned, done.
func (w *Worker) pool(n int, loop, done func()) {
	var pool sync.WaitGroup
	for range n {
		pool.Add(1)
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			defer pool.Done()
			loop()
		}()
	}
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		pool.Wait()
		done()
	}()
}

// Submit queues a task. It never blocks: a full CPU queue answers at once
// with QueueFull (back-pressure the coordinator counts as a drop).
func (w *Worker) Submit(t Task) {
	w.mu.Lock()
	h := w.mods[string(t.App)+"/"+string(t.Module)]
	w.stats.Tasks++
	if h == nil {
		w.stats.Failed++
		w.mu.Unlock()
		w.emit(Result{Task: t.ID, Outcome: NotLoaded})
		return
	}
	select {
	case h.q <- t: // under w.mu: Load closes queues under it too
		w.mu.Unlock()
	default:
		w.stats.Full++
		w.mu.Unlock()
		w.emit(Result{Task: t.ID, Outcome: QueueFull})
	}
}

func (w *Worker) count(f func(*WorkerStats)) {
	w.mu.Lock()
	f(&w.stats)
	w.mu.Unlock()
}

// Latency is l(b) of a loaded GPU module's model, for the emulated
// executor: the profile the coordinator sent with the module.
func (w *Worker) Latency(model string, b int) (time.Duration, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, h := range w.mods {
		if h.spec.Kind == dag.GPU && h.spec.Model == model && b >= 1 && b <= len(h.spec.Latency) {
			return h.spec.Latency[b-1], true
		}
	}
	// A module being unloaded finishes what it had queued: its batches
	// still need their time (an unload must not fail in-flight frames).
	for h := range w.retiring {
		if h.spec.Model == model && b >= 1 && b <= len(h.spec.Latency) {
			return h.spec.Latency[b-1], true
		}
	}
	return 0, false
}

// SetExecutor sets the GPU executor (before any GPU module is loaded).
func (w *Worker) SetExecutor(x gpu.Executor) {
	w.mu.Lock()
	w.exec = x
	w.mu.Unlock()
}

// Stats returns a copy of the counters.
func (w *Worker) Stats() WorkerStats {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.stats
}

// next waits for h's next task; false when the module was unloaded (its
// queue closed and drained) or the worker closed (queued tasks fail).
func (w *Worker) next(ctx context.Context, h *hosted) (Task, bool) {
	select {
	case <-ctx.Done():
		w.drain(h)
		return Task{}, false
	case t, ok := <-h.q:
		return t, ok
	}
}

func (w *Worker) cpuLoop(ctx context.Context, h *hosted) {
	for {
		t, ok := w.next(ctx, h)
		if !ok {
			return
		}
		start := w.clk.Now()
		r := Result{Task: t.ID, Outputs: make([][]*media.Item, len(t.Items))}
		for i, it := range t.Items {
			out, err := h.proc.Process(it)
			if err != nil {
				r.Outputs, r.Outcome, r.Detail = nil, ModuleError, err.Error()
				w.count(func(s *WorkerStats) { s.Failed++ })
				break
			}
			r.Outputs[i] = out
		}
		r.Measured = w.clk.Now().Sub(start)
		w.emit(r)
	}
}

func (w *Worker) gpuLoop(ctx context.Context, h *hosted) {
	for {
		t, ok := w.next(ctx, h)
		if !ok {
			return
		}
		if wait := t.Earliest.Sub(w.clk.Now()); wait > 0 {
			done := make(chan struct{})
			tm := w.clk.AfterFunc(wait, func() { close(done) })
			select {
			case <-done:
			case <-ctx.Done():
				tm.Stop()
				w.emit(Result{Task: t.ID, Outcome: Unloaded})
				w.drain(h)
				return
			}
		}
		start := w.clk.Now()
		if !t.Latest.IsZero() && start.After(t.Latest) {
			w.count(func(s *WorkerStats) { s.Rejected++ })
			w.emit(Result{Task: t.ID, Outcome: Rejected})
			continue
		}
		out, err := w.exec.Run(ctx, h.spec.Model, t.Items)
		r := Result{Task: t.ID, Outputs: out, Measured: w.clk.Now().Sub(start)}
		if err != nil {
			r.Outputs, r.Outcome, r.Detail = nil, ExecutorError, err.Error()
			w.count(func(s *WorkerStats) { s.Failed++ })
		}
		w.emit(r)
	}
}

// drain fails the tasks still queued on a module that stopped.
func (w *Worker) drain(h *hosted) {
	for {
		select {
		case t, ok := <-h.q:
			if !ok {
				return
			}
			w.emit(Result{Task: t.ID, Outcome: Unloaded})
		default:
			return
		}
	}
}

// Close stops every module and waits for the worker's goroutines; queued
// tasks fail with Unloaded.
func (w *Worker) Close() {
	w.stop()
	w.wg.Wait()
}
