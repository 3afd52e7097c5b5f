package coordinator

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/mdag/mdag/coordinator/why"
	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/scheduler"
)

// ProbeAfter: a GPU module whose requests the scheduler has dropped as
// unable to finish, ProbeDrops of them with no batch of it finishing for
// this long, has its estimate reset to the profile, so the next requests
// run and measure it again. A slowdown that is real is then measured again
// and learned (ballooning); a stale one (a stall, a cold run, a neighbour
// gone) stops costing every frame.
const (
	ProbeAfter = time.Second
	ProbeDrops = 4
)

// gpuPath is the GPU modules' path through the central scheduler: the
// scheduler of the current plan, its slots (a GPU ID per instance, module
// and concurrent slot) and the requests waiting in it.
type gpuPath struct {
	sched    scheduler.Scheduler
	schedGen int
	schedSig string
	schedTm  clock.Timer
	schedAt  scheduler.Time
	reqs     map[uint64]*work // GPU requests waiting in the scheduler
	nextReq  uint64
	gpuIDs   map[string]scheduler.GPUID
	gpuInst  map[scheduler.GPUID]string
	slotsOf  map[string][]scheduler.GPUID // "instance#module key": its slots in the current scheduler
	nextGPU  scheduler.GPUID
}

func (e *Engine) schedTime(t time.Time) scheduler.Time { return t.Sub(e.epoch0) }

func (e *Engine) wallTime(t scheduler.Time) time.Time { return e.epoch0.Add(t) }

func (e *Engine) arriveGPU(w *work) {
	ms := w.s.mods[w.m]
	if e.sched == nil || !ms.scheduled {
		e.drop(w, why.NoInstance, "no live GPU hosts the model"+e.startingFor(w.s.app.Name, w.m))
		return
	}
	now := e.now()
	// The frame's SLO is the bound: a request is dropped only when it can
	// no longer finish by its frame's deadline less the fastest possible
	// rest of the graph (hard). A 2 ms split of a 600 ms SLO used to drop
	// every frame that a 17 ms cold batch or a shared core delayed. The
	// scheduler aims first at the plan's target (soft: the frame's deadline
	// less the plan's time for the rest of the graph), so a work-conserving
	// policy does not grow a batch into the time the modules after it were
	// planned to have; a request that cannot meet its target any more is
	// put back in line with the hard bound (rescue, in pump), never dropped
	// for missing the plan.
	hard := w.f.deadline.Add(-w.s.minTail[w.m])
	dl := hard
	w.hard = time.Time{}
	if soft := w.f.deadline.Add(-w.s.planTail[w.m]); soft.Before(hard) && !soft.Before(now.Add(ms.budget+e.cfg.DispatchDelay)) {
		dl, w.hard = soft, hard
	}
	e.nextReq++
	e.reqs[e.nextReq] = w
	e.sched.Arrive(e.schedTime(now), scheduler.Request{ID: e.nextReq, Model: ms.model, Arrival: e.schedTime(now), Deadline: e.schedTime(dl)})
	e.pump()
}

// probe counts a scheduler cannot-finish drop of module ms and resets the
// model's estimate when the drops have gone on with nothing run.
func (e *Engine) probe(ms *modState) {
	ms.expired++
	now := e.now()
	if ms.expired < ProbeDrops || now.Sub(ms.lastDone) < ProbeAfter || e.sched == nil {
		return
	}
	est := e.sched.Estimator()
	e.log.Warn("scheduler estimate re-measured: it let no batch run", "module", ms.key,
		"dropped", ms.expired, "since_last_batch", now.Sub(ms.lastDone).Round(time.Millisecond),
		"estimate_b1", est.Estimate(ms.model, 1), "profiled_b1", est.Profiled(ms.model, 1))
	est.Reset(ms.model)
	ms.expired, ms.lastDone = 0, now
}

// rescue puts a request that missed the plan's target back in line with
// its hard bound: the frame's SLO still has room.
func (e *Engine) rescue(w *work) {
	hard := w.hard
	w.hard = time.Time{}
	now := e.now()
	e.nextReq++
	e.reqs[e.nextReq] = w
	e.sched.Arrive(e.schedTime(now), scheduler.Request{ID: e.nextReq, Model: w.s.mods[w.m].model, Arrival: e.schedTime(now), Deadline: e.schedTime(hard)})
}

// pump carries out what the scheduler decided and re-arms its timer.
func (e *Engine) pump() {
	if e.sched == nil {
		return
	}
	acts, drops := e.sched.Take()
	rescued := false
	for _, d := range drops {
		w := e.reqs[d.Request.ID]
		delete(e.reqs, d.Request.ID)
		if w != nil {
			if d.Reason == scheduler.DropExpired && !w.hard.IsZero() {
				e.rescue(w)
				rescued = true
				continue
			}
			if d.Reason == scheduler.DropExpired {
				e.probe(w.s.mods[w.m])
			}
			w.s.mods[w.m].mx.SchedulerDrop(schedulerDrop(d.Reason))
			e.drop(w, schedulerDrop(d.Reason), fmt.Sprintf("scheduler at +%v, deadline +%v, capture +%v", d.At, d.Request.Deadline, e.schedTime(w.f.capture)))
		}
	}
	for _, a := range acts {
		var ws []*work
		var ids []uint64
		for _, r := range a.Requests {
			if w := e.reqs[r.ID]; w != nil {
				ws = append(ws, w)
				ids = append(ids, r.ID)
				delete(e.reqs, r.ID)
			}
		}
		if len(ws) == 0 {
			continue
		}
		ws[0].s.mods[ws[0].m].mx.Batch(len(ws))
		in := e.insts[e.gpuInst[a.GPU]]
		if in == nil || in.lost {
			for _, w := range ws {
				e.drop(w, why.WorkerLost, "the GPU's instance is gone")
			}
			continue
		}
		// The batch may start as soon as its worker has it: the GPU is
		// free (the scheduler dispatches only to a free one), and the
		// dispatch margin (a.Earliest is now + DispatchDelay) is what
		// the scheduler reserves for getting it there, not a wait to
		// impose: waiting it out idled the GPU for the margin on every
		// batch (10 ms of each 15 ms batch of the tracker's reid).
		e.submit(in, ws, ids, e.now(), e.wallTime(a.Latest), a)
	}
	if rescued {
		// The rescued requests went back in line after Take: what the
		// scheduler decided for them is taken now (each is rescued once).
		e.pump()
		return
	}
	next := e.sched.Next()
	if next == scheduler.Never {
		return
	}
	if e.schedTm != nil && e.schedAt == next {
		return
	}
	if e.schedTm != nil {
		e.schedTm.Stop()
	}
	e.schedAt = next
	gen := e.schedGen
	e.schedTm = e.clk.AfterFunc(max(0, e.wallTime(next).Sub(e.now())), func() {
		e.post(func() {
			if gen != e.schedGen || e.schedAt != next {
				return
			}
			e.schedTm = nil
			e.sched.Tick(e.schedTime(e.now()))
			e.pump()
		})
	})
}

// rebuildScheduler gives the central scheduler the GPUs and models of the
// live routing tables. An unchanged set keeps the scheduler (and its rate
// estimates); a changed one replaces it: requests waiting in it are handed
// to the new one, and batches still running on GPUs finish normally (a GPU
// the new scheduler over-books rejects the late action, which is how the
// scheduler learns of it).
//
// A scheduler that cannot be built (a model's table refused) leaves its
// GPU modules unserved: the error is logged here and is the plan's problem.
func (e *Engine) rebuildScheduler() error {
	cfg := scheduler.Config{NoLoadShed: true, Network: scheduler.Network{Control: e.cfg.DispatchDelay}}
	gpuSet := map[scheduler.GPUID]bool{}
	e.slotsOf = map[string][]scheduler.GPUID{}
	var sig strings.Builder
	apps := make([]dag.AppID, 0, len(e.sessions))
	for id := range e.sessions {
		apps = append(apps, id)
	}
	slices.Sort(apps)
	for _, id := range apps {
		s := e.sessions[id]
		for _, m := range s.g.Order() {
			ms := s.mods[m]
			ms.scheduled = false
			if ms.mod.Kind != dag.GPU {
				continue
			}
			model, ok := e.schedModel(s, m, gpuSet)
			if !ok {
				continue
			}
			cfg.Models = append(cfg.Models, model)
			ms.scheduled = true
			if ms.lastDone.IsZero() {
				ms.lastDone = e.now() // the probe's clock starts with the model's first scheduler
			}
			fmt.Fprintf(&sig, "%s %v %v %v %.6g %.6g|", model.ID, model.SLO, model.Latency, model.GPUs, model.Rate, model.Shares)
		}
	}
	for g := range gpuSet {
		cfg.GPUs = append(cfg.GPUs, g)
	}
	slices.Sort(cfg.GPUs)
	if sig.String() == e.schedSig && e.sched != nil {
		return nil
	}
	e.schedSig = sig.String()
	return e.replaceScheduler(cfg)
}

// schedModel is a GPU module as the central scheduler sees it: its own
// slots on each instance it is routed to (added to gpuSet), its latency
// table, its budget as the SLO and, for the nexus policy, its rate and
// slot shares; false when no live instance serves it.
func (e *Engine) schedModel(s *session, m dag.ModuleID, gpuSet map[scheduler.GPUID]bool) (scheduler.Model, bool) {
	ms := s.mods[m]
	var ids []scheduler.GPUID
	share := map[scheduler.GPUID]float64{} // placement's rate for each slot (the nexus policy's packing)
	var table []time.Duration
	for _, r := range ms.routes {
		in := e.insts[r.inst]
		if in == nil || in.lost {
			continue
		}
		// Each module has its own slots on an instance: the plan gives
		// co-located modules fractions of the GPU that run side by side
		// (Scrooge's partial allocations). Slots shared by the instance's
		// modules made a 10 ms AlexNet batch wait out a 1.5 s S2VT batch
		// on the same P100 (caption: features took 565 ms against a 46 ms
		// budget).
		for slot := range max(1, ms.conc[r.inst]) {
			gid := e.gpuID(fmt.Sprintf("%s#%s#%d", r.inst, ms.key, slot))
			ids = append(ids, gid)
			e.slotsOf[r.inst+"#"+ms.key] = append(e.slotsOf[r.inst+"#"+ms.key], gid)
			gpuSet[gid] = true
			share[gid] += r.weight / float64(max(1, ms.conc[r.inst]))
		}
		if l := ms.gpuLat[r.inst]; len(table) == 0 || len(l) > 0 && l[0] > table[0] {
			table = l
		}
	}
	if len(ids) == 0 || len(table) == 0 {
		return scheduler.Model{}, false
	}
	slices.Sort(ids)
	slo := ms.budget
	if slo <= 0 {
		slo = s.app.SLO
	}
	// The nexus policy packs models onto GPUs by their expected rates: the
	// allocation's (the others estimate online).
	rate := 0.0
	var shares []float64
	if e.cfg.Policy == scheduler.Nexus {
		if s.alloc != nil {
			for _, ma := range s.alloc.Modules {
				if ma.Module == m {
					rate = ma.Rate
				}
			}
		}
		for _, g := range ids {
			shares = append(shares, share[g])
		}
	}
	return scheduler.Model{ID: ms.model, SLO: slo, Latency: table, GPUs: ids, Rate: rate, Shares: shares}, true
}

// replaceScheduler starts a new central scheduler from cfg (none when no
// GPU module is served) and hands it the requests the old one held, in
// their order.
func (e *Engine) replaceScheduler(cfg scheduler.Config) error {
	e.schedGen++
	if e.schedTm != nil {
		e.schedTm.Stop()
		e.schedTm = nil
	}
	waiting := e.reqs
	e.reqs = map[uint64]*work{}
	e.sched = nil
	var rebuildErr error
	if len(cfg.Models) > 0 {
		sc, err := scheduler.New(e.cfg.Policy, cfg)
		if err != nil {
			e.log.Error("scheduler rebuild failed: GPU modules are unserved", "err", err)
			rebuildErr = fmt.Errorf("GPU modules unserved: %w", err)
		} else {
			e.sched = sc
			e.holdBusy() // before anything arrives in it
		}
	}
	ids := make([]uint64, 0, len(waiting))
	for id := range waiting {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		e.arriveGPU(waiting[id])
	}
	return rebuildErr
}

func (e *Engine) gpuID(slot string) scheduler.GPUID {
	if id, ok := e.gpuIDs[slot]; ok {
		return id
	}
	e.nextGPU++
	e.gpuIDs[slot] = e.nextGPU
	inst, _, _ := strings.Cut(slot, "#")
	e.gpuInst[e.nextGPU] = inst
	return e.nextGPU
}
