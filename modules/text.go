package modules

import (
	"fmt"
	"image"
	"math"
	"slices"

	"github.com/mdag/mdag/media"
)

// textCrop is the text-crop op: the rectifying crop in front of a text
// recogniser (PP-OCR rec). Per matching box it cuts the box out of the
// frame (pad pixels around it), scales it to height pixels keeping its
// aspect (bilinear), and places it left-aligned in a width x height
// frame, the rest filled with grey fill: PP-OCR's resize_norm_img, whose
// padding is 0 after (x/255 - 0.5)/0.5, i.e. grey 127.5. A box wider
// than width at that height is squeezed to width (PP-OCR does the same).
// Every crop has the same size, so the recogniser's registry entry has
// one input size and the scheduler batches crops of any stream together;
// the padding is the cost of that (the recogniser runs on width columns
// whatever the text's). The pixels stay BGR bytes: the normalisation is
// the registry entry's (scale, mean, std), as for every model.
//
// Boxes are axis-aligned (the db decoder's), so rectifying is scaling;
// a rotated box would need a perspective warp here. The item keeps the
// box as its Region (as crop does), for place to put the text back.
type textCrop struct {
	w, h, pad int
	fill      byte
	classes   []string
	minScore  float32
}

func newTextCrop(p Params) (Processor, error) {
	return textCrop{w: p.Int("width"), h: p.Int("height"), pad: p.Int("pad"), fill: byte(p.Int("fill")),
		classes: p.Strings("classes"), minScore: float32(p.Float("min_score"))}, nil
}

func (c textCrop) Process(it *media.Item) ([]*media.Item, error) {
	if err := it.Frame.Valid(); err != nil {
		return nil, fmt.Errorf("text-crop: %w", err)
	}
	var out []*media.Item
	for _, b := range it.Boxes {
		if len(c.classes) > 0 && !slices.Contains(c.classes, b.Class) {
			continue
		}
		if b.Score < c.minScore {
			continue
		}
		r := image.Rect(b.X-c.pad, b.Y-c.pad, b.X+b.W+c.pad, b.Y+b.H+c.pad).Intersect(image.Rect(0, 0, it.Frame.W, it.Frame.H))
		if r.Empty() {
			continue
		}
		o := it.Derive()
		box := b
		o.Region = &box
		o.Frame = TextLine(it.Frame, r, c.w, c.h, c.fill)
		out = append(out, o)
	}
	return out, nil
}

func (textCrop) Close() {}

// TextLine cuts r out of f and returns it as a w x h text line: scaled to
// height h keeping its aspect (at most w wide, at least 1), bilinear,
// left-aligned, the rest grey fill.
func TextLine(f *media.Frame, r image.Rectangle, w, h int, fill byte) *media.Frame {
	o := &media.Frame{W: w, H: h, Pix: make([]byte, w*h*3)}
	for i := range o.Pix {
		o.Pix[i] = fill
	}
	rw := min(w, max(1, int(math.Ceil(float64(r.Dx())*float64(h)/float64(r.Dy())))))
	sx, sy := float64(r.Dx())/float64(rw), float64(r.Dy())/float64(h)
	stride := f.W * 3
	for y := range h {
		fy := min(max((float64(y)+0.5)*sy-0.5, 0), float64(r.Dy()-1))
		iy := int(fy)
		dy := fy - float64(iy)
		r0 := f.Pix[(r.Min.Y+iy)*stride:]
		r1 := f.Pix[(r.Min.Y+min(iy+1, r.Dy()-1))*stride:]
		for x := range rw {
			fx := min(max((float64(x)+0.5)*sx-0.5, 0), float64(r.Dx()-1))
			ix := int(fx)
			dx := fx - float64(ix)
			p0, p1 := (r.Min.X+ix)*3, (r.Min.X+min(ix+1, r.Dx()-1))*3
			d := (y*w + x) * 3
			for k := range 3 {
				top := float64(r0[p0+k]) + (float64(r0[p1+k])-float64(r0[p0+k]))*dx
				bot := float64(r1[p0+k]) + (float64(r1[p1+k])-float64(r1[p0+k]))*dx
				o.Pix[d+k] = byte(math.Round(top + (bot-top)*dy))
			}
		}
	}
	return o
}

// place is the place op: it puts a crop's result back onto the frame.
// Per item with a Region (a crop, e.g. text-crop -> a recogniser with the
// ctc decoder) it emits one box, the region, classed by the item's first
// label (the text read) and scored by its first box's score (the
// recogniser's confidence; else the region's score); the labels are
// carried. An item without a Region or without labels is passed with no
// boxes: nothing was read there. So a frame's result lists each string
// read with where it is in the frame.
type place struct{}

func (place) Process(it *media.Item) ([]*media.Item, error) {
	o := it.Derive()
	o.Region, o.Labels = it.Region, it.Labels
	if it.Region != nil && len(it.Labels) > 0 {
		b := *it.Region
		b.Class = it.Labels[0]
		if len(it.Boxes) > 0 {
			b.Score = it.Boxes[0].Score
		}
		o.Boxes = []media.Box{b}
	}
	return []*media.Item{o}, nil
}

func (place) Close() {}
