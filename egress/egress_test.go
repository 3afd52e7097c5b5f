package egress

import (
	"image/color"
	"testing"
	"time"

	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/media"
)

type got struct {
	f   *media.Frame
	seq uint64
}

// watch watches stream with a sink that reports on a channel.
func watch(t *testing.T, h *Hub, name string) (<-chan got, func()) {
	t.Helper()
	ch := make(chan got, 100)
	stop, err := h.Watch(name, func(f *media.Frame, seq uint64) { ch <- got{f, seq} })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return ch, stop
}

func next(t *testing.T, ch <-chan got) got {
	t.Helper()
	select {
	case g := <-ch:
		return g
	case <-time.After(10 * time.Second):
		t.Fatal("no frame reached the sink")
		return got{}
	}
}

func stats(h *Hub, name string) Stats {
	for _, s := range h.Stats() {
		if s.Stream == name {
			return s
		}
	}
	return Stats{}
}

func TestRingBounds(t *testing.T) {
	clk := clock.NewFake(time.Unix(0, 0))
	h := New(Config{MaxFrames: 4, MaxBytes: 5 * 10 * 10 * 3, MaxAge: time.Second, Clock: clk})
	watch(t, h, "a")
	for seq := range uint64(10) {
		h.Ingest("a", seq, media.NewFrame(10, 10))
	}
	if s := stats(h, "a"); s.Buffered != 4 || s.Evicted != 6 || s.Ingested != 10 || s.Bytes != 4*300 {
		t.Errorf("frames bound: %+v, want 4 buffered, 6 evicted", s)
	}
	// bytes: two frames of 600 bytes fill 1500 with the 300s
	h.Ingest("a", 10, media.NewFrame(10, 20))
	h.Ingest("a", 11, media.NewFrame(10, 20))
	if s := stats(h, "a"); s.Bytes > 1500 || s.Buffered != 3 {
		t.Errorf("bytes bound: %+v, want <= 1500 bytes (3 frames)", s)
	}
	// age: a frame older than MaxAge goes with the next ingest
	clk.Advance(1500 * time.Millisecond)
	h.Ingest("a", 12, media.NewFrame(10, 10))
	if s := stats(h, "a"); s.Buffered != 1 {
		t.Errorf("age bound: %+v, want only the new frame", s)
	}
}

func TestOutOfOrder(t *testing.T) {
	h := New(Config{})
	ch, _ := watch(t, h, "a")
	frames := map[uint64]*media.Frame{}
	for seq := uint64(1); seq <= 5; seq++ {
		frames[seq] = media.NewFrame(16, 16)
		h.Ingest("a", seq, frames[seq])
	}
	h.Result(Result{Stream: "a", Seq: 3, Boxes: []media.Box{{X: 2, Y: 2, W: 8, H: 8, Class: "car"}}})
	if g := next(t, ch); g.seq != 3 || g.f == frames[3] {
		t.Errorf("got seq %d (same frame %v): want 3, drawn on a copy", g.seq, g.f == frames[3])
	}
	h.Result(Result{Stream: "a", Seq: 2}) // older than the last sent
	h.Result(Result{Stream: "a", Seq: 5, Dropped: true})
	if g := next(t, ch); g.seq != 5 || g.f != frames[5] {
		t.Errorf("got seq %d: want 5, undrawn (the ingested frame)", g.seq)
	}
	h.Result(Result{Stream: "a", Seq: 4}) // passed over by 5
	h.Result(Result{Stream: "a", Seq: 9}) // never ingested
	s := stats(h, "a")
	// stale: 1 and 2 passed over by 3, 4 passed over by 5, results 2 and 4
	if s.Sent != 2 || s.Undrawn != 1 || s.Stale != 5 || s.Missing != 1 || s.Buffered != 0 {
		t.Errorf("stats %+v: want 2 sent (1 undrawn), 5 stale, 1 missing, none buffered", s)
	}
	select {
	case g := <-ch:
		t.Errorf("unexpected frame %d", g.seq)
	default:
	}
	for _, p := range frames[3].Pix {
		if p != 0 {
			t.Fatal("drawing changed the ingested frame")
		}
	}
}

// TestNoWorkUnwatched: an unwatched stream keeps no frame and allocates
// nothing per frame once seen; results for it do nothing.
func TestNoWorkUnwatched(t *testing.T) {
	h := New(Config{})
	f := media.NewFrame(64, 48)
	h.Ingest("a", 0, f)
	if n := testing.AllocsPerRun(100, func() {
		h.Ingest("a", 1, f)
		h.Result(Result{Stream: "a", Seq: 1})
	}); n != 0 {
		t.Errorf("%v allocations per unwatched frame, want 0", n)
	}
	if len(h.Stats()) != 0 || !h.IsLive("a") || len(h.Live()) != 1 {
		t.Errorf("stats %+v live %v", h.Stats(), h.Live())
	}
	// watched, then unwatched: the ring is dropped
	_, stop := watch(t, h, "a")
	h.Ingest("a", 2, f)
	if s := stats(h, "a"); s.Buffered != 1 {
		t.Errorf("watched: %+v", s)
	}
	stop()
	if len(h.Stats()) != 0 {
		t.Errorf("after stop: %+v", h.Stats())
	}
	h.Result(Result{Stream: "a", Seq: 2}) // no sink, no panic
	if _, err := h.Watch("a", func(*media.Frame, uint64) {}); err != nil {
		t.Errorf("watch again: %v", err)
	}
}

func TestLive(t *testing.T) {
	clk := clock.NewFake(time.Unix(0, 0))
	h := New(Config{Clock: clk, LiveWithin: time.Second})
	h.Ingest("b", 0, media.NewFrame(2, 2))
	h.Ingest("a", 0, media.NewFrame(2, 2))
	if l := h.Live(); len(l) != 2 || l[0] != "a" {
		t.Errorf("live %v", l)
	}
	clk.Advance(2 * time.Second)
	if h.IsLive("a") || len(h.Live()) != 0 {
		t.Errorf("live after 2 s: %v", h.Live())
	}
}

func at(f *media.Frame, x, y int) color.RGBA {
	i := (y*f.W + x) * 3
	return color.RGBA{f.Pix[i+2], f.Pix[i+1], f.Pix[i], 255}
}

// TestDraw: the box's colour lies on its four edges, Line pixels thick,
// and not in its middle; track ids and labels draw something.
func TestDraw(t *testing.T) {
	f := media.NewFrame(160, 120)
	b := media.Box{X: 40, Y: 30, W: 50, H: 40, Class: "car"}
	out := Annotate(f, Result{Boxes: []media.Box{b}, Labels: []string{"busy"},
		Tracks: []media.Track{{ID: 7, Box: media.Box{X: 100, Y: 60, W: 20, H: 20, Class: "person"}}}})
	c := ClassColor("car")
	for _, p := range [][2]int{{b.X, b.Y + 20}, {b.X + b.W - 1, b.Y + 20}, {b.X + 25, b.Y}, {b.X + 25, b.Y + b.H - 1},
		{b.X - 1, b.Y + 20}, {b.X + 1, b.Y + 20}, {b.X + 25, b.Y + b.H}} {
		if got := at(out, p[0], p[1]); got != c {
			t.Errorf("pixel %v = %v, want the class colour %v", p, got, c)
		}
	}
	if got := at(out, b.X+25, b.Y+20); got == c {
		t.Errorf("the box's middle is drawn")
	}
	if ClassColor("car") == ClassColor("person") {
		t.Log("car and person share a colour")
	}
	pc := ClassColor("person")
	if at(out, 100, 70) != pc {
		t.Errorf("track outline missing")
	}
	lit := func(x0, y0, x1, y1 int) bool {
		for y := y0; y < y1; y++ {
			for x := x0; x < x1; x++ {
				if at(out, x, y) == (color.RGBA{255, 255, 255, 255}) {
					return true
				}
			}
		}
		return false
	}
	if !lit(0, 0, 40, 16) {
		t.Errorf("no label text at the top left")
	}
	// palette colours stay far from any synthetic fill (channels >= 64)
	for _, p := range palette {
		if min(p.R, p.G, p.B) != 0 || max(p.R, p.G, p.B) != 255 {
			t.Errorf("palette colour %v: want a channel at 0 and one at 255", p)
		}
	}
}

func BenchmarkAnnotate640x480(b *testing.B) {
	f := media.NewFrame(640, 480)
	r := Result{Boxes: []media.Box{{X: 10, Y: 10, W: 100, H: 80, Class: "car"}, {X: 200, Y: 100, W: 60, H: 120, Class: "person"}},
		Tracks: []media.Track{{ID: 3, Box: media.Box{X: 10, Y: 10, W: 100, H: 80, Class: "car"}}}}
	for b.Loop() {
		Annotate(f, r)
	}
}
