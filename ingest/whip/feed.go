package whip

import (
	"errors"
	"fmt"
	"regexp"
	"sync"
	"time"

	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/ingest"
)

// feedName is what a Feed's name may be: it is the stream's ID, in URLs.
var feedName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

// OpenFeed opens a stream fed by a camera (ingest.Feeds): it is pending
// until its first frame decodes, then admitted like a WHIP stream, and it
// shows in Streams, IngestTotals, /v1/streams and the dashboard under its
// name. It is refused, with the reason, for an unknown app, a codec the
// server cannot decode, a name in use, the stream or pending limit, no
// CPU capacity, or shutdown (refusals are counted like a POST's).
func (s *Server) OpenFeed(cfg ingest.FeedConfig) (ingest.Feed, error) {
	app := dag.AppID(cfg.App)
	fps, ok := s.cfg.Apps[app]
	if !ok {
		return nil, fmt.Errorf("unknown app %q (deployed: %s)", cfg.App, s.appList())
	}
	if s.mediaOf(app) == dag.Audio {
		return nil, fmt.Errorf("app %s takes audio: a camera's stream is video (stream audio into it over WHIP with Opus)", app)
	}
	if cfg.FPS > 0 {
		fps = cfg.FPS
	}
	if !feedName.MatchString(cfg.Name) {
		return nil, fmt.Errorf("stream name %q: want letters, digits, '.', '_' or '-' (at most 64, not starting with a symbol)", cfg.Name)
	}
	if cfg.Codec != CodecH264 && cfg.Codec != "h265" {
		return nil, fmt.Errorf("codec %q: a camera's stream is h264 or h265", cfg.Codec)
	}
	if ad, ok := s.sink.(Admitter); ok {
		if err := ad.Admit(app); err != nil {
			s.countRefused(app, RefusedSession)
			return nil, fmt.Errorf("app %s refuses new streams: %v", app, err)
		}
	}
	if reason, msg := s.reserve(); reason != "" {
		s.countRefused(app, reason)
		return nil, errors.New(msg)
	}
	dec, err := newDecoder(cfg.Codec)
	if err != nil {
		s.unreserve()
		return nil, err
	}
	st := newStream(s, cfg.Name, app, fps, nil)
	st.codec, st.source = cfg.Codec, cfg.Source
	f := &feed{st: st, dec: dec, p: &pipeline{st: st, dec: dec, sync: &captureClock{}, needKey: true}}
	st.onEnd = f.closeDecoder
	s.mu.Lock()
	s.reserved--
	switch {
	case s.closed:
		s.mu.Unlock()
		dec.Close()
		return nil, errors.New("server shutting down")
	case s.streams[cfg.Name] != nil:
		s.mu.Unlock()
		dec.Close()
		return nil, fmt.Errorf("a stream named %q is live already", cfg.Name)
	}
	s.streams[cfg.Name] = st
	st.adm.media = true // decoding load is coming
	s.mu.Unlock()
	// A camera that connects but never decodes a frame (a profile the
	// decoder cannot take, no parameter sets, pictures above the limit)
	// must not hold a pending slot and its predicted load for ever: it is
	// ended (connect-timeout) and the camera opens a new stream later.
	// Cameras get three connect timeouts: their key frames may be seconds
	// apart.
	st.armConnectAfter(3 * s.cfg.ConnectTimeout)
	s.log.Info("camera stream opened (pending until its first frame decodes)", "app", app, "stream", st.id, "source", cfg.Source, "codec", cfg.Codec, "fps", fps)
	return f, nil
}

// feed is a camera's stream: the camera's goroutine calls its methods;
// mu orders them with the end (which frees the decoder).
type feed struct {
	st *stream

	mu     sync.Mutex
	dec    decoder   // nil once freed
	p      *pipeline // nil once the stream is ending
	lostAt time.Time // when the camera was lost (zero: it is not)
}

func (f *feed) ID() string            { return f.st.id }
func (f *feed) Done() <-chan struct{} { return f.st.done }

func (f *feed) Ended() (kind, why string) {
	f.st.mu.Lock()
	defer f.st.mu.Unlock()
	return f.st.endKind, f.st.ended
}

func (f *feed) Frame(au []byte, rtpTS uint32, key bool) {
	st := f.st
	now := st.s.clk.Now()
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.p == nil {
		return
	}
	st.mu.Lock()
	st.lastMedia = now
	ended := st.ended != ""
	if !f.lostAt.IsZero() {
		// Frames again after the camera was lost: the gap is over.
		st.c.gap.Add(int64(now.Sub(f.lostAt)))
		f.lostAt = time.Time{}
		st.waiting = ""
	}
	st.mu.Unlock()
	if ended {
		return
	}
	if !f.p.frame(codedFrame{Data: au, TS: rtpTS, Key: key}, now) {
		f.p = nil // the stream is ending (the pipeline said why)
	}
}

func (f *feed) SenderReport(ntp uint64, rtpTS uint32) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.p != nil {
		f.p.sync.senderReport(ntp, rtpTS, f.st.s.clk.Now())
	}
}

func (f *feed) Lost(frames int) {
	if frames <= 0 {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.st.c.lost.Add(uint64(frames))
	if f.p != nil {
		f.p.needKey = true
	}
}

func (f *feed) Disconnected(why string) {
	st := f.st
	now := st.s.clk.Now()
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.p == nil {
		return
	}
	st.c.cameraLost.Add(1)
	if f.lostAt.IsZero() {
		f.lostAt = now
	}
	st.mu.Lock()
	st.waiting = "camera lost: " + why + "; reconnecting"
	st.mu.Unlock()
	// The camera comes back on a new timeline: a key frame first, capture
	// times and the sampling grid from its frames' arrivals.
	f.p.needKey = true
	f.p.sync.restart(now)
	f.p.next = time.Time{}
	// The camera reader logs the camera-lost event at WARN; this is the stream's side.
	st.s.log.Debug("camera stream waiting", "app", st.app, "stream", st.id, "why", why, "lost_times", st.c.cameraLost.Load())
}

func (f *feed) End(kind, why string) { f.st.endAs(kind, why) }

// closeDecoder frees the decoder when the stream ends (stream.onEnd).
func (f *feed) closeDecoder() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.p = nil
	if f.dec != nil {
		f.dec.Close()
		f.dec = nil
	}
}

var _ ingest.Feeds = (*Server)(nil)
