package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/mdag/mdag/api"
	"github.com/mdag/mdag/gpu"
	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/internal/defaults"
	"github.com/mdag/mdag/modules"
	"github.com/mdag/mdag/remote/wire"
	"github.com/mdag/mdag/worker"
)

// workerStream is the worker's end of the Connect stream as a session
// uses it: gRPC's client stream, or a test's in-memory one. The context
// the stream was opened with ends it (Recv returns).
type workerStream interface {
	Send(*api.WorkerMessage) error
	Recv() (*api.CoordinatorMessage, error)
	CloseSend() error
}

// openStream opens the Connect stream; ctx ending ends it.
type openStream func(ctx context.Context) (workerStream, error)

// workerSession is one connection of a worker to the coordinator, RunWorker
// in named steps: probe the executor, register, start the worker, then
// three goroutines until the stream ends: the sender (the only one that
// writes the stream: queued messages and heartbeats), the prober (an
// executor with a health probe) and the receiver (the caller's: loads and
// tasks).
type workerSession struct {
	cfg    WorkerConfig // defaults filled in
	kind   string       // the executor, as registered
	target string       // the coordinator, for the log
	hp     healthProber // nil: the executor has no probe

	ctx    context.Context // ends with the session; its cause is why
	cancel context.CancelCauseFunc
	stream workerStream
	dp     *DataPlane              // never nil once registering
	beat   time.Duration           // the heartbeat interval the coordinator asked for
	batch  bool                    // the coordinator takes WorkerBatch messages
	direct bool                    // outputs' frames are held here for peers
	inline int                     // direct: outputs' frames of fewer pixel bytes go inline (-1: none)
	out    chan *api.WorkerMessage // to the sender
	w      *worker.Worker
	fx     *fetcher
	order  *pending
	em     *gpu.Emulated // nil: no model runs emulated
	loaded *api.Load     // the modules hosted now
	joins  joinWaits     // camera streams joining through this session (ingest)
	cams   cameraSet     // the coordinator's cameras read here
	// whipSlots bound the delegated WHIP offers answered at once
	whipSlots chan struct{}
}

// newWorkerSession fills in cfg's defaults and checks it; a field out of
// range is InvalidArgument (retrying cannot fix it: callers stop on it).
func newWorkerSession(cfg WorkerConfig) (*workerSession, error) {
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Ops == nil {
		cfg.Ops = modules.Builtin()
	}
	if cfg.GPU == "" {
		cfg.GPU = "unknown"
	}
	c := defaults.Fields{Prefix: "client.WorkerConfig"}
	c.Duration("HealthInterval", &cfg.HealthInterval, DefaultHealthInterval)
	c.Duration("HealthTimeout", &cfg.HealthTimeout, 2*time.Second)
	if cfg.Data != nil && cfg.Data.Store != nil {
		cfg.Data.Store.check(&c, "Data.Store.")
	}
	if err := c.Err(); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	s := &workerSession{cfg: cfg, kind: "emulated"}
	if cfg.Exec != nil {
		s.kind = cfg.Exec.Kind()
		if len(cfg.Emulate) > 0 {
			s.kind += "+emulated"
		}
	}
	s.hp, _ = cfg.Exec.(healthProber)
	return s, nil
}

// run is the session from the first probe to the stream's end; it returns
// why it ended.
func (s *workerSession) run(ctx context.Context, open openStream) error {
	if s.hp != nil {
		if err := s.probe(ctx); err != nil {
			return fmt.Errorf("not registering: %w", err)
		}
	}
	s.ctx, s.cancel = context.WithCancelCause(ctx)
	defer s.cancel(nil)
	stream, err := open(s.ctx)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	s.stream = stream
	ack, err := s.register()
	if err != nil {
		return err
	}
	s.start(ack)
	defer s.stop()
	sent, probed, cams := s.startSender(), s.startProber(), s.startCameras()
	err = s.receive()
	// the stream may end without ctx: end the sender, the prober and the
	// cameras
	s.cancel(err)
	<-sent
	<-probed
	<-cams
	return err
}

// probe runs the executor's health probe once, bounded by HealthTimeout.
func (s *workerSession) probe(ctx context.Context) error {
	pctx, pcancel := context.WithTimeout(ctx, s.cfg.HealthTimeout)
	defer pcancel()
	if err := s.hp.Health(pctx); err != nil {
		return fmt.Errorf("executor %s unhealthy: %w", s.kind, err)
	}
	return nil
}

// register sends the registration and returns the coordinator's ack.
func (s *workerSession) register() (*api.Registered, error) {
	s.dp = s.cfg.Data
	if s.dp == nil {
		s.dp = &DataPlane{}
	}
	if s.dp.Addr != "" && s.dp.Store == nil {
		s.dp.Store = &Store{Clock: s.cfg.Clock}
	}
	reg := &api.Register{Id: s.cfg.ID, Type: s.cfg.Type, Executor: s.kind, Cpus: int32(runtime.NumCPU()), Gpu: s.cfg.GPU, PeerAddr: s.dp.Addr, Batches: true}
	if s.dp.Addr != "" && s.dp.Ingest != nil {
		reg.IngestAddr, reg.IngestStreams = s.dp.Ingest.Addr, int32(s.dp.Ingest.maxStreams())
		reg.Thumbnails = s.dp.Ingest.Thumb != nil
		reg.Cameras = s.dp.Ingest.Cameras != nil
		reg.Whip = s.dp.Ingest.Whip != nil
	}
	if err := s.stream.Send(&api.WorkerMessage{Msg: &api.WorkerMessage_Register{Register: reg}}); err != nil {
		if errors.Is(err, io.EOF) {
			// The coordinator ended the call before it read the
			// registration (it refused the call: a wrong role, a rate
			// limit): the status says why, and Recv has it.
			if _, rerr := s.stream.Recv(); rerr != nil {
				err = rerr
			}
		}
		return nil, fmt.Errorf("register: %w", err)
	}
	m, err := s.stream.Recv()
	if err != nil {
		return nil, fmt.Errorf("register: %w", err)
	}
	ack := m.GetRegistered()
	if ack == nil {
		return nil, errors.New("register: the coordinator did not acknowledge")
	}
	return ack, nil
}

// start makes the worker that serves the session's tasks, as ack asks,
// its fetcher and the order that hands it tasks once their frames are
// here; stop ends them.
func (s *workerSession) start(ack *api.Registered) {
	s.beat = time.Duration(ack.HeartbeatIntervalNs)
	if s.beat <= 0 {
		s.beat = wire.DefaultHeartbeat
	}
	s.out = make(chan *api.WorkerMessage, wire.DefaultSendQueue)
	s.whipSlots = make(chan struct{}, maxWhipAccepting)
	s.batch = ack.Batches
	s.direct = ack.Direct && s.dp.Addr != ""
	s.inline = s.dp.inlineBelow()
	if ack.ByReference {
		s.inline = -1
	}
	s.w = worker.NewWorker(s.cfg.ID, s.cfg.Type, s.cfg.Clock, nil, s.cfg.Ops, s.result)
	s.fx = newFetcher(s.cfg.ID, s.dp, s.cfg.Clock)
	s.order = newPending(s.ctx, s.w, s.fx, s.unfetched)
	s.w.SetExecutor(s.executor())
	if s.direct && s.dp.Ingest != nil {
		s.dp.Ingest.attach(s)
	}
	s.logRegistered()
}

// executor is what runs the worker's GPU batches: Exec, the emulated
// executor, or Exec with the models of Emulate routed to the emulated one.
func (s *workerSession) executor() gpu.Executor {
	cfg := s.cfg
	if cfg.Exec == nil || len(cfg.Emulate) > 0 {
		s.em = gpu.NewEmulated(cfg.Clock, s.w.Latency, gpu.WithVariance(cfg.Variance.Derive(cfg.ID)))
		if cfg.Slowdown > 0 {
			s.em.SetSlowdown(cfg.Slowdown)
		}
		if cfg.OnEmulated != nil {
			cfg.OnEmulated(s.em)
		}
	}
	switch {
	case cfg.Exec == nil:
		return s.em
	case len(cfg.Emulate) > 0:
		r := &gpu.Router{By: map[string]gpu.Executor{}, Default: cfg.Exec}
		for _, m := range cfg.Emulate {
			r.By[m] = s.em
		}
		return r
	}
	return cfg.Exec
}

func (s *workerSession) logRegistered() {
	plane := "relay (outputs' frames through the coordinator)"
	if s.direct {
		plane = "direct (outputs' frames held here for peers at " + s.dp.Addr + ")"
		if s.inline < 0 {
			plane = "direct, every frame by reference (outputs' frames held here for peers at " + s.dp.Addr + ")"
		}
		if s.dp.Ingest != nil {
			plane += "; ingest: cameras routed here at " + s.dp.Ingest.Addr
		}
	} else if s.dp.Ingest != nil {
		s.cfg.Log.Warn("ingest off: the coordinator relays this worker's frames, so no camera is routed here", "ingest_listen", s.dp.Ingest.Addr)
	}
	args := []any{"coordinator", s.target, "id", s.cfg.ID, "type", s.cfg.Type, "executor", s.kind, "heartbeat", s.beat, "data_plane", plane}
	if s.em != nil {
		args = append(args, "variance", s.cfg.Variance.String())
	}
	s.cfg.Log.Info("registered", args...)
}

// stop waits for the tasks fetching their frames (they submit to the
// worker), logs the data plane's counters and closes the fetcher and the
// worker.
func (s *workerSession) stop() {
	if s.dp.Ingest != nil {
		s.dp.Ingest.detach(s)
		if s.dp.Ingest.Whip != nil {
			s.dp.Ingest.Whip.EndAll() // the coordinator ended them with this connection
		}
	}
	s.order.wait()
	st := s.fx.stats()
	args := []any{"fetched", st.fetched, "fetches_failed", st.failed}
	if s.dp.Store != nil {
		ss := s.dp.Store.Stats()
		args = append(args, "held", ss.Held, "held_bytes", ss.Bytes, "put", ss.Put, "served", ss.Served, "local", ss.Local,
			"expired", ss.Expired, "evicted", ss.Evicted, "missing", ss.Missing)
	}
	s.cfg.Log.Info("data plane", args...)
	s.fx.close()
	s.w.Close()
}

// send queues m for the sender; it gives up when the session ends.
func (s *workerSession) send(m *api.WorkerMessage) {
	select {
	case s.out <- m:
	case <-s.ctx.Done():
	}
}

// result sends the worker's result of a task, its outputs' frames held
// here on the direct data plane.
func (s *workerSession) result(r worker.Result) {
	if s.direct {
		r = holdOutputs(r, s.cfg.ID, s.dp, s.inline)
	}
	s.send(&api.WorkerMessage{Msg: &api.WorkerMessage_Result{Result: wire.ResultToPB(r)}})
}

// unfetched answers a task the order could not hand to the worker: its
// frames could not be fetched, or too many tasks wait for theirs.
func (s *workerSession) unfetched(t worker.Task, o worker.Outcome, detail string) {
	s.cfg.Log.Warn("task refused before it ran", "task", t.ID, "app", t.App, "module", t.Module, "outcome", o, "detail", detail)
	s.answer(t.ID, o, detail)
}

// answer sends the result of a task that never ran.
func (s *workerSession) answer(id uint64, o worker.Outcome, detail string) {
	s.send(&api.WorkerMessage{Msg: &api.WorkerMessage_Result{Result: wire.ResultToPB(worker.Result{Task: id, Outcome: o, Detail: detail})}})
}

// startSender starts the sender; the channel closes when it has ended.
func (s *workerSession) startSender() <-chan struct{} {
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		s.sendLoop()
	}()
	return sent
}

// sendLoop writes the queued messages, and a heartbeat every beat on the
// clock, until the session ends or a write fails (which ends it).
//
// With a coordinator that takes batches (Registered.batches), what queued
// while the sender was writing goes as one WorkerBatch, in order.
func (s *workerSession) sendLoop() {
	tick := s.cfg.Clock.After(s.beat)
	var next *api.WorkerMessage // where the last batch stopped: sent first
	for {
		if s.ctx.Err() != nil {
			_ = s.stream.CloseSend()
			return
		}
		m := next
		next = nil
		if m == nil {
			select {
			case m = <-s.out:
			case <-tick:
				m, tick = s.heartbeat(), s.cfg.Clock.After(s.beat)
			case <-s.ctx.Done():
				_ = s.stream.CloseSend()
				return
			}
		}
		if s.batch {
			m, next = wire.PackUp(m, s.out)
		}
		if !s.write(m) {
			return
		}
	}
}

// write sends m down the stream; a failure ends the session.
func (s *workerSession) write(m *api.WorkerMessage) bool {
	if err := s.stream.Send(m); err != nil {
		s.cancel(fmt.Errorf("send: %w", err))
		return false
	}
	return true
}

// heartbeat is the worker's counters now.
func (s *workerSession) heartbeat() *api.WorkerMessage {
	st := s.w.Stats()
	hb := &api.Heartbeat{Tasks: st.Tasks, Rejected: st.Rejected, Failed: st.Failed, QueueFull: st.Full, Modules: int32(st.Modules)}
	return &api.WorkerMessage{Msg: &api.WorkerMessage_Heartbeat{Heartbeat: hb}}
}

// startProber starts the prober of an executor with a health probe; the
// channel closes when it has ended (at once without a probe).
func (s *workerSession) startProber() <-chan struct{} {
	probed := make(chan struct{})
	if s.hp == nil {
		close(probed)
		return probed
	}
	go func() {
		defer close(probed)
		s.proberLoop()
	}()
	return probed
}

// proberLoop probes the executor every HealthInterval on the clock; a
// failed probe ends the session with the reason.
func (s *workerSession) proberLoop() {
	for {
		select {
		case <-s.cfg.Clock.After(s.cfg.HealthInterval):
		case <-s.ctx.Done():
			return
		}
		if err := s.probe(s.ctx); err != nil {
			if s.ctx.Err() == nil {
				s.cfg.Log.Error("leaving the coordinator", "err", err)
			}
			s.cancel(err)
			return
		}
	}
}

// receive handles the coordinator's messages until the stream ends; it
// returns why: the session's cause if it has one (a failed probe or
// write, the caller's context), else the stream's error.
func (s *workerSession) receive() error {
	for {
		m, err := s.stream.Recv()
		if err != nil {
			if c := context.Cause(s.ctx); c != nil {
				return c
			}
			return fmt.Errorf("receive: %w", err)
		}
		if b := m.GetBatch(); b != nil {
			for _, in := range b.Msgs {
				s.handle(in, true)
			}
			continue
		}
		s.handle(m, false)
	}
}

// handle handles one message from the coordinator (inBatch: one of a
// batch's, which holds no batch).
func (s *workerSession) handle(m *api.CoordinatorMessage, inBatch bool) {
	switch m := m.Msg.(type) {
	case *api.CoordinatorMessage_Load:
		s.handleLoad(m.Load)
	case *api.CoordinatorMessage_Task:
		s.handleTask(m.Task)
	case *api.CoordinatorMessage_StreamJoined:
		if !s.joins.answer(m.StreamJoined) {
			s.cfg.Log.Warn("the coordinator answered a stream join no one waits for", "join", m.StreamJoined.Id)
		}
	case *api.CoordinatorMessage_ThumbsWanted:
		if s.dp.Ingest != nil {
			s.dp.Ingest.wantThumbs(s.cfg.Clock.Now(), m.ThumbsWanted)
		}
	case *api.CoordinatorMessage_CameraAssign, *api.CoordinatorMessage_CameraRelease:
		// done by the camera loop, in order: a camera's join waits for
		// the coordinator's answer, which this receiver reads
		if s.cams.wake == nil { // this worker reads none: said at once
			if a, ok := m.(*api.CoordinatorMessage_CameraAssign); ok {
				s.assignCamera(a.CameraAssign)
			}
			return
		}
		s.cameraOp(&api.CoordinatorMessage{Msg: m})
	case *api.CoordinatorMessage_WhipOffer:
		s.whipOffer(m.WhipOffer)
	case *api.CoordinatorMessage_WhipResult:
		if g := s.dp.Ingest; g != nil && g.Whip != nil {
			g.Whip.Result(m.WhipResult.Stream, m.WhipResult.Json)
		}
	case *api.CoordinatorMessage_WhipEnd:
		if g := s.dp.Ingest; g != nil && g.Whip != nil {
			go g.Whip.End(m.WhipEnd.Stream) // it waits for the stream's goodbyes
		}
	default:
		s.cfg.Log.Warn("unexpected message from the coordinator", "type", fmt.Sprintf("%T", m), "in_batch", inBatch)
	}
}

// handleLoad makes the worker host l's modules and answers with a
// LoadReply of l's generation (and the error, if it failed). The tasks
// sent before l reach the modules they were sent to, those fetching their
// frames too: the load waits for the fetches of modules it removes or
// changes.
func (s *workerSession) handleLoad(l *api.Load) {
	s.order.barrier(unchanged(s.loaded, l))
	s.loaded = l
	reply := &api.LoadReply{Generation: l.Generation}
	if err := load(s.w, l); err != nil {
		reply.Error = err.Error()
		s.cfg.Log.Error("load", "err", err)
	} else {
		s.cfg.Log.Info("modules loaded", "generation", l.Generation, "modules", moduleNames(l))
	}
	s.send(&api.WorkerMessage{Msg: &api.WorkerMessage_LoadReply{LoadReply: reply}})
}

// handleTask hands a task to the worker once its frames are here. Every
// kind of task (a frame, or a stateful module's export, checkpoint or
// import) goes to the worker; one this side cannot decode (a kind it does
// not know, too much state, a bad item) is answered BadTask with the
// reason.
func (s *workerSession) handleTask(p *api.Task) {
	t, err := wire.TaskFromPB(p)
	if err != nil {
		s.cfg.Log.Warn("bad task from the coordinator", "task", p.Id, "err", err)
		s.answer(p.Id, worker.BadTask, err.Error())
		return
	}
	s.order.submit(t)
}
