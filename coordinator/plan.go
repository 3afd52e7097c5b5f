package coordinator

import (
	"context"
	"fmt"
	"maps"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/mdag/mdag/allocator"
	"github.com/mdag/mdag/coordinator/why"
	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/placement"
	"github.com/mdag/mdag/profile"
	"github.com/mdag/mdag/worker"
)

// planDriver runs the planning rounds: the triggers waiting for one, the
// history of plans applied, the timers that re-plan (adaptation tick,
// turn-off, the minimum gap).
type planDriver struct {
	planning    bool
	replanDue   []string      // triggers waiting for the running plan to finish
	dueKinds    []why.Trigger // their kinds (and the next plan's)
	replans     []Replan
	nextPlan    int
	lastApplied *Replan // the last plan applied, recorded or not
	unchanged   int     // recorded re-plans that changed nothing
	tickTm      clock.Timer
	turnOffTm   clock.Timer
	gapTm       clock.Timer // MinReplanGap: the deferred re-plan
	lastPlanAt  time.Time   // when the last planning round started
	lastEpoch   time.Time
}

// Replan records one planning round: why it ran and what it changed.
type Replan struct {
	N              int                  `json:"n"`
	At             time.Time            `json:"at"`
	Trigger        string               `json:"trigger"`
	Kinds          []why.Trigger        `json:"kinds"` // what kinds of event asked for it (why.Triggers)
	PlanMS         float64              `json:"plan_ms"`
	Moves          []placement.Move     `json:"moves"`
	CostWhole      float64              `json:"cost_whole_per_hour"`
	CostFractional float64              `json:"cost_fractional_per_hour"`
	Shortages      []placement.Shortage `json:"shortages,omitempty"`
	Problems       []string             `json:"problems,omitempty"`
	// Bridges: GPU modules the plan moved that stay where they run warm
	// until their new instances are ("P100-0 keeps face/detect"; bridge.go).
	Bridges  []string         `json:"bridges,omitempty"`
	Sessions []PlannedSession `json:"sessions"`
	// Unchanged: the plan changed nothing against the one before (no
	// moves, same allocations); an event-driven re-plan that changes
	// nothing is a defect to look into (periodic checks that change
	// nothing are not recorded at all).
	Unchanged bool `json:"unchanged,omitempty"`
}

// PlannedSession is one session's allocation in a replan.
type PlannedSession struct {
	App      dag.AppID                `json:"app"`
	Rate     float64                  `json:"rate"`
	Scale    map[dag.ModuleID]float64 `json:"scale,omitempty"`
	Balloon  map[dag.ModuleID]float64 `json:"balloon,omitempty"`
	Feasible bool                     `json:"feasible"`
	Reason   string                   `json:"reason,omitempty"`
	Cost     float64                  `json:"cost_per_hour"`
	Critical float64                  `json:"critical_latency_ms"`
	IngestMS float64                  `json:"ingest_reserve_ms,omitempty"` // the SLO it planned with is the app's less this
	Admitted float64                  `json:"admitted"`                    // share of the session's frames the plan carries (below 1: the rest are shed)
	Headroom float64                  `json:"headroom,omitempty"`          // multiplier of the engine's headroom, > 1 after finish-rate triggers
}

type planInput struct {
	app     *dag.App
	g       *dag.Graph
	cat     *profile.Catalog
	rate    float64
	scale   map[dag.ModuleID]float64
	balloon map[dag.ModuleID]float64
	reserve time.Duration // of the SLO, for the delay before frames reach the session
	extra   float64       // the session's multiplier of the engine's headroom (finish-rate triggers)
}

type planOutput struct {
	trigger string
	kinds   []why.Trigger
	snapIDs map[string]bool
	plan    placement.Plan
	allocs  map[dag.AppID]*allocator.Allocation
	admit   map[dag.AppID]float64 // share of each session's frames the plan carries (1: all)
	kept    []dag.AppID           // sessions infeasible at any rate: their previous allocation re-placed
	// appProblem is each session's planning problem ("" for none); problems
	// lists them, "app: problem", with the round's own (shortages).
	appProblem map[dag.AppID]string
	inputs     map[dag.AppID]planInput
	problems   []string
	took       time.Duration
}

// trigger counts an event of kind (join, leave, scaling, ballooning,
// epoch, worker-registered, worker-lost, ingest, turn-off) and re-plans for it.
func (e *Engine) trigger(kind why.Trigger, text string) {
	e.cfg.Observer.Trigger(kind)
	e.dueKinds = append(e.dueKinds, kind)
	e.replan(text)
}

// replan starts a planning round, or queues the trigger when one is
// running (its outcome re-plans once more with every queued trigger).
func (e *Engine) replan(trigger string) {
	if e.planning {
		e.replanDue = append(e.replanDue, trigger)
		return
	}
	now := e.now()
	if gap := e.cfg.MinReplanGap; gap > 0 && !e.lastPlanAt.IsZero() && now.Sub(e.lastPlanAt) < gap && !e.unplanned() {
		e.replanDue = append(e.replanDue, trigger)
		if e.gapTm == nil {
			e.gapTm = e.clk.AfterFunc(e.lastPlanAt.Add(gap).Sub(now), func() {
				e.post(func() {
					e.gapTm = nil
					if len(e.replanDue) > 0 && !e.planning {
						e.replan(e.takeDue())
					}
				})
			})
		}
		return
	}
	e.lastPlanAt = now
	e.planning = true
	inputs := map[dag.AppID]planInput{}
	for id, s := range e.sessions {
		rate := s.ingress()
		if rate == 0 && len(s.frames) > 0 && s.plan != nil {
			// The last stream left with frames still in flight: they keep
			// the plan they were admitted under until they end (finishFrame
			// re-plans then), rather than meet unloaded modules.
			rate = s.rate
		}
		inputs[id] = planInput{app: s.app, g: s.g, cat: s.cat, rate: rate, scale: copyMap(s.scale), balloon: copyMap(s.balloon),
			reserve: s.ingestReserve(), extra: s.headroom}
	}
	limits := map[profile.WorkerTypeID]int{}
	if e.cfg.Provisioner != nil {
		for t, n := range e.cfg.Provisioner.Limits() {
			limits[t] += n
		}
	}
	snap := placement.Snapshot{Now: now, TurnOffDelay: e.cfg.TurnOff, Limits: limits, Prices: map[profile.WorkerTypeID]float64{},
		NextID: maps.Clone(e.pendingIDs)}
	ids := map[string]bool{}
	for _, in := range e.sortedInsts() {
		if in.registered {
			limits[in.typ]++
		}
		pi := placement.Instance{ID: placement.InstanceID(in.id), Type: in.typ, State: in.state, ReleaseAt: in.releaseAt, Loads: slices.Clone(in.loads)}
		if in.draining {
			pi.State = placement.Draining
		}
		for _, l := range in.allLoads() {
			pi.Loaded = append(pi.Loaded, l.Module)
		}
		if len(in.loads) == 0 {
			for _, sp := range e.parked(in) { // a Warm instance that still hosts them: reuse it for them first
				pi.Loaded = append(pi.Loaded, sp.Module)
			}
		}
		snap.Instances = append(snap.Instances, pi)
		ids[in.id] = true
	}
	for _, s := range e.sessions {
		for _, w := range s.cat.Workers() {
			snap.Prices[w.Type] = w.Price
		}
	}
	method, milpSolver, headroom, mx := e.cfg.Method, e.cfg.MILPSolver, e.cfg.Headroom, e.cfg.Observer
	slices.Sort(e.dueKinds)
	kinds := slices.Compact(e.dueKinds)
	e.dueKinds = nil
	prev := map[dag.AppID]*allocator.Allocation{}
	for id, s := range e.sessions {
		if s.alloc != nil {
			prev[id] = s.alloc
		}
	}
	round := func() {
		start := time.Now()
		out := planOutput{trigger: trigger, kinds: kinds, snapIDs: ids, inputs: inputs}
		planRound(&out, snap, limits, prev, method, milpSolver, headroom, mx)
		out.took = time.Since(start)
		e.post(func() { e.apply(out) })
	}
	if e.cfg.Stepped {
		round() // virtual time: planning takes none of it
		return
	}
	go round()
}

// Planning reports whether a planning round runs or a re-plan is queued
// (behind a running round or MinReplanGap). Asked on the loop: false
// means the last round was applied, its log lines written. mdag serve's
// summary waits for false, so it shows the plan the last leave made.
func (e *Engine) Planning() bool {
	var p bool
	e.call(func() { p = e.planning || len(e.replanDue) > 0 })
	return p
}

// unplanned says whether a session has streams but no plan yet: its first
// plan does not wait for MinReplanGap.
func (e *Engine) unplanned() bool {
	for _, s := range e.sessions {
		if (len(s.streams) > 0 || s.app.Warm > 0) && s.plan == nil {
			return true
		}
	}
	return false
}

// planRound allocates every session within the worker limits and places the
// allocations (off the loop; pure but for the solver). A session the pool
// cannot carry at its full rate is planned, by the stated degrade policy, for
// the largest share of its rate that fits (every stream sheds the same share
// of its frames at ingest, counted dropped "shed"); one infeasible at any rate
// keeps its previous allocation, re-placed on what exists. Placement
// shortages (partials that do not pack) lower the type's limit and re-run.
func planRound(out *planOutput, snap placement.Snapshot, limits map[profile.WorkerTypeID]int, prev map[dag.AppID]*allocator.Allocation,
	method allocator.Method, milpSolver allocator.Solver, headroom float64, mx Observer) {
	capF := map[profile.WorkerTypeID]float64{}
	for _, in := range out.inputs {
		for _, w := range in.cat.Workers() {
			capF[w.Type] = float64(limits[w.Type])
		}
	}
	for _, id := range sortedApps(out.inputs) {
		if out.inputs[id].rate <= 0 {
			snap.Idle = append(snap.Idle, id)
		}
	}
	for try := 0; try < 4; try++ {
		out.problems, out.allocs, out.admit, out.kept = nil, map[dag.AppID]*allocator.Allocation{}, map[dag.AppID]float64{}, nil
		out.appProblem = map[dag.AppID]string{}
		problem := func(id dag.AppID, format string, args ...any) {
			out.appProblem[id] = fmt.Sprintf(format, args...)
			out.problems = append(out.problems, string(id)+": "+out.appProblem[id])
		}
		allocStart := time.Now()
		left := maps.Clone(capF)
		var demands []placement.Demand
		for _, id := range sortedApps(out.inputs) {
			in := out.inputs[id]
			if in.rate <= 0 {
				continue
			}
			a, share, err := allocateWithin(in, left, method, milpSolver, headroom)
			switch {
			case err != nil:
				problem(id, "%v", err)
				continue
			case a == nil:
				why := ""
				if in.reserve > 0 {
					why = fmt.Sprintf(" (the %v SLO less %v of ingest delay)", in.app.SLO, in.reserve)
				}
				p := prev[id]
				if p == nil {
					problem(id, "infeasible at any rate within %s: %s%s", fmtLimits(capF), share.reason, why)
					continue
				}
				problem(id, "infeasible at any rate within %s: %s%s; the previous allocation is kept and re-placed on what exists",
					fmtLimits(capF), share.reason, why)
				a, share.f = p, 1
				out.kept = append(out.kept, id)
			case share.f < 1:
				problem(id, "degraded: %s carry %.0f%% of %.4g frames/s within the SLO (%s at the full rate); every stream sheds %.0f%% of its frames (reason shed)",
					fmtLimits(capF), share.f*100, in.rate, share.reason, (1-share.f)*100)
			}
			out.allocs[id], out.admit[id] = a, share.f
			for _, m := range a.Modules {
				for _, ia := range m.Allocations {
					if _, ok := left[ia.Worker]; ok {
						left[ia.Worker] = max(0, left[ia.Worker]-ia.Instances)
					}
				}
			}
			demands = append(demands, placement.Demands(in.app, a)...)
		}
		placeStart := time.Now()
		mx.Solve("allocate", placeStart.Sub(allocStart))
		out.plan = placement.Place(snap, demands)
		mx.Solve("place", time.Since(placeStart))
		if len(out.plan.Shortages) == 0 {
			return
		}
		// Partials that did not pack: ask the allocator for fewer of the type.
		for _, sh := range out.plan.Shortages {
			capF[sh.Type] = max(0, min(capF[sh.Type], float64(sh.Limit))-float64(max(1, sh.Needed)))
		}
	}
	for _, sh := range out.plan.Shortages {
		out.problems = append(out.problems, fmt.Sprintf("shortage: %d more %s instances needed than the limit of %d allows", sh.Needed, sh.Type, sh.Limit))
	}
}

// share is the part of a session's rate a plan carries and, below 1, why.
type share struct {
	f      float64
	reason string
}

// allocateWithin allocates a session within the worker limits left; when
// its full rate does not fit it searches (bisection, 10 steps) for the
// largest share of the rate that does. A nil allocation means none fits.
// The planning headroom stays: measured with 8 traffic streams on one
// worker of each type, planning the full rate without it (detect at 99% of
// a P100) finished 70% of frames, shedding 10% with it 80%.
func allocateWithin(in planInput, left map[profile.WorkerTypeID]float64, method allocator.Method, milpSolver allocator.Solver, headroom float64) (*allocator.Allocation, share, error) {
	req := allocator.Request{Graph: in.g, Catalog: in.cat, Rate: in.rate * headroom * max(1, in.extra), Scale: in.scale, Balloon: in.balloon,
		Method: method, MILPSolver: milpSolver, Timeout: 2 * time.Second, Budget: in.app.SLO - in.reserve, Limits: left}
	a, err := allocator.Allocate(context.Background(), req)
	if err != nil || a.Feasible {
		return a, share{f: 1}, err
	}
	sh := share{reason: a.Reason}
	lo, best, err := allocator.LargestShare(context.Background(), req, 10)
	if err != nil {
		return nil, sh, err
	}
	// Below one frame a second in the whole session nothing useful runs.
	if best == nil || in.rate*lo < 1 {
		return nil, sh, nil
	}
	sh.f = lo
	return best, sh, nil
}

// fmtLimits renders worker limits: "P100=1, V100=1, CPU=1" ("no limits" if
// none).
func fmtLimits(m map[profile.WorkerTypeID]float64) string {
	var parts []string
	for _, t := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s=%.3g", t, m[t]))
	}
	if len(parts) == 0 {
		return "no limits"
	}
	return "the workers (" + strings.Join(parts, ", ") + ")"
}

func sortedApps(m map[dag.AppID]planInput) []dag.AppID { return slices.Sorted(maps.Keys(m)) }

// apply is the one applier: it re-checks a plan against live state and
// carries it out.
func (e *Engine) apply(out planOutput) {
	e.planning = false
	now := e.now()
	if stale := e.staleInstance(out); stale != "" {
		e.log.Info("plan discarded: instance gone since the snapshot", "instance", stale, "trigger", out.trigger)
		e.replanDue = append(e.replanDue, out.trigger)
		e.dueKinds = append(e.dueKinds, out.kinds...)
		e.replan(e.takeDue())
		return
	}
	prevWarm := e.warmHosts() // before the plan's loads replace theirs
	e.nextPlan++
	rp := Replan{N: e.nextPlan, At: now, Trigger: out.trigger, Kinds: out.kinds, PlanMS: float64(out.took.Microseconds()) / 1000,
		Moves: out.plan.Moves, CostWhole: out.plan.CostWhole, CostFractional: out.plan.CostFractional,
		Shortages: out.plan.Shortages, Problems: out.problems}
	rp.Problems = append(rp.Problems, e.startPlanned(out, now)...)
	e.releaseUnplanned(out, prevWarm, now)
	rp.Sessions = e.applySessions(out, now)
	e.loadPlanned(prevWarm, now, &rp)
	e.record(rp, now)
}

// staleInstance names an instance the plan counts on that has gone since
// the snapshot it was made from ("" when none has): the plan is discarded.
func (e *Engine) staleInstance(out planOutput) string {
	stale := ""
	for _, pi := range out.plan.Instances {
		if out.snapIDs[string(pi.ID)] && e.insts[string(pi.ID)] == nil && len(pi.Loads) > 0 {
			stale = string(pi.ID)
		}
	}
	return stale
}

// startPlanned starts what the plan starts and sets every planned
// instance's state and loads; it returns the starts that failed.
func (e *Engine) startPlanned(out planOutput, now time.Time) []string {
	var problems []string
	for _, pi := range out.plan.Instances {
		id := string(pi.ID)
		in := e.insts[id]
		if in == nil {
			if out.snapIDs[id] || e.cfg.Provisioner == nil {
				continue // lost meanwhile and unloaded; or nothing to start it with
			}
			inst, err := e.cfg.Provisioner.Start(id, pi.Type)
			if err != nil {
				problems = append(problems, fmt.Sprintf("start %s: %v", id, err))
				continue
			}
			in = &instState{id: id, typ: pi.Type, inst: inst, outstanding: map[uint64]bool{}}
			e.insts[id] = in
			if _, later := inst.(Pending); later {
				e.startPending(in)
				// Its ID is not given again this run: a late report
				// about it (its gRPC stream ending after the engine
				// closed it, its terminating pod, a worker reconnecting
				// under it) cannot reach the instance that replaces it.
				if n, ok := idNumber(id, pi.Type); ok {
					if e.pendingIDs == nil {
						e.pendingIDs = map[profile.WorkerTypeID]int{}
					}
					e.pendingIDs[pi.Type] = max(e.pendingIDs[pi.Type], n+1)
				}
			}
		}
		in.state, in.releaseAt, in.loads, in.releasing = pi.State, pi.ReleaseAt, pi.Loads, false
		switch {
		case in.pending && in.state == placement.Active:
			in.state = placement.Starting // serves once its worker registers (bind)
		case !in.pending && in.state == placement.Starting:
			in.state = placement.Active // local and registered instances serve at once
		}
		if in.registered && in.state == placement.Warm {
			in.releaseAt = now.Add(24 * time.Hour)
		}
	}
	return problems
}

// releaseUnplanned releases the instances of the snapshot the plan left
// out (never a registered worker: it stays connected, idle, until it
// leaves).
func (e *Engine) releaseUnplanned(out planOutput, prevWarm map[string][]bridgeLoad, now time.Time) {
	inPlan := map[string]bool{}
	for _, pi := range out.plan.Instances {
		inPlan[string(pi.ID)] = true
	}
	for _, in := range e.sortedInsts() {
		if inPlan[in.id] || !out.snapIDs[in.id] {
			continue
		}
		if in.registered {
			in.state, in.loads = placement.Warm, nil
			continue
		}
		if len(in.outstanding) > 0 || e.holdsState(in.id) || hosts(prevWarm, in.id) {
			// Work still runs there, streams' state is still to move
			// out, or it may bridge a module until its new instances are
			// warm (bridge.go): keep it warm, released once that is done
			// (releaseDrained, after its last result) or by a later plan.
			// Not timed: a turn-off timer at now would re-plan in a loop
			// while the work runs.
			in.state, in.loads, in.releaseAt, in.releasing = placement.Warm, nil, now, true
			continue
		}
		delete(e.insts, in.id)
		e.giveUp(in)
		in.inst.Close()
		if e.cfg.Provisioner != nil {
			e.cfg.Provisioner.Release(in.id)
		}
	}
}

// applySessions gives every session its allocation, budgets and
// admission from the plan, resets its routes and wakes the streams that
// waited for a plan; it returns the sessions as planned, by app.
func (e *Engine) applySessions(out planOutput, now time.Time) []PlannedSession {
	var planned []PlannedSession
	for id, s := range e.sessions {
		planned = append(planned, e.applySession(id, s, out, now))
	}
	sort.Slice(planned, func(i, j int) bool { return planned[i].App < planned[j].App })
	return planned
}

func (e *Engine) applySession(id dag.AppID, s *session, out planOutput, now time.Time) PlannedSession {
	in := out.inputs[id]
	ps := PlannedSession{App: id, Rate: in.rate, Scale: in.scale, Balloon: in.balloon, IngestMS: millis(in.reserve)}
	if in.extra > 1 {
		ps.Headroom = in.extra
	}
	a := out.allocs[id]
	s.admit = 1
	if f, ok := out.admit[id]; ok {
		s.admit = f
	}
	ps.Admitted = s.admit
	s.mx.Admitted(s.admit)
	s.degraded = out.appProblem[id]
	ps.Reason = s.degraded
	if a != nil {
		s.alloc, s.rate = a, in.rate
		ps.Feasible, ps.Cost, ps.Critical = !slices.Contains(out.kept, id), a.CostPerHour, a.CriticalLatencyMS
		for _, ma := range a.Modules {
			s.mods[ma.Module].budget = time.Duration(ma.LatencyMS * float64(time.Millisecond))
		}
		s.reserve = in.reserve
		s.planTail = tails(s.g, func(m dag.ModuleID) time.Duration {
			if s.mods[m].mod.Kind == dag.GPU {
				return s.mods[m].budget + e.cfg.DispatchDelay
			}
			return s.mods[m].budget
		})
		plan := out.plan
		s.plan = &plan
	} else if in.rate > 0 && ps.Reason == "" {
		ps.Reason = "no allocation"
	} else if in.rate == 0 && s.plan != nil && len(s.streams) == 0 {
		// No streams: the session holds nothing (its instances were
		// unloaded by this plan and go after the turn-off delay) and
		// costs nothing; the next stream waits for a fresh plan.
		s.alloc, s.plan, s.rate, s.admit, s.degraded = nil, nil, 0, 1, ""
		s.planned = make(chan struct{})
		ps.Reason = "no streams"
	}
	full := map[dag.ModuleID]float64{}
	for _, m := range s.g.Order() {
		full[m] = s.g.Scale(m, s.scale)
	}
	s.det.Planned(now, full, s.balloon, in.extra)
	if in.rate > 0 {
		select {
		case <-s.planned:
		default:
			close(s.planned)
		}
	}
	for _, ms := range s.mods {
		ms.routes, ms.conc, ms.latency, ms.gpuLat = nil, map[string]int{}, map[string]time.Duration{}, map[string][]time.Duration{}
		ms.cpuProf, ms.gpuProf = map[string]time.Duration{}, map[string][]time.Duration{}
	}
	return ps
}

// loadPlanned loads the plan's modules onto the instances, with the
// bridges that keep a moved GPU module where it runs warm until its new
// instances are, rebuilds the central scheduler, and starts moving the
// streams whose state the plan moved; rp gets the problems and bridges.
func (e *Engine) loadPlanned(prevWarm map[string][]bridgeLoad, now time.Time, rp *Replan) {
	e.bridgeTo(prevWarm)
	for _, in := range e.sortedInsts() {
		if in.pending {
			continue // its loads wait for its worker (bind); nothing is routed to it
		}
		if err := e.load(in, e.hostSpecs(in, true)); err != nil {
			rp.Problems = append(rp.Problems, fmt.Sprintf("load %s: %v", in.id, err))
		}
	}
	for _, k := range e.bridgedKeys() {
		e.endBridges(k) // modules that warm nowhere (audio) need none
	}
	rp.Bridges = e.bridgeList()
	if err := e.rebuildScheduler(); err != nil {
		rp.Problems = append(rp.Problems, err.Error())
	}
	e.releaseDrained() // the instances kept to bridge that bridge nothing
	e.armTurnOff(now)
	// Streams whose state the plan moved start moving now, frames or not.
	for _, s := range e.sessions {
		for _, m := range s.statefulMods {
			for st := range s.mods[m].affs {
				e.dirty(s, st)
			}
		}
	}
}

// record keeps an applied plan in the history (a routine check that
// changed nothing is not a re-plan), counts and logs it, and runs the
// re-plan the triggers that came meanwhile asked for.
func (e *Engine) record(rp Replan, now time.Time) {
	rp.Unchanged = e.lastApplied != nil && sameOutcome(*e.lastApplied, rp)
	e.lastApplied = &rp
	if rp.Unchanged && routine(rp.Kinds) {
		// A periodic check that found nothing to change is not a re-plan.
		e.nextPlan--
		e.log.Debug("plan check: nothing to change", "trigger", rp.Trigger)
		if len(e.replanDue) > 0 {
			e.replan(e.takeDue())
		}
		return
	}
	e.replans = append(e.replans, rp)
	if rp.Unchanged {
		e.unchanged++
	}
	e.cfg.Observer.Replanned()
	e.publishMetrics(now)
	if len(e.replans) > 200 {
		e.replans = e.replans[len(e.replans)-200:]
	}
	for _, p := range rp.Problems {
		e.log.Warn("plan problem", "n", rp.N, "problem", p)
	}
	e.log.Info("replanned", "n", rp.N, "trigger", rp.Trigger, "moves", summarizeMoves(rp.Moves),
		"cost_whole", rp.CostWhole, "cost_fractional", math.Round(rp.CostFractional*1000)/1000,
		"problems", rp.Problems, "plan_ms", rp.PlanMS, "bridges", rp.Bridges)
	if len(e.replanDue) > 0 {
		e.replan(e.takeDue())
	}
}

// routine says every kind is a periodic check (epoch, turn-off), not an
// event that asked for a change.
func routine(kinds []why.Trigger) bool {
	for _, k := range kinds {
		if !k.Routine() {
			return false
		}
	}
	return true
}

// sameOutcome says a plan changed nothing against the last one applied: no
// moves, and every session planned with the same rate, factors, cost,
// latency, ingest reserve, headroom, share and problems.
func sameOutcome(prev, cur Replan) bool {
	if len(cur.Moves) > 0 || !slices.Equal(prev.Problems, cur.Problems) || len(prev.Sessions) != len(cur.Sessions) {
		return false
	}
	for i, a := range prev.Sessions {
		b := cur.Sessions[i]
		if a.App != b.App || a.Rate != b.Rate || a.Cost != b.Cost || a.Critical != b.Critical || a.Admitted != b.Admitted ||
			a.Feasible != b.Feasible || a.Reason != b.Reason || a.IngestMS != b.IngestMS || a.Headroom != b.Headroom || !maps.Equal(a.Scale, b.Scale) || !maps.Equal(a.Balloon, b.Balloon) {
			return false
		}
	}
	return true
}

// armTurnOff re-plans when the first warm instance's turn-off delay ends,
// so an idle instance is given back on time rather than at the next epoch.
func (e *Engine) armTurnOff(now time.Time) {
	var first time.Time
	for _, in := range e.insts {
		if in.state == placement.Warm && !in.registered && !in.releasing && !in.releaseAt.IsZero() && (first.IsZero() || in.releaseAt.Before(first)) {
			first = in.releaseAt
		}
	}
	if e.turnOffTm != nil {
		e.turnOffTm.Stop()
		e.turnOffTm = nil
	}
	if first.IsZero() {
		return
	}
	e.turnOffTm = e.clk.AfterFunc(max(0, first.Sub(now)), func() {
		e.post(func() { e.trigger(why.OnTurnOff, "warm instances reached the turn-off delay") })
	})
}

func (e *Engine) takeDue() string {
	due := slices.Compact(e.replanDue)
	e.replanDue = nil
	return strings.Join(due, "; ")
}

func summarizeMoves(ms []placement.Move) string {
	count := map[placement.MoveKind]int{}
	for _, m := range ms {
		count[m.Kind]++
	}
	var parts []string
	for k, n := range count {
		parts = append(parts, fmt.Sprintf("%s=%d", k, n))
	}
	sort.Strings(parts)
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, " ")
}

// specs turns an instance's loads into what its worker hosts, and fills
// the sessions' routing tables.
func (e *Engine) specs(in *instState) []worker.ModuleSpec { return e.specsFor(in, true) }

// specsFor is specs; routed false leaves the routes and per-instance
// profiles alone (a reload outside a plan: a stateful module's last state
// left the instance).
func (e *Engine) specsFor(in *instState, routed bool) []worker.ModuleSpec {
	type agg struct {
		spec worker.ModuleSpec
		rate float64
	}
	byKey := map[string]*agg{}
	var keys []string
	// A GPU module runs at its own planned concurrency (the largest of its
	// loads here), not the instance's largest: S2VT planned <1,1> beside
	// AlexNet <2,2> on one P100 would run two at a time, 1490 ms a batch
	// instead of the 894 ms the plan gave it.
	slots := map[string]int{}
	loads := in.allLoads()
	for _, l := range loads {
		if s := e.sessions[l.App]; s != nil && s.mods[l.Module] != nil && s.mods[l.Module].mod.Kind == dag.GPU {
			k := s.mods[l.Module].key
			slots[k] = max(slots[k], l.Concurrency, 1)
		}
	}
	for _, l := range loads {
		s := e.sessions[l.App]
		if s == nil || s.mods[l.Module] == nil {
			continue
		}
		ms := s.mods[l.Module]
		a := byKey[ms.key]
		if a == nil {
			a = &agg{spec: worker.ModuleSpec{App: l.App, Module: l.Module, Kind: ms.mod.Kind, Op: ms.mod.Op, Params: ms.mod.Params, Model: ms.mod.Model}}
			byKey[ms.key] = a
			keys = append(keys, ms.key)
		}
		a.rate += l.Rate
		if ms.mod.Kind == dag.GPU {
			a.spec.Concurrency = slots[ms.key]
			a.spec.Latency = latencyTable(s.cat.ConfigsOn(l.Module, in.typ), a.spec.Concurrency, 1)
		} else {
			a.spec.Concurrency += max(1, l.Concurrency)
		}
	}
	sort.Strings(keys)
	out := make([]worker.ModuleSpec, 0, len(keys))
	for _, k := range keys {
		a := byKey[k]
		s := e.sessions[a.spec.App]
		ms := s.mods[a.spec.Module]
		var cpuLat time.Duration
		if a.spec.Kind != dag.GPU {
			for _, c := range s.cat.ConfigsOn(a.spec.Module, in.typ) {
				if c.Batch == 1 && (cpuLat == 0 || c.Concurrency <= a.spec.Concurrency) {
					cpuLat = c.Latency
				}
			}
			a.spec.Latency = []time.Duration{cpuLat} // its profiled time per item (virtual workers take it; real ones measure)
		}
		if !routed {
			out = append(out, a.spec)
			continue
		}
		ms.routes = append(ms.routes, route{inst: in.id, weight: a.rate})
		ms.conc[in.id] = a.spec.Concurrency
		if ms.stateful {
			ms.hostConc[in.id] = a.spec.Concurrency // kept while its streams' state drains out
		}
		if a.spec.Kind == dag.GPU {
			ms.gpuProf[in.id] = a.spec.Latency
			ms.gpuLat[in.id] = latencyTable(s.cat.ConfigsOn(a.spec.Module, in.typ), a.spec.Concurrency, s.balloon[a.spec.Module])
		} else {
			ms.cpuProf[in.id] = cpuLat
			ms.latency[in.id] = time.Duration(float64(cpuLat) * math.Max(1, s.balloon[a.spec.Module]))
		}
		out = append(out, a.spec)
	}
	// A stateful module the plan moved away stays loaded (unrouted) while
	// streams' state is still there: it leaves with an export, and the
	// module goes with the last one (affinity.go, released).
	for _, s := range e.sortedSessions() {
		for _, m := range s.statefulMods {
			ms := s.mods[m]
			if byKey[ms.key] == nil && ms.holdsOn(in.id) {
				out = append(out, worker.ModuleSpec{App: s.app.Name, Module: m, Kind: dag.CPU, Op: ms.mod.Op, Params: ms.mod.Params,
					Concurrency: max(1, ms.hostConc[in.id])})
			}
		}
	}
	return out
}

// latencyTable is l(b) for b = 1..the largest profiled batch at the given
// concurrency (or the nearest profiled one), interpolated linearly between
// profiled batches, inflated by the planned ballooning factor and made
// non-decreasing (a larger batch is never planned faster than a smaller).
func latencyTable(cfgs []profile.Config, conc int, balloon float64) []time.Duration {
	best := 0
	for _, c := range cfgs {
		if c.Concurrency <= conc && c.Concurrency > best {
			best = c.Concurrency
		}
	}
	if best == 0 {
		for _, c := range cfgs {
			if best == 0 || c.Concurrency < best {
				best = c.Concurrency
			}
		}
	}
	pts := map[int]time.Duration{}
	maxB := 0
	for _, c := range cfgs {
		if c.Concurrency == best {
			pts[c.Batch] = c.Latency
			maxB = max(maxB, c.Batch)
		}
	}
	f := math.Max(1, balloon)
	out := make([]time.Duration, maxB)
	prevB, prevL := 0, time.Duration(0)
	for b := 1; b <= maxB; b++ {
		l, ok := pts[b]
		if !ok {
			nb := b + 1
			for ; nb <= maxB; nb++ {
				if _, ok := pts[nb]; ok {
					break
				}
			}
			nl := pts[nb]
			if prevB == 0 {
				l = nl * time.Duration(b) / time.Duration(nb)
			} else {
				l = prevL + (nl-prevL)*time.Duration(b-prevB)/time.Duration(nb-prevB)
			}
		} else {
			prevB, prevL = b, l
		}
		out[b-1] = max(1, time.Duration(float64(l)*f))
		if b > 1 {
			// A measured profile need not rise with the batch (b16
			// measured 43.9 ms, b8 45.1 on a shared machine): the
			// scheduler, which needs l(b) non-decreasing, gets its upper
			// envelope, never a refusal that leaves the model unserved.
			out[b-1] = max(out[b-1], out[b-2])
		}
	}
	return out
}

// millis is d in milliseconds.
func millis(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
