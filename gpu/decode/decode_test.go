package decode

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/mdag/mdag/media"
)

func TestClassify(t *testing.T) {
	probs := Output{Name: "p", Shape: []int64{4}, Data: []float32{0.1, 0.6, 0.05, 0.25}}
	for _, tc := range []struct {
		name string
		outs []Output
		p    Params
		want string // labels joined, or "error: ..."
	}{
		{"top1", []Output{probs}, Params{}, "class1"},
		{"top3 labels", []Output{probs}, Params{TopK: 3, Labels: []string{"a", "b", "c", "d"}}, "b,d,a"},
		{"threshold", []Output{probs}, Params{TopK: 4, Threshold: 0.2}, "class1,class3"},
		{"softmax", []Output{{Name: "l", Shape: []int64{3}, Data: []float32{1, 3, 2}}}, Params{TopK: 2, Softmax: true, Threshold: 0.2}, "class1,class2"},
		{"labels count", []Output{probs}, Params{Labels: []string{"a"}}, "error: output p has 4 classes, the labels file 1"},
		{"two outputs", []Output{probs, probs}, Params{}, "error: want 1 output"},
		{"short data", []Output{{Name: "p", Shape: []int64{5}, Data: []float32{1}}}, Params{}, "error: output p has 1 values for shape [5]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := Classify(tc.outs, Geometry{}, tc.p)
			got := strings.Join(r.Labels, ",")
			if err != nil {
				got = "error: " + err.Error()
			}
			if !strings.Contains(got, strings.TrimPrefix(tc.want, "error: ")) || strings.HasPrefix(tc.want, "error: ") != (err != nil) {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
}

// Classify's top k agree with a full stable sort (and, with Softmax and a
// threshold, with the probabilities computed whole) on random scores with
// many ties; NaN is never a label.
func TestClassifyTopKProperty(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 2000 {
		n := 1 + rng.IntN(60)
		data := make([]float32, n)
		for i := range data {
			data[i] = float32(rng.IntN(8)) - 3 // few distinct values: ties
			if rng.IntN(25) == 0 {
				data[i] = float32(math.NaN())
			}
		}
		p := Params{TopK: 1 + rng.IntN(8), Softmax: rng.IntN(2) == 0}
		if rng.IntN(4) == 0 {
			p.TopK = insertionK + rng.IntN(40) // the sorted path
		}
		if rng.IntN(2) == 0 {
			p.Threshold = rng.Float64() * 0.3
		}
		// the reference: every score (softmax over the non-NaN logits), sorted whole
		var idx []int
		s := make([]float64, n)
		m, sum := math.Inf(-1), 0.0
		for i, v := range data {
			if !math.IsNaN(float64(v)) {
				idx = append(idx, i)
				m = max(m, float64(v))
			}
		}
		for _, i := range idx {
			sum += math.Exp(float64(data[i]) - m)
		}
		for _, i := range idx {
			s[i] = float64(data[i])
			if p.Softmax {
				s[i] = math.Exp(float64(data[i])-m) / sum
			}
		}
		sort.SliceStable(idx, func(a, b int) bool { return data[idx[a]] > data[idx[b]] })
		var want []string
		for _, i := range idx[:min(p.TopK, len(idx))] {
			if s[i] < p.Threshold {
				break
			}
			want = append(want, fmt.Sprintf("class%d", i))
		}
		r, err := Classify([]Output{{Name: "p", Shape: []int64{int64(n)}, Data: data}}, Geometry{}, p)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(r.Labels, want) {
			t.Fatalf("trial %d: %v %+v: got %v, want %v", trial, data, p, r.Labels, want)
		}
	}
}

// BenchmarkClassify is one ResNet-50 item: top 1 of 1,000 logits.
func BenchmarkClassify(b *testing.B) {
	rng := rand.New(rand.NewPCG(3, 4))
	data := make([]float32, 1000)
	for i := range data {
		data[i] = rng.Float32() * 10
	}
	outs := []Output{{Name: "output", Shape: []int64{1000}, Data: data}}
	for _, p := range []Params{{TopK: 1, Softmax: true}, {TopK: 5, Softmax: true, Threshold: 0.01}} {
		b.Run(fmt.Sprintf("top%d-threshold%g", p.TopK, p.Threshold), func(b *testing.B) {
			for b.Loop() {
				if _, err := Classify(outs, Geometry{}, p); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func TestGeometry(t *testing.T) {
	for _, tc := range []struct {
		name string
		g    Geometry
		box  [4]float64
		want media.Box
	}{
		{"stretch", Geometry{InW: 100, InH: 100, FrameW: 200, FrameH: 50}, [4]float64{10, 20, 60, 60}, media.Box{X: 20, Y: 10, W: 100, H: 20}},
		{"letterbox", Geometry{InW: 100, InH: 100, FrameW: 200, FrameH: 100, Letterbox: true}, [4]float64{10, 25, 60, 75}, media.Box{X: 20, Y: 0, W: 100, H: 100}},
		{"clipped", Geometry{InW: 10, InH: 10, FrameW: 10, FrameH: 10}, [4]float64{-5, -5, 5, 5}, media.Box{X: 0, Y: 0, W: 5, H: 5}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.g.Box(tc.box[0], tc.box[1], tc.box[2], tc.box[3], "x", 1)
			got.Class, got.Score = "", 0
			if got != tc.want {
				t.Fatalf("%+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestBoxes(t *testing.T) {
	g := Geometry{InW: 100, InH: 100, FrameW: 100, FrameH: 100}
	ssdBoxes := Output{Name: "boxes", Shape: []int64{3, 4}, Data: []float32{0.1, 0.1, 0.5, 0.5, 0.12, 0.12, 0.5, 0.5, 0.6, 0.6, 0.9, 0.9}}
	ssdScores := Output{Name: "scores", Shape: []int64{3, 3}, Data: []float32{0.1, 0.9, 0.0, 0.2, 0.8, 0.0, 0.5, 0.1, 0.3}}
	yolo := Output{Name: "out", Shape: []int64{2, 7}, Data: []float32{50, 50, 20, 20, 0.9, 0.1, 0.9, 10, 10, 4, 4, 0.2, 1, 0}}
	for _, tc := range []struct {
		name string
		outs []Output
		p    Params
		want string
	}{
		{"ssd, nms, background skipped", []Output{ssdBoxes, ssdScores}, Params{Format: "ssd", Threshold: 0.25, NMS: 0.45, Labels: []string{"background", "car", "person"}},
			"[{10 10 40 40 car 0.9} {60 60 30 30 person 0.3}]"},
		{"ssd, outputs swapped", []Output{ssdScores, ssdBoxes}, Params{Format: "ssd", Threshold: 0.85, NMS: 0.45}, "[{10 10 40 40 class1 0.9}]"},
		{"yolo", []Output{yolo}, Params{Format: "yolo", Threshold: 0.3, NMS: 0.45}, "[{40 40 20 20 class1 0.8"},
		{"ssd wrong shape", []Output{ssdBoxes}, Params{Format: "ssd"}, "error: boxes (ssd): want two outputs, boxes [K,4] (x1,y1,x2,y2 as fractions of the input) and scores [K,C]: one output given"},
		{"format", []Output{yolo}, Params{Format: "retina"}, `error: boxes: format "retina" unknown (ssd, yolo, yolov5, yolov8, yolox, ssd-tf, detr, rtdetr, e2e)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := Boxes(tc.outs, g, tc.p)
			got := fmt.Sprint(r.Boxes)
			if err != nil {
				got = "error: " + err.Error()
			}
			if !strings.HasPrefix(got, tc.want) {
				t.Fatalf("got %s, want %s", got, tc.want)
			}
		})
	}
}

func TestBlazeFaceShapes(t *testing.T) {
	_, err := BlazeFace([]Output{{Name: "x", Shape: []int64{10}, Data: make([]float32, 10)}}, Geometry{InW: 128, InH: 128, FrameW: 128, FrameH: 128}, Params{})
	if err == nil || !strings.Contains(err.Error(), "want outputs shaped [[512 1] [384 1] [512 16] [384 16]]") {
		t.Fatalf("error %v", err)
	}
	// one anchor above threshold: cell (0,0) of the 16x16 head (centre 4,4), a
	// 32x32 box: -12..20 in the input, -24..40 in the 2x frame, clipped to 0..40
	outs := []Output{
		{Shape: []int64{512, 1}, Data: make([]float32, 512)}, {Shape: []int64{384, 1}, Data: make([]float32, 384)},
		{Shape: []int64{512, 16}, Data: make([]float32, 512*16)}, {Shape: []int64{384, 16}, Data: make([]float32, 384*16)},
	}
	for i := range outs[0].Data {
		outs[0].Data[i] = -10
	}
	for i := range outs[1].Data {
		outs[1].Data[i] = -10
	}
	outs[0].Data[0] = 5
	copy(outs[2].Data, []float32{0, 0, 32, 32})
	r, err := BlazeFace(outs, Geometry{InW: 128, InH: 128, FrameW: 256, FrameH: 256}, Params{})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Boxes) != 1 || r.Boxes[0].X != 0 || r.Boxes[0].W != 40 || r.Boxes[0].Class != "face" {
		t.Fatalf("%+v", r.Boxes)
	}
}

func TestNames(t *testing.T) {
	if _, ok := Lookup("nope"); ok {
		t.Fatal("Lookup found an unknown decoder")
	}
	if got := strings.Join(Names(), ","); got != "blazeface,boxes,classify,ctc,db,keypoints" {
		t.Fatalf("names %s", got)
	}
}
