package coordinator

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/mdag/mdag/coordinator/why"
	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/placement"
	"github.com/mdag/mdag/profile"
	"github.com/mdag/mdag/scheduler"
	"github.com/mdag/mdag/worker"
)

// registry is what the engine knows of the instances: live ones by ID,
// the IDs started as Pending, the ones given up on.
type registry struct {
	insts      map[string]*instState
	releaseDue bool                         // an instance a plan released finished its last work (releaseDrained)
	pendingIDs map[profile.WorkerTypeID]int // one past the highest ID number started as Pending, per type (placement.Snapshot.NextID)
	givenUp    map[string]time.Time         // instances started as Pending since released or lost: when (a late registration under the ID is refused)
}

// AddInstance adds a running instance: a worker that registered over
// gRPC. Under the ID of an instance the provisioner started as Pending (a
// Kubernetes pod) it binds the worker to that planned instance, which gets
// its loads and serves from then on (see Pending); under any other ID it is
// a worker the provisioner did not start: a registered instance, which
// no plan releases, and the engine re-plans.
func (e *Engine) AddInstance(id string, typ profile.WorkerTypeID, inst Instance) {
	e.post(func() {
		delete(e.ps.expect, id)
		if in := e.insts[id]; in != nil && in.pending {
			e.bind(in, typ, inst)
			return
		}
		if at, ok := e.givenUp[id]; ok && e.insts[id] == nil {
			// The worker of a pod the engine gave up (its pod is being
			// deleted): it is no instance of the plan's.
			e.log.Warn("a worker registered under the ID of a provisioned instance given up; closed", "instance", id, "type", typ, "given_up", at)
			inst.Close()
			return
		}
		e.insts[id] = &instState{id: id, typ: typ, inst: inst, state: placement.Warm, registered: true,
			releaseAt: e.clk.Now().Add(24 * time.Hour), outstanding: map[uint64]bool{}}
		e.log.Info("worker registered", "instance", id, "type", typ)
		e.trigger(why.OnWorkerRegistered, "worker "+id+" ("+string(typ)+") registered")
	})
}

// bind gives a Pending instance the connection of its worker, which just
// registered: it takes its planned loads and serves.
func (e *Engine) bind(in *instState, typ profile.WorkerTypeID, inst Instance) {
	if typ != in.typ {
		e.loseInstance(in.id, fmt.Sprintf("its worker registered as type %s, the plan started it as %s", typ, in.typ))
		inst.Close()
		return
	}
	if in.startTm != nil {
		in.startTm.Stop()
		in.startTm = nil
	}
	old := in.inst
	in.inst, in.pending = inst, false
	old.Close()
	if in.state == placement.Starting {
		in.state = placement.Active
	}
	took := e.now().Sub(in.startedAt)
	if err := e.load(in, e.specs(in)); err != nil {
		e.log.Error("loading a provisioned instance that came up failed", "instance", in.id, "err", err)
	}
	for _, k := range e.bridgedKeys() {
		e.endBridges(k) // what it hosts without a warm-up needs no bridge now
	}
	e.rebuildScheduler()
	// Stateful modules' streams may now move their state onto it.
	for _, s := range e.sessions {
		for _, m := range s.statefulMods {
			for st := range s.mods[m].affs {
				e.dirty(s, st)
			}
		}
	}
	e.log.Info("provisioned instance up", "instance", in.id, "type", in.typ, "took", took.Round(time.Millisecond), "modules", len(in.loads))
}

// giveUp records that a provisioned instance (started as Pending) is gone
// from the engine, so that a late registration under its ID is refused;
// records older than the start timeout and 10 minutes more go.
func (e *Engine) giveUp(in *instState) {
	if !in.provisioned {
		return
	}
	now := e.now()
	if e.givenUp == nil {
		e.givenUp = map[string]time.Time{}
	}
	for id, at := range e.givenUp {
		if now.Sub(at) > e.cfg.StartTimeout+10*time.Minute {
			delete(e.givenUp, id)
		}
	}
	e.givenUp[in.id] = now
}

// startPending watches a Pending instance's start: one whose worker has
// not registered within Config.StartTimeout is lost.
func (e *Engine) startPending(in *instState) {
	in.pending, in.provisioned, in.startedAt = true, true, e.now()
	timeout := e.cfg.StartTimeout
	in.startTm = e.clk.AfterFunc(timeout, func() {
		e.post(func() {
			if e.insts[in.id] == in && in.pending {
				e.loseInstance(in.id, fmt.Sprintf("not up within the start timeout of %v: its worker never registered", timeout))
			}
		})
	})
}

// startingFor lists the Pending instances (not up yet) the plan loaded
// module m of app onto, for the reason of a drop that found none up.
func (e *Engine) startingFor(app dag.AppID, m dag.ModuleID) string {
	var ids []string
	for _, in := range e.sortedInsts() {
		if !in.pending {
			continue
		}
		for _, l := range in.loads {
			if l.App == app && l.Module == m {
				ids = append(ids, in.id)
				break
			}
		}
	}
	if len(ids) == 0 {
		return ""
	}
	return " (planned on " + strings.Join(ids, ", ") + ", still starting)"
}

// LostInstance reports that an instance is gone (missed heartbeats, its
// stream broke, its process died): work in flight there is counted as
// dropped with reason worker-lost, and the engine re-plans at once.
func (e *Engine) LostInstance(id, why string) {
	e.post(func() { e.loseInstance(id, why) })
}

type instState struct {
	id          string
	typ         profile.WorkerTypeID
	inst        Instance
	state       placement.State
	releaseAt   time.Time
	loads       []placement.Load
	bridge      []placement.Load    // GPU modules a plan moved away, kept until their new instances are warm (bridge.go)
	hosted      []worker.ModuleSpec // what it was last given to host (load)
	registered  bool
	lost        bool
	draining    bool // Drain: no loads; its stateful modules' streams move out with their state
	outstanding map[uint64]bool
	releasing   bool // a plan released it while it still worked: released once idle (releaseDrained)
	byMod       map[string]map[uint64]bool
	// pending: the provisioner started it as Pending and its worker has
	// not registered yet (since startedAt; startTm is the start timeout).
	pending     bool
	provisioned bool // started as Pending (stays true once bound)
	startedAt   time.Time
	startTm     clock.Timer
	// runs counts, per hosted module (key) and batch size, the batches
	// started here (submitted, warm-up batches included; one the worker
	// never ran is taken back) since the module was loaded: the first
	// WarmupRuns of each are cold (warming).
	runs map[string]map[int]int
	// gpuMods are the GPU modules loaded here; warm counts each one's
	// warm-up batches still out, and held its slots held from the
	// current scheduler meanwhile (warmup.go).
	gpuMods map[string]bool
	warm    map[string]int
	held    map[string][]scheduler.GPUID
}

// allLoads is what in hosts for the plan: its loads, then its bridges.
func (in *instState) allLoads() []placement.Load {
	return append(slices.Clone(in.loads), in.bridge...)
}

// warming counts a batch of b of module key starting (submitted) and says
// whether it is a cold one. A nil instance (gone) counts nothing.
func (in *instState) warming(key string, b int) bool {
	if in == nil {
		return false
	}
	if in.runs == nil {
		in.runs = map[string]map[int]int{}
	}
	if in.runs[key] == nil {
		in.runs[key] = map[int]int{}
	}
	in.runs[key][b]++
	return in.runs[key][b] <= WarmupRuns
}

// unstarted takes back a batch warming counted that the worker rejected
// (it never ran).
func (in *instState) unstarted(key string, b int) {
	if in != nil && in.runs[key][b] > 0 {
		in.runs[key][b]--
	}
}

// loaded forgets the runs of modules the instance no longer hosts: loaded
// again, they start cold.
func (in *instState) loaded(specs []worker.ModuleSpec) {
	keep := map[string]bool{}
	for _, sp := range specs {
		keep[sp.Key()] = true
	}
	for k := range in.runs {
		if !keep[k] {
			delete(in.runs, k)
		}
	}
}

func (e *Engine) loseInstance(id, cause string) {
	in := e.insts[id]
	if in == nil || in.lost {
		return
	}
	in.lost = true
	if in.startTm != nil {
		in.startTm.Stop()
		in.startTm = nil
	}
	ids := make([]uint64, 0, len(in.outstanding))
	for t := range in.outstanding {
		ids = append(ids, t)
	}
	slices.Sort(ids)
	for _, tid := range ids {
		t := e.tasks[tid]
		if t == nil {
			continue
		}
		e.forget(t)
		if t.state != nil {
			e.onStateResult(t, nil)
			continue
		}
		if t.aff != nil {
			t.aff.busy = 0
		}
		for _, w := range t.works {
			e.drop(w, why.WorkerLost, cause)
		}
	}
	delete(e.insts, id)
	e.giveUp(in)
	in.inst.Close()
	if !in.registered && e.cfg.Provisioner != nil {
		e.cfg.Provisioner.Release(id)
	}
	e.statefulLost(id)
	e.log.Warn("worker lost", "instance", id, "type", in.typ, "why", cause, "in_flight_dropped", len(ids))
	e.rebuildScheduler()
	e.trigger(why.OnWorkerLost, "worker "+id+" lost: "+cause)
}

// Drain empties an instance: the next plan places nothing on it, moves its
// modules elsewhere (each stream's state of a stateful module with it,
// export then import, no frame lost) and keeps it, empty, until it leaves
// (a registered worker) or is released. What it runs meanwhile finishes.
// It is how an operator takes a worker out of service without losing
// work (`mdag drain`, POST /v1/instances/{id}/drain).
func (e *Engine) Drain(id string) error {
	var out error
	e.call(func() {
		in := e.insts[id]
		switch {
		case in == nil || in.lost:
			out = fmt.Errorf("instance %q: %w", id, ErrUnknownInstance)
		case in.draining:
		default:
			in.draining = true
			e.log.Warn("instance draining", "instance", id, "type", in.typ)
			e.trigger(why.OnDrain, "operator drains "+id)
		}
	})
	return out
}

// WorkerTypes is the set of worker types in the deployed apps' profiles:
// the types a registering worker may have.
func (e *Engine) WorkerTypes() map[profile.WorkerTypeID]bool {
	out := map[profile.WorkerTypeID]bool{}
	e.call(func() {
		for _, s := range e.sessions {
			for _, w := range s.cat.Workers() {
				out[w.Type] = true
			}
		}
	})
	return out
}

func (e *Engine) sortedInsts() []*instState {
	out := make([]*instState, 0, len(e.insts))
	for _, in := range e.insts {
		out = append(out, in)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].id < out[j].id })
	return out
}

// idNumber is N of placement's instance ID TYPE-N.
func idNumber(id string, typ profile.WorkerTypeID) (int, bool) {
	rest, ok := strings.CutPrefix(id, string(typ)+"-")
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(rest)
	return n, err == nil && n >= 0
}

// ErrUnknownInstance: Drain named no live instance.
var ErrUnknownInstance = errors.New("unknown instance")
