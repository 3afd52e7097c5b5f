// Package client is the worker side of mdag's gRPC transport: RunWorker
// connects a worker.Worker to a coordinator and serves its tasks; the
// direct data plane (Store, PeerServer, DataPlane) holds and serves frames
// between workers; Dial and DialTLS open the connections. Camera sources
// are package remote/source. It imports worker, media, gpu and
// remote/wire, never the coordinator or the planners, so `mdag worker`
// carries no planner code on its path.
package client

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	"github.com/mdag/mdag/api"
	"github.com/mdag/mdag/gpu"
	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/media"
	"github.com/mdag/mdag/modules"
	"github.com/mdag/mdag/remote/wire"
	"github.com/mdag/mdag/worker"
)

// Dial connects to a coordinator with mdag's message limits, in plaintext:
// loopback, or a Unix socket (unix:/PATH), which is talked to only when
// its server is of this process's uid or root (DialTLS is mutual TLS).
func Dial(addr string) (*grpc.ClientConn, error) {
	return dial(addr, insecure.NewCredentials())
}

// WorkerConfig configures RunWorker.
type WorkerConfig struct {
	ID   string
	Type string
	// Exec runs GPU batches; nil means the emulated executor (profiled
	// times from the loaded modules' specs).
	Exec  gpu.Executor
	Clock clock.Clock
	Log   *slog.Logger
	// Slowdown multiplies the emulated executor's times (ballooning
	// injection); 0 or 1 = none.
	Slowdown float64
	// Variance is the emulated executor's variance model (zero: exact),
	// its seed derived from ID (`mdag worker --variance`).
	Variance gpu.Variance
	// Ops builds the CPU modules the coordinator loads (the binary's
	// registry); nil: the pure-Go ops (modules.Builtin).
	Ops *modules.Registry
	// GPU describes the machine's GPUs for the coordinator's log (NVML's
	// summary, from the binary); empty: "unknown".
	GPU string
	// OnEmulated, when set, receives the emulated executor once made (tests
	// use it to slow the worker down live).
	OnEmulated func(*gpu.Emulated)
	// Emulate lists models Exec does not run: they run on the emulated
	// executor (profiled times, the synthetic ground truth echoed) and
	// every other model on Exec (`mdag worker --emulate`).
	Emulate []string
	// HealthInterval is how often, while connected, an executor that has
	// a health probe (Health(ctx) error: gpu/kserve's, its endpoints and
	// models) is probed, on Clock; default 1 s. HealthTimeout bounds one
	// probe (real time: it is gRPC's deadline); default 2 s.
	HealthInterval, HealthTimeout time.Duration
	// Data is the worker's side of the direct data plane (issue 25): its
	// peer address and store, and how it reaches other workers. nil: no
	// peer address (its outputs travel through the coordinator); frames
	// other workers hold are still fetched, in plaintext.
	Data *DataPlane
}

// healthProber is an executor that can say whether it can serve: one
// whose models run elsewhere (gpu/kserve).
type healthProber interface {
	Health(context.Context) error
}

// DefaultHealthInterval is WorkerConfig.HealthInterval's default.
const DefaultHealthInterval = time.Second

// RunWorker connects a worker to the coordinator at cc and serves until ctx
// ends or the stream breaks; it returns why. Callers reconnect (with
// backoff) by calling it again: the coordinator counts the old connection
// lost and the new one registers afresh.
//
// An executor with a health probe (gpu/kserve: its inference servers) is
// probed before registering, so a worker whose server is down does not
// register (RunWorker returns the reason; the caller retries), and every
// HealthInterval while connected: a failed probe ends the connection with
// the reason, so the coordinator counts the instance lost and re-plans
// its modules elsewhere; the caller's reconnect registers it again once
// the probe passes.
func RunWorker(ctx context.Context, cc *grpc.ClientConn, cfg WorkerConfig) error {
	s, err := newWorkerSession(cfg)
	if err != nil {
		return err
	}
	s.target = cc.Target()
	return s.run(ctx, func(ctx context.Context) (workerStream, error) {
		return api.NewCoordinatorClient(cc).Connect(ctx)
	})
}

func load(w *worker.Worker, l *api.Load) error {
	specs := make([]worker.ModuleSpec, 0, len(l.Modules))
	for _, p := range l.Modules {
		s, err := wire.SpecFromPB(p)
		if err != nil {
			return err
		}
		specs = append(specs, s)
	}
	return w.Load(specs)
}

// unchanged lists the modules (app/module) that next keeps as prev had
// them.
func unchanged(prev, next *api.Load) map[string]bool {
	out := map[string]bool{}
	if prev == nil {
		return out
	}
	was := map[string]*api.ModuleSpec{}
	for _, m := range prev.Modules {
		was[m.App+"/"+m.Module] = m
	}
	for _, m := range next.Modules {
		k := m.App + "/" + m.Module
		if p := was[k]; p != nil && proto.Equal(p, m) {
			out[k] = true
		}
	}
	return out
}

func moduleNames(l *api.Load) []string {
	out := make([]string, 0, len(l.Modules))
	for _, m := range l.Modules {
		out = append(out, m.App+"/"+m.Module)
	}
	sort.Strings(out)
	return out
}

// holdOutputs keeps the frames of a Done result's outputs in dp's store
// and returns the result with references in their place (the items are
// copied: the worker's own may still be in use). A frame shared by several
// outputs is held once; one smaller than dp.InlineBelow (a crop) stays
// inline.
func holdOutputs(r worker.Result, self string, dp *DataPlane, inline int) worker.Result {
	if r.Outcome != worker.Done {
		return r
	}
	var keys map[*media.Frame]uint64
	outs := make([][]*media.Item, len(r.Outputs))
	for i, list := range r.Outputs {
		outs[i] = list
		cloned := false
		for j, it := range list {
			f := it.Frame
			if f == nil || f.Ref != nil || len(f.Pix) == 0 || len(f.Pix) < inline {
				continue
			}
			if keys == nil {
				keys = map[*media.Frame]uint64{}
			}
			id, ok := keys[f]
			if !ok {
				if id, ok = dp.Store.Put(f, it.Deadline); !ok {
					continue // over the store's limit at once: inline
				}
				keys[f] = id
			}
			if !cloned {
				outs[i], cloned = slices.Clone(list), true
			}
			cp := *it
			cp.Frame = &media.Frame{W: f.W, H: f.H, Ref: &media.FrameRef{Holder: self, Addr: dp.Addr, ID: id}}
			outs[i][j] = &cp
		}
	}
	r.Outputs = outs
	return r
}

// pending hands tasks to the worker once their frames are here: a task
// whose frames are all in this worker's store (or inline) goes at once;
// the others wait their turn in one queue, oldest first, for one of
// maxRun fetchers (oldest first: under overload the oldest frames still
// finish, rather than every frame sharing the CPU and none finishing).
// A dead holder holds up at most the fetchers on it, until its first
// fetch fails; its later ones then fail at once (fetcher.markDown).
// Order between tasks is not needed: the coordinator sends a stateful
// module one task at a time per stream. A module load that removes or
// changes a module waits for that module's tasks queued or fetching before
// it (barrier), so none meets its module unloaded after it was sent. Past
// maxQueue tasks waiting, the next is answered QueueFull at once, as a
// full module queue is.
type pending struct {
	ctx      context.Context
	w        *worker.Worker
	fx       *fetcher
	fail     func(worker.Task, worker.Outcome, string)
	maxRun   int
	maxQueue int
	mu       sync.Mutex
	idle     *sync.Cond // on mu: a module's last queued task left
	queue    []worker.Task
	running  int
	by       map[string]int // tasks queued or fetching, by module (app/module)
	wg       sync.WaitGroup
}

// pending's defaults.
const (
	maxFetchers  = 4
	maxFetchWait = 256
)

func newPending(ctx context.Context, w *worker.Worker, fx *fetcher, fail func(worker.Task, worker.Outcome, string)) *pending {
	o := &pending{ctx: ctx, w: w, fx: fx, fail: fail, maxRun: maxFetchers, maxQueue: maxFetchWait, by: map[string]int{}}
	o.idle = sync.NewCond(&o.mu)
	return o
}

func moduleKey(t worker.Task) string { return string(t.App) + "/" + string(t.Module) }

func (o *pending) submit(t worker.Task) {
	refs := refsOf(t.Items)
	if o.fx.allLocal(refs) {
		if err := o.fx.resolve(o.ctx, refs); err != nil {
			o.fail(t, worker.PeerLost, err.Error())
			return
		}
		o.w.Submit(t)
		return
	}
	o.mu.Lock()
	if len(o.queue) >= o.maxQueue {
		o.mu.Unlock()
		o.fail(t, worker.QueueFull, fmt.Sprintf("%d tasks are waiting for their frames from other workers on this worker", o.maxQueue))
		return
	}
	o.queue = append(o.queue, t)
	o.by[moduleKey(t)]++
	if o.running < o.maxRun {
		o.running++
		o.wg.Add(1)
		go o.run()
	}
	o.mu.Unlock()
}

// run fetches the frames of the queue's tasks, oldest first, until it is
// empty.
func (o *pending) run() {
	defer o.wg.Done()
	for {
		o.mu.Lock()
		if len(o.queue) == 0 {
			o.running--
			o.mu.Unlock()
			return
		}
		t := o.queue[0]
		o.queue[0] = worker.Task{}
		o.queue = o.queue[1:]
		o.mu.Unlock()
		if err := o.fx.resolve(o.ctx, refsOf(t.Items)); err != nil {
			o.fail(t, worker.PeerLost, err.Error())
		} else {
			o.w.Submit(t)
		}
		o.mu.Lock()
		k := moduleKey(t)
		if o.by[k]--; o.by[k] == 0 {
			delete(o.by, k)
			o.idle.Broadcast()
		}
		o.mu.Unlock()
	}
}

// barrier waits until no task of the modules keep does not list (by
// key) is fetching: those a load removes or changes.
func (o *pending) barrier(keep map[string]bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for {
		busy := false
		for k := range o.by {
			if !keep[k] {
				busy = true
			}
		}
		if !busy {
			return
		}
		o.idle.Wait()
	}
}

// wait waits for every task fetching now.
func (o *pending) wait() { o.wg.Wait() }
