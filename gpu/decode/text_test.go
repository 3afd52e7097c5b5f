package decode

import (
	"strings"
	"testing"

	"github.com/mdag/mdag/media"
)

// probMap is an h x w map, 0 everywhere but the rectangles, set to p.
func probMap(w, h int, p float32, rects ...[4]int) Output {
	o := Output{Name: "map", Shape: []int64{1, int64(h), int64(w)}, Data: make([]float32, w*h)}
	for _, r := range rects {
		for y := r[1]; y < r[3]; y++ {
			for x := r[0]; x < r[2]; x++ {
				o.Data[y*w+x] = p
			}
		}
	}
	return o
}

func TestDB(t *testing.T) {
	g := Geometry{InW: 64, InH: 32, FrameW: 128, FrameH: 64}
	// two regions: 20x6 at (4,4) and 10x4 at (30,20); a 2x2 speck (too small)
	outs := []Output{probMap(64, 32, 0.9, [4]int{4, 4, 24, 10}, [4]int{30, 20, 40, 24}, [4]int{50, 2, 52, 4})}
	r, err := DB(outs, g, Params{Threshold: 0.6, Unclip: 1.5})
	if err != nil {
		t.Fatal(err)
	}
	// unclip d = w*h*1.5/(2(w+h)): 20x6 -> 3.46, 10x4 -> 2.14; x2 on the frame
	want := []media.Box{
		{X: 1, Y: 1, W: 54, H: 26, Class: "text", Score: 0.9},
		{X: 55, Y: 35, W: 29, H: 17, Class: "text", Score: 0.9},
	}
	if len(r.Boxes) != len(want) {
		t.Fatalf("boxes %v, want %v", r.Boxes, want)
	}
	for i, b := range r.Boxes {
		w := want[i]
		if b.X != w.X || b.Y != w.Y || b.W != w.W || b.H != w.H || b.Class != w.Class || b.Score < 0.89 || b.Score > 0.91 {
			t.Errorf("box %d: %+v, want %+v", i, b, w)
		}
	}
	// a region whose mean falls below Threshold goes; Binarize decides the pixels
	if r, _ := DB([]Output{probMap(64, 32, 0.5, [4]int{4, 4, 24, 10})}, g, Params{Threshold: 0.6}); len(r.Boxes) != 0 {
		t.Errorf("mean 0.5 < threshold 0.6: %v", r.Boxes)
	}
	if r, _ := DB([]Output{probMap(64, 32, 0.5, [4]int{4, 4, 24, 10})}, g, Params{Binarize: 0.55}); len(r.Boxes) != 0 {
		t.Errorf("pixels 0.5 < binarize 0.55: %v", r.Boxes)
	}
	// diagonal neighbours join (8-connected): one region
	o := probMap(64, 32, 0.9, [4]int{0, 0, 4, 4}, [4]int{4, 4, 8, 8})
	if r, _ := DB([]Output{o}, g, Params{}); len(r.Boxes) != 1 {
		t.Errorf("8-connected squares: %d boxes, want 1", len(r.Boxes))
	}
	for _, bad := range [][]Output{nil, {{Name: "m", Shape: []int64{2, 4, 4}, Data: make([]float32, 32)}}, {{Name: "m", Shape: []int64{1, 4, 4}, Data: make([]float32, 3)}}} {
		if _, err := DB(bad, g, Params{}); err == nil {
			t.Errorf("DB(%v): no error", bad)
		}
	}
}

// ctcOut is a [T,C] output whose best class at t is seq[t] (probability p).
func ctcOut(c int, p float32, seq ...int) Output {
	o := Output{Name: "probs", Shape: []int64{int64(len(seq)), int64(c)}, Data: make([]float32, len(seq)*c)}
	for t, k := range seq {
		for j := range c {
			o.Data[t*c+j] = (1 - p) / float32(c-1)
		}
		o.Data[t*c+k] = p
	}
	return o
}

func TestCTC(t *testing.T) {
	keys := []string{"A", "B", "7", "\u3000"}
	g := Geometry{InW: 320, InH: 48, FrameW: 320, FrameH: 48}
	tests := []struct {
		name string
		c    int
		seq  []int
		want string
	}{
		{"repeats collapse, blanks drop", 5, []int{0, 1, 1, 0, 2, 2, 2, 0, 0}, "AB"},
		{"a blank separates a double letter", 5, []int{1, 0, 1, 3}, "AA7"},
		{"the space class after the keys", 6, []int{1, 5, 2}, "A B"},
		{"a key TrimSpace would drop", 5, []int{4, 1}, "\u3000A"},
		{"only blanks", 5, []int{0, 0, 0}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := CTC([]Output{ctcOut(tc.c, 0.8, tc.seq...)}, g, Params{Labels: keys, Threshold: 0.5})
			if err != nil {
				t.Fatal(err)
			}
			if tc.want == "" {
				if len(r.Labels) != 0 || len(r.Boxes) != 0 {
					t.Fatalf("got %v %v, want nothing", r.Labels, r.Boxes)
				}
				return
			}
			if len(r.Labels) != 1 || r.Labels[0] != tc.want {
				t.Fatalf("labels %q, want [%q]", r.Labels, tc.want)
			}
			if len(r.Boxes) != 1 || r.Boxes[0].Class != tc.want || r.Boxes[0].Score < 0.79 || r.Boxes[0].Score > 0.81 || r.Boxes[0].W != 320 {
				t.Fatalf("boxes %+v, want one 320x48 box of class %q scored 0.8", r.Boxes, tc.want)
			}
		})
	}
	if r, _ := CTC([]Output{ctcOut(5, 0.4, 1, 2)}, g, Params{Labels: keys, Threshold: 0.5}); len(r.Labels) != 0 {
		t.Errorf("confidence 0.4 < threshold 0.5: %v", r.Labels)
	}
	for _, tc := range []struct {
		outs []Output
		keys []string
		want string
	}{
		{[]Output{ctcOut(5, 0.8, 1)}, keys, "has no space class"},
		{[]Output{ctcOut(5, 0.8, 1)}, nil, "no keys"},
		{[]Output{ctcOut(9, 0.8, 1)}, keys, "9 classes; the keys file has 4"},
		{nil, keys, "want 1 output"},
		{[]Output{{Name: "p", Shape: []int64{5}, Data: make([]float32, 5)}}, keys, "want [T,C]"},
	} {
		if _, err := CTC(tc.outs, g, Params{Labels: tc.keys, Space: 0.05}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("error %v, want %q", err, tc.want)
		}
	}
}

// TestCTCSpace: with Params.Space, a blank run between two characters in
// which the space class reaches Space reads as a space; below it, or before
// the first character, or beside a space already read, it adds nothing.
func TestCTCSpace(t *testing.T) {
	keys := []string{"A", "B", "7", "\u3000"}
	g := Geometry{InW: 320, InH: 48, FrameW: 320, FrameH: 48}
	// out is ctcOut(6, ...) with the space class (5) at sp[t] in blank timesteps
	out := func(sp map[int]float32, seq ...int) Output {
		o := ctcOut(6, 0.8, seq...)
		for i, v := range sp {
			o.Data[i*6+5], o.Data[i*6] = v, 0.8-v
		}
		return o
	}
	tests := []struct {
		name  string
		space float64
		o     Output
		want  string
	}{
		{"a word gap", 0.05, out(map[int]float32{2: 0.02, 3: 0.3}, 1, 0, 0, 0, 2), "A B"},
		{"off: greedy", 0, out(map[int]float32{2: 0.3}, 1, 0, 0, 0, 2), "AB"},
		{"inside a word", 0.05, out(map[int]float32{1: 0.01, 2: 0.04}, 1, 0, 0, 2), "AB"},
		{"the threshold itself", 0.25, out(map[int]float32{1: 0.25}, 1, 0, 2), "A B"},
		{"before the first character", 0.05, out(map[int]float32{0: 0.3}, 0, 1, 2), "AB"},
		{"after the last", 0.05, out(map[int]float32{2: 0.3}, 1, 2, 0), "AB"},
		{"beside a space read", 0.05, out(map[int]float32{1: 0.3, 3: 0.3}, 1, 0, 5, 0, 2), "A B"},
		{"two gaps", 0.05, out(map[int]float32{1: 0.2, 3: 0.2}, 1, 0, 3, 0, 2), "A 7 B"},
		{"only a space", 0.05, out(nil, 0, 5, 0), ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := CTC([]Output{tc.o}, g, Params{Labels: keys, Threshold: 0.5, Space: tc.space})
			if err != nil {
				t.Fatal(err)
			}
			got := ""
			if len(r.Labels) > 0 {
				got = r.Labels[0]
			}
			if got != tc.want {
				t.Fatalf("read %q, want %q", got, tc.want)
			}
		})
	}
}
