// Package clips records event clips: each stream's recent video, encoded
// once to H.264, is kept in a ring bounded by duration and bytes; an event
// the app's `clips:` section names writes an MP4 from the pre-roll before
// it to the post-roll after it, with the event's JSON beside it, into a
// directory whose size and age are bounded (the oldest clips go first).
//
// The package is pure Go: the encoder (ingest/avc's in the binary) is
// handed in, and the MP4 is muxed by mediacommon's pmp4. All timing is by
// the frames' capture times, and by an injected clock for what happens
// when frames stop (Tick) and for retention.
package clips

import (
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/media"
	"github.com/mdag/mdag/outputs"
)

// Encoder compresses one stream's frames, all of one size, to H.264.
// Encode returns the frame's access unit (Annex-B; nil if the encoder
// held it back) and whether it is a key frame; key forces one.
type Encoder interface {
	Encode(f *media.Frame, key bool) (au []byte, isKey bool, err error)
	Close()
}

// NewEncoder makes an encoder for frames of w x h (even) at about fps.
type NewEncoder func(w, h, fps, kbps int) (Encoder, error)

// Config configures a Recorder.
type Config struct {
	App   string
	Clips dag.Clips // defaults filled (dag.Parse does)
	Dir   string    // where clips go (resolved: Clips.Dir relative to the app, or the state dir's)
	FPS   int       // the streams' nominal rate, for the encoder's rate control (default 10)
	// KeyEvery is the longest time between key frames (default 1 s): a clip
	// starts at a key frame at most this much before its pre-roll.
	KeyEvery   time.Duration
	NewEncoder NewEncoder
	Clock      clock.Clock   // default real
	Log        *slog.Logger  // default slog.Default()
	Slack      time.Duration // the ring keeps Pre+Slack, for results that arrive late (default 3 s)
	RingBytes  int           // per stream (default 64 MiB)
	Queue      int           // clips waiting to be written (default 8)
}

// Stats are a recorder's counters.
type Stats struct {
	Frames       int64 // encoded
	FrameErrors  int64 // frames not encoded (no pixels, encoder errors)
	Events       int64 // events seen that clips are on
	Extended     int64 // events that extended a clip being recorded
	Limited      int64 // events past max_clips_per_stream_per_minute: no clip
	Missed       int64 // events with no video in the ring
	Clips        int64 // clips written
	WriteErrors  int64 // clips not written (disk errors, queue full)
	Removed      int64 // clips removed by retention
	RemovedBytes int64
	RingDrops    int64 // GOPs dropped from rings to fit their bytes
}

// Recorder records the clips of one app's streams. Its methods are safe
// for concurrent use.
type Recorder struct {
	cfg   Config
	store *Store

	mu      sync.Mutex
	streams map[string]*stream
	stats   Stats
	closed  bool

	queue chan *clip
	done  sync.WaitGroup // the writer
	inq   sync.WaitGroup // clips queued and not yet written
}

type stream struct {
	name    string
	enc     Encoder
	w, h    int
	ring    ring
	lastKey time.Time
	last    time.Time // the newest frame's capture
	lastAt  time.Time // when it arrived (clock)
	open    *clip
	starts  []time.Time // clips started, by clock, within the last minute
	limited bool        // the limit was logged (once per stretch of limited events)
}

// clip is one being recorded.
type clip struct {
	stream  string
	first   outputs.Body // the event that started it
	events  []outputs.Event
	samples []Sample
	until   time.Time // capture time the post-roll ends at
	start   time.Time // the first sample's capture
	due     time.Time // clock time Tick closes it at if frames stop
}

// New starts a recorder; Close stops it.
func New(cfg Config) (*Recorder, error) {
	if cfg.NewEncoder == nil {
		return nil, fmt.Errorf("clips: no encoder")
	}
	if cfg.FPS <= 0 {
		cfg.FPS = 10
	}
	if cfg.KeyEvery <= 0 {
		cfg.KeyEvery = time.Second
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Slack <= 0 {
		cfg.Slack = 3 * time.Second
	}
	if cfg.RingBytes <= 0 {
		cfg.RingBytes = 64 << 20
	}
	if cfg.Queue <= 0 {
		cfg.Queue = 8
	}
	st, err := OpenStore(cfg.Dir, int64(cfg.Clips.MaxBytes), cfg.Clips.MaxAge, cfg.Clock)
	if err != nil {
		return nil, err
	}
	r := &Recorder{cfg: cfg, store: st, streams: map[string]*stream{}, queue: make(chan *clip, cfg.Queue)}
	r.done.Add(1)
	go r.writer()
	return r, nil
}

// Store is the recorder's directory of clips.
func (r *Recorder) Store() *Store { return r.store }

// Stats returns the counters.
func (r *Recorder) Stats() Stats {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.stats
	s.Removed, s.RemovedBytes = r.store.Removed()
	return s
}

// Frame encodes a stream's decoded frame into its ring, and into the clip
// being recorded; a frame past the clip's post-roll (or its max length)
// ends the clip, which is then written.
func (r *Recorder) Frame(name string, seq uint64, capture time.Time, f *media.Frame) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	if f == nil || f.Pix == nil || f.W < 2 || f.H < 2 {
		r.stats.FrameErrors++
		return
	}
	f = even(f)
	s := r.streams[name]
	if s == nil {
		s = &stream{name: name, ring: ring{keep: r.cfg.Clips.Pre + r.cfg.Slack + r.cfg.KeyEvery, maxBytes: r.cfg.RingBytes}}
		r.streams[name] = s
	}
	if s.enc != nil && (s.w != f.W || s.h != f.H) { // a new size: a new encoder, ring and clip
		r.cfg.Log.Warn("clips: frame size changed: the clip being recorded ends", "stream", name, "from", fmt.Sprintf("%dx%d", s.w, s.h), "to", fmt.Sprintf("%dx%d", f.W, f.H))
		r.finish(s)
		s.enc.Close()
		s.enc = nil
		s.ring.reset()
	}
	if s.enc == nil {
		enc, err := r.cfg.NewEncoder(f.W, f.H, r.cfg.FPS, r.cfg.Clips.BitrateKbps)
		if err != nil {
			r.stats.FrameErrors++
			r.cfg.Log.Error("clips: encoder", "stream", name, "err", err)
			return
		}
		s.enc, s.w, s.h, s.lastKey = enc, f.W, f.H, time.Time{}
	}
	if !s.last.IsZero() && !capture.After(s.last) {
		capture = s.last.Add(time.Millisecond) // captures must increase for sample durations
	}
	force := s.lastKey.IsZero() || capture.Sub(s.lastKey) >= r.cfg.KeyEvery
	au, key, err := s.enc.Encode(f, force)
	if err != nil {
		r.stats.FrameErrors++
		r.cfg.Log.Error("clips: encode", "stream", name, "seq", seq, "err", err)
		return
	}
	if au == nil {
		return
	}
	r.stats.Frames++
	if key {
		s.lastKey = capture
	}
	s.last, s.lastAt = capture, r.cfg.Clock.Now()
	smp := Sample{Seq: seq, Capture: capture, Key: key, Data: au}
	if c := s.open; c != nil {
		if capture.After(c.until) {
			r.finish(s)
		} else {
			c.samples = append(c.samples, smp)
			c.due = s.lastAt.Add(c.until.Sub(capture) + r.cfg.Slack)
			if capture.Sub(c.start) >= r.cfg.Clips.MaxLength {
				r.finish(s)
			}
		}
	}
	before := s.ring.dropped
	s.ring.push(smp)
	if d := s.ring.dropped - before; d > 0 {
		r.stats.RingDrops += int64(d)
		r.cfg.Log.Warn("clips: ring over its bytes: oldest video dropped", "stream", name, "gops", d, "max_bytes", r.cfg.RingBytes)
	}
}

// Event takes one event of a stream's frame seq (captured at capture, the
// time the frame's result reports; zero: the ring's record of seq, else
// the newest frame). An event the clips are on starts a clip, or extends
// the one being recorded.
func (r *Recorder) Event(name string, seq uint64, capture time.Time, e media.Event) {
	if !r.cfg.Clips.ClipOn(e.Kind, e.Rule) {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	r.stats.Events++
	s := r.streams[name]
	if s == nil || len(s.ring.samples) == 0 && s.open == nil {
		r.stats.Missed++
		r.cfg.Log.Warn("clips: event with no video recorded: no clip", "stream", name, "seq", seq, "kind", e.Kind, "rule", e.Rule)
		return
	}
	if capture.IsZero() {
		var ok bool
		if capture, ok = s.ring.capture(seq); !ok {
			capture = s.last
		}
	}
	ev := outputs.Event{Kind: e.Kind, Rule: e.Rule, Track: e.Track, Detail: e.Detail}
	now := r.cfg.Clock.Now()
	if c := s.open; c != nil {
		c.events = append(c.events, ev)
		c.until = maxTime(c.until, capture.Add(r.cfg.Clips.Post))
		if lim := c.start.Add(r.cfg.Clips.MaxLength); c.until.After(lim) {
			c.until = lim
		}
		c.due = now.Add(c.until.Sub(s.last) + r.cfg.Slack)
		r.stats.Extended++
		return
	}
	for len(s.starts) > 0 && now.Sub(s.starts[0]) >= time.Minute {
		s.starts = s.starts[1:]
	}
	if len(s.starts) >= r.cfg.Clips.PerMinute {
		r.stats.Limited++
		if s.limited {
			return
		}
		s.limited = true
		r.cfg.Log.Warn("clips: max_clips_per_stream_per_minute reached: no clip", "stream", name, "seq", seq, "kind", e.Kind, "rule", e.Rule, "limit", r.cfg.Clips.PerMinute, "note", "counted in clips' limited; logged once until a clip starts")
		return
	}
	s.starts, s.limited = append(s.starts, now), false
	smp := s.ring.from(capture.Add(-r.cfg.Clips.Pre))
	c := &clip{
		stream:  name,
		first:   outputs.Body{Schema: "mdag.output/v1", App: r.cfg.App, Stream: name, Kind: "event", Seq: seq, Capture: capture, Time: now, Event: &ev},
		events:  []outputs.Event{ev},
		samples: smp,
		start:   smp[0].Capture,
		until:   capture.Add(r.cfg.Clips.Post),
	}
	if lim := c.start.Add(r.cfg.Clips.MaxLength); c.until.After(lim) {
		c.until = lim
	}
	// frames after the post-roll already in the ring (late results) stay out
	for len(c.samples) > 1 && c.samples[len(c.samples)-1].Capture.After(c.until) {
		c.samples = c.samples[:len(c.samples)-1]
	}
	c.due = now.Add(c.until.Sub(s.last) + r.cfg.Slack)
	s.open = c
	if !s.last.Before(c.until) {
		r.finish(s)
	}
}

// Tick ends the clips whose streams stopped before their post-roll did
// (by the clock: the post-roll's time since the last frame, and Slack).
func (r *Recorder) Tick() {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.cfg.Clock.Now()
	for _, s := range r.streams {
		if s.open != nil && !now.Before(s.open.due) {
			r.finish(s)
		}
	}
}

// EndStream ends a stream: its clip being recorded is written as it is,
// its encoder and ring are freed.
func (r *Recorder) EndStream(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if s := r.streams[name]; s != nil {
		r.finish(s)
		if s.enc != nil {
			s.enc.Close()
		}
		delete(r.streams, name)
	}
}

// finish queues s's open clip for writing. r.mu held.
func (r *Recorder) finish(s *stream) {
	c := s.open
	if c == nil {
		return
	}
	s.open = nil
	r.inq.Add(1)
	select {
	case r.queue <- c:
	default:
		r.inq.Done()
		r.stats.WriteErrors++
		r.cfg.Log.Error("clips: writer behind: clip dropped", "stream", s.name, "start", c.start, "queue", cap(r.queue))
	}
}

// writer writes queued clips, one at a time.
func (r *Recorder) writer() {
	defer r.done.Done()
	for c := range r.queue {
		info, err := r.store.Write(c.first, c.events, c.samples, time.Second/time.Duration(r.cfg.FPS))
		r.mu.Lock()
		if err != nil {
			r.stats.WriteErrors++
			r.cfg.Log.Error("clips: write", "stream", c.stream, "start", c.start, "err", err)
		} else {
			r.stats.Clips++
			r.cfg.Log.Info("clips: written", "name", info.Name, "stream", c.stream, "frames", info.Frames, "duration", info.Duration, "bytes", info.Bytes)
		}
		r.mu.Unlock()
		r.inq.Done()
	}
}

// Sync waits for the clips ended so far to be written.
func (r *Recorder) Sync() { r.inq.Wait() }

// Close ends every stream (their clips are written) and stops the writer.
func (r *Recorder) Close() {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return
	}
	for name, s := range r.streams {
		r.finish(s)
		if s.enc != nil {
			s.enc.Close()
		}
		delete(r.streams, name)
	}
	r.closed = true
	close(r.queue)
	r.mu.Unlock()
	r.done.Wait()
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// even returns f cropped to even sides (the encoder's 4:2:0 needs them).
func even(f *media.Frame) *media.Frame {
	w, h := f.W&^1, f.H&^1
	if w == f.W && h == f.H {
		return f
	}
	pix := make([]byte, w*h*3)
	for y := range h {
		copy(pix[y*w*3:(y+1)*w*3], f.Pix[y*f.W*3:])
	}
	return &media.Frame{W: w, H: h, Pix: pix}
}
