package eval

import (
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/mdag/mdag/coordinator"
	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/gpu"
	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/media"
	"github.com/mdag/mdag/modules"
	"github.com/mdag/mdag/profile"
	"github.com/mdag/mdag/worker"
)

// provisioner starts virtual workers: coordinator.Instance values that run
// in virtual time on the engine's fake clock. A task's result reaches the
// engine when its profiled time has passed: a GPU batch takes l(b) of its
// module's profile at the configured concurrency (what gpu.Emulated
// sleeps), a CPU task its profiled per-item time for each item. CPU ops
// really run (the pure-Go ones: crop, count, track on small frames), so
// fan-out, labels and tracks are the real ones; GPU models answer as the
// emulated executor does (gpu.EmulatedOutputs). Queues behave as the
// worker's: a CPU module holds 8 tasks per pool slot (2048 for stateful
// ones) before it answers queue-full; a GPU task that cannot start by its
// window's end is rejected.
type provisioner struct {
	clk    *clock.Fake
	e      *coordinator.Engine
	limits map[profile.WorkerTypeID]int
	prices map[profile.WorkerTypeID]float64
	ops    *modules.Registry
	insts  map[string]*vinst
	bill   *bill
}

// bill is what the instances cost: each one from its start to its release,
// within the run (the drain after it, while the last frames end, is not
// billed: every system pays for the same span); types the system pays for
// regardless (the Nexus-style front-ends) are left out.
type bill struct {
	running map[string]billed // by instance ID
	spent   float64           // dollars of the instances released
	starts  int
	end     time.Time
	exclude map[profile.WorkerTypeID]bool
}

type billed struct {
	typ   profile.WorkerTypeID
	since time.Time
	price float64 // per hour
}

func newBill(end time.Time, exclude map[profile.WorkerTypeID]bool) *bill {
	return &bill{running: map[string]billed{}, end: end, exclude: exclude}
}

// stop ends instance id's bill at now (at most the run's end).
func (b *bill) stop(id string, now time.Time) {
	x, ok := b.running[id]
	if !ok {
		return
	}
	delete(b.running, id)
	if !b.exclude[x.typ] && now.After(x.since) {
		b.spent += x.price * minTime(now, b.end).Sub(minTime(x.since, b.end)).Hours()
	}
}

// rate is the cost per hour of the instances running.
func (b *bill) rate() float64 {
	r := 0.0
	for _, id := range b.ids() {
		if x := b.running[id]; !b.exclude[x.typ] {
			r += x.price
		}
	}
	return r
}

func (b *bill) ids() []string { return slices.Sorted(maps.Keys(b.running)) }

func (p *provisioner) Limits() map[profile.WorkerTypeID]int { return p.limits }

func (p *provisioner) Start(id string, typ profile.WorkerTypeID) (coordinator.Instance, error) {
	if p.insts[id] != nil {
		return nil, fmt.Errorf("instance %s already running", id)
	}
	n := 0
	for _, in := range p.insts {
		if in.typ == typ {
			n++
		}
	}
	if n >= p.limits[typ] {
		return nil, fmt.Errorf("virtual provisioner: %s limit %d reached", typ, p.limits[typ])
	}
	in := &vinst{p: p, id: id, typ: typ, mods: map[string]*vmod{}}
	p.insts[id] = in
	p.bill.running[id] = billed{typ: typ, since: p.clk.Now(), price: p.prices[typ]}
	p.bill.starts++
	return in, nil
}

func (p *provisioner) Release(id string) {
	in := p.insts[id]
	if in == nil {
		return
	}
	in.Close()
	delete(p.insts, id)
	p.bill.stop(id, p.clk.Now())
}

// vinst is one virtual worker instance.
type vinst struct {
	p      *provisioner
	id     string
	typ    profile.WorkerTypeID
	mods   map[string]*vmod
	closed bool
	result func(worker.Result) // tests: takes the results instead of the engine
}

// vmod is a module hosted on a virtual instance.
type vmod struct {
	spec     worker.ModuleSpec
	proc     modules.Processor
	stateful modules.Stateful
	free     []time.Time // when each pool slot (CPU) or device slot (GPU) is next free
	starts   []time.Time // CPU: start times of accepted tasks not yet started (the queue)
}

// Load implements coordinator.Instance: as worker.Worker.Load, a module
// that stays keeps its processor (and its streams' state); one that leaves
// finishes what it was given (its results are already scheduled).
func (in *vinst) Load(specs []worker.ModuleSpec) error {
	if in.closed {
		return fmt.Errorf("instance %s is closed", in.id)
	}
	want := map[string]worker.ModuleSpec{}
	for _, s := range specs {
		want[s.Key()] = s
	}
	for _, k := range slices.Sorted(maps.Keys(in.mods)) {
		m := in.mods[k]
		s, ok := want[k]
		if !ok || s.Kind != m.spec.Kind || s.Op != m.spec.Op || s.Model != m.spec.Model || fmt.Sprint(s.Params) != fmt.Sprint(m.spec.Params) {
			if m.proc != nil {
				m.proc.Close()
			}
			delete(in.mods, k)
			continue
		}
		m.spec = s
		m.resize(max(1, s.Concurrency))
	}
	var errs []error
	for _, k := range slices.Sorted(maps.Keys(want)) {
		if in.mods[k] != nil {
			continue
		}
		s := want[k]
		m := &vmod{spec: s}
		m.resize(max(1, s.Concurrency))
		if s.Kind == dag.CPU {
			p, err := in.p.ops.New(modules.OpID(s.Op), s.Params)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", k, err))
				continue
			}
			m.proc = p
			if op, _ := modules.Lookup(modules.OpID(s.Op)); op.Stateful {
				st, ok := p.(modules.Stateful)
				if !ok {
					p.Close()
					errs = append(errs, fmt.Errorf("%s: op %s keeps per-stream state but its processor cannot snapshot it", k, s.Op))
					continue
				}
				m.stateful = st
			}
		}
		in.mods[k] = m
	}
	if len(errs) > 0 {
		return fmt.Errorf("virtual worker %s: %v", in.id, errs)
	}
	return nil
}

// resize sets the number of slots, keeping the first ones' free times.
func (m *vmod) resize(n int) {
	for len(m.free) < n {
		m.free = append(m.free, time.Time{})
	}
	m.free = m.free[:n]
}

// slot returns the index of the slot free first.
func (m *vmod) slot() int {
	best := 0
	for i, t := range m.free {
		if t.Before(m.free[best]) {
			best = i
		}
	}
	return best
}

// Submit implements coordinator.Instance.
func (in *vinst) Submit(t worker.Task) {
	now := in.p.clk.Now()
	if in.closed {
		in.deliver(now, worker.Result{Task: t.ID, Outcome: worker.Unloaded})
		return
	}
	m := in.mods[string(t.App)+"/"+string(t.Module)]
	switch {
	case m == nil:
		in.deliver(now, worker.Result{Task: t.ID, Outcome: worker.NotLoaded})
	case m.spec.Kind == dag.GPU:
		in.runGPU(now, m, t)
	default:
		in.runCPU(now, m, t)
	}
}

func (in *vinst) runGPU(now time.Time, m *vmod, t worker.Task) {
	if t.Kind != worker.Run {
		in.deliver(now, worker.Result{Task: t.ID, Outcome: worker.BadTask, Detail: fmt.Sprintf("%s task for GPU module %s", t.Kind, m.spec.Key())})
		return
	}
	i := m.slot()
	start := maxTime(now, m.free[i], t.Earliest)
	if !t.Latest.IsZero() && start.After(t.Latest) {
		// The device loop took it at max(now, free), waited for Earliest
		// and found it too late: the slot is free again at once.
		m.free[i] = start
		in.deliver(start, worker.Result{Task: t.ID, Outcome: worker.Rejected})
		return
	}
	b := len(t.Items)
	if b < 1 || b > len(m.spec.Latency) {
		in.deliver(start, worker.Result{Task: t.ID, Outcome: worker.ExecutorError,
			Detail: fmt.Sprintf("emulated: no profile for model %q at batch %d", m.spec.Model, b)})
		return
	}
	d := m.spec.Latency[b-1]
	m.free[i] = start.Add(d)
	in.deliver(start.Add(d), worker.Result{Task: t.ID, Outputs: gpu.EmulatedOutputs(t.Items), Measured: d})
}

func (in *vinst) runCPU(now time.Time, m *vmod, t worker.Task) {
	// The queue: accepted tasks not started yet (FIFO over the pool, so
	// start times never decrease).
	k := 0
	for k < len(m.starts) && !m.starts[k].After(now) {
		k++
	}
	m.starts = m.starts[k:]
	limit := 8 * len(m.free)
	if m.stateful != nil {
		limit = max(limit, 2048)
	}
	if len(m.starts) >= limit {
		in.deliver(now, worker.Result{Task: t.ID, Outcome: worker.QueueFull})
		return
	}
	per := time.Duration(0)
	if len(m.spec.Latency) > 0 {
		per = m.spec.Latency[0]
	}
	i := m.slot()
	start := maxTime(now, m.free[i])
	var r worker.Result
	d := time.Duration(0)
	if m.stateful != nil || t.Kind != worker.Run {
		r = worker.RunStateTask(m.stateful, m.spec.Op, t)
		if t.Kind == worker.Run {
			d = per * time.Duration(len(t.Items))
		}
	} else {
		r = worker.Result{Task: t.ID, Outputs: make([][]*media.Item, len(t.Items))}
		for j, it := range t.Items {
			out, err := m.proc.Process(it)
			if err != nil {
				r = worker.Result{Task: t.ID, Outcome: worker.ModuleError, Detail: err.Error()}
				break
			}
			r.Outputs[j] = out
		}
		d = per * time.Duration(len(t.Items))
	}
	r.Measured = d
	m.free[i] = start.Add(d)
	if start.After(now) {
		m.starts = append(m.starts, start)
	}
	in.deliver(start.Add(d), r)
}

// deliver hands r to the engine at virtual time at.
func (in *vinst) deliver(at time.Time, r worker.Result) {
	emit := in.result
	if emit == nil {
		e, id := in.p.e, in.id
		emit = func(r worker.Result) { e.Result(id, r) }
	}
	in.p.clk.AfterFunc(at.Sub(in.p.clk.Now()), func() { emit(r) })
}

// Close implements coordinator.Instance: later tasks answer Unloaded.
func (in *vinst) Close() {
	if in.closed {
		return
	}
	in.closed = true
	for _, k := range slices.Sorted(maps.Keys(in.mods)) {
		if p := in.mods[k].proc; p != nil {
			p.Close()
		}
	}
	in.mods = map[string]*vmod{}
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

func maxTime(ts ...time.Time) time.Time {
	m := ts[0]
	for _, t := range ts[1:] {
		if t.After(m) {
			m = t
		}
	}
	return m
}
