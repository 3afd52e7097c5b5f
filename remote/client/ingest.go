package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/mdag/mdag/api"
	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/media"
	"github.com/mdag/mdag/remote/wire"
)

// Ingest on the workers (issue 41): a worker with an ingest address takes
// the camera streams the coordinator routes to it (Coordinator.Route). It
// joins each over its Connect stream with the source's ticket, keeps every
// frame in its Store until the frame's deadline (plus HoldAfter) and sends
// the coordinator only the frame's identity, capture time and size; the
// first module's worker fetches the pixels here, or takes them from this
// store when it is this worker. When the worker's connection to the
// coordinator ends, its streams end Unavailable: their sources route
// again.

// Ingest defaults.
const (
	// DefaultIngestStreams bounds the camera streams one worker ingests.
	DefaultIngestStreams = 256
	// DefaultIngestMessage bounds one message on the Ingest service: a
	// 1920x1080 frame and 256 ground-truth boxes, as the coordinator's
	// default --max-frame and --max-boxes allow.
	DefaultIngestMessage = 1920*1080*3 + 256*wire.MaxBoxBytes + 64<<10
	// ingestFirstMessage is how long a stream may take to send its join.
	ingestFirstMessage = 10 * time.Second
	// ingestJoinTimeout bounds the coordinator's answer to a join.
	ingestJoinTimeout = 10 * time.Second
)

// IngestServer is a worker's Ingest service. Register it on a gRPC server
// with NewIngestGRPC, serve it on Addr, and set DataPlane.Ingest: the
// worker then registers Addr with the coordinator, which routes cameras to
// it. Streams are refused Unavailable while the worker is not connected.
type IngestServer struct {
	api.UnimplementedIngestServer
	// Addr is where sources reach it (host:port), told to the coordinator.
	Addr string
	// MaxStreams bounds the streams open at once; 0: DefaultIngestStreams.
	MaxStreams int
	Clock      clock.Clock // nil: real time
	// Thumb, when set, encodes a stream's frame as a JPEG ThumbWidth
	// pixels wide for the coordinator's dashboard, while the coordinator
	// asks (ThumbsWanted): at most one a second a stream, on the stream's
	// own goroutine. nil: this worker sends none.
	Thumb      func(f *media.Frame, width int) ([]byte, error)
	ThumbWidth int
	// Cameras, when set, reads the RTSP cameras the coordinator assigns
	// this worker (mdag coordinator --camera; see cameras.go); nil: it
	// reads none, and says so when it registers.
	Cameras CameraReader
	// Whip, when set, takes the WHIP streams the coordinator's endpoint
	// delegates here (see whip.go); nil: none, said when it registers.
	Whip WhipIngest

	mu    sync.Mutex
	sess  *workerSession // the session now, nil between connections
	open  int
	stats ingestCounters
	// thumbsUntil is when the coordinator's last ThumbsWanted runs out
	// (unix ns on the session's clock); 0 on each new session
	thumbsUntil atomic.Int64
}

type ingestCounters struct {
	joined, frames, rejected atomic.Uint64
}

// IngestStats counts what an IngestServer took.
type IngestStats struct {
	Open     int    // streams open now
	Joined   uint64 // streams the coordinator joined
	Frames   uint64 // frames held and announced
	Rejected uint64 // frames refused (their size, the store full)
}

// Stats returns the counters.
func (g *IngestServer) Stats() IngestStats {
	g.mu.Lock()
	n := g.open
	g.mu.Unlock()
	return IngestStats{Open: n, Joined: g.stats.joined.Load(), Frames: g.stats.frames.Load(), Rejected: g.stats.rejected.Load()}
}

// NewIngestGRPC returns a gRPC server with g registered and a message
// limit of DefaultIngestMessage; opts add credentials (mutual TLS:
// pki.Material.IngestServerConfig). A connection must finish its TLS
// handshake within 10 s.
func NewIngestGRPC(g *IngestServer, opts ...grpc.ServerOption) *grpc.Server {
	s := grpc.NewServer(append([]grpc.ServerOption{grpc.MaxRecvMsgSize(DefaultIngestMessage), grpc.MaxSendMsgSize(1 << 20), grpc.ConnectionTimeout(10 * time.Second),
		grpc.MaxConcurrentStreams(uint32(g.maxStreams())), KeepaliveEnforcement()}, opts...)...)
	api.RegisterIngestServer(s, g)
	return s
}

func (g *IngestServer) maxStreams() int {
	if g.MaxStreams <= 0 {
		return DefaultIngestStreams
	}
	return g.MaxStreams
}

func (g *IngestServer) clock() clock.Clock {
	if g.Clock == nil {
		return clock.Real{}
	}
	return g.Clock
}

// attach makes s the session streams join through; detach forgets it
// (its streams end with it: they watch its context).
func (g *IngestServer) attach(s *workerSession) {
	g.mu.Lock()
	g.sess = s
	g.mu.Unlock()
	g.thumbsUntil.Store(0) // a new coordinator asks anew (an older one never does)
}

func (g *IngestServer) detach(s *workerSession) {
	g.mu.Lock()
	if g.sess == s {
		g.sess = nil
	}
	g.mu.Unlock()
}

// admit takes a place for a stream; the func gives it back.
func (g *IngestServer) admit() (func(), error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.open >= g.maxStreams() {
		return nil, status.Errorf(codes.ResourceExhausted, "ingest: this worker has %d camera streams open, its limit", g.open)
	}
	g.open++
	return func() {
		g.mu.Lock()
		g.open--
		g.mu.Unlock()
	}, nil
}

// session is the session now, or Unavailable.
func (g *IngestServer) session() (*workerSession, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.sess == nil || g.sess.ctx.Err() != nil {
		return nil, status.Error(codes.Unavailable, "ingest: this worker is not connected to the coordinator: route again")
	}
	return g.sess, nil
}

// Ingest implements api.IngestServer: one camera stream.
func (g *IngestServer) Ingest(stream grpc.ClientStreamingServer[api.IngestMessage, api.IngestReply]) error {
	release, err := g.admit()
	if err != nil {
		return err
	}
	defer release()
	first, err := g.recvFirst(stream)
	if err != nil {
		return err
	}
	j := first.GetJoin()
	if j == nil || j.App == "" || j.Stream == "" {
		return status.Error(codes.InvalidArgument, "ingest: the first message must carry join with app, stream and Route's ticket")
	}
	s, err := g.session()
	if err != nil {
		return err
	}
	caps, err := s.joinStream(stream.Context(), j)
	if err != nil {
		return err
	}
	g.stats.joined.Add(1)
	in := &ingesting{g: g, s: s, stream: j.Stream, caps: caps}
	done := make(chan error, 1)
	go func() { done <- in.receive(stream) }()
	select {
	case err = <-done:
	case <-s.ctx.Done():
		// The coordinator counted the stream gone with this worker's
		// connection; the handler returning ends the Recv above.
		go func() { <-done }()
		return status.Error(codes.Unavailable, "ingest: this worker lost the coordinator: route again")
	}
	s.leave(j.Stream)
	if err != nil {
		return err
	}
	return stream.SendAndClose(&api.IngestReply{Accepted: in.accepted, Rejected: in.rejected, LastError: in.lastErr})
}

// recvFirst reads the join, within ingestFirstMessage.
func (g *IngestServer) recvFirst(stream grpc.ClientStreamingServer[api.IngestMessage, api.IngestReply]) (*api.IngestMessage, error) {
	type got struct {
		m   *api.IngestMessage
		err error
	}
	ch := make(chan got, 1)
	go func() {
		m, err := stream.Recv()
		ch <- got{m, err}
	}()
	late := make(chan struct{})
	tm := g.clock().AfterFunc(ingestFirstMessage, func() { close(late) })
	defer tm.Stop()
	select {
	case r := <-ch:
		return r.m, r.err
	case <-late:
		return nil, status.Errorf(codes.DeadlineExceeded, "ingest: no join within %v of opening the stream", ingestFirstMessage)
	}
}

// ingestCaps is what the coordinator's StreamJoined allows a stream.
type ingestCaps struct {
	slo        time.Duration
	maxW, maxH int
	maxBoxes   int
}

// joinStream asks the coordinator to join j's stream, with j's ticket, and
// waits for its answer (bounded by ingestJoinTimeout); a refusal comes
// back as the coordinator's status.
func (s *workerSession) joinStream(ctx context.Context, j *api.Join) (ingestCaps, error) {
	id, ch := s.joins.open()
	defer s.joins.close(id)
	s.send(&api.WorkerMessage{Msg: &api.WorkerMessage_StreamJoin{StreamJoin: &api.StreamJoin{Id: id, App: j.App, Stream: j.Stream, Ticket: j.Ticket}}})
	tm := s.cfg.Clock.After(ingestJoinTimeout)
	select {
	case r := <-ch:
		if r.Code != 0 {
			return ingestCaps{}, status.Error(codes.Code(r.Code), "ingest: "+r.Error)
		}
		if r.SloNs <= 0 || r.MaxFrameW <= 0 || r.MaxFrameH <= 0 || r.MaxBoxes < 0 {
			s.leave(j.Stream)
			return ingestCaps{}, status.Errorf(codes.Internal, "ingest: the coordinator's join answer is incomplete (slo %v, max frame %dx%d)", time.Duration(r.SloNs), r.MaxFrameW, r.MaxFrameH)
		}
		return ingestCaps{slo: time.Duration(r.SloNs), maxW: int(r.MaxFrameW), maxH: int(r.MaxFrameH), maxBoxes: int(r.MaxBoxes)}, nil
	case <-tm:
		s.leave(j.Stream) // the coordinator may join it yet: it leaves at once then
		return ingestCaps{}, status.Errorf(codes.Unavailable, "ingest: the coordinator did not answer the join within %v", ingestJoinTimeout)
	case <-s.ctx.Done():
		return ingestCaps{}, status.Error(codes.Unavailable, "ingest: this worker lost the coordinator: route again")
	case <-ctx.Done():
		s.leave(j.Stream)
		return ingestCaps{}, status.FromContextError(ctx.Err()).Err()
	}
}

// leave tells the coordinator a stream joined through this session ended
// (or that a join it may still answer is given up).
func (s *workerSession) leave(stream string) {
	s.send(&api.WorkerMessage{Msg: &api.WorkerMessage_StreamLeave{StreamLeave: &api.StreamLeave{Stream: stream}}})
}

// joinWaits are the StreamJoins waiting for the coordinator's answer.
type joinWaits struct {
	mu   sync.Mutex
	next uint64
	m    map[uint64]chan *api.StreamJoined
}

func (w *joinWaits) open() (uint64, chan *api.StreamJoined) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.m == nil {
		w.m = map[uint64]chan *api.StreamJoined{}
	}
	w.next++
	ch := make(chan *api.StreamJoined, 1)
	w.m[w.next] = ch
	return w.next, ch
}

func (w *joinWaits) close(id uint64) {
	w.mu.Lock()
	delete(w.m, id)
	w.mu.Unlock()
}

// answer hands the coordinator's answer to its join; false: none waits.
func (w *joinWaits) answer(r *api.StreamJoined) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	ch := w.m[r.Id]
	if ch == nil {
		return false
	}
	ch <- r
	delete(w.m, r.Id)
	return true
}

// thumbEvery is how often a stream's thumbnail is sent while wanted.
const thumbEvery = time.Second

// DefaultThumbWidth is a thumbnail's width when IngestServer.ThumbWidth is
// not set (the dashboard's).
const DefaultThumbWidth = 160

// wantThumbs records the coordinator's ThumbsWanted, arriving at now:
// thumbnails for the next w.for_ns, at most maxThumbsFor.
func (g *IngestServer) wantThumbs(now time.Time, w *api.ThumbsWanted) {
	g.thumbsUntil.Store(now.Add(min(max(0, time.Duration(w.ForNs)), maxThumbsFor)).UnixNano())
}

// maxThumbsFor bounds what one ThumbsWanted asks for.
const maxThumbsFor = time.Minute

// ingesting is one joined stream's frames.
type ingesting struct {
	g                  *IngestServer
	s                  *workerSession
	stream             string
	caps               ingestCaps
	accepted, rejected uint64
	lastErr            string
	lastThumb          time.Time
	thumbFailed        bool // an encoder's failure was logged
}

// thumb sends a thumbnail of f when the coordinator wants them and the
// stream's last one is a second old; an encoder's error or a JPEG over
// wire.MaxThumbBytes sends none.
func (in *ingesting) thumb(f *media.Frame) {
	g := in.g
	if g.Thumb == nil {
		return
	}
	now := in.s.cfg.Clock.Now()
	if now.UnixNano() >= g.thumbsUntil.Load() || now.Sub(in.lastThumb) < thumbEvery {
		return
	}
	in.lastThumb = now
	width := g.ThumbWidth
	if width <= 0 {
		width = DefaultThumbWidth
	}
	jpeg, err := g.Thumb(f, width)
	if err == nil && len(jpeg) > wire.MaxThumbBytes {
		err = fmt.Errorf("a JPEG of %d bytes, over %d", len(jpeg), wire.MaxThumbBytes)
	}
	if err != nil {
		if !in.thumbFailed { // once a stream: it is tried again each second
			in.thumbFailed = true
			in.s.cfg.Log.Warn("ingest: no thumbnail of this stream for the dashboard", "stream", in.stream, "frame", fmt.Sprintf("%dx%d", f.W, f.H), "err", err)
		}
		return
	}
	in.s.send(&api.WorkerMessage{Msg: &api.WorkerMessage_Thumbnail{Thumbnail: &api.Thumbnail{Stream: in.stream, Jpeg: jpeg}}})
}

// receive holds and announces the stream's frames until it ends: nil at
// its clean end; a message over the caps ends it (a source that sends one
// is misconfigured), a frame that cannot be held is rejected (counted) and
// the stream goes on.
func (in *ingesting) receive(stream grpc.ClientStreamingServer[api.IngestMessage, api.IngestReply]) error {
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := in.check(m); err != nil {
			return err
		}
		if err := in.hold(m); err != nil {
			in.rejected++
			in.g.stats.rejected.Add(1)
			in.lastErr = fmt.Sprintf("frame %d: %v", m.Seq, err)
			continue
		}
		in.accepted++
		in.g.stats.frames.Add(1)
	}
}

// check applies the caps the coordinator gave to one message.
func (in *ingesting) check(m *api.IngestMessage) error {
	where := fmt.Sprintf("ingest stream %s frame %d", in.stream, m.Seq)
	f := m.Frame
	switch {
	case m.Audio != nil:
		return status.Errorf(codes.InvalidArgument, "%s: audio: an audio app's chunks go to the coordinator", where)
	case f != nil && (int(f.Width) > in.caps.maxW || int(f.Height) > in.caps.maxH):
		return status.Errorf(codes.InvalidArgument, "%s: %dx%d is larger than %dx%d (the coordinator's --max-frame)", where, f.Width, f.Height, in.caps.maxW, in.caps.maxH)
	case len(m.Truth) > in.caps.maxBoxes:
		return status.Errorf(codes.InvalidArgument, "%s: %d ground-truth boxes, the limit is %d", where, len(m.Truth), in.caps.maxBoxes)
	}
	if err := wire.CheckKeypoints(m.Truth); err != nil {
		return status.Errorf(codes.InvalidArgument, "%s: ground truth: %v", where, err)
	}
	return nil
}

// hold keeps m's frame in the store and tells the coordinator.
func (in *ingesting) hold(m *api.IngestMessage) error {
	f, err := wire.SourceFrameFromPB(m.Frame)
	if err != nil {
		return err
	}
	return in.holdFrame(m.Seq, m.CaptureUnixNs, f, m.Truth)
}

// holdFrame keeps f (seq of the stream, captured at captureNs) in the
// store and tells the coordinator.
func (in *ingesting) holdFrame(seq uint64, captureNs int64, f *media.Frame, truth []*api.Box) error {
	// Held until the frame's deadline: from its capture, or from now when
	// the source's clock says a later time (a frame from the future
	// would stay and crowd out the others); the coordinator gets the same
	// time, so its deadline and the store's agree.
	capture := wire.FromNS(captureNs)
	if now := in.s.cfg.Clock.Now(); capture.After(now) {
		capture = now
	}
	dp := in.s.dp
	id, ok := dp.Store.Put(f, capture.Add(in.caps.slo))
	if !ok {
		return fmt.Errorf("the worker's frame store is full (%d bytes)", dp.Store.MaxBytes)
	}
	ref := &api.Frame{Width: int32(f.W), Height: int32(f.H), Ref: &api.FrameRef{Holder: in.s.cfg.ID, Addr: dp.Addr, Id: id}}
	in.s.send(&api.WorkerMessage{Msg: &api.WorkerMessage_Ingested{Ingested: &api.Ingested{Stream: in.stream, Seq: seq, CaptureUnixNs: wire.UnixNS(capture), Frame: ref, Truth: truth}}})
	in.thumb(f)
	return nil
}
