// Package decode holds the model output decoders: pure Go functions,
// named, that turn one item's output tensors into detections
// or labels. The model registry (gpu/registry) names a decoder per model
// and every executor (gpu/onnx, gpu/opencv) calls the same function, so a
// model decodes the same way whichever runtime ran it.
//
// Built in: classify (top-k labels), blazeface (MediaPipe BlazeFace front,
// 128x128: anchors, score threshold, NMS), boxes (the detector heads
// users bring, by Params.Format: ssd, yolov5 (alias yolo), yolov8 (v9,
// YOLO11), yolox, ssd-tf, detr, rtdetr, e2e; see Boxes), keypoints
// (YOLOv8/YOLO11-pose: boxes with media.Keypoints), db (DB text
// detection: probability map to text boxes) and ctc (CTC text recognition: greedy decoding against a keys
// file).
//
// CheckShapes says whether a decoder and format can read outputs of given
// shapes (the registry's check, `mdag validate --models`); Infer proposes
// a decoder from the shapes alone (`mdag models inspect`).
package decode

import (
	"cmp"
	"fmt"
	"image"
	"math"
	"slices"
	"sort"

	"github.com/mdag/mdag/media"
)

// Output is one output tensor of one item: the batch dimension removed.
type Output struct {
	Name  string
	Shape []int64 // without the batch dimension
	Data  []float32
}

// Geometry maps model-input pixels back to the frame the item carried.
type Geometry struct {
	InW, InH       int  // the model's input size
	FrameW, FrameH int  // the frame's size
	Letterbox      bool // the frame was scaled keeping its aspect and centred (else stretched)
}

// Fit is how the frame lies in the input: scale factors and padding.
func (g Geometry) Fit() (sx, sy, padX, padY float64) {
	sx, sy = float64(g.InW)/float64(g.FrameW), float64(g.InH)/float64(g.FrameH)
	if g.Letterbox {
		s := min(sx, sy)
		return s, s, (float64(g.InW) - float64(g.FrameW)*s) / 2, (float64(g.InH) - float64(g.FrameH)*s) / 2
	}
	return sx, sy, 0, 0
}

// Box maps a box given in input pixels (corners) to a frame box, clipped.
func (g Geometry) Box(x1, y1, x2, y2 float64, class string, score float64) media.Box {
	sx, sy, px, py := g.Fit()
	fx1, fy1 := (x1-px)/sx, (y1-py)/sy
	fx2, fy2 := (x2-px)/sx, (y2-py)/sy
	b := media.Box{X: int(math.Floor(fx1)), Y: int(math.Floor(fy1)), W: int(math.Round(fx2 - fx1)), H: int(math.Round(fy2 - fy1)),
		Class: class, Score: float32(score)}
	r := b.Rect().Intersect(image.Rect(0, 0, g.FrameW, g.FrameH))
	b.X, b.Y, b.W, b.H = r.Min.X, r.Min.Y, r.Dx(), r.Dy()
	return b
}

// Params are a decoder's settings from the registry.
type Params struct {
	Threshold float64  // the score a detection needs
	NMS       float64  // IoU above which the weaker of two detections goes
	TopK      int      // classify: labels kept
	Softmax   bool     // classify: the output is logits
	Labels    []string // class names by index
	Format    string   // boxes and keypoints: the head's layout (Formats)
	Binarize  float64  // db: the probability a text pixel needs (0: DefaultBinarize)
	Unclip    float64  // db: how far boxes grow back, DB's unclip ratio (0: DefaultUnclip)
	Space     float64  // ctc: the space class's probability that makes a gap between characters a space (0: only where it is the best class)
}

// Result is what a decoder found in one item.
type Result struct {
	Boxes  []media.Box
	Labels []string
}

// Func decodes one item's outputs.
type Func func(outs []Output, g Geometry, p Params) (Result, error)

// funcs holds the decoders by name: a literal, fixed at build time (no
// registration, no init side effects, nothing to lock).
var funcs = map[string]Func{"classify": Classify, "blazeface": BlazeFace, "boxes": Boxes, "keypoints": Keypoints, "db": DB, "ctc": CTC}

// Lookup returns the decoder named name.
func Lookup(name string) (Func, bool) {
	f, ok := funcs[name]
	return f, ok
}

// Names lists the decoders, sorted.
func Names() []string {
	out := make([]string, 0, len(funcs))
	for n := range funcs {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

func size(shape []int64) int64 {
	n := int64(1)
	for _, d := range shape {
		n *= d
	}
	return n
}

func label(labels []string, i int) string {
	if i >= 0 && i < len(labels) && labels[i] != "" {
		return labels[i]
	}
	return fmt.Sprintf("class%d", i)
}

// Classify keeps the top-k classes of a single output of class scores
// (probabilities, or logits with Softmax) whose score reaches Threshold.
func Classify(outs []Output, _ Geometry, p Params) (Result, error) {
	if len(outs) != 1 {
		return Result{}, fmt.Errorf("classify: want 1 output of class scores, have %d", len(outs))
	}
	o := outs[0]
	if int64(len(o.Data)) != size(o.Shape) || len(o.Data) == 0 {
		return Result{}, fmt.Errorf("classify: output %s has %d values for shape %v", o.Name, len(o.Data), o.Shape)
	}
	if len(p.Labels) > 0 && len(p.Labels) != len(o.Data) {
		return Result{}, fmt.Errorf("classify: output %s has %d classes, the labels file %d", o.Name, len(o.Data), len(p.Labels))
	}
	k := min(max(1, p.TopK), len(o.Data))
	top := topK(o.Data, k)
	// softmax is monotonic: the top k of the logits are the top k of the
	// probabilities (ranked by logit, also where probabilities underflow
	// to 0), and only a threshold needs the probabilities themselves (a
	// full sort of 1,000 classes per item took 0.22 ms: 7.3 ms of a
	// ResNet-50 batch of 32 on an H200's host)
	score := func(v float32) float64 { return float64(v) }
	switch {
	case p.Softmax && p.Threshold <= 0: // every probability reaches it
		score = func(float32) float64 { return 0 }
	case p.Softmax:
		m := math.Inf(-1)
		for _, v := range o.Data {
			if !math.IsNaN(float64(v)) {
				m = max(m, float64(v))
			}
		}
		sum := 0.0
		for _, v := range o.Data {
			if !math.IsNaN(float64(v)) {
				sum += math.Exp(float64(v) - m)
			}
		}
		score = func(v float32) float64 { return math.Exp(float64(v)-m) / sum }
	}
	var r Result
	for _, i := range top {
		if score(o.Data[i]) < p.Threshold {
			break
		}
		r.Labels = append(r.Labels, label(p.Labels, i))
	}
	return r, nil
}

// topK is the indices of the k highest values of s, highest first, the
// lower index first among equal values; NaN is no score and never kept.
// One pass with insertion into k places, O(n k), for the small k a
// classifier keeps; a stable sort above insertionK.
func topK(s []float32, k int) []int {
	if k > insertionK {
		idx := make([]int, 0, len(s))
		for i, v := range s {
			if v == v {
				idx = append(idx, i)
			}
		}
		slices.SortStableFunc(idx, func(a, b int) int { return cmp.Compare(s[b], s[a]) })
		return idx[:min(k, len(idx))]
	}
	top := make([]int, 0, k)
	for i, v := range s {
		if v != v { // NaN
			continue
		}
		if len(top) == k && v <= s[top[k-1]] {
			continue
		}
		j := len(top)
		if j < k {
			top = append(top, i)
		} else {
			j = k - 1
		}
		for ; j > 0 && v > s[top[j-1]]; j-- {
			top[j] = top[j-1]
		}
		top[j] = i
	}
	return top
}

// insertionK is the largest k topK selects by insertion.
const insertionK = 32

// NMS keeps the best-scoring boxes, dropping any that overlaps a kept one
// of the same class by more than iou, and boxes with no area.
func NMS(bs []media.Box, iou float64) []media.Box {
	sort.SliceStable(bs, func(i, j int) bool { return bs[i].Score > bs[j].Score })
	var keep []media.Box
	for _, b := range bs {
		if b.W <= 0 || b.H <= 0 {
			continue
		}
		ok := true
		for _, k := range keep {
			if k.Class == b.Class && IoU(b, k) > iou {
				ok = false
				break
			}
		}
		if ok {
			keep = append(keep, b)
		}
	}
	return keep
}

// IoU is the intersection over union of two boxes.
func IoU(a, b media.Box) float64 {
	in := a.Rect().Intersect(b.Rect())
	if in.Empty() {
		return 0
	}
	i := float64(in.Dx() * in.Dy())
	return i / (float64(a.W*a.H+b.W*b.H) - i)
}

func sigmoid(x float64) float64 { return 1 / (1 + math.Exp(-x)) }
