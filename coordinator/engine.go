// Package coordinator is mdag's control plane: the Engine holds sessions,
// plans (allocator, with the MILP solver handed in as Config.MILPSolver, and
// placement), routes frames, runs the central GPU batch scheduler, accounts
// for every frame and adapts to scaling and ballooning. Workers (package
// worker) execute the modules; `mdag serve` runs them in process through the
// Local provisioner, and package remote puts gRPC between them (`mdag
// coordinator`, `mdag worker`). Observers (observe/metrics) see it through
// the Observer interface; it imports no native code and no observer.
//
// Concurrency: the coordinator's state is owned by one loop goroutine; every
// outside call (a frame arriving, a worker's result, a timer) is posted to
// it as a closure. Planning (allocation and placement, which may take a
// while) runs off the loop on a snapshot and the loop's applier re-checks the
// plan against live state before applying it. Time comes only from the
// injected clock. coordinator/README.md maps the files and draws a frame's
// and a plan's path through them.
package coordinator

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"time"

	"github.com/mdag/mdag/allocator"
	"github.com/mdag/mdag/coordinator/why"
	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/gpu"
	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/media"
	"github.com/mdag/mdag/modules"
	"github.com/mdag/mdag/profile"
	"github.com/mdag/mdag/scheduler"
	"github.com/mdag/mdag/worker"
)

// Config configures an Engine.
type Config struct {
	Clock       clock.Clock
	Provisioner Provisioner // set by NewEmbedded for the local one
	Policy      scheduler.Policy
	Method      allocator.Method
	MILPSolver  allocator.Solver // for Method milp (the default); the caller hands it in (allocator/milp)
	Adapt       AdaptConfig
	Epoch       time.Duration // periodic re-plan; default 30 s
	LostAfter   time.Duration // a frame still open this long past its deadline is counted lost; default 5 s
	TurnOff     time.Duration // warm-instance turn-off delay; default placement's 30 s
	// Headroom multiplies the ingress rate the allocator plans for, so
	// instances run below saturation (bursts of synchronised streams,
	// batches that do not fill); default 1.25 (80% planned utilisation).
	Headroom float64
	// DispatchDelay is the margin the GPU scheduler keeps between deciding
	// a batch and the batch starting on its worker (loop, timer and network
	// jitter); default 10 ms. It is reserved in the deadline arithmetic
	// (a batch is dispatched only if it can finish with it), not waited
	// out: the worker starts a batch as soon as it has it.
	DispatchDelay time.Duration
	Log           *slog.Logger
	// OnFrame, when set, is called (from the loop; do not block) with every
	// frame's outcome.
	OnFrame func(FrameResult)
	// Observer receives the engine's events and state (Prometheus:
	// coordinator.Observe(metrics)); default none.
	Observer Observer
	// Ops builds the CPU modules: Deploy refuses an app naming an op it
	// lacks, and the embedded workers build from it. Default: the pure-Go
	// ops (modules.Builtin); the full binary adds the OpenCV ones.
	Ops *modules.Registry
	// Executor, when set, gives each in-process worker (NewEmbedded) its
	// GPU executor, e.g. ONNX Runtime (gpu/onnx, built by cmd/mdag); nil:
	// emulated GPUs. It may hand every worker the same executor.
	Executor ExecutorFactory
	// Store, when set, keeps the state across restarts (coordinator/store:
	// bbolt): New restores what it holds, the loop saves every SaveEvery
	// (default 200 ms) and Close once more. Nil: state in memory only.
	Store     Store
	SaveEvery time.Duration
	// Checkpoint is how often the state of each stream at a stateful
	// module is copied to the coordinator while the stream is idle there,
	// so a lost worker's streams restore from it instead of starting fresh;
	// default 2 s, negative: never.
	Checkpoint time.Duration
	// Stepped runs the engine with no goroutine of its own: events queue
	// until RunPending runs them on the caller's goroutine, and planning
	// rounds run inline. Virtual-time experiments (package eval) drive it
	// that way, with a fake clock, so that every run of a seed is the
	// same; one goroutine must make every call.
	Stepped bool
	// MinReplanGap, when set, is the least time between the starts of two
	// planning rounds: a trigger sooner than that waits for the gap's end
	// (Nexus's epoch scheduler: at least 10 s between epochs). Default 0:
	// every trigger plans at once.
	MinReplanGap time.Duration
	// StartTimeout is how long an instance the provisioner starts as
	// Pending (a Kubernetes pod) may take to come up (its worker to
	// register) before it is counted lost and re-planned; default 3 min
	// (a pod's image pull and scheduling onto a node being added).
	StartTimeout time.Duration
	// Warmup runs, when a GPU module is loaded onto an instance where it
	// was not, a batch of each power-of-two size its budget allows on a
	// blank frame, and keeps the scheduler off the module's
	// slots there until they are done (warmup.go): no frame meets a cold
	// executor. The services set it; off, a module serves at once.
	Warmup bool
}

// ExecutorFactory returns the GPU executor for in-process worker id of
// type typ.
type ExecutorFactory func(id string, typ profile.WorkerTypeID) (gpu.Executor, error)

// FrameResult is one frame's outcome and its module outputs.
type FrameResult struct {
	App      dag.AppID
	Stream   string
	Seq      uint64
	Outcome  Outcome
	Latency  time.Duration
	Module   dag.ModuleID // for drops: where
	Reason   why.Drop     // for drops: why
	Boxes    []media.Box
	Labels   []string
	Counts   map[string]int
	Tracks   []media.Track // from a tracker (track's outputs reaching a sink)
	Events   []media.Event // from activity rules
	Finished time.Time
}

// Outcome is how a frame ended.
type Outcome string

const (
	Finished Outcome = "finished" // within the SLO
	Late     Outcome = "late"     // completed after its deadline
	Dropped  Outcome = "dropped"  // not completed; Module and Reason say where and why
)

// DefaultPolicy is the runtime's GPU batching policy. It is clockwork's
// work-conserving rule (largest batch that meets the earliest deadline), not
// symphony's deferred batching: live sessions of a few streams at 2-30 fps
// reach each model at tens of requests per second, in bursts (streams
// capture at the same instants), with per-module budgets from the latency
// split of tens of milliseconds. There, symphony's wait for sched_at and its
// variability-based batch cap spend the budget a burst needs (measured:
// TestAdaptation's traffic session at 4 x 10 fps finished 66-86% of frames
// under symphony, 99-100% under clockwork). Symphony stays selectable
// (`--policy symphony`) and remains the simulator's default for the
// high-rate shared clusters it was built for.
const DefaultPolicy = scheduler.Clockwork

// Engine is the coordinator. One event loop (loop) runs everything that
// touches its state; the state is grouped by responsibility: the sessions
// and their frames (session.go, engine.go), the instances (registry,
// instance.go), the GPU path to the central scheduler (gpuPath, gpu.go),
// the planning driver (planDriver, plan.go) and persistence (state.go).
// coordinator/README.md maps every file.
type Engine struct {
	cfg    Config
	clk    clock.Clock
	log    *slog.Logger
	epoch0 time.Time
	loop

	// Loop-owned state.
	sessions map[dag.AppID]*session
	streams  map[string]*stream
	tasks    map[uint64]*taskState
	nextTask uint64
	dirtyS   map[*session]map[string]bool // streams whose stateful modules may move on (affinity.go)
	registry
	gpuPath
	planDriver
	ps persist
}

// New returns an engine; call Start before use and Close after. Zero
// fields of cfg take their defaults; a field out of range is an error
// naming it.
func New(cfg Config) (*Engine, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	e := &Engine{cfg: cfg, clk: cfg.Clock, log: cfg.Log, epoch0: cfg.Clock.Now(),
		loop:     loop{events: make(chan func(), 1<<16), done: make(chan struct{})},
		sessions: map[dag.AppID]*session{}, streams: map[string]*stream{}, tasks: map[uint64]*taskState{},
		registry: registry{insts: map[string]*instState{}},
		gpuPath:  gpuPath{reqs: map[uint64]*work{}, gpuIDs: map[string]scheduler.GPUID{}, gpuInst: map[scheduler.GPUID]string{}}}
	if cfg.Store != nil {
		if err := e.loadState(); err != nil {
			return nil, err
		}
	}
	return e, nil
}

// NewEmbedded returns an engine with the local provisioner: in-process
// workers with emulated GPUs (or cfg.Executor's), at most limit instances
// per worker type.
func NewEmbedded(cfg Config, limit map[profile.WorkerTypeID]int) (*Engine, *Local, error) {
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.Ops == nil {
		cfg.Ops = modules.Builtin()
	}
	l := &Local{Clock: cfg.Clock, Limit: limit, Ops: cfg.Ops, Executor: cfg.Executor}
	cfg.Provisioner = l
	e, err := New(cfg)
	if err != nil {
		return nil, nil, err
	}
	l.Engine = e
	return e, l, nil
}

// ErrUnknownApp and friends are the errors callers map to HTTP statuses.
var (
	ErrUnknownApp    = errors.New("unknown app")
	ErrUnknownStream = errors.New("unknown stream")
	ErrDuplicate     = errors.New("already exists")
)

// Deploy adds an app with its profiles. Every CPU op must have an
// implementation and the app must validate against its profiles.
func (e *Engine) Deploy(app *dag.App, f *profile.File) error {
	g, err := dag.NewGraph(app)
	if err != nil {
		return err
	}
	cat, err := profile.Bind(app, f)
	if err != nil {
		return err
	}
	// The runtime's instances start a batch with whatever is queued: plan
	// with that latency model, not Eq. 3's wait to fill a batch.
	cat = cat.Dispatching()
	var errs []error
	for _, m := range app.Modules {
		if m.Kind != dag.CPU {
			continue
		}
		p, err := e.cfg.Ops.New(modules.OpID(m.Op), m.Params)
		if err != nil {
			errs = append(errs, fmt.Errorf("module %s: %w", m.Name, err))
			continue
		}
		p.Close()
	}
	if len(errs) > 0 {
		return fmt.Errorf("app %s cannot run: %w", app.Name, errors.Join(errs...))
	}
	var out error
	e.call(func() {
		if _, ok := e.sessions[app.Name]; ok {
			out = fmt.Errorf("app %s: %w", app.Name, ErrDuplicate)
			return
		}
		s := newSession(app, g, cat, e.cfg.Adapt)
		s.mx = e.cfg.Observer.App(string(app.Name))
		for _, ms := range s.mods {
			ms.mx = e.cfg.Observer.Module(string(app.Name), string(ms.mod.Name), ms.mod.Model, ms.mod.Kind == dag.GPU)
		}
		e.sessions[app.Name] = s
		e.restoreSession(s)
		e.log.Info("app deployed", "app", app.Name, "modules", len(app.Modules), "slo", app.SLO, "warm", app.Warm)
		if app.Warm > 0 {
			e.trigger(why.OnDeploy, fmt.Sprintf("%s deployed, warm for %d streams", app.Name, app.Warm))
		}
	})
	return out
}

// Join adds a stream to an app's session and re-plans for the new rate.
// The session's first stream waits (up to 10 s) for the first plan to be
// applied, so its first frames find instances to run on.
func (e *Engine) Join(app dag.AppID, streamID string) error { return e.JoinAt(app, streamID, 0) }

// JoinAt is Join for a stream that sends fps frames per second rather than
// the app's fps (a camera configured slower or faster): the plan is for
// the sum of the streams' rates. fps 0 is the app's.
func (e *Engine) JoinAt(app dag.AppID, streamID string, fps float64) error {
	if fps < 0 || math.IsNaN(fps) || math.IsInf(fps, 0) {
		return fmt.Errorf("stream %q: fps %v: must be a finite number >= 0 (0: the app's)", streamID, fps)
	}
	var out error
	var wait chan struct{}
	e.call(func() {
		s := e.sessions[app]
		switch {
		case s == nil:
			out = fmt.Errorf("app %q: %w", app, ErrUnknownApp)
		case e.streams[streamID] != nil:
			out = fmt.Errorf("stream %q: %w", streamID, ErrDuplicate)
		default:
			st := &stream{id: streamID, s: s, credit: 1, fps: fps} // a stream's first frame is admitted (a share just under 1 must not shed it)
			if next, ok := s.resume[streamID]; ok {
				// a stream of the previous run, back
				st.next, st.resumed = next, true
				delete(s.resume, streamID)
			}
			e.streams[streamID] = st
			s.streams[streamID] = st
			for _, m := range s.statefulMods {
				// Back before its state was forgotten (a client
				// reconnecting): the state goes on.
				if a := s.mods[m].affs[streamID]; a != nil {
					a.closed = false
				}
			}
			e.log.Info("stream joined", "app", app, "stream", streamID, "streams", len(s.streams))
			e.trigger(why.OnJoin, fmt.Sprintf("stream %s joined %s (%d streams)", streamID, app, len(s.streams)))
			if s.plan == nil {
				wait = s.planned
			}
		}
	})
	if wait != nil && !e.cfg.Stepped { // Stepped: the plan was applied inside call
		select {
		case <-wait:
		case <-e.clk.After(10 * time.Second):
		case <-e.done:
		}
	}
	return out
}

// ErrOverloaded is what Admit answers when a session cannot take another
// stream; the WHIP endpoint turns it into 503 with Retry-After.
var ErrOverloaded = errors.New("overloaded")

// Admit says whether app's session can take one more stream: not while its
// plan has a problem (the workers carry only part of its streams' frames,
// or none of it) or
// its frames reach it later than half the SLO (ingest is saturated; the
// graph would get no time).
func (e *Engine) Admit(app dag.AppID) error {
	var out error
	e.call(func() {
		s := e.sessions[app]
		switch {
		case s == nil:
			out = fmt.Errorf("app %q: %w", app, ErrUnknownApp)
		case s.degraded != "":
			out = fmt.Errorf("app %s is %w: %s", app, ErrOverloaded, s.degraded)
		case s.ingestOver != "":
			out = fmt.Errorf("app %s is %w: %s", app, ErrOverloaded, s.ingestOver)
		}
		if out != nil && s != nil {
			s.mx.Refused()
			e.log.Warn("stream refused", "app", app, "why", out)
		}
	})
	return out
}

// Saturated says whether app's frames reach its session later than half
// its SLO (p95, checked each adaptation window): its streams cannot be
// served, whatever takes the time (decoding CPU, a busy machine, the
// network). The WHIP server sheds the newest streams while it lasts.
func (e *Engine) Saturated(app dag.AppID) bool {
	var out bool
	e.call(func() {
		if s := e.sessions[app]; s != nil {
			out = s.ingestOver != ""
		}
	})
	return out
}

// Leave removes a stream; its frames still in flight are still accounted.
func (e *Engine) Leave(streamID string) error {
	var out error
	e.call(func() {
		st := e.streams[streamID]
		if st == nil {
			out = fmt.Errorf("stream %q: %w", streamID, ErrUnknownStream)
			return
		}
		delete(e.streams, streamID)
		delete(st.s.streams, streamID)
		if !st.size.IsZero() {
			e.planFrame(st.s) // the largest size left may be smaller
		}
		e.streamLeft(st.s, streamID)
		e.log.Info("stream left", "app", st.s.app.Name, "stream", streamID, "streams", len(st.s.streams))
		if len(st.s.streams) == 0 {
			// What the streams taught (objects per frame, slowdowns, extra
			// headroom) leaves with them: the next stream starts from the
			// app's factors, not from a plan for a scene no one sends.
			st.s.forget()
		}
		e.trigger(why.OnLeave, fmt.Sprintf("stream %s left %s (%d streams)", streamID, st.s.app.Name, len(st.s.streams)))
	})
	return out
}

// Ingest hands one captured frame of a stream to its session. It returns
// at once; the frame's outcome is accounted (and sent to OnFrame) later.
func (e *Engine) Ingest(streamID string, seq uint64, capture time.Time, f *media.Frame, truth []media.Box) error {
	if err := f.Valid(); err != nil {
		return fmt.Errorf("stream %s frame %d: %w", streamID, seq, err)
	}
	return e.ingestMedia(streamID, seq, capture, dag.Video, &media.Item{Frame: f, Truth: truth})
}

// IngestHeld is Ingest for a frame an ingest worker holds (issue 41): f
// names it (Ref) and gives its size, and its pixels never come here; the
// first module's worker fetches them from the holder, as it does any
// module's output on the direct data plane.
func (e *Engine) IngestHeld(streamID string, seq uint64, capture time.Time, f *media.Frame, truth []media.Box) error {
	switch {
	case f == nil || f.Ref == nil:
		return fmt.Errorf("stream %s frame %d: not a reference to a held frame", streamID, seq)
	case f.Pix != nil:
		return fmt.Errorf("stream %s frame %d: a held frame carries no pixels", streamID, seq)
	case f.W <= 0 || f.H <= 0:
		return fmt.Errorf("stream %s frame %d: size %dx%d", streamID, seq, f.W, f.H)
	}
	return e.ingestMedia(streamID, seq, capture, dag.Video, &media.Item{Frame: f, Truth: truth})
}

// AppInfo is what an ingest worker needs of an app: what it takes and its
// SLO (how long the worker holds a frame).
type AppInfo struct {
	Media dag.Media
	SLO   time.Duration
}

// App returns app's AppInfo; ErrUnknownApp when it is not deployed.
func (e *Engine) App(app dag.AppID) (AppInfo, error) {
	var out AppInfo
	var err error
	e.call(func() {
		s := e.sessions[app]
		if s == nil {
			err = fmt.Errorf("app %q: %w", app, ErrUnknownApp)
			return
		}
		out = AppInfo{Media: cmp.Or(s.app.Media, dag.Video), SLO: s.app.SLO}
	})
	return out, err
}

// IngestAudio hands one chunk of an audio stream (an app with `media:
// audio`) to its session, like Ingest does a frame: seq numbers the chunks.
func (e *Engine) IngestAudio(streamID string, seq uint64, capture time.Time, a *media.Audio) error {
	if err := a.Valid(); err != nil {
		return fmt.Errorf("stream %s chunk %d: %w", streamID, seq, err)
	}
	return e.ingestMedia(streamID, seq, capture, dag.Audio, &media.Item{Audio: a})
}

// ingestMedia starts payload (of kind m) as frame seq of the stream, if
// the stream's app takes m.
func (e *Engine) ingestMedia(streamID string, seq uint64, capture time.Time, m dag.Media, payload *media.Item) error {
	var out error
	e.call(func() {
		st := e.streams[streamID]
		switch {
		case st == nil:
			out = fmt.Errorf("stream %q: %w", streamID, ErrUnknownStream)
		case cmp.Or(st.s.app.Media, dag.Video) != m:
			out = fmt.Errorf("stream %s: app %s takes %s, not %s", streamID, st.s.app.Name, cmp.Or(st.s.app.Media, dag.Video), m)
		default:
			e.ingest(st, seq, capture, payload)
		}
	})
	return out
}

// Result is how instances report task outcomes (from any goroutine).
func (e *Engine) Result(instance string, r worker.Result) {
	e.post(func() { e.onResult(instance, r) })
}

// now is the engine's time; schedNow the scheduler's (since the engine started).
func (e *Engine) now() time.Time { return e.clk.Now() }

// ---- sessions, frames and items ----

type stream struct {
	id      string
	s       *session
	credit  float64           // shedding: admitted share accumulated; a frame is admitted when it reaches 1
	next    uint64            // the sequence number after the highest one seen (persisted)
	resumed bool              // restored from the store: its first frame may say what it sent meanwhile
	fps     float64           // its frame rate; 0: the app's
	size    profile.FrameSize // the size of its last frame (kept only where the profiles are sized: framesize.go)
}

type frameKey struct {
	stream string
	seq    uint64
}

type frame struct {
	key      frameKey
	capture  time.Time
	deadline time.Time
	pending  int
	busy     map[dag.ModuleID]int // items at each module not yet retired (stateful modules' gathers read it)
	dropped  bool
	module   dag.ModuleID
	reason   why.Drop
	outputs  []*media.Item
}

// work is one item on its way into a module.
type work struct {
	s  *session
	f  *frame
	m  dag.ModuleID
	it *media.Item
	at time.Time // entered the module
	// hard: a GPU request sent with the plan's target as its deadline
	// goes back in line with this bound when the target is missed (zero:
	// it was sent with the bound).
	hard time.Time
}

// ingest starts frame seq of st; it carries payload's Frame and Truth
// (video) or Audio.
func (e *Engine) ingest(st *stream, seq uint64, capture time.Time, payload *media.Item) {
	s := st.s
	k := frameKey{st.id, seq}
	if _, dup := s.frames[k]; dup {
		e.log.Warn("duplicate frame ignored", "stream", st.id, "seq", seq)
		return
	}
	if st.resumed {
		for _, m := range s.statefulMods {
			// The state this stream had before the coordinator restarted
			// is not known here: its next holder starts it fresh (a
			// worker may hold a stale copy: forgotten), counted reset.
			s.mods[m].aff(st.id).restarted = true
		}
		e.resumed(st, seq)
	}
	st.next = max(st.next, seq+1)
	if f := payload.Frame; f != nil {
		e.sawFrame(st, f.W, f.H)
	}
	fr := &frame{key: k, capture: capture, deadline: capture.Add(s.app.SLO)}
	s.frames[k] = fr
	if s.stateful {
		fr.busy = map[dag.ModuleID]int{}
		if s.open[st.id] == nil {
			s.open[st.id] = map[uint64]*frame{}
		}
		s.open[st.id][seq] = fr
	}
	s.acct.sent(capture)
	s.mx.FrameSent()
	delay := e.now().Sub(capture)
	s.sawIngest(delay)
	s.mx.IngestDelay(delay)
	if s.admit < 1 {
		// Degraded plan: every stream keeps the same share of its frames
		// (the shed ones are counted, never silently skipped).
		st.credit += s.admit
		if st.credit < 1 {
			fr.dropped, fr.module, fr.reason = true, "-", why.Shed
			e.finishFrame(s, fr)
			return
		}
		st.credit--
	}
	it := &media.Item{Stream: st.id, Seq: seq, Capture: capture, Deadline: fr.deadline, Frame: payload.Frame, Truth: payload.Truth, Audio: payload.Audio}
	outs := s.g.Sources()
	if len(outs) == 0 {
		e.finishFrame(s, fr)
		return
	}
	for _, m := range outs {
		e.emit(s, fr, m, it)
	}
}

// emit sends an item into module m: early drop, then the GPU scheduler or
// a CPU instance.
func (e *Engine) emit(s *session, fr *frame, m dag.ModuleID, it *media.Item) {
	fr.pending++
	if fr.dropped {
		e.done1(s, fr)
		return
	}
	now := e.now()
	ms := s.mods[m]
	ms.obs.In++
	ms.mx.In()
	w := &work{s: s, f: fr, m: m, it: it, at: now}
	if fr.busy != nil {
		fr.busy[m]++
	}
	if s.plan == nil {
		e.drop(w, why.NoPlan, "the session has no feasible plan yet")
		return
	}
	if now.Add(s.minTail[m] + ms.fastest).After(fr.deadline) {
		e.drop(w, why.CannotFinish, fmt.Sprintf("needs %v more, %v left", (s.minTail[m]+ms.fastest).Round(time.Microsecond), fr.deadline.Sub(now).Round(time.Microsecond)))
		return
	}
	if ms.mod.Kind == dag.GPU {
		e.arriveGPU(w)
		return
	}
	if ms.stateful {
		e.park(w)
		return
	}
	in, ok := e.pick(ms)
	if !ok {
		e.drop(w, why.NoInstance, "no live instance hosts the module"+e.startingFor(s.app.Name, m))
		return
	}
	// Early drop on the instance's queue: waiting behind what is
	// outstanding there, at the profiled speed.
	ahead := len(in.byMod[ms.key]) / max(1, ms.conc[in.id])
	expect := time.Duration(ahead+1) * ms.latency[in.id]
	if now.Add(expect + s.minTail[m]).After(fr.deadline) {
		e.drop(w, why.CannotFinish, fmt.Sprintf("%d ahead on %s, %v expected", len(in.byMod[ms.key]), in.id, expect.Round(time.Microsecond)))
		return
	}
	e.submit(in, []*work{w}, nil, time.Time{}, time.Time{}, nil)
}

func (e *Engine) submit(in *instState, ws []*work, reqs []uint64, earliest, latest time.Time, a *scheduler.Action) {
	e.nextTask++
	id := e.nextTask
	t := worker.Task{ID: id, App: ws[0].s.app.Name, Module: ws[0].m, Earliest: earliest, Latest: latest}
	for _, w := range ws {
		t.Items = append(t.Items, w.it)
	}
	key := ws[0].s.mods[ws[0].m].key
	// Warm-up is counted in the order batches start, not the order they
	// end: at concurrency 2 a cold first batch (3.4 s of S2VT's 1.5) ends
	// after the warm second and third, and counted on its result it was
	// taken for the third, measured, and stopped every frame.
	e.tasks[id] = &taskState{id: id, inst: in.id, works: ws, reqs: reqs, action: a, gen: e.schedGen, key: key,
		cold: in.warming(key, len(ws))}
	in.outstanding[id] = true
	if in.byMod == nil {
		in.byMod = map[string]map[uint64]bool{}
	}
	if in.byMod[key] == nil {
		in.byMod[key] = map[uint64]bool{}
	}
	in.byMod[key][id] = true
	in.inst.Submit(t)
}

// pick chooses the instance for a CPU item: the fewest outstanding tasks
// per unit of planned rate (weighted join-shortest-queue).
func (e *Engine) pick(ms *modState) (*instState, bool) {
	var best *instState
	bestScore := 0.0
	for _, r := range ms.routes {
		in := e.insts[r.inst]
		if in == nil || in.lost {
			continue
		}
		score := float64(len(in.byMod[ms.key])+1) / max(r.weight, 1e-9)
		if best == nil || score < bestScore {
			best, bestScore = in, score
		}
	}
	return best, best != nil
}

type taskState struct {
	id     uint64
	inst   string
	key    string // the module's key (app/module)
	works  []*work
	reqs   []uint64 // GPU tasks: the scheduler's request ID of each work
	action *scheduler.Action
	gen    int
	cold   bool // among the first WarmupRuns of its size on the instance (warming)
	warm   bool // a warm-up batch (warmup.go): no works
	heldIn int  // the scheduler generation that holds its slot (a batch of an earlier one still running)
	// Stateful modules: the stream's affinity (frame and state tasks),
	// and for a state task what it does and the bytes it carried.
	aff        *affinity
	state      *stateOp
	stateBytes []byte
}

func (e *Engine) onResult(instance string, r worker.Result) {
	t := e.tasks[r.Task]
	if t == nil || t.inst != instance {
		return // answered already (the instance was declared lost)
	}
	e.forget(t)
	if t.warm {
		e.warmed(t, r)
		return
	}
	if e.unhold(t) {
		defer e.pump() // what the scheduler sent to the slot goes out now
	}
	switch r.Outcome {
	case worker.Rejected, worker.QueueFull, worker.NotLoaded, worker.Unloaded, worker.BadTask:
		e.insts[instance].unstarted(t.key, len(t.works)) // it never ran: no warm-up run used
	}
	if t.state != nil {
		e.onStateResult(t, &r)
		return
	}
	if t.aff != nil {
		t.aff.busy = 0
		if r.Outcome == worker.Done {
			t.aff.lastSq, t.aff.sent = t.works[0].f.key.seq, true // what the next checkpoint includes
		}
		e.dirty(t.works[0].s, t.aff.stream)
	}
	now := e.now()
	s := t.works[0].s
	ms := s.mods[t.works[0].m]
	if r.Outcome == worker.Rejected && t.action != nil {
		e.requeueRejected(t, ms, now)
		return
	}
	measured := r.Measured
	if r.Outcome == worker.Done && t.cold {
		// A cold run (the first at this batch size since the module was
		// loaded here: ONNX Runtime's first runs of a shape took 16-18 ms
		// against 1.5-2 ms warm) is not what the module costs: it teaches
		// neither the scheduler's estimate nor the ballooning factor.
		measured = 0
	}
	if t.action != nil && r.Outcome == worker.Done {
		ms.expired, ms.lastDone = 0, now
	}
	if t.action != nil && t.gen == e.schedGen && e.sched != nil {
		e.sched.Finished(e.schedTime(now), t.action, measured)
		defer e.pump()
	}
	// Anything but a usable Done drops the task's items, with the outcome's
	// code as the reason.
	if reason, detail := usable(t, r); reason != worker.Done {
		for _, w := range t.works {
			e.drop(w, outcomeDrop(reason), detail)
		}
		return
	}
	e.completed(instance, t, r, measured, now)
}

// requeueRejected puts a GPU task's requests a worker rejected (its action
// window passed) back to the scheduler: under their IDs when its
// scheduler still runs, as new arrivals when a plan has replaced it.
func (e *Engine) requeueRejected(t *taskState, ms *modState, now time.Time) {
	ms.obs.rejected++
	ms.mx.Rejected()
	if t.gen == e.schedGen {
		// The scheduler puts the requests back in line under their
		// IDs: so must the engine, or they could never be dispatched
		// or dropped again.
		for i, w := range t.works {
			e.reqs[t.reqs[i]] = w
		}
		e.sched.Rejected(e.schedTime(now), t.action)
	} else {
		for _, w := range t.works {
			e.arriveGPU(w)
		}
	}
	e.pump()
}

// usable says whether a result can be used (worker.Done) or else why not:
// its outcome, or BadResult with what is wrong with it.
func usable(t *taskState, r worker.Result) (worker.Outcome, string) {
	switch r.Outcome {
	case worker.Done:
		if len(r.Outputs) != len(t.works) {
			return worker.BadResult, fmt.Sprintf("%d outputs for %d items", len(r.Outputs), len(t.works))
		}
	case worker.Rejected: // only a GPU task has a window to miss
		return worker.BadResult, "rejected a task that had no action window"
	default:
		if !r.Outcome.Valid() {
			return worker.BadResult, fmt.Sprintf("unknown outcome %d (detail: %q)", uint8(r.Outcome), r.Detail)
		}
	}
	return r.Outcome, r.Detail
}

// completed records a task that ran (its measured time teaches the
// ballooning factor unless it was a cold run) and sends its items' outputs
// on to the next modules.
func (e *Engine) completed(instance string, t *taskState, r worker.Result, measured time.Duration, now time.Time) {
	s := t.works[0].s
	ms := s.mods[t.works[0].m]
	if exp := ms.expected(instance, len(t.works)); exp > 0 && measured > 0 {
		ms.obs.measured += r.Measured
		ms.obs.profiled += exp
		ms.obs.balloonN++
	}
	ms.obs.batches += len(t.works)
	ms.obs.tasks++
	ms.obs.execSum += r.Measured
	{
		// The task started about Measured before its result came back
		// (the return trip counts as execution, not queueing).
		ms.mx.Exec(r.Measured)
		started := now.Add(-r.Measured)
		for _, w := range t.works {
			ms.mx.Queued(started.Sub(w.at))
		}
	}
	outs := s.g.Outputs(t.works[0].m)
	for i, w := range t.works {
		ms.obs.latSum += now.Sub(w.at)
		ms.obs.latN++
		ms.obs.Done++
		ms.obs.Out += len(r.Outputs[i])
		for _, o := range r.Outputs[i] {
			if len(outs) == 0 {
				w.f.outputs = append(w.f.outputs, o)
			}
			for _, d := range outs {
				e.emit(s, w.f, d, o)
			}
		}
		e.retire(w)
	}
}

func (e *Engine) forget(t *taskState) {
	delete(e.tasks, t.id)
	if in := e.insts[t.inst]; in != nil {
		delete(in.outstanding, t.id)
		if m := in.byMod[t.key]; m != nil {
			delete(m, t.id)
		}
		if in.releasing && len(in.outstanding) == 0 {
			e.releaseDue = true // after this event (runEvent)
		}
	}
}

// drop ends an item: its frame is counted dropped at module w.m for reason.
func (e *Engine) drop(w *work, reason why.Drop, detail string) {
	ms := w.s.mods[w.m]
	ms.obs.dropped++
	if !w.f.dropped {
		w.f.dropped, w.f.module, w.f.reason = true, w.m, reason
		e.log.Debug("frame dropped", "app", w.s.app.Name, "stream", w.f.key.stream, "seq", w.f.key.seq,
			"module", w.m, "reason", reason, "detail", detail)
	}
	e.retire(w)
}

// retire ends one item's stay at its module.
func (e *Engine) retire(w *work) {
	if w.f.busy != nil {
		w.f.busy[w.m]--
		e.dirty(w.s, w.f.key.stream)
	}
	e.done1(w.s, w.f)
}

// done1 retires one item of a frame; the last one decides the outcome.
func (e *Engine) done1(s *session, fr *frame) {
	fr.pending--
	if fr.pending == 0 {
		e.finishFrame(s, fr)
	}
}

func (e *Engine) finishFrame(s *session, fr *frame) {
	if _, open := s.frames[fr.key]; !open {
		return
	}
	delete(s.frames, fr.key)
	if s.stateful {
		delete(s.open[fr.key.stream], fr.key.seq)
		if len(s.open[fr.key.stream]) == 0 {
			delete(s.open, fr.key.stream)
		}
		e.dirty(s, fr.key.stream)
	}
	now := e.now()
	res := FrameResult{App: s.app.Name, Stream: fr.key.stream, Seq: fr.key.seq, Latency: now.Sub(fr.capture), Finished: now}
	switch {
	case fr.dropped:
		res.Outcome, res.Module, res.Reason = Dropped, fr.module, fr.reason
	case now.After(fr.deadline):
		res.Outcome = Late
	default:
		res.Outcome = Finished
	}
	for _, o := range fr.outputs {
		res.Boxes = append(res.Boxes, o.Boxes...)
		res.Labels = append(res.Labels, o.Labels...)
		res.Tracks = append(res.Tracks, o.Tracks...)
		res.Events = append(res.Events, o.Events...)
		for k, v := range o.Counts {
			if res.Counts == nil {
				res.Counts = map[string]int{}
			}
			res.Counts[k] += v
		}
	}
	if len(s.streams) == 0 && len(s.frames) == 0 && s.plan != nil && s.rate > 0 && s.app.Warm == 0 {
		// The streams left and their last frame ended: the session can
		// give its instances back now.
		defer e.trigger(why.OnLeave, fmt.Sprintf("the last frames of %s's streams ended", s.app.Name))
	}
	s.acct.outcome(fr.capture, res)
	s.mx.Frame(string(res.Outcome), string(res.Module), res.Reason, res.Latency)
	if e.cfg.OnFrame != nil {
		e.cfg.OnFrame(res)
	}
}

// schedulerDrop is the drop reason of a request the central scheduler
// dropped (the scheduler's reasons are among why's Drops under their own
// strings: TestReasonVocabulary).
func schedulerDrop(r scheduler.DropReason) why.Drop { return why.Drop(r) }

// outcomeDrop is the drop reason of a worker's outcome other than Done
// (every worker.Outcome is among why's Drops under its String:
// TestReasonVocabulary).
func outcomeDrop(o worker.Outcome) why.Drop { return why.Drop(o.String()) }
