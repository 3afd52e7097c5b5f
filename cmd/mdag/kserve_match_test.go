package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/mdag/mdag/gpu/kserve"
	"github.com/mdag/mdag/gpu/onnx"
	"github.com/mdag/mdag/gpu/registry"
	"github.com/mdag/mdag/media"
)

// serveInferAt serves s on 127.0.0.1:0 as the command does and returns its
// address; the server stops at the test's end.
func serveInferAt(t *testing.T, s *kserve.Server) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serveInfer(ctx, s, lis, 5*time.Second, newLogger(io.Discard, false)) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serveInfer: %v", err)
		}
	})
	return lis.Addr().String()
}

// serveTiny serves testdata/onnx's models (onnx on CPU) as `mdag
// infer-server` does, until the test ends, and returns the address.
func serveTiny(t *testing.T) string {
	t.Helper()
	is, err := newInferServer("onnx", inferFlags(t, "--models", "testdata/onnx/models.yaml", "--intra-threads", "1", "--sessions", "2"), "", "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(is.close)
	return serveInferAt(t, is.srv)
}

// loadKServeRegistry writes a registry whose entries are served at addr, with
// testdata/onnx's tiny model's tensors and decoder.
func loadKServeRegistry(t *testing.T, entries ...string) *registry.Registry {
	t.Helper()
	p := filepath.Join(t.TempDir(), "models.yaml")
	if err := os.WriteFile(p, []byte("models:\n"+strings.Join(entries, "")), 0o644); err != nil {
		t.Fatal(err)
	}
	reg, err := registry.Load(p)
	if err != nil {
		t.Fatal(err)
	}
	return reg
}

func tinyKServe(name, addr, model, shm string, width int) string {
	return fmt.Sprintf(`  %s:
    format: kserve
    kserve: {endpoint: "%s", model: %s, shared_memory: %s}
    input: {name: input, dtype: float32, layout: NCHW, width: %d, height: 64, colour: rgb,
            scale: 0.00392156862745098, mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225], resize: stretch}
    max_batch: 8
    decoder: {name: classify, top_k: 3}
`, name, addr, model, shm, width)
}

// The kserve executor against `mdag infer-server` (onnx on CPU) returns
// exactly what the in-process onnx executor returns for the same batch,
// with the tensors in the request and in shared memory; a wrong shape, an
// unknown model, a deadline and a server that is down each give a clear
// error naming the model and the endpoint.
func TestKServeMatchesONNX(t *testing.T) {
	requireORT(t)
	t.Cleanup(func() { goleak.VerifyNone(t) })
	addr := serveTiny(t)

	// the reference: the in-process executor, the same model file and entry
	// (top_k 3, so the order of the three best classes is compared too)
	refReg, err := registry.Load("testdata/onnx/models.yaml")
	if err != nil {
		t.Fatal(err)
	}
	refReg.Models["tiny"].Decoder.TopK = 3
	ref, err := onnx.New(refReg, onnx.Config{IntraThreads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer ref.Close()
	items := func() []*media.Item {
		var out []*media.Item
		for i, wh := range [][2]int{{64, 64}, {100, 80}, {48, 90}, {320, 240}, {7, 5}} {
			out = append(out, &media.Item{Frame: testFrame(i+1, wh[0], wh[1])})
		}
		return out
	}
	want, err := ref.Run(context.Background(), "tiny", items())
	if err != nil {
		t.Fatal(err)
	}

	reg := loadKServeRegistry(t, tinyKServe("raw", addr, "tiny", "off", 64), tinyKServe("shm", addr, "tiny", "on", 64),
		tinyKServe("narrow", addr, "tiny", "off", 32), tinyKServe("ghost", addr, "nope", "off", 64))
	x, err := kserve.New(reg, kserve.Config{Slots: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, model := range []string{"raw", "shm"} {
		got, err := x.Run(ctx, model, items())
		if err != nil {
			t.Fatalf("%s: %v", model, err)
		}
		if len(got) != len(want) {
			t.Fatalf("%s: %d outputs, want %d", model, len(got), len(want))
		}
		for i := range want {
			g, w := fmt.Sprint(got[i][0].Labels, got[i][0].Boxes), fmt.Sprint(want[i][0].Labels, want[i][0].Boxes)
			if g != w || len(got[i][0].Labels) != 3 {
				t.Errorf("%s: item %d: %s over the protocol, %s in process", model, i, g, w)
			}
		}
	}
	if !strings.Contains(x.Describe(), "shared memory") {
		t.Errorf("Describe does not say shm uses shared memory: %s", x.Describe())
	}

	for _, tc := range []struct {
		model string
		ctx   func() (context.Context, context.CancelFunc)
		want  []string
	}{
		{"narrow", nil, []string{"kserve: model narrow at " + addr, "input", "[1 3 64 32]"}},
		{"ghost", nil, []string{"kserve: model ghost at " + addr, "nope"}},
		// a deadline already spent: the call does not go out, or fails DeadlineExceeded
		{"raw", func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), time.Nanosecond)
		}, []string{"kserve: model raw at " + addr, "deadline"}},
	} {
		c := ctx
		if tc.ctx != nil {
			var stop context.CancelFunc
			c, stop = tc.ctx()
			defer stop()
		}
		_, err := x.Run(c, tc.model, items()[:1])
		for _, w := range tc.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %v, want it to say %q", tc.model, err, w)
			}
		}
	}

	// the server down: a clear error, and Health says so
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := lis.Addr().String()
	lis.Close()
	dx, err := kserve.New(loadKServeRegistry(t, tinyKServe("raw", down, "tiny", "off", 64)), kserve.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer dx.Close()
	short, stop := context.WithTimeout(context.Background(), 5*time.Second)
	defer stop()
	if _, err := dx.Run(short, "raw", items()[:1]); err == nil || !strings.Contains(err.Error(), "kserve: model raw at "+down) {
		t.Errorf("server down: %v", err)
	}
	if err := dx.Health(short); err == nil {
		t.Error("server down: Health says nothing")
	}
}

// mdag profile --executor kserve measures a model on its server (mdag
// infer-server here) and writes a profile the planners read; a model of
// another format is refused.
func TestProfileKServe(t *testing.T) {
	requireORT(t)
	t.Cleanup(func() { goleak.VerifyNone(t) })
	addr := serveTiny(t)
	p := filepath.Join(t.TempDir(), "models.yaml")
	if err := os.WriteFile(p, []byte("models:\n"+tinyKServe("tiny", addr, "tiny", "auto", 64)), 0o644); err != nil {
		t.Fatal(err)
	}
	var o, e strings.Builder
	code := run(strings.Fields("profile --executor kserve --models "+p+" --model tiny --worker-type ORT --price 1 --batches 1,2,16 "+
		"--concurrency 1,2 --iterations 3 --warmup 1 --frame 64x64"), &o, &e)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, e.String())
	}
	for _, w := range []string{"target: tiny", "{batch: 1, concurrency: 1,", "{batch: 2, concurrency: 2,"} {
		if !strings.Contains(o.String(), w) {
			t.Errorf("the profile lacks %q:\n%s", w, o.String())
		}
	}
	if strings.Contains(o.String(), "batch: 16") {
		t.Errorf("batch 16 is above max_batch 8 and was measured:\n%s", o.String())
	}
	if !strings.Contains(e.String(), "shared memory") {
		t.Errorf("stderr does not say how the tensors travel: %s", e.String())
	}
	e.Reset()
	if code := run(strings.Fields("profile --executor kserve --models testdata/onnx/models.yaml --model tiny --worker-type ORT --price 1"), &o, &e); code != exitInvalid ||
		!strings.Contains(e.String(), "format onnx") {
		t.Errorf("an onnx entry with --executor kserve: exit %d, %s", code, e.String())
	}
}
