package onnx

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/mdag/mdag/gpu/prep"
	"github.com/mdag/mdag/gpu/registry"
	"github.com/mdag/mdag/media"
)

// The test models (testdata, from tools/models/tiny.py): tiny-classifier
// float32[batch,3,64,64] -> probs float32[batch,10]; tiny-fixed the same
// with the batch fixed at 1.

func testdata(t testing.TB, name string) string {
	p, err := filepath.Abs(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// requireLib skips when the library is absent, unless MDAG_REQUIRE_ORT is
// set (make test sets it: make deps installs the library).
func requireLib(t testing.TB) {
	if _, err := os.Stat(DefaultLib()); err != nil {
		if os.Getenv("MDAG_REQUIRE_ORT") != "" {
			t.Fatalf("MDAG_REQUIRE_ORT is set and %v", err)
		}
		t.Skipf("no ONNX Runtime library (%v); make deps installs it", err)
	}
}

const entry = `
  %s:
    format: onnx
    file: %s
    input: {name: input, dtype: float32, layout: %s, width: %d, height: %d, colour: rgb, scale: 0.00392156862745098, mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225]%s}
    max_batch: %d
    decoder: {name: classify, top_k: 3}
`

func writeRegistry(t testing.TB, entries ...string) *registry.Registry {
	dir := t.TempDir()
	p := filepath.Join(dir, "models.yaml")
	if err := os.WriteFile(p, []byte("models:"+strings.Join(entries, "")), 0o644); err != nil {
		t.Fatal(err)
	}
	r, err := registry.Load(p)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func tinyEntry(t testing.TB, name string, maxBatch int) string {
	return fmt.Sprintf(entry, name, testdata(t, "tiny-classifier.onnx"), "NCHW", 64, 64, "", maxBatch)
}

// frame is a deterministic test picture, different per seed.
func frame(seed, w, h int) *media.Frame {
	f := media.NewFrame(w, h)
	for i := range f.Pix {
		f.Pix[i] = byte((i*7 + seed*31 + (i/(w*3))*seed) % 251)
	}
	return f
}

func newTiny(t testing.TB, sessions, maxBatch int) *Executor {
	requireLib(t)
	x, err := New(writeRegistry(t, tinyEntry(t, "tiny", maxBatch)), Config{Sessions: sessions, IntraThreads: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(x.Close)
	return x
}

func TestBatchEqualsSingles(t *testing.T) {
	x := newTiny(t, 1, 32)
	frames := make([]*media.Frame, 8)
	for i := range frames {
		frames[i] = frame(i+1, 96+i*8, 80)
	}
	batch, err := x.RunRaw("tiny", frames)
	if err != nil {
		t.Fatal(err)
	}
	if len(batch) != 8 {
		t.Fatalf("%d results, want 8", len(batch))
	}
	worst := 0.0
	for i, f := range frames {
		one, err := x.RunRaw("tiny", []*media.Frame{f})
		if err != nil {
			t.Fatal(err)
		}
		b, s := batch[i][0], one[0][0]
		if len(b.Data) != 10 || len(s.Data) != 10 || fmt.Sprint(b.Shape) != "[10]" {
			t.Fatalf("item %d: shapes %v/%v, %d/%d values, want [10]", i, b.Shape, s.Shape, len(b.Data), len(s.Data))
		}
		for j := range b.Data {
			worst = max(worst, math.Abs(float64(b.Data[j]-s.Data[j])))
		}
	}
	if worst > 1e-4 {
		t.Fatalf("batch 8 differs from 8 x batch 1 by %g, want <= 1e-4", worst)
	}
	// different frames give different outputs: the batch is not one item repeated
	if fmt.Sprint(batch[0][0].Data) == fmt.Sprint(batch[1][0].Data) {
		t.Fatal("items 0 and 1 have the same outputs")
	}
	t.Logf("batch 8 vs 8 x batch 1: max |diff| %g", worst)
}

func TestRunDecodes(t *testing.T) {
	x := newTiny(t, 1, 8)
	items := []*media.Item{{Stream: "a", Seq: 1, Frame: frame(1, 64, 64)}, {Stream: "b", Seq: 2, Frame: frame(2, 120, 90)}}
	out, err := x.Run(context.Background(), "tiny", items)
	if err != nil {
		t.Fatal(err)
	}
	for i, o := range out {
		if len(o) != 1 || o[0].Stream != items[i].Stream || o[0].Seq != items[i].Seq || len(o[0].Labels) != 3 || !strings.HasPrefix(o[0].Labels[0], "class") {
			t.Fatalf("item %d: %+v, want 3 labels classN for stream %s", i, o[0], items[i].Stream)
		}
	}
}

// ortRejects is an ONNX model the graph reader accepts (an input and an
// output) that ONNX Runtime refuses to load: no node produces the output.
func ortRejects() []byte {
	dim := func(v int64) []byte {
		return protowire.AppendVarint(protowire.AppendTag(nil, 1, protowire.VarintType), uint64(v))
	}
	var shape []byte
	for _, d := range []int64{1, 3, 64, 64} {
		shape = protowire.AppendBytes(protowire.AppendTag(shape, 1, protowire.BytesType), dim(d))
	}
	tt := protowire.AppendVarint(protowire.AppendTag(nil, 1, protowire.VarintType), 1)
	tt = protowire.AppendBytes(protowire.AppendTag(tt, 2, protowire.BytesType), shape)
	typ := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), tt)
	vi := func(name string) []byte {
		b := protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), name)
		return protowire.AppendBytes(protowire.AppendTag(b, 2, protowire.BytesType), typ)
	}
	g := protowire.AppendBytes(protowire.AppendTag(nil, 11, protowire.BytesType), vi("input"))
	g = protowire.AppendBytes(protowire.AppendTag(g, 12, protowire.BytesType), vi("probs"))
	m := protowire.AppendVarint(protowire.AppendTag(nil, 1, protowire.VarintType), 8) // ir_version
	opset := protowire.AppendVarint(protowire.AppendTag(nil, 2, protowire.VarintType), 13)
	m = protowire.AppendBytes(protowire.AppendTag(m, 8, protowire.BytesType), opset)
	return protowire.AppendBytes(protowire.AppendTag(m, 7, protowire.BytesType), g)
}

func TestLoadErrors(t *testing.T) {
	requireLib(t)
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage.onnx")
	if err := os.WriteFile(garbage, []byte("this is not a protobuf \xff\xff\xff\xff"), 0o644); err != nil {
		t.Fatal(err)
	}
	rejected := filepath.Join(dir, "rejected.onnx")
	if err := os.WriteFile(rejected, ortRejects(), 0o644); err != nil {
		t.Fatal(err)
	}
	tiny, fixed := testdata(t, "tiny-classifier.onnx"), testdata(t, "tiny-fixed.onnx")
	for _, tc := range []struct {
		name, entry, cfgDevice string
		want                   []string
	}{
		{"corrupt file", fmt.Sprintf(entry, "m", garbage, "NCHW", 64, 64, "", 4), "", []string{"model m", "garbage.onnx is not an ONNX model"}},
		{"missing file", fmt.Sprintf(entry, "m", filepath.Join(dir, "nope.onnx"), "NCHW", 64, 64, "", 4), "", []string{"model m", "nope.onnx: no such file"}},
		{"runtime refuses", fmt.Sprintf(entry, "m", rejected, "NCHW", 64, 64, "", 1), "", []string{"model m (", "rejected.onnx", "probs"}},
		{"wrong size", fmt.Sprintf(entry, "m", tiny, "NCHW", 128, 128, "", 4), "", []string{"model m: input 'input' is float32[batch,3,64,64] in tiny-classifier.onnx, the registry says NCHW 128x128"}},
		{"wrong layout", fmt.Sprintf(entry, "m", tiny, "NHWC", 64, 64, "", 4), "", []string{"model m: input 'input' is float32[batch,3,64,64] in tiny-classifier.onnx, the registry says NHWC 64x64"}},
		{"fixed batch", fmt.Sprintf(entry, "m", fixed, "NCHW", 64, 64, "", 8), "", []string{"batch dimension is fixed at 1", "max_batch 8"}},
		{"device not listed", fmt.Sprintf(entry, "m", tiny, "NCHW", 64, 64, "", 4), "cuda", []string{"model m: device cuda is not among its devices (cpu)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(writeRegistry(t, tc.entry), Config{Device: tc.cfgDevice})
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
	// a fixed batch of 1 with max_batch 1 loads
	x, err := New(writeRegistry(t, fmt.Sprintf(entry, "m", fixed, "NCHW", 64, 64, "", 1)), Config{})
	if err != nil {
		t.Fatal(err)
	}
	x.Close()
}

func TestMissingLibrary(t *testing.T) {
	reg := writeRegistry(t, tinyEntry(t, "tiny", 4))
	_, err := New(reg, Config{Lib: "/nonexistent/libonnxruntime.so.1"})
	want := "ONNX Runtime library not found at /nonexistent/libonnxruntime.so.1; run make deps or set MDAG_ORT_LIB"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("error %v, want %q", err, want)
	}
}

func TestCUDAWithoutProvider(t *testing.T) {
	requireLib(t)
	e := strings.Replace(tinyEntry(t, "tiny", 4), "decoder:", "devices: [cpu, cuda]\n    decoder:", 1)
	x, err := New(writeRegistry(t, e), Config{Device: "cuda"})
	if err == nil {
		x.Close()
		t.Skip("this ONNX Runtime library has a CUDA provider")
	}
	if !strings.Contains(err.Error(), "CUDA execution provider") || !strings.Contains(err.Error(), "CPU-only") {
		t.Fatalf("error %q does not say the library has no CUDA provider", err)
	}
}

func TestBatchErrors(t *testing.T) {
	x := newTiny(t, 1, 4)
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		model string
		items []*media.Item
		want  string
	}{
		{"unknown model", "nope", []*media.Item{{Frame: frame(1, 8, 8)}}, `model "nope" is not loaded here (loaded: tiny)`},
		{"over max batch", "tiny", make([]*media.Item, 5), "batch of 5 exceeds its max_batch 4"},
		{"no frame", "tiny", []*media.Item{{}}, "item 0 has no frame"},
		{"bad frame", "tiny", []*media.Item{{Frame: &media.Frame{W: 4, H: 4, Pix: make([]byte, 3)}}}, "item 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := x.Run(ctx, tc.model, tc.items)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
		})
	}
	// the executor still runs after the errors
	if _, err := x.Run(ctx, "tiny", []*media.Item{{Frame: frame(1, 64, 64)}}); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	s := <-x.models["tiny"].sessions // every session busy: Run waits for ctx
	_, err := x.Run(cctx, "tiny", []*media.Item{{Frame: frame(1, 64, 64)}})
	x.models["tiny"].sessions <- s
	if err != context.Canceled {
		t.Fatalf("error %v, want context.Canceled", err)
	}
}

// Concurrent batches of different sizes on 2 sessions give what one batch
// at a time gives.
func TestConcurrentBatches(t *testing.T) {
	x := newTiny(t, 2, 8)
	want := map[int][]string{}
	for n := 1; n <= 8; n++ {
		items := make([]*media.Item, n)
		for i := range items {
			items[i] = &media.Item{Frame: frame(n*10+i, 64+n, 64)}
		}
		out, err := x.Run(context.Background(), "tiny", items)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range out {
			want[n] = append(want[n], strings.Join(o[0].Labels, ","))
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range 4 {
				n := (g+r)%8 + 1
				items := make([]*media.Item, n)
				for i := range items {
					items[i] = &media.Item{Frame: frame(n*10+i, 64+n, 64)}
				}
				out, err := x.Run(context.Background(), "tiny", items)
				if err != nil {
					errs <- err
					return
				}
				for i, o := range out {
					if got := strings.Join(o[0].Labels, ","); got != want[n][i] {
						errs <- fmt.Errorf("batch %d item %d: %s, want %s", n, i, got, want[n][i])
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// BenchmarkBatch: items per second at batch 1, 8 and 32 on one session
// (ORT CPU), with 1 intra-op thread and with ORT's default (the cores);
// preprocessing (resize and normalise into the batch tensor) included.
func BenchmarkBatch(b *testing.B) {
	requireLib(b)
	for _, threads := range []int{1, 0} {
		x, err := New(writeRegistry(b, tinyEntry(b, "tiny", 32)), Config{IntraThreads: threads})
		if err != nil {
			b.Fatal(err)
		}
		for _, n := range []int{1, 8, 32} {
			frames := make([]*media.Frame, n)
			for i := range frames {
				frames[i] = frame(i, 64, 64)
			}
			b.Run(fmt.Sprintf("threads=%d/b=%d", threads, n), func(b *testing.B) {
				for b.Loop() {
					if _, err := x.RunRaw("tiny", frames); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "items/s")
			})
		}
		x.Close()
	}
}

// BenchmarkInfer: the session Run alone (the batch buffer filled once),
// 1 intra-op thread: the model call's own batching gain.
func BenchmarkInfer(b *testing.B) {
	x := newTiny(b, 1, 32)
	m := x.models["tiny"]
	s := <-m.sessions
	defer func() { m.sessions <- s }()
	frames := make([]*media.Frame, 32)
	for i := range frames {
		frames[i] = frame(i, 64, 64)
		prep.Fill(s.f32[i*s.item:(i+1)*s.item], frames[i], &m.m.Input)
	}
	for _, n := range []int{1, 8, 32} {
		b.Run(fmt.Sprintf("b=%d", n), func(b *testing.B) {
			for b.Loop() {
				if _, err := x.infer(m, s, n); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "items/s")
		})
	}
}

// BenchmarkPreprocess: one 320x240 frame into a 64x64 NCHW float32 slot.
func BenchmarkPreprocess(b *testing.B) {
	r := writeRegistry(b, tinyEntry(b, "tiny", 1))
	in := &r.Models["tiny"].Input
	f := frame(1, 320, 240)
	dst := make([]float32, 64*64*3)
	for b.Loop() {
		prep.Fill(dst, f, in)
	}
}

// The float16 model (same weights, float16 input and output) agrees with
// the float32 one within float16's precision, at batch 4.
func TestFloat16(t *testing.T) {
	requireLib(t)
	half := strings.Replace(fmt.Sprintf(entry, "half", testdata(t, "tiny-half.onnx"), "NCHW", 64, 64, "", 4), "dtype: float32", "dtype: float16", 1)
	x, err := New(writeRegistry(t, tinyEntry(t, "tiny", 4), half), Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	frames := []*media.Frame{frame(1, 64, 64), frame(2, 80, 64), frame(3, 64, 90), frame(4, 33, 33)}
	a, err := x.RunRaw("tiny", frames)
	if err != nil {
		t.Fatal(err)
	}
	b, err := x.RunRaw("half", frames)
	if err != nil {
		t.Fatal(err)
	}
	for i := range frames {
		for j := range a[i][0].Data {
			if d := math.Abs(float64(a[i][0].Data[j] - b[i][0].Data[j])); d > 2e-3 {
				t.Fatalf("item %d class %d: float32 %g, float16 %g", i, j, a[i][0].Data[j], b[i][0].Data[j])
			}
		}
	}
}

// A graph whose height and width are symbolic loads whatever size the
// registry says; sizes its Reshape cannot take fail inside ONNX Runtime at
// run time: that batch's error, and the executor goes on.
func TestRunTimeErrors(t *testing.T) {
	requireLib(t)
	model := testdata(t, "tiny-reshape.onnx")
	x, err := New(writeRegistry(t,
		fmt.Sprintf(entry, "bad", model, "NCHW", 20, 20, "", 4),
		fmt.Sprintf(entry, "notbatch", model, "NCHW", 64, 64, "", 4),
		fmt.Sprintf(entry, "good", model, "NCHW", 16, 16, "", 4)), Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	items := []*media.Item{{Frame: frame(1, 64, 48)}, {Frame: frame(2, 64, 48)}, {Frame: frame(3, 64, 48)}}
	for _, tc := range []struct{ model, want string }{
		{"bad", "onnx: model bad, batch of 3: Error running network"},
		// the output is allocated here at [3,10]: ORT refuses the [48,10] it computes
		{"notbatch", "computed output shape for this run is {48,10}"},
	} {
		if _, err := x.Run(context.Background(), tc.model, items); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want %q", tc.model, err, tc.want)
		} else {
			t.Logf("%s: %v", tc.model, err)
		}
	}
	for _, m := range []string{"good", "bad", "good"} {
		_, err := x.Run(context.Background(), m, items)
		if (err == nil) != (m == "good") {
			t.Fatalf("%s after the errors: %v", m, err)
		}
	}
}

// The binding (onnxruntime_go v1.27.0, C API version 24) runs on the
// library make deps installs (ONNX Runtime 1.30.0, which serves API
// versions up to 30).
func TestLibraryVersion(t *testing.T) {
	requireLib(t)
	v, err := Init(DefaultLib())
	if err != nil {
		t.Fatal(err)
	}
	if os.Getenv(LibEnv) == "" && v != "1.30.0" {
		t.Fatalf("ONNX Runtime %s at %s, want 1.30.0 (tools/ort-fetch.sh)", v, DefaultLib())
	}
	t.Logf("ONNX Runtime %s", v)
	other := filepath.Join(t.TempDir(), "libonnxruntime.so.1")
	if err := os.WriteFile(other, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Init(other); err == nil || !strings.Contains(err.Error(), "one library per process") {
		t.Fatalf("a second library: %v", err)
	}
}
