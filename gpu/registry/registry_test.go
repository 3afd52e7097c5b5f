package registry

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const good = `models:
  face:
    format: onnx
    file: ../onnx/testdata/tiny-classifier.onnx
    input: {name: input, dtype: float32, layout: NCHW, width: 64, height: 64, colour: rgb, scale: 0.00784313725490196, mean: [1, 1, 1], resize: letterbox}
    max_batch: 32
    decoder: {name: classify, top_k: 2, labels: labels.txt}
    devices: [cpu, cuda]
  remote:
    format: kserve
    kserve: {endpoint: "http://triton:8000", model: resnet50, version: "1", shared_memory: "off"}
    input: {name: data, dtype: uint8, layout: NHWC, width: 224, height: 224}
    max_batch: 8
    decoder: {name: boxes, format: yolo, threshold: 0.25}
`

func write(t *testing.T, dir, name, s string) string {
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLoadGood(t *testing.T) {
	write(t, ".", "labels.txt", strings.Repeat("a\n", 9)+"tenth\n")
	t.Cleanup(func() { os.Remove("labels.txt") })
	r, err := Parse("models.yaml", []byte(good))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(r.Names(), ","); got != "face,remote" {
		t.Fatalf("names %s", got)
	}
	f := r.Models["face"]
	if f.Path != "../onnx/testdata/tiny-classifier.onnx" || len(f.Labels) != 10 || f.Labels[9] != "tenth" || f.Input.Std[0] != 1 || f.Input.Resize != "letterbox" {
		t.Fatalf("face: %+v", f)
	}
	if rm := r.Models["remote"]; rm.Input.Colour != "rgb" || rm.Decoder.NMS != 0.45 || rm.Devices[0] != "cpu" || rm.KServe.Model != "resnet50" || rm.KServe.SharedMemory != "off" {
		t.Fatalf("remote defaults: %+v", rm)
	}
	if err := r.CheckFiles(); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Get("nope"); err == nil || !strings.Contains(err.Error(), "it has: face, remote") {
		t.Fatalf("Get(nope): %v", err)
	}
	if r.Line("remote") != 9 {
		t.Fatalf("line of remote: %d", r.Line("remote"))
	}
}

func TestParseErrors(t *testing.T) {
	base := "models:\n  m:\n    format: onnx\n    file: m.onnx\n    input: {name: input, dtype: float32, layout: NCHW, width: 8, height: 8}\n    max_batch: 4\n    decoder: {name: classify}\n"
	for _, tc := range []struct {
		name, yaml string
		want       []string
	}{
		{"empty", "", []string{"models.yaml: empty document"}},
		{"no models", "models: {}\n", []string{"no models"}},
		{"unknown key", strings.Replace(base, "max_batch: 4", "max_batch: 4\n    colour: rgb", 1), []string{"models.yaml:7: models.m.colour"}},
		{"bad format", strings.Replace(base, "format: onnx", "format: tflite", 1), []string{`models.yaml:3: models.m.format: "tflite" unknown (one of onnx, kserve)`}},
		{"no file", strings.Replace(base, "    file: m.onnx\n", "", 1), []string{"models.m.file: missing"}},
		{"bad dtype", strings.Replace(base, "float32", "int64", 1), []string{`models.yaml:5: models.m.input.dtype: "int64" unknown (one of float32, float16, uint8)`}},
		{"bad layout", strings.Replace(base, "NCHW", "CHW", 1), []string{"models.m.input.layout"}},
		{"zero width", strings.Replace(base, "width: 8", "width: 0", 1), []string{"models.m.input.width: 0: want 1..8192"}},
		{"mean count", strings.Replace(base, "height: 8", "height: 8, mean: [1, 2]", 1), []string{"models.m.input.mean: 2 values: want 3"}},
		{"std zero", strings.Replace(base, "height: 8", "height: 8, std: [1, 0, 1]", 1), []string{"models.m.input.std[1]: 0: must be > 0"}},
		{"uint8 scale", strings.Replace(strings.Replace(base, "float32", "uint8", 1), "height: 8", "height: 8, scale: 2", 1), []string{"a uint8 input takes the pixels as they are"}},
		{"max batch", strings.Replace(base, "max_batch: 4", "max_batch: 0", 1), []string{"models.yaml:6: models.m.max_batch: 0: want 1..1024"}},
		{"decoder", strings.Replace(base, "classify", "yolo9", 1), []string{`models.m.decoder.name: "yolo9" unknown (one of blazeface, boxes, classify, ctc, db, keypoints)`}},
		{"boxes format", strings.Replace(base, "{name: classify}", "{name: boxes, format: retina}", 1), []string{`models.m.decoder.format: "retina" unknown (one of ssd, yolo, yolov5, yolov8, yolox, ssd-tf, detr, rtdetr, e2e)`}},
		{"labels missing", strings.Replace(base, "{name: classify}", "{name: classify, labels: nope.txt}", 1), []string{"models.m.decoder.labels", "nope.txt"}},
		{"device", strings.Replace(base, "max_batch: 4", "max_batch: 4\n    devices: [cpu, tpu, cpu]", 1), []string{`models.m.devices[1]: "tpu" unknown`, `models.m.devices[2]: "cpu" given twice`}},
		{"kserve missing", strings.Replace(strings.Replace(base, "format: onnx", "format: kserve", 1), "    file: m.onnx\n", "", 1), []string{"models.m.kserve: missing"}},
		{"kserve endpoint", strings.Replace(strings.Replace(base, "format: onnx", "format: kserve", 1), "file: m.onnx", "kserve: {endpoint: \"ftp://x\", model: \"\"}", 1),
			[]string{"models.m.kserve.endpoint", "scheme must be http or https", "models.m.kserve.model: missing"}},
		{"kserve shared memory", strings.Replace(strings.Replace(base, "format: onnx", "format: kserve", 1), "file: m.onnx", "kserve: {endpoint: \"127.0.0.1:8001\", model: m, shared_memory: always}", 1),
			[]string{`models.yaml:4: models.m.kserve.shared_memory: "always" unknown (one of auto, on, off)`}},
		{"type error", strings.Replace(base, "max_batch: 4", "max_batch: lots", 1), []string{"models.yaml:6: models.m.max_batch"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("models.yaml", []byte(tc.yaml))
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error\n%s\nlacks %q", err, w)
				}
			}
		})
	}
}

func TestReadGraph(t *testing.T) {
	for _, tc := range []struct{ file, in, out string }{
		{"tiny-classifier.onnx", "'input' float32[batch,3,64,64]", "'probs' float32[batch,10]"},
		{"tiny-fixed.onnx", "'input' float32[1,3,64,64]", "'probs' float32[1,10]"},
	} {
		g, err := ReadGraph(filepath.Join("..", "onnx", "testdata", tc.file))
		if err != nil {
			t.Fatal(err)
		}
		if got := list(g.Inputs); got != tc.in {
			t.Errorf("%s inputs %s, want %s (initializers are not inputs)", tc.file, got, tc.in)
		}
		if got := list(g.Outputs); got != tc.out {
			t.Errorf("%s outputs %s, want %s", tc.file, got, tc.out)
		}
	}
	if _, err := ParseGraph([]byte("\xff\xff")); err == nil {
		t.Error("garbage parsed")
	}
	if _, err := ParseGraph(nil); err == nil || !strings.Contains(err.Error(), "no graph") {
		t.Errorf("empty: %v", err)
	}
}

func TestCheck(t *testing.T) {
	g, err := ReadGraph("../onnx/testdata/tiny-classifier.onnx")
	if err != nil {
		t.Fatal(err)
	}
	fixed, err := ReadGraph("../onnx/testdata/tiny-fixed.onnx")
	if err != nil {
		t.Fatal(err)
	}
	mk := func(f func(*Model)) *Model {
		m := &Model{Name: "face", Path: "x/tiny-classifier.onnx", MaxBatch: 8, Decoder: Decoder{Name: "classify"},
			Input: Input{Name: "input", DType: "float32", Layout: "NCHW", Width: 64, Height: 64}}
		f(m)
		return m
	}
	for _, tc := range []struct {
		name string
		m    *Model
		g    *Graph
		want string // "" = no error
	}{
		{"ok", mk(func(*Model) {}), g, ""},
		{"fixed batch 1 at max 1", mk(func(m *Model) { m.MaxBatch = 1 }), fixed, ""},
		{"layout", mk(func(m *Model) { m.Input.Layout = "NHWC" }), g, "model face: input 'input' is float32[batch,3,64,64] in tiny-classifier.onnx, the registry says NHWC 64x64"},
		{"size", mk(func(m *Model) { m.Input.Width = 128 }), g, "the registry says NCHW 128x64"},
		{"dtype", mk(func(m *Model) { m.Input.DType = "uint8" }), g, "the registry says uint8 NCHW 64x64"},
		{"name", mk(func(m *Model) { m.Input.Name = "data" }), g, "model face: no input 'data' in tiny-classifier.onnx (its inputs: 'input' float32[batch,3,64,64])"},
		{"fixed batch", mk(func(*Model) {}), fixed, "its batch dimension is fixed at 1, so it cannot run batches of up to max_batch 8"},
		{"output", mk(func(m *Model) { m.Outputs = []string{"scores"} }), g, "no output 'scores' in tiny-classifier.onnx (its outputs: 'probs' float32[batch,10])"},
		{"labels", mk(func(m *Model) { m.Labels = []string{"a", "b"} }), g, "model face: output 'probs' is float32[batch,10] in tiny-classifier.onnx: 10 classes, the labels file has 2"},
		{"blazeface outputs", mk(func(m *Model) { m.Decoder.Name = "blazeface" }), g, "the blazeface decoder reads 4 outputs, tiny-classifier.onnx gives 1"},
		{"ssd outputs", mk(func(m *Model) { m.Decoder = Decoder{Name: "boxes", Format: "ssd"} }), g, "the boxes decoder (format ssd) reads two outputs, boxes [K,4] (x1,y1,x2,y2 as fractions of the input) and scores [K,C]; tiny-classifier.onnx gives 'probs' float32[batch,10]: one output given"},
		{"yolo outputs", mk(func(m *Model) { m.Decoder = Decoder{Name: "boxes", Format: "yolo"} }), g, "output 'probs' [10] has rank 1 after the batch, want 2"},
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

func FuzzParseRegistry(f *testing.F) {
	f.Add([]byte(good))
	f.Add([]byte("models:\n  m: {format: kserve, kserve: {endpoint: a, model: b}}\n"))
	f.Add([]byte("models: [1, 2]\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := Parse("fuzz.yaml", b)
		if err == nil && len(r.Models) == 0 {
			t.Fatal("no error and no models")
		}
	})
}

func FuzzParseGraph(f *testing.F) {
	for _, n := range []string{"tiny-classifier.onnx", "tiny-fixed.onnx"} {
		b, err := os.ReadFile(filepath.Join("..", "onnx", "testdata", n))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{0x3a, 0x02, 0x5a, 0x00})
	f.Fuzz(func(t *testing.T, b []byte) {
		g, err := ParseGraph(b)
		if err == nil && (len(g.Inputs) == 0 || len(g.Outputs) == 0) {
			t.Fatal("a graph without inputs or outputs accepted")
		}
	})
}

// examples/models.yaml parses; its files come from `make models`, so the
// graphs are checked only where they have been generated.
func TestExampleRegistry(t *testing.T) {
	r, err := Load("../../examples/models.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(r.Names(), ","); got != "blazeface,mobilenetv2,resnet50,resnet50-remote,ssd" {
		t.Fatalf("models %s", got)
	}
	for _, n := range r.Names() {
		m := r.Models[n]
		if m.Format != "onnx" {
			continue
		}
		if _, err := os.Stat(m.Path); err != nil {
			t.Logf("%s: %v (make models)", n, err)
			continue
		}
		g, err := ReadGraph(m.Path)
		if err == nil {
			err = m.Check(g)
		}
		if err != nil {
			t.Errorf("%s: %v", n, err)
		}
	}
}
