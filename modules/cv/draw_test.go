package cv

import (
	"bytes"
	"image"
	"image/color"
	"testing"

	"github.com/mdag/mdag/media"
)

// grey is a w x h frame of one grey value.
func grey(w, h int, v byte) *media.Frame {
	f := media.NewFrame(w, h)
	for i := range f.Pix {
		f.Pix[i] = v
	}
	return f
}

// px is f's BGR pixel at (x, y).
func px(f *media.Frame, x, y int) [3]byte {
	i := (y*f.W + x) * 3
	return [3]byte{f.Pix[i], f.Pix[i+1], f.Pix[i+2]}
}

func bgr(c color.RGBA) [3]byte { return [3]byte{c.B, c.G, c.R} }

// changed counts the pixels of r that differ between a and b.
func changed(a, b *media.Frame, r image.Rectangle) int {
	n := 0
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			if px(a, x, y) != px(b, x, y) {
				n++
			}
		}
	}
	return n
}

// TestAnnotate: a box's border takes its class's colour, a track's its
// id's, the inside of a box stays as it was, text goes above a box and in
// the corners for labels and events (only with labels on), and the input
// frame is never written.
func TestAnnotate(t *testing.T) {
	box := media.Box{X: 60, Y: 80, W: 100, H: 60, Class: "person", Score: 0.9}
	trk := media.Track{ID: 7, Box: media.Box{X: 200, Y: 100, W: 50, H: 80, Class: "car"}}
	above := image.Rect(60, 62, 160, 78)      // the text tab above box
	topLeft := image.Rect(0, 0, 50, 20)       // the first label line
	bottomLeft := image.Rect(0, 220, 50, 240) // the last event line
	inside := image.Rect(70, 90, 150, 130)    // well inside box
	tests := []struct {
		name      string
		params    map[string]any
		item      media.Item
		border    map[image.Point][3]byte // pixel -> colour
		text, not []image.Rectangle       // regions with and without drawing
	}{
		{"box", nil, media.Item{Boxes: []media.Box{box}},
			map[image.Point][3]byte{{60, 110}: bgr(classColour("person")), {110, 80}: bgr(classColour("person")), {159, 139}: bgr(classColour("person"))},
			[]image.Rectangle{above}, []image.Rectangle{inside, topLeft, bottomLeft}},
		{"box without labels", map[string]any{"labels": 0, "thickness": 1}, media.Item{Boxes: []media.Box{box}, Labels: []string{"x"}},
			map[image.Point][3]byte{{60, 110}: bgr(classColour("person"))}, nil, []image.Rectangle{above, inside, topLeft}},
		{"track", nil, media.Item{Tracks: []media.Track{trk}},
			map[image.Point][3]byte{{200, 140}: bgr(trackColour(7)), {249, 140}: bgr(trackColour(7))},
			[]image.Rectangle{image.Rect(200, 84, 240, 98)}, []image.Rectangle{image.Rect(210, 110, 240, 170)}},
		{"labels and events", nil, media.Item{Labels: []string{"speaking"}, Events: []media.Event{{Kind: "dwell", Rule: "door", Track: 7}}},
			nil, []image.Rectangle{topLeft, bottomLeft}, []image.Rectangle{inside}},
		{"a box at the top edge labels inside", nil, media.Item{Boxes: []media.Box{{X: 10, Y: 0, W: 80, H: 60, Class: "dog"}}},
			map[image.Point][3]byte{{10, 30}: bgr(classColour("dog"))}, []image.Rectangle{image.Rect(12, 4, 40, 16)}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := New("annotate", tc.params)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			in := tc.item
			in.Frame = grey(320, 240, 128)
			orig := bytes.Clone(in.Frame.Pix)
			out, err := p.Process(&in)
			if err != nil || len(out) != 1 {
				t.Fatalf("Process = %v, %v", out, err)
			}
			if !bytes.Equal(in.Frame.Pix, orig) {
				t.Fatal("the input frame was modified")
			}
			o := out[0].Frame
			if o == in.Frame || o.W != 320 || o.H != 240 {
				t.Fatalf("output frame %dx%d, want a new 320x240 frame", o.W, o.H)
			}
			for pt, c := range tc.border {
				if got := px(o, pt.X, pt.Y); got != c {
					t.Errorf("pixel %v = %v, want %v", pt, got, c)
				}
			}
			for _, r := range tc.text {
				if changed(in.Frame, o, r) == 0 {
					t.Errorf("nothing drawn in %v", r)
				}
			}
			for _, r := range tc.not {
				if n := changed(in.Frame, o, r); n != 0 {
					t.Errorf("%d pixels drawn in %v", n, r)
				}
			}
		})
	}
	p, _ := New("annotate", nil)
	if _, err := p.Process(&media.Item{Frame: &media.Frame{W: 4, H: 4}}); err == nil || !contains(err.Error(), "annotate: frame 4x4 has 0 bytes") {
		t.Errorf("empty frame: %v", err)
	}
	if _, err := p.Process(&media.Item{}); err == nil {
		t.Error("an item without a frame was annotated")
	}
}

// TestAnnotateThickness: the border is as thick as asked.
func TestAnnotateThickness(t *testing.T) {
	for _, th := range []int{1, 2, 5} {
		p, err := New("annotate", map[string]any{"thickness": th, "labels": 0})
		if err != nil {
			t.Fatal(err)
		}
		in := &media.Item{Frame: grey(200, 200, 128), Boxes: []media.Box{{X: 50, Y: 50, W: 100, H: 100, Class: "car"}}}
		out, _ := p.Process(in)
		n := 0 // border pixels on the row through the box's middle, left side
		for x := 40; x < 100; x++ {
			if px(out[0].Frame, x, 100) != px(in.Frame, x, 100) {
				n++
			}
		}
		if n != th {
			t.Errorf("thickness %d: %d pixels drawn across the left border", th, n)
		}
	}
}

func BenchmarkAnnotate(b *testing.B) {
	p, _ := New("annotate", nil)
	it := &media.Item{Frame: scene640(40, 60), Labels: []string{"label"}, Events: []media.Event{{Kind: "dwell", Rule: "door", Track: 3}}}
	for i := range 5 {
		it.Boxes = append(it.Boxes, media.Box{X: 40 + i*110, Y: 100, W: 80, H: 160, Class: "person", Score: 0.8})
		it.Tracks = append(it.Tracks, media.Track{ID: uint64(i), Box: it.Boxes[i]})
	}
	for b.Loop() {
		if _, err := p.Process(it); err != nil {
			b.Fatal(err)
		}
	}
}

// TestLetterbox: exact geometry (scale, content size and offsets, the
// padding's rows or columns) for landscape, portrait, enlarged and
// odd-leftover frames; the content keeps its pixels; boxes, truth and
// tracks move with them and Unmap brings them back.
func TestLetterbox(t *testing.T) {
	tests := []struct {
		name         string
		srcW, srcH   int
		w, h         int
		want         Letterbox
		box, wantBox media.Box
	}{
		{"640x360 into 320x320", 640, 360, 320, 320, Letterbox{W: 320, H: 320, Scale: 0.5, ContentW: 320, ContentH: 180, Left: 0, Top: 70},
			media.Box{X: 100, Y: 40, W: 60, H: 120}, media.Box{X: 50, Y: 90, W: 30, H: 60}},
		{"portrait 360x640 into 320x320", 360, 640, 320, 320, Letterbox{W: 320, H: 320, Scale: 0.5, ContentW: 180, ContentH: 320, Left: 70, Top: 0},
			media.Box{X: 100, Y: 40, W: 60, H: 120}, media.Box{X: 120, Y: 20, W: 30, H: 60}},
		{"enlarged 160x90 into 640x640", 160, 90, 640, 640, Letterbox{W: 640, H: 640, Scale: 4, ContentW: 640, ContentH: 360, Left: 0, Top: 140},
			media.Box{X: 10, Y: 10, W: 5, H: 5}, media.Box{X: 40, Y: 180, W: 20, H: 20}},
		{"odd leftover goes bottom", 640, 361, 320, 320, Letterbox{W: 320, H: 320, Scale: 320.0 / 640, ContentW: 320, ContentH: 181, Left: 0, Top: 69},
			media.Box{X: 0, Y: 0, W: 640, H: 360}, media.Box{X: 0, Y: 69, W: 320, H: 180}},
		{"same aspect, no padding", 640, 480, 320, 240, Letterbox{W: 320, H: 240, Scale: 0.5, ContentW: 320, ContentH: 240},
			media.Box{X: 2, Y: 2, W: 4, H: 4}, media.Box{X: 1, Y: 1, W: 2, H: 2}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := NewLetterbox(tc.srcW, tc.srcH, tc.w, tc.h); got != tc.want {
				t.Fatalf("NewLetterbox = %+v, want %+v", got, tc.want)
			}
			p, err := New("letterbox", map[string]any{"width": tc.w, "height": tc.h})
			if err != nil {
				t.Fatal(err)
			}
			src := grey(tc.srcW, tc.srcH, 200)
			in := &media.Item{Seq: 3, Frame: src, Boxes: []media.Box{tc.box}, Truth: []media.Box{tc.box},
				Tracks: []media.Track{{ID: 1, Box: tc.box}}}
			out, err := p.Process(in)
			if err != nil || len(out) != 1 {
				t.Fatalf("Process = %v, %v", out, err)
			}
			o := out[0]
			if o.Frame.W != tc.w || o.Frame.H != tc.h || o.Seq != 3 {
				t.Fatalf("output %dx%d seq %d", o.Frame.W, o.Frame.H, o.Seq)
			}
			content := image.Rect(tc.want.Left, tc.want.Top, tc.want.Left+tc.want.ContentW, tc.want.Top+tc.want.ContentH)
			for y := range tc.h {
				for x := range tc.w {
					want := byte(114)
					if image.Pt(x, y).In(content) {
						want = 200
					}
					if got := px(o.Frame, x, y); got != [3]byte{want, want, want} {
						t.Fatalf("pixel (%d,%d) = %v, want %d (content %v)", x, y, got, want, content)
					}
				}
			}
			if o.Boxes[0] != tc.wantBox || o.Truth[0] != tc.wantBox || o.Tracks[0].Box != tc.wantBox || in.Boxes[0] != tc.box || in.Tracks[0].Box != tc.box {
				t.Errorf("boxes %v truth %v track %v, want %v (input %v)", o.Boxes, o.Truth, o.Tracks, tc.wantBox, in.Boxes)
			}
			if back := tc.want.Unmap(tc.wantBox); back != tc.box {
				t.Errorf("Unmap(%v) = %v, want %v", tc.wantBox, back, tc.box)
			}
		})
	}
	p, _ := New("letterbox", map[string]any{"pad": 0, "width": 64, "height": 64})
	out, _ := p.Process(&media.Item{Frame: grey(64, 32, 9)})
	if got := px(out[0].Frame, 0, 0); got != [3]byte{} {
		t.Errorf("pad 0: corner %v", got)
	}
	if out[0].Boxes != nil || out[0].Truth != nil || out[0].Tracks != nil {
		t.Error("no boxes became some")
	}
	if _, err := p.Process(&media.Item{Frame: &media.Frame{W: 3, H: 3, Pix: make([]byte, 26)}}); err == nil || !contains(err.Error(), "letterbox: frame 3x3") {
		t.Errorf("short frame: %v", err)
	}
}

func BenchmarkLetterbox(b *testing.B) {
	p, _ := New("letterbox", nil)
	it := &media.Item{Frame: scene640(40, 60)}
	for b.Loop() {
		if _, err := p.Process(it); err != nil {
			b.Fatal(err)
		}
	}
}
