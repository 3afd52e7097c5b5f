package cv

import (
	"image"
	"image/color"
	"os"
	"slices"
	"sync"
	"testing"

	"go.uber.org/goleak"
	"gocv.io/x/gocv"

	"github.com/mdag/mdag/media"
)

// TestMain checks no test leaves a goroutine behind (TestHOGPeopleConcurrent
// starts some).
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// vtestAVI is Debian's opencv-doc sample of pedestrians on a campus path
// (768x576).
const vtestAVI = "/usr/share/doc/opencv-doc/examples/data/vtest.avi"

// videoFrames returns the frames of path at the given indexes (ascending),
// skipping the test when the file is absent.
func videoFrames(t testing.TB, path string, idx ...int) []*media.Frame {
	t.Helper()
	if _, err := os.Stat(path); err != nil {
		t.Skipf("%s absent (Debian package opencv-doc): %v", path, err)
	}
	vc, err := gocv.VideoCaptureFile(path)
	if err != nil {
		t.Skipf("OpenCV cannot open %s: %v", path, err)
	}
	defer vc.Close()
	m := gocv.NewMat()
	defer m.Close()
	var out []*media.Frame
	for i := 0; len(out) < len(idx); i++ {
		if !vc.Read(&m) || m.Empty() {
			t.Fatalf("%s ends at frame %d, want frame %d", path, i, idx[len(out)])
		}
		if i == idx[len(out)] {
			out = append(out, FromMat(m))
		}
	}
	return out
}

// drawFigure paints a dark human silhouette h pixels tall whose head's top
// is at (x, y): head, torso, arms and legs, the shape HOG's people
// detector was trained on.
func drawFigure(m *gocv.Mat, x, y, h int) {
	c := color.RGBA{40, 40, 40, 0}
	u := h / 8
	gocv.Circle(m, image.Pt(x, y+u/2+u/4), u/2+u/8, c, -1)
	gocv.Rectangle(m, image.Rect(x-u, y+u+u/2, x+u, y+4*u+u/2), c, -1)
	gocv.Line(m, image.Pt(x-u, y+2*u), image.Pt(x-u-u/2, y+4*u+u/2), c, u/2)
	gocv.Line(m, image.Pt(x+u, y+2*u), image.Pt(x+u+u/2, y+4*u+u/2), c, u/2)
	gocv.Line(m, image.Pt(x-u/2, y+4*u+u/2), image.Pt(x-u, y+h), c, u*2/3)
	gocv.Line(m, image.Pt(x+u/2, y+4*u+u/2), image.Pt(x+u, y+h), c, u*2/3)
}

// figures is a w x h light grey frame with a silhouette per point (the
// top of its head) of height fh, scaled by w/320.
func figures(w, h, fh int, at ...image.Point) *media.Frame {
	m := gocv.NewMatWithSizeFromScalar(gocv.NewScalar(190, 190, 190, 0), h, w, gocv.MatTypeCV8UC3)
	defer m.Close()
	for _, p := range at {
		drawFigure(&m, p.X*w/320, p.Y*w/320, fh*w/320)
	}
	return FromMat(m)
}

// centreIn reports whether b's centre lies in r.
func centreIn(b media.Box, r image.Rectangle) bool {
	return image.Pt(b.X+b.W/2, b.Y+b.H/2).In(r)
}

// TestHOGPeopleSynthetic: drawn silhouettes are found where they stand
// (also through the downscale, boxes mapped back), a blank frame and a
// frame smaller than the detection window have nobody, min_score and the
// hit threshold filter, and a broken frame is an error.
func TestHOGPeopleSynthetic(t *testing.T) {
	two := []image.Point{{70, 60}, {240, 20}}
	twoAt := func(scale int) []image.Rectangle {
		return []image.Rectangle{image.Rect(50*scale, 60*scale, 90*scale, 170*scale), image.Rect(220*scale, 20*scale, 260*scale, 150*scale)}
	}
	tests := []struct {
		name   string
		params map[string]any
		frame  *media.Frame
		want   []image.Rectangle // a person's centre must lie in each, one box each
	}{
		{"blank", nil, figures(320, 240, 0), nil},
		{"one figure", nil, figures(320, 240, 120, image.Pt(160, 40)), []image.Rectangle{image.Rect(140, 40, 180, 160)}},
		{"two figures", nil, figures(320, 240, 110, two...), twoAt(1)},
		{"two figures at 640, downscaled to 320", map[string]any{"width": 320}, figures(640, 480, 110, two...), twoAt(2)},
		{"two figures at 640, no downscale", map[string]any{"width": 0}, figures(640, 480, 110, two...), twoAt(2)},
		{"a frame smaller than the window", nil, figures(60, 100, 0), nil},
		{"min_score above every score", map[string]any{"min_score": 0.9999}, figures(320, 240, 120, image.Pt(160, 40)), nil},
		{"a high hit threshold", map[string]any{"hit_threshold": 20}, figures(320, 240, 120, image.Pt(160, 40)), nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := New("hog-people", tc.params)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			in := &media.Item{Stream: "s", Seq: 7, Frame: tc.frame, Labels: []string{"kept"}}
			out, err := p.Process(in)
			if err != nil || len(out) != 1 {
				t.Fatalf("Process = %v, %v", out, err)
			}
			o := out[0]
			if o.Frame != in.Frame || o.Seq != 7 || !slices.Equal(o.Labels, in.Labels) {
				t.Errorf("the item changed beyond its boxes: %+v", o)
			}
			if len(o.Boxes) != len(tc.want) {
				t.Fatalf("%d people %v, want %d", len(o.Boxes), o.Boxes, len(tc.want))
			}
			for _, r := range tc.want {
				i := slices.IndexFunc(o.Boxes, func(b media.Box) bool { return centreIn(b, r) })
				if i < 0 {
					t.Errorf("nobody centred in %v: %v", r, o.Boxes)
					continue
				}
				if b := o.Boxes[i]; b.Class != "person" || b.Score <= 0.5 || b.Score > 1 || b.H < b.W {
					t.Errorf("box %+v: want an upright person scoring in (0.5, 1]", b)
				}
			}
		})
	}
	p, _ := New("hog-people", nil)
	defer p.Close()
	if _, err := p.Process(&media.Item{Frame: &media.Frame{W: 100, H: 200, Pix: make([]byte, 10)}}); err == nil || !contains(err.Error(), "hog-people: frame 100x200 has 10 bytes") {
		t.Errorf("short frame: %v", err)
	}
}

// TestHOGPeopleVtest: on OpenCV's pedestrian video the detector finds the
// people walking on the path, at the default width (downscaled from 768)
// and at full size.
func TestHOGPeopleVtest(t *testing.T) {
	fs := videoFrames(t, vtestAVI, 40)
	// At frame 40 two people walk side by side right of the lamp post.
	walkers := image.Rect(540, 200, 650, 340)
	for _, w := range []int{640, 0} {
		p, err := New("hog-people", map[string]any{"width": w})
		if err != nil {
			t.Fatal(err)
		}
		out, err := p.Process(&media.Item{Frame: fs[0]})
		p.Close()
		if err != nil {
			t.Fatal(err)
		}
		if !slices.ContainsFunc(out[0].Boxes, func(b media.Box) bool { return centreIn(b, walkers) }) {
			t.Errorf("width %d: no person among the walkers %v: %v", w, walkers, out[0].Boxes)
		}
	}
}

// TestHOGPeopleConcurrent: callers at once each get a descriptor of their
// own (run with -race) and the same answer; Close then releases them all.
func TestHOGPeopleConcurrent(t *testing.T) {
	p, err := New("hog-people", nil)
	if err != nil {
		t.Fatal(err)
	}
	f := figures(320, 240, 120, image.Pt(160, 40))
	var wg sync.WaitGroup
	counts := make([]int, 4)
	for i := range counts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 3 {
				out, err := p.Process(&media.Item{Frame: f})
				if err != nil {
					t.Error(err)
					return
				}
				counts[i] += len(out[0].Boxes)
			}
		}()
	}
	wg.Wait()
	if !slices.Equal(counts, []int{3, 3, 3, 3}) {
		t.Errorf("people per caller %v, want 3 each", counts)
	}
	p.Close()
	if _, err := p.Process(&media.Item{Frame: f}); err == nil || !contains(err.Error(), "closed") {
		t.Errorf("after Close: %v", err)
	}
}

// BenchmarkHOGPeople640 runs the detector on a 640x480 frame at the
// default width (no downscale); BenchmarkHOGPeople640To320 downscales it to
// 320 wide first.
func BenchmarkHOGPeople640(b *testing.B) { benchHOG(b, nil) }

func BenchmarkHOGPeople640To320(b *testing.B) { benchHOG(b, map[string]any{"width": 320}) }

func benchHOG(b *testing.B, params map[string]any) {
	p, err := New("hog-people", params)
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	it := &media.Item{Frame: figures(640, 480, 110, image.Pt(70, 60), image.Pt(240, 20))}
	for b.Loop() {
		if _, err := p.Process(it); err != nil {
			b.Fatal(err)
		}
	}
}
