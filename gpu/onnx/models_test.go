package onnx

import (
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mdag/mdag/gpu/decode"
	"github.com/mdag/mdag/gpu/registry"
	"github.com/mdag/mdag/media"
)

// The real models of `make models` (build/models, tools/models/README.md)
// through the entries of examples/models.yaml: the registry the examples
// use is the one tested here.

const exampleModels = "../../examples/models.yaml"

// loadExampleModels loads examples/models.yaml, keeps the named entries
// (max_batch raised to maxBatch where given) and loads them on ORT with
// threads intra-op threads (0: ORT's default). It skips
// when the library or the models are absent, unless MDAG_REQUIRE_ORT or
// MDAG_REQUIRE_MODELS is set (make test sets both).
func loadExampleModels(t testing.TB, maxBatch, threads int, names ...string) *Executor {
	t.Helper()
	requireLib(t)
	reg, err := registry.Load(exampleModels)
	if err != nil {
		t.Fatal(err)
	}
	keep := map[string]*registry.Model{}
	for _, n := range names {
		m, err := reg.Get(n)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(m.Path); err != nil {
			if os.Getenv("MDAG_REQUIRE_MODELS") != "" {
				t.Fatalf("%v (MDAG_REQUIRE_MODELS is set: run make models)", err)
			}
			t.Skipf("%v: run make models", err)
		}
		if maxBatch > 0 {
			m.MaxBatch = maxBatch
		}
		keep[n] = m
	}
	reg.Models = keep
	x, err := New(reg, Config{IntraThreads: threads})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(x.Close)
	return x
}

// faceJPEG is gocv's face.jpg (one face), or a skip without gocv's sources.
func faceJPEG(t testing.TB) *media.Frame {
	t.Helper()
	dir, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "gocv.io/x/gocv").Output()
	if err != nil {
		t.Skipf("gocv's images: %v", err)
	}
	return jpegFrame(t, filepath.Join(strings.TrimSpace(string(dir)), "images", "face.jpg"))
}

// shifted is f moved right by dx pixels (edge repeated): another picture
// of the same face.
func shifted(f *media.Frame, dx int) *media.Frame {
	g := media.NewFrame(f.W, f.H)
	for y := range f.H {
		for x := range f.W {
			sx := max(0, x-dx)
			copy(g.Pix[(y*f.W+x)*3:(y*f.W+x)*3+3], f.Pix[(y*f.W+sx)*3:(y*f.W+sx)*3+3])
		}
	}
	return g
}

// TestRealModelBatchEqualsSingles: for BlazeFace (real weights) and the
// generated MobileNetV2, one batch of 8 gives each item the raw outputs 8
// runs at batch 1 give (max |diff| <= 1e-4), and the items differ.
func TestRealModelBatchEqualsSingles(t *testing.T) {
	cases := []struct {
		model  string
		frames func(t *testing.T) []*media.Frame
		shapes string // each item's output shapes
	}{
		{"blazeface", func(t *testing.T) []*media.Frame {
			face := faceJPEG(t)
			fs := []*media.Frame{face, media.NewFrame(320, 240)}
			for i := range 6 {
				if i%2 == 0 {
					fs = append(fs, shifted(face, 20*(i+1)))
				} else {
					fs = append(fs, frame(i, 160+16*i, 120))
				}
			}
			return fs
		}, "[[512 1] [384 1] [512 16] [384 16]]"},
		{"mobilenetv2", func(t *testing.T) []*media.Frame {
			fs := make([]*media.Frame, 8)
			for i := range fs {
				fs[i] = frame(i+1, 96+i*8, 80)
			}
			return fs
		}, "[[1000]]"},
	}
	for _, c := range cases {
		t.Run(c.model, func(t *testing.T) {
			x := loadExampleModels(t, 0, 1, c.model)
			frames := c.frames(t)
			batch, err := x.RunRaw(c.model, frames)
			if err != nil {
				t.Fatal(err)
			}
			if len(batch) != len(frames) {
				t.Fatalf("%d results for %d frames", len(batch), len(frames))
			}
			worst := 0.0
			for i, f := range frames {
				one, err := x.RunRaw(c.model, []*media.Frame{f})
				if err != nil {
					t.Fatal(err)
				}
				var shapes []string
				for j, b := range batch[i] {
					s := one[0][j]
					shapes = append(shapes, fmt.Sprint(b.Shape))
					if b.Name != s.Name || len(b.Data) != len(s.Data) {
						t.Fatalf("item %d output %d: %s %v against %s %v", i, j, b.Name, b.Shape, s.Name, s.Shape)
					}
					for k := range b.Data {
						d := math.Abs(float64(b.Data[k] - s.Data[k]))
						if math.IsNaN(d) {
							t.Fatalf("item %d output %s: NaN", i, b.Name)
						}
						worst = max(worst, d)
					}
				}
				if got := "[" + strings.Join(shapes, " ") + "]"; got != c.shapes {
					t.Fatalf("item %d: output shapes %s, want %s", i, got, c.shapes)
				}
			}
			if worst > 1e-4 {
				t.Fatalf("batch %d differs from %d x batch 1 by %g, want <= 1e-4", len(frames), len(frames), worst)
			}
			if fmt.Sprint(batch[0][0].Data) == fmt.Sprint(batch[1][0].Data) {
				t.Fatal("items 0 and 1 have the same outputs: the batch is one item repeated")
			}
			t.Logf("%s: batch %d vs %d x batch 1: max |diff| %g", c.model, len(frames), len(frames), worst)
		})
	}
}

// TestRealBlazeFaceBatchDecodes: the batch-capable BlazeFace finds the face
// of face.jpg in every slot of a batch (the OpenCV executor's box, IoU >=
// 0.9, moved with the picture) and nothing on blank frames.
func TestRealBlazeFaceBatchDecodes(t *testing.T) {
	x := loadExampleModels(t, 0, 1, "blazeface")
	face := faceJPEG(t)
	cvBox := media.Box{X: 243, Y: 198, W: 229, H: 172} // gpu/opencv's test log
	var items []*media.Item
	var want []*media.Box
	for i := range 8 {
		switch i % 3 {
		case 0:
			items = append(items, &media.Item{Frame: media.NewFrame(320, 240)})
			want = append(want, nil)
		default:
			dx := 10 * i
			b := cvBox
			b.X += dx
			items = append(items, &media.Item{Frame: shifted(face, dx)})
			want = append(want, &b)
		}
	}
	out, err := x.Run(context.Background(), "blazeface", items)
	if err != nil {
		t.Fatal(err)
	}
	for i, o := range out {
		got := o[0].Boxes
		if want[i] == nil {
			if len(got) != 0 {
				t.Errorf("item %d (blank): faces %v", i, got)
			}
			continue
		}
		if len(got) != 1 || decode.IoU(got[0], *want[i]) < 0.9 {
			t.Errorf("item %d: %v, want one face overlapping %v by IoU >= 0.9", i, got, *want[i])
		}
	}
}

// BenchmarkModels: items per second of each `make models` model on ORT CPU
// at batch 1, 8 and 32 (one session, ORT's default intra-op threads: the
// cores), preprocessing of a 320x240 frame included; the batching gain is
// b=32's items/s over b=1's in the same run:
//
//	go test -run '^$' -bench Models -benchtime 20x ./gpu/onnx
func BenchmarkModels(b *testing.B) {
	for _, name := range []string{"blazeface", "mobilenetv2", "ssd", "resnet50"} {
		b.Run(name, func(b *testing.B) {
			x := loadExampleModels(b, 32, 0, name)
			for _, n := range []int{1, 8, 32} {
				frames := make([]*media.Frame, n)
				for i := range frames {
					frames[i] = frame(i, 320, 240)
				}
				b.Run(fmt.Sprintf("b=%d", n), func(b *testing.B) {
					for b.Loop() {
						if _, err := x.RunRaw(name, frames); err != nil {
							b.Fatal(err)
						}
					}
					b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "items/s")
				})
			}
		})
	}
}

// BenchmarkBlazeFaceProfile measures the batch latency examples/face-live's
// profile for worker type ORT-CPU lists: conc batches of b face frames
// (face.jpg, 512x512) at once, each on its own session with 1 intra-op
// thread (mdag serve --executor onnx --intra-threads 1 --sessions 2),
// preprocessing and decoding included. ms/batch is one round's wall time:
//
//	go test -run '^$' -bench BlazeFaceProfile -benchtime 2s ./gpu/onnx
func BenchmarkBlazeFaceProfile(b *testing.B) {
	requireLib(b)
	reg, err := registry.Load(exampleModels)
	if err != nil {
		b.Fatal(err)
	}
	x := loadExampleModels(b, 32, 1, "blazeface")
	x.Close()
	face := faceJPEG(b)
	for _, conc := range []int{1, 2} {
		reg.Models = map[string]*registry.Model{"blazeface": x.models["blazeface"].m}
		y, err := New(reg, Config{IntraThreads: 1, Sessions: conc})
		if err != nil {
			b.Fatal(err)
		}
		for _, n := range []int{1, 2, 4, 8, 16} {
			items := make([]*media.Item, n)
			for i := range items {
				items[i] = &media.Item{Frame: shifted(face, 8*i)}
			}
			b.Run(fmt.Sprintf("c=%d/b=%d", conc, n), func(b *testing.B) {
				errs := make(chan error, conc)
				for b.Loop() {
					for range conc {
						go func() {
							_, err := y.Run(context.Background(), "blazeface", items)
							errs <- err
						}()
					}
					for range conc {
						if err := <-errs; err != nil {
							b.Fatal(err)
						}
					}
				}
				sec := b.Elapsed().Seconds()
				b.ReportMetric(1000*sec/float64(b.N), "ms/batch")
				b.ReportMetric(float64(b.N*n*conc)/sec, "items/s")
			})
		}
		y.Close()
	}
}
