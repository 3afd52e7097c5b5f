package cv

import (
	"bytes"
	"errors"
	"testing"

	"github.com/mdag/mdag/media"
	"github.com/mdag/mdag/modules"
)

// block is a bright block in scene; the zero block is the empty scene.
type block struct{ x, y, w, h int }

func (b block) frame() *media.Frame { return scene(b.x, b.y, b.w, b.h) }

var (
	still = block{}
	tall  = block{40, 60, 30, 80}   // a "person" by Motion's rule
	wide  = block{150, 100, 90, 40} // a "car"
)

// want is one frame's expected outcome: dropped (no outputs), else the
// classes of its regions.
type want struct {
	dropped bool
	classes []string
}

func newStateful(t testing.TB, params map[string]any) modules.Stateful {
	t.Helper()
	p, err := New("motion", params)
	if err != nil {
		t.Fatal(err)
	}
	st, ok := p.(modules.Stateful)
	if !ok {
		t.Fatalf("motion's processor %T is not modules.Stateful", p)
	}
	t.Cleanup(st.Close)
	return st
}

// run feeds blocks as frames seq from, from+1, ... of stream and checks
// each frame's outcome.
func run(t *testing.T, st modules.Stateful, stream string, from uint64, frames []block, wants []want) {
	t.Helper()
	for i, b := range frames {
		seq := from + uint64(i)
		in := &media.Item{Stream: stream, Seq: seq, Frame: b.frame(), Boxes: []media.Box{{W: 1, H: 1, Class: "old"}}}
		out, err := st.ProcessFrame(stream, seq, []*media.Item{in})
		if err != nil {
			t.Fatalf("%s frame %d: %v", stream, seq, err)
		}
		w := wants[i]
		if w.dropped {
			if len(out) != 0 {
				t.Errorf("%s frame %d (%+v): emitted %d items, want none (still)", stream, seq, b, len(out))
			}
			continue
		}
		if len(out) != 1 {
			t.Fatalf("%s frame %d (%+v): %d items, want 1", stream, seq, b, len(out))
		}
		o := out[0]
		if o == in || o.Frame != in.Frame || o.Seq != seq || in.Boxes[0].Class != "old" {
			t.Errorf("%s frame %d: want a copy of the input with its frame (input boxes %v)", stream, seq, in.Boxes)
		}
		var got []string
		for _, b := range o.Boxes {
			got = append(got, b.Class)
		}
		if !equalStrings(got, w.classes) {
			t.Errorf("%s frame %d (%+v): regions %v, want classes %v", stream, seq, b, o.Boxes, w.classes)
		}
	}
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func repeat[T any](v T, n int) []T {
	out := make([]T, n)
	for i := range out {
		out[i] = v
	}
	return out
}

var (
	none   = want{}
	drop   = want{dropped: true}
	person = want{classes: []string{"person"}}
	car    = want{classes: []string{"car"}}
)

// TestMotionOp: the op reports nothing while it learns (never dropping
// then), then the moving blocks as regions classed by Motion's rule or the
// class param; drop_still drops still frames after the warm-up only;
// min_area hides small regions.
func TestMotionOp(t *testing.T) {
	warm := repeat(still, 5)
	tests := []struct {
		name   string
		params map[string]any
		frames []block
		wants  []want
	}{
		{"defaults", nil, append(warm, tall, wide, still), append(repeat(none, 5), person, car, none)},
		{"drop_still", map[string]any{"drop_still": 1}, append(warm, tall, still, wide, still),
			append(repeat(none, 5), person, drop, car, drop)},
		{"class", map[string]any{"class": "mover"}, append(warm, tall, wide), append(repeat(none, 5), want{classes: []string{"mover"}}, want{classes: []string{"mover"}})},
		{"warmup 2", map[string]any{"warmup": 2, "drop_still": 1}, []block{still, still, tall, still}, []want{none, none, person, drop}},
		{"min_area above the block", map[string]any{"min_area": 0.5}, append(warm, tall, wide), repeat(none, 7)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			run(t, newStateful(t, tc.params), "cam", 1, tc.frames, tc.wants)
		})
	}
	// A size change: the frames of a smaller camera relearn (no drop).
	st := newStateful(t, map[string]any{"warmup": 2, "drop_still": 1})
	run(t, st, "cam", 1, []block{still, still, still}, []want{none, none, drop})
	for seq := uint64(4); seq < 6; seq++ {
		out, err := st.ProcessFrame("cam", seq, []*media.Item{{Frame: media.NewFrame(64, 48)}})
		if err != nil || len(out) != 1 || len(out[0].Boxes) != 0 {
			t.Errorf("frame %d at a new size: %v, %v; want it kept while the model learns", seq, out, err)
		}
	}
	if out, _ := st.ProcessFrame("cam", 6, []*media.Item{{Frame: media.NewFrame(64, 48)}}); len(out) != 0 {
		t.Errorf("a still frame after relearning was kept: %v", out)
	}
}

// TestMotionOpStreams: each stream has its own background model.
func TestMotionOpStreams(t *testing.T) {
	st := newStateful(t, map[string]any{"warmup": 3})
	run(t, st, "a", 1, []block{still, still, still}, repeat(none, 3))
	run(t, st, "b", 1, []block{tall}, []want{none}) // b is learning: its first frame is not motion
	run(t, st, "a", 4, []block{tall}, []want{person})
	run(t, st, "b", 2, []block{tall, tall, tall}, repeat(none, 3)) // b learnt the block as background
	run(t, st, "b", 5, []block{wide}, []want{{classes: []string{"car", "person"}}})
}

// TestMotionOpItems: of a frame's items, the whole frame feeds the model
// and carries the regions; the others pass unchanged; a frame with no
// pixels is an error naming the stream and frame.
func TestMotionOpItems(t *testing.T) {
	st := newStateful(t, map[string]any{"warmup": 1})
	run(t, st, "s", 1, []block{still}, []want{none})
	crop := &media.Item{Stream: "s", Seq: 2, Frame: media.NewFrame(8, 8), Region: &media.Box{W: 8, H: 8}}
	noFrame := &media.Item{Stream: "s", Seq: 2, Labels: []string{"x"}}
	whole := &media.Item{Stream: "s", Seq: 2, Frame: tall.frame()}
	out, err := st.ProcessFrame("s", 2, []*media.Item{crop, noFrame, whole})
	if err != nil || len(out) != 3 {
		t.Fatalf("ProcessFrame = %v, %v", out, err)
	}
	if out[0] != crop || out[1] != noFrame || out[2] == whole || len(out[2].Boxes) != 1 || whole.Boxes != nil {
		t.Errorf("outputs %v %v %+v: want the crop and the frameless item unchanged, a copy of the frame with one region", out[0], out[1], out[2])
	}
	_, err = st.ProcessFrame("s", 3, []*media.Item{noFrame, {Frame: &media.Frame{W: 2, H: 2}}})
	if err == nil || err.Error() != `motion: frame 3 of stream "s": none of its 2 items carries a valid frame` {
		t.Errorf("no frame: %v", err)
	}
}

// decodeSnapshot opens a motion snapshot.
func decodeSnapshot(t *testing.T, b []byte) *motionState {
	t.Helper()
	v, p, err := modules.DecodeState("motion", b)
	if err != nil || v != motionStateVersion {
		t.Fatalf("DecodeState = %d, %v", v, err)
	}
	s, err := decodeMotionState(p)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestMotionOpState: a snapshot carries frames seen, the last seq and
// regions; restored elsewhere the stream relearns its background (warm-up
// again, nothing dropped meanwhile) and keeps its counters; Restore(nil)
// forgets; a damaged, foreign or newer snapshot is refused and leaves the
// stream fresh.
func TestMotionOpState(t *testing.T) {
	params := map[string]any{"warmup": 2, "drop_still": 1}
	a := newStateful(t, params)
	empty, err := a.Snapshot("never")
	if s := decodeSnapshot(t, empty); err != nil || s.seen != 0 || s.lastSeq != 0 || s.last != nil {
		t.Fatalf("snapshot of an unseen stream: %v", err)
	}
	run(t, a, "s", 10, []block{still, still, tall}, []want{none, none, person})
	snap, err := a.Snapshot("s")
	if err != nil {
		t.Fatal(err)
	}
	got := decodeSnapshot(t, snap)
	if got.seen != 3 || got.lastSeq != 12 || len(got.last) != 1 || got.last[0].Class != "person" {
		t.Fatalf("snapshot %+v: want 3 frames, last 12, one person", got)
	}

	b := newStateful(t, params)
	if err := b.Restore("s", snap); err != nil {
		t.Fatal(err)
	}
	if again, _ := b.Snapshot("s"); !bytes.Equal(again, snap) {
		t.Error("a restored stream snapshots differently")
	}
	// The model relearns: two frames kept without regions, then the
	// still scene is dropped and motion reported.
	run(t, b, "s", 13, []block{still, still, still, wide}, []want{none, none, drop, car})
	if s := decodeSnapshot(t, mustSnapshot(t, b, "s")); s.seen != 7 || s.lastSeq != 16 {
		t.Errorf("after 4 more frames: %+v, want 7 seen, last 16", s)
	}
	if err := b.Restore("s", nil); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(mustSnapshot(t, b, "s"), empty) {
		t.Error("Restore(nil) kept the stream's state")
	}

	bad := map[string][]byte{
		"damaged":       append(snap[:len(snap)-1:len(snap)-1], snap[len(snap)-1]^1),
		"another op":    modules.EncodeState("track", motionStateVersion, nil),
		"a newer state": modules.EncodeState("motion", motionStateVersion+1, nil),
		"trailing":      modules.EncodeState("motion", motionStateVersion, append(motionState{seen: 1}.encode(), 0)),
		"too many":      modules.EncodeState("motion", motionStateVersion, []byte{1, 1, 200, 1}),
	}
	for name, s := range bad {
		run(t, b, "s", 1, []block{still}, []want{none})
		err := b.Restore("s", s)
		if err == nil || !contains(err.Error(), `motion: restore stream "s"`) {
			t.Errorf("%s: Restore = %v", name, err)
		}
		if name != "a newer state" && name != "trailing" && name != "too many" && !errors.Is(err, modules.ErrState) {
			t.Errorf("%s: %v does not wrap modules.ErrState", name, err)
		}
		if !bytes.Equal(mustSnapshot(t, b, "s"), empty) {
			t.Errorf("%s: the refused snapshot left state behind", name)
		}
	}
}

func mustSnapshot(t *testing.T, st modules.Stateful, stream string) []byte {
	t.Helper()
	b, err := st.Snapshot(stream)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestMotionOpVtest: on OpenCV's pedestrian video the walkers move, so
// after the warm-up the op reports regions.
func TestMotionOpVtest(t *testing.T) {
	fs := videoFrames(t, vtestAVI, 0, 2, 4, 6, 8, 10, 12, 14, 16, 18)
	st := newStateful(t, nil)
	moving := 0
	for i, f := range fs {
		out, err := st.ProcessFrame("vtest", uint64(i), []*media.Item{{Frame: f}})
		if err != nil {
			t.Fatal(err)
		}
		if i < motionWarmup && len(out[0].Boxes) > 0 {
			t.Errorf("frame %d of the warm-up has regions", i)
		}
		if len(out[0].Boxes) > 0 {
			moving++
		}
	}
	if moving < len(fs)-motionWarmup-1 {
		t.Errorf("regions on %d of %d frames after the warm-up", moving, len(fs)-motionWarmup)
	}
}

// FuzzMotionRestore: any bytes restore or are refused, never a panic; what
// restores snapshots back to the same bytes.
func FuzzMotionRestore(f *testing.F) {
	f.Add(modules.EncodeState("motion", motionStateVersion, motionState{seen: 3, lastSeq: 9,
		last: []media.Box{{X: 1, Y: 2, W: 3, H: 4, Class: "person", Score: 1}}}.encode()))
	f.Add(modules.EncodeState("motion", motionStateVersion, nil))
	f.Add([]byte("MDST"))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := New("motion", nil)
		if err != nil {
			t.Fatal(err)
		}
		st := p.(modules.Stateful)
		defer st.Close()
		if err := st.Restore("s", b); err != nil {
			return
		}
		s1 := mustSnapshot(t, st, "s")
		if err := st.Restore("s", s1); err != nil {
			t.Fatalf("own snapshot refused: %v", err)
		}
		if s2 := mustSnapshot(t, st, "s"); !bytes.Equal(s1, s2) {
			t.Fatal("snapshot, restore, snapshot changed the bytes")
		}
	})
}

// FuzzMotionState: any payload in a valid envelope decodes or is refused.
func FuzzMotionState(f *testing.F) {
	f.Add(motionState{seen: 1, last: []media.Box{{W: 2, H: 2, Class: "car"}}}.encode())
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, payload []byte) {
		s, err := decodeMotionState(payload)
		if err != nil {
			return
		}
		if len(s.last) > motionMaxBoxes {
			t.Fatalf("%d regions decoded, at most %d allowed", len(s.last), motionMaxBoxes)
		}
		s2, err := decodeMotionState(s.encode())
		if err != nil {
			t.Fatalf("a decoded state re-encodes to bytes it refuses: %v", err)
		}
		if !bytes.Equal(s2.encode(), s.encode()) {
			t.Fatal("decode, encode, decode changed the state")
		}
	})
}

func BenchmarkMotionOp(b *testing.B) {
	st := newStateful(b, nil)
	f := [2]*media.Frame{scene640(40, 60), scene640(60, 60)}
	var seq uint64
	for b.Loop() {
		seq++
		if _, err := st.ProcessFrame("s", seq, []*media.Item{{Frame: f[seq%2]}}); err != nil {
			b.Fatal(err)
		}
	}
}

// scene640 is a 640x480 version of scene: a block at (x, y) on texture.
func scene640(x, y int) *media.Frame {
	s := scene(x, y, 30, 80)
	f, err := ResizeArea(s, 640, 480)
	if err != nil {
		panic(err)
	}
	return f
}
