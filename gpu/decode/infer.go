package decode

import (
	"fmt"
	"slices"
)

// Infer proposes a decoder for a model from its outputs' shapes (the
// batch removed, -1 where symbolic; in the graph's order) and its input's
// size (0 where unknown): the decoder's name, its format ("" for the
// decoders without one), why (the rule that matched and what it could not
// tell, for a person to check) and ok, false when no rule fits (why then
// says what was seen). Shapes are all it reads: two heads with the same
// layout cannot be told apart (a YOLOX export with or without
// --decode_in_inference, DETR or RT-DETR logits of unusual sizes), so the
// proposal is a starting point that `mdag validate --models` then checks.
//
// The rules, first match wins (G: the cells of a YOLO head on the input,
// strides 8, 16, 32, or to 64 for P6 models: 8400 at 640x640):
//
//  1. four outputs [512,1], [384,1], [512,16], [384,16] in any order:
//     blazeface;
//  2. four outputs, one [K,4], two [K] and one [] or [1]: boxes ssd-tf;
//  3. two outputs, one [K,4]: with an output named like "logits", a
//     transformer: rtdetr when Q is 300 or the classes 80 (RT-DETR's
//     defaults), else detr (DETR's Q is 100, its COCO logits 92); without
//     such a name boxes ssd;
//  4. one output of one dimension above 1 (e.g. [1000] or [1000,1,1]):
//     classify;
//  5. one output [R,K] with R < K, or K symbolic (a transposed head):
//     keypoints yolov8 when R is 56 (one class and 17 COCO points, YOLOv8
//     pose), else boxes yolov8 (C = R-4);
//  6. one output [K,W] with K >= W, or K symbolic: K = G, boxes yolox (the
//     raw export; a decoded one is yolov5's layout); K = 3G, boxes yolov5;
//     W = 6, boxes e2e (YOLOv10: K is 300); K <= 300, boxes rtdetr
//     (Ultralytics' RT-DETR, [300,4+C]); else boxes yolov5.
//
// A proposal whose shapes CheckShapes refuses is not made (ok false).
func Infer(outs []Shape, in Input) (name, format, why string, ok bool) {
	name, format, why = infer(outs, in)
	if name == "" {
		return "", "", why, false
	}
	if err := CheckShapes(name, format, outs, in, 0); err != nil {
		return "", "", fmt.Sprintf("%s, but: %v", why, err), false
	}
	return name, format, why, true
}

func infer(outs []Shape, in Input) (name, format, why string) {
	g5, g6 := gridCount(in, strides5), gridCount(in, strides6)
	grid := func(k int64) string {
		switch {
		case k <= 0 || g5 == 0:
			return ""
		case k == g5:
			return "G"
		case k == g6:
			return "G6"
		case k == 3*g5:
			return "3G"
		case k == 3*g6:
			return "3G6"
		}
		return ""
	}
	switch len(outs) {
	case 4:
		have := map[string]int{}
		for _, o := range outs {
			have[fmt.Sprint(o.Dims)]++
		}
		if have["[512 1]"] == 1 && have["[384 1]"] == 1 && have["[512 16]"] == 1 && have["[384 16]"] == 1 {
			return "blazeface", "", "four outputs shaped like MediaPipe BlazeFace's two heads (scores [512,1], [384,1], regressors [512,16], [384,16])"
		}
		if t := tfOutputs(outs); t.boxes >= 0 && t.classes >= 0 && t.scores >= 0 && t.num >= 0 {
			return "boxes", "ssd-tf", fmt.Sprintf("four outputs, boxes %s, classes %s, scores %s and a count %s: the TF Object Detection API's "+
				"(check: boxes are ymin,xmin,ymax,xmax fractions; class values index the labels as they are)", outs[t.boxes], outs[t.classes], outs[t.scores], outs[t.num])
		}
	case 2:
		bi := boxesIndex(outs)
		if bi < 0 || len(outs[1-bi].Dims) != 2 {
			break
		}
		b, s := outs[bi], outs[1-bi]
		q, c := b.Dims[0], s.Dims[1]
		if named(s, "logit") {
			if q == 300 || c == 80 {
				return "boxes", "rtdetr", fmt.Sprintf("boxes %s and logits %s with %d queries, %d classes: RT-DETR's defaults (sigmoid per class; "+
					"if the logits have a no-object class, DETR-style softmax, use detr)", b, s, q, c)
			}
			return "boxes", "detr", fmt.Sprintf("boxes %s and logits %s: a DETR-style set prediction (softmax with the last class \"no object\"; "+
				"if the logits are per class with sigmoid, RT-DETR, use rtdetr)", b, s)
		}
		return "boxes", "ssd", fmt.Sprintf("boxes %s and scores %s (check: boxes are x1,y1,x2,y2 fractions of the input, anchors decoded in the graph)", b, s)
	case 1:
		o := outs[0]
		big := 0
		for _, d := range o.Dims {
			if d != 1 {
				big++
			}
		}
		if big == 1 && slices.Max(o.Dims) > 1 && o.Dims[0] > 1 {
			return "classify", "", fmt.Sprintf("one output %s of %d class scores (check: probabilities, or logits: softmax: true)", o, o.Dims[0])
		}
		if len(o.Dims) != 2 {
			break
		}
		r, k := o.Dims[0], o.Dims[1]
		if r > 0 && (k < 0 || r < k) {
			if r == 56 {
				return "keypoints", "yolov8", fmt.Sprintf("one output %s: 56 rows = 4 box + 1 class + 17 points x 3, YOLOv8/YOLO11-pose (Ultralytics)", o)
			}
			return "boxes", "yolov8", fmt.Sprintf("one output %s, fewer rows than candidates: 4 box rows + %d class scores per column, YOLOv8/v9/YOLO11 (Ultralytics)%s",
				o, r-4, map[bool]string{true: "", false: fmt.Sprintf("; %d candidates is not the grid of a %dx%d input (%d): check the input size", k, in.W, in.H, g5)}[k <= 0 || g5 == 0 || grid(k) != ""])
		}
		if k <= 0 || (r > 0 && r < k) {
			break
		}
		switch grid(r) {
		case "G", "G6":
			return "boxes", "yolox", fmt.Sprintf("one output %s, one candidate per grid cell of the %dx%d input: YOLOX's raw export "+
				"(if it was exported with --decode_in_inference, boxes in pixels, use yolov5)", o, in.W, in.H)
		case "3G", "3G6":
			return "boxes", "yolov5", fmt.Sprintf("one output %s, three anchors per grid cell of the %dx%d input: YOLOv5/YOLOv7 (4 box + objectness + %d classes)", o, in.W, in.H, k-5)
		}
		switch {
		case k == 6:
			return "boxes", "e2e", fmt.Sprintf("one output %s of 6 values per row: an end-to-end head with NMS inside (YOLOv10: x1,y1,x2,y2,score,class in input pixels)", o)
		case r > 0 && r <= 300 && k >= 5:
			return "boxes", "rtdetr", fmt.Sprintf("one output %s: %d queries of 4 box values (fractions) + %d class scores, Ultralytics' RT-DETR", o, r, k-4)
		case k >= 6:
			return "boxes", "yolov5", fmt.Sprintf("one output %s of candidates with 4 box values, objectness and %d classes: YOLOv5-style "+
				"(the candidates match no grid of the input: check the layout)", o, k-5)
		}
	}
	var have []string
	for _, o := range outs {
		have = append(have, o.String())
	}
	return "", "", fmt.Sprintf("no known head has outputs %v", have)
}
