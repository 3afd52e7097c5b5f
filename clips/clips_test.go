package clips

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/media"
	"github.com/mdag/mdag/outputs"
)

// A real SPS (1920x1080, baseline) for the MP4 header; the pictures are
// stand-ins (the logic tests check frame counts and timing, not pixels).
var testSPS = []byte{0x67, 0x42, 0xc0, 0x28, 0xd9, 0x00, 0x78, 0x02, 0x27, 0xe5, 0x84, 0x00, 0x00, 0x03, 0x00, 0x04,
	0x00, 0x00, 0x03, 0x00, 0xf0, 0x3c, 0x60, 0xc9, 0x20}

var testPPS = []byte{0x68, 0xce, 0x3c, 0x80}

// fakeEncoder makes an access unit per frame: a key frame when asked.
type fakeEncoder struct {
	mu     sync.Mutex
	n      int
	closed bool
	size   int // picture bytes
}

func (e *fakeEncoder) Encode(f *media.Frame, key bool) ([]byte, bool, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.n++
	pic := make([]byte, max(e.size, 8))
	pic[0], pic[1] = 0x41, 0x9a
	if key {
		pic[0] = 0x65
		au := append([]byte{0, 0, 0, 1}, testSPS...)
		au = append(au, 0, 0, 0, 1)
		au = append(au, testPPS...)
		au = append(au, 0, 0, 0, 1)
		return append(au, pic...), true, nil
	}
	return append([]byte{0, 0, 0, 1}, pic...), false, nil
}

func (e *fakeEncoder) Close() { e.closed = true }

var t0 = time.Date(2026, 11, 29, 9, 0, 0, 0, time.UTC)

type rig struct {
	t   *testing.T
	clk *clock.Fake
	r   *Recorder
	dir string
	seq uint64
}

func newRig(t *testing.T, c dag.Clips) *rig {
	t.Helper()
	if c.MaxLength == 0 {
		c.MaxLength = time.Minute
	}
	if c.MaxBytes == 0 {
		c.MaxBytes = 1 << 30
	}
	if c.MaxAge == 0 {
		c.MaxAge = time.Hour
	}
	if c.PerMinute == 0 {
		c.PerMinute = 6
	}
	clk := clock.NewFake(t0)
	dir := t.TempDir()
	r, err := New(Config{App: "t", Clips: c, Dir: dir, FPS: 10, Clock: clk,
		Log:        slog.New(slog.DiscardHandler),
		NewEncoder: func(w, h, fps, kbps int) (Encoder, error) { return &fakeEncoder{}, nil }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return &rig{t: t, clk: clk, r: r, dir: dir}
}

var tiny = &media.Frame{W: 4, H: 4, Pix: make([]byte, 48)}

// frames feeds n frames at 10 fps (capture = t0 + seq*100ms), the clock
// following.
func (g *rig) frames(n int) {
	for range n {
		at := t0.Add(time.Duration(g.seq) * 100 * time.Millisecond)
		g.clk.Set(at.Add(50 * time.Millisecond))
		g.r.Frame("cam", g.seq, at, tiny)
		g.r.Sync() // encoded before the next: no frame dropped from the queue
		g.seq++
	}
}

func (g *rig) event(seq uint64, kind string) {
	g.r.Event("cam", seq, time.Time{}, media.Event{Kind: kind, Rule: "r", Track: 7})
}

// written returns the clips written, oldest first, with their sidecars.
func (g *rig) written() []Sidecar {
	g.r.Sync()
	var out []Sidecar
	infos := g.r.Store().List()
	for i := len(infos) - 1; i >= 0; i-- {
		b, err := os.ReadFile(filepath.Join(g.dir, strings.TrimSuffix(infos[i].Name, ".mp4")+".json"))
		if err != nil {
			g.t.Fatal(err)
		}
		var sc Sidecar
		if err := json.Unmarshal(b, &sc); err != nil {
			g.t.Fatal(err)
		}
		out = append(out, sc)
	}
	return out
}

func at(seq int) time.Time { return t0.Add(time.Duration(seq) * 100 * time.Millisecond) }

// TestPrePostRoll: an event's clip runs from the key frame at or before
// its pre-roll to the end of its post-roll, and its JSON is the event's
// message.
func TestPrePostRoll(t *testing.T) {
	for _, c := range []struct {
		event, first, last int
	}{
		{50, 30, 60}, // pre 2s: 3.0 s, a key frame (one every second: seq 0, 10, ...)
		{55, 30, 65}, // 3.5 s: back to the key frame at 3.0 s
		{59, 30, 69},
		{61, 40, 71},
		{5, 0, 15}, // less video than the pre-roll: from the first frame
	} {
		g := newRig(t, dag.Clips{Pre: 2 * time.Second, Post: time.Second})
		g.frames(c.event + 3) // the result comes three frames late
		g.event(uint64(c.event), "line-cross")
		g.frames(100 - c.event - 3)
		w := g.written()
		if len(w) != 1 {
			t.Fatalf("event %d: %d clips", c.event, len(w))
		}
		ci := w[0].Clip
		if ci.Frames != c.last-c.first+1 || !ci.Start.Equal(at(c.first)) || ci.Duration != time.Duration(c.last-c.first+1)*100*time.Millisecond {
			t.Errorf("event %d: clip %+v: want frames %d..%d", c.event, ci, c.first, c.last)
		}
		if w[0].Kind != "event" || w[0].Event.Kind != "line-cross" || w[0].Seq != uint64(c.event) || !w[0].Capture.Equal(at(c.event)) || w[0].Schema != "mdag.output/v1" || w[0].Stream != "cam" {
			t.Errorf("event %d: sidecar %+v", c.event, w[0].Body)
		}
	}
}

// TestOverlap: events inside a clip being recorded extend it; one after
// it ends starts another.
func TestOverlap(t *testing.T) {
	g := newRig(t, dag.Clips{Pre: 2 * time.Second, Post: time.Second})
	g.frames(52)
	g.event(50, "line-cross")
	g.frames(9)
	g.event(58, "dwell") // until 6.8 s
	g.frames(17)         // to seq 77: the clip ended at 69
	g.event(75, "loiter")
	g.frames(22)
	w := g.written()
	if len(w) != 2 {
		t.Fatalf("%d clips, want 2", len(w))
	}
	if c := w[0].Clip; c.Frames != 39 || !c.Start.Equal(at(30)) || len(c.Events) != 2 || c.Events[1].Kind != "dwell" {
		t.Errorf("first clip %+v: want seq 30..68, two events", c)
	}
	if c := w[1].Clip; c.Frames != 36 || !c.Start.Equal(at(50)) { // 5.5 s back to the key frame at 5 s, to 8.5 s
		t.Errorf("second clip %+v", c)
	}
	if s := g.r.Stats(); s.Events != 3 || s.Extended != 1 || s.Clips != 2 {
		t.Errorf("stats %+v", s)
	}
}

// TestMaxLengthAndLimit: a clip stops at max_length however many events
// extend it; clips per stream per minute are capped, the rest counted.
func TestMaxLengthAndLimit(t *testing.T) {
	g := newRig(t, dag.Clips{Pre: time.Second, Post: 2 * time.Second, MaxLength: 4 * time.Second, PerMinute: 2})
	g.frames(20)
	for i := 0; i < 100; i++ { // an event every frame for 10 s
		g.event(g.seq-1, "dwell")
		g.frames(1)
	}
	g.frames(30)
	w := g.written()
	if len(w) != 2 {
		t.Fatalf("%d clips, want 2 (the limit)", len(w))
	}
	for _, sc := range w {
		if sc.Clip.Duration > 4*time.Second+100*time.Millisecond {
			t.Errorf("clip %v longer than max_length", sc.Clip.Duration)
		}
	}
	if s := g.r.Stats(); s.Limited == 0 {
		t.Errorf("stats %+v: want events limited", s)
	}
}

// TestOn: only the events clips are on make clips.
func TestOn(t *testing.T) {
	g := newRig(t, dag.Clips{Pre: time.Second, Post: time.Second, On: []string{"dwell"}})
	g.frames(20)
	g.event(19, "line-cross")
	g.frames(30)
	if w := g.written(); len(w) != 0 {
		t.Fatalf("%d clips for an event clips are not on", len(w))
	}
}

// TestStreamStops: a clip whose stream stops before its post-roll ends is
// written when the clock passes it (Tick), or when the stream ends.
func TestStreamStops(t *testing.T) {
	g := newRig(t, dag.Clips{Pre: 2 * time.Second, Post: 5 * time.Second})
	g.frames(50)
	g.event(48, "dwell")
	g.r.Tick()
	if w := g.written(); len(w) != 0 {
		t.Fatal("written before its post-roll")
	}
	g.clk.Advance(5 * time.Second) // 4.8 s of post-roll left + 3 s slack
	g.r.Tick()
	if w := g.written(); len(w) != 0 {
		t.Fatal("written before the slack")
	}
	g.clk.Advance(3 * time.Second)
	g.r.Tick()
	if w := g.written(); len(w) != 1 || w[0].Clip.Frames != 30 {
		t.Fatalf("after the post-roll: %+v", w)
	}
	g.frames(10)
	g.event(59, "dwell")
	g.r.EndStream("cam")
	if w := g.written(); len(w) != 2 {
		t.Fatalf("after EndStream: %d clips", len(w))
	}
}

// TestRingBounds: the ring keeps pre-roll, slack and a GOP; bytes drop
// whole GOPs, counted.
func TestRingBounds(t *testing.T) {
	r := ring{keep: 2 * time.Second, maxBytes: 1 << 20}
	for i := range 100 {
		r.push(Sample{Seq: uint64(i), Capture: at(i), Key: i%10 == 0, Data: make([]byte, 100)})
	}
	if r.samples[0].Seq != 70 || len(r.samples) != 30 || r.bytes != 3000 {
		t.Errorf("ring from %d, %d samples, %d bytes: want 70, 30, 3000", r.samples[0].Seq, len(r.samples), r.bytes)
	}
	r = ring{keep: time.Hour, maxBytes: 2500}
	for i := range 100 {
		r.push(Sample{Seq: uint64(i), Capture: at(i), Key: i%10 == 0, Data: make([]byte, 100)})
	}
	if r.samples[0].Seq != 80 || r.bytes > 2500 || r.dropped != 8 {
		t.Errorf("ring from %d, %d bytes, %d dropped: want 80, <= 2500, 8", r.samples[0].Seq, r.bytes, r.dropped)
	}
	r = ring{keep: time.Hour, maxBytes: 1000}
	r.push(Sample{Seq: 1, Capture: at(1), Data: []byte{1}})
	if len(r.samples) != 0 {
		t.Error("a ring starts at a key frame")
	}
}

// TestRetention: the oldest clips go, by bytes and by age; a reopened
// store finds the clips on disk.
func TestRetention(t *testing.T) {
	clk := clock.NewFake(t0)
	dir := t.TempDir()
	st, err := OpenStore(dir, 1<<40, time.Hour, clk)
	if err != nil {
		t.Fatal(err)
	}
	write := func(st *Store, start time.Time, n int) Info {
		var smp []Sample
		enc := &fakeEncoder{size: 1000}
		for i := range n {
			au, key, _ := enc.Encode(nil, i == 0)
			smp = append(smp, Sample{Seq: uint64(i), Capture: start.Add(time.Duration(i) * 100 * time.Millisecond), Key: key, Data: au})
		}
		info, err := st.Write(testBody("cam"), nil, smp, 100*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		return info
	}
	var infos []Info
	for i := range 5 {
		infos = append(infos, write(st, t0.Add(time.Duration(i)*time.Minute), 20))
	}
	if len(st.List()) != 5 || st.List()[0].Name != infos[4].Name {
		t.Fatalf("list: %+v", st.List())
	}
	// by bytes: room for three
	st2, err := OpenStore(dir, 3*infos[0].Bytes+infos[0].Bytes/2, time.Hour, clk)
	if err != nil {
		t.Fatal(err)
	}
	if l := st2.List(); len(l) != 3 || l[2].Name != infos[2].Name {
		t.Fatalf("by bytes: %+v", l)
	}
	for _, i := range infos[:2] {
		for _, p := range []string{i.Name, strings.TrimSuffix(i.Name, ".mp4") + ".json"} {
			if _, err := os.Stat(filepath.Join(dir, p)); !os.IsNotExist(err) {
				t.Errorf("%s not removed: %v", p, err)
			}
		}
	}
	if rm := st2.Removed(); rm.Clips != 2 || rm.Bytes != infos[0].Bytes+infos[1].Bytes {
		t.Errorf("removed %+v", rm)
	}
	// by age: an hour after the fourth began, it and the third go on the next write
	clk.Set(t0.Add(time.Hour + 3*time.Minute + time.Second))
	write(st2, clk.Now(), 5)
	if l := st2.List(); len(l) != 2 || l[1].Name != infos[4].Name {
		t.Fatalf("by age: %+v", l)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 4 {
		t.Errorf("%d files, want 2 clips and their JSON", len(ents))
	}
	if rm := st2.Removed(); rm.Clips != 4 || rm.ForBytes != 2 || rm.ForAge != 2 {
		t.Errorf("removed %+v: want 2 for bytes, 2 for age", rm)
	}
}

func testBody(stream string) (b outputsBody) {
	b.Schema, b.Kind, b.Stream, b.App = "mdag.output/v1", "event", stream, "t"
	return b
}

func TestEvenCrop(t *testing.T) {
	f := &media.Frame{W: 5, H: 3, Pix: make([]byte, 45)}
	for i := range f.Pix {
		f.Pix[i] = byte(i)
	}
	e := even(f)
	if e.W != 4 || e.H != 2 || e.Pix[12] != 15 || fmt.Sprint(e.Pix[:3]) != "[0 1 2]" {
		t.Errorf("even: %dx%d %v", e.W, e.H, e.Pix)
	}
}

type outputsBody = outputs.Body

// gatedEncoder encodes a frame for each token in gate, and says so on
// entered when it starts one.
type gatedEncoder struct {
	fakeEncoder
	gate    chan struct{}
	entered chan struct{}
}

func (e *gatedEncoder) Encode(f *media.Frame, key bool) ([]byte, bool, error) {
	e.entered <- struct{}{}
	<-e.gate
	return e.fakeEncoder.Encode(f, key)
}

// TestQueueFull: Frame never waits for the encoder; frames past a full
// queue are dropped from the recording, counted, logged once, and noted in
// the clip.
func TestQueueFull(t *testing.T) {
	clk := clock.NewFake(t0)
	enc := &gatedEncoder{gate: make(chan struct{}, 100), entered: make(chan struct{}, 100)}
	logs := &syncWriter{w: &strings.Builder{}}
	r, err := New(Config{App: "t", Dir: t.TempDir(), FPS: 10, Clock: clk, FrameQueue: 4,
		Log:        slog.New(slog.NewTextHandler(logs, nil)),
		Clips:      dag.Clips{Pre: 2 * time.Second, Post: time.Second, MaxLength: time.Minute, MaxBytes: 1 << 30, MaxAge: time.Hour, PerMinute: 6},
		NewEncoder: func(w, h, fps, kbps int) (Encoder, error) { return enc, nil }})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	feed := func(i int) {
		clk.Set(at(i))
		r.Frame("cam", uint64(i), at(i), tiny)
	}
	for i := range 20 { // encoded one by one
		enc.gate <- struct{}{}
		feed(i)
		r.Sync()
	}
	// the encoder stalls on frame 20; 21..24 fill the queue; 25..29 are dropped
	feed(20)
	for range 21 {
		<-enc.entered
	}
	for i := 21; i < 30; i++ {
		feed(i) // returns at once: the encoder is stuck
	}
	if s := r.Stats(); s.FramesDropped != 5 || s.Frames != 20 {
		t.Errorf("stats %+v: want 5 dropped, 20 encoded", s)
	}
	for range 5 {
		enc.gate <- struct{}{}
	}
	r.Sync()
	for i := 30; i < 60; i++ {
		enc.gate <- struct{}{}
		feed(i)
		if i == 31 { // a dropped frame's event: its capture is known all the same
			r.Event("cam", 28, time.Time{}, media.Event{Kind: "dwell", Rule: "r"})
		}
		r.Sync()
	}
	// pre-roll from 0.8 s: the key frame at 0; post-roll to 3.8 s: frames
	// 0..38 less the 5 dropped
	list := r.Store().List()
	if len(list) != 1 || list[0].FramesDropped != 5 || list[0].Frames != 34 {
		t.Fatalf("clips %+v: want one of 34 frames, 5 dropped", list)
	}
	if n := strings.Count(logs.String(), "frames dropped from its recording"); n != 1 {
		t.Errorf("%d drop logs, want 1 (once a minute per stream):\n%s", n, logs.String())
	}
	if !strings.Contains(logs.String(), "frames_dropped=5") {
		t.Errorf("the clip's log does not say frames_dropped=5:\n%s", logs.String())
	}
}

type syncWriter struct {
	mu sync.Mutex
	w  *strings.Builder
}

func (s *syncWriter) Write(b []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(b)
}

func (s *syncWriter) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.String()
}

// TestNoLeak: each stream's goroutine ends with the stream, and Close
// ends the rest; their encoders are closed.
func TestNoLeak(t *testing.T) {
	before := runtime.NumGoroutine()
	var encs []*fakeEncoder
	var mu sync.Mutex
	r, err := New(Config{App: "t", Dir: t.TempDir(), FPS: 10, Clock: clock.NewFake(t0), Log: slog.New(slog.DiscardHandler),
		Clips: dag.Clips{Pre: time.Second, Post: time.Second, MaxLength: time.Minute, MaxBytes: 1 << 30, MaxAge: time.Hour, PerMinute: 6},
		NewEncoder: func(w, h, fps, kbps int) (Encoder, error) {
			mu.Lock()
			defer mu.Unlock()
			e := &fakeEncoder{}
			encs = append(encs, e)
			return e, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		r.Frame(fmt.Sprint("s", i), 0, t0, tiny)
	}
	r.Sync()
	if s := r.Stats(); s.Streams != 5 {
		t.Fatalf("%d streams", s.Streams)
	}
	r.EndStream("s0")
	r.EndStream("s1")
	r.Sync()
	if s := r.Stats(); s.Streams != 3 {
		t.Fatalf("%d streams after two ended", s.Streams)
	}
	r.Close()
	r.Frame("s9", 0, t0, tiny) // after Close: ignored, no goroutine
	mu.Lock()
	for i, e := range encs {
		if !e.closed {
			t.Errorf("encoder %d not closed", i)
		}
	}
	mu.Unlock()
	// every goroutine was waited for (Close returns after they are done);
	// the runtime counts one until it has exited, so allow it to finish
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if runtime.NumGoroutine() <= before {
			return
		}
	}
	buf := make([]byte, 1<<16)
	t.Errorf("goroutines: %d before, %d after Close\n%s", before, runtime.NumGoroutine(), buf[:runtime.Stack(buf, true)])
}

// TestScale: frames over MaxSide are scaled down, aspect kept, sides even.
func TestScale(t *testing.T) {
	f := media.NewFrame(1920, 1080)
	for i := range f.Pix {
		f.Pix[i] = byte(i / 3 % 1920 * 255 / 1919)
	}
	g := scale(f, 1280)
	if g.W != 1280 || g.H != 720 || len(g.Pix) != 1280*720*3 || g.Pix[0] != 0 || g.Pix[len(g.Pix)-1] < 250 {
		t.Errorf("1920x1080 -> %dx%d", g.W, g.H)
	}
	if g := scale(media.NewFrame(1081, 1921), 1280); g.W != 720 || g.H != 1280 {
		t.Errorf("1081x1921 -> %dx%d", g.W, g.H)
	}
	if g := scale(f, 1920); g != f {
		t.Error("a frame that fits is not copied")
	}
}

// TestSizeChange: a stream whose frame size changes ends the clip being
// recorded (written), and records on at the new size with a new encoder.
func TestSizeChange(t *testing.T) {
	g := newRig(t, dag.Clips{Pre: time.Second, Post: 5 * time.Second})
	g.frames(20)
	g.event(18, "dwell")
	g.clk.Set(at(20))
	g.r.Frame("cam", 20, at(20), &media.Frame{W: 6, H: 6, Pix: make([]byte, 108)})
	g.r.Sync()
	w := g.written()
	if len(w) != 1 || w[0].Clip.Frames != 20 { // from the key frame at 0 (pre-roll to 0.8 s) to the last 4x4 frame
		t.Fatalf("after the size change: %+v", w)
	}
	if s := g.r.Stats(); s.Frames != 21 || s.EncodeErrors != 0 {
		t.Errorf("stats %+v", s)
	}
}

// samples makes n fake samples from start at 10 fps, a key frame first.
func samples(start time.Time, n int) []Sample {
	var smp []Sample
	enc := &fakeEncoder{size: 100}
	for i := range n {
		au, key, _ := enc.Encode(nil, i == 0)
		smp = append(smp, Sample{Seq: uint64(i), Capture: start.Add(time.Duration(i) * 100 * time.Millisecond), Key: key, Data: au})
	}
	return smp
}

// TestNames: clips that would share a name (same start, first frame and
// event; streams sanitised alike; no name left) get their own, none
// replaced, and a reopened store indexes them all.
func TestNames(t *testing.T) {
	dir := t.TempDir()
	st, err := OpenStore(dir, 1<<40, time.Hour, clock.NewFake(t0))
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, stream := range []string{"cam", "cam", "a/b", "a b", "", "///"} {
		info, err := st.Write(testBody(stream), nil, samples(t0, 5), 100*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if names[info.Name] || !nameRE.MatchString(info.Name) {
			t.Errorf("stream %q: name %q taken or not the store's pattern", stream, info.Name)
		}
		names[info.Name] = true
	}
	st2, err := OpenStore(dir, 1<<40, time.Hour, clock.NewFake(t0))
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := st2.Usage(); n != 6 || st2.Skipped() != 0 {
		t.Errorf("reopened: %d clips, %d skipped; want 6, 0", n, st2.Skipped())
	}
}

// TestOpenStoreSkips: a clip without a readable JSON is skipped (not a
// failure to open); leftover temporary files and JSONs without their MP4
// are removed.
func TestOpenStoreSkips(t *testing.T) {
	dir := t.TempDir()
	st, err := OpenStore(dir, 1<<40, time.Hour, clock.NewFake(t0))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Write(testBody("cam"), nil, samples(t0, 5), 100*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string]string{
		"20261129T090100000Z-cam-0-0.mp4":  "mp4 without json",
		"20261129T090200000Z-cam-0-0.mp4":  "mp4",
		"20261129T090200000Z-cam-0-0.json": "{not json",
		"20261129T090300000Z-cam-0-0.json": "{}", // its MP4 never written
		".clip-123":                        "temp",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(b), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	st2, err := OpenStore(dir, 1<<40, time.Hour, clock.NewFake(t0))
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := st2.Usage(); n != 1 || st2.Skipped() != 2 {
		t.Errorf("%d clips, %d skipped; want 1, 2", n, st2.Skipped())
	}
	for _, gone := range []string{".clip-123", "20261129T090300000Z-cam-0-0.json"} {
		if _, err := os.Stat(filepath.Join(dir, gone)); err == nil {
			t.Errorf("%s not removed", gone)
		}
	}
}

// TestCloseManyOpen: Close writes every open clip, more than the writer's
// queue holds: none is dropped.
func TestCloseManyOpen(t *testing.T) {
	clk := clock.NewFake(t0)
	r, err := New(Config{App: "t", Dir: t.TempDir(), FPS: 10, Clock: clk, Log: slog.New(slog.DiscardHandler), Queue: 2,
		Clips:      dag.Clips{Pre: time.Second, Post: 30 * time.Second, MaxLength: time.Minute, MaxBytes: 1 << 30, MaxAge: time.Hour, PerMinute: 6},
		NewEncoder: func(w, h, fps, kbps int) (Encoder, error) { return &fakeEncoder{}, nil }})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		name := fmt.Sprint("s", i)
		for seq := range 5 {
			r.Frame(name, uint64(seq), at(seq), tiny)
		}
		r.Sync()
		r.Event(name, 4, time.Time{}, media.Event{Kind: "dwell"})
	}
	r.Close()
	if s := r.Stats(); s.Clips != 20 || s.WriteErrors != 0 {
		t.Errorf("stats %+v: want 20 clips, no write errors", s)
	}
}

// TestReap: a stream with no frame for Idle is ended by Tick, its open
// clip written.
func TestReap(t *testing.T) {
	g := newRig(t, dag.Clips{Pre: time.Second, Post: time.Minute, MaxLength: 2 * time.Minute})
	g.frames(20)
	g.event(19, "dwell")
	g.clk.Advance(20 * time.Second)
	g.r.Tick()
	if s := g.r.Stats(); s.Streams != 1 || s.Reaped != 0 {
		t.Fatalf("reaped early: %+v", s)
	}
	g.clk.Advance(11 * time.Second)
	g.r.Tick()
	if w := g.written(); len(w) != 1 {
		t.Fatalf("%d clips after the stream was reaped", len(w))
	}
	if s := g.r.Stats(); s.Streams != 0 || s.Reaped != 1 {
		t.Errorf("stats %+v: want the stream reaped", s)
	}
}

// TestEventPastMaxLength: an event later than the open clip can hold ends
// it and starts a clip of its own.
func TestEventPastMaxLength(t *testing.T) {
	g := newRig(t, dag.Clips{Pre: time.Second, Post: time.Second, MaxLength: 3 * time.Second})
	g.frames(20)
	g.event(19, "dwell")
	g.frames(6)                                                          // to 2.5 s: the clip (from 0 s) open
	g.r.Event("cam", 40, at(40), media.Event{Kind: "loiter", Rule: "r"}) // 4 s: past 0 s + 3 s
	g.frames(40)
	w := g.written()
	if len(w) != 2 || len(w[0].Clip.Events) != 1 || w[1].Seq != 40 || w[1].Event.Kind != "loiter" {
		t.Fatalf("clips %+v: want two, the second the loiter's", w)
	}
}

// TestShortPreRoll: a clip with less video before its event than pre is
// counted.
func TestShortPreRoll(t *testing.T) {
	g := newRig(t, dag.Clips{Pre: 2 * time.Second, Post: time.Second})
	g.frames(5)
	g.event(4, "dwell")
	g.frames(50)
	g.event(50, "dwell")
	g.frames(20)
	if s := g.r.Stats(); s.ShortPreRoll != 1 || s.Clips != 2 {
		t.Errorf("stats %+v: want 2 clips, 1 with short pre-roll", s)
	}
}
