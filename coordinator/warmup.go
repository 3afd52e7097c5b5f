package coordinator

import (
	"fmt"
	"strings"
	"time"

	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/media"
	"github.com/mdag/mdag/scheduler"
	"github.com/mdag/mdag/worker"
)

// Warm-up (Triton's model_warmup, done by the runtime for every model):
// a model's first batches on an executor run cold. ONNX Runtime's first
// runs of a shape took 16-18 ms against 1.5-2 ms warm; a GPU whose clocks
// came down, a CUDA context, cuDNN's algorithm search, a first allocation
// do the same. A frame that meets a cold batch is late, and one whose
// batch runs most of the SLO (caption's 1.5 s S2VT, 3.4 s cold) cannot
// make it at all. So when Config.Warmup is set, a GPU module loaded onto
// an instance where it was not runs one batch of each power-of-two size
// its budget allows (warmSizes) on a blank frame first, and the scheduler
// gives its slots there no batch until those are done (Scheduler.Hold).
// Frames wait for the instances that are warm; the cold time is spent on
// no one's frame, for the sizes warmed (a size the budget rules out, or a
// module whose warm-up failed, still meets its first run cold; the first
// WarmupRuns of each size never teach the estimate).

// WarmupRuns is how many batches of each size a module runs on an instance
// after it is loaded there before their times count as measurements.
const WarmupRuns = 2

// warmFrame is the warm-up batches' input: blank, small (it crosses the
// wire to remote workers), resized by the executor like any frame.
const warmW, warmH = 320, 240

// warmSizes are the batch sizes a module warms up, by its l(b) (lat) and
// its budget (the plan's share of the SLO; 0: none known): the powers of
// two whose l(b) fits the budget, and the largest size that does (the
// scheduler's batches are cut to the budget); 1 always. Sizes the budget
// rules out would hold the slots for nothing (face's SSD takes 650 ms at
// 16 against a 400 ms SLO).
func warmSizes(lat []time.Duration, budget time.Duration) []int {
	fits := func(b int) bool { return budget <= 0 || lat[b-1] <= budget }
	top := 1
	for b := 2; b <= len(lat) && fits(b); b++ {
		top = b
	}
	var bs []int
	for b := 1; b < top; b *= 2 {
		bs = append(bs, b)
	}
	return append(bs, top)
}

// load gives instance in its modules (specs) and warms up each GPU module
// new to it. The error is the worker's (the modules it could not load);
// the others are loaded and warm up.
func (e *Engine) load(in *instState, specs []worker.ModuleSpec) error {
	in.loaded(specs)
	in.hosted = specs
	err := in.inst.Load(specs)
	keep := map[string]bool{}
	for _, sp := range specs {
		if sp.Kind != dag.GPU {
			continue
		}
		k := sp.Key()
		keep[k] = true
		if in.gpuMods[k] {
			continue
		}
		if in.gpuMods == nil {
			in.gpuMods = map[string]bool{}
		}
		in.gpuMods[k] = true
		if e.cfg.Warmup {
			e.warmUp(in, sp)
		}
	}
	for k := range in.gpuMods {
		if !keep[k] {
			delete(in.gpuMods, k) // unloaded: loaded again, it warms up again
		}
	}
	return err
}

// warmUp submits module sp's warm-up batches to in; its slots there are
// held from the scheduler until they are all answered (warmed).
func (e *Engine) warmUp(in *instState, sp worker.ModuleSpec) {
	k := sp.Key()
	if in.warm == nil {
		in.warm = map[string]int{}
	}
	var budget time.Duration
	ses := e.sessions[sp.App]
	if ses != nil && ses.mods[sp.Module] != nil {
		budget = ses.mods[sp.Module].budget
	}
	if ses != nil && ses.app.Media == dag.Audio {
		// Audio models take chunks, not frames: no blank input to warm
		// them with yet; they serve at once.
		e.log.Debug("no warm-up for an audio model", "instance", in.id, "module", k)
		return
	}
	// Each size once per slot: a runtime with a session per slot (ONNX
	// Runtime at concurrency 2) has each one meet the shape cold.
	for _, b := range warmSizes(sp.Latency, budget) {
		for range max(1, sp.Concurrency) {
			items := make([]*media.Item, b)
			for i := range items {
				items[i] = &media.Item{Stream: "warm-up", Frame: media.NewFrame(warmW, warmH)}
			}
			e.nextTask++
			id := e.nextTask
			e.tasks[id] = &taskState{id: id, inst: in.id, key: k, warm: true, cold: in.warming(k, b)}
			in.outstanding[id] = true
			in.warm[k]++
			in.inst.Submit(worker.Task{ID: id, App: sp.App, Module: sp.Module, Items: items})
		}
	}
	e.log.Debug("warming up", "instance", in.id, "module", k, "batches", in.warm[k])
	// Held from the scheduler now if it already has the slots (a plan
	// that loaded the module rebuilds it after: rebuildScheduler holds
	// them then).
	e.holdWarming(in, k)
}

// warmed takes the answer to a warm-up batch: once the module's last is
// in, its slots on the instance are the scheduler's.
func (e *Engine) warmed(t *taskState, r worker.Result) {
	in := e.insts[t.inst]
	if in == nil {
		return
	}
	switch r.Outcome {
	case worker.Done:
	case worker.NotLoaded, worker.Unloaded:
		// The module did not load (or went): loaded again, it warms up
		// again.
		delete(in.gpuMods, t.key)
	default:
		e.log.Warn("a warm-up batch failed; the module serves cold", "instance", in.id, "module", t.key,
			"outcome", r.Outcome.String(), "detail", r.Detail)
	}
	if in.warm[t.key]--; in.warm[t.key] > 0 {
		return
	}
	delete(in.warm, t.key)
	e.log.Debug("warm", "instance", in.id, "module", t.key)
	e.endBridges(t.key)
	// The session whose module it is (key: app/module) judges its finish
	// rate from now on, once all of it is warm.
	app, _, _ := strings.Cut(t.key, "/")
	if s := e.sessions[dag.AppID(app)]; s != nil && e.warm(s) {
		s.det.Warmed(e.now())
	}
	if e.sched == nil {
		return
	}
	now := e.schedTime(e.now())
	for _, g := range in.held[t.key] {
		e.sched.Hold(now, g, false)
	}
	delete(in.held, t.key)
	e.pump()
}

// holdWarming holds module key's slots on in while it warms up, in the
// current scheduler (the slots rebuildScheduler last gave it).
func (e *Engine) holdWarming(in *instState, key string) {
	if e.sched == nil || in.warm[key] == 0 || len(in.held[key]) > 0 {
		return
	}
	now := e.schedTime(e.now())
	for _, g := range e.slotsOf[in.id+"#"+key] {
		e.sched.Hold(now, g, true)
		if in.held == nil {
			in.held = map[string][]scheduler.GPUID{}
		}
		in.held[key] = append(in.held[key], g)
	}
}

// holdBusy holds, in a scheduler just built, the slots where batches an
// earlier one dispatched still run (it knows nothing of them: it would
// send another batch to a busy slot, to queue behind it on the worker and
// miss its window), and the slots of modules warming up.
func (e *Engine) holdBusy() {
	if e.sched == nil {
		return
	}
	now := e.schedTime(e.now())
	for _, t := range e.tasks {
		if t.action != nil && t.gen != e.schedGen {
			e.sched.Hold(now, t.action.GPU, true)
			t.heldIn = e.schedGen
		}
	}
	for _, in := range e.insts {
		in.held = nil
		for k := range in.warm {
			e.holdWarming(in, k)
		}
	}
}

// unhold gives back the slot held for t, a batch of an earlier scheduler,
// now answered, and says whether it did (the caller pumps what the
// scheduler then sent there).
func (e *Engine) unhold(t *taskState) bool {
	if t.action == nil || t.heldIn != e.schedGen || t.heldIn == 0 || e.sched == nil {
		return false
	}
	t.heldIn = 0
	e.sched.Hold(e.schedTime(e.now()), t.action.GPU, false)
	return true
}

// Ready says whether app has a plan and every instance its GPU modules
// are routed to has warmed them up: a stream that joins now meets no cold
// batch. An app with no GPU module is ready once planned.
func (e *Engine) Ready(app dag.AppID) bool {
	ready := false
	e.call(func() {
		s := e.sessions[app]
		ready = s != nil && s.plan != nil && e.warm(s)
	})
	return ready
}

// warm says whether every instance s's GPU modules are routed to is up
// and has warmed them up.
func (e *Engine) warm(s *session) bool {
	for _, ms := range s.mods {
		if ms.mod.Kind != dag.GPU {
			continue
		}
		for _, r := range ms.routes {
			in := e.insts[r.inst]
			if in == nil || in.pending || in.warm[ms.key] > 0 {
				return false
			}
		}
	}
	return true
}

// WaitReady waits up to timeout (on the engine's clock) for Ready(app),
// checking every 20 ms; an error says what it waited for. Not from the
// engine's loop, and not for a Stepped engine, whose caller moves its
// clock (it polls Ready).
func (e *Engine) WaitReady(app dag.AppID, timeout time.Duration) error {
	if e.cfg.Stepped {
		return fmt.Errorf("app %s: WaitReady on a Stepped engine would wait for ever: poll Ready between steps", app)
	}
	end := e.clk.Now().Add(timeout)
	for !e.Ready(app) {
		if !e.clk.Now().Before(end) {
			return fmt.Errorf("app %s: not planned and warm after %v", app, timeout)
		}
		select {
		case <-e.clk.After(20 * time.Millisecond):
		case <-e.done:
			return fmt.Errorf("app %s: the engine stopped", app)
		}
	}
	return nil
}
