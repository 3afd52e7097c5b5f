package onnx

import (
	"context"
	"fmt"
	"image"
	"image/jpeg"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mdag/mdag/gpu/decode"
	"github.com/mdag/mdag/media"
)

// The real BlazeFace (gpu/opencv/testdata: MediaPipe's weights, batch
// fixed at 1) through ORT and the shared decoder finds the face the OpenCV
// executor finds in gocv's face.jpg.

const blazeEntry = `
  face:
    format: onnx
    file: %s
    input: {name: "input:0", dtype: float32, layout: NHWC, width: 128, height: 128, colour: rgb, scale: 0.00784313725490196, mean: [1, 1, 1]}
    max_batch: %d
    decoder: {name: blazeface}
`

func jpegFrame(t testing.TB, path string) *media.Frame {
	fh, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	img, err := jpeg.Decode(fh)
	if err != nil {
		t.Fatal(err)
	}
	b := img.Bounds()
	f := media.NewFrame(b.Dx(), b.Dy())
	for y := range f.H {
		for x := range f.W {
			r, g, bl, _ := img.At(b.Min.X+x, b.Min.Y+y).RGBA()
			i := (y*f.W + x) * 3
			f.Pix[i], f.Pix[i+1], f.Pix[i+2] = byte(bl>>8), byte(g>>8), byte(r>>8)
		}
	}
	return f
}

func TestBlazeFace(t *testing.T) {
	requireLib(t)
	model, err := filepath.Abs("../opencv/testdata/blazeface/blazeface-front-128.onnx")
	if err != nil {
		t.Fatal(err)
	}
	_, err = New(writeRegistry(t, fmt.Sprintf(blazeEntry, model, 8)), Config{})
	want := "model face: input 'input:0' is float32[1,128,128,3] in blazeface-front-128.onnx: its batch dimension is fixed at 1, so it cannot run batches of up to max_batch 8"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("max_batch 8 on a batch-1 graph: %v, want %q", err, want)
	}
	x, err := New(writeRegistry(t, fmt.Sprintf(blazeEntry, model, 1)), Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	dir, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "gocv.io/x/gocv").Output()
	if err != nil {
		t.Skipf("gocv's images: %v", err)
	}
	face := jpegFrame(t, filepath.Join(strings.TrimSpace(string(dir)), "images", "face.jpg"))
	for _, f := range []*media.Frame{face, media.NewFrame(320, 240)} {
		out, err := x.Run(context.Background(), "face", []*media.Item{{Frame: f}})
		if err != nil {
			t.Fatal(err)
		}
		got := out[0][0].Boxes
		if f != face {
			if len(got) != 0 {
				t.Errorf("blank frame: faces %v", got)
			}
			continue
		}
		// what the OpenCV executor reports on face.jpg (gpu/opencv's test log)
		cvBox := media.Box{X: 243, Y: 198, W: 229, H: 172}
		if len(got) != 1 || decode.IoU(got[0], cvBox) < 0.9 {
			t.Fatalf("face.jpg: %v, want one face overlapping the OpenCV executor's %v by IoU >= 0.9", got, image.Rect(243, 198, 243+229, 198+172))
		}
		t.Logf("face.jpg: onnx %+v, IoU with opencv's box %.3f", got[0], decode.IoU(got[0], cvBox))
	}
}

// BenchmarkBlazeFace is one face image through the real model on ORT
// (the batch-1 graph), preprocessing and decoding included: compare
// gpu/opencv's BenchmarkOpenCVBlazeFace.
func BenchmarkBlazeFace(b *testing.B) {
	requireLib(b)
	model, err := filepath.Abs("../opencv/testdata/blazeface/blazeface-front-128.onnx")
	if err != nil {
		b.Fatal(err)
	}
	x, err := New(writeRegistry(b, fmt.Sprintf(blazeEntry, model, 1)), Config{})
	if err != nil {
		b.Fatal(err)
	}
	defer x.Close()
	dir, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "gocv.io/x/gocv").Output()
	if err != nil {
		b.Skip(err)
	}
	items := []*media.Item{{Frame: jpegFrame(b, filepath.Join(strings.TrimSpace(string(dir)), "images", "face.jpg"))}}
	for b.Loop() {
		if _, err := x.Run(context.Background(), "face", items); err != nil {
			b.Fatal(err)
		}
	}
}
