package decode

import (
	"fmt"
	"slices"

	"github.com/mdag/mdag/media"
)

// BlazeFace (MediaPipe, front camera, 128x128): per anchor a score logit
// and 16 regressors (the box centre offset and size in input pixels, then
// six key points), for 16x16 cells x 2 anchors and 8x8 cells x 6 anchors.
// Outputs are found by shape (scores [512,1] or [512], regressors [512,16],
// the same for 384), so their order and names do not matter.
const (
	BlazeFaceSize      = 128
	BlazeFaceThreshold = 0.6 // default score threshold
	BlazeFaceNMS       = 0.3 // default IoU for suppression
)

type bfHead struct{ cells, anchors int }

var bfHeads = []bfHead{{16, 2}, {8, 6}}

// BlazeFaceShapes are the output shapes (batch dimension removed) a
// BlazeFace model has: scores then regressors per head.
var BlazeFaceShapes = [][]int64{{512, 1}, {384, 1}, {512, 16}, {384, 16}}

// BlazeFace decodes MediaPipe BlazeFace outputs into face boxes (class
// "face"); Threshold and NMS default to BlazeFaceThreshold/BlazeFaceNMS.
func BlazeFace(outs []Output, g Geometry, p Params) (Result, error) {
	th, iou := p.Threshold, p.NMS
	if th == 0 {
		th = BlazeFaceThreshold
	}
	if iou == 0 {
		iou = BlazeFaceNMS
	}
	var scores, regs [2][]float32
	for _, o := range outs {
		n := size(o.Shape)
		if int64(len(o.Data)) != n {
			return Result{}, fmt.Errorf("blazeface: output %s has %d values for shape %v", o.Name, len(o.Data), o.Shape)
		}
		for hi, h := range bfHeads {
			a := int64(h.cells * h.cells * h.anchors)
			switch {
			case n == a && (len(o.Shape) == 1 || o.Shape[len(o.Shape)-1] == 1):
				scores[hi] = o.Data
			case n == a*16 && o.Shape[len(o.Shape)-1] == 16:
				regs[hi] = o.Data
			}
		}
	}
	for hi := range bfHeads {
		if scores[hi] == nil || regs[hi] == nil {
			var have [][]int64
			for _, o := range outs {
				have = append(have, o.Shape)
			}
			return Result{}, fmt.Errorf("blazeface: want outputs shaped %v (batch removed), have %v", BlazeFaceShapes, have)
		}
	}
	inW, inH := float64(g.InW), float64(g.InH)
	var cands []Detection
	for hi, h := range bfHeads {
		for cy := range h.cells {
			for cx := range h.cells {
				for a := range h.anchors {
					idx := (cy*h.cells+cx)*h.anchors + a
					score := sigmoid(float64(scores[hi][idx]))
					if score < th {
						continue
					}
					r := regs[hi][idx*16 : idx*16+4]
					xc := (float64(cx)+0.5)/float64(h.cells)*inW + float64(r[0])*inW/BlazeFaceSize
					yc := (float64(cy)+0.5)/float64(h.cells)*inH + float64(r[1])*inH/BlazeFaceSize
					w, hh := float64(r[2])*inW/BlazeFaceSize, float64(r[3])*inH/BlazeFaceSize
					cands = append(cands, Detection{xc - w/2, yc - hh/2, xc + w/2, yc + hh/2, 0, score})
				}
			}
		}
	}
	return Result{Boxes: finish(cands, g, iou, []string{"face"})}, nil
}

// Detection is a candidate box in input pixels (corners), its class index
// and score, before suppression.
type Detection struct {
	X1, Y1, X2, Y2 float64
	Class          int
	Score          float64
}

// finish maps candidates to the frame, suppresses overlaps and orders the
// result by score (then position, so equal scores decode the same way).
func finish(cands []Detection, g Geometry, iou float64, labels []string) []media.Box {
	bs := make([]media.Box, 0, len(cands))
	for _, c := range cands {
		bs = append(bs, g.Box(c.X1, c.Y1, c.X2, c.Y2, label(labels, c.Class), c.Score))
	}
	slices.SortStableFunc(bs, func(a, b media.Box) int {
		if a.Score != b.Score {
			if a.Score > b.Score {
				return -1
			}
			return 1
		}
		if a.Y != b.Y {
			return a.Y - b.Y
		}
		return a.X - b.X
	})
	return NMS(bs, iou)
}
