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
	"context"
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
	Clock      clock.Clock  // default real
	Log        *slog.Logger // default slog.Default()
	// SLO is the app's latency objective: results arrive up to about that
	// late, so the ring keeps Pre+Slack with Slack at least SLO + 1 s.
	SLO       time.Duration
	Slack     time.Duration // the ring keeps Pre+Slack, for results that arrive late (default max(3 s, SLO + 1 s))
	RingBytes int           // per stream (default 64 MiB)
	// Queue is the clips waiting to be written (default 8). A stream's
	// goroutine waits for room (it is off the ingest path), so none is
	// dropped for a full queue, at Close or on a slow disk.
	Queue int
	// Idle ends a stream that has had no frame for this long (default
	// 30 s): its goroutine and encoder are freed, its open clip written.
	Idle time.Duration
	// FrameQueue is each stream's frames waiting for its encoder (default
	// 8): Frame only queues; a full queue drops the frame from the
	// recording (counted, logged, and noted in the clip's frames_dropped).
	FrameQueue int
	// MaxSide bounds the recorded picture (default 1280): a frame whose
	// longer side is over it is scaled down (nearest neighbour, aspect
	// kept) before it is encoded, on the stream's recording goroutine.
	MaxSide int
}

// Stats are a recorder's counters.
type Stats struct {
	Streams       int   // streams being recorded (each with its encoding goroutine)
	Frames        int64 // encoded into the rings
	FramesDropped int64 // not recorded: the stream's encoder was behind (its queue full)
	EncodeErrors  int64 // frames not recorded: no pixels, encoder errors
	Events        int64 // events seen that clips are on
	Extended      int64 // events that extended a clip being recorded
	Limited       int64 // events past max_clips_per_stream_per_minute: no clip
	Missed        int64 // events with no video in the ring
	Clips         int64 // clips written
	ClipBytes     int64 // their MP4s' bytes
	WriteErrors   int64 // clips not written (disk errors)
	Removed       int64 // clips removed by retention (ForBytes + ForAge)
	RemovedBytes  int64
	ForBytes      int64 // clips removed to fit max_bytes
	ForAge        int64 // clips removed as older than max_age
	RingDrops     int64 // GOPs dropped from rings to fit their bytes
	ShortPreRoll  int64 // clips started with less than Pre of video before the event (ring short: stream just started, results later than Slack, ring bytes)
	Reaped        int64 // streams ended by Tick after Idle without a frame
	Skipped       int64 // clips on disk at start that could not be indexed (left in place, not served)
}

// Recorder records the clips of one app's streams. Its methods are safe
// for concurrent use. Frame only queues the frame for the stream's own
// goroutine, which encodes it: the ingest path that calls Frame is never
// delayed by encoding.
type Recorder struct {
	cfg   Config
	store *Store

	mu      sync.Mutex
	streams map[string]*stream
	stats   Stats
	closed  bool
	missLog time.Time // the last "event with no video" log

	queue   chan *clip
	done    sync.WaitGroup // the writer
	inq     sync.WaitGroup // clips queued and not yet written
	workers sync.WaitGroup // the streams' encoding goroutines
	pending sync.WaitGroup // frames (and ends) queued and not yet taken by them
}

// job is a frame queued for a stream's encoder.
type job struct {
	seq     uint64
	capture time.Time
	at      time.Time // when it was queued (clock)
	f       *media.Frame
	gap     int // frames of the stream not recorded just before it
}

type seqCapture struct {
	seq     uint64
	capture time.Time
}

type stream struct {
	name string
	in   chan job // closed when the stream ends

	// the ingest side's, under Recorder.mu
	gap     int // frames not queued since the last queued one
	dropped int // frames dropped since the last log of it
	dropLog time.Time
	errLog  time.Time
	seen    time.Time      // the last Frame (clock)
	recent  [32]seqCapture // the newest queued frames' captures, by seq%32

	// the stream's goroutine's alone
	enc     Encoder
	w, h    int
	lastKey time.Time
	carry   int // frames not recorded since the last sample (encode errors, held back)

	// under Recorder.mu (written by the stream's goroutine)
	ring      ring
	last      time.Time // the newest sample's capture
	lastAt    time.Time // when it was queued (clock)
	open      *clip
	starts    []time.Time // clips started, by clock, within the last minute
	limited   bool        // the limit was logged (once per stretch of limited events)
	ready     []*clip     // finished clips the stream's goroutine hands to the writer
	ringLog   time.Time   // the last "ring over its bytes" log
	ringDrops int         // GOPs dropped since that log
	preLog    time.Time   // the last "short pre-roll" log
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
		cfg.Slack = max(3*time.Second, cfg.SLO+time.Second)
	}
	if cfg.Idle <= 0 {
		cfg.Idle = 30 * time.Second
	}
	if cfg.RingBytes <= 0 {
		cfg.RingBytes = 64 << 20
	}
	if cfg.Queue <= 0 {
		cfg.Queue = 8
	}
	if cfg.FrameQueue <= 0 {
		cfg.FrameQueue = 8
	}
	if cfg.MaxSide <= 0 {
		cfg.MaxSide = 1280
	}
	st, err := openStore(cfg.Dir, int64(cfg.Clips.MaxBytes), cfg.Clips.MaxAge, cfg.Clock, cfg.Log)
	if err != nil {
		return nil, err
	}
	r := &Recorder{cfg: cfg, store: st, streams: map[string]*stream{}, queue: make(chan *clip, cfg.Queue)}
	r.stats.Skipped = int64(st.Skipped())
	r.done.Add(1)
	go r.writer()
	return r, nil
}

// Store is the recorder's directory of clips.
func (r *Recorder) Store() *Store { return r.store }

// Stats returns the counters.
// The store's figures are read first, without r.mu: r.mu is never held
// while waiting for the store (whose lock a write may hold).
func (r *Recorder) Stats() Stats {
	rm := r.store.Removed()
	r.mu.Lock()
	s := r.stats
	s.Streams = len(r.streams)
	r.mu.Unlock()
	s.Removed, s.RemovedBytes, s.ForBytes, s.ForAge = rm.Clips, rm.Bytes, rm.ForBytes, rm.ForAge
	return s
}

// Frame queues a stream's decoded frame for the stream's encoder (its
// goroutine starts with the stream's first frame) and returns: it never
// waits for encoding. The frame is kept, not copied: frames are read-only
// once ingested (the decoders allocate each frame's pixels; the engine
// holds them too). A full queue drops the frame from the recording.
func (r *Recorder) Frame(name string, seq uint64, capture time.Time, f *media.Frame) {
	now := r.cfg.Clock.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	s := r.streams[name]
	if s == nil {
		s = &stream{name: name, in: make(chan job, r.cfg.FrameQueue), ring: ring{keep: r.cfg.Clips.Pre + r.cfg.Slack + r.cfg.KeyEvery, maxBytes: r.cfg.RingBytes}}
		r.streams[name] = s
		r.workers.Add(1)
		go r.run(s)
	}
	s.seen = now
	s.recent[seq%uint64(len(s.recent))] = seqCapture{seq, capture}
	if f == nil || f.W < 2 || f.H < 2 || len(f.Pix) < f.W*f.H*3 {
		s.gap++
		r.stats.EncodeErrors++
		r.errorEvery(s, now, "clips: a frame without pixels: not recorded", "seq", seq)
		return
	}
	r.pending.Add(1)
	select {
	case s.in <- job{seq: seq, capture: capture, at: now, f: f, gap: s.gap}:
		s.gap = 0
	default:
		r.pending.Done()
		s.gap++
		s.dropped++
		r.stats.FramesDropped++
		if now.Sub(s.dropLog) >= time.Minute {
			r.cfg.Log.Warn("clips: the stream's encoder is behind: frames dropped from its recording", "stream", name, "dropped", s.dropped,
				"queue", cap(s.in), "note", "counted in mdag_clips_frames_dropped_total; clips note them in frames_dropped; logged at most once a minute per stream")
			s.dropLog, s.dropped = now, 0
		}
	}
}

// every reports whether a log last made at *last may be made again at now
// (at most once a minute), and if so notes now.
func every(last *time.Time, now time.Time) bool {
	if !last.IsZero() && now.Sub(*last) < time.Minute {
		return false
	}
	*last = now
	return true
}

// errorEvery logs an error of s's recording at most once a minute. r.mu held.
func (r *Recorder) errorEvery(s *stream, now time.Time, msg string, args ...any) {
	if !s.errLog.IsZero() && now.Sub(s.errLog) < time.Minute {
		return
	}
	s.errLog = now
	r.cfg.Log.Error(msg, append([]any{"stream", s.name, "note", "counted in mdag_clips_encode_errors_total; logged at most once a minute per stream"}, args...)...)
}

// run is a stream's goroutine: it encodes the stream's queued frames until
// the stream ends, then writes its clip being recorded.
func (r *Recorder) run(s *stream) {
	defer r.workers.Done()
	for j := range s.in {
		if j.f != nil { // nil: a wake-up to hand finished clips to the writer
			r.encode(s, j)
		}
		r.handOver(s)
		r.pending.Done()
	}
	r.mu.Lock()
	r.finish(s)
	r.mu.Unlock()
	r.handOver(s)
	if s.enc != nil {
		s.enc.Close()
	}
	r.pending.Done() // the end
}

// handOver queues s's finished clips for the writer, waiting for room
// (without r.mu: the writer takes it): nothing is dropped for a full
// queue. Only s's goroutine calls it.
func (r *Recorder) handOver(s *stream) {
	r.mu.Lock()
	ready := s.ready
	s.ready = nil
	r.mu.Unlock()
	for _, c := range ready {
		r.queue <- c
	}
}

// encode encodes one queued frame into s's ring and the clip being
// recorded; a frame past the clip's post-roll (or its max length) ends
// the clip, which is then written.
func (r *Recorder) encode(s *stream, j job) {
	f := scale(even(j.f), r.cfg.MaxSide)
	gap := j.gap + s.carry
	s.carry = gap                                   // until a sample takes it
	if s.enc != nil && (s.w != f.W || s.h != f.H) { // a new size: a new encoder, ring and clip
		r.cfg.Log.Warn("clips: frame size changed: the clip being recorded ends", "stream", s.name, "from", fmt.Sprintf("%dx%d", s.w, s.h), "to", fmt.Sprintf("%dx%d", f.W, f.H))
		r.mu.Lock()
		r.finish(s)
		s.ring.reset()
		r.mu.Unlock()
		s.enc.Close()
		s.enc = nil
	}
	if s.enc == nil {
		enc, err := r.cfg.NewEncoder(f.W, f.H, r.cfg.FPS, r.cfg.Clips.BitrateKbps)
		if err != nil {
			r.mu.Lock()
			s.carry++
			r.stats.EncodeErrors++
			r.errorEvery(s, j.at, "clips: encoder", "size", fmt.Sprintf("%dx%d", f.W, f.H), "err", err)
			r.mu.Unlock()
			return
		}
		s.enc, s.w, s.h, s.lastKey = enc, f.W, f.H, time.Time{}
	}
	capture := j.capture
	if !s.last.IsZero() && !capture.After(s.last) { // s.last: only this goroutine writes it
		capture = s.last.Add(time.Millisecond) // captures must increase for sample durations
	}
	force := s.lastKey.IsZero() || capture.Sub(s.lastKey) >= r.cfg.KeyEvery
	au, key, err := s.enc.Encode(f, force)
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		s.carry++
		r.stats.EncodeErrors++
		r.errorEvery(s, j.at, "clips: encode", "seq", j.seq, "err", err)
		return
	}
	if au == nil {
		s.carry++ // held back: a gap in the clip all the same
		return
	}
	r.stats.Frames++
	if key {
		s.lastKey = capture
	}
	s.carry = 0
	s.last, s.lastAt = capture, j.at
	smp := Sample{Seq: j.seq, Capture: capture, Key: key, Data: au, Gap: gap}
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
		s.ringDrops += d
		if every(&s.ringLog, j.at) {
			r.cfg.Log.Warn("clips: ring over its bytes: oldest video dropped", "stream", s.name, "gops", s.ringDrops, "max_bytes", r.cfg.RingBytes,
				"note", "counted in mdag_clips_ring_drops_total; logged at most once a minute per stream")
			s.ringDrops = 0
		}
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
	now := r.cfg.Clock.Now()
	if s == nil || len(s.ring.samples) == 0 && s.open == nil {
		r.stats.Missed++
		if every(&r.missLog, now) {
			r.cfg.Log.Warn("clips: event with no video recorded: no clip", "stream", name, "seq", seq, "kind", e.Kind, "rule", e.Rule,
				"note", "counted in mdag_clips_missed_total; logged at most once a minute")
		}
		return
	}
	if capture.IsZero() {
		var ok bool
		if capture, ok = s.ring.capture(seq); !ok {
			if rc := s.recent[seq%uint64(len(s.recent))]; rc.seq == seq && !rc.capture.IsZero() { // queued, not yet encoded
				capture = rc.capture
			} else {
				capture = s.last
			}
		}
	}
	ev := outputs.Event{Kind: e.Kind, Rule: e.Rule, Track: e.Track, Detail: e.Detail}
	if c := s.open; c != nil && capture.After(c.start.Add(r.cfg.Clips.MaxLength)) {
		// past what the open clip may hold: it ends, a new one starts
		r.finish(s)
		r.wake(s)
	}
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
	if len(s.ring.samples) == 0 { // the clip being recorded just ended; no video since
		r.stats.Missed++
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
	if short := smp[0].Capture.Sub(capture.Add(-r.cfg.Clips.Pre)); short > 0 {
		r.stats.ShortPreRoll++
		if every(&s.preLog, now) {
			r.cfg.Log.Warn("clips: less pre-roll than pre: the ring holds no older video", "stream", name, "seq", seq, "short_by", short, "pre", r.cfg.Clips.Pre, "slack", r.cfg.Slack,
				"note", "the stream just started, its result came later than the slack, or the ring hit its bytes; counted in clips' short pre-roll; logged at most once a minute per stream")
		}
	}
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
		r.wake(s)
	}
}

// Tick ends the clips whose streams stopped before their post-roll did
// (by the clock: the post-roll's time since the last frame, and Slack).
func (r *Recorder) Tick() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	now := r.cfg.Clock.Now()
	for name, s := range r.streams {
		if now.Sub(s.seen) >= r.cfg.Idle {
			// no frame for long: the stream left (or a late frame of a
			// stream that had left made it again); its goroutine writes
			// the open clip, frees the encoder and exits
			r.stats.Reaped++
			r.cfg.Log.Info("clips: no frame for a while: the stream's recording ends", "stream", name, "idle", now.Sub(s.seen).Round(time.Second),
				"open_clip", s.open != nil, "note", "counted in clips' reaped")
			r.end(name)
			continue
		}
		if s.open != nil && !now.Before(s.open.due) {
			r.finish(s)
			r.wake(s)
		}
	}
}

// EndStream ends a stream: its goroutine encodes the frames queued, writes
// the clip being recorded as it is, frees the encoder and the ring, and
// exits. It does not wait for that (Sync does).
func (r *Recorder) EndStream(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.end(name)
}

// end ends stream name's recording. r.mu held.
func (r *Recorder) end(name string) {
	if s := r.streams[name]; s != nil {
		delete(r.streams, name)
		r.pending.Add(1) // the goroutine's end
		close(s.in)
	}
}

// finish ends s's open clip: s's goroutine hands it to the writer (after
// the job it is on; wake makes it, when the clip ended off that
// goroutine). r.mu held.
func (r *Recorder) finish(s *stream) {
	c := s.open
	if c == nil {
		return
	}
	s.open = nil
	r.inq.Add(1)
	s.ready = append(s.ready, c)
}

// wake makes s's goroutine hand its finished clips over: a job with no
// frame, unless its queue is full (it then does after the jobs queued).
// s is in r.streams (its queue open). r.mu held.
func (r *Recorder) wake(s *stream) {
	r.pending.Add(1)
	select {
	case s.in <- job{}:
	default:
		r.pending.Done()
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
			r.cfg.Log.Error("clips: write", "stream", c.stream, "start", c.start, "err", err, "note", "counted in mdag_clips_write_errors_total")
		} else {
			r.stats.Clips++
			r.stats.ClipBytes += info.Bytes
			lvl := slog.LevelInfo
			if info.FramesDropped > 0 {
				lvl = slog.LevelWarn
			}
			r.cfg.Log.Log(context.Background(), lvl, "clips: written", "name", info.Name, "stream", c.stream, "frames", info.Frames, "frames_dropped", info.FramesDropped,
				"duration", info.Duration, "bytes", info.Bytes)
		}
		r.mu.Unlock()
		r.inq.Done()
	}
}

// Sync waits for the frames queued so far to be encoded and the clips
// ended so far to be written (tests: it keeps them deterministic; no
// Frame, Event or EndStream may run while it waits).
func (r *Recorder) Sync() {
	r.pending.Wait()
	r.inq.Wait()
}

// Close ends every stream (their queued frames are encoded and their
// clips written), waits for the streams' goroutines and stops the writer.
func (r *Recorder) Close() {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return
	}
	r.closed = true
	for name := range r.streams {
		r.end(name)
	}
	r.mu.Unlock()
	r.workers.Wait()
	close(r.queue) // no goroutine finishes a clip any more
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

// scale returns f scaled down (nearest neighbour, aspect kept, even sides)
// so that its longer side is at most side; f itself when it fits. A 1920
// wide frame costs the encoder over twice a 1280 one's, for detail a clip
// seldom needs.
func scale(f *media.Frame, side int) *media.Frame {
	if f.W <= side && f.H <= side {
		return f
	}
	w, h := side, f.H*side/f.W
	if f.H > f.W {
		w, h = f.W*side/f.H, side
	}
	w, h = max(w&^1, 2), max(h&^1, 2)
	xs := make([]int, w)
	for x := range xs {
		xs[x] = (x * f.W / w) * 3
	}
	pix := make([]byte, w*h*3)
	for y := range h {
		src := f.Pix[(y*f.H/h)*f.W*3:]
		dst := pix[y*w*3 : (y+1)*w*3]
		for x, sx := range xs {
			d, s := dst[x*3:x*3+3:x*3+3], src[sx:sx+3:sx+3]
			d[0], d[1], d[2] = s[0], s[1], s[2]
		}
	}
	return &media.Frame{W: w, H: h, Pix: pix}
}
