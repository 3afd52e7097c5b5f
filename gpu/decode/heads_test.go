package decode

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"strings"
	"testing"

	"github.com/mdag/mdag/media"
)

// HeadCase is one case of testdata/heads/heads.json (tools/models/heads.py):
// a model's constant outputs and the boxes numpy computed for them.
type HeadCase struct {
	Name, File, Decoder, Format string
	Input                       struct{ W, H int }
	Frame                       struct{ W, H int }
	Letterbox                   bool
	Threshold, NMS              float64
	Labels                      []string
	Outputs                     []struct {
		Name  string
		Shape []int64
		Data  []float32
	}
	Want []WantBox
}

// WantBox is an expected box; Keypoints are x, y, score.
type WantBox struct {
	X, Y, W, H int
	Class      string
	Score      float32
	Keypoints  [][3]float32
}

func readHeads(t *testing.T) []HeadCase {
	b, err := os.ReadFile("testdata/heads/heads.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct{ Cases []HeadCase }
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	if len(d.Cases) < 11 {
		t.Fatalf("%d cases in heads.json", len(d.Cases))
	}
	return d.Cases
}

// sameBoxes says how got differs from want ("" when it does not): the
// boxes exactly, scores within 1e-5, points within 1e-3 pixels.
func sameBoxes(got []media.Box, want []WantBox) string {
	if len(got) != len(want) {
		return fmt.Sprintf("%d boxes %v, want %d %v", len(got), got, len(want), want)
	}
	for i, g := range got {
		w := want[i]
		if g.X != w.X || g.Y != w.Y || g.W != w.W || g.H != w.H || g.Class != w.Class || math.Abs(float64(g.Score-w.Score)) > 1e-5 {
			return fmt.Sprintf("box %d is %v, want %+v", i, g, w)
		}
		if (g.Keypoints != nil) != (w.Keypoints != nil) {
			return fmt.Sprintf("box %d: keypoints %v, want %d", i, g.Keypoints, len(w.Keypoints))
		}
		if g.Keypoints == nil {
			continue
		}
		if len(g.Keypoints.Points) != len(w.Keypoints) {
			return fmt.Sprintf("box %d: %d keypoints, want %d", i, len(g.Keypoints.Points), len(w.Keypoints))
		}
		for j, p := range g.Keypoints.Points {
			q := w.Keypoints[j]
			if math.Abs(float64(p.X-q[0])) > 1e-3 || math.Abs(float64(p.Y-q[1])) > 1e-3 || math.Abs(float64(p.Score-q[2])) > 1e-5 {
				return fmt.Sprintf("box %d point %d is %+v, want %v", i, j, p, q)
			}
		}
	}
	return ""
}

// TestHeads runs each head's constant outputs through its decoder and
// compares with the boxes numpy computed (tools/models/heads.py).
func TestHeads(t *testing.T) {
	for _, tc := range readHeads(t) {
		t.Run(tc.Name, func(t *testing.T) {
			f, ok := Lookup(tc.Decoder)
			if !ok {
				t.Fatalf("no decoder %s", tc.Decoder)
			}
			var outs []Output
			for _, o := range tc.Outputs {
				outs = append(outs, Output{Name: o.Name, Shape: o.Shape, Data: o.Data})
			}
			g := Geometry{InW: tc.Input.W, InH: tc.Input.H, FrameW: tc.Frame.W, FrameH: tc.Frame.H, Letterbox: tc.Letterbox}
			r, err := f(outs, g, Params{Threshold: tc.Threshold, NMS: tc.NMS, Labels: tc.Labels, Format: tc.Format})
			if err != nil {
				t.Fatal(err)
			}
			if d := sameBoxes(r.Boxes, tc.Want); d != "" {
				t.Fatal(d)
			}
			// the graph's shapes take this decoder, and Infer proposes it
			var shapes []Shape
			for _, o := range outs {
				shapes = append(shapes, Shape{Name: o.Name, Dims: o.Shape})
			}
			in := Input{W: tc.Input.W, H: tc.Input.H}
			if err := CheckShapes(tc.Decoder, tc.Format, shapes, in, len(tc.Labels)); err != nil {
				t.Fatalf("CheckShapes: %v", err)
			}
			name, format, why, ok := Infer(shapes, in)
			if want := tc.Format; want == "yolo" {
				format = "yolo" // the alias
			}
			if !ok || name != tc.Decoder || format != tc.Format {
				t.Errorf("Infer: %s %s (%s, %v), want %s %s", name, format, why, ok, tc.Decoder, tc.Format)
			}
		})
	}
}

// Before this decoder existed, a YOLOv8 head read as the YOLOv5 layout
// decoded into garbage; now the static check refuses it, naming yolov8.
func TestYOLOv8AsYOLOv5(t *testing.T) {
	err := CheckShapes("boxes", "yolov5", []Shape{{Name: "output0", Dims: []int64{84, 8400}}}, Input{W: 640, H: 640}, 0)
	if err == nil || !strings.Contains(err.Error(), "format: yolov8") {
		t.Fatalf("error %v", err)
	}
	if err := CheckShapes("boxes", "yolov8", []Shape{{Name: "output0", Dims: []int64{84, 8400}}}, Input{W: 640, H: 640}, 80); err != nil {
		t.Fatal(err)
	}
}

func TestCheckShapes(t *testing.T) {
	in := Input{W: 640, H: 640}
	s := func(dims ...int64) Shape { return Shape{Name: "o", Dims: dims} }
	for _, tc := range []struct {
		name, decoder, format string
		outs                  []Shape
		labels                int
		want                  string // "" = fits
	}{
		{"yolov5", "boxes", "yolov5", []Shape{s(25200, 85)}, 80, ""},
		{"yolov5 symbolic", "boxes", "yolov5", []Shape{s(-1, 85)}, 0, ""},
		{"yolov5 labels", "boxes", "yolov5", []Shape{s(25200, 85)}, 3, "80 classes, the labels file 3"},
		{"yolov5 on yolov8", "boxes", "yolov5", []Shape{s(84, 8400)}, 0, "looks transposed"},
		{"yolov5 two outputs", "boxes", "yolov5", []Shape{s(25200, 85), s(1)}, 0, "2 outputs given"},
		{"yolov5 rank", "boxes", "yolov5", []Shape{s(3, 80, 80, 85)}, 0, "rank 4"},
		{"yolov8 on yolov5", "boxes", "yolov8", []Shape{s(25200, 85)}, 0, "looks like rows of candidates"},
		{"yolov8 on e2e", "boxes", "yolov8", []Shape{s(300, 6)}, 0, "looks like rows of candidates"},
		{"yolov8 p6", "boxes", "yolov8", []Shape{s(84, 8500)}, 0, ""},
		{"yolox", "boxes", "yolox", []Shape{s(8400, 85)}, 0, ""},
		{"yolox wrong K", "boxes", "yolox", []Shape{s(25200, 85)}, 0, "has 25200 anchors; a 640x640 input has 8400"},
		{"ssd-tf", "boxes", "ssd-tf", []Shape{s(100, 4), s(100), s(100), s()}, 0, ""},
		{"ssd-tf two", "boxes", "ssd-tf", []Shape{s(100, 4), s(100, 90)}, 0, "2 outputs given"},
		{"ssd-tf shapes", "boxes", "ssd-tf", []Shape{s(100, 4), s(100, 2), s(100), s()}, 0, "not one [K,4], two [K]"},
		{"detr", "boxes", "detr", []Shape{s(100, 92), s(100, 4)}, 0, ""},
		{"detr no boxes", "boxes", "detr", []Shape{s(100, 92), s(100, 5)}, 0, "is [Q,4]"},
		{"detr Q", "boxes", "detr", []Shape{s(100, 92), s(300, 4)}, 0, "differ in Q"},
		{"rtdetr one", "boxes", "rtdetr", []Shape{s(300, 84)}, 0, ""},
		{"detr one", "boxes", "detr", []Shape{s(300, 84)}, 0, "one output given"},
		{"e2e", "boxes", "e2e", []Shape{s(300, 6)}, 0, ""},
		{"e2e width", "boxes", "e2e", []Shape{s(300, 7)}, 0, "7 values per row, want 6"},
		{"ssd", "boxes", "ssd", []Shape{s(2034, 80), s(2034, 4)}, 0, ""},
		{"ssd K", "boxes", "ssd", []Shape{s(2034, 4), s(1917, 80)}, 0, "differ in K"},
		{"keypoints", "keypoints", "yolov8", []Shape{s(56, 8400)}, 0, ""},
		{"keypoints rows", "keypoints", "yolov8", []Shape{s(84, 8400)}, 0, "84 rows are not 4 + 1 class(es) + 3 per point"},
		{"keypoints transposed", "keypoints", "yolov8", []Shape{s(8400, 56)}, 0, "more rows than columns"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckShapes(tc.decoder, tc.format, tc.outs, in, tc.labels)
			switch {
			case tc.want == "" && err != nil:
				t.Fatal(err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want %q", err, tc.want)
			}
		})
	}
}

func TestInfer(t *testing.T) {
	s := func(name string, dims ...int64) Shape { return Shape{Name: name, Dims: dims} }
	for _, tc := range []struct {
		name string
		outs []Shape
		in   Input
		want string // "name format", or "no"
	}{
		{"yolov8", []Shape{s("output0", 84, 8400)}, Input{640, 640}, "boxes yolov8"},
		{"yolo11 symbolic K", []Shape{s("output0", 84, -1)}, Input{}, "boxes yolov8"},
		{"yolov8-pose", []Shape{s("output0", 56, 8400)}, Input{640, 640}, "keypoints yolov8"},
		{"yolov5", []Shape{s("output0", 25200, 85)}, Input{640, 640}, "boxes yolov5"},
		{"yolov5 one class", []Shape{s("output0", 25200, 6)}, Input{640, 640}, "boxes yolov5"},
		{"yolox", []Shape{s("output", 8400, 85)}, Input{640, 640}, "boxes yolox"},
		{"yolox nano", []Shape{s("output", 3549, 85)}, Input{416, 416}, "boxes yolox"},
		{"yolov10", []Shape{s("output0", 300, 6)}, Input{640, 640}, "boxes e2e"},
		{"rtdetr ultralytics", []Shape{s("output0", 300, 84)}, Input{640, 640}, "boxes rtdetr"},
		{"rtdetr hf", []Shape{s("logits", 300, 80), s("pred_boxes", 300, 4)}, Input{640, 640}, "boxes rtdetr"},
		{"detr hf", []Shape{s("logits", 100, 92), s("pred_boxes", 100, 4)}, Input{800, 800}, "boxes detr"},
		{"ssd", []Shape{s("boxes", 2034, 4), s("scores", 2034, 80)}, Input{320, 320}, "boxes ssd"},
		{"ssd-tf", []Shape{s("detection_boxes", 100, 4), s("detection_classes", 100), s("detection_scores", 100), s("num_detections")}, Input{300, 300}, "boxes ssd-tf"},
		{"blazeface", []Shape{s("a", 512, 1), s("b", 384, 1), s("c", 512, 16), s("d", 384, 16)}, Input{128, 128}, "blazeface "},
		{"classify", []Shape{s("probs", 1000)}, Input{224, 224}, "classify "},
		{"classify 4d", []Shape{s("probs", 1000, 1, 1)}, Input{224, 224}, "classify "},
		{"segmentation", []Shape{s("output0", 116, 8400), s("output1", 32, 160, 160)}, Input{640, 640}, "no"},
		{"feature map", []Shape{s("x", 256, 20, 20)}, Input{640, 640}, "no"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name, format, why, ok := Infer(tc.outs, tc.in)
			got := name + " " + format
			if !ok {
				got = "no"
			}
			if got != tc.want || why == "" {
				t.Fatalf("%s (%s), want %s", got, why, tc.want)
			}
			t.Log(why)
		})
	}
}
