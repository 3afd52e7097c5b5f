// Package remote is the coordinator's side of mdag's gRPC transport
// (api/mdag.proto): `mdag coordinator` serves the Coordinator service around
// a coordinator.Engine. The other side is remote/client (`mdag worker` runs a
// worker.Worker that dials it; `mdag source` streams synthetic frames into
// it); both convert messages with remote/wire.
//
// A worker holds one bidirectional stream: module loads and tasks flow
// down in order (a task never overtakes the load that hosts its module),
// results and heartbeats flow up. The coordinator counts a worker lost when
// its stream breaks or its heartbeats stop; the engine then drops the
// worker's in-flight frames with reason worker-lost and re-plans.
package remote

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/mdag/mdag/api"
	"github.com/mdag/mdag/coordinator"
	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/profile"
	"github.com/mdag/mdag/remote/wire"
	"github.com/mdag/mdag/worker"
)

// Server is the Coordinator service around a coordinator.Engine.
type Server struct {
	api.UnimplementedCoordinatorServer

	Engine *coordinator.Engine
	Clock  clock.Clock
	Log    *slog.Logger
	// Heartbeat is the interval workers are told to beat at; a worker
	// silent for 4 intervals is lost. Default wire.DefaultHeartbeat.
	Heartbeat time.Duration
	// Limits bound what peers may send and how often workers register;
	// zero fields take DefaultLimits. Set before serving.
	Limits Limits
	// Shared are the certificates several workers or sources share, and
	// the worker IDs or streams each may claim (--shared-cert); every
	// other certificate claims only its own name. Set before serving.
	Shared []SharedCert
	// Relay makes every worker send its outputs' frames through the
	// coordinator, as before the direct data plane (issue 25). By
	// default a worker that registers a peer address keeps them and
	// sends references; the next module's worker fetches them from it.
	Relay bool
	// ByReference (not with Relay) makes every worker hand out its
	// outputs' frames by reference however small (no crops inline), so
	// that with ingest on the workers no pixel reaches the coordinator
	// (`--data-plane metadata`, issue 41).
	ByReference bool
	// Thumbs takes the dashboard's thumbnails of the streams ingested on
	// workers (a JPEG a worker sent while WantThumbs asked, checked: of a
	// stream joined on that worker, at most wire.MaxThumbBytes). nil:
	// none are asked for. Set before serving.
	Thumbs func(stream string, jpeg []byte)
	// OnWhipEnded is told when a WHIP stream delegated to an ingest worker
	// (OfferWhip) ended there (kind: the worker's end kind, "" when the
	// worker was lost) and why: the WHIP endpoint ends it too. Set before
	// serving.
	OnWhipEnded func(stream, kind, why string)

	// insts is what Connect reports workers' registrations, losses and
	// results to: Engine, unless a test set a stand-in before serving.
	insts instances

	once    sync.Once
	initErr error  // a Limits field out of range (defaults): every stream is refused
	limits  Limits // Limits with defaults
	caps    wire.Caps
	refused *refusals
	callLog *logLimiter // refused calls (authorize)
	regs    registrations

	mu            sync.Mutex
	workers       map[string]*conn
	sources       map[string]int                  // open Ingest streams per source
	workerStreams map[string]int                  // open Connect streams per worker peer (workerPeer)
	routes        map[string]map[string]time.Time // per source: streams routed and not joined yet, until their tickets expire
	routeSrc      map[string]string               // stream -> the source it was routed for
	routesSwept   time.Time                       // when expired routes were last swept

	plane   planeCounters
	ingress ingress // bytes received on the gRPC port, by sender

	routeMu                      sync.Mutex // Route's choices, one at a time
	keyOnce                      sync.Once
	key                          []byte // for Route's tickets
	ingestFrames, ingestRejected atomic.Uint64
	thumbsAsked                  atomic.Int64 // when WantThumbs last asked the workers (unix ns)
	cams                         atomic.Pointer[cameraPlacer]
	whip                         whipWaits
}

// planeCounters count the frames of workers' results by how they came.
type planeCounters struct {
	relayed, relayedBytes, refs atomic.Uint64
	hops                        hopRing
}

// HopBuckets are the upper bounds (seconds) of PlaneStats.HopBuckets.
var HopBuckets = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1}

// hopRing keeps the last hops for their quantiles, and a histogram of all.
type hopRing struct {
	mu      sync.Mutex
	ring    [4096]time.Duration
	n       uint64
	buckets [14]uint64 // by HopBuckets, the last one above them all
	sum     time.Duration
}

func (h *hopRing) add(d time.Duration) {
	d = max(d, 0)
	i, _ := slices.BinarySearch(HopBuckets, d.Seconds())
	h.mu.Lock()
	h.ring[h.n%uint64(len(h.ring))] = d
	h.n++
	h.buckets[i]++
	h.sum += d
	h.mu.Unlock()
}

// read returns, at one instant, the p50 and p99 of the kept hops, how many
// there were in all, the cumulative counts by HopBuckets and their sum.
func (h *hopRing) read() (p50, p99 time.Duration, n uint64, buckets map[float64]uint64, sum time.Duration) {
	h.mu.Lock()
	k := min(h.n, uint64(len(h.ring)))
	v := slices.Clone(h.ring[:k])
	n, sum = h.n, h.sum
	buckets = make(map[float64]uint64, len(HopBuckets))
	var c uint64
	for i, b := range HopBuckets {
		c += h.buckets[i]
		buckets[b] = c
	}
	h.mu.Unlock()
	if k == 0 {
		return 0, 0, n, buckets, sum
	}
	slices.Sort(v)
	at := func(q float64) time.Duration { return v[min(int(q*float64(k)), int(k)-1)] }
	return at(0.5), at(0.99), n, buckets, sum
}

// PlaneStats says how the frames of workers' results reached the
// coordinator: with their pixels (the relay) or as references to the
// worker holding them (the direct data plane).
//
// A hop is what a task spends outside its module's run, from the
// coordinator sending it to the result coming back: the task down, the
// worker's queue, the fetch of its frames on the direct data plane, and
// the result up. HopP50 and HopP99 are over the last 4096 tasks that ran.
type PlaneStats struct {
	RelayedFrames uint64        `json:"relayed_frames"`
	RelayedBytes  uint64        `json:"relayed_bytes"`
	RefFrames     uint64        `json:"ref_frames"`
	Hops          uint64        `json:"hops"`
	HopP50        time.Duration `json:"hop_p50_ns"`
	HopP99        time.Duration `json:"hop_p99_ns"`
	// HopBuckets counts every hop by HopBuckets (cumulative, Prometheus'
	// le), HopSum adds them up.
	HopBuckets map[float64]uint64 `json:"-"`
	HopSum     time.Duration      `json:"-"`
}

// Plane returns the data plane's counters.
func (s *Server) Plane() PlaneStats {
	p50, p99, n, b, sum := s.plane.hops.read()
	return PlaneStats{RelayedFrames: s.plane.relayed.Load(), RelayedBytes: s.plane.relayedBytes.Load(), RefFrames: s.plane.refs.Load(),
		Hops: n, HopP50: p50, HopP99: p99, HopBuckets: b, HopSum: sum}
}

// instances is the part of coordinator.Engine that hosts remote workers.
type instances interface {
	WorkerTypes() map[profile.WorkerTypeID]bool
	AddInstance(id string, typ profile.WorkerTypeID, inst coordinator.Instance)
	LostInstance(id, why string)
	Result(instance string, r worker.Result)
}

// NewGRPC returns a plaintext gRPC server with s's message limit
// (Limits.MaxMessage) and s registered (loopback only: see NewTLSGRPC).
func NewGRPC(s *Server) *grpc.Server { return newGRPC(s) }

func newGRPC(s *Server, opts ...grpc.ServerOption) *grpc.Server {
	s.defaults()
	// clients ping a silent connection (remote/client's dial: every 15 s
	// while a call is open); more often than every 7.5 s is too many
	ka := grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 7500 * time.Millisecond, PermitWithoutStream: true})
	g := grpc.NewServer(append([]grpc.ServerOption{grpc.MaxRecvMsgSize(s.limits.MaxMessage), grpc.MaxSendMsgSize(wire.MaxMessage), grpc.StatsHandler(&s.ingress),
		grpc.MaxConcurrentStreams(uint32(min(s.limits.MaxConnStreams, 1<<20))), ka}, opts...)...)
	api.RegisterCoordinatorServer(g, s)
	return g
}

// defaults fills in the unset fields, once: the handlers call it, and the
// fields must not change once serving.
func (s *Server) defaults() {
	s.once.Do(func() {
		if s.Clock == nil {
			s.Clock = clock.Real{}
		}
		if s.insts == nil {
			s.insts = s.Engine
		}
		if s.Log == nil {
			s.Log = slog.New(slog.DiscardHandler)
		}
		if s.Heartbeat <= 0 {
			s.Heartbeat = wire.DefaultHeartbeat
		}
		var err error
		if s.limits, err = s.Limits.withDefaults(); err != nil {
			s.initErr = err
			s.Log.Error("coordinator server: limits out of range; every worker and source is refused until they are fixed", "err", err)
		}
		l := s.limits
		// A worker's results may carry audio chunks up to segment's
		// longest (10 s of 96 kHz stereo fits wire.MaxAudioBytes) even
		// when sources are held to a smaller --max-audio.
		s.caps = wire.Caps{FrameW: l.MaxFrameW, FrameH: l.MaxFrameH, Boxes: l.MaxBoxes, ResultItems: l.MaxResultItems,
			Tracks: l.MaxTracks, Steps: l.MaxSteps, Events: l.MaxEvents, Labels: l.MaxLabels, AudioBytes: max(l.MaxAudioBytes, wire.MaxAudioBytes), StateBytes: l.MaxStateBytes}
		s.refused = newRefusals(s.Clock, s.Log, s.limits.LogEvery)
		s.callLog = newLogLimiter(s.Clock, s.Log, s.limits.LogEvery)
	})
}

// Check reports a Limits field out of range, by name; a server with one
// refuses every Connect and Ingest stream (FailedPrecondition), so call it
// before serving.
func (s *Server) Check() error {
	s.defaults()
	return s.initErr
}

// Workers lists the IDs of connected workers.
func (s *Server) Workers() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.workers))
	for id := range s.workers {
		out = append(out, id)
	}
	return out
}

func joinTypes(m map[profile.WorkerTypeID]bool) string {
	if len(m) == 0 {
		return "none: deploy an app first"
	}
	out := ""
	for _, t := range sortedTypes(m) {
		if out != "" {
			out += ", "
		}
		out += string(t)
	}
	return out
}

// Ingest implements api.CoordinatorServer: one camera stream.
func (s *Server) Ingest(stream grpc.ClientStreamingServer[api.IngestMessage, api.IngestReply]) error {
	if err := s.Check(); err != nil {
		return status.Errorf(codes.FailedPrecondition, "coordinator misconfigured: %v", err)
	}
	// A stream counts against its source's limit from its start, join or
	// not, so streams that never join hold no more than that either.
	source := peerID(stream.Context())
	closeSource, err := s.openSource(source)
	if err != nil {
		return err
	}
	defer closeSource()
	var first *api.IngestMessage
	if err := s.recvFirst(func() (err error) { first, err = stream.Recv(); return err }, "join", "ingest", "source", source); err != nil {
		return err
	}
	j := first.GetJoin()
	if j == nil || j.App == "" || j.Stream == "" {
		return status.Error(codes.InvalidArgument, "ingest: the first message must carry join with app and stream")
	}
	if _, err := s.checkClaim(stream.Context(), "ingest", j.Stream); err != nil {
		return err
	}
	if err := s.Engine.Join(dag.AppID(j.App), j.Stream); err != nil {
		return status.Error(engineCode(err), "ingest: "+err.Error())
	}
	defer func() {
		if err := s.Engine.Leave(j.Stream); err != nil {
			s.Log.Warn("leave", "stream", j.Stream, "err", err)
		}
	}()
	s.Log.Info("camera joined", "app", j.App, "stream", j.Stream, "cert", certName(stream.Context()))
	reply := &api.IngestReply{}
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return stream.SendAndClose(reply)
		}
		if err != nil {
			if status.Code(err) == codes.ResourceExhausted { // over Limits.MaxMessage: gRPC refused it unread
				s.refused.add(RefusedMessage, err, "stream", j.Stream)
			}
			return err
		}
		if err := s.checkIngest(j.Stream, m); err != nil {
			return err
		}
		if err := s.ingestOne(j.Stream, m); err != nil {
			reply.Rejected++
			reply.LastError = fmt.Sprintf("frame %d: %v", m.Seq, err)
			continue
		}
		reply.Accepted++
	}
}

// recvFirst runs recv, a stream's first Recv, and gives up on it after
// Limits.FirstMessage (on s.Clock): a stream that never sends its register
// or join is ended with DeadlineExceeded, counted `first-message`. When it
// gives up, recv's goroutine ends with the stream (the handler returning
// cancels it).
func (s *Server) recvFirst(recv func() error, what, call string, attrs ...any) error {
	got := make(chan error, 1)
	go func() { got <- recv() }()
	late := make(chan struct{})
	tm := s.Clock.AfterFunc(s.limits.FirstMessage, func() { close(late) })
	defer tm.Stop()
	select {
	case err := <-got:
		return err
	case <-late:
		return s.refuse(RefusedFirstMessage, status.Errorf(codes.DeadlineExceeded, "%s: no %s message within %v of opening the stream (remote.Limits.FirstMessage)", call, what, s.limits.FirstMessage), attrs...)
	}
}

// ingestOne hands one message's frame, or audio chunk (an audio app's
// stream), to the engine; an error rejects it (counted, the stream goes
// on).
func (s *Server) ingestOne(stream string, m *api.IngestMessage) error {
	capture := wire.FromNS(m.CaptureUnixNs)
	switch {
	case m.Audio != nil && m.Frame != nil:
		return errors.New("both a frame and audio: a message carries one")
	case m.Audio != nil:
		a, err := wire.IngestAudioFromPB(m.Audio, s.limits.MaxAudioBytes)
		if err != nil {
			return err
		}
		return s.Engine.IngestAudio(stream, m.Seq, capture, a)
	}
	if m.Frame == nil {
		return errors.New("no frame and no audio")
	}
	f, err := wire.SourceFrameFromPB(m.Frame)
	if err != nil {
		return err
	}
	return s.Engine.Ingest(stream, m.Seq, capture, f, wire.BoxesFromPB(m.Truth))
}

// checkIngest applies the source caps to one message; a message over them
// ends the stream (a source that sends one is misconfigured). A frame whose
// payload does not match its size is the frame's problem, not a cap's: the
// stream goes on and the frame is counted rejected.
func (s *Server) checkIngest(stream string, m *api.IngestMessage) error {
	where := fmt.Sprintf("ingest stream %s frame %d", stream, m.Seq)
	if err := s.caps.CheckFrame(m.Frame); errors.Is(err, wire.ErrFrameSize) {
		return s.refuse(RefusedFrameSize, status.Errorf(codes.InvalidArgument, "%s: %v", where, err), "stream", stream)
	}
	if err := s.caps.CheckBoxes("ground-truth boxes", len(m.Truth)); err != nil {
		return s.refuse(RefusedBoxes, status.Errorf(codes.InvalidArgument, "%s: %v", where, err), "stream", stream)
	}
	if err := wire.CheckKeypoints(m.Truth); err != nil {
		return s.refuse(RefusedBoxes, status.Errorf(codes.InvalidArgument, "%s: ground truth: %v", where, err), "stream", stream)
	}
	if n := len(m.GetAudio().GetPcm()); n > s.limits.MaxAudioBytes {
		return s.refuse(RefusedAudioSize, status.Errorf(codes.InvalidArgument, "%s: an audio chunk of %d bytes of PCM; a source may send at most %d (--max-audio)", where, n, s.limits.MaxAudioBytes), "stream", stream)
	}
	if n, limit := proto.Size(m), s.limits.SourceMessage(); n > limit {
		return s.refuse(RefusedMessage, status.Errorf(codes.ResourceExhausted, "%s: the message is %d bytes; a source may send at most %d (a %dx%d frame and %d boxes)", where, n, limit, s.limits.MaxFrameW, s.limits.MaxFrameH, s.limits.MaxBoxes), "stream", stream)
	}
	return nil
}

func engineCode(err error) codes.Code {
	switch {
	case errors.Is(err, coordinator.ErrUnknownApp), errors.Is(err, coordinator.ErrUnknownStream):
		return codes.NotFound
	case errors.Is(err, coordinator.ErrDuplicate):
		return codes.AlreadyExists
	}
	return codes.Internal
}

func sortedTypes(m map[profile.WorkerTypeID]bool) []profile.WorkerTypeID {
	out := make([]profile.WorkerTypeID, 0, len(m))
	for t := range m {
		out = append(out, t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}
