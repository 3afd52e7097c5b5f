package registry

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mdag/mdag/gpu/decode"
)

// heads.json's cases (tools/models/heads.py): each model's graph passes
// Check with its decoder, and Infer proposes that decoder from the graph.
func TestCheckHeadModels(t *testing.T) {
	b, err := os.ReadFile("../decode/testdata/heads/heads.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Cases []struct {
			Name, File, Decoder, Format string
			Input                       struct{ W, H int }
			Labels                      []string
		}
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	for _, tc := range d.Cases {
		t.Run(tc.Name, func(t *testing.T) {
			g, err := ReadGraph(filepath.Join("../decode/testdata/heads", tc.File))
			if err != nil {
				t.Fatal(err)
			}
			m := &Model{Name: tc.Name, Path: tc.File, MaxBatch: 4, Labels: tc.Labels, Decoder: Decoder{Name: tc.Decoder, Format: tc.Format},
				Input: Input{Name: "input", DType: "float32", Layout: "NCHW", Width: tc.Input.W, Height: tc.Input.H}}
			if err := m.Check(g); err != nil {
				t.Fatal(err)
			}
			name, format, why, ok := decode.Infer(Shapes(g.Outputs), decode.Input{W: tc.Input.W, H: tc.Input.H})
			if tc.Format == "yolo" {
				format = "yolo"
			}
			if !ok || name != tc.Decoder || format != tc.Format {
				t.Errorf("Infer: %s %s (%s)", name, format, why)
			}
		})
	}
}

func tensor(name string, dims ...int64) Tensor {
	t := Tensor{Name: name, DType: "float32", Dims: []Dim{{Param: "N"}}}
	for _, d := range dims {
		t.Dims = append(t.Dims, Dim{Value: d, Fixed: true})
	}
	return t
}

// A decoder that cannot read the graph's outputs is refused with both
// views: what it reads, what the file gives, and why they differ.
func TestCheckHeads(t *testing.T) {
	in := Tensor{Name: "images", DType: "float32", Dims: []Dim{{Param: "N"}, {Value: 3, Fixed: true}, {Value: 640, Fixed: true}, {Value: 640, Fixed: true}}}
	graph := func(outs ...Tensor) *Graph { return &Graph{Inputs: []Tensor{in}, Outputs: outs} }
	v8 := graph(tensor("output0", 84, 8400))
	mk := func(name, format string, f ...func(*Model)) *Model {
		m := &Model{Name: "det", Path: "models/det.onnx", MaxBatch: 8, Decoder: Decoder{Name: name, Format: format},
			Input: Input{Name: "images", DType: "float32", Layout: "NCHW", Width: 640, Height: 640}}
		for _, f := range f {
			f(m)
		}
		return m
	}
	for _, tc := range []struct {
		name string
		m    *Model
		g    *Graph
		want string // "" = no error
	}{
		{"yolov8", mk("boxes", "yolov8"), v8, ""},
		{"yolov5 on yolov8", mk("boxes", "yolov5"), v8, "model det: the boxes decoder (format yolov5) reads one output [K,5+C] (cx,cy,w,h in input pixels, objectness, C class scores per row); " +
			"det.onnx gives 'output0' float32[N,84,8400]: output 'output0' [84,8400] looks transposed, [4+C,K] with K = 8400 candidates (format: yolov8)"},
		{"yolo on yolov8", mk("boxes", "yolo"), v8, "looks transposed"},
		{"yolov8 labels", mk("boxes", "yolov8", func(m *Model) { m.Labels = []string{"a", "b"} }), v8, "output 'output0' [84,8400] has 80 classes, the labels file 2"},
		{"yolov8 on yolov5", mk("boxes", "yolov8"), graph(tensor("output0", 25200, 85)), "(format yolov8) reads one output [4+C,K]"},
		{"yolox input size", mk("boxes", "yolox", func(m *Model) { m.Input.Width, m.Input.Height = 416, 416 }), graph(tensor("output", 8400, 85)),
			"has 8400 anchors; a 416x416 input has 3549 (strides 8,16,32)"},
		{"ssd-tf two outputs", mk("boxes", "ssd-tf"), graph(tensor("boxes", 100, 4), tensor("scores", 100, 90)),
			"(format ssd-tf) reads four outputs: boxes [K,4] (ymin,xmin,ymax,xmax as fractions), classes [K], scores [K], num_detections [] or [1]; " +
				"det.onnx gives 'boxes' float32[N,100,4], 'scores' float32[N,100,90]: 2 outputs given"},
		{"ssd-tf", mk("boxes", "ssd-tf"), graph(tensor("detection_boxes", 100, 4), tensor("detection_classes", 100), tensor("detection_scores", 100), tensor("num_detections")), ""},
		{"detr", mk("boxes", "detr"), graph(tensor("logits", 100, 92), tensor("pred_boxes", 100, 4)), ""},
		{"detr without boxes", mk("boxes", "detr"), graph(tensor("logits", 100, 92), tensor("x", 100, 8)), "neither 'logits' [100,92] nor 'x' [100,8] is [Q,4]"},
		{"e2e", mk("boxes", "e2e"), graph(tensor("output0", 300, 6)), ""},
		{"e2e on yolov8", mk("boxes", "e2e"), v8, "has 8400 values per row, want 6"},
		{"too many outputs", mk("boxes", "e2e"), graph(tensor("output0", 300, 6), tensor("extra", 300)), "2 outputs given; name the ones it reads, in order, in outputs:"},
		{"pose", mk("keypoints", "yolov8"), graph(tensor("output0", 56, 8400)), ""},
		{"pose on detector", mk("keypoints", "yolov8"), v8, "(format yolov8) reads one output [4+C+3P,K]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.m.Check(tc.g)
			switch {
			case tc.want == "" && err != nil:
				t.Fatal(err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want %q", err, tc.want)
			}
		})
	}
}

// Formats, their defaults and the NMS each gets; a mismatch with the
// file is said at the entry's file:line by CheckFiles (mdag validate --models).
func TestHeadEntries(t *testing.T) {
	dir := t.TempDir()
	heads, err := filepath.Abs("../decode/testdata/heads")
	if err != nil {
		t.Fatal(err)
	}
	entry := func(name, file, dec string) string {
		return "  " + name + ":\n    format: onnx\n    file: " + filepath.Join(heads, file) + "\n" +
			"    input: {name: input, dtype: float32, layout: NCHW, width: 64, height: 64}\n    max_batch: 4\n    decoder: " + dec + "\n"
	}
	y := "models:\n" + entry("v8", "yolov8.onnx", "{name: boxes, format: yolov8}") + entry("e2e", "e2e.onnx", "{name: boxes, format: e2e}") +
		entry("pose", "yolov8-pose.onnx", "{name: keypoints}") + entry("wrong", "yolov8.onnx", "{name: boxes, format: yolov5, nms: 0.5}")
	p := filepath.Join(dir, "models.yaml")
	if err := os.WriteFile(p, []byte(y), 0o644); err != nil {
		t.Fatal(err)
	}
	r, err := Load(p)
	if err != nil {
		t.Fatal(err)
	}
	for n, want := range map[string]string{"v8": "yolov8 0.45", "e2e": "e2e 0", "pose": "yolov8 0.45", "wrong": "yolov5 0.5"} {
		if d := r.Models[n].Decoder; fmt.Sprintf("%s %g", d.Format, d.NMS) != want {
			t.Errorf("%s: format %q nms %g, want %s", n, d.Format, d.NMS, want)
		}
	}
	err = r.CheckFiles()
	if err == nil || !strings.Contains(err.Error(), "models.yaml:22: models.wrong.file: model wrong: the boxes decoder (format yolov5) reads one output [K,5+C]") ||
		!strings.Contains(err.Error(), "yolov8.onnx gives 'output0' float32[N,7,84]") || strings.Count(err.Error(), "\n") != 0 {
		t.Fatalf("CheckFiles: %v", err)
	}
	for _, tc := range []struct{ dec, want string }{
		{"{name: keypoints, format: yolov5}", `models.m.decoder.format: "yolov5" unknown (one of yolov8)`},
		{"{name: classify, format: yolov8}", "models.m.decoder.format: only for the boxes and keypoints decoders"},
	} {
		_, err := Parse(p, []byte("models:\n"+entry("m", "yolov8.onnx", tc.dec)))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.dec, err, tc.want)
		}
	}
}

// examples/pose/models.yaml parses: its pose model is brought by the user.
func TestPoseExampleRegistry(t *testing.T) {
	r, err := Load("../../examples/pose/models.yaml")
	if err != nil {
		t.Fatal(err)
	}
	m, err := r.Get("openpose")
	if err != nil {
		t.Fatal(err)
	}
	if d := m.Decoder; d.Name != "keypoints" || d.Format != "yolov8" {
		t.Fatalf("openpose decoder %+v", d)
	}
	// the graph such an export has passes the check
	g := &Graph{Inputs: []Tensor{{Name: "images", DType: "float32", Dims: []Dim{{Param: "batch"}, {Value: 3, Fixed: true}, {Value: 640, Fixed: true}, {Value: 640, Fixed: true}}}},
		Outputs: []Tensor{tensor("output0", 56, 8400)}}
	if err := m.Check(g); err != nil {
		t.Fatal(err)
	}
}
