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
	"sync/atomic"
	"time"

	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/gpu"
	"github.com/mdag/mdag/gpu/queue"
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
	// Kind is Run (the zero value) or a state operation on a stateful
	// module (modules.Stateful). A Run task of a stateful module carries
	// all of one frame's items for it; its outputs come back in
	// Outputs[0] (the other lists empty).
	Kind   TaskKind
	Stream string // state operations: the stream whose state moves
	State  []byte // Import: the snapshot to restore (nil: forget the stream)
}

// TaskKind says what a task does.
type TaskKind uint8

// The task kinds. Export, Checkpoint and Import apply to stateful modules
// only (another module answers BadTask).
const (
	Run        TaskKind = iota // run the module on the items
	Export                     // snapshot the stream's state and forget it here (migration: the state leaves)
	Checkpoint                 // snapshot the stream's state and keep it
	Import                     // restore the stream's state from State (nil: forget it)
	numTaskKinds
)

var taskKindNames = [numTaskKinds]string{"run", "export", "checkpoint", "import"}

func (k TaskKind) String() string {
	if k < numTaskKinds {
		return taskKindNames[k]
	}
	return fmt.Sprintf("task-kind(%d)", uint8(k))
}

// Valid says whether k is one of the declared kinds.
func (k TaskKind) Valid() bool { return k < numTaskKinds }

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
	State    []byte        // Export, Checkpoint: the stream's snapshot
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
	PeerLost                     // an input frame could not be fetched from the worker holding it (direct data plane)
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
	PeerLost:      "peer-lost",
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
	spec     ModuleSpec
	proc     modules.Processor // CPU
	stateful modules.Stateful  // CPU modules of stateful ops: proc's per-stream interface
	q        chan Task
	stop     context.CancelFunc
	// handedOff: a restart of a stateful module (new pool size) took over
	// proc and its streams' state; the old pool must not close it.
	handedOff bool
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
	carry := map[string]*hosted{} // stateful modules restarting with a new pool size keep their state
	for k, h := range w.mods {
		s, ok := want[k]
		switch {
		case ok && h.stateful != nil && !sameSpec(s, h.spec) && sameOp(s, h.spec):
			close(h.q)
			delete(w.mods, k)
			h.handedOff = true
			carry[k] = h
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
		var h *hosted
		var err error
		if old := carry[k]; old != nil {
			h = w.restart(want[k], old)
		} else {
			h, err = w.start(want[k])
		}
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
	return sameOp(a, b) && a.Model == b.Model && a.Concurrency == b.Concurrency
}

// sameOp says a and b build the same CPU processor (the pool size aside).
func sameOp(a, b ModuleSpec) bool {
	return a.Kind == b.Kind && a.Op == b.Op && fmt.Sprint(a.Params) == fmt.Sprint(b.Params)
}

// QueuePerSlot is a CPU module's queue per pool goroutine (queueSize).
const QueuePerSlot = 1024

// queueSize is a CPU module's queue: QueuePerSlot tasks per pool goroutine, or
// for a stateful module room for one frame task and one state task per
// stream (the engine sends a stream's next task only when its last one is
// done, so its queue grows with the streams, not with their rate). The
// bound is back-pressure against a broken sender, not admission: the
// coordinator sends an item only when the work queued ahead of it still
// lets its frame finish within the SLO (its early drop), so a burst (a
// detector's batch of 16 fanning out to a 0.5 ms op) waits while the SLO
// has room. With 8 a goroutine, bursts were dropped queue-full with
// hundreds of milliseconds to spare.
func queueSize(h *hosted) int {
	n := QueuePerSlot * max(1, h.spec.Concurrency)
	if h.stateful != nil {
		n = max(n, 2048)
	}
	return n
}

// restart starts a stateful CPU module's new pool on old's processor: its
// streams' state stays (the engine sends a stream's next frame only after
// its last one finished, so the two pools never share a stream).
func (w *Worker) restart(s ModuleSpec, old *hosted) *hosted {
	n := max(1, s.Concurrency)
	ctx, stop := context.WithCancel(w.ctx)
	h := &hosted{spec: s, proc: old.proc, stateful: old.stateful, stop: stop}
	h.q = make(chan Task, queueSize(h))
	w.pool(n, func() { w.cpuLoop(ctx, h) }, w.closeProc(h))
	return h
}

// closeProc returns the pool-done hook of a CPU module: close its
// processor unless a restart took it over.
func (w *Worker) closeProc(h *hosted) func() {
	return func() {
		w.mu.Lock()
		off := h.handedOff
		w.mu.Unlock()
		if !off {
			h.proc.Close()
		}
	}
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
		if op, _ := modules.Lookup(modules.OpID(s.Op)); op.Stateful {
			st, ok := p.(modules.Stateful)
			if !ok {
				p.Close()
				stop()
				return nil, fmt.Errorf("op %s keeps per-stream state but its processor cannot snapshot it (modules.Stateful)", s.Op)
			}
			h.stateful = st
		}
		h.q = make(chan Task, queueSize(h))
		w.pool(n, func() { w.cpuLoop(ctx, h) }, w.closeProc(h))
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
	if t.Kind != Run && h.spec.Kind != dag.CPU {
		w.stats.Failed++
		w.mu.Unlock()
		w.emit(Result{Task: t.ID, Outcome: BadTask, Detail: fmt.Sprintf("%s task for GPU module %s", t.Kind, h.spec.Key())})
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
		if h.stateful != nil || t.Kind != Run {
			w.emit(w.runStateful(h, t))
			continue
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

// runStateful runs a task of a stateful CPU module: one frame's items
// through ProcessFrame, or a state operation.
func (w *Worker) runStateful(h *hosted, t Task) Result {
	start := w.clk.Now()
	r := RunStateTask(h.stateful, h.spec.Op, t)
	if r.Outcome != Done {
		w.count(func(s *WorkerStats) { s.Failed++ })
	}
	r.Measured = w.clk.Now().Sub(start)
	return r
}

// RunStateTask runs task t of a module of op whose processor keeps
// per-stream state (st; nil: the op keeps none, a BadTask): one frame's
// items through ProcessFrame, or a state operation. It is what a Worker
// does with such a task; mdag eval's virtual workers run the same. The
// caller sets Measured.
func RunStateTask(st modules.Stateful, op string, t Task) Result {
	r := Result{Task: t.ID}
	fail := func(o Outcome, format string, args ...any) Result {
		return Result{Task: t.ID, Outcome: o, Detail: fmt.Sprintf(format, args...)}
	}
	if st == nil {
		return fail(BadTask, "%s task for module %s/%s, which keeps no per-stream state (op %s)", t.Kind, t.App, t.Module, op)
	}
	var err error
	switch t.Kind {
	case Run:
		if len(t.Items) == 0 {
			return fail(BadTask, "a frame task with no items")
		}
		first := t.Items[0]
		for _, it := range t.Items[1:] {
			if it.Stream != first.Stream || it.Seq != first.Seq {
				return fail(BadTask, "a frame task mixes frames (%s/%d and %s/%d)", first.Stream, first.Seq, it.Stream, it.Seq)
			}
		}
		var out []*media.Item
		out, err = st.ProcessFrame(first.Stream, first.Seq, t.Items)
		if err == nil {
			r.Outputs = make([][]*media.Item, len(t.Items))
			r.Outputs[0] = out
		}
	case Export, Checkpoint:
		r.State, err = st.Snapshot(t.Stream)
		if err == nil && t.Kind == Export {
			err = st.Restore(t.Stream, nil)
		}
	case Import:
		err = st.Restore(t.Stream, t.State)
	default:
		return fail(BadTask, "unknown task kind %d", uint8(t.Kind))
	}
	if err != nil {
		return fail(ModuleError, "%v", err)
	}
	return r
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
		var queued atomic.Int64 // the executor's wait for a slot (queue.Add): not the model's time
		out, err := w.exec.Run(queue.WithTimer(ctx, &queued), h.spec.Model, t.Items)
		r := Result{Task: t.ID, Outputs: out, Measured: max(0, w.clk.Now().Sub(start)-time.Duration(queued.Load()))}
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
