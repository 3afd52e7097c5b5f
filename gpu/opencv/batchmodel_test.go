package opencv

import (
	"context"
	"image"
	"math"
	"os"
	"path/filepath"
	"testing"

	"gocv.io/x/gocv"

	"github.com/mdag/mdag/gpu"
	"github.com/mdag/mdag/gpu/decode"
	"github.com/mdag/mdag/media"
	"github.com/mdag/mdag/modules/cv"
)

// batchBlazeFace is `make models`'s batch-capable rewrite of the testdata
// model (tools/models/blazeface_batch.py): the same weights, a symbolic
// batch dimension.
var batchBlazeFace = filepath.Join("..", "..", "build", "models", "blazeface-front-128.onnx")

// needModel skips when `make models` has not run, or fails when
// MDAG_REQUIRE_MODELS is set (so CI that builds the models cannot skip).
func needModel(t *testing.T, path string) {
	t.Helper()
	if _, err := os.Stat(path); err != nil {
		if os.Getenv("MDAG_REQUIRE_MODELS") != "" {
			t.Fatalf("%v (MDAG_REQUIRE_MODELS is set: run make models)", err)
		}
		t.Skipf("%v: run make models", err)
	}
}

// TestBatchBlazeFaceEqualsOriginal: at batch 1 the rewritten model's four
// raw outputs equal the original's within 1e-4 on OpenCV DNN.
func TestBatchBlazeFaceEqualsOriginal(t *testing.T) {
	needModel(t, batchBlazeFace)
	load := func(path string) *gocv.Net {
		n := gocv.ReadNetFromONNX(path)
		if n.Empty() {
			t.Fatalf("%s: OpenCV cannot read it", path)
		}
		if err := checkBlazeFace(&n); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		return &n
	}
	orig, rewritten := load(blazeFaceFile), load(batchBlazeFace)
	defer orig.Close()
	defer rewritten.Close()

	face := gocvImage(t, "face.jpg")
	tests := []struct {
		name string
		fill func(i int, data []float32)
	}{
		{"zeros", func(int, []float32) {}},
		{"ramp", func(i int, d []float32) { d[i] = float32(i%255)/127.5 - 1 }},
		{"lcg", func(i int, d []float32) { d[i] = float32(uint32(i)*1664525+1013904223)/(1<<31) - 1 }},
		{"face.jpg", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in := gocv.NewMatWithSizes([]int{1, bfSize, bfSize, 3}, gocv.MatTypeCV32F)
			defer in.Close()
			data, err := in.DataPtrFloat32()
			if err != nil {
				t.Fatal(err)
			}
			if tc.fill != nil {
				for i := range data {
					tc.fill(i, data)
				}
			} else {
				fillFace(t, face, data)
			}
			a, err := forward(orig, in)
			if err != nil {
				t.Fatal(err)
			}
			defer closeAll(a)
			b, err := forward(rewritten, in)
			if err != nil {
				t.Fatal(err)
			}
			defer closeAll(b)
			for i, name := range bfOutputs {
				x, _ := a[i].DataPtrFloat32()
				y, _ := b[i].DataPtrFloat32()
				if len(x) != len(y) || len(x) == 0 {
					t.Fatalf("%s: %d values, rewritten %d", name, len(x), len(y))
				}
				worst := 0.0
				for j := range x {
					worst = max(worst, math.Abs(float64(x[j]-y[j])))
				}
				if worst > 1e-4 {
					t.Errorf("%s: max |original - rewritten| = %g, want <= 1e-4", name, worst)
				}
				t.Logf("%s: %d values, max |original - rewritten| = %g", name, len(x), worst)
			}
		})
	}
}

// fillFace writes f as the BlazeFace input (the executor's preprocessing).
func fillFace(t *testing.T, f *media.Frame, data []float32) {
	t.Helper()
	src, err := cv.ToMat(f)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	small := gocv.NewMat()
	defer small.Close()
	gocv.Resize(src, &small, image.Pt(bfSize, bfSize), 0, 0, gocv.InterpolationLinear)
	px := small.ToBytes()
	for i := 0; i < len(px); i += 3 {
		data[i] = float32(px[i+2])/127.5 - 1
		data[i+1] = float32(px[i+1])/127.5 - 1
		data[i+2] = float32(px[i])/127.5 - 1
	}
}

// TestBatchBlazeFaceExecutor: the OpenCV executor loads the rewritten
// model and finds the same face as with the original.
func TestBatchBlazeFaceExecutor(t *testing.T) {
	needModel(t, batchBlazeFace)
	x, err := NewOpenCV([]gpu.ModelFile{
		{Name: "orig", Decoder: "blazeface", Path: blazeFaceFile},
		{Name: "batch", Decoder: "blazeface", Path: batchBlazeFace},
	}, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	face := gocvImage(t, "face.jpg")
	var got [2][]media.Box
	for i, m := range []string{"orig", "batch"} {
		out, err := x.Run(context.Background(), m, []*media.Item{{Frame: face}})
		if err != nil {
			t.Fatalf("%s: %v", m, err)
		}
		got[i] = out[0][0].Boxes
	}
	if len(got[0]) != 1 || len(got[1]) != len(got[0]) {
		t.Fatalf("faces: original %v, rewritten %v; want the same single face", got[0], got[1])
	}
	if iou := decode.IoU(got[0][0], got[1][0]); iou < 0.99 {
		t.Errorf("face: original %+v, rewritten %+v, IoU %.3f, want >= 0.99", got[0][0], got[1][0], iou)
	}
}
