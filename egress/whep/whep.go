// Package whep serves annotated video over WHEP (the WebRTC-HTTP Egress
// Protocol, RFC 9725): a stream's frames with the app's results drawn
// (package egress), encoded once per stream to VP8 (ingest/vpx) and
// written to one track that all of the stream's viewers share.
//
//	POST    /whep/{app}/{stream}        SDP offer (recvonly video) -> 201, SDP answer, Location
//	DELETE  /whep/{app}/{stream}/{id}   end the viewer
//	OPTIONS /whep/...                   CORS preflight (same-origin pages need none)
//	GET     /v1/whep                    viewers, live streams and per-stream counters (JSON)
//	GET     /whep/player.js             the browser player (no data: serve it without a token)
//
// The encoder of a stream starts with its first viewer and stops with its
// last; a new viewer gets a key frame (and so does a viewer's PLI).
// Viewers are bounded per stream and in total (503 with Retry-After and
// the reason). Authentication is the caller's: cmd/mdag wraps the handler
// with the WHIP server's token check.
package whep

import (
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pion/ice/v4"
	"github.com/pion/interceptor"
	"github.com/pion/rtcp"
	"github.com/pion/webrtc/v4"
	pmedia "github.com/pion/webrtc/v4/pkg/media"

	"github.com/mdag/mdag/egress"
	"github.com/mdag/mdag/ingest/vpx"
	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/media"
)

// Config configures a Server. Zero fields take their defaults.
type Config struct {
	// Apps are the app names the path may name.
	Apps []string
	// MaxPerStream and MaxViewers bound the viewers of one stream and of
	// all streams (defaults 8 and 32).
	MaxPerStream, MaxViewers int
	// FPS is the encoder's time base (default 30); BitrateKbps its target
	// (default 1000).
	FPS         int
	BitrateKbps int
	// ConnectTimeout ends a viewer whose ICE has not connected this long
	// after its offer (default 15 s).
	ConnectTimeout time.Duration
	// UDPPortMin/Max and PublicIPs: as WHIP's (the same flags).
	UDPPortMin, UDPPortMax uint16
	PublicIPs              []string
	Clock                  clock.Clock
	Log                    *slog.Logger
}

// Server is the WHEP endpoint.
type Server struct {
	cfg Config
	hub *egress.Hub
	api *webrtc.API
	clk clock.Clock
	log *slog.Logger

	mu    sync.Mutex
	feeds map[string]*feed // by stream
	// stopping are the feeds whose last viewer left, until their stop
	// returns (the hub's watch is theirs until then)
	stopping map[string]chan struct{}
	viewers  int // all feeds' viewers, and the ones being set up
	closed   bool
	refused  map[string]uint64    // by reason
	said     map[string]time.Time // reason -> when a refusal was last logged
	ended    Totals               // the counters of feeds that have stopped
	started  atomic.Uint64        // viewers that got an answer
}

// feed is one watched stream: its encoder and the track its viewers share.
type feed struct {
	stream  string
	track   *webrtc.TrackLocalStaticSample
	viewers map[string]*viewer
	pending int // viewers being set up
	stop    func()
	keyReq  atomic.Bool
	// lastKeyReq is when a viewer's PLI or FIR last forced a key frame
	// (unix ns)
	lastKeyReq atomic.Int64
	// owned by the hub's goroutine for the stream (the sink)
	enc     *vpx.Encoder
	w, h    int
	pts     int64
	last    time.Time
	encoded atomic.Uint64
	bytes   atomic.Uint64
	errs    atomic.Uint64
}

type viewer struct {
	id      string
	pc      *webrtc.PeerConnection
	started time.Time
}

// OfferReadTimeout bounds reading an offer's body; keyInterval is the
// least time between key frames viewers' PLIs and FIRs force.
var OfferReadTimeout = 10 * time.Second

const keyInterval = 500 * time.Millisecond

// New returns a server fed by hub.
func New(cfg Config, hub *egress.Hub) (*Server, error) {
	if cfg.MaxPerStream <= 0 {
		cfg.MaxPerStream = 8
	}
	if cfg.MaxViewers <= 0 {
		cfg.MaxViewers = 32
	}
	if cfg.FPS <= 0 {
		cfg.FPS = 30
	}
	if cfg.BitrateKbps <= 0 {
		cfg.BitrateKbps = 1000
	}
	if cfg.ConnectTimeout <= 0 {
		cfg.ConnectTimeout = 15 * time.Second
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	m := &webrtc.MediaEngine{}
	if err := m.RegisterCodec(webrtc.RTPCodecParameters{
		RTPCodecCapability: webrtc.RTPCodecCapability{MimeType: webrtc.MimeTypeVP8, ClockRate: 90000,
			RTCPFeedback: []webrtc.RTCPFeedback{{Type: "nack"}, {Type: "nack", Parameter: "pli"}, {Type: "ccm", Parameter: "fir"}}},
		PayloadType: 96,
	}, webrtc.RTPCodecTypeVideo); err != nil {
		return nil, err
	}
	ir := &interceptor.Registry{}
	if err := webrtc.ConfigureNack(m, ir); err != nil {
		return nil, err
	}
	if err := webrtc.ConfigureRTCPReports(ir); err != nil {
		return nil, err
	}
	se := webrtc.SettingEngine{}
	se.SetICEMulticastDNSMode(ice.MulticastDNSModeDisabled)
	se.SetIncludeLoopbackCandidate(true)
	se.SetNetworkTypes([]webrtc.NetworkType{webrtc.NetworkTypeUDP4})
	if cfg.UDPPortMin > 0 || cfg.UDPPortMax > 0 {
		if err := se.SetEphemeralUDPPortRange(cfg.UDPPortMin, cfg.UDPPortMax); err != nil {
			return nil, fmt.Errorf("whep: UDP port range %d-%d: %w", cfg.UDPPortMin, cfg.UDPPortMax, err)
		}
	}
	if len(cfg.PublicIPs) > 0 {
		se.SetNAT1To1IPs(cfg.PublicIPs, webrtc.ICECandidateTypeHost)
	}
	api := webrtc.NewAPI(webrtc.WithMediaEngine(m), webrtc.WithInterceptorRegistry(ir), webrtc.WithSettingEngine(se))
	return &Server{cfg: cfg, hub: hub, api: api, clk: cfg.Clock, log: cfg.Log, feeds: map[string]*feed{}, stopping: map[string]chan struct{}{}, refused: map[string]uint64{}, said: map[string]time.Time{}}, nil
}

// PlayerJS is the browser player (static/player.js): whepPlay(url,
// video, token) and whepLive(token).
//
//go:embed static/player.js
var PlayerJS []byte

// PlayerPath is where Handler serves PlayerJS. It holds no data: callers
// that guard the handler with a token serve this path without one (a
// <script src> cannot send a header).
const PlayerPath = "/whep/player.js"

// Handler serves the WHEP endpoints, GET /v1/whep and the player.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+PlayerPath, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/javascript; charset=utf-8")
		w.Header().Set("Cache-Control", "no-cache")
		_, _ = w.Write(PlayerJS)
	})
	mux.HandleFunc("POST /whep/{app}/{stream}", s.handlePost)
	mux.HandleFunc("DELETE /whep/{app}/{stream}/{id}", s.handleDelete)
	mux.HandleFunc("PATCH /whep/{app}/{stream}/{id}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", "DELETE")
		httpError(w, http.StatusMethodNotAllowed, "trickle ICE is not supported: the answer carries all candidates")
	})
	mux.HandleFunc("OPTIONS /whep/", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Accept-Post", "application/sdp")
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("GET /v1/whep", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(s.Stats())
	})
	return mux
}

func httpError(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(code)
	fmt.Fprintln(w, msg)
}

// Refusal reasons (Stats.Refused).
const (
	RefusedStreamFull = "stream_full"
	RefusedFull       = "full"
	RefusedUnknown    = "unknown_stream"
	RefusedBadOffer   = "bad_offer"
)

func (s *Server) refuse(w http.ResponseWriter, code int, reason, msg string) {
	now := s.clk.Now()
	s.mu.Lock()
	s.refused[reason]++
	n := s.refused[reason]
	say := now.Sub(s.said[reason]) >= 10*time.Second // at most one line per reason every 10 s
	if say {
		s.said[reason] = now
	}
	s.mu.Unlock()
	if say {
		s.log.Warn("whep: viewer refused", "reason", reason, "status", code, "detail", msg, "refused_so_far", n)
	}
	if code == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "5")
	}
	httpError(w, code, msg)
}

func (s *Server) handlePost(w http.ResponseWriter, r *http.Request) {
	app, name := r.PathValue("app"), r.PathValue("stream")
	if !slices.Contains(s.cfg.Apps, app) {
		s.refuse(w, http.StatusNotFound, RefusedUnknown, fmt.Sprintf("no app %q here (apps: %s)", app, strings.Join(s.cfg.Apps, ", ")))
		return
	}
	if !s.hub.IsLive(name) {
		live := s.hub.Live()
		list := strings.Join(live, ", ")
		if len(live) == 0 {
			list = "none"
		}
		s.refuse(w, http.StatusNotFound, RefusedUnknown, fmt.Sprintf("no live stream %q in app %q (live streams: %s)", name, app, list))
		return
	}
	if ct := r.Header.Get("Content-Type"); ct != "" && !strings.HasPrefix(ct, "application/sdp") {
		s.refuse(w, http.StatusUnsupportedMediaType, RefusedBadOffer, "want Content-Type application/sdp (an SDP offer)")
		return
	}
	// the offer within OfferReadTimeout: a client trickling its body
	// holds no handler
	_ = http.NewResponseController(w).SetReadDeadline(s.clk.Now().Add(OfferReadTimeout))
	body, err := io.ReadAll(io.LimitReader(r.Body, 64<<10))
	if err != nil || !strings.Contains(string(body), "m=video") {
		s.refuse(w, http.StatusBadRequest, RefusedBadOffer, "the body is not an SDP offer with a video section (m=video)")
		return
	}
	f, code, reason, msg := s.reserve(name)
	if code != 0 {
		s.refuse(w, code, reason, msg)
		return
	}
	v, answer, err := s.start(f, string(body))
	if err != nil {
		s.refuse(w, http.StatusBadRequest, RefusedBadOffer, "cannot answer the offer: "+err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/sdp")
	w.Header().Set("Location", "/whep/"+url.PathEscape(app)+"/"+url.PathEscape(name)+"/"+v.id)
	w.WriteHeader(http.StatusCreated)
	_, _ = io.WriteString(w, answer)
}

// reserve takes a viewer slot on stream's feed (starting the feed: its
// track and the hub's watch), or says why not.
func (s *Server) reserve(name string) (*feed, int, string, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.feeds[name] == nil && s.stopping[name] != nil { // its last viewer just left: wait for the stop
		done := s.stopping[name]
		s.mu.Unlock()
		select {
		case <-done:
		case <-s.clk.After(5 * time.Second):
		}
		s.mu.Lock()
		if s.stopping[name] == done {
			return nil, http.StatusServiceUnavailable, RefusedFull, fmt.Sprintf("stream %q's encoder is still stopping; retry", name)
		}
	}
	if s.closed {
		return nil, http.StatusServiceUnavailable, RefusedFull, "server shutting down"
	}
	if s.viewers >= s.cfg.MaxViewers {
		return nil, http.StatusServiceUnavailable, RefusedFull, fmt.Sprintf("the server has its limit of %d WHEP viewers at once; retry later", s.cfg.MaxViewers)
	}
	f := s.feeds[name]
	if f != nil && len(f.viewers)+f.pending >= s.cfg.MaxPerStream {
		return nil, http.StatusServiceUnavailable, RefusedStreamFull, fmt.Sprintf("stream %q has its limit of %d WHEP viewers at once; retry later", name, s.cfg.MaxPerStream)
	}
	if f == nil {
		track, err := webrtc.NewTrackLocalStaticSample(webrtc.RTPCodecCapability{MimeType: webrtc.MimeTypeVP8}, "video", "mdag-"+name)
		if err != nil {
			return nil, http.StatusInternalServerError, RefusedBadOffer, err.Error()
		}
		f = &feed{stream: name, track: track, viewers: map[string]*viewer{}}
		stop, err := s.hub.Watch(name, f.sink(s))
		if err != nil {
			return nil, http.StatusInternalServerError, RefusedBadOffer, err.Error()
		}
		f.stop = stop
		s.feeds[name] = f
		s.log.Info("whep: encoding started", "stream", name)
	}
	f.pending++
	s.viewers++
	return f, 0, "", ""
}

// start answers offer for a new viewer of f (whose slot is reserved).
func (s *Server) start(f *feed, offer string) (*viewer, string, error) {
	v := &viewer{id: newID(), started: s.clk.Now()}
	fail := func(err error) (*viewer, string, error) {
		if v.pc != nil {
			_ = v.pc.Close()
		}
		s.mu.Lock()
		f.pending--
		s.viewers--
		stop := s.dropFeedLocked(f)
		s.mu.Unlock()
		stop()
		return nil, "", err
	}
	pc, err := s.api.NewPeerConnection(webrtc.Configuration{})
	if err != nil {
		return fail(err)
	}
	v.pc = pc
	sender, err := pc.AddTrack(f.track)
	if err != nil {
		return fail(err)
	}
	go func() { // PLI and FIR ask for a key frame; reading keeps the interceptors going
		for {
			pkts, _, err := sender.ReadRTCP()
			if err != nil {
				return
			}
			for _, p := range pkts {
				switch p.(type) {
				case *rtcp.PictureLossIndication, *rtcp.FullIntraRequest:
					// at most one forced key frame per keyInterval: a
					// viewer sending PLIs without end cannot spend every
					// viewer's bitrate on key frames
					now := s.clk.Now().UnixNano()
					if last := f.lastKeyReq.Load(); now-last >= int64(keyInterval) && f.lastKeyReq.CompareAndSwap(last, now) {
						f.keyReq.Store(true)
					}
				}
			}
		}
	}()
	if err := pc.SetRemoteDescription(webrtc.SessionDescription{Type: webrtc.SDPTypeOffer, SDP: offer}); err != nil {
		return fail(err)
	}
	ans, err := pc.CreateAnswer(nil)
	if err != nil {
		return fail(err)
	}
	gathered := webrtc.GatheringCompletePromise(pc)
	if err := pc.SetLocalDescription(ans); err != nil {
		return fail(err)
	}
	select {
	case <-gathered:
	case <-s.clk.After(5 * time.Second):
		return fail(errors.New("ICE candidate gathering did not finish in 5 s"))
	}
	connected := make(chan struct{})
	var once sync.Once
	pc.OnConnectionStateChange(func(st webrtc.PeerConnectionState) {
		switch st {
		case webrtc.PeerConnectionStateConnected:
			once.Do(func() { close(connected) })
			f.keyReq.Store(true) // the new viewer starts on a key frame
		case webrtc.PeerConnectionStateFailed, webrtc.PeerConnectionStateClosed, webrtc.PeerConnectionStateDisconnected:
			go s.remove(f.stream, v.id, "connection "+st.String())
		}
	})
	s.clk.AfterFunc(s.cfg.ConnectTimeout, func() {
		select {
		case <-connected:
		default:
			s.remove(f.stream, v.id, "ICE did not connect in time")
		}
	})
	s.mu.Lock()
	if s.closed { // Close ran while this viewer was set up: it ends here
		f.pending--
		s.viewers--
		stop := s.dropFeedLocked(f)
		s.mu.Unlock()
		_ = pc.Close()
		stop()
		return nil, "", errors.New("server shutting down")
	}
	f.pending--
	f.viewers[v.id] = v
	s.mu.Unlock()
	s.started.Add(1)
	f.keyReq.Store(true)
	s.log.Info("whep viewer started", "stream", f.stream, "viewer", v.id)
	return v, pc.LocalDescription().SDP, nil
}

// dropFeedLocked removes f when it has no viewers left, returning what
// stops it (to call without s.mu: it waits for the encoder).
func (s *Server) dropFeedLocked(f *feed) func() {
	if len(f.viewers)+f.pending > 0 || s.feeds[f.stream] != f {
		return func() {}
	}
	delete(s.feeds, f.stream)
	// the feed's counters move to the totals with it, at once: a scrape
	// never sees them go down (a frame or two the sink still encodes
	// before it stops are not counted)
	var eg egress.Stats
	for _, st := range s.hub.Stats() {
		if st.Stream == f.stream {
			eg = st
		}
	}
	s.ended.add(f, eg)
	// a new viewer of the stream waits for this stop (the hub's watch is
	// held until it)
	done := make(chan struct{})
	s.stopping[f.stream] = done
	return func() {
		f.stop() // waits for the sink: the encoder is free after it
		s.mu.Lock()
		if s.stopping[f.stream] == done {
			delete(s.stopping, f.stream)
		}
		s.mu.Unlock()
		close(done)
		if f.enc != nil {
			f.enc.Close()
			f.enc = nil
		}
		s.log.Info("whep: encoding stopped (no viewers)", "stream", f.stream, "frames", f.encoded.Load())
	}
}

// remove ends a viewer (idempotent).
func (s *Server) remove(stream, id, why string) bool {
	s.mu.Lock()
	f := s.feeds[stream]
	if f == nil || f.viewers[id] == nil {
		s.mu.Unlock()
		return false
	}
	v := f.viewers[id]
	delete(f.viewers, id)
	s.viewers--
	stop := s.dropFeedLocked(f)
	s.mu.Unlock()
	_ = v.pc.Close()
	stop()
	s.log.Info("whep viewer ended", "stream", stream, "viewer", id, "why", why)
	return true
}

func (s *Server) handleDelete(w http.ResponseWriter, r *http.Request) {
	if !slices.Contains(s.cfg.Apps, r.PathValue("app")) || !s.remove(r.PathValue("stream"), r.PathValue("id"), "deleted by the client") {
		httpError(w, http.StatusNotFound, fmt.Sprintf("no viewer %q of stream %q", r.PathValue("id"), r.PathValue("stream")))
		return
	}
	w.WriteHeader(http.StatusOK)
}

// sink encodes a stream's annotated frames once and writes them to the
// shared track (on the hub's goroutine for the stream).
func (f *feed) sink(s *Server) egress.Sink {
	return func(fr *media.Frame, seq uint64) {
		if fr.W%2 != 0 || fr.H%2 != 0 {
			fr = even(fr)
		}
		if f.enc == nil || f.w != fr.W || f.h != fr.H {
			if f.enc != nil {
				f.enc.Close()
			}
			enc, err := vpx.NewEncoder(vpx.EncoderConfig{Width: fr.W, Height: fr.H, FPS: s.cfg.FPS, BitrateKbps: s.cfg.BitrateKbps})
			if err != nil {
				f.enc = nil
				f.fail(s, "cannot start the encoder", err)
				return
			}
			f.enc, f.w, f.h = enc, fr.W, fr.H
			f.keyReq.Store(true)
		}
		now := s.clk.Now()
		d := time.Second / time.Duration(s.cfg.FPS)
		if !f.last.IsZero() {
			d = now.Sub(f.last)
		}
		f.last = now
		pts := f.pts
		f.pts += max(1, int64(d*time.Duration(s.cfg.FPS)/time.Second))
		pkts, err := f.enc.Encode(fr, pts, f.keyReq.Swap(false))
		if err != nil {
			f.fail(s, "cannot encode a frame", err)
			return
		}
		for _, p := range pkts {
			if err := f.track.WriteSample(pmedia.Sample{Data: p.Data, Duration: d}); err != nil {
				f.fail(s, "cannot send a frame", err)
			}
			f.bytes.Add(uint64(len(p.Data)))
		}
		f.encoded.Add(1)
	}
}

// fail counts an encoder error; the first of a feed and every 100th are
// logged (viewers miss those frames).
func (f *feed) fail(s *Server, what string, err error) {
	if n := f.errs.Add(1); n == 1 || n%100 == 0 {
		s.log.Warn("whep: "+what+": viewers miss frames", "stream", f.stream, "err", err, "errors", n)
	}
}

// even crops a frame to even dimensions (VP8's 4:2:0).
func even(f *media.Frame) *media.Frame {
	w, h := f.W&^1, f.H&^1
	out := media.NewFrame(max(w, 2), max(h, 2))
	for y := 0; y < min(h, f.H); y++ {
		copy(out.Pix[y*out.W*3:(y*out.W+min(w, f.W))*3], f.Pix[y*f.W*3:])
	}
	return out
}

func newID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// StreamStats are one watched stream's viewers and counters.
type StreamStats struct {
	Stream       string       `json:"stream"`
	Viewers      int          `json:"viewers"`
	Encoded      uint64       `json:"encoded_frames"`
	EncodedBytes uint64       `json:"encoded_bytes"`
	Errors       uint64       `json:"errors"`
	Egress       egress.Stats `json:"egress"`
}

// Totals are counters over every feed this server has run (Prometheus
// counters: they only grow).
type Totals struct {
	Encoded      uint64 `json:"encoded_frames"`
	EncodedBytes uint64 `json:"encoded_bytes"`
	Errors       uint64 `json:"errors"`
	Evicted      uint64 `json:"evicted_frames"` // frames the ring's bounds evicted before their result came
	Skipped      uint64 `json:"skipped_frames"` // frames replaced while the encoder was busy
	Undrawn      uint64 `json:"undrawn_frames"` // frames sent without drawings (their result was a drop)
}

func (t *Totals) add(f *feed, eg egress.Stats) {
	t.Encoded += f.encoded.Load()
	t.EncodedBytes += f.bytes.Load()
	t.Errors += f.errs.Load()
	t.Evicted += eg.Evicted
	t.Skipped += eg.Skipped
	t.Undrawn += eg.Undrawn
}

// Stats is the server's state.
type Stats struct {
	Apps         []string          `json:"apps"`
	Live         []string          `json:"live"` // the streams one can watch
	Viewers      int               `json:"viewers"`
	MaxViewers   int               `json:"max_viewers"`
	MaxPerStream int               `json:"max_per_stream"`
	Started      uint64            `json:"viewers_started"`
	Refused      map[string]uint64 `json:"refused"`
	Totals       Totals            `json:"totals"`
	BitrateKbps  int               `json:"bitrate_kbps"`
	Streams      []StreamStats     `json:"streams"`
}

// Stats reports the viewers, refusals and each watched stream's counters.
func (s *Server) Stats() Stats {
	eg := map[string]egress.Stats{}
	for _, st := range s.hub.Stats() {
		eg[st.Stream] = st
	}
	live := s.hub.Live()
	if live == nil {
		live = []string{}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	out := Stats{Apps: s.cfg.Apps, Live: live, Viewers: s.viewers, MaxViewers: s.cfg.MaxViewers, MaxPerStream: s.cfg.MaxPerStream, BitrateKbps: s.cfg.BitrateKbps, Started: s.started.Load(), Refused: map[string]uint64{}}
	out.Totals = s.ended
	for k, v := range s.refused {
		out.Refused[k] = v
	}
	for name, f := range s.feeds {
		out.Totals.add(f, eg[name])
		out.Streams = append(out.Streams, StreamStats{Stream: name, Viewers: len(f.viewers), Encoded: f.encoded.Load(), EncodedBytes: f.bytes.Load(), Errors: f.errs.Load(), Egress: eg[name]})
	}
	sort.Slice(out.Streams, func(i, j int) bool { return out.Streams[i].Stream < out.Streams[j].Stream })
	return out
}

// Close ends every viewer and stops the encoders.
func (s *Server) Close() {
	s.mu.Lock()
	s.closed = true
	type pair struct{ stream, id string }
	var all []pair
	for name, f := range s.feeds {
		for id := range f.viewers {
			all = append(all, pair{name, id})
		}
	}
	s.mu.Unlock()
	for _, p := range all {
		s.remove(p.stream, p.id, "server closing")
	}
}
