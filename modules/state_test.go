package modules

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/mdag/mdag/media"
)

func TestStateEnvelope(t *testing.T) {
	b := EncodeState("track", 3, []byte("payload"))
	v, p, err := DecodeState("track", b)
	if err != nil || v != 3 || !bytes.Equal(p, []byte("payload")) {
		t.Fatalf("round trip: v=%d p=%q err=%v", v, p, err)
	}
	damaged := bytes.Clone(b)
	damaged[len(damaged)-6] ^= 1
	for name, tc := range map[string]struct {
		op OpID
		b  []byte
	}{
		"other op":  {"window", b},
		"damaged":   {"track", damaged},
		"truncated": {"track", b[:len(b)-3]},
		"empty":     {"track", nil},
		"not state": {"track", []byte("hello, world, this is not a snapshot")},
	} {
		if _, _, err := DecodeState(tc.op, tc.b); !errors.Is(err, ErrState) {
			t.Errorf("%s: err = %v, want ErrState", name, err)
		}
	}
}

func FuzzDecodeState(f *testing.F) {
	f.Add(EncodeState("track", 1, []byte{1, 2, 3}))
	f.Add(EncodeState("window", 1, nil))
	f.Add([]byte("MDST"))
	f.Fuzz(func(t *testing.T, b []byte) {
		v, p, err := DecodeState("track", b)
		if err != nil {
			return
		}
		if again := EncodeState("track", v, p); !bytes.Equal(again, b) {
			t.Fatalf("decoded snapshot does not re-encode to its bytes")
		}
	})
}

// TestParamsFinite: a Number param is finite, a Duration in range.
func TestParamsFinite(t *testing.T) {
	for _, tc := range []struct {
		op  OpID
		raw map[string]any
	}{
		{"track", map[string]any{"iou": math.NaN()}},
		{"crop", map[string]any{"min_score": math.Inf(1)}},
		{"segment", map[string]any{"chunk": 18446744074}},
		{"segment", map[string]any{"chunk": math.NaN()}},
	} {
		if _, err := DecodeParams(tc.op, tc.raw); err == nil {
			t.Errorf("%s %v: accepted", tc.op, tc.raw)
		}
	}
}

// TestSnapshotUnseenStream: a snapshot of a stream never seen is a valid
// empty state and leaves nothing behind.
func TestSnapshotUnseenStream(t *testing.T) {
	p, err := Builtin().New("window", nil)
	if err != nil {
		t.Fatal(err)
	}
	w := p.(Stateful)
	for i := range 100 {
		if _, err := w.Snapshot(fmt.Sprint("ghost-", i)); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(p.(*window).streams.m); n != 0 {
		t.Errorf("%d streams kept after snapshots of unseen ones", n)
	}
}

// TestLiveStateSurvivesMove: what a frame feeds a stateful op (odd boxes
// included: no size, a score that is not a number, far outside the frame)
// never builds a state that a restore refuses: a stream's state always
// survives a move.
func TestLiveStateSurvivesMove(t *testing.T) {
	odd := []media.Box{{X: 1, Y: 1, W: 0, H: 3, Class: "person"}, {X: 2, Y: 2, W: 4, H: 4, Class: "person", Score: float32(math.NaN())},
		{X: 1 << 31, Y: 0, W: 4, H: 4, Class: "person"}, {X: 5, Y: 5, W: 10, H: 10, Class: "person", Score: 0.9}}
	long := strings.Repeat("x", 2000)
	for _, op := range []OpID{"track", "window", "sequence"} {
		p, err := Builtin().New(op, nil)
		if err != nil {
			t.Fatal(err)
		}
		st := p.(Stateful)
		for seq := range uint64(3) {
			items := []*media.Item{{Stream: "s", Seq: seq, Boxes: odd, Labels: []string{long, "ok"}}}
			for i := range odd {
				b := odd[i]
				items = append(items, &media.Item{Stream: "s", Seq: seq, Region: &b, Labels: []string{long}})
			}
			if _, err := st.ProcessFrame("s", seq, items); err != nil {
				t.Fatalf("%s frame %d: %v", op, seq, err)
			}
		}
		b, err := st.Snapshot("s")
		if err != nil {
			t.Fatalf("%s: snapshot: %v", op, err)
		}
		q, _ := Builtin().New(op, nil)
		if err := q.(Stateful).Restore("s", b); err != nil {
			t.Errorf("%s: the live state does not restore: %v", op, err)
		}
	}
}
