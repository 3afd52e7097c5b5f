package decode

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/mdag/mdag/media"
)

// Boxes decodes detector outputs; Params.Format names the head. Shapes
// below are per item (the batch dimension removed); "input pixels" are
// the model input's (after the stretch or letterbox, which Geometry
// undoes), "fractions" are of the input's width and height.
//
//   - ssd (the default): two outputs, boxes [K,4] (x1, y1, x2, y2 as
//     fractions) and scores [K,C] (per class; a class labelled
//     "background" is skipped); the best class per box counts. Either
//     order.
//   - yolov5 (alias yolo; also YOLOv7 and a YOLOX export made with
//     --decode_in_inference): one output [K,5+C]: centre x, centre y,
//     width, height in input pixels, objectness, then class scores;
//     score = objectness x class.
//   - yolov8 (also YOLOv9, YOLO11: Ultralytics' export): one output
//     [4+C,K], transposed: centre x, centre y, width, height in input
//     pixels, then class scores (no objectness).
//   - yolox: YOLOX's default export (tools/export_onnx.py without
//     --decode_in_inference): one output [K,5+C] still on the grid: per
//     anchor (strides 8, 16, 32, or with P6 also 64; levels in that
//     order, cells row-major) x and y offsets in cells, log width and
//     height in strides, objectness, class scores (both after sigmoid).
//     K must be the anchor count of the input size.
//   - ssd-tf: TensorFlow Object Detection API exports, four outputs found
//     by shape (and name): boxes [K,4] (ymin, xmin, ymax, xmax as
//     fractions), classes [K] and scores [K] (by name, else in that
//     order), num_detections [] or [1]; the class value indexes the
//     labels as it is (TF counts from 1: give the labels file a first
//     line for 0).
//   - detr: DETR (facebook/detr, Hugging Face exports): class logits
//     [Q,C+1] (softmax; the last class is "no object") and boxes [Q,4]
//     (centre x, centre y, width, height as fractions); outputs told
//     apart by shape, or a name with "box" when both end in 4.
//   - rtdetr: RT-DETR. One output [Q,4+C] (Ultralytics: boxes as for
//     detr, then class scores after sigmoid) or two, boxes [Q,4] and
//     class logits [Q,C] (sigmoid here; no "no object" class).
//   - e2e: heads with the suppression inside (YOLOv10, Ultralytics
//     end-to-end exports): one output [K,6]: x1, y1, x2, y2 in input
//     pixels, score, class index.
//
// Boxes below Threshold go, then NMS per class at Params.NMS; for the
// heads that suppress or match in the model (ssd-tf, detr, rtdetr, e2e)
// an NMS of 0 means none (the registry sets 0.45 only for the others).
func Boxes(outs []Output, g Geometry, p Params) (Result, error) {
	for _, o := range outs {
		if int64(len(o.Data)) != size(o.Shape) {
			return Result{}, fmt.Errorf("boxes: output %s has %d values for shape %v", o.Name, len(o.Data), o.Shape)
		}
	}
	shapes := make([]Shape, len(outs))
	for i, o := range outs {
		shapes[i] = Shape{Name: o.Name, Dims: o.Shape}
	}
	format := p.Format
	if format == "" {
		format = "ssd"
	}
	if !knownFormat("boxes", format) {
		return Result{}, fmt.Errorf("boxes: format %q unknown (%s)", p.Format, strings.Join(Formats("boxes"), ", "))
	}
	// Input{}: the static check (the registry's) also guesses transposed
	// heads from the input's size; at run time the layout is taken as given
	if err := CheckShapes("boxes", format, shapes, Input{}, 0); err != nil {
		return Result{}, fmt.Errorf("boxes (%s): want %s: %w", format, Layout("boxes", format), err)
	}
	var cands []Detection
	inW, inH := float64(g.InW), float64(g.InH)
	switch format {
	case "ssd":
		bo, so := outs[0], outs[1]
		if !isBoxes(shapes[0]) {
			bo, so = so, bo
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
			cands = append(cands, Detection{float64(b[0]) * inW, float64(b[1]) * inH, float64(b[2]) * inW, float64(b[3]) * inH, best, bs})
		}
	case "yolo", "yolov5", "yolox":
		o := outs[0]
		k, w := int(o.Shape[0]), int(o.Shape[1])
		var grid []cell
		if format == "yolox" {
			if grid = yoloxGrid(Input{W: g.InW, H: g.InH}, k); grid == nil {
				return Result{}, fmt.Errorf("boxes (yolox): output %s has %d anchors, a %dx%d input %d (strides 8,16,32) or %d (to 64)", o.Name, k, g.InW, g.InH,
					gridCount(Input{W: g.InW, H: g.InH}, strides5), gridCount(Input{W: g.InW, H: g.InH}, strides6))
			}
		}
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
			if grid != nil {
				c := grid[i]
				cx, cy = (cx+c.x)*c.stride, (cy+c.y)*c.stride
				bw, bh = math.Exp(bw)*c.stride, math.Exp(bh)*c.stride
			}
			cands = append(cands, Detection{cx - bw/2, cy - bh/2, cx + bw/2, cy + bh/2, best, bs})
		}
	case "yolov8":
		o := outs[0]
		c, k := int(o.Shape[0])-4, int(o.Shape[1])
		at := func(row, i int) float64 { return float64(o.Data[row*k+i]) }
		for i := range k {
			best, bs := -1, 0.0
			for j := range c {
				if s := at(4+j, i); best < 0 || s > bs {
					best, bs = j, s
				}
			}
			if bs < p.Threshold {
				continue
			}
			cx, cy, bw, bh := at(0, i), at(1, i), at(2, i), at(3, i)
			cands = append(cands, Detection{cx - bw/2, cy - bh/2, cx + bw/2, cy + bh/2, best, bs})
		}
	case "ssd-tf":
		t := tfOutputs(shapes)
		bo, co, so := outs[t.boxes], outs[t.classes], outs[t.scores]
		k := int(bo.Shape[0])
		n := min(k, max(0, int(math.Round(float64(outs[t.num].Data[0])))))
		for i := range n {
			s := float64(so.Data[i])
			if s < p.Threshold {
				continue
			}
			b := bo.Data[i*4 : i*4+4] // ymin, xmin, ymax, xmax
			cands = append(cands, Detection{float64(b[1]) * inW, float64(b[0]) * inH, float64(b[3]) * inW, float64(b[2]) * inH, int(math.Round(float64(co.Data[i]))), s})
		}
	case "detr", "rtdetr":
		var bo, so Output
		var c int
		raw := true // two outputs: logits
		if len(outs) == 1 {
			o := outs[0]
			q, w := int(o.Shape[0]), int(o.Shape[1])
			c, raw = w-4, false
			bo = Output{Shape: []int64{int64(q), 4}, Data: make([]float32, q*4)}
			so = Output{Shape: []int64{int64(q), int64(c)}, Data: make([]float32, q*c)}
			for i := range q {
				copy(bo.Data[i*4:], o.Data[i*w:i*w+4])
				copy(so.Data[i*c:], o.Data[i*w+4:(i+1)*w])
			}
		} else {
			bi := boxesIndex(shapes)
			bo, so = outs[bi], outs[1-bi]
			c = int(so.Shape[1])
		}
		q := int(bo.Shape[0])
		for i := range q {
			r := so.Data[i*c : (i+1)*c]
			best, bs := -1, 0.0
			if format == "detr" {
				pr := softmax(r)
				for j := range c - 1 { // the last is "no object"
					if best < 0 || pr[j] > bs {
						best, bs = j, pr[j]
					}
				}
			} else {
				for j, v := range r {
					s := float64(v)
					if raw {
						s = sigmoid(s)
					}
					if best < 0 || s > bs {
						best, bs = j, s
					}
				}
			}
			if best < 0 || bs < p.Threshold {
				continue
			}
			b := bo.Data[i*4 : i*4+4]
			cx, cy, bw, bh := float64(b[0])*inW, float64(b[1])*inH, float64(b[2])*inW, float64(b[3])*inH
			cands = append(cands, Detection{cx - bw/2, cy - bh/2, cx + bw/2, cy + bh/2, best, bs})
		}
	case "e2e":
		o := outs[0]
		for i := range int(o.Shape[0]) {
			r := o.Data[i*6 : i*6+6]
			if s := float64(r[4]); s >= p.Threshold && s > 0 {
				cands = append(cands, Detection{float64(r[0]), float64(r[1]), float64(r[2]), float64(r[3]), int(math.Round(float64(r[5]))), s})
			}
		}
	}
	iou := p.NMS
	if iou == 0 && !needsNMS("boxes", format) {
		iou = 1 // nothing overlaps by more than all of it: no suppression
	}
	return Result{Boxes: finish(cands, g, iou, p.Labels)}, nil
}

// Keypoints decodes a pose model (Params.Format yolov8, the only one and
// the default: YOLOv8/YOLO11-pose, Ultralytics' export) into boxes with
// their points: one output [4+C+3P,K], transposed like boxes' yolov8:
// centre x, centre y, width, height in input pixels, C class scores (C
// is the labels' count, 1 without labels: pose models find people), then
// per point x, y in input pixels and a visibility (after sigmoid). COCO
// pose models have P = 17: [56,8400] at 640x640. Boxes below Threshold
// go, then NMS per class (default 0.45 from the registry); points are
// mapped to the frame like the boxes and kept inside it.
func Keypoints(outs []Output, g Geometry, p Params) (Result, error) {
	for _, o := range outs {
		if int64(len(o.Data)) != size(o.Shape) {
			return Result{}, fmt.Errorf("keypoints: output %s has %d values for shape %v", o.Name, len(o.Data), o.Shape)
		}
	}
	format := p.Format
	if format == "" {
		format = "yolov8"
	}
	if !knownFormat("keypoints", format) {
		return Result{}, fmt.Errorf("keypoints: format %q unknown (%s)", p.Format, strings.Join(Formats("keypoints"), ", "))
	}
	shapes := make([]Shape, len(outs))
	for i, o := range outs {
		shapes[i] = Shape{Name: o.Name, Dims: o.Shape}
	}
	if err := CheckShapes("keypoints", format, shapes, Input{}, len(p.Labels)); err != nil {
		return Result{}, fmt.Errorf("keypoints (%s): want %s: %w", format, Layout("keypoints", format), err)
	}
	o := outs[0]
	rows, k := int(o.Shape[0]), int(o.Shape[1])
	c := max(1, len(p.Labels))
	np := (rows - 4 - c) / 3
	at := func(row, i int) float64 { return float64(o.Data[row*k+i]) }
	var bs []media.Box
	for i := range k {
		best, score := -1, 0.0
		for j := range c {
			if s := at(4+j, i); best < 0 || s > score {
				best, score = j, s
			}
		}
		if score < p.Threshold {
			continue
		}
		cx, cy, bw, bh := at(0, i), at(1, i), at(2, i), at(3, i)
		b := g.Box(cx-bw/2, cy-bh/2, cx+bw/2, cy+bh/2, label(p.Labels, best), score)
		kp := &media.Keypoints{Points: make([]media.Keypoint, np)}
		for j := range np {
			x, y := g.Point(at(4+c+3*j, i), at(4+c+3*j+1, i))
			kp.Points[j] = media.Keypoint{X: float32(x), Y: float32(y), Score: float32(at(4+c+3*j+2, i))}
		}
		b.Keypoints = kp
		bs = append(bs, b)
	}
	iou := p.NMS
	if iou == 0 {
		iou = DefaultNMS
	}
	return Result{Boxes: finishBoxes(bs, iou)}, nil
}

// Point maps a point in input pixels to the frame, kept inside it.
func (g Geometry) Point(x, y float64) (float64, float64) {
	sx, sy, px, py := g.Fit()
	return math.Min(math.Max((x-px)/sx, 0), float64(g.FrameW)), math.Min(math.Max((y-py)/sy, 0), float64(g.FrameH))
}

// finishBoxes orders frame boxes as finish does and suppresses overlaps.
func finishBoxes(bs []media.Box, iou float64) []media.Box {
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

func softmax(r []float32) []float64 {
	m := math.Inf(-1)
	for _, v := range r {
		m = max(m, float64(v))
	}
	out := make([]float64, len(r))
	sum := 0.0
	for i, v := range r {
		out[i] = math.Exp(float64(v) - m)
		sum += out[i]
	}
	for i := range out {
		out[i] /= sum
	}
	return out
}
