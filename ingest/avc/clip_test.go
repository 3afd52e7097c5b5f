package avc

import (
	"os"
	"testing"
)

// splitHEVC cuts an H.265 Annex-B byte stream into access units (H.265
// 7.4.2.4.4): a new one begins at an access unit delimiter, a parameter
// set or prefix SEI after a picture's slices, or at a slice whose
// first_slice_segment_in_pic_flag is set.
func splitHEVC(stream []byte) [][]byte {
	var aus [][]byte
	start, sawVCL := -1, false
	eachNAL(stream, func(off int, nal []byte) bool {
		if len(nal) < 3 {
			return true
		}
		at := off - 3
		if at > 0 && stream[at-1] == 0 {
			at-- // a four-byte start code
		}
		t := (nal[0] >> 1) & 0x3f
		vcl := t < 32
		begins := false
		switch {
		case vcl:
			begins = nal[2]&0x80 != 0 // first_slice_segment_in_pic_flag
		case t == 35 || (t >= 32 && t <= 34) || t == 39:
			begins = sawVCL
		}
		if begins && start >= 0 && (sawVCL || t == 35) {
			aus = append(aus, stream[start:at])
			start, sawVCL = -1, false
		}
		if start < 0 {
			start = at
		}
		if vcl {
			sawVCL = true
		}
		return true
	})
	if start >= 0 {
		aus = append(aus, stream[start:])
	}
	return aus
}

// TestForeignClip decodes an H.265 stream from another encoder (GStreamer's
// x265enc, with B-frames; testdata/README.md), cut into access units by
// NAL types: every access unit decodes, the pictures come out at the
// stream's size, and the ball moves from picture to picture.
func TestForeignClip(t *testing.T) {
	stream, err := os.ReadFile("testdata/ball-320x240.h265")
	if err != nil {
		t.Fatal(err)
	}
	aus := splitHEVC(stream)
	if len(aus) != 30 {
		t.Fatalf("%d access units, want 30", len(aus))
	}
	dec, err := NewDecoder(H265)
	if err != nil {
		t.Fatal(err)
	}
	defer dec.Close()
	var keys []int
	var xs []float64
	for i, au := range aus {
		if IsKeyFrame(H265, au) {
			keys = append(keys, i)
		}
		f, err := dec.Decode(au)
		if err != nil {
			t.Fatalf("access unit %d (%d bytes): %v", i, len(au), err)
		}
		if f == nil {
			continue
		}
		if f.W != 320 || f.H != 240 {
			t.Fatalf("access unit %d: %dx%d", i, f.W, f.H)
		}
		// The ball is white on black: the mean x of bright pixels.
		var sx, n float64
		for p := 0; p < len(f.Pix); p += 3 {
			if f.Pix[p] > 200 && f.Pix[p+1] > 200 && f.Pix[p+2] > 200 {
				sx += float64(p / 3 % f.W)
				n++
			}
		}
		if n < 50 || n > 320*240/4 {
			t.Fatalf("access unit %d: %.0f bright pixels, want a ball", i, n)
		}
		xs = append(xs, sx/n)
	}
	if len(keys) < 2 || keys[0] != 0 {
		t.Errorf("key frames at %v, want 0 and later ones (key-int-max 15)", keys)
	}
	if len(xs) < 25 { // B-frames: the decoder keeps a few at the end
		t.Fatalf("%d pictures from 30 access units", len(xs))
	}
	t.Logf("key frames at %v, %d pictures, ball x %.0f", keys, len(xs), xs)
	// In display order the ball moves smoothly (a bounce turns it at most
	// twice in a second); pictures out of order would turn it back and
	// forth.
	moved, turns := 0, 0
	for i := 1; i < len(xs); i++ {
		if xs[i] != xs[i-1] {
			moved++
		}
		if i > 1 && (xs[i]-xs[i-1])*(xs[i-1]-xs[i-2]) < 0 {
			turns++
		}
	}
	if moved < len(xs)/2 || turns > 2 {
		t.Errorf("the ball moved in %d of %d pictures and turned %d times (x %.0f)", moved, len(xs)-1, turns, xs)
	}
}

// TestDecodeAtStamps: with B-frames pictures come out later and out of
// decode order; DecodeAt gives each the stamp of the access unit it was
// coded in, so a caller times it by that unit's capture, not by the unit
// that happened to release it. Every stamp comes back once.
func TestDecodeAtStamps(t *testing.T) {
	stream, err := os.ReadFile("testdata/ball-320x240.h265")
	if err != nil {
		t.Fatal(err)
	}
	dec, err := NewDecoder(H265)
	if err != nil {
		t.Fatal(err)
	}
	defer dec.Close()
	seen := map[int64]bool{}
	late := 0
	for i, au := range splitHEVC(stream) {
		f, pts, err := dec.DecodeAt(au, int64(1000+i))
		if err != nil {
			t.Fatalf("access unit %d: %v", i, err)
		}
		if f == nil {
			continue
		}
		if pts < 1000 || pts > int64(1000+i) || seen[pts] {
			t.Fatalf("access unit %d released a picture stamped %d (seen before: %v)", i, pts, seen[pts])
		}
		seen[pts] = true
		if pts != int64(1000+i) {
			late++
		}
	}
	if len(seen) < 25 || late == 0 {
		t.Errorf("%d pictures stamped, %d released by a later access unit: want B-frames' reordering visible", len(seen), late)
	}
}
