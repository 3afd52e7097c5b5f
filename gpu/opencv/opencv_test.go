package opencv

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"gocv.io/x/gocv"

	"github.com/mdag/mdag/gpu"
	"github.com/mdag/mdag/gpu/decode"
	"github.com/mdag/mdag/media"
	"github.com/mdag/mdag/modules"
	"github.com/mdag/mdag/modules/cv"
)

const blazeFaceFile = "testdata/blazeface/blazeface-front-128.onnx"

// gocvImage reads a test image shipped with the gocv module (in the module
// cache whenever mdag builds).
func gocvImage(t *testing.T, name string) *media.Frame {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "gocv.io/x/gocv").Output()
	if err != nil {
		t.Fatalf("locating gocv: %v", err)
	}
	m := gocv.IMRead(filepath.Join(strings.TrimSpace(string(out)), "images", name), gocv.IMReadColor)
	defer m.Close()
	if m.Empty() {
		t.Fatalf("cannot read gocv's images/%s", name)
	}
	return cv.FromMat(m)
}

func TestOpenCVBlazeFace(t *testing.T) {
	x, err := NewOpenCV([]gpu.ModelFile{{Name: "face-detector", Decoder: "blazeface", Path: blazeFaceFile}}, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	face := gocvImage(t, "face.jpg")
	blank := media.NewFrame(320, 240)
	out, err := x.Run(context.Background(), "face-detector", []*media.Item{{Frame: face}, {Frame: blank}})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != 2 || len(out[0]) != 1 || len(out[1]) != 1 {
		t.Fatalf("outputs %v: want one item per input", out)
	}
	got := out[0][0].Boxes
	if len(got) != 1 {
		t.Fatalf("face.jpg: %d faces %v, want 1", len(got), got)
	}
	if n := len(out[1][0].Boxes); n != 0 {
		t.Errorf("blank frame: %d faces, want 0", n)
	}
	// The DNN and the Haar cascade (a different method entirely) must
	// agree on where the face is.
	ops := modules.NewRegistry()
	modules.Must(cv.Register(ops))
	haar, err := ops.New("haar-face", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer haar.Close()
	hr, err := haar.Process(&media.Item{Frame: face})
	if err != nil || len(hr) != 1 || len(hr[0].Boxes) == 0 {
		t.Fatalf("haar-face on face.jpg: %v %v", hr, err)
	}
	best := 0.0
	for _, h := range hr[0].Boxes {
		best = max(best, decode.IoU(got[0], h))
	}
	if best < 0.4 {
		t.Errorf("blazeface box %+v overlaps the cascade's %v by IoU %.2f, want >= 0.4", got[0], hr[0].Boxes, best)
	}
	t.Logf("face.jpg %dx%d: blazeface %+v, haar %v, IoU %.2f", face.W, face.H, got[0], hr[0].Boxes, best)
}

func TestOpenCVErrors(t *testing.T) {
	tests := []struct {
		name  string
		files []gpu.ModelFile
		want  string
	}{
		{"unknown decoder", []gpu.ModelFile{{Name: "m", Decoder: "yolo", Path: blazeFaceFile}}, `decoder "yolo" unknown (known: blazeface)`},
		{"missing file", []gpu.ModelFile{{Name: "m", Decoder: "blazeface", Path: "testdata/none.onnx"}}, "no such file"},
		{"not onnx", []gpu.ModelFile{{Name: "m", Decoder: "blazeface", Path: "testdata/blazeface/LICENSE"}}, "not an ONNX model OpenCV can read"},
		{"twice", []gpu.ModelFile{{Name: "m", Decoder: "blazeface", Path: blazeFaceFile}, {Name: "m", Decoder: "blazeface", Path: blazeFaceFile}}, "given twice"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			x, err := NewOpenCV(tc.files, 1)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want %q", err, tc.want)
			}
			if x != nil {
				t.Fatal("executor returned with an error")
			}
		})
	}
	x, err := NewOpenCV([]gpu.ModelFile{{Name: "m", Decoder: "blazeface", Path: blazeFaceFile}}, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	if _, err := x.Run(context.Background(), "other", []*media.Item{{Frame: media.NewFrame(8, 8)}}); err == nil || !strings.Contains(err.Error(), `model "other" is not loaded here (loaded: m)`) {
		t.Errorf("unknown model: %v", err)
	}
	if _, err := x.Run(context.Background(), "m", []*media.Item{{Frame: &media.Frame{W: 4, H: 4}}}); err == nil || !strings.Contains(err.Error(), "item 0: frame 4x4 has 0 bytes") {
		t.Errorf("bad frame: %v", err)
	}
	for _, s := range []string{"", "a=b", "=blazeface:x", "a=:x"} {
		if _, err := gpu.ParseModelFile(s); err == nil {
			t.Errorf("gpu.ParseModelFile(%q) accepted", s)
		}
	}
	if f, err := gpu.ParseModelFile("face=blazeface:/m/x.onnx"); err != nil || f != (gpu.ModelFile{Name: "face", Decoder: "blazeface", Path: "/m/x.onnx"}) {
		t.Errorf("ParseModelFile: %+v %v", f, err)
	}
}

// BenchmarkOpenCVBlazeFace is one face image through the real model on the
// CPU target (batch 1, as OpenCV 4.6 runs it).
func BenchmarkOpenCVBlazeFace(b *testing.B) {
	x, err := NewOpenCV([]gpu.ModelFile{{Name: "f", Decoder: "blazeface", Path: blazeFaceFile}}, 1)
	if err != nil {
		b.Fatal(err)
	}
	defer x.Close()
	f := media.NewFrame(640, 480)
	items := []*media.Item{{Frame: f}}
	b.ResetTimer()
	for range b.N {
		if _, err := x.Run(context.Background(), "f", items); err != nil {
			b.Fatal(err)
		}
	}
}
