package decode

import (
	"fmt"
	"sort"
)

// DB defaults (PaddleOCR's det_db_thresh and det_db_unclip_ratio).
const (
	DefaultBinarize = 0.3
	DefaultUnclip   = 1.5
)

// DB decodes a DB (Differentiable Binarization) text detector, such as
// PaddleOCR's PP-OCR det models: one output, the text probability map
// [1,H,W] (or [H,W]) at the input's resolution or a fraction of it.
//
// The map is thresholded at Params.Binarize (default 0.3); each
// 8-connected region of text pixels is one candidate, scored by the mean
// probability over its pixels and kept when that reaches Threshold
// (PaddleOCR: 0.6) and its bounding box is at least 3 map pixels on each
// side. The box is then unclipped as DB does (the shrunk text kernel
// grown back): by d = area x Params.Unclip / perimeter (default 1.5) on
// every side, and mapped to the frame (Geometry). Boxes are axis-aligned:
// PaddleOCR fits a rotated minimum-area rectangle to the region's contour
// and unclips that polygon; for horizontal text both give the same box,
// for tilted text this one is larger (it holds the tilted line whole).
// Boxes are of class Labels[0] ("text" without labels), in reading order
// (top to bottom, then left to right).
func DB(outs []Output, g Geometry, p Params) (Result, error) {
	if len(outs) != 1 {
		return Result{}, fmt.Errorf("db: want 1 output (the probability map [1,H,W]), have %d", len(outs))
	}
	o := outs[0]
	var mh, mw int
	switch {
	case len(o.Shape) == 3 && o.Shape[0] == 1:
		mh, mw = int(o.Shape[1]), int(o.Shape[2])
	case len(o.Shape) == 2:
		mh, mw = int(o.Shape[0]), int(o.Shape[1])
	default:
		return Result{}, fmt.Errorf("db: output %s has shape %v, want [1,H,W]", o.Name, o.Shape)
	}
	if mh <= 0 || mw <= 0 || len(o.Data) != mh*mw {
		return Result{}, fmt.Errorf("db: output %s has %d values for shape %v", o.Name, len(o.Data), o.Shape)
	}
	bin, unclip := p.Binarize, p.Unclip
	if bin <= 0 {
		bin = DefaultBinarize
	}
	if unclip <= 0 {
		unclip = DefaultUnclip
	}
	class := "text"
	if len(p.Labels) > 0 && p.Labels[0] != "" {
		class = p.Labels[0]
	}
	sx, sy := float64(g.InW)/float64(mw), float64(g.InH)/float64(mh)
	prob := o.Data
	seen := make([]bool, len(prob))
	var stack []int
	var r Result
	for start, v := range prob {
		if seen[start] || float64(v) <= bin {
			continue
		}
		// one region: flood fill (8-connected), its bounding box and mean
		seen[start] = true
		stack = append(stack[:0], start)
		x0, y0, x1, y1 := mw, mh, -1, -1
		n, sum := 0, 0.0
		for len(stack) > 0 {
			i := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			x, y := i%mw, i/mw
			x0, y0, x1, y1 = min(x0, x), min(y0, y), max(x1, x), max(y1, y)
			n++
			sum += float64(prob[i])
			for dy := -1; dy <= 1; dy++ {
				ny := y + dy
				if ny < 0 || ny >= mh {
					continue
				}
				for dx := -1; dx <= 1; dx++ {
					nx := x + dx
					if nx < 0 || nx >= mw {
						continue
					}
					if j := ny*mw + nx; !seen[j] && float64(prob[j]) > bin {
						seen[j] = true
						stack = append(stack, j)
					}
				}
			}
		}
		w, h := float64(x1-x0+1), float64(y1-y0+1)
		score := sum / float64(n)
		if w < 3 || h < 3 || score < p.Threshold {
			continue
		}
		d := w * h * unclip / (2 * (w + h))
		b := g.Box((float64(x0)-d)*sx, (float64(y0)-d)*sy, (float64(x1+1)+d)*sx, (float64(y1+1)+d)*sy, class, score)
		if b.W > 0 && b.H > 0 {
			r.Boxes = append(r.Boxes, b)
		}
	}
	sort.SliceStable(r.Boxes, func(i, j int) bool {
		a, b := r.Boxes[i], r.Boxes[j]
		if a.Y != b.Y {
			return a.Y < b.Y
		}
		return a.X < b.X
	})
	return r, nil
}
