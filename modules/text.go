package modules

import (
	"image"
	"math"

	"github.com/mdag/mdag/media"
)

// newTextCrop is the text-crop op (a crop whose cut is TextLine): the rectifying crop in front of a text
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
func newTextCrop(p Params) (Processor, error) {
	w, h, fill := p.Int("width"), p.Int("height"), byte(p.Int("fill"))
	return crop{pad: p.Int("pad"), classes: p.Strings("classes"), minScore: float32(p.Float("min_score")), op: "text-crop",
		cut: func(f *media.Frame, r image.Rectangle) *media.Frame { return TextLine(f, r, w, h, fill) }}, nil
}

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
