package modules

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"testing"
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
