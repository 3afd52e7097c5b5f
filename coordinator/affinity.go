package coordinator

import (
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/mdag/mdag/coordinator/why"
	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/worker"
)

// Stateful modules (ops that keep per-stream state: track, window,
// sequence, activity, segment, motion) follow these rules, all kept here on
// the loop:
//
//   - Gather: a frame's items reaching the module are held until no module
//     upstream of it still works on the frame; then they go as one frame
//     task (the op sees a frame's detections together).
//   - Order: a stream's frames go in seq order, one at a time: the frame
//     task after the one in flight, and only once every earlier open frame
//     of the stream has passed (or can no longer reach) the module. A
//     frame dropped or finished upstream never blocks the ones after it.
//   - Affinity: every frame of a stream goes to the one instance holding
//     its state (chosen, when the stream first arrives, among the
//     module's routes by fewest streams per unit of planned rate).
//   - Migration: when a plan no longer routes the module to that instance
//     while it still lives, the stream's state moves: export (snapshot and
//     forget) there, import on the new instance, then its held frames go,
//     in order. Nothing is dropped for the move; the pause is measured.
//   - Loss: the instance holding the state is lost: the state is restored
//     from the stream's last checkpoint (taken every Config.Checkpoint
//     while the stream is idle at the module) or starts fresh, counted as
//     a state event ("restore", "reset") in the status, metrics and log.

// stateEvents are the kinds of state event.
var stateEvents = []string{"migrate", "restore", "reset", "failed"}

// affinity is one stream's place at one stateful module.
type affinity struct {
	stream string
	inst   string            // the instance holding the state ("" none yet)
	busy   uint64            // the task in flight for the stream (a frame or a state op); 0: none
	gather map[uint64]*group // frames still gathering their items, by seq
	queue  []*group          // complete frames waiting for their turn, by seq
	held   []byte            // state exported and not yet imported anywhere
	move   *migration        // a state move in progress
	ckpt   []byte            // the last checkpoint
	ckptAt time.Time         // when it was taken (zero: none)
	ckptSq uint64            // the last frame it includes
	ckptDo bool              // a checkpoint is due at the next idle moment
	lastSq uint64            // the last frame sent to the module
	sent   bool              // lastSq is set
	closed bool              // the stream left: forget its state once idle
	lost   string            // the state was lost (why): the next holder restores the checkpoint or starts fresh
	// restarted: the stream was resumed after a coordinator restart; its
	// first holder forgets any copy it holds and the reset is counted.
	restarted bool
	// fresh: the next holder is told to forget any copy first (a reset).
	fresh bool
	// backoff: a state task was refused for back-pressure (queue full);
	// it is tried again after stateRetry.
	backoff bool
	ops     map[uint64]stateOp // state tasks in flight (at most one)
}

// group is one frame's items at a stateful module.
type group struct {
	seq   uint64
	fr    *frame
	works []*work
}

// migration is a state move in progress.
type migration struct {
	from    string
	to      string // the instance importing the state (once the export is done)
	started time.Time
	why     string
	tries   int
}

// stateOp is a state task in flight: what it does, for whom.
type stateOp struct {
	kind worker.TaskKind
	s    *session
	ms   *modState
	a    *affinity
	inst string
	// restoring: an import of a checkpoint after a loss (counted
	// "restore" when it lands) rather than of exported state; fresh: an
	// import of nothing to a new holder (a reset); forget: an import of
	// nothing to the holder of a stream that left.
	restoring, fresh, forget bool
}

// StateStatus is a stateful module's state handling in the status.
type StateStatus struct {
	Streams    int            `json:"streams"`                          // streams with state at the module
	Moving     int            `json:"moving"`                           // state moves in progress
	Events     map[string]int `json:"events,omitempty"`                 // migrate, restore, reset, failed: since deploy
	LastEvent  string         `json:"last_event,omitempty"`             // the last one, said in words
	PauseP50MS float64        `json:"migration_pause_p50_ms,omitempty"` // over the last 1024 moves
	PauseP99MS float64        `json:"migration_pause_p99_ms,omitempty"`
	PauseMaxMS float64        `json:"migration_pause_max_ms,omitempty"`
	Checkpoint float64        `json:"checkpoint_s,omitempty"` // the checkpoint period
}

// aff returns stream's affinity at ms, creating it.
func (ms *modState) aff(stream string) *affinity {
	a := ms.affs[stream]
	if a == nil {
		a = &affinity{stream: stream, gather: map[uint64]*group{}, ops: map[uint64]stateOp{}}
		ms.affs[stream] = a
	}
	return a
}

// park holds w at its stateful module until its frame's items are all
// there; the loop's advance sends it on.
func (e *Engine) park(w *work) {
	ms := w.s.mods[w.m]
	a := ms.aff(w.f.key.stream)
	g := a.gather[w.f.key.seq]
	if g == nil {
		g = &group{seq: w.f.key.seq, fr: w.f}
		a.gather[g.seq] = g
	}
	g.works = append(g.works, w)
	e.dirty(w.s, w.f.key.stream)
}

// dirty marks a stream of a session with stateful modules for advance at
// the end of the loop's current event.
func (e *Engine) dirty(s *session, stream string) {
	if !s.stateful {
		return
	}
	if e.dirtyS == nil {
		e.dirtyS = map[*session]map[string]bool{}
	}
	if e.dirtyS[s] == nil {
		e.dirtyS[s] = map[string]bool{}
	}
	e.dirtyS[s][stream] = true
}

// advanceDirty runs advance for every stream marked dirty (repeatedly:
// an advance may finish frames and mark more).
func (e *Engine) advanceDirty() {
	for len(e.dirtyS) > 0 {
		d := e.dirtyS
		e.dirtyS = nil
		ss := make([]*session, 0, len(d))
		for s := range d {
			ss = append(ss, s)
		}
		sort.Slice(ss, func(i, j int) bool { return ss[i].app.Name < ss[j].app.Name })
		for _, s := range ss {
			for _, st := range slices.Sorted(mapKeys(d[s])) {
				e.advance(s, st)
			}
		}
	}
}

func mapKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// upstreamIdle says no module upstream of m still works on fr: nothing
// more of fr can reach m.
func (s *session) upstreamIdle(fr *frame, m dag.ModuleID) bool {
	for _, u := range s.upstream[m] {
		if fr.busy[u] > 0 {
			return false
		}
	}
	return true
}

// advance moves stream's frames along its stateful modules: complete
// gathers join the queue, and the queue's head goes when it is its turn.
func (e *Engine) advance(s *session, stream string) {
	for _, m := range s.statefulMods {
		ms := s.mods[m]
		a := ms.affs[stream]
		if a == nil {
			continue
		}
		for seq, g := range a.gather {
			if !g.fr.dropped && !s.upstreamIdle(g.fr, m) {
				continue
			}
			delete(a.gather, seq)
			i, _ := slices.BinarySearchFunc(a.queue, seq, func(g *group, seq uint64) int { return cmpU64(g.seq, seq) })
			a.queue = slices.Insert(a.queue, i, g)
		}
		e.dispatchStateful(s, ms, a)
	}
}

func cmpU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// turn says whether frame seq of the stream may go to m now: every earlier
// frame still open has passed m or can no longer reach it.
func (s *session) turn(m dag.ModuleID, a *affinity, seq uint64) bool {
	for _, fr := range s.open[a.stream] {
		if fr.key.seq >= seq || fr.dropped {
			continue
		}
		if _, waiting := a.gather[fr.key.seq]; waiting {
			return false
		}
		if !s.upstreamIdle(fr, m) {
			return false
		}
	}
	return true
}

// dispatchStateful sends a's next piece of work to the instance holding
// its state: a due state operation, or the queue's head frame when it is
// its turn.
func (e *Engine) dispatchStateful(s *session, ms *modState, a *affinity) {
	for a.busy == 0 {
		// Frames of a dropped frame need no state: retire them.
		for len(a.queue) > 0 && a.queue[0].fr.dropped {
			g := a.queue[0]
			a.queue = a.queue[1:]
			for _, w := range g.works {
				e.retire(w)
			}
		}
		in, ready := e.holder(s, ms, a)
		if !ready {
			return // a state move or restore is under way, or waits for an instance
		}
		if in == nil {
			// No instance hosts the module: what waits is dropped.
			for _, g := range a.queue {
				for _, w := range g.works {
					e.drop(w, why.NoInstance, "no live instance hosts the stateful module"+e.startingFor(w.s.app.Name, w.m))
				}
			}
			a.queue = nil
			if a.closed {
				delete(ms.affs, a.stream)
			}
			return
		}
		if a.ckptDo && e.cfg.Checkpoint > 0 {
			a.ckptDo = false
			e.submitState(in, s, ms, a, worker.Checkpoint, nil, false)
			return
		}
		if len(a.queue) == 0 {
			if a.closed && !a.pending(s) {
				// The stream left and its last frame passed: forget its
				// state where it is held (the affinity goes when that is
				// done: a frame of the stream rejoining must not run
				// before it).
				e.submitStateOp(in, s, ms, a, worker.Import, nil, stateOp{forget: true})
			}
			return
		}
		g := a.queue[0]
		if !s.turn(ms.mod.Name, a, g.seq) {
			return
		}
		a.queue = a.queue[1:]
		// A frame the module cannot finish in time is dropped here, not
		// run: a stream whose frames come faster than the module takes
		// them would otherwise queue without end (its state sees a gap).
		if lat := ms.latency[in.id]; e.now().Add(lat + s.minTail[ms.mod.Name]).After(g.fr.deadline) {
			for _, w := range g.works {
				e.drop(w, why.CannotFinish, fmt.Sprintf("stateful module: %v to run and %v after, %v left", lat, s.minTail[ms.mod.Name], g.fr.deadline.Sub(e.now()).Round(time.Microsecond)))
			}
			continue
		}
		e.submitFrame(in, a, g)
	}
}

// pending says whether frames of a's stream may still reach or wait at
// the module.
func (a *affinity) pending(s *session) bool {
	return len(a.queue) > 0 || len(a.gather) > 0 || len(s.open[a.stream]) > 0
}

// holder returns the instance holding a's state, ready to take work, or
// starts what makes one: a migration (the plan moved the module), a
// restore from checkpoint or a reset (the holder was lost), a first
// placement. ready false: wait (a state task is in flight); in nil with
// ready: no instance hosts the module.
func (e *Engine) holder(s *session, ms *modState, a *affinity) (in *instState, ready bool) {
	if a.move != nil || a.backoff {
		return nil, false
	}
	if a.inst != "" {
		cur := e.insts[a.inst]
		if cur != nil && !cur.lost && ms.routed(a.inst) {
			return cur, true
		}
		if cur != nil && !cur.lost && a.closed && !a.pending(s) {
			return cur, true // nothing more of the stream comes: it is forgotten there
		}
		if cur != nil && !cur.lost {
			// The plan moved the module: the state follows the stream.
			to := e.pickAffine(ms, a.inst)
			if to == nil {
				// Nowhere to go: the state stays and serves where it is
				// until the instance is gone (it still hosts the module
				// while its work drains).
				return cur, true
			}
			a.move = &migration{from: a.inst, started: e.now(), why: "the plan moved " + ms.key + " from " + a.inst}
			e.submitState(cur, s, ms, a, worker.Export, nil, false)
			return nil, false
		}
		if cur == nil && (!a.closed || a.pending(s)) {
			// Gone without a word (released or closed): its state is
			// lost all the same, and said.
			a.lost = "instance " + a.inst + " is gone"
		}
		a.inst = ""
	}
	to := e.pickAffine(ms, "")
	if to == nil {
		return nil, true
	}
	switch {
	case a.lost != "":
		e.rehome(s, ms, a, to)
		if a.move != nil {
			return nil, false
		}
	case a.held != nil:
		// Exported state waiting for a home (its import failed, or no
		// instance could take it then).
		a.move = &migration{from: "(held)", to: to.id, started: e.now(), why: "exported state waiting for an instance"}
		b := a.held
		a.held = nil
		e.submitState(to, s, ms, a, worker.Import, b, false)
		return nil, false
	}
	a.inst = to.id
	if a.restarted {
		a.restarted = false
		e.stateEvent(s, ms, "reset", fmt.Sprintf("stream %s: resumed after a coordinator restart, its state at the module is not known here; it starts fresh on %s", a.stream, to.id))
		a.fresh = true
	}
	if a.fresh {
		// The new holder forgets any copy of the stream it may have (a
		// stale one: the stream's state is to start fresh).
		a.fresh = false
		e.submitStateOp(to, s, ms, a, worker.Import, nil, stateOp{fresh: true})
		return nil, false
	}
	return to, true
}

// holdsOn says whether streams' state of the module is (or is being
// exported) on instance id.
func (ms *modState) holdsOn(id string) bool {
	for _, a := range ms.affs {
		if a.inst == id || a.move != nil && a.move.from == id {
			return true
		}
	}
	return false
}

// released reloads instance id when a stateful module the plan moved away
// no longer holds any stream's state there: the module is unloaded.
func (e *Engine) released(ms *modState, id string) {
	in := e.insts[id]
	if in == nil || in.lost || ms.routed(id) || ms.holdsOn(id) {
		return
	}
	if err := e.load(in, e.specsFor(in, false)); err != nil {
		e.log.Warn("unloading a stateful module whose streams left failed", "instance", id, "module", ms.key, "err", err)
	}
	e.releaseDrained()
}

// releaseDrained gives back the provisioned instances an operator drained,
// or a plan released while they still worked, once they are empty: no
// loads, no work, no stream's state. (A registered worker stays, idle,
// until it is stopped.)
func (e *Engine) releaseDrained() {
	for _, in := range e.sortedInsts() {
		if !in.draining && !in.releasing || in.registered || len(in.loads) > 0 || len(in.bridge) > 0 || len(in.outstanding) > 0 || e.holdsState(in.id) {
			continue
		}
		delete(e.insts, in.id)
		e.giveUp(in)
		in.inst.Close()
		if e.cfg.Provisioner != nil {
			e.cfg.Provisioner.Release(in.id)
		}
		e.log.Info("drained instance released", "instance", in.id, "type", in.typ, "drained_by", map[bool]string{true: "operator", false: "plan"}[in.draining])
	}
}

// holdsState says whether any stateful module holds a stream's state on
// instance id.
func (e *Engine) holdsState(id string) bool {
	for _, s := range e.sessions {
		for _, m := range s.statefulMods {
			if s.mods[m].holdsOn(id) {
				return true
			}
		}
	}
	return false
}

// routed says whether the plan routes the module to instance id.
func (ms *modState) routed(id string) bool {
	return slices.ContainsFunc(ms.routes, func(r route) bool { return r.inst == id })
}

// pickAffine chooses the instance for a stream's state: among the live
// routes (but not), the fewest streams per unit of planned rate.
func (e *Engine) pickAffine(ms *modState, not string) *instState {
	count := map[string]int{}
	for _, a := range ms.affs {
		switch {
		case a.move != nil && a.move.to != "":
			count[a.move.to]++ // on its way there
		case a.inst != "":
			count[a.inst]++
		}
	}
	var best *instState
	bestScore := 0.0
	for _, r := range ms.routes {
		in := e.insts[r.inst]
		if in == nil || in.lost || r.inst == not {
			continue
		}
		score := float64(count[r.inst]+1) / max(r.weight, 1e-9)
		if best == nil || score < bestScore {
			best, bestScore = in, score
		}
	}
	return best
}

// submitFrame sends one frame's items to the instance holding the state.
func (e *Engine) submitFrame(in *instState, a *affinity, g *group) {
	e.submit(in, g.works, nil, time.Time{}, time.Time{}, nil)
	a.busy = e.nextTask
	e.tasks[e.nextTask].aff = a
}

// submitState sends a state operation for a's stream.
func (e *Engine) submitState(in *instState, s *session, ms *modState, a *affinity, kind worker.TaskKind, state []byte, restoring bool) {
	e.submitStateOp(in, s, ms, a, kind, state, stateOp{restoring: restoring})
}

// submitStateOp is submitState with op's flags (fresh, forget).
func (e *Engine) submitStateOp(in *instState, s *session, ms *modState, a *affinity, kind worker.TaskKind, state []byte, op stateOp) {
	e.nextTask++
	id := e.nextTask
	t := worker.Task{ID: id, App: s.app.Name, Module: ms.mod.Name, Kind: kind, Stream: a.stream, State: state}
	op.kind, op.s, op.ms, op.a, op.inst = kind, s, ms, a, in.id
	e.tasks[id] = &taskState{id: id, inst: in.id, aff: a, state: &op, key: ms.key, stateBytes: state}
	a.busy = id
	in.outstanding[id] = true
	in.inst.Submit(t)
}

// onStateResult handles a state task's result (r nil: its instance was
// lost).
func (e *Engine) onStateResult(t *taskState, r *worker.Result) {
	op := *t.state
	a, ms, s := op.a, op.ms, op.s
	a.busy = 0
	defer e.dirty(s, a.stream)
	ok := r != nil && r.Outcome == worker.Done
	// Back-pressure (the instance's queue or the transport's send queue
	// was full): nothing happened there; the same step is tried again
	// after stateRetry.
	full := r != nil && r.Outcome == worker.QueueFull
	why := "the instance was lost"
	if r != nil && !ok {
		why = r.Outcome.String() + ": " + r.Detail
	}
	now := e.now()
	switch op.kind {
	case worker.Checkpoint:
		switch {
		case ok:
			a.ckpt, a.ckptAt, a.ckptSq = r.State, now, a.lastSq
		case full:
			a.ckptDo = true
			e.backoffState(s, a)
		case r != nil:
			e.log.Warn("checkpoint failed", "app", s.app.Name, "module", ms.mod.Name, "stream", a.stream, "why", why)
		}
	case worker.Export:
		mv := a.move
		if full {
			a.move = nil // the state is still there
			e.backoffState(s, a)
			return
		}
		if !ok {
			// The state could not leave: restore from the checkpoint on
			// the new instance, or start fresh.
			a.move, a.inst = nil, ""
			if r != nil {
				e.stateEvent(s, ms, "failed", fmt.Sprintf("stream %s: exporting its state from %s failed (%s)", a.stream, op.inst, why))
			}
			e.recover(s, ms, a, "exporting from "+op.inst+": "+why)
			return
		}
		to := e.pickAffine(ms, mv.from)
		if to == nil {
			a.held, a.move, a.inst = r.State, nil, ""
			return
		}
		mv.to = to.id
		e.submitState(to, s, ms, a, worker.Import, r.State, false)
	case worker.Import:
		e.onImport(t, op, r, ok, full, why, now)
	}
}

// onImport handles an Import's result: a migration's or a restore's
// landing, a fresh start's or a forget's.
func (e *Engine) onImport(t *taskState, op stateOp, r *worker.Result, ok, full bool, why string, now time.Time) {
	a, ms, s := op.a, op.ms, op.s
	mv := a.move
	switch {
	case op.forget:
		if !ok && a.closed {
			// Refused or lost: the holder may still have it; told again
			// (or, lost, it went with the instance).
			if full {
				e.backoffState(s, a)
			}
			if r == nil {
				a.inst = ""
			}
			return
		}
		if a.closed && ms.affs[a.stream] == a {
			delete(ms.affs, a.stream)
			e.released(ms, op.inst)
		}
	case op.fresh:
		if !ok {
			// Not told to forget: the next holder is.
			a.inst, a.fresh = "", true
			if full {
				e.backoffState(s, a)
			}
		}
	case op.restoring && ok:
		a.inst, a.move = op.inst, nil
		e.stateEvent(s, ms, "restore", fmt.Sprintf("stream %s: state restored on %s from the checkpoint of %v ago (frame %d)",
			a.stream, op.inst, now.Sub(a.ckptAt).Round(time.Millisecond), a.ckptSq))
	case op.restoring && (r == nil || full):
		a.move = nil
		e.recover(s, ms, a, op.inst+" could not take the checkpoint ("+why+")")
		if full {
			e.backoffState(s, a)
		}
	case op.restoring:
		// The op refused the checkpoint: the stream starts fresh there
		// (a refused Restore leaves it fresh).
		a.move, a.inst = nil, op.inst
		e.stateEvent(s, ms, "reset", fmt.Sprintf("stream %s: restoring the checkpoint on %s failed (%s); the state starts fresh", a.stream, op.inst, why))
	case ok:
		a.inst, a.move = op.inst, nil
		pause := now.Sub(mv.started)
		ms.pauses = append(ms.pauses, pause)
		if len(ms.pauses) > 1024 {
			ms.pauses = ms.pauses[len(ms.pauses)-1024:]
		}
		ms.mx.MigrationPause(pause)
		e.stateEvent(s, ms, "migrate", fmt.Sprintf("stream %s: state moved %s -> %s in %v (%s)", a.stream, mv.from, op.inst,
			pause.Round(time.Microsecond), mv.why))
		e.released(ms, mv.from)
	case full || r == nil:
		// The bytes are in hand: another instance (or this one, later)
		// takes them.
		a.move, a.inst, a.held = nil, "", t.stateBytes
		if full {
			e.backoffState(s, a)
		}
	default:
		// The import failed: try another instance with the same bytes
		// (they are in the task we sent).
		mv.tries++
		if mv.tries < 3 {
			if to := e.pickAffine(ms, op.inst); to != nil {
				mv.to = to.id
				e.submitState(to, s, ms, a, worker.Import, t.stateBytes, false)
				return
			}
		}
		a.move, a.inst = nil, ""
		e.stateEvent(s, ms, "failed", fmt.Sprintf("stream %s: importing its state on %s failed (%s)", a.stream, op.inst, why))
		e.recover(s, ms, a, "import failed")
	}
}

// stateRetry is how long a state step refused for back-pressure waits
// before it is tried again.
const stateRetry = 20 * time.Millisecond

// backoffState holds a's state steps for stateRetry.
func (e *Engine) backoffState(s *session, a *affinity) {
	a.backoff = true
	e.clk.AfterFunc(stateRetry, func() {
		e.post(func() {
			a.backoff = false
			e.dirty(s, a.stream)
		})
	})
}

// recover marks a stream whose state was lost: its next holder (holder,
// once an instance hosts the module) restores the last checkpoint, or the
// stream starts fresh (counted "reset").
func (e *Engine) recover(s *session, ms *modState, a *affinity, why string) {
	a.inst, a.lost = "", why
	e.dirty(s, a.stream)
}

// rehome gives a stream whose state was lost its new holder to: the last
// checkpoint restored there (ready false: wait for it), or a fresh state
// (the holder is told to forget any copy it has).
func (e *Engine) rehome(s *session, ms *modState, a *affinity, to *instState) {
	why := a.lost
	a.lost = ""
	if a.ckpt != nil {
		a.move = &migration{from: "(checkpoint)", to: to.id, started: e.now(), why: why}
		e.submitState(to, s, ms, a, worker.Import, a.ckpt, true)
		return
	}
	e.stateEvent(s, ms, "reset", fmt.Sprintf("stream %s: its state was lost (%s) and no checkpoint exists; it starts fresh on %s", a.stream, why, to.id))
	a.fresh = true
}

// stateEvent counts and says a state event.
func (e *Engine) stateEvent(s *session, ms *modState, kind, text string) {
	if ms.events == nil {
		ms.events = map[string]int{}
	}
	ms.events[kind]++
	ms.lastEvent = text
	ms.mx.StateEvent(kind)
	if kind == "migrate" {
		e.log.Info("state moved", "app", s.app.Name, "module", ms.mod.Name, "what", text)
		return
	}
	e.log.Warn("state "+kind, "app", s.app.Name, "module", ms.mod.Name, "what", text)
}

// statefulLost handles the loss of instance id for the streams whose
// state it held: each is restored from its checkpoint or starts fresh.
func (e *Engine) statefulLost(id string) {
	for _, s := range e.sortedSessions() {
		for _, m := range s.statefulMods {
			ms := s.mods[m]
			for _, st := range slices.Sorted(mapKeys(ms.affs)) {
				a := ms.affs[st]
				if a.inst != id || a.move != nil {
					continue
				}
				a.inst = ""
				if a.closed && !a.pending(s) {
					delete(ms.affs, st) // it left, nothing more comes: nothing to recover
					continue
				}
				e.recover(s, ms, a, "worker "+id+" was lost")
				e.dirty(s, st)
			}
		}
	}
}

// checkpointsDue marks every stream with state due for a checkpoint.
func (e *Engine) checkpointsDue(now time.Time) {
	if e.cfg.Checkpoint <= 0 {
		return
	}
	for _, s := range e.sessions {
		for _, m := range s.statefulMods {
			for st, a := range s.mods[m].affs {
				if a.inst != "" && a.sent && (a.lastSq != a.ckptSq || a.ckptAt.IsZero()) && now.Sub(a.ckptAt) >= e.cfg.Checkpoint {
					a.ckptDo = true
					e.dirty(s, st)
				}
			}
		}
	}
}

// streamLeft closes stream's state at every stateful module: once its
// frames have passed, the holder forgets it.
func (e *Engine) streamLeft(s *session, stream string) {
	for _, m := range s.statefulMods {
		if a := s.mods[m].affs[stream]; a != nil {
			a.closed = true
			e.dirty(s, stream)
		}
	}
}

func (e *Engine) sortedSessions() []*session {
	out := make([]*session, 0, len(e.sessions))
	for _, s := range e.sessions {
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].app.Name < out[j].app.Name })
	return out
}

// stateStatus is ms's StateStatus.
func (e *Engine) stateStatus(ms *modState) *StateStatus {
	st := &StateStatus{Events: map[string]int{}, LastEvent: ms.lastEvent, Checkpoint: e.cfg.Checkpoint.Seconds()}
	for _, k := range stateEvents {
		if n := ms.events[k]; n > 0 {
			st.Events[k] = n
		}
	}
	for _, a := range ms.affs {
		if a.inst != "" {
			st.Streams++
		}
		if a.move != nil {
			st.Moving++
		}
	}
	if len(ms.pauses) > 0 {
		p := slices.Clone(ms.pauses)
		slices.Sort(p)
		st.PauseP50MS = millis(p[len(p)/2])
		st.PauseP99MS = millis(p[len(p)*99/100])
		st.PauseMaxMS = millis(p[len(p)-1])
	}
	return st
}

// HasCheckpoint says whether stream's state at app's module has a
// checkpoint (for tests and tools).
func (e *Engine) HasCheckpoint(app dag.AppID, module dag.ModuleID, stream string) bool {
	var out bool
	e.call(func() {
		if s := e.sessions[app]; s != nil && s.mods[module] != nil {
			if a := s.mods[module].affs[stream]; a != nil {
				out = a.ckpt != nil
			}
		}
	})
	return out
}
