package remote

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/mdag/mdag/api"
	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/internal/defaults"
	"github.com/mdag/mdag/internal/pki"
	"github.com/mdag/mdag/remote/wire"
)

// Limits bound what one peer may make the coordinator hold or do (issue 22,
// part 2). A zero field takes its default (DefaultLimits).
type Limits struct {
	// MaxMessage is the largest gRPC message a worker may send (a result
	// carries its output items' frames): gRPC refuses a larger one
	// (ResourceExhausted) from its length prefix, before reading it. With
	// TLS, other peers (sources) get SourceMessage the same way
	// (NewTLSGRPC); in plaintext (loopback) there is one server and this
	// is everyone's, sources' messages being checked after they are read.
	MaxMessage int
	// MaxFrameW and MaxFrameH cap a frame's declared size, checked before
	// anything is built from it: a source's frames and the frames in a
	// worker's results.
	MaxFrameW, MaxFrameH int
	// MaxBoxes caps the boxes (detections or ground truth) on one frame.
	MaxBoxes int
	// MaxAudioBytes caps the PCM of one audio chunk a source sends (an
	// audio app's IngestMessage.audio), checked before it is decoded, and
	// of an item in a worker's result.
	MaxAudioBytes int
	// MaxResultItems caps the output items in one result, all outputs
	// together.
	MaxResultItems int
	// MaxTracks, MaxSteps, MaxEvents and MaxLabels cap what one item of a
	// worker's result carries (tracks and labels on each of its steps too);
	// MaxStateBytes the state snapshot of a worker's export or checkpoint
	// (stateful modules).
	MaxTracks, MaxSteps, MaxEvents, MaxLabels int
	MaxStateBytes                             int
	// MaxSourceStreams caps the Ingest streams (cameras) one source has open
	// at once; a source is its certificate's name with TLS, its IP address
	// without.
	MaxSourceStreams int
	// MaxWorkerStreams caps the Connect streams one worker peer has open
	// at once, registered or still to send its register: a certificate's
	// name with TLS (with a shared certificate, --shared-cert, its name
	// and connection: each holder is a worker); not counted in plaintext
	// (loopback only).
	// A stream over it is refused before its first message is read, so
	// what the coordinator may hold unread for one peer is this many
	// messages of MaxMessage (one worker needs one stream, and one more
	// while it reconnects).
	MaxWorkerStreams int
	// Registration rate limit on Connect: a token bucket per peer (its
	// certificate's name with TLS, its IP address without) and one for
	// everyone. Rate is tokens a second, Burst the bucket's size.
	PeerRate, PeerBurst     float64
	GlobalRate, GlobalBurst float64
	// LogEvery is the least time between two log lines for one refusal
	// reason; the refusals in between are counted and said in the next.
	LogEvery time.Duration
	// FirstMessage is how long a Connect stream may wait for its register
	// message, and an Ingest stream for its join, before it is ended
	// (DeadlineExceeded, counted `first-message`): a stream that never
	// says who it is holds nothing for long.
	FirstMessage time.Duration
	// MaxConnStreams caps the gRPC streams open at once on one connection
	// (grpc.MaxConcurrentStreams, told to the client in HTTP/2's
	// SETTINGS); never below MaxSourceStreams, so one source's connection
	// can carry all the streams it is allowed.
	MaxConnStreams int
}

// DefaultLimits are the limits a Server applies where Limits leaves a
// field zero.
var DefaultLimits = Limits{
	MaxMessage:       wire.MaxMessage,
	MaxFrameW:        1920,
	MaxFrameH:        1080,
	MaxBoxes:         256,
	MaxAudioBytes:    1 << 20, // 5.4 s of 48 kHz stereo
	MaxResultItems:   4096,
	MaxTracks:        wire.DefaultTracks,
	MaxSteps:         wire.DefaultSteps,
	MaxEvents:        wire.DefaultEvents,
	MaxLabels:        wire.DefaultLabels,
	MaxStateBytes:    wire.MaxStateBytes,
	MaxSourceStreams: 64,
	MaxWorkerStreams: 2,
	PeerRate:         1,
	PeerBurst:        20,
	GlobalRate:       20,
	GlobalBurst:      200,
	LogEvery:         10 * time.Second,
	FirstMessage:     10 * time.Second,
	MaxConnStreams:   1024,
}

// withDefaults fills l's zero fields with DefaultLimits' and reports a
// field out of range (a negative count, rate or duration) by name, as
// internal/defaults does for every config: a bad value is an error, never
// silently replaced.
func (l Limits) withDefaults() (Limits, error) {
	d := DefaultLimits
	c := defaults.Fields{Prefix: "remote.Limits"}
	c.Count("MaxMessage", &l.MaxMessage, d.MaxMessage)
	c.Count("MaxFrameW", &l.MaxFrameW, d.MaxFrameW)
	c.Count("MaxFrameH", &l.MaxFrameH, d.MaxFrameH)
	c.Count("MaxBoxes", &l.MaxBoxes, d.MaxBoxes)
	c.Count("MaxAudioBytes", &l.MaxAudioBytes, d.MaxAudioBytes)
	c.Count("MaxResultItems", &l.MaxResultItems, d.MaxResultItems)
	c.Count("MaxTracks", &l.MaxTracks, d.MaxTracks)
	c.Count("MaxSteps", &l.MaxSteps, d.MaxSteps)
	c.Count("MaxEvents", &l.MaxEvents, d.MaxEvents)
	c.Count("MaxLabels", &l.MaxLabels, d.MaxLabels)
	c.Count("MaxStateBytes", &l.MaxStateBytes, d.MaxStateBytes)
	c.Count("MaxSourceStreams", &l.MaxSourceStreams, d.MaxSourceStreams)
	c.Count("MaxWorkerStreams", &l.MaxWorkerStreams, d.MaxWorkerStreams)
	// Rates and bursts: +Inf is no limit (a token bucket that never
	// empties); negative and NaN are refused.
	c.Between("PeerRate", &l.PeerRate, d.PeerRate, 0)
	c.Between("PeerBurst", &l.PeerBurst, d.PeerBurst, 0)
	c.Between("GlobalRate", &l.GlobalRate, d.GlobalRate, 0)
	c.Between("GlobalBurst", &l.GlobalBurst, d.GlobalBurst, 0)
	c.Duration("LogEvery", &l.LogEvery, d.LogEvery)
	c.Duration("FirstMessage", &l.FirstMessage, d.FirstMessage)
	c.Count("MaxConnStreams", &l.MaxConnStreams, d.MaxConnStreams)
	l.MaxConnStreams = max(l.MaxConnStreams, l.MaxSourceStreams)
	return l, c.Err()
}

// Check reports the fields of l out of range, by name (nil when all are
// valid; a zero field takes its default).
func (l Limits) Check() error {
	_, err := l.withDefaults()
	return err
}

// SourceMessage is the largest message a source may send: one frame at
// the cap in BGR, its boxes, and 64 KiB for the rest of the message (an
// audio chunk must fit too: --max-audio above that is refused at start).
func (l Limits) SourceMessage() int {
	return l.MaxFrameW*l.MaxFrameH*3 + l.MaxBoxes*wire.MaxBoxBytes + 64<<10
}

// ParseFrameSize parses WxH (e.g. 1920x1080), as --max-frame takes it.
func ParseFrameSize(s string) (w, h int, err error) {
	if _, err := fmt.Sscanf(s, "%dx%d", &w, &h); err != nil || w <= 0 || h <= 0 || fmt.Sprintf("%dx%d", w, h) != s {
		return 0, 0, fmt.Errorf("frame size %q: want WIDTHxHEIGHT with positive integers, e.g. 1920x1080", s)
	}
	if w > 16384 || h > 16384 {
		return 0, 0, fmt.Errorf("frame size %q: at most 16384 pixels a side", s)
	}
	return w, h, nil
}

// Refusal reasons, the label values of mdag_grpc_refused_total.
const (
	RefusedMessage      = "message-size"   // over MaxMessage, or a source's over SourceMessage
	RefusedFrameSize    = "frame-size"     // a frame over MaxFrameW x MaxFrameH
	RefusedBoxes        = "boxes"          // more than MaxBoxes on a frame
	RefusedAudioSize    = "audio-size"     // an audio chunk over MaxAudioBytes
	RefusedResultItems  = "result-items"   // a result with more than MaxResultItems
	RefusedItemContent  = "item-content"   // an item over MaxTracks, MaxSteps, MaxEvents, MaxLabels or MaxAudioBytes
	RefusedStateSize    = "state-size"     // a result's state over MaxStateBytes
	RefusedStreams      = "source-streams" // a source over MaxSourceStreams
	RefusedWorkerStream = "worker-streams" // a Connect over MaxWorkerStreams of its peer
	RefusedRatePeer     = "rate-peer"      // Connect over the peer's rate
	RefusedRateGlobal   = "rate-global"    // Connect over the global rate
	RefusedUnknownTask  = "unknown-task"   // a result for a task the worker was not given
	RefusedHandshakes   = "handshakes"     // a connection while MaxHandshakes TLS handshakes are in progress
	RefusedFrameRef     = "frame-ref"      // a result's frame reference the worker may not make (not its own, or it relays)
	RefusedHandshakesIP = "handshakes-ip"  // a connection while MaxHandshakesPerIP handshakes from its IP address are in progress
	RefusedTLS          = "tls-handshake"  // a TLS handshake that failed (no or a bad certificate, not TLS) or never started (FirstByteTimeout)
	RefusedFirstMessage = "first-message"  // a Connect or Ingest stream whose register or join did not come within Limits.FirstMessage
	RefusedIdentity     = "identity"       // a worker ID or stream its certificate may not claim
	RefusedRegister     = "register"       // a Register with a field over its length or outside its characters
	RefusedRole         = "role"           // a call the certificate's role may not make (or no certificate)
	RefusedTicket       = "ticket"         // a worker's stream join whose ticket is not Route's for it (forged, another worker's or stream's, expired)
	RefusedIngested     = "ingested"       // a worker's ingested frame of a stream not joined on it, or not its own reference
	RefusedThumbnail    = "thumbnail"      // a worker's thumbnail not asked for, of a stream not joined on it, over its size or not a JPEG
	RefusedCamera       = "camera"         // a worker's state of a camera the coordinator did not assign it
	RefusedWhip         = "whip"           // a worker's WHIP answer no offer waits for, or end of a stream not delegated to it
)

// count counts one refusal without logging it (its caller logs).
func (r *refusals) count(reason string) {
	r.mu.Lock()
	r.counts[reason]++
	r.mu.Unlock()
}

// logBurst is how many lines a logLimiter writes at once before it
// holds to one per interval.
const logBurst = 5

// logLimiter writes at most logBurst lines at once and then one per
// interval; a line after some were held back says how many.
type logLimiter struct {
	clk   clock.Clock
	log   *slog.Logger
	every time.Duration

	mu      sync.Mutex
	tokens  bucket
	started bool
	held    uint64
}

func newLogLimiter(clk clock.Clock, log *slog.Logger, every time.Duration) *logLimiter {
	return &logLimiter{clk: clk, log: log, every: every}
}

func (l *logLimiter) warn(msg string, attrs ...any) {
	now := l.clk.Now()
	rate := 1 / l.every.Seconds()
	l.mu.Lock()
	if !l.started {
		l.tokens, l.started = bucket{tokens: logBurst, at: now}, true
	}
	if !l.tokens.take(now, rate, logBurst) {
		l.held++
		l.mu.Unlock()
		return
	}
	held := l.held
	l.held = 0
	l.mu.Unlock()
	if held > 0 {
		attrs = append(attrs, "also_refused_since_last_log", held)
	}
	l.log.Warn(msg, attrs...)
}

// refusals counts refusals by reason and logs each reason at most once per
// interval, saying how many were refused since the last line.
type refusals struct {
	clk   clock.Clock
	log   *slog.Logger
	every time.Duration

	mu     sync.Mutex
	counts map[string]uint64
	logged map[string]time.Time
	quiet  map[string]uint64 // refused since the last line
}

func newRefusals(clk clock.Clock, log *slog.Logger, every time.Duration) *refusals {
	return &refusals{clk: clk, log: log, every: every, counts: map[string]uint64{}, logged: map[string]time.Time{}, quiet: map[string]uint64{}}
}

// add counts one refusal and logs it unless reason was logged less than
// an interval ago.
func (r *refusals) add(reason string, err error, attrs ...any) {
	now := r.clk.Now()
	r.mu.Lock()
	r.counts[reason]++
	last, seen := r.logged[reason]
	if seen && now.Sub(last) < r.every {
		r.quiet[reason]++
		r.mu.Unlock()
		return
	}
	suppressed := r.quiet[reason]
	r.quiet[reason] = 0
	r.logged[reason] = now
	r.mu.Unlock()
	attrs = append(attrs, "reason", reason, "err", status.Convert(err).Message())
	if suppressed > 0 {
		attrs = append(attrs, "also_refused_since_last_log", suppressed)
	}
	r.log.Warn("gRPC request refused", attrs...)
}

func (r *refusals) snapshot() map[string]uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]uint64, len(r.counts))
	for k, v := range r.counts {
		out[k] = v
	}
	return out
}

// bucket is a token bucket: rate tokens a second up to burst.
type bucket struct {
	tokens float64
	at     time.Time
}

// take refills b to now and takes one token if there is one.
func (b *bucket) take(now time.Time, rate, burst float64) bool {
	b.refill(now, rate, burst)
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

func (b *bucket) refill(now time.Time, rate, burst float64) {
	if dt := now.Sub(b.at).Seconds(); dt > 0 {
		b.tokens = min(burst, b.tokens+dt*rate)
	}
	b.at = now
}

// maxPeerBuckets bounds the per-peer buckets kept; past it, full ones (peers
// that have not connected for a while) are forgotten.
const maxPeerBuckets = 4096

// registrations is Connect's rate limiter: a bucket per peer and a global
// one. A refused attempt takes no token from either.
type registrations struct {
	mu     sync.Mutex
	global bucket
	peers  map[string]*bucket
}

// allow reports "" when peer may register now, else the refusal reason.
func (g *registrations) allow(now time.Time, peer string, l Limits) string {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.peers == nil {
		g.peers = map[string]*bucket{}
		g.global = bucket{tokens: l.GlobalBurst, at: now}
	}
	b := g.peers[peer]
	if b == nil {
		if len(g.peers) >= maxPeerBuckets {
			for k, o := range g.peers {
				if o.refill(now, l.PeerRate, l.PeerBurst); o.tokens >= l.PeerBurst {
					delete(g.peers, k)
				}
			}
		}
		if len(g.peers) >= maxPeerBuckets {
			// every bucket in use: a new peer is held to the global
			// bucket alone rather than growing the map without bound
			if !g.global.take(now, l.GlobalRate, l.GlobalBurst) {
				return RefusedRateGlobal
			}
			return ""
		}
		b = &bucket{tokens: l.PeerBurst, at: now}
		g.peers[peer] = b
	}
	b.refill(now, l.PeerRate, l.PeerBurst)
	if b.tokens < 1 {
		return RefusedRatePeer
	}
	if !g.global.take(now, l.GlobalRate, l.GlobalBurst) {
		return RefusedRateGlobal
	}
	b.tokens--
	return ""
}

// peerID is who a caller is for limits: its certificate's mdag://ROLE/NAME
// with TLS, its IP address without (ports change with each connection).
func peerID(ctx context.Context) string {
	if n := certName(ctx); n != "" {
		return n
	}
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return "unknown"
	}
	if host, _, err := net.SplitHostPort(p.Addr.String()); err == nil {
		return host
	}
	return p.Addr.String()
}

// Refused returns the refusals so far by reason (mdag_grpc_refused_total).
func (s *Server) Refused() map[string]uint64 {
	s.defaults()
	return s.refused.snapshot()
}

// refuse counts and logs a refusal and returns err.
func (s *Server) refuse(reason string, err error, attrs ...any) error {
	s.refused.add(reason, err, attrs...)
	return err
}

// admitRegistration applies the Connect rate limits.
func (s *Server) admitRegistration(ctx context.Context) error {
	who := peerID(ctx)
	l := s.limits
	switch s.regs.allow(s.Clock.Now(), who, l) {
	case RefusedRatePeer:
		return s.refuse(RefusedRatePeer, status.Errorf(codes.ResourceExhausted, "register: %s connects more often than %g a second (burst %g); retry later", who, l.PeerRate, l.PeerBurst), "peer", who)
	case RefusedRateGlobal:
		return s.refuse(RefusedRateGlobal, status.Errorf(codes.ResourceExhausted, "register: workers connect more often than %g a second in all (burst %g); retry later", l.GlobalRate, l.GlobalBurst), "peer", who)
	}
	return nil
}

// openSource counts one more Ingest stream for source, or refuses it; the
// returned func closes it.
func (s *Server) openSource(source string) (func(), error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sources == nil {
		s.sources = map[string]int{}
	}
	if n := s.sources[source]; n >= s.limits.MaxSourceStreams {
		return nil, s.refuse(RefusedStreams, status.Errorf(codes.ResourceExhausted, "ingest: source %s already has %d streams open, the limit (--max-source-streams)", source, n), "source", source)
	}
	s.sources[source]++
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.sources[source]--; s.sources[source] <= 0 {
			delete(s.sources, source)
		}
	}, nil
}

// openWorker counts one more Connect stream for the worker peer of ctx
// (workerPeer), or refuses it before anything of it is read; the returned
// func closes it.
func (s *Server) openWorker(ctx context.Context) (func(), error) {
	who := s.workerPeer(ctx)
	if who == "" {
		return func() {}, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.workerStreams == nil {
		s.workerStreams = map[string]int{}
	}
	if n := s.workerStreams[who]; n >= s.limits.MaxWorkerStreams {
		return nil, s.refuse(RefusedWorkerStream, status.Errorf(codes.ResourceExhausted, "connect: %s already has %d Connect streams open, the limit (remote.Limits.MaxWorkerStreams); one worker needs one", who, n), "peer", who)
	}
	s.workerStreams[who]++
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.workerStreams[who]--; s.workerStreams[who] <= 0 {
			delete(s.workerStreams, who)
		}
	}, nil
}

// workerPeer is whom MaxWorkerStreams counts: the certificate's identity;
// for a shared certificate (Server.Shared), that and the connection, since
// each of its holders is a worker of its own and several may share a host
// (so a shared certificate is bounded per connection only: one per worker,
// as the kubernetes provisioner issues, is bounded per worker). In
// plaintext, none (""): the server is loopback only, where any local
// process may be any worker (docs/security.md), and the bound is
// MaxConnStreams per connection.
func (s *Server) workerPeer(ctx context.Context) string {
	leaf := verifiedLeaf(ctx)
	if leaf == nil {
		return ""
	}
	var addr net.Addr
	if p, ok := peer.FromContext(ctx); ok {
		addr = p.Addr
	}
	role, name, err := pki.RoleOf(leaf)
	if err != nil {
		return "unknown"
	}
	id := pki.IdentityURI(role, name).String()
	for _, c := range s.Shared {
		if c.Role == role && c.Name == name {
			if addr == nil {
				return id
			}
			return id + " at " + addr.String()
		}
	}
	return id
}

// maxField bounds a Register message's id, type and executor (and a
// shared certificate's prefix); maxGPUField its gpu telemetry, a line per
// GPU.
const (
	maxField    = 128
	maxGPUField = 1024
)

// printable reports whether v is printable ASCII (spaces too with spaces).
func printable(v string, spaces bool) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < 0x20 || c > 0x7e || c == ' ' && !spaces {
			return false
		}
	}
	return true
}

// checkRegister checks a Register's free-text fields before any reaches a
// log, the status or the state: id and type 1 to 128 printable ASCII
// characters without spaces, executor up to 128 and gpu up to 1024
// printable ASCII characters. A refusal says which field and is counted
// `register`; it quotes no more of the field than 32 bytes.
func (s *Server) checkRegister(r *api.Register, peer string) error {
	for _, f := range []struct {
		name, v      string
		max          int
		spaces, need bool
	}{{"id", r.Id, maxField, false, true}, {"type", r.Type, maxField, false, true}, {"executor", r.Executor, maxField, true, false}, {"gpu", r.Gpu, maxGPUField, true, false}} {
		var why string
		switch {
		case f.need && f.v == "":
			why = "is required"
		case len(f.v) > f.max:
			why = fmt.Sprintf("has %d bytes; at most %d", len(f.v), f.max)
		case !printable(f.v, f.spaces):
			why = "must be printable ASCII"
			if !f.spaces {
				why += " without spaces"
			}
		default:
			continue
		}
		return s.refuse(RefusedRegister, status.Errorf(codes.InvalidArgument, "register: field %s %s (starts %.32q)", f.name, why, f.v), "peer", peer)
	}
	return nil
}
