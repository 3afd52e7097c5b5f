// Package egress is annotated video out, the pure half: per watched
// stream a bounded ring of the recent decoded frames, keyed by seq, and on
// each frame's result the frame with the app's boxes, track ids and labels
// drawn on a copy, handed to the stream's sink (the edge, egress/whep,
// encodes it once for all of the stream's viewers).
//
// A stream nobody watches costs one lock-free map read and an atomic store
// per frame (its last-seen time, for Live): no pixels are kept or drawn.
// Frames are read-only once ingested (the engine's rule), so the ring holds
// them without copying; drawing works on a copy. Drawing and the sink run
// on the stream's own goroutine behind a one-slot mailbox: the engine's
// result callback never waits for an encoder, and when the encoder falls
// behind the newest frame replaces the waiting one (counted as skipped).
//
// Results may arrive out of order: a result older than the last frame sent
// is discarded (counted stale), and sending frame N evicts the frames
// before it that are still waiting (their results would be stale).
// A frame whose result is a drop is sent undrawn: the video keeps its pace
// and shows the camera as it was, without boxes that were never computed.
package egress

import (
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/media"
)

// Config bounds a Hub. Zero fields take their defaults.
type Config struct {
	// MaxFrames, MaxAge and MaxBytes bound each watched stream's ring
	// (defaults 64 frames, 2 s, 64 MiB): a frame beyond any of them is
	// evicted, oldest first, and counted.
	MaxFrames int
	MaxAge    time.Duration
	MaxBytes  int64
	// LiveWithin: a stream is live while its last frame is this recent
	// (default 5 s).
	LiveWithin time.Duration
	Clock      clock.Clock
}

func (c Config) withDefaults() Config {
	if c.MaxFrames <= 0 {
		c.MaxFrames = 64
	}
	if c.MaxAge <= 0 {
		c.MaxAge = 2 * time.Second
	}
	if c.MaxBytes <= 0 {
		c.MaxBytes = 64 << 20
	}
	if c.LiveWithin <= 0 {
		c.LiveWithin = 5 * time.Second
	}
	if c.Clock == nil {
		c.Clock = clock.Real{}
	}
	return c
}

// Result is what a frame's result draws: the engine's FrameResult as the
// egress sees it.
type Result struct {
	Stream  string
	Seq     uint64
	Dropped bool // the frame was dropped: sent undrawn
	Boxes   []media.Box
	Tracks  []media.Track
	Labels  []string
}

// Sink receives a stream's annotated frames in seq order, on the stream's
// goroutine (one call at a time). The frame is the sink's.
type Sink func(f *media.Frame, seq uint64)

// Stats are a stream's counters.
type Stats struct {
	Stream   string
	Watched  bool
	Buffered int    // frames in the ring now
	Bytes    int64  // their pixels
	Ingested uint64 // frames put in the ring (while watched)
	Sent     uint64 // frames handed to the sink
	Undrawn  uint64 // of Sent, frames whose result was a drop
	Evicted  uint64 // frames that left the ring by its bounds before their result
	Missing  uint64 // results whose frame was not in the ring
	Stale    uint64 // results older than the last frame sent, and frames passed over by a newer one
	Skipped  uint64 // frames replaced in the mailbox while the sink was busy
}

type slot struct {
	seq uint64
	at  time.Time
	f   *media.Frame
}

type job struct {
	f   *media.Frame
	res Result
}

type stream struct {
	name string
	mu   sync.Mutex
	ring []slot // ascending seq
	size int64
	sent bool // last is set
	shut bool // stopped: the mailbox is closed
	last uint64
	st   Stats
	box  chan job // the one-slot mailbox
	done chan struct{}
}

// Hub holds the watched streams.
type Hub struct {
	cfg     Config
	seen    sync.Map // stream -> *atomic.Int64 (unix ns of its last frame)
	watched atomic.Int64
	mu      sync.RWMutex
	streams map[string]*stream
}

// New returns a hub.
func New(cfg Config) *Hub {
	return &Hub{cfg: cfg.withDefaults(), streams: map[string]*stream{}}
}

// Watch starts keeping stream's frames and handing its annotated frames
// to sink. A stream has one sink (the edge shares it among the viewers);
// stop ends it, waiting for a sink call in progress, and drops the ring.
func (h *Hub) Watch(name string, sink Sink) (stop func(), err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.streams[name]; ok {
		return nil, fmt.Errorf("egress: stream %q is already watched", name)
	}
	s := &stream{name: name, box: make(chan job, 1), done: make(chan struct{})}
	h.streams[name] = s
	h.watched.Add(1)
	go s.run(sink)
	var once sync.Once
	return func() {
		once.Do(func() {
			h.mu.Lock()
			delete(h.streams, name)
			h.watched.Add(-1)
			h.mu.Unlock()
			s.mu.Lock()
			s.shut = true
			close(s.box)
			s.ring, s.size = nil, 0
			s.mu.Unlock()
			<-s.done
		})
	}, nil
}

func (s *stream) run(sink Sink) {
	defer close(s.done)
	for j := range s.box {
		if j.res.Dropped {
			sink(j.f, j.res.Seq)
			continue
		}
		out := Annotate(j.f, j.res)
		sink(out, j.res.Seq)
	}
}

func (h *Hub) get(name string) *stream {
	if h.watched.Load() == 0 {
		return nil
	}
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.streams[name]
}

// Ingest offers a decoded frame (read-only from here). Unwatched streams
// only have their last-seen time stamped.
func (h *Hub) Ingest(name string, seq uint64, f *media.Frame) {
	now := h.cfg.Clock.Now()
	if v, ok := h.seen.Load(name); ok {
		v.(*atomic.Int64).Store(now.UnixNano())
	} else {
		v := &atomic.Int64{}
		v.Store(now.UnixNano())
		h.seen.Store(name, v)
	}
	s := h.get(name)
	if s == nil || f == nil || f.Pix == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.shut {
		return
	}
	if s.sent && seq <= s.last {
		s.st.Stale++
		return
	}
	// keep seq order: a frame out of order goes in its place
	i := sort.Search(len(s.ring), func(i int) bool { return s.ring[i].seq >= seq })
	if i < len(s.ring) && s.ring[i].seq == seq {
		return
	}
	s.ring = append(s.ring, slot{})
	copy(s.ring[i+1:], s.ring[i:])
	s.ring[i] = slot{seq: seq, at: now, f: f}
	s.size += int64(len(f.Pix))
	s.st.Ingested++
	for len(s.ring) > 0 && (len(s.ring) > h.cfg.MaxFrames || s.size > h.cfg.MaxBytes || now.Sub(s.ring[0].at) > h.cfg.MaxAge) {
		s.evictFirst()
		s.st.Evicted++
	}
}

func (s *stream) evictFirst() {
	s.size -= int64(len(s.ring[0].f.Pix))
	s.ring[0] = slot{}
	s.ring = s.ring[1:]
}

// Result takes r's frame from the ring and queues it, to be drawn and
// handed to the sink. It never blocks.
func (h *Hub) Result(r Result) {
	s := h.get(r.Stream)
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.shut {
		return
	}
	if s.sent && r.Seq <= s.last {
		s.st.Stale++
		return
	}
	i := sort.Search(len(s.ring), func(i int) bool { return s.ring[i].seq >= r.Seq })
	if i == len(s.ring) || s.ring[i].seq != r.Seq {
		s.st.Missing++
		return
	}
	f := s.ring[i].f
	// the frames before it would only ever be stale
	for range i {
		s.evictFirst()
		s.st.Stale++
	}
	s.evictFirst()
	s.sent, s.last = true, r.Seq
	s.st.Sent++
	if r.Dropped {
		s.st.Undrawn++
	}
	j := job{f: f, res: r}
	select {
	case s.box <- j:
	default:
		select { // the sink is busy: the newest frame replaces the waiting one
		case <-s.box:
			s.st.Skipped++
			s.st.Sent--
		default:
		}
		s.box <- j // only Result sends, under s.mu: there is room now
	}
}

// Live lists the streams whose last frame is at most LiveWithin old,
// sorted.
func (h *Hub) Live() []string {
	now := h.cfg.Clock.Now().UnixNano()
	var out []string
	h.seen.Range(func(k, v any) bool {
		if now-v.(*atomic.Int64).Load() <= int64(h.cfg.LiveWithin) {
			out = append(out, k.(string))
		} else {
			h.seen.Delete(k)
		}
		return true
	})
	sort.Strings(out)
	return out
}

// IsLive reports whether name's last frame is at most LiveWithin old.
func (h *Hub) IsLive(name string) bool {
	v, ok := h.seen.Load(name)
	return ok && h.cfg.Clock.Now().UnixNano()-v.(*atomic.Int64).Load() <= int64(h.cfg.LiveWithin)
}

// Stats are the watched streams' counters, sorted by stream.
func (h *Hub) Stats() []Stats {
	h.mu.RLock()
	ss := make([]*stream, 0, len(h.streams))
	for _, s := range h.streams {
		ss = append(ss, s)
	}
	h.mu.RUnlock()
	out := make([]Stats, 0, len(ss))
	for _, s := range ss {
		s.mu.Lock()
		st := s.st
		st.Stream, st.Watched, st.Buffered, st.Bytes = s.name, true, len(s.ring), s.size
		s.mu.Unlock()
		out = append(out, st)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Stream < out[j].Stream })
	return out
}
