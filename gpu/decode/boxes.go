package decode

import "fmt"

// Boxes decodes SSD- or YOLO-style detector outputs (Params.Format):
//   - ssd: two outputs, boxes [K,4] (x1, y1, x2, y2 as fractions of the
//     input) and scores [K,C] (per class; a class labelled "background" is
//     skipped); the best class per box counts;
//   - yolo: one output [K,5+C]: centre x, centre y, width, height in input
//     pixels, objectness, then class scores; score = objectness x class.
//
// Boxes below Threshold go, then NMS per class.
func Boxes(outs []Output, g Geometry, p Params) (Result, error) {
	for _, o := range outs {
		if int64(len(o.Data)) != size(o.Shape) {
			return Result{}, fmt.Errorf("boxes: output %s has %d values for shape %v", o.Name, len(o.Data), o.Shape)
		}
	}
	var cands []Detection
	switch p.Format {
	case "ssd", "":
		if len(outs) != 2 {
			return Result{}, fmt.Errorf("boxes (ssd): want 2 outputs (boxes [K,4], scores [K,C]), have %d", len(outs))
		}
		bo, so := outs[0], outs[1]
		if len(bo.Shape) == 2 && bo.Shape[1] != 4 && len(so.Shape) == 2 && so.Shape[1] == 4 {
			bo, so = so, bo
		}
		if len(bo.Shape) != 2 || bo.Shape[1] != 4 || len(so.Shape) != 2 || so.Shape[0] != bo.Shape[0] {
			return Result{}, fmt.Errorf("boxes (ssd): want boxes [K,4] and scores [K,C], have %s %v and %s %v", bo.Name, bo.Shape, so.Name, so.Shape)
		}
		k, c := int(bo.Shape[0]), int(so.Shape[1])
		for i := range k {
			best, bs := -1, 0.0
			for j := range c {
				if j < len(p.Labels) && p.Labels[j] == "background" {
					continue
				}
				if s := float64(so.Data[i*c+j]); best < 0 || s > bs {
					best, bs = j, s
				}
			}
			if best < 0 || bs < p.Threshold {
				continue
			}
			b := bo.Data[i*4 : i*4+4]
			cands = append(cands, Detection{float64(b[0]) * float64(g.InW), float64(b[1]) * float64(g.InH),
				float64(b[2]) * float64(g.InW), float64(b[3]) * float64(g.InH), best, bs})
		}
	case "yolo":
		if len(outs) != 1 || len(outs[0].Shape) != 2 || outs[0].Shape[1] < 6 {
			return Result{}, fmt.Errorf("boxes (yolo): want one output [K,5+C]")
		}
		o := outs[0]
		k, w := int(o.Shape[0]), int(o.Shape[1])
		for i := range k {
			r := o.Data[i*w : (i+1)*w]
			best, bs := -1, 0.0
			for j, s := range r[5:] {
				if s := float64(r[4]) * float64(s); best < 0 || s > bs {
					best, bs = j, s
				}
			}
			if bs < p.Threshold {
				continue
			}
			cx, cy, bw, bh := float64(r[0]), float64(r[1]), float64(r[2]), float64(r[3])
			cands = append(cands, Detection{cx - bw/2, cy - bh/2, cx + bw/2, cy + bh/2, best, bs})
		}
	default:
		return Result{}, fmt.Errorf("boxes: format %q unknown (ssd or yolo)", p.Format)
	}
	return Result{Boxes: finish(cands, g, p.NMS, p.Labels)}, nil
}
