package modules_test

import (
	"testing"

	"github.com/mdag/mdag/media"
	"github.com/mdag/mdag/modules"
)

// text-crop: one 320x48 line per box, the text scaled to height 48
// keeping its aspect, left-aligned, the rest grey; the box as Region.
func TestTextCrop(t *testing.T) {
	f := media.NewFrame(200, 100)
	for y := 10; y < 30; y++ { // a white 60x20 box at (20,10)
		for x := 20; x < 80; x++ {
			i := (y*f.W + x) * 3
			f.Pix[i], f.Pix[i+1], f.Pix[i+2] = 255, 255, 255
		}
	}
	in := &media.Item{Stream: "s", Seq: 3, Frame: f, Boxes: []media.Box{
		{X: 20, Y: 10, W: 60, H: 20, Class: "text", Score: 0.9},
		{X: 0, Y: 50, W: 200, H: 10, Class: "text", Score: 0.8}, // 960 wide at height 48: squeezed
		{X: 0, Y: 0, W: 5, H: 5, Class: "text", Score: 0.1},     // below min_score
	}}
	p, err := modules.Builtin().New("text-crop", map[string]any{"min_score": 0.5})
	if err != nil {
		t.Fatal(err)
	}
	out, err := p.Process(in)
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != 2 {
		t.Fatalf("%d crops, want 2", len(out))
	}
	c := out[0]
	if c.Frame.W != 320 || c.Frame.H != 48 || c.Region == nil || *c.Region != in.Boxes[0] || c.Seq != 3 {
		t.Fatalf("crop %dx%d region %v seq %d", c.Frame.W, c.Frame.H, c.Region, c.Seq)
	}
	px := func(f *media.Frame, x, y int) byte { return f.Pix[(y*f.W+x)*3] }
	// 60x20 at height 48 is 144 wide: white up to 143, grey 128 after
	if px(c.Frame, 0, 0) != 255 || px(c.Frame, 143, 47) != 255 || px(c.Frame, 144, 0) != 128 || px(c.Frame, 319, 47) != 128 {
		t.Errorf("crop pixels: %d %d %d %d, want 255 255 128 128", px(c.Frame, 0, 0), px(c.Frame, 143, 47), px(c.Frame, 144, 0), px(c.Frame, 319, 47))
	}
	if w := out[1].Frame; w.W != 320 || w.H != 48 || px(w, 319, 0) != 0 {
		t.Errorf("wide line: %dx%d, last column %d; want 320x48 squeezed (black, no padding)", w.W, w.H, px(w, 319, 0))
	}
}

// place: a crop's first label and box score go onto its region.
func TestPlace(t *testing.T) {
	p, err := modules.Builtin().New("place", nil)
	if err != nil {
		t.Fatal(err)
	}
	region := media.Box{X: 5, Y: 6, W: 70, H: 20, Class: "text", Score: 0.7}
	out, err := p.Process(&media.Item{Seq: 9, Region: &region, Labels: []string{"EXIT 24"}, Boxes: []media.Box{{W: 320, H: 48, Class: "EXIT 24", Score: 0.97}}})
	if err != nil {
		t.Fatal(err)
	}
	want := media.Box{X: 5, Y: 6, W: 70, H: 20, Class: "EXIT 24", Score: 0.97}
	if len(out) != 1 || len(out[0].Boxes) != 1 || out[0].Boxes[0] != want || out[0].Labels[0] != "EXIT 24" || out[0].Seq != 9 {
		t.Fatalf("place: %+v, want one box %+v", out[0], want)
	}
	out, _ = p.Process(&media.Item{Seq: 9, Region: &region}) // nothing read
	if len(out) != 1 || len(out[0].Boxes) != 0 {
		t.Fatalf("place without labels: %+v, want no boxes", out[0])
	}
}
