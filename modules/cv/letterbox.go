package cv

import (
	"fmt"
	"image"
	"image/color"
	"math"

	"gocv.io/x/gocv"

	"github.com/mdag/mdag/media"
	"github.com/mdag/mdag/modules"
)

// Letterbox is the transform of the letterbox op from a srcW x srcH frame
// into a W x H one: the frame is scaled by Scale (the same on both axes) to
// a ContentW x ContentH image placed at (Left, Top), and the rest is
// padding. It depends only on the two sizes, so whoever knows a stream's
// frame size recovers it with NewLetterbox and maps detections made on the
// letterboxed frames back with Unmap.
type Letterbox struct {
	W, H               int // output size
	Scale              float64
	ContentW, ContentH int // the scaled frame's size
	Left, Top          int // where the scaled frame starts
}

// NewLetterbox computes the transform of a srcW x srcH frame into w x h
// (all sizes positive): the largest scale that fits, the content centred
// (an odd leftover pixel goes right or bottom).
func NewLetterbox(srcW, srcH, w, h int) Letterbox {
	s := math.Min(float64(w)/float64(srcW), float64(h)/float64(srcH))
	cw := min(w, max(1, int(math.Round(float64(srcW)*s))))
	ch := min(h, max(1, int(math.Round(float64(srcH)*s))))
	return Letterbox{W: w, H: h, Scale: s, ContentW: cw, ContentH: ch, Left: (w - cw) / 2, Top: (h - ch) / 2}
}

// Map returns b (source coordinates) in letterboxed coordinates.
func (l Letterbox) Map(b media.Box) media.Box {
	x0, y0 := l.Left+int(math.Round(float64(b.X)*l.Scale)), l.Top+int(math.Round(float64(b.Y)*l.Scale))
	x1, y1 := l.Left+int(math.Round(float64(b.X+b.W)*l.Scale)), l.Top+int(math.Round(float64(b.Y+b.H)*l.Scale))
	b.X, b.Y, b.W, b.H = x0, y0, x1-x0, y1-y0
	return b
}

// Unmap returns b (letterboxed coordinates) in source coordinates: the
// inverse of Map up to rounding.
func (l Letterbox) Unmap(b media.Box) media.Box {
	x0, y0 := int(math.Round(float64(b.X-l.Left)/l.Scale)), int(math.Round(float64(b.Y-l.Top)/l.Scale))
	x1, y1 := int(math.Round(float64(b.X+b.W-l.Left)/l.Scale)), int(math.Round(float64(b.Y+b.H-l.Top)/l.Scale))
	b.X, b.Y, b.W, b.H = x0, y0, x1-x0, y1-y0
	return b
}

// MapBoxes maps every box (nil stays nil).
func (l Letterbox) MapBoxes(in []media.Box) []media.Box {
	if in == nil {
		return nil
	}
	out := make([]media.Box, len(in))
	for i, b := range in {
		out[i] = l.Map(b)
	}
	return out
}

// letterbox is the letterbox op: the frame scaled into w x h keeping its
// aspect (area interpolation when shrinking, linear when enlarging), the
// rest filled with grey pad; Boxes, Truth and Tracks move with the pixels, so an
// emulated detector's truth stays on its objects.
type letterbox struct {
	w, h int
	pad  uint8
}

func newLetterbox(p modules.Params) (modules.Processor, error) {
	return letterbox{w: p.Int("width"), h: p.Int("height"), pad: uint8(p.Int("pad"))}, nil
}

func (l letterbox) Process(it *media.Item) ([]*media.Item, error) {
	f := it.Frame
	if err := f.Valid(); err != nil {
		return nil, fmt.Errorf("letterbox: %w", err)
	}
	t := NewLetterbox(f.W, f.H, l.w, l.h)
	m, err := ToMat(f)
	if err != nil {
		return nil, fmt.Errorf("letterbox: %w", err)
	}
	defer m.Close()
	interp := gocv.InterpolationArea
	if t.Scale > 1 {
		interp = gocv.InterpolationLinear
	}
	scaled := gocv.NewMat()
	defer scaled.Close()
	gocv.Resize(m, &scaled, image.Pt(t.ContentW, t.ContentH), 0, 0, interp)
	out := gocv.NewMat()
	defer out.Close()
	g := color.RGBA{l.pad, l.pad, l.pad, 0}
	gocv.CopyMakeBorder(scaled, &out, t.Top, l.h-t.ContentH-t.Top, t.Left, l.w-t.ContentW-t.Left, gocv.BorderConstant, g)
	o := *it
	o.Frame = FromMat(out)
	o.Boxes = t.MapBoxes(it.Boxes)
	o.Truth = t.MapBoxes(it.Truth)
	if it.Tracks != nil {
		o.Tracks = make([]media.Track, len(it.Tracks))
		for i, tr := range it.Tracks {
			tr.Box = t.Map(tr.Box)
			o.Tracks[i] = tr
		}
	}
	return []*media.Item{&o}, nil
}

func (letterbox) Close() {}
