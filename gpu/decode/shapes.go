package decode

import (
	"fmt"
	"slices"
	"strings"
)

// Shape is an output tensor as a graph declares it, without the batch
// dimension: its name and dimensions, -1 where symbolic (unknown until
// run). The registry's check and Infer read these.
type Shape struct {
	Name string
	Dims []int64
}

func (s Shape) String() string {
	d := make([]string, len(s.Dims))
	for i, v := range s.Dims {
		d[i] = "?"
		if v > 0 {
			d[i] = fmt.Sprint(v)
		}
	}
	return "'" + s.Name + "' [" + strings.Join(d, ",") + "]"
}

// Input is the model input's size in pixels (0 where unknown).
type Input struct{ W, H int }

// DefaultNMS is the IoU for suppression the registry gives the decoders
// that need one (Params.NMS 0).
const DefaultNMS = 0.45

// formats per decoder, the default first.
var formats = map[string][]string{
	"boxes":     {"ssd", "yolo", "yolov5", "yolov8", "yolox", "ssd-tf", "detr", "rtdetr", "e2e"},
	"keypoints": {"yolov8"},
}

// Formats lists the formats the decoder takes, its default first (none:
// the decoder has no format).
func Formats(decoder string) []string { return slices.Clone(formats[decoder]) }

func knownFormat(decoder, format string) bool { return slices.Contains(formats[decoder], format) }

// NMS reports the IoU for suppression a decoder and format get when the
// registry gives none: DefaultNMS for heads that leave overlapping boxes
// (ssd, yolo, yolov5, yolov8, yolox, keypoints), 0 for those that
// suppress or match inside the model (ssd-tf, detr, rtdetr, e2e: 0 is
// none) and for the decoders with their own default (blazeface).
func NMSFor(decoder, format string) float64 {
	if needsNMS(decoder, format) {
		return DefaultNMS
	}
	return 0
}

func needsNMS(decoder, format string) bool {
	switch decoder {
	case "keypoints":
		return true
	case "boxes":
		return !slices.Contains([]string{"ssd-tf", "detr", "rtdetr", "e2e"}, format)
	}
	return false
}

// Layout says in words what a decoder and format read, e.g. "one output
// [4+C,K] (...)": the registry's check prints it beside the graph's view.
func Layout(decoder, format string) string {
	switch decoder + "/" + format {
	case "boxes/ssd", "boxes/":
		return "two outputs, boxes [K,4] (x1,y1,x2,y2 as fractions of the input) and scores [K,C]"
	case "boxes/yolo", "boxes/yolov5":
		return "one output [K,5+C] (cx,cy,w,h in input pixels, objectness, C class scores per row)"
	case "boxes/yolov8":
		return "one output [4+C,K] (cx,cy,w,h in input pixels, then C class scores, per column)"
	case "boxes/yolox":
		return "one output [K,5+C] on the grid of strides 8,16,32 (or 8..64) of the input (x,y cell offsets, log w,h, objectness, C class scores)"
	case "boxes/ssd-tf":
		return "four outputs: boxes [K,4] (ymin,xmin,ymax,xmax as fractions), classes [K], scores [K], num_detections [] or [1]"
	case "boxes/detr":
		return "two outputs: boxes [Q,4] (cx,cy,w,h as fractions) and class logits [Q,C+1] (the last: no object)"
	case "boxes/rtdetr":
		return "one output [Q,4+C] (cx,cy,w,h as fractions, then C class scores) or two: boxes [Q,4] and class logits [Q,C]"
	case "boxes/e2e":
		return "one output [K,6] (x1,y1,x2,y2 in input pixels, score, class)"
	case "keypoints/yolov8", "keypoints/":
		return "one output [4+C+3P,K] (cx,cy,w,h in input pixels, C class scores (C: the labels' count, else 1), then P points x,y,visibility, per column)"
	case "classify/":
		return "one output of class scores"
	case "blazeface/":
		return fmt.Sprintf("four outputs shaped %v", BlazeFaceShapes)
	}
	return "?"
}

// CheckShapes says why outputs shaped outs cannot be read by the decoder
// and format (nil: they can, as far as fixed dimensions tell): their
// number, rank, layout and sizes; the input's size (when known) for
// YOLOX's grid and to recognise a transposed YOLO head; labels (the
// labels file's count, 0 for none) against the classes.
func CheckShapes(decoder, format string, outs []Shape, in Input, labels int) error {
	n := func(want int) error {
		if len(outs) != want {
			if len(outs) == 1 {
				return fmt.Errorf("one output given")
			}
			return fmt.Errorf("%d outputs given", len(outs))
		}
		return nil
	}
	rank := func(s Shape, r int) error {
		if len(s.Dims) != r {
			return fmt.Errorf("output %s has rank %d after the batch, want %d", s, len(s.Dims), r)
		}
		return nil
	}
	classes := func(s Shape, c int64) error {
		if c > 0 && labels > 0 && c != int64(labels) {
			return fmt.Errorf("output %s has %d classes, the labels file %d", s, c, labels)
		}
		return nil
	}
	// pair checks two outputs, boxes [N,4] and a second [N,C] (scores or
	// logits, what), with N (dim) agreeing; it returns the second
	pair := func(dim, what string) (Shape, error) {
		if err := n(2); err != nil {
			return Shape{}, err
		}
		bi := boxesIndex(outs)
		if bi < 0 {
			return Shape{}, fmt.Errorf("neither %s nor %s is [%s,4]", outs[0], outs[1], dim)
		}
		b, s := outs[bi], outs[1-bi]
		if err := rank(s, 2); err != nil {
			return Shape{}, err
		}
		if n1, n2 := b.Dims[0], s.Dims[0]; n1 > 0 && n2 > 0 && n1 != n2 {
			return Shape{}, fmt.Errorf("boxes %s and %s %s differ in %s", b, what, s, dim)
		}
		return s, nil
	}
	// with the input's size known (the registry's check), a head with
	// more classes than candidates is taken for a transposed one
	known := in.W > 0 && in.H > 0
	g5, g6 := gridCount(in, strides5), gridCount(in, strides6)
	isGrid := func(k int64) bool { return k > 0 && (k == g5 || k == g6) }
	switch decoder {
	case "keypoints":
		if err := n(1); err != nil {
			return err
		}
		s := outs[0]
		if err := rank(s, 2); err != nil {
			return err
		}
		r, k := s.Dims[0], s.Dims[1]
		c := int64(max(1, labels))
		if known && r > 0 && k > 0 && r > k {
			return fmt.Errorf("output %s has more rows than columns: it looks like [K,%d], not [4+C+3P,K]", s, k)
		}
		if r > 0 && (r-4-c < 3 || (r-4-c)%3 != 0) {
			return fmt.Errorf("output %s: %d rows are not 4 + %d class(es) + 3 per point", s, r, c)
		}
		return nil
	case "boxes":
	default:
		return nil
	}
	switch format {
	case "ssd", "":
		s, err := pair("K", "scores")
		if err != nil {
			return err
		}
		return classes(s, s.Dims[1])
	case "yolo", "yolov5", "yolox":
		if err := n(1); err != nil {
			return err
		}
		s := outs[0]
		if err := rank(s, 2); err != nil {
			return err
		}
		k, w := s.Dims[0], s.Dims[1]
		if w > 0 && w < 6 {
			return fmt.Errorf("output %s has %d values per row, want 5 + at least one class", s, w)
		}
		if isGrid(w) || (known && k > 0 && w > 0 && w > k) {
			return fmt.Errorf("output %s looks transposed, [4+C,K] with K = %d candidates (format: yolov8)", s, w)
		}
		if format == "yolox" && k > 0 && known && !isGrid(k) {
			return fmt.Errorf("output %s has %d anchors; a %dx%d input has %d (strides 8,16,32) or %d (with 64): a raw YOLOX head on another input size, or another head", s, k, in.W, in.H, g5, g6)
		}
		if w > 0 {
			return classes(s, w-5)
		}
		return nil
	case "yolov8":
		if err := n(1); err != nil {
			return err
		}
		s := outs[0]
		if err := rank(s, 2); err != nil {
			return err
		}
		r, k := s.Dims[0], s.Dims[1]
		if r > 0 && r < 5 {
			return fmt.Errorf("output %s has %d rows, want 4 + at least one class", s, r)
		}
		if isGrid(r) || (known && r > 0 && k > 0 && r > k) {
			return fmt.Errorf("output %s looks like rows of candidates, [K,%d] (format: yolov5, yolox or e2e by what the rows hold)", s, k)
		}
		if r > 0 {
			return classes(s, r-4)
		}
		return nil
	case "ssd-tf":
		if err := n(4); err != nil {
			return err
		}
		if t := tfOutputs(outs); t.boxes < 0 || t.num < 0 || t.classes < 0 || t.scores < 0 {
			return fmt.Errorf("not one [K,4], two [K] and one [] or [1]")
		}
		return nil
	case "detr", "rtdetr":
		if len(outs) == 1 && format == "rtdetr" {
			s := outs[0]
			if err := rank(s, 2); err != nil {
				return err
			}
			if w := s.Dims[1]; w > 0 && w < 5 {
				return fmt.Errorf("output %s has %d values per query, want 4 + at least one class", s, w)
			}
			return nil
		}
		s, err := pair("Q", "logits")
		if err != nil {
			return err
		}
		if c := s.Dims[1]; format == "detr" && c > 0 && c < 2 {
			return fmt.Errorf("logits %s: want at least one class and the no-object class", s)
		}
		return nil
	case "e2e":
		if err := n(1); err != nil {
			return err
		}
		s := outs[0]
		if err := rank(s, 2); err != nil {
			return err
		}
		if w := s.Dims[1]; w > 0 && w != 6 {
			return fmt.Errorf("output %s has %d values per row, want 6", s, w)
		}
		return nil
	}
	return fmt.Errorf("format %q unknown", format)
}

var (
	strides5 = []int{8, 16, 32}
	strides6 = []int{8, 16, 32, 64}
)

// gridCount is the number of cells of a YOLO-style head over strides
// (0 when the input size is unknown).
func gridCount(in Input, strides []int) int64 {
	if in.W <= 0 || in.H <= 0 {
		return 0
	}
	var n int64
	for _, s := range strides {
		n += int64((in.W+s-1)/s) * int64((in.H+s-1)/s)
	}
	return n
}

type cell struct{ x, y, stride float64 }

// yoloxGrid lists the cells of a YOLOX head of k anchors on the input:
// levels by stride, cells row-major (nil if k is not the count).
func yoloxGrid(in Input, k int) []cell {
	for _, ss := range [][]int{strides5, strides6} {
		if gridCount(in, ss) != int64(k) {
			continue
		}
		g := make([]cell, 0, k)
		for _, s := range ss {
			w, h := (in.W+s-1)/s, (in.H+s-1)/s
			for y := range h {
				for x := range w {
					g = append(g, cell{float64(x), float64(y), float64(s)})
				}
			}
		}
		return g
	}
	return nil
}

// isBoxes reports whether s is [K,4].
func isBoxes(s Shape) bool { return len(s.Dims) == 2 && s.Dims[1] == 4 }

// boxesIndex is which of two outputs holds the boxes [K,4]: the only one
// so shaped, else the one named like boxes, else the first; -1 if none.
func boxesIndex(outs []Shape) int {
	a, b := isBoxes(outs[0]), isBoxes(outs[1])
	switch {
	case a && !b:
		return 0
	case b && !a:
		return 1
	case !a && !b:
		return -1
	case !named(outs[0], "box") && named(outs[1], "box"):
		return 1
	}
	return 0
}

func named(s Shape, w string) bool { return strings.Contains(strings.ToLower(s.Name), w) }

type tfIdx struct{ boxes, classes, scores, num int }

// tfOutputs finds the TF Object Detection API outputs by shape: boxes
// [K,4], num_detections [] or [1], and two [K]: classes and scores by
// name, else in that order (the exports' alphabetical one). -1: missing.
func tfOutputs(outs []Shape) tfIdx {
	t := tfIdx{-1, -1, -1, -1}
	var vec []int
	for i, s := range outs {
		switch {
		case isBoxes(s) && t.boxes < 0:
			t.boxes = i
		case (len(s.Dims) == 0 || (len(s.Dims) == 1 && s.Dims[0] == 1)) && t.num < 0:
			t.num = i
		case len(s.Dims) == 1:
			vec = append(vec, i)
		}
	}
	if len(vec) != 2 {
		return t
	}
	t.classes, t.scores = vec[0], vec[1]
	if named(outs[vec[0]], "score") || named(outs[vec[1]], "class") {
		t.classes, t.scores = vec[1], vec[0]
	}
	return t
}
