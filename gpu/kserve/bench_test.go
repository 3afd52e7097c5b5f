package kserve

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	pb "github.com/mdag/mdag/api/kserve"
	"github.com/mdag/mdag/gpu/registry"
	"github.com/mdag/mdag/internal/clock"
)

// BenchmarkModelInfer is what the protocol costs per request over
// loopback gRPC, without compute: the emulated backend at l(b) = 0 for a
// ResNet-50 input (float32 3x224x224), the batch in raw_input_contents or
// in a shared memory region (the output, [b,1], comes back raw either
// way). Bytes/s is the input's.
func BenchmarkModelInfer(b *testing.B) {
	dir := b.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "r.onnx"), []byte("x"), 0o644); err != nil {
		b.Fatal(err)
	}
	p := filepath.Join(dir, "models.yaml")
	yaml := "models:\n  resnet:\n    format: onnx\n    file: r.onnx\n    input: {name: input, dtype: float32, layout: NCHW, width: 224, height: 224}\n    max_batch: 128\n    decoder: {name: classify}\n"
	if err := os.WriteFile(p, []byte(yaml), 0o644); err != nil {
		b.Fatal(err)
	}
	reg, err := registry.Load(p)
	if err != nil {
		b.Fatal(err)
	}
	e, err := NewEmulated(reg, clock.Real{}, func(string, int) (time.Duration, bool) { return 0, true })
	if err != nil {
		b.Fatal(err)
	}
	s, err := NewServer("mdag", "bench", e)
	if err != nil {
		b.Fatal(err)
	}
	c := serve(b, s)
	ctx := context.Background()
	item := 3 * 224 * 224 * 4
	key := fmt.Sprintf("/mdag-bench-%d", os.Getpid())
	mem, err := CreateRegion(key, 128*item)
	if err != nil {
		b.Fatal(err)
	}
	defer mem.Close()
	if _, err := c.SystemSharedMemoryRegister(ctx, &pb.SystemSharedMemoryRegisterRequest{Name: "in", Key: key, ByteSize: uint64(128 * item)}); err != nil {
		b.Fatal(err)
	}
	defer c.SystemSharedMemoryUnregister(ctx, &pb.SystemSharedMemoryUnregisterRequest{})
	for _, n := range []int{1, 8, 32, 128} {
		for _, via := range []string{"raw", "shm"} {
			b.Run(fmt.Sprintf("b%d/%s", n, via), func(b *testing.B) {
				in := &pb.ModelInferRequest_InferInputTensor{Name: "input", Datatype: "FP32", Shape: []int64{int64(n), 3, 224, 224}}
				req := &pb.ModelInferRequest{ModelName: "resnet", Inputs: []*pb.ModelInferRequest_InferInputTensor{in}}
				if via == "raw" {
					req.RawInputContents = [][]byte{make([]byte, n*item)}
				} else {
					in.Parameters = shmP("in", int64(n*item), 0)
				}
				b.SetBytes(int64(n * item))
				for b.Loop() {
					if _, err := c.ModelInfer(ctx, req); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
