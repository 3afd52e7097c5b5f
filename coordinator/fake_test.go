package coordinator

import (
	"slices"
	"sort"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/mdag/mdag/allocator/milp"
	"github.com/mdag/mdag/coordinator/why"
	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/ingest/synth"
	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/profile"
	"github.com/mdag/mdag/worker"
)

// fakeStart is where the fake clock starts: a whole second, so the
// accounting's one-second windows start at whole seconds of a scenario.
var fakeStart = time.Unix(1e9, 0)

// fakeRun is an embedded engine on a fake clock, run inside a synctest
// bubble (testing/synctest) so that every step is deterministic:
//
//   - Time moves only when the test moves it (runTo), one instant at a
//     time, each instant's timers one at a time.
//   - settle returns only once every goroutine the engine started is
//     durably blocked: the loop waits for an event, a planning round has
//     posted its plan (the planner runs off the loop), and each worker
//     waits for a task or for a timer of the fake clock (an emulated GPU
//     batch, an action's start).
//   - The workers' results are held (Local.deliver) and handed to the
//     engine at settle points in task order: two workers that finish at
//     the same instant (CPU pools run at once, emulated GPUs finish at the
//     same fake time) reach the loop in the same order every run.
//
// So after settle the engine's state is the outcome of what the test did,
// not of a race with it. Use it only inside synctest.Test; t.Cleanup
// closes the engine there.
type fakeRun struct {
	t     testing.TB
	clk   *clock.Fake
	e     *Engine
	local *Local
	rec   *recorder // frame outcomes; triggers and module events unless cfg had an Observer

	mu   sync.Mutex
	held []heldResult

	streams []*fakeStream // fed by runTo
	actions []fakeAction  // run by runTo
}

// fakeAction is a function runTo calls at its time.
type fakeAction struct {
	at time.Time
	f  func()
}

// fakeStream is a synthetic camera that runTo feeds into the engine: a
// pattern frame every period from its start, with capture time its slot
// in the schedule.
type fakeStream struct {
	id     string
	index  int // the pattern's phase
	pat    *synth.Pattern
	period time.Duration
	next   time.Time // the next frame's capture time
	seq    uint64    // the next frame's sequence number (from 0)
	count  uint64    // frames to send (0: until stopped)
}

// heldResult is a worker's result not yet handed to the engine.
type heldResult struct {
	inst string
	r    worker.Result
}

// startFake starts an embedded engine with limits instances per worker
// type on a fake clock reading fakeStart. Frame outcomes and (unless cfg
// has an Observer) triggers and module events are recorded; cfg.OnFrame
// still gets every outcome.
func startFake(t *testing.T, cfg Config, limits map[profile.WorkerTypeID]int) *fakeRun {
	t.Helper()
	f := &fakeRun{t: t, clk: clock.NewFake(fakeStart), rec: newRecorder()}
	cfg.Clock = f.clk
	onFrame := cfg.OnFrame
	cfg.OnFrame = func(r FrameResult) {
		f.rec.frame(r)
		if onFrame != nil {
			onFrame(r)
		}
	}
	if cfg.Observer == nil {
		cfg.Observer = f.rec
	}
	if cfg.MILPSolver == nil {
		cfg.MILPSolver = milp.Solver{}
	}
	f.e, f.local = mustEmbedded(t, cfg, limits)
	f.local.deliver = func(inst string, r worker.Result) {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.held = append(f.held, heldResult{inst, r})
	}
	f.e.Start()
	t.Cleanup(f.e.Close)
	f.settle()
	return f
}

// wait returns once every other goroutine of the bubble is durably
// blocked.
func (f *fakeRun) wait() { synctest.Wait() }

// bubbleUntil waits inside a synctest bubble for cond, for engines on the
// bubble's (fake) time: each round lets every goroutine settle, then lets
// a millisecond of bubble time pass. limit is bubble time, not wall time.
func bubbleUntil(t *testing.T, what string, limit time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for synctest.Wait(); !cond(); synctest.Wait() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after %v of bubble time", what, limit)
		}
		time.Sleep(time.Millisecond)
	}
}

// settle waits, hands the held results to the engine in task order and
// waits again, until no result is held (see fakeRun).
func (f *fakeRun) settle() {
	for {
		f.wait()
		f.mu.Lock()
		held := f.held
		f.held = nil
		f.mu.Unlock()
		if len(held) == 0 {
			return
		}
		sort.SliceStable(held, func(i, j int) bool { return held[i].r.Task < held[j].r.Task })
		for _, h := range held {
			f.e.Result(h.inst, h.r)
		}
	}
}

// runTo moves the fake clock to t, calling the actions (after) and
// feeding the streams' frames due on the way, in time order; at one
// instant, that instant's timers fire first (see clockTo), then the
// actions in the order they were set, then the frames in the order the
// streams were added.
func (f *fakeRun) runTo(t time.Time) {
	f.t.Helper()
	if t.Before(f.clk.Now()) {
		f.t.Fatalf("time goes backwards: +%v after +%v", t.Sub(fakeStart), f.clk.Now().Sub(fakeStart))
	}
	for {
		act := -1
		for i, a := range f.actions {
			if act < 0 || a.at.Before(f.actions[act].at) {
				act = i
			}
		}
		var next *fakeStream
		for _, s := range f.streams {
			if (s.count == 0 || s.seq < s.count) && (next == nil || s.next.Before(next.next)) {
				next = s
			}
		}
		switch {
		case act >= 0 && !f.actions[act].at.After(t) && (next == nil || !next.next.Before(f.actions[act].at)):
			a := f.actions[act]
			f.actions = slices.Delete(f.actions, act, act+1)
			f.clockTo(a.at)
			a.f()
			f.settle()
			continue
		case next == nil || next.next.After(t):
			f.clockTo(t)
			return
		}
		f.clockTo(next.next)
		fr, truth, err := next.pat.Frame(next.index, next.seq)
		if err != nil {
			f.t.Fatal(err)
		}
		if err := f.e.Ingest(next.id, next.seq, next.next, fr, truth); err != nil {
			f.t.Fatalf("stream %s frame %d at +%v: %v", next.id, next.seq, f.since(), err)
		}
		next.seq++
		next.next = next.next.Add(next.period)
		f.settle()
	}
}

// after has runTo call fn d from now.
func (f *fakeRun) after(d time.Duration, fn func()) {
	f.actions = append(f.actions, fakeAction{at: f.clk.Now().Add(d), f: fn})
}

// clockTo moves the fake clock to t. At each instant a timer is due it
// fires that instant's timers one at a time (waiting after each, so one
// timer's effects, such as the loop setting a timer due at once, are in
// place before the next is looked at), then settles: the results of the
// batches the instant ended reach the engine together, in task order.
func (f *fakeRun) clockTo(t time.Time) {
	for {
		f.settle()
		at, ok := f.clk.Next()
		if !ok || at.After(t) {
			break
		}
		for f.clk.Step(at) {
			f.wait()
		}
	}
	f.clk.Set(t)
	f.settle()
}

// stream adds a stream to app's session and starts feeding it n frames
// (0: until stop) at fps from now, drawn by pat.
func (f *fakeRun) stream(app dag.AppID, id string, index int, pat *synth.Pattern, fps float64, n uint64) {
	f.t.Helper()
	if err := f.e.Join(app, id); err != nil {
		f.t.Fatal(err)
	}
	f.settle()
	f.streams = append(f.streams, &fakeStream{id: id, index: index, pat: pat, period: time.Duration(float64(time.Second) / fps),
		next: f.clk.Now(), count: n})
}

// stop stops feeding a stream (it stays joined).
func (f *fakeRun) stop(id string) {
	f.streams = slices.DeleteFunc(f.streams, func(s *fakeStream) bool { return s.id == id })
}

// until settles, then runs the clock forward 50 ms at a time until cond
// holds, failing once limit of fake time has passed without it. (Settling
// first matters: a test that called the engine directly, say a trigger
// through e.call, must see the plan it started before cond is asked.)
func (f *fakeRun) until(what string, limit time.Duration, cond func() bool) {
	f.t.Helper()
	f.settle()
	end := f.clk.Now().Add(limit)
	for !cond() {
		if !f.clk.Now().Before(end) {
			f.t.Fatalf("no %s after %v of fake time (at +%v)", what, limit, f.since())
		}
		next := f.clk.Now().Add(50 * time.Millisecond)
		if next.After(end) {
			next = end
		}
		f.runTo(next)
	}
}

func (f *fakeRun) engine() *Engine     { return f.e }
func (f *fakeRun) provisioner() *Local { return f.local }
func (f *fakeRun) now() time.Time      { return f.clk.Now() }

// close stops the feeds and the actions and closes the engine (t.Cleanup
// does too).
func (f *fakeRun) close() {
	f.streams, f.actions = nil, nil
	f.e.Close()
}

// advance is runTo d from now.
func (f *fakeRun) advance(d time.Duration) { f.runTo(f.clk.Now().Add(d)) }

// since is the time since the clock started.
func (f *fakeRun) since() time.Duration { return f.clk.Now().Sub(fakeStart) }

// recorder is the Observer of a fakeRun: re-plan triggers by kind and,
// per module (by name), items in, batch sizes and the scheduler's drops;
// plus every frame's outcome. Its calls come from the engine's loop.
type recorder struct {
	nop
	mu       sync.Mutex
	frames   map[frameKey]FrameResult
	triggers map[why.Trigger]int
	mods     map[string]*modRecorder
}

func newRecorder() *recorder {
	return &recorder{frames: map[frameKey]FrameResult{}, triggers: map[why.Trigger]int{}, mods: map[string]*modRecorder{}}
}

func (r *recorder) frame(res FrameResult) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.frames[frameKey{res.Stream, res.Seq}] = res
}

// result is the outcome of a frame, if it has one.
func (r *recorder) result(stream string, seq uint64) (FrameResult, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	res, ok := r.frames[frameKey{stream, seq}]
	return res, ok
}

// Trigger implements Observer.
func (r *recorder) Trigger(kind why.Trigger) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.triggers[kind]++
}

// triggered is how many re-plan triggers of kind there were.
func (r *recorder) triggered(kind why.Trigger) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.triggers[kind]
}

// Module implements Observer.
func (r *recorder) Module(_, module, _ string, _ bool) ModuleObserver {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := &modRecorder{r: r, drops: map[why.Drop]int{}}
	r.mods[module] = m
	return m
}

// module returns a copy of what a module recorded (zero if unknown).
func (r *recorder) module(name string) modRecorder {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.mods[name]
	if m == nil {
		return modRecorder{}
	}
	c := *m
	c.batches = append([]int(nil), m.batches...)
	c.drops = map[why.Drop]int{}
	for k, v := range m.drops {
		c.drops[k] = v
	}
	return c
}

type modRecorder struct {
	nop
	r       *recorder
	in      int
	batches []int
	drops   map[why.Drop]int // the scheduler's, by reason
}

func (m *modRecorder) In() {
	m.r.mu.Lock()
	defer m.r.mu.Unlock()
	m.in++
}

func (m *modRecorder) Batch(n int) {
	m.r.mu.Lock()
	defer m.r.mu.Unlock()
	m.batches = append(m.batches, n)
}

func (m *modRecorder) SchedulerDrop(reason why.Drop) {
	m.r.mu.Lock()
	defer m.r.mu.Unlock()
	m.drops[reason]++
}

// mustNew and mustEmbedded are New and NewEmbedded for a test's fixed
// configs: an error ends the test.
func mustNew(tb testing.TB, cfg Config) *Engine {
	tb.Helper()
	e, err := New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	return e
}

func mustEmbedded(tb testing.TB, cfg Config, limit map[profile.WorkerTypeID]int) (*Engine, *Local) {
	tb.Helper()
	e, l, err := NewEmbedded(cfg, limit)
	if err != nil {
		tb.Fatal(err)
	}
	return e, l
}
