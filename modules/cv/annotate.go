package cv

import (
	"fmt"
	"hash/fnv"
	"image"
	"image/color"
	"strings"

	"gocv.io/x/gocv"

	"github.com/mdag/mdag/media"
	"github.com/mdag/mdag/modules"
)

// annotate draws an item's results onto a copy of its frame: each box's
// outline in its class's colour (with "class score" above it), each track's
// outline in its id's colour (with "#id"), the labels at the top left and
// the events at the bottom left. Items are shared between modules, so the
// input frame is never written: ToMat copies it.
type annotate struct {
	thickness int
	text      bool
}

// annotateFont is the text's face and scale; annotateMaxLines bounds the
// labels and events written (a busy frame stays readable).
const (
	annotateFont      = gocv.FontHersheySimplex
	annotateFontScale = 0.5
	annotateMaxLines  = 8
)

// palette are the outline colours (distinct, readable on video); a class
// or a track id picks one by hash.
var palette = []color.RGBA{
	{230, 25, 75, 0}, {60, 180, 75, 0}, {255, 225, 25, 0}, {0, 130, 200, 0}, {245, 130, 48, 0},
	{145, 30, 180, 0}, {70, 240, 240, 0}, {240, 50, 230, 0}, {210, 245, 60, 0}, {250, 190, 212, 0},
}

// classColour is the colour of a class's boxes.
func classColour(class string) color.RGBA {
	h := fnv.New32a()
	_, _ = h.Write([]byte(class))
	return palette[h.Sum32()%uint32(len(palette))]
}

// trackColour is the colour of a track's box.
func trackColour(id uint64) color.RGBA { return palette[id%uint64(len(palette))] }

var (
	white = color.RGBA{255, 255, 255, 0}
	black = color.RGBA{0, 0, 0, 0}
)

func newAnnotate(p modules.Params) (modules.Processor, error) {
	return annotate{thickness: p.Int("thickness"), text: p.Int("labels") == 1}, nil
}

func (a annotate) Process(it *media.Item) ([]*media.Item, error) {
	m, err := ToMat(it.Frame)
	if err != nil {
		return nil, fmt.Errorf("annotate: %w", err)
	}
	defer m.Close()
	for _, b := range it.Boxes {
		a.box(&m, b.Rect(), classColour(b.Class), fmt.Sprintf("%s %.2f", b.Class, b.Score))
	}
	for _, t := range it.Tracks {
		label := fmt.Sprintf("#%d", t.ID)
		if t.Box.Class != "" {
			label += " " + t.Box.Class
		}
		a.box(&m, t.Box.Rect(), trackColour(t.ID), label)
	}
	if a.text {
		var lines []string
		lines = append(lines, it.Labels...)
		if len(lines) > annotateMaxLines {
			lines = append(lines[:annotateMaxLines-1], fmt.Sprintf("(+%d labels)", len(it.Labels)-annotateMaxLines+1))
		}
		a.lines(&m, lines, true)
		var ev []string
		for _, e := range it.Events {
			s := strings.TrimSpace(fmt.Sprintf("%s %s #%d %s", e.Kind, e.Rule, e.Track, e.Detail))
			ev = append(ev, s)
		}
		if len(ev) > annotateMaxLines {
			ev = append(ev[:annotateMaxLines-1], fmt.Sprintf("(+%d events)", len(it.Events)-annotateMaxLines+1))
		}
		a.lines(&m, ev, false)
	}
	o := *it
	o.Frame = FromMat(m)
	return []*media.Item{&o}, nil
}

// box draws r's outline in c and, with text on, label on a filled tab of
// c just above it (inside the frame when r touches the top).
func (a annotate) box(m *gocv.Mat, r image.Rectangle, c color.RGBA, label string) {
	if r.Empty() {
		return
	}
	// The outline is thickness pixels inside the box (OpenCV's own
	// thick lines straddle the edge and are always odd).
	t := min(a.thickness, r.Dx(), r.Dy())
	for _, band := range []image.Rectangle{
		image.Rect(r.Min.X, r.Min.Y, r.Max.X, r.Min.Y+t), image.Rect(r.Min.X, r.Max.Y-t, r.Max.X, r.Max.Y),
		image.Rect(r.Min.X, r.Min.Y, r.Min.X+t, r.Max.Y), image.Rect(r.Max.X-t, r.Min.Y, r.Max.X, r.Max.Y),
	} {
		fill(m, band, c)
	}
	if !a.text {
		return
	}
	sz, base := gocv.GetTextSizeWithBaseline(label, annotateFont, annotateFontScale, 1)
	y := r.Min.Y
	if y-sz.Y-base < 0 {
		y = r.Min.Y + sz.Y + base + t
	}
	tab := image.Rect(r.Min.X, y-sz.Y-base, r.Min.X+sz.X+4, y)
	fill(m, tab, c)
	gocv.PutText(m, label, image.Pt(tab.Min.X+2, y-base), annotateFont, annotateFontScale, textOn(c), 1)
}

// lines writes lines at the top left (top) or bottom left of m on black.
func (a annotate) lines(m *gocv.Mat, lines []string, top bool) {
	if len(lines) == 0 {
		return
	}
	_, lh := gocv.GetTextSizeWithBaseline("Ag", annotateFont, annotateFontScale, 1)
	step := gocv.GetTextSize("Ag", annotateFont, annotateFontScale, 1).Y + lh + 4
	y := 4
	if !top {
		y = m.Rows() - 4 - step*len(lines)
	}
	for _, l := range lines {
		sz := gocv.GetTextSize(l, annotateFont, annotateFontScale, 1)
		fill(m, image.Rect(2, y, 2+sz.X+6, y+step), black)
		gocv.PutText(m, l, image.Pt(5, y+step-lh-2), annotateFont, annotateFontScale, white, 1)
		y += step
	}
}

// fill paints r (exclusive of its Max corner, as image.Rectangle means)
// in c; OpenCV clips what lies outside m.
func fill(m *gocv.Mat, r image.Rectangle, c color.RGBA) {
	if r.Empty() {
		return
	}
	gocv.RectangleWithParams(m, image.Rect(r.Min.X, r.Min.Y, r.Max.X-1, r.Max.Y-1), c, -1, gocv.Line8, 0)
}

// textOn is black or white, whichever reads better on c.
func textOn(c color.RGBA) color.RGBA {
	if int(c.R)*299+int(c.G)*587+int(c.B)*114 > 128*1000 {
		return black
	}
	return white
}

func (annotate) Close() {}
