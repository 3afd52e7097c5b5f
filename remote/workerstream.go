package remote

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/mdag/mdag/api"
	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/profile"
	"github.com/mdag/mdag/remote/wire"
	"github.com/mdag/mdag/worker"
)

// workerStream is the coordinator's end of a worker's Connect stream as a
// session uses it: gRPC's server stream, or a test's in-memory one. Its
// context ends when the call does, which ends a Recv in progress.
type workerStream interface {
	Send(*api.CoordinatorMessage) error
	Recv() (*api.WorkerMessage, error)
	Context() context.Context
}

// Connect implements api.CoordinatorServer.
func (s *Server) Connect(stream grpc.BidiStreamingServer[api.WorkerMessage, api.CoordinatorMessage]) error {
	return s.serveWorker(stream)
}

// workerSession is one worker's Connect stream on the coordinator, in
// named steps: admit the stream, read and check its registration,
// register the worker (its conn, the engine's instance), then, until the
// stream ends, three goroutines: the sender (the only one that writes the
// stream), the receiver (results, load replies, heartbeats) and the
// heartbeat watch (timers on the clock); leave counts the worker lost.
type workerSession struct {
	s      *Server
	stream workerStream
	peer   string // who the caller is for limits (peerID)

	reg         *api.Register
	typ         profile.WorkerTypeID
	shared      bool   // its certificate is shared (--shared-cert)
	direct      bool   // it holds its outputs' frames for peers
	peerRefused error  // why its peer address was refused (it relays)
	ingestAddr  string // its Ingest service (direct only, the address checked)

	ctx    context.Context // ends with the stream; its cause is why
	cancel context.CancelCauseFunc
	c      *conn

	watchMu sync.Mutex
	watchTm clock.Timer // the next heartbeat check
}

// serveWorker is Connect on a workerStream.
func (s *Server) serveWorker(stream workerStream) error {
	w := &workerSession{s: s, stream: stream, peer: peerID(stream.Context())}
	closeWorker, err := w.admit()
	if err != nil {
		return err
	}
	defer closeWorker()
	if err := w.readRegister(); err != nil {
		return err
	}
	w.ctx, w.cancel = context.WithCancelCause(stream.Context())
	defer w.cancel(nil)
	if err := w.join(); err != nil {
		return err
	}
	defer w.drop()
	if err := w.acknowledge(); err != nil {
		return err
	}
	sent := w.startSender()
	w.watchHeartbeats()
	defer w.stopWatch()
	received := w.startReceiver()
	<-w.ctx.Done()
	return w.leave(sent, received)
}

// admit refuses the stream of a misconfigured server, one over the
// Connect rate limits and one over its peer's open streams
// (MaxWorkerStreams), before any of it is read; the returned func closes
// the stream's place.
func (w *workerSession) admit() (func(), error) {
	s := w.s
	if err := s.Check(); err != nil {
		return nil, status.Errorf(codes.FailedPrecondition, "coordinator misconfigured: %v", err)
	}
	if err := s.admitRegistration(w.stream.Context()); err != nil {
		return nil, err
	}
	return s.openWorker(w.stream.Context())
}

// readRegister reads the first message, within Limits.FirstMessage, and
// checks it is a registration the worker may make: its fields, the ID
// its certificate may claim, a deployed worker type, its peer address.
func (w *workerSession) readRegister() error {
	s, ctx := w.s, w.stream.Context()
	var first *api.WorkerMessage
	if err := s.recvFirst(func() (err error) { first, err = w.stream.Recv(); return err }, "register", "connect", "peer", w.peer); err != nil {
		return err
	}
	reg := first.GetRegister()
	if reg == nil {
		return status.Error(codes.InvalidArgument, "the first message on Connect must be register")
	}
	if err := s.checkRegister(reg, w.peer); err != nil {
		return err
	}
	shared, err := s.checkClaim(ctx, "register", reg.Id)
	if err != nil {
		return err
	}
	typ := profile.WorkerTypeID(reg.Type)
	if known := s.insts.WorkerTypes(); !known[typ] {
		return status.Errorf(codes.InvalidArgument, "register %s: worker type %q is in no deployed app's profiles (known: %s)", reg.Id, reg.Type, joinTypes(known))
	}
	if len(reg.PeerAddr) > wire.MaxRefField {
		return status.Errorf(codes.InvalidArgument, "register %s: peer address of %d bytes; at most %d", reg.Id, len(reg.PeerAddr), wire.MaxRefField)
	}
	w.reg, w.typ, w.shared = reg, typ, shared
	w.direct = reg.PeerAddr != "" && !s.Relay
	if w.direct {
		if w.peerRefused = peerHostIsCaller(ctx, reg.PeerAddr); w.peerRefused != nil {
			w.direct = false
		}
	}
	if len(reg.IngestAddr) > wire.MaxRefField {
		return status.Errorf(codes.InvalidArgument, "register %s: ingest address of %d bytes; at most %d", reg.Id, len(reg.IngestAddr), wire.MaxRefField)
	}
	if w.direct && reg.IngestAddr != "" {
		// Sources are sent there: the same rule as the peer address.
		if err := peerHostIsCaller(ctx, reg.IngestAddr); err != nil {
			s.Log.Warn("worker's ingest address refused: cameras are not routed to it", "instance", reg.Id, "err", err)
		} else {
			w.ingestAddr = reg.IngestAddr
		}
	}
	return nil
}

// join makes the worker's conn and lists it among the connected workers;
// a worker of the same ID already connected is refused. drop unlists it.
func (w *workerSession) join() error {
	s, reg := w.s, w.reg
	c := &conn{id: reg.Id, out: make(chan *api.CoordinatorMessage, wire.DefaultSendQueue), cancel: w.cancel, engine: s.insts, clk: s.Clock, given: map[uint64]time.Time{}, streams: map[string]int{}, routed: map[string]time.Time{}, assigned: map[string]assignment{}}
	c.beat.Store(s.Clock.Now().UnixNano())
	if w.direct {
		c.peer, c.ingest, c.ingestMax = reg.PeerAddr, w.ingestAddr, int(max(0, reg.IngestStreams))
		c.thumbs = w.ingestAddr != "" && reg.Thumbnails
		c.cameras = w.ingestAddr != "" && reg.Cameras
		c.whip = w.ingestAddr != "" && reg.Whip
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.workers == nil {
		s.workers = map[string]*conn{}
	}
	if _, dup := s.workers[reg.Id]; dup {
		return status.Errorf(codes.AlreadyExists, "register: a worker with id %q is already connected", reg.Id)
	}
	s.workers[reg.Id] = c
	w.c = c
	return nil
}

func (w *workerSession) drop() {
	w.s.mu.Lock()
	delete(w.s.workers, w.reg.Id)
	w.s.mu.Unlock()
}

// acknowledge tells the worker it is registered (its heartbeat interval,
// and whether it holds its outputs' frames), logs it and hands it to the
// engine.
func (w *workerSession) acknowledge() error {
	s, reg := w.s, w.reg
	ack := &api.Registered{Id: reg.Id, HeartbeatIntervalNs: int64(s.Heartbeat), Direct: w.direct, ByReference: w.direct && s.ByReference, Batches: true}
	if err := w.stream.Send(&api.CoordinatorMessage{Msg: &api.CoordinatorMessage_Registered{Registered: ack}}); err != nil {
		return err
	}
	if w.peerRefused != nil {
		s.Log.Warn("worker's peer address refused: its outputs' frames come through the coordinator", "instance", reg.Id, "err", w.peerRefused)
	}
	connected := []any{"instance", reg.Id, "type", reg.Type, "executor", reg.Executor, "cpus", reg.Cpus, "gpu", reg.Gpu,
		"cert", certName(w.stream.Context()), "data_plane", w.plane()}
	if w.shared {
		connected = append(connected, "cert_shared", "a shared certificate (--shared-cert): any of its holders may register this ID")
	}
	s.Log.Info("worker connected", connected...)
	s.insts.AddInstance(reg.Id, w.typ, w.c)
	s.kickCameras()
	return nil
}

// plane says, for the log, how the worker's outputs' frames travel.
func (w *workerSession) plane() string {
	switch {
	case w.peerRefused != nil:
		return "relay: " + w.peerRefused.Error()
	case w.reg.PeerAddr == "":
		return "relay: it has no peer address (mdag worker --peer-listen), so its outputs' frames come through the coordinator"
	case w.s.Relay:
		return "relay: the coordinator runs with --data-plane relay"
	}
	return "direct: its outputs' frames stay there, peers fetch them from " + w.reg.PeerAddr
}

// startSender starts the sender: it writes what the conn queues until
// the session ends or a write fails (which ends it); the channel says
// which, once.
//
// A worker that takes batches (Register.batches) gets what queued while
// the sender was writing as one CoordinatorBatch, in order.
func (w *workerSession) startSender() <-chan error {
	sent := make(chan error, 1)
	go func() {
		var next *api.CoordinatorMessage
		for {
			if w.ctx.Err() != nil {
				sent <- nil
				return
			}
			m := next
			next = nil
			if m == nil {
				select {
				case m = <-w.c.out:
				case <-w.ctx.Done():
					sent <- nil
					return
				}
			}
			if w.reg.Batches {
				m, next = wire.PackDown(m, w.c.out)
			}
			if err := w.stream.Send(m); err != nil {
				sent <- err
				w.cancel(fmt.Errorf("send: %w", err))
				return
			}
		}
	}()
	return sent
}

// watchHeartbeats ends the session once the worker has been silent (no
// message of any kind) for more than 4 heartbeat intervals: it checks now
// and every interval after, on the clock, until the session ends.
func (w *workerSession) watchHeartbeats() {
	if w.ctx.Err() != nil {
		return
	}
	hb := w.s.Heartbeat
	if silent := w.s.Clock.Now().Sub(time.Unix(0, w.c.beat.Load())); silent > 4*hb {
		w.cancel(fmt.Errorf("missed heartbeats: silent for %v", silent.Round(time.Millisecond)))
		return
	}
	w.watchMu.Lock()
	w.watchTm = w.s.Clock.AfterFunc(hb, w.watchHeartbeats)
	w.watchMu.Unlock()
}

func (w *workerSession) stopWatch() {
	w.watchMu.Lock()
	if w.watchTm != nil {
		w.watchTm.Stop()
	}
	w.watchMu.Unlock()
}

// startReceiver starts the receiver, on its own goroutine so a stuck
// Recv cannot outlive the session; the channel has the error that ended
// it.
func (w *workerSession) startReceiver() <-chan error {
	received := make(chan error, 1)
	go func() {
		for {
			m, err := w.stream.Recv()
			if err != nil {
				if status.Code(err) == codes.ResourceExhausted { // over Limits.MaxMessage: gRPC refused it unread
					w.s.refused.add(RefusedMessage, err, "instance", w.reg.Id)
				}
				received <- err
				if cerr := w.stream.Context().Err(); cerr != nil {
					// the call itself ended (the worker went, or the
					// server stops): that is why, not Recv's echo of it,
					// whichever of the two is seen first
					w.cancel(cerr)
				} else {
					w.cancel(fmt.Errorf("receive: %w", err))
				}
				return
			}
			w.c.beat.Store(w.s.Clock.Now().UnixNano())
			w.receive(m)
		}
	}()
	return received
}

// receive handles one message from the worker (any message is a sign of
// life: the receiver has noted it), or each of a batch's in order.
func (w *workerSession) receive(m *api.WorkerMessage) {
	switch m := m.Msg.(type) {
	case *api.WorkerMessage_Batch:
		if n := len(m.Batch.Msgs); n > wire.MaxBatch {
			w.cancel(w.s.refuse(RefusedMessage, status.Errorf(codes.InvalidArgument, "worker %s: a batch of %d messages; at most %d", w.reg.Id, n, wire.MaxBatch), "instance", w.reg.Id))
			return
		}
		for _, in := range m.Batch.Msgs {
			if w.ctx.Err() != nil {
				return // the session ended: the rest is not handled
			}
			switch in.Msg.(type) {
			case *api.WorkerMessage_Batch, *api.WorkerMessage_Register:
				w.s.Log.Warn("a batch from the worker holds a batch or a register; ignored", "instance", w.reg.Id)
			default:
				w.receive(in)
			}
		}
	case *api.WorkerMessage_Result:
		w.s.result(w.c, m.Result)
	case *api.WorkerMessage_LoadReply:
		if m.LoadReply.Error != "" {
			w.s.Log.Error("worker could not load its modules", "instance", w.reg.Id, "generation", m.LoadReply.Generation, "err", m.LoadReply.Error)
		}
	case *api.WorkerMessage_Heartbeat:
	case *api.WorkerMessage_StreamJoin:
		w.joinStream(m.StreamJoin)
	case *api.WorkerMessage_Ingested:
		w.ingested(m.Ingested)
	case *api.WorkerMessage_StreamLeave:
		w.leaveStream(m.StreamLeave)
	case *api.WorkerMessage_Thumbnail:
		w.thumbnail(m.Thumbnail)
	case *api.WorkerMessage_CameraState:
		w.cameraState(m.CameraState)
	case *api.WorkerMessage_WhipAnswer:
		w.whipAnswer(m.WhipAnswer)
	case *api.WorkerMessage_WhipEnded:
		w.whipEnded(m.WhipEnded)
	default:
		w.s.Log.Warn("unexpected message from worker", "instance", w.reg.Id, "type", fmt.Sprintf("%T", m))
	}
}

// leave, once the session has ended, says why, counts the worker lost
// (the engine re-plans its modules) and returns the stream's status: none
// when the worker closed it, else Unavailable with the reason.
func (w *workerSession) leave(sent, received <-chan error) error {
	why := context.Cause(w.ctx)
	switch {
	case w.c.closed.Load():
		why = errors.New("released by the coordinator")
	case errors.Is(why, context.Canceled):
		why = errors.New("stream ended")
	}
	w.c.closed.Store(true)
	w.s.Log.Warn("worker disconnected", "instance", w.reg.Id, "why", why)
	w.s.insts.LostInstance(w.reg.Id, why.Error())
	w.leaveStreams()
	w.endWhips()
	w.c.released.Store(true)
	w.s.kickCameras() // its cameras move
	<-sent
	// The handler returning ends the stream, which ends Recv.
	go func() { <-received }()
	if errors.Is(why, io.EOF) {
		return nil
	}
	return status.Error(codes.Unavailable, why.Error())
}

// conn is the coordinator's coordinator.Instance for one connected worker.
type conn struct {
	id     string
	peer   string // its peer address when it holds its outputs' frames (direct); "" relays them
	ingest string // its Ingest service's address (direct only); "": it ingests no camera
	// ingestMax is the most streams its Ingest service takes at once
	// (Register.ingest_streams); 0: not said
	ingestMax int
	thumbs    bool // it sends thumbnails when asked (Register.thumbnails)
	out       chan *api.CoordinatorMessage
	cancel    context.CancelCauseFunc
	engine    instances
	gen       atomic.Uint64
	beat      atomic.Int64 // unix ns of the last message from the worker
	closed    atomic.Bool
	released  atomic.Bool // gone, and its streams have left: its cameras may move

	clk     clock.Clock
	mu      sync.Mutex
	given   map[uint64]time.Time // tasks sent down the stream and not answered yet: when
	streams map[string]int       // camera streams joined or joining on it (ingest on the workers): their state
	routed  map[string]time.Time // camera streams routed to it, not joined yet: until their tickets expire
	joining int                  // stream joins in progress
	// cameras: it reads the coordinator's cameras (Register.cameras);
	// whip: it takes delegated WHIP streams (Register.whip)
	cameras, whip bool
	// assigned are the streams the coordinator gave it to read, by ID:
	// its cameras (cameras.go) and delegated WHIP streams (whip.go); each
	// joins without a ticket
	assigned map[string]assignment
	left     bool // it is gone: no stream joins it any more
}

// give records that task id goes to the worker; answer takes it back and
// reports whether it was given (a result for any other is refused) and
// when.
func (c *conn) give(id uint64) {
	c.mu.Lock()
	c.given[id] = c.clk.Now()
	c.mu.Unlock()
}

func (c *conn) answer(id uint64) (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	at, ok := c.given[id]
	if !ok {
		return time.Time{}, false
	}
	delete(c.given, id)
	return at, true
}

// Load implements coordinator.Instance. It is asynchronous: the worker answers
// with a LoadReply, and an error there is logged (tasks for a module that
// did not load come back as module-not-loaded drops).
func (c *conn) Load(specs []worker.ModuleSpec) error {
	msg := &api.Load{Generation: c.gen.Add(1)}
	for _, sp := range specs {
		p, err := wire.SpecToPB(sp)
		if err != nil {
			return err
		}
		msg.Modules = append(msg.Modules, p)
	}
	if !c.send(&api.CoordinatorMessage{Msg: &api.CoordinatorMessage_Load{Load: msg}}) {
		return fmt.Errorf("worker %s: send queue full or stream closed", c.id)
	}
	return nil
}

// Submit implements coordinator.Instance; it never blocks. A task that cannot be
// queued for the stream comes back at once as queue-full.
func (c *conn) Submit(t worker.Task) {
	c.give(t.ID) // before it is sent: the answer may come at once
	if !c.send(&api.CoordinatorMessage{Msg: &api.CoordinatorMessage_Task{Task: wire.TaskToPB(t)}}) {
		_, _ = c.answer(t.ID)
		// Result posts to the engine loop, which is calling us: not inline.
		go c.engine.Result(c.id, worker.Result{Task: t.ID, Outcome: worker.QueueFull, Detail: "the stream to worker " + c.id + " is backed up or closed"})
	}
}

// Close implements coordinator.Instance: the stream ends.
func (c *conn) Close() {
	if c.closed.CompareAndSwap(false, true) {
		c.cancel(errors.New("closed by the coordinator"))
	}
}

func (c *conn) send(m *api.CoordinatorMessage) bool {
	if c.closed.Load() {
		return false
	}
	select {
	case c.out <- m:
		return true
	default:
		return false
	}
}

// result hands a worker's result to the engine if the task was given to
// that worker and not answered yet; any other is refused (counted, logged
// with the worker's ID) and never reaches the engine. A result over the
// caps is accounted as BadResult: its frames are dropped, not lost.
func (s *Server) result(c *conn, p *api.Result) {
	sent, ok := c.answer(p.Task)
	if ok && (p.Outcome == api.Outcome_OUTCOME_OK || p.Outcome == api.Outcome_OUTCOME_PEER_LOST) {
		// What the task spent outside its module's run: the task down,
		// the worker's queue and, on the direct data plane, the fetch of
		// its frames (a failed fetch too: the slowest), and the result up.
		s.plane.hops.add(s.Clock.Now().Sub(sent) - time.Duration(p.MeasuredNs))
	}
	if !ok {
		_ = s.refuse(RefusedUnknownTask, status.Errorf(codes.InvalidArgument, "worker %s: result for task %d, which was not given to it or was already answered; ignored", c.id, p.Task), "instance", c.id, "task", p.Task)
		return
	}
	if err := s.caps.CheckResult(p); err != nil {
		// A payload that does not match its frame's size is no cap's
		// business: ResultFromPB turns it into BadResult.
		reason := ""
		switch {
		case errors.Is(err, wire.ErrFrameSize):
			reason = RefusedFrameSize
		case errors.Is(err, wire.ErrBoxes):
			reason = RefusedBoxes
		case errors.Is(err, wire.ErrResultItems):
			reason = RefusedResultItems
		case errors.Is(err, wire.ErrTracks), errors.Is(err, wire.ErrSteps), errors.Is(err, wire.ErrEvents),
			errors.Is(err, wire.ErrLabels), errors.Is(err, wire.ErrAudioSize), errors.Is(err, wire.ErrKeypoints):
			reason = RefusedItemContent
		case errors.Is(err, wire.ErrStateSize):
			reason = RefusedStateSize
		}
		if reason != "" {
			_ = s.refuse(reason, status.Errorf(codes.InvalidArgument, "worker %s: %v", c.id, err), "instance", c.id, "task", p.Task)
			s.insts.Result(c.id, worker.Result{Task: p.Task, Outcome: worker.BadResult, Detail: "refused by the coordinator: " + err.Error(), Measured: time.Duration(p.MeasuredNs)})
			return
		}
	}
	if err := s.countFrames(c, p); err != nil {
		_ = s.refuse(RefusedFrameRef, status.Errorf(codes.InvalidArgument, "worker %s: %v", c.id, err), "instance", c.id, "task", p.Task)
		s.insts.Result(c.id, worker.Result{Task: p.Task, Outcome: worker.BadResult, Detail: "refused by the coordinator: " + err.Error(), Measured: time.Duration(p.MeasuredNs)})
		return
	}
	s.insts.Result(c.id, wire.ResultFromPB(p))
}

// peerHostIsCaller checks that a worker's peer address names the host its
// connection comes from (an IP literal equal to the caller's address), so
// no worker can send the workers that fetch its frames to another host (a
// service inside the network, say). Behind NAT the two differ: the worker
// then relays.
func peerHostIsCaller(ctx context.Context, addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host == "" || port == "" {
		return fmt.Errorf("peer address %q: want IP:PORT", addr)
	}
	ip := net.ParseIP(host)
	if ip == nil {
		return fmt.Errorf("peer address %q: want an IP address, not a name (the coordinator checks it is the address the worker connects from)", addr)
	}
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return fmt.Errorf("peer address %q: the connection's address is unknown", addr)
	}
	ch, _, err := net.SplitHostPort(p.Addr.String())
	if err != nil {
		return fmt.Errorf("peer address %q: the connection's address %q: %v", addr, p.Addr, err)
	}
	if c := net.ParseIP(ch); c == nil || !c.Equal(ip) {
		return fmt.Errorf("peer address %q is not the address the worker connects from (%s): another host's address is refused", addr, ch)
	}
	return nil
}

// countFrames counts a result's output frames by how they came, and
// refuses a reference a worker may not make: one from a worker that
// relays, or one that names another holder or address than the worker's
// own (a worker cannot send its peers to fetch elsewhere).
func (s *Server) countFrames(c *conn, p *api.Result) error {
	var relayed, bytes, refs uint64
	for _, list := range p.Outputs {
		for _, it := range list.Items {
			f := it.GetFrame()
			switch {
			case f == nil:
			case f.Ref == nil:
				relayed++
				bytes += uint64(len(f.Bgr))
			case c.peer == "":
				return fmt.Errorf("output frame %d of stream %s is a reference, but this worker relays its frames (it registered no peer address, or the coordinator runs --data-plane relay)", f.Ref.Id, it.Stream)
			case f.Ref.Holder != c.id || f.Ref.Addr != c.peer:
				return fmt.Errorf("output frame %d of stream %s names holder %q at %q; a worker may only hand out its own frames (%q at %q)", f.Ref.Id, it.Stream, f.Ref.Holder, f.Ref.Addr, c.id, c.peer)
			default:
				refs++
			}
		}
	}
	s.plane.relayed.Add(relayed) // a refused result counts nothing
	s.plane.relayedBytes.Add(bytes)
	s.plane.refs.Add(refs)
	return nil
}
