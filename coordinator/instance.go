package coordinator

import (
	"fmt"
	"sync"

	"github.com/mdag/mdag/gpu"
	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/modules"
	"github.com/mdag/mdag/profile"
	"github.com/mdag/mdag/worker"
)

// Instance is the coordinator's handle on one worker instance: in-process
// (a *Worker) or remote (a gRPC stream to `mdag worker`). Results come back
// through Engine.Result.
type Instance interface {
	Load(specs []worker.ModuleSpec) error
	Submit(t worker.Task)
	Close()
}

// Provisioner supplies instances (Scrooge's provisioning step). Start is
// asked for a new instance of a type under the ID the placement chose;
// Release gives one back.
type Provisioner interface {
	// Limits is the most instances per type; a type absent has none.
	Limits() map[profile.WorkerTypeID]int
	Start(id string, typ profile.WorkerTypeID) (Instance, error)
	Release(id string)
}

// Pending is implemented by an Instance that is not up when
// Provisioner.Start returns it: the provisioner has asked for it (a
// Kubernetes pod) and its worker registers over gRPC later under the same
// ID (Engine.AddInstance). Until then the engine routes nothing to it and
// loads nothing onto it (Load and Submit are never called; its planned
// loads wait), and it shows as "starting" in Status. The registration binds
// the worker's connection to the planned instance: it gets its loads,
// serves, and stays the provisioner's (the turn-off delay releases it and
// Provisioner.Release stops it), unlike a worker that registered on its
// own. One not up within Config.StartTimeout is counted lost and
// re-planned. The engine calls Close when it gives the instance up before
// it is up, then Provisioner.Release.
type Pending interface {
	Instance
	// Pending marks the instance as one that comes up later.
	Pending()
}

// Local provisions in-process workers with emulated GPUs (or Executor's),
// up to a per-type limit: the embedded default's provisioner.
type Local struct {
	Clock    clock.Clock
	Limit    map[profile.WorkerTypeID]int
	Engine   *Engine
	Ops      *modules.Registry // the CPU ops workers build
	Executor ExecutorFactory   // nil: emulated GPUs
	// Variance is the emulated GPUs' variance model (zero: exact), each
	// instance's seed derived from its ID; they share one gpu.Host (one
	// process's cores) for its contention.
	Variance gpu.Variance

	// deliver, when set, takes the workers' results instead of
	// Engine.Result: the fake-clock tests hold the results of workers
	// running at once and hand them over in task order, so which of two
	// concurrent results reaches the loop first is not left to chance.
	deliver func(id string, r worker.Result)

	mu      sync.Mutex
	workers map[string]*worker.Worker
	emu     map[string]*gpu.Emulated
	host    gpu.Host
}

// Limits implements Provisioner.
func (l *Local) Limits() map[profile.WorkerTypeID]int { return l.Limit }

// Start implements Provisioner.
func (l *Local) Start(id string, typ profile.WorkerTypeID) (Instance, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.workers == nil {
		l.workers, l.emu = map[string]*worker.Worker{}, map[string]*gpu.Emulated{}
	}
	if _, ok := l.workers[id]; ok {
		return nil, fmt.Errorf("instance %s already running", id)
	}
	n := 0
	for _, w := range l.workers {
		if w.Type == string(typ) {
			n++
		}
	}
	if n >= l.Limit[typ] {
		return nil, fmt.Errorf("local provisioner: %s limit %d reached", typ, l.Limit[typ])
	}
	e, deliver := l.Engine, l.deliver
	emit := func(r worker.Result) { e.Result(id, r) }
	if deliver != nil {
		emit = func(r worker.Result) { deliver(id, r) }
	}
	w := worker.NewWorker(id, string(typ), l.Clock, nil, l.Ops, emit)
	var em *gpu.Emulated
	if l.Executor != nil {
		x, err := l.Executor(id, typ)
		if err != nil {
			w.Close()
			return nil, fmt.Errorf("instance %s: executor: %w", id, err)
		}
		w.SetExecutor(x)
	} else {
		em = gpu.NewEmulated(l.Clock, w.Latency, gpu.WithVariance(l.Variance.Derive(id)), gpu.WithHost(&l.host))
		w.SetExecutor(em)
	}
	l.workers[id], l.emu[id] = w, em
	return w, nil
}

// Release implements Provisioner.
func (l *Local) Release(id string) {
	l.mu.Lock()
	w := l.workers[id]
	delete(l.workers, id)
	delete(l.emu, id)
	l.mu.Unlock()
	if w != nil {
		w.Close()
	}
}

// Emulated returns the emulated executor of an in-process instance, for
// tests and `--slowdown` (ballooning injection); nil when the instance runs
// another executor (Config.Executor).
func (l *Local) Emulated(id string) *gpu.Emulated {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.emu[id]
}

// Each calls f for every running in-process worker (em is nil for one
// that runs another executor than the emulated one).
func (l *Local) Each(f func(id string, w *worker.Worker, em *gpu.Emulated)) {
	l.mu.Lock()
	ids := make([]string, 0, len(l.workers))
	for id := range l.workers {
		ids = append(ids, id)
	}
	l.mu.Unlock()
	for _, id := range ids {
		l.mu.Lock()
		w, em := l.workers[id], l.emu[id]
		l.mu.Unlock()
		if w != nil {
			f(id, w, em)
		}
	}
}

// Close releases every worker.
func (l *Local) Close() {
	l.mu.Lock()
	ids := make([]string, 0, len(l.workers))
	for id := range l.workers {
		ids = append(ids, id)
	}
	l.mu.Unlock()
	for _, id := range ids {
		l.Release(id)
	}
}
