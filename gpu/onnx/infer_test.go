package onnx

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/mdag/mdag/gpu/prep"
	"github.com/mdag/mdag/media"
)

// Infer on the bytes prep.Pack writes answers exactly what RunRaw answers
// for the frames (float32 and float16 models, several batch sizes); Meta
// says the tensors as Infer takes and returns them.
func TestInferEqualsRunRaw(t *testing.T) {
	requireLib(t)
	half := strings.Replace(fmt.Sprintf(entry, "half", testdata(t, "tiny-half.onnx"), "NCHW", 64, 64, "", 4), "dtype: float32", "dtype: float16", 1)
	x, err := New(writeRegistry(t, tinyEntry(t, "tiny", 4), half), Config{IntraThreads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	for _, tc := range []struct {
		model, meta string
	}{
		{"tiny", "tiny 4 {input float32 [-1 3 64 64]} [{probs float32 [-1 10]}]"},
		{"half", "half 4 {input float16 [-1 3 64 64]} [{probs float16 [-1 10]}]"},
	} {
		m, ok := x.Meta(tc.model)
		if got := fmt.Sprint(m.Name, " ", m.MaxBatch, " ", m.Input, " ", m.Outputs); !ok || got != tc.meta {
			t.Fatalf("Meta(%s) = %s, want %s", tc.model, got, tc.meta)
		}
		for _, n := range []int{1, 3, 4} {
			frames := make([]*media.Frame, n)
			for i := range frames {
				frames[i] = frame(i+n, 70+9*i, 64)
			}
			want, err := x.RunRaw(tc.model, frames)
			if err != nil {
				t.Fatal(err)
			}
			in := &x.models[tc.model].m.Input
			raw, err := prep.Pack(make([]byte, n*prep.ItemBytes(in)), in, frames, nil)
			if err != nil {
				t.Fatal(err)
			}
			got, err := x.Infer(context.Background(), tc.model, n, raw)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 1 || got[0].Name != "probs" || fmt.Sprint(got[0].Shape) != fmt.Sprintf("[%d 10]", n) || got[0].DType != m.Outputs[0].DType {
				t.Fatalf("%s b%d: outputs %+v", tc.model, n, got)
			}
			vals, err := prep.Floats(got[0].DType, got[0].Data)
			if err != nil {
				t.Fatal(err)
			}
			for i := range n {
				if a, b := fmt.Sprint(vals[i*10:(i+1)*10]), fmt.Sprint(want[i][0].Data); a != b {
					t.Fatalf("%s b%d item %d: Infer %s, RunRaw %s", tc.model, n, i, a, b)
				}
			}
		}
	}
}

func TestInferRefuses(t *testing.T) {
	x := newTiny(t, 1, 4)
	item := 3 * 64 * 64 * 4
	ctx := context.Background()
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	// hold the only session: a cancelled request does not wait for it
	s := <-x.models["tiny"].sessions
	_, err := x.Infer(canceled, "tiny", 1, make([]byte, item))
	x.models["tiny"].sessions <- s
	if err != context.Canceled {
		t.Fatalf("waiting for a session with a cancelled context: %v", err)
	}
	for _, tc := range []struct {
		model string
		batch int
		bytes int
		says  string
	}{
		{"nope", 1, item, `model "nope" is not loaded here (loaded: tiny)`},
		{"tiny", 0, 0, "batch of 0: want 1..4"},
		{"tiny", 5, 5 * item, "batch of 5: want 1..4"},
		{"tiny", 2, item, "input 'input' of a batch of 2 is 49152 bytes, float32 [2 3 64 64] needs 98304"},
	} {
		_, err := x.Infer(ctx, tc.model, tc.batch, make([]byte, tc.bytes))
		if err == nil || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s b%d %d bytes: %v, want %q", tc.model, tc.batch, tc.bytes, err, tc.says)
		}
	}
	if _, ok := x.Meta("nope"); ok {
		t.Error("Meta of a model not loaded")
	}
}

// Unload frees a model (its batches fail at once, also one that had
// looked it up before), Load brings it back answering as before.
func TestUnloadLoad(t *testing.T) {
	x := newTiny(t, 2, 4)
	frames := []*media.Frame{frame(1, 64, 64), frame(2, 90, 70)}
	before, err := x.RunRaw("tiny", frames)
	if err != nil {
		t.Fatal(err)
	}
	old := x.models["tiny"]
	if err := x.Unload("tiny"); err != nil {
		t.Fatal(err)
	}
	if len(x.Models()) != 0 {
		t.Fatalf("loaded after unload: %v", x.Models())
	}
	if _, err := old.acquire(context.Background()); err == nil || !strings.Contains(err.Error(), "model tiny was unloaded") {
		t.Fatalf("a session of the unloaded model: %v", err)
	}
	for _, tc := range []struct {
		name string
		f    func() error
		says string
	}{
		{"run", func() error {
			_, err := x.Run(context.Background(), "tiny", []*media.Item{{Frame: frames[0]}})
			return err
		}, `model "tiny" is not loaded here (loaded: )`},
		{"infer", func() error { _, err := x.Infer(context.Background(), "tiny", 1, nil); return err }, `model "tiny" is not loaded here`},
		{"unload again", func() error { return x.Unload("tiny") }, `model "tiny" is not loaded here`},
		{"load unknown", func() error { return x.Load("resnet") }, `model "resnet" is not an onnx entry of the registry (entries: tiny)`},
	} {
		if err := tc.f(); err == nil || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.says)
		}
	}
	if err := x.Load("tiny"); err != nil {
		t.Fatal(err)
	}
	if err := x.Load("tiny"); err != nil {
		t.Fatalf("loading a loaded model: %v", err)
	}
	after, err := x.RunRaw("tiny", frames)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("after Load the model answers %v, before %v", after, before)
	}
}
