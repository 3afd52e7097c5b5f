package kserve

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "github.com/mdag/mdag/api/kserve"
	"github.com/mdag/mdag/gpu/registry"
	"github.com/mdag/mdag/internal/clock"
)

// fake is a Backend for the server's tests: model "twice" takes x FP32
// [-1,2,3] (max_batch 4) and returns y = 2x and n UINT8 [-1,1] = the
// item's index; "half" takes FP16 [-1,4] and returns it; "fixed" has no
// batch (u UINT8 [2,2] -> v the same); "fail" fails; "block" waits for
// its context.
type fake struct {
	mu    sync.Mutex
	calls int
}

func (f *fake) Models() []ModelMeta {
	return []ModelMeta{
		{Name: "twice", Platform: "test", MaxBatch: 4,
			Inputs:  []TensorMeta{{Name: "x", DType: "float32", Shape: []int64{-1, 2, 3}}},
			Outputs: []TensorMeta{{Name: "y", DType: "float32", Shape: []int64{-1, 2, 3}}, {Name: "n", DType: "uint8", Shape: []int64{-1, 1}}}},
		{Name: "half", Platform: "test", MaxBatch: 2,
			Inputs:  []TensorMeta{{Name: "h", DType: "float16", Shape: []int64{-1, 4}}},
			Outputs: []TensorMeta{{Name: "h", DType: "float16", Shape: []int64{-1, 4}}}},
		{Name: "fixed", Platform: "test",
			Inputs:  []TensorMeta{{Name: "u", DType: "uint8", Shape: []int64{2, 2}}},
			Outputs: []TensorMeta{{Name: "v", DType: "uint8", Shape: []int64{2, 2}}}},
		{Name: "fail", Platform: "test", MaxBatch: 1,
			Inputs:  []TensorMeta{{Name: "x", DType: "float32", Shape: []int64{-1, 1}}},
			Outputs: []TensorMeta{{Name: "y", DType: "float32", Shape: []int64{-1, 1}}}},
		{Name: "block", Platform: "test", MaxBatch: 1,
			Inputs:  []TensorMeta{{Name: "x", DType: "float32", Shape: []int64{-1, 1}}},
			Outputs: []TensorMeta{{Name: "y", DType: "float32", Shape: []int64{-1, 1}}}},
	}
}

func (f *fake) Infer(ctx context.Context, model string, in []Tensor) ([]Tensor, error) {
	f.mu.Lock()
	f.calls++
	f.mu.Unlock()
	switch model {
	case "twice":
		x := in[0]
		y := make([]byte, len(x.Data))
		for i := 0; i < len(y); i += 4 {
			binary.LittleEndian.PutUint32(y[i:], math.Float32bits(2*math.Float32frombits(binary.LittleEndian.Uint32(x.Data[i:]))))
		}
		b := x.Shape[0]
		n := make([]byte, b)
		for i := range n {
			n[i] = byte(i)
		}
		return []Tensor{{Name: "y", DType: "float32", Shape: x.Shape, Data: y}, {Name: "n", DType: "uint8", Shape: []int64{b, 1}, Data: n}}, nil
	case "half":
		return []Tensor{{Name: "h", DType: "float16", Shape: in[0].Shape, Data: append([]byte(nil), in[0].Data...)}}, nil
	case "fixed":
		return []Tensor{{Name: "v", DType: "uint8", Shape: in[0].Shape, Data: append([]byte(nil), in[0].Data...)}}, nil
	case "fail":
		return nil, errors.New("the device fell over")
	case "block":
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return nil, fmt.Errorf("fake: model %s", model)
}

// serve starts s on 127.0.0.1:0 and returns a client; everything stops at
// the test's end.
func serve(t testing.TB, s *Server) pb.GRPCInferenceServiceClient {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(ServerOptions()...)
	s.Register(g)
	done := make(chan struct{})
	go func() { defer close(done); _ = g.Serve(lis) }()
	cc, err := grpc.NewClient(lis.Addr().String(), append(DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cc.Close()
		g.Stop()
		<-done
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return pb.NewGRPCInferenceServiceClient(cc)
}

func newFake(t testing.TB) (*Server, *fake) {
	f := &fake{}
	s, err := NewServer("mdag", "test", f)
	if err != nil {
		t.Fatal(err)
	}
	return s, f
}

func f32(v ...float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}

func seq(n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(i) + 0.5
	}
	return v
}

func twiceReq(b int64) *pb.ModelInferRequest {
	return &pb.ModelInferRequest{ModelName: "twice", Id: "r1",
		Inputs:           []*pb.ModelInferRequest_InferInputTensor{{Name: "x", Datatype: "FP32", Shape: []int64{b, 2, 3}}},
		RawInputContents: [][]byte{f32(seq(int(b) * 6)...)}}
}

func sparam(s string) *pb.InferParameter {
	return &pb.InferParameter{ParameterChoice: &pb.InferParameter_StringParam{StringParam: s}}
}
func iparam(v int64) *pb.InferParameter {
	return &pb.InferParameter{ParameterChoice: &pb.InferParameter_Int64Param{Int64Param: v}}
}
func shmP(name string, size, off int64) map[string]*pb.InferParameter {
	return map[string]*pb.InferParameter{ParamRegion: sparam(name), ParamByteSize: iparam(size), ParamOffset: iparam(off)}
}

// wantCode checks err's code and that its message says each of says.
func wantCode(t *testing.T, err error, code codes.Code, says ...string) {
	t.Helper()
	if status.Code(err) != code {
		t.Fatalf("error %v, want code %s", err, code)
	}
	for _, s := range says {
		if !strings.Contains(status.Convert(err).Message(), s) {
			t.Errorf("message %q does not say %q", status.Convert(err).Message(), s)
		}
	}
}

func TestHealthAndMetadata(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) }) // after serve's cleanup
	s, _ := newFake(t)
	c := serve(t, s)
	ctx := context.Background()
	live, err := c.ServerLive(ctx, &pb.ServerLiveRequest{})
	if err != nil || !live.Live {
		t.Fatalf("ServerLive %v, %v", live, err)
	}
	ready, err := c.ServerReady(ctx, &pb.ServerReadyRequest{})
	if err != nil || !ready.Ready {
		t.Fatalf("ServerReady %v, %v", ready, err)
	}
	md, err := c.ServerMetadata(ctx, &pb.ServerMetadataRequest{})
	if err != nil || md.Name != "mdag" || md.Version != "test" || fmt.Sprint(md.Extensions) != "[system_shared_memory]" {
		t.Fatalf("ServerMetadata %v, %v; want mdag test with system_shared_memory only (fake is no Loader)", md, err)
	}
	for _, tc := range []struct {
		name, version string
		code          codes.Code
		ready         bool
		says          []string
	}{
		{"twice", "", codes.OK, true, nil},
		{"twice", "1", codes.OK, true, nil},
		{"twice", "2", codes.NotFound, false, []string{"no version \"2\""}},
		{"nope", "", codes.NotFound, false, []string{`"nope"`, "block, fail, fixed, half, twice"}},
	} {
		t.Run(tc.name+"/"+tc.version, func(t *testing.T) {
			r, err := c.ModelReady(ctx, &pb.ModelReadyRequest{Name: tc.name, Version: tc.version})
			if tc.code != codes.OK {
				wantCode(t, err, tc.code, tc.says...)
				_, err = c.ModelMetadata(ctx, &pb.ModelMetadataRequest{Name: tc.name, Version: tc.version})
				wantCode(t, err, tc.code, tc.says...)
				return
			}
			if err != nil || r.Ready != tc.ready {
				t.Fatalf("ModelReady %v, %v", r, err)
			}
			m, err := c.ModelMetadata(ctx, &pb.ModelMetadataRequest{Name: tc.name, Version: tc.version})
			if err != nil {
				t.Fatal(err)
			}
			got := fmt.Sprint(m.Name, m.Versions, m.Platform, m.Inputs[0].Name, m.Inputs[0].Datatype, m.Inputs[0].Shape, len(m.Outputs), m.Outputs[1].Datatype, m.Outputs[1].Shape)
			if want := "twice[1]testxFP32[-1 2 3] 2UINT8[-1 1]"; got != want {
				t.Fatalf("ModelMetadata %s, want %s", got, want)
			}
		})
	}
	// closing: not ready (live still), so clients stop sending
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if r, err := c.ServerReady(ctx, &pb.ServerReadyRequest{}); err != nil || r.Ready {
		t.Fatalf("ServerReady after Close: %v, %v", r, err)
	}
}

func TestModelInfer(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) }) // after serve's cleanup
	s, f := newFake(t)
	c := serve(t, s)
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		req   func() *pb.ModelInferRequest
		check func(t *testing.T, r *pb.ModelInferResponse)
	}{
		{"raw, every output", func() *pb.ModelInferRequest { return twiceReq(3) }, func(t *testing.T, r *pb.ModelInferResponse) {
			if r.ModelName != "twice" || r.ModelVersion != "1" || r.Id != "r1" || len(r.Outputs) != 2 || len(r.RawOutputContents) != 2 {
				t.Fatalf("response %v", r)
			}
			y := seq(18)
			for i := range y {
				y[i] *= 2
			}
			if string(r.RawOutputContents[0]) != string(f32(y...)) || fmt.Sprint(r.Outputs[0].Shape) != "[3 2 3]" || r.Outputs[0].Datatype != "FP32" {
				t.Fatalf("output y %v %v", r.Outputs[0], r.RawOutputContents[0])
			}
			if string(r.RawOutputContents[1]) != "\x00\x01\x02" || r.Outputs[1].Datatype != "UINT8" || fmt.Sprint(r.Outputs[1].Shape) != "[3 1]" {
				t.Fatalf("output n %v %q", r.Outputs[1], r.RawOutputContents[1])
			}
		}},
		{"one requested output", func() *pb.ModelInferRequest {
			r := twiceReq(1)
			r.Outputs = []*pb.ModelInferRequest_InferRequestedOutputTensor{{Name: "n"}}
			return r
		}, func(t *testing.T, r *pb.ModelInferResponse) {
			if len(r.Outputs) != 1 || r.Outputs[0].Name != "n" || string(r.RawOutputContents[0]) != "\x00" {
				t.Fatalf("response %v", r)
			}
		}},
		{"fp32_contents", func() *pb.ModelInferRequest {
			r := twiceReq(1)
			r.RawInputContents = nil
			r.Inputs[0].Contents = &pb.InferTensorContents{Fp32Contents: seq(6)}
			return r
		}, func(t *testing.T, r *pb.ModelInferResponse) {
			if math.Float32frombits(binary.LittleEndian.Uint32(r.RawOutputContents[0][20:])) != 11 {
				t.Fatalf("y[5] of contents 5.5 is not 11: %v", r.RawOutputContents[0])
			}
		}},
		{"uint_contents, no batch", func() *pb.ModelInferRequest {
			return &pb.ModelInferRequest{ModelName: "fixed", Inputs: []*pb.ModelInferRequest_InferInputTensor{{Name: "u", Datatype: "UINT8", Shape: []int64{2, 2}, Contents: &pb.InferTensorContents{UintContents: []uint32{1, 2, 3, 255}}}}}
		}, func(t *testing.T, r *pb.ModelInferResponse) {
			if string(r.RawOutputContents[0]) != "\x01\x02\x03\xff" {
				t.Fatalf("v %q", r.RawOutputContents[0])
			}
		}},
		{"FP16 raw", func() *pb.ModelInferRequest {
			return &pb.ModelInferRequest{ModelName: "half", Inputs: []*pb.ModelInferRequest_InferInputTensor{{Name: "h", Datatype: "FP16", Shape: []int64{2, 4}}}, RawInputContents: [][]byte{[]byte("0123456789abcdef")}}
		}, func(t *testing.T, r *pb.ModelInferResponse) {
			if string(r.RawOutputContents[0]) != "0123456789abcdef" || r.Outputs[0].Datatype != "FP16" {
				t.Fatalf("h %v %q", r.Outputs[0], r.RawOutputContents[0])
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := c.ModelInfer(ctx, tc.req())
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, r)
		})
	}
	calls := f.calls

	// every refusal, with its code and what it says; none reaches the backend
	for _, tc := range []struct {
		name string
		req  func(r *pb.ModelInferRequest)
		code codes.Code
		says []string
	}{
		{"unknown model", func(r *pb.ModelInferRequest) { r.ModelName = "resnet" }, codes.NotFound, []string{`"resnet"`, "twice"}},
		{"unknown version", func(r *pb.ModelInferRequest) { r.ModelVersion = "3" }, codes.NotFound, []string{"version"}},
		{"no inputs", func(r *pb.ModelInferRequest) { r.Inputs = nil }, codes.InvalidArgument, []string{"takes 1 inputs", "'x' float32[-1 2 3]", "has 0"}},
		{"input name", func(r *pb.ModelInferRequest) { r.Inputs[0].Name = "img" }, codes.InvalidArgument, []string{"no input 'img'", "'x'"}},
		{"datatype", func(r *pb.ModelInferRequest) { r.Inputs[0].Datatype = "FP16" }, codes.InvalidArgument, []string{"input 'x' datatype FP16: model twice wants FP32"}},
		{"shape", func(r *pb.ModelInferRequest) { r.Inputs[0].Shape = []int64{1, 3, 2} }, codes.InvalidArgument, []string{"input 'x' shape [1 3 2]: model twice wants [-1 2 3]"}},
		{"rank", func(r *pb.ModelInferRequest) { r.Inputs[0].Shape = []int64{6} }, codes.InvalidArgument, []string{"shape [6]", "rank 1, not 3"}},
		{"negative dim", func(r *pb.ModelInferRequest) { r.Inputs[0].Shape = []int64{1, -2, 3} }, codes.InvalidArgument, []string{"shape [1 -2 3]"}},
		{"batch > max_batch", func(r *pb.ModelInferRequest) { r.Inputs[0].Shape = []int64{5, 2, 3} }, codes.InvalidArgument, []string{"batch 5", "1..4 (max_batch)"}},
		{"batch 0", func(r *pb.ModelInferRequest) { r.Inputs[0].Shape = []int64{0, 2, 3} }, codes.InvalidArgument, []string{"batch 0"}},
		{"raw bytes", func(r *pb.ModelInferRequest) { r.RawInputContents[0] = r.RawInputContents[0][:10] }, codes.InvalidArgument, []string{"raw_input_contents[0] (input 'x') has 10 bytes, shape [2 2 3] * FP32 needs 48"}},
		{"raw count", func(r *pb.ModelInferRequest) { r.RawInputContents = append(r.RawInputContents, nil) }, codes.InvalidArgument, []string{"2 raw_input_contents for 1 inputs"}},
		{"no data", func(r *pb.ModelInferRequest) { r.RawInputContents = nil }, codes.InvalidArgument, []string{"carry no data"}},
		{"contents count", func(r *pb.ModelInferRequest) {
			r.RawInputContents = nil
			r.Inputs[0].Contents = &pb.InferTensorContents{Fp32Contents: []float32{1}}
		}, codes.InvalidArgument, []string{"1 fp32_contents, the shape has 12 elements"}},
		{"output name", func(r *pb.ModelInferRequest) {
			r.Outputs = []*pb.ModelInferRequest_InferRequestedOutputTensor{{Name: "probs"}}
		}, codes.InvalidArgument, []string{"no output 'probs'", "'y'", "'n'"}},
		{"unknown input region", func(r *pb.ModelInferRequest) {
			r.RawInputContents = nil
			r.Inputs[0].Parameters = shmP("in0", 48, 0)
		}, codes.NotFound, []string{`input 'x': shared memory region "in0" is not registered`}},
		{"unknown output region", func(r *pb.ModelInferRequest) {
			r.Outputs = []*pb.ModelInferRequest_InferRequestedOutputTensor{{Name: "y", Parameters: shmP("out0", 48, 0)}}
		}, codes.NotFound, []string{`output 'y': shared memory region "out0"`}},
		{"region without size", func(r *pb.ModelInferRequest) {
			r.RawInputContents = nil
			r.Inputs[0].Parameters = map[string]*pb.InferParameter{ParamRegion: sparam("in0")}
		}, codes.InvalidArgument, []string{"needs parameter shared_memory_byte_size"}},
		{"negative offset", func(r *pb.ModelInferRequest) {
			r.RawInputContents = nil
			r.Inputs[0].Parameters = shmP("in0", 48, -1)
		}, codes.InvalidArgument, []string{"shared_memory_offset is -1"}},
		{"region name type", func(r *pb.ModelInferRequest) {
			r.RawInputContents = nil
			r.Inputs[0].Parameters = map[string]*pb.InferParameter{ParamRegion: iparam(1), ParamByteSize: iparam(48)}
		}, codes.InvalidArgument, []string{"must be a non-empty string"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := twiceReq(2)
			tc.req(r)
			_, err := c.ModelInfer(ctx, r)
			wantCode(t, err, tc.code, tc.says...)
		})
	}
	if f.calls != calls {
		t.Errorf("refused requests reached the backend: %d calls, want %d", f.calls, calls)
	}

	t.Run("FP16 contents", func(t *testing.T) {
		_, err := c.ModelInfer(ctx, &pb.ModelInferRequest{ModelName: "half", Inputs: []*pb.ModelInferRequest_InferInputTensor{{Name: "h", Datatype: "FP16", Shape: []int64{1, 4}, Contents: &pb.InferTensorContents{Fp32Contents: []float32{1, 2, 3, 4}}}}})
		wantCode(t, err, codes.InvalidArgument, "FP16 has no typed contents field")
	})
	t.Run("UINT8 contents > 255", func(t *testing.T) {
		_, err := c.ModelInfer(ctx, &pb.ModelInferRequest{ModelName: "fixed", Inputs: []*pb.ModelInferRequest_InferInputTensor{{Name: "u", Datatype: "UINT8", Shape: []int64{2, 2}, Contents: &pb.InferTensorContents{UintContents: []uint32{1, 2, 3, 256}}}}})
		wantCode(t, err, codes.InvalidArgument, "uint_contents[3] is 256")
	})
	t.Run("backend error", func(t *testing.T) {
		_, err := c.ModelInfer(ctx, &pb.ModelInferRequest{ModelName: "fail", Inputs: []*pb.ModelInferRequest_InferInputTensor{{Name: "x", Datatype: "FP32", Shape: []int64{1, 1}}}, RawInputContents: [][]byte{f32(1)}})
		wantCode(t, err, codes.Internal, "model fail, batch of 1: the device fell over")
	})
	t.Run("deadline", func(t *testing.T) {
		// the backend blocks until its context ends: the client's deadline
		// reaches it and comes back as DeadlineExceeded
		dctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		_, err := c.ModelInfer(dctx, &pb.ModelInferRequest{ModelName: "block", Inputs: []*pb.ModelInferRequest_InferInputTensor{{Name: "x", Datatype: "FP32", Shape: []int64{1, 1}}}, RawInputContents: [][]byte{f32(1)}})
		wantCode(t, err, codes.DeadlineExceeded)
	})
}

// The system shared memory extension: register, infer with the input
// read from and the output written to regions (the output's parameters
// echo where), status, refusals, unregister.
func TestSharedMemory(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) }) // after serve's cleanup
	s, _ := newFake(t)
	c := serve(t, s)
	ctx := context.Background()
	key := fmt.Sprintf("/mdag-srv-test-%d", os.Getpid())
	mem, err := CreateRegion(key, 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	copy(mem.Data[100:], f32(seq(12)...))

	for _, tc := range []struct {
		name string
		req  *pb.SystemSharedMemoryRegisterRequest
		code codes.Code
		says string
	}{
		{"in", &pb.SystemSharedMemoryRegisterRequest{Name: "in", Key: key, Offset: 100, ByteSize: 48}, codes.OK, ""},
		{"out", &pb.SystemSharedMemoryRegisterRequest{Name: "out", Key: key, Offset: 1000, ByteSize: 1000}, codes.OK, ""},
		{"again", &pb.SystemSharedMemoryRegisterRequest{Name: "in", Key: key, Offset: 0, ByteSize: 48}, codes.AlreadyExists, `"in" is registered already`},
		{"no name", &pb.SystemSharedMemoryRegisterRequest{Key: key, ByteSize: 48}, codes.InvalidArgument, "needs a name"},
		{"bad key", &pb.SystemSharedMemoryRegisterRequest{Name: "x", Key: "a/b", ByteSize: 48}, codes.InvalidArgument, "want /NAME"},
		{"no object", &pb.SystemSharedMemoryRegisterRequest{Name: "x", Key: key + "-absent", ByteSize: 48}, codes.NotFound, "no such file"},
		{"too large", &pb.SystemSharedMemoryRegisterRequest{Name: "x", Key: key, Offset: 4000, ByteSize: 200}, codes.InvalidArgument, "outside its 4096 bytes"},
		{"size 0", &pb.SystemSharedMemoryRegisterRequest{Name: "x", Key: key}, codes.InvalidArgument, "byte_size 0"},
	} {
		t.Run("register "+tc.name, func(t *testing.T) {
			_, err := c.SystemSharedMemoryRegister(ctx, tc.req)
			if tc.code == codes.OK {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			wantCode(t, err, tc.code, tc.says)
		})
	}
	st, err := c.SystemSharedMemoryStatus(ctx, &pb.SystemSharedMemoryStatusRequest{})
	if err != nil || len(st.Regions) != 2 || st.Regions["in"].Key != key || st.Regions["in"].Offset != 100 || st.Regions["out"].ByteSize != 1000 {
		t.Fatalf("status %v, %v", st, err)
	}
	_, err = c.SystemSharedMemoryStatus(ctx, &pb.SystemSharedMemoryStatusRequest{Name: "nope"})
	wantCode(t, err, codes.NotFound, `"nope" is not registered`)

	req := &pb.ModelInferRequest{ModelName: "twice",
		Inputs:  []*pb.ModelInferRequest_InferInputTensor{{Name: "x", Datatype: "FP32", Shape: []int64{2, 2, 3}, Parameters: shmP("in", 48, 0)}},
		Outputs: []*pb.ModelInferRequest_InferRequestedOutputTensor{{Name: "y", Parameters: shmP("out", 48, 8)}, {Name: "n"}}}
	r, err := c.ModelInfer(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	y := seq(12)
	for i := range y {
		y[i] *= 2
	}
	if got := mem.Data[1008 : 1008+48]; string(got) != string(f32(y...)) {
		t.Fatalf("y in the region %v, want %v", got, f32(y...))
	}
	if len(r.RawOutputContents) != 1 || string(r.RawOutputContents[0]) != "\x00\x01" {
		t.Fatalf("raw outputs %q: want only n's", r.RawOutputContents)
	}
	p := r.Outputs[0].Parameters
	if r.Outputs[0].Name != "y" || p[ParamRegion].GetStringParam() != "out" || p[ParamByteSize].GetInt64Param() != 48 || p[ParamOffset].GetInt64Param() != 8 {
		t.Fatalf("y's parameters %v: want the region, byte size and offset echoed", p)
	}

	for _, tc := range []struct {
		name string
		mod  func(r *pb.ModelInferRequest)
		code codes.Code
		says string
	}{
		{"input byte size", func(r *pb.ModelInferRequest) { r.Inputs[0].Parameters = shmP("in", 40, 0) }, codes.InvalidArgument, "shared_memory_byte_size 40, shape [2 2 3] * FP32 needs 48"},
		{"input out of range", func(r *pb.ModelInferRequest) { r.Inputs[0].Parameters = shmP("in", 48, 4) }, codes.InvalidArgument, `offset 4 + byte_size 48 is outside shared memory region "in" of 48 bytes`},
		{"output region too small", func(r *pb.ModelInferRequest) { r.Outputs[0].Parameters = shmP("out", 40, 0) }, codes.InvalidArgument, `output 'y' is 48 bytes (shape [2 2 3] * FP32): shared memory region "out" was given shared_memory_byte_size 40`},
		{"output out of range", func(r *pb.ModelInferRequest) { r.Outputs[0].Parameters = shmP("out", 48, 990) }, codes.InvalidArgument, "outside shared memory region"},
		{"contents and region", func(r *pb.ModelInferRequest) {
			r.Inputs[0].Contents = &pb.InferTensorContents{Fp32Contents: seq(12)}
		}, codes.InvalidArgument, "contents and a shared memory region"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := proto.Clone(req).(*pb.ModelInferRequest)
			tc.mod(r)
			_, err := c.ModelInfer(ctx, r)
			wantCode(t, err, tc.code, tc.says)
		})
	}

	if _, err := c.SystemSharedMemoryUnregister(ctx, &pb.SystemSharedMemoryUnregisterRequest{Name: "in"}); err != nil {
		t.Fatal(err)
	}
	_, err = c.SystemSharedMemoryUnregister(ctx, &pb.SystemSharedMemoryUnregisterRequest{Name: "in"})
	wantCode(t, err, codes.NotFound, `"in" is not registered`)
	_, err = c.ModelInfer(ctx, req)
	wantCode(t, err, codes.NotFound, `"in" is not registered (registered: out)`)
	if _, err := c.SystemSharedMemoryUnregister(ctx, &pb.SystemSharedMemoryUnregisterRequest{}); err != nil {
		t.Fatal(err)
	}
	if st, err := c.SystemSharedMemoryStatus(ctx, &pb.SystemSharedMemoryStatusRequest{}); err != nil || len(st.Regions) != 0 {
		t.Fatalf("after unregistering all: %v, %v", st, err)
	}
	// the server never removes the client's object
	if _, err := os.Stat(filepath.Join(ShmDir, key[1:])); err != nil {
		t.Fatalf("the object is gone: %v", err)
	}
}

// Requests that use a region while it is unregistered: Unregister waits
// for them (no access to unmapped memory), later ones are refused.
func TestSharedMemoryUnregisterWhileInUse(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) }) // after serve's cleanup
	s, _ := newFake(t)
	c := serve(t, s)
	ctx := context.Background()
	key := fmt.Sprintf("/mdag-srv-race-%d", os.Getpid())
	mem, err := CreateRegion(key, 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	var wg sync.WaitGroup
	for i := range 20 {
		// a name per iteration: a register of r0 racing the unregister
		// of an earlier r0 is a different race (Unavailable, by design)
		name := fmt.Sprintf("r%d", i)
		if _, err := c.SystemSharedMemoryRegister(ctx, &pb.SystemSharedMemoryRegisterRequest{Name: name, Key: key, ByteSize: 4096}); err != nil && status.Code(err) != codes.AlreadyExists {
			t.Fatal(err)
		}
		wg.Add(2)
		go func() {
			defer wg.Done()
			_, err := c.ModelInfer(ctx, &pb.ModelInferRequest{ModelName: "twice",
				Inputs:  []*pb.ModelInferRequest_InferInputTensor{{Name: "x", Datatype: "FP32", Shape: []int64{4, 2, 3}, Parameters: shmP(name, 96, 0)}},
				Outputs: []*pb.ModelInferRequest_InferRequestedOutputTensor{{Name: "y", Parameters: shmP(name, 96, 96)}}})
			if err != nil && status.Code(err) != codes.NotFound {
				t.Errorf("infer: %v", err)
			}
		}()
		go func() {
			defer wg.Done()
			_, err := c.SystemSharedMemoryUnregister(ctx, &pb.SystemSharedMemoryUnregisterRequest{Name: name})
			if err != nil && status.Code(err) != codes.NotFound {
				t.Errorf("unregister: %v", err)
			}
		}()
	}
	wg.Wait()
}

// A client that truncates its object under a registered region makes
// reading it fault (SIGBUS): the request fails, the server goes on.
func TestSharedMemoryTruncated(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) }) // after serve's cleanup
	s, _ := newFake(t)
	c := serve(t, s)
	ctx := context.Background()
	key := fmt.Sprintf("/mdag-srv-trunc-%d", os.Getpid())
	mem, err := CreateRegion(key, 3*os.Getpagesize())
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	off := int64(2 * os.Getpagesize())
	if _, err := c.SystemSharedMemoryRegister(ctx, &pb.SystemSharedMemoryRegisterRequest{Name: "r", Key: key, Offset: uint64(off), ByteSize: 96}); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(filepath.Join(ShmDir, key[1:]), 0); err != nil {
		t.Fatal(err)
	}
	req := &pb.ModelInferRequest{ModelName: "twice",
		Inputs:           []*pb.ModelInferRequest_InferInputTensor{{Name: "x", Datatype: "FP32", Shape: []int64{1, 2, 3}}},
		Outputs:          []*pb.ModelInferRequest_InferRequestedOutputTensor{{Name: "y", Parameters: shmP("r", 24, 0)}},
		RawInputContents: [][]byte{f32(seq(6)...)}}
	_, err = c.ModelInfer(ctx, req)
	wantCode(t, err, codes.InvalidArgument, "shared memory region faulted", "truncated")
	// the server still answers
	req.Outputs = nil
	if _, err := c.ModelInfer(ctx, req); err != nil {
		t.Fatal(err)
	}
}

// emulatedRegistry is a registry of two models (any format serves: only
// the input and max_batch are read).
func emulatedRegistry(t *testing.T) *registry.Registry {
	dir := t.TempDir()
	for _, f := range []string{"a.onnx", "b.onnx"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	yaml := `models:
  resnet:
    format: onnx
    file: a.onnx
    input: {name: input, dtype: float32, layout: NCHW, width: 8, height: 4}
    max_batch: 4
    decoder: {name: classify}
  face:
    format: onnx
    file: b.onnx
    input: {name: img, dtype: uint8, layout: NHWC, width: 2, height: 2}
    max_batch: 2
    decoder: {name: blazeface}
`
	p := filepath.Join(dir, "models.yaml")
	if err := os.WriteFile(p, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	reg, err := registry.Load(p)
	if err != nil {
		t.Fatal(err)
	}
	return reg
}

func linearLatency(model string, b int) (time.Duration, bool) {
	return time.Duration(b)*time.Millisecond + 4*time.Millisecond, model == "resnet" || model == "face"
}

// The emulated backend: the registry's input shape, l(b) on the injected
// clock (the answer waits for the clock), zeros [b,1] back; and the
// repository extension, which it supports.
func TestEmulatedBackend(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) }) // after serve's cleanup
	clk := clock.NewFake(time.Unix(0, 0))
	e, err := NewEmulated(emulatedRegistry(t), clk, linearLatency)
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewServer("mdag", "test", e)
	if err != nil {
		t.Fatal(err)
	}
	c := serve(t, s)
	ctx := context.Background()
	md, err := c.ModelMetadata(ctx, &pb.ModelMetadataRequest{Name: "resnet"})
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(md.Platform, md.Inputs[0].Name, md.Inputs[0].Datatype, md.Inputs[0].Shape, md.Outputs[0].Name, md.Outputs[0].Shape); got != "mdag_emulatedinputFP32[-1 3 4 8]output[-1 1]" {
		t.Fatalf("metadata %s", got)
	}
	smd, _ := c.ServerMetadata(ctx, &pb.ServerMetadataRequest{})
	if fmt.Sprint(smd.Extensions) != "[model_repository system_shared_memory]" {
		t.Fatalf("extensions %v", smd.Extensions)
	}
	req := &pb.ModelInferRequest{ModelName: "face", Inputs: []*pb.ModelInferRequest_InferInputTensor{{Name: "img", Datatype: "UINT8", Shape: []int64{2, 2, 2, 3}}}, RawInputContents: [][]byte{make([]byte, 24)}}
	type res struct {
		r   *pb.ModelInferResponse
		err error
	}
	done := make(chan res, 1)
	go func() {
		r, err := c.ModelInfer(ctx, req)
		done <- res{r, err}
	}()
	// the request waits l(2) = 6 ms on the fake clock: advance to just
	// before, then past
	for limit := time.Now().Add(10 * time.Second); clk.Pending() == 0; runtime.Gosched() {
		if time.Now().After(limit) {
			t.Fatal("the request never waited on the clock")
		}
	}
	next, _ := clk.Next()
	if d := next.Sub(time.Unix(0, 0)); d != 6*time.Millisecond {
		t.Fatalf("the backend waits %v, want l(2) = 6ms", d)
	}
	clk.Advance(5 * time.Millisecond)
	select {
	case r := <-done:
		t.Fatalf("answered before l(2): %v %v", r.r, r.err)
	default:
	}
	clk.Advance(time.Millisecond)
	got := <-done
	if got.err != nil {
		t.Fatal(got.err)
	}
	if fmt.Sprint(got.r.Outputs[0].Shape) != "[2 1]" || string(got.r.RawOutputContents[0]) != string(make([]byte, 8)) {
		t.Fatalf("output %v %v, want zeros [2 1]", got.r.Outputs[0], got.r.RawOutputContents)
	}

	// repository: unload, refused while unloaded, load again
	idx, err := c.RepositoryIndex(ctx, &pb.RepositoryIndexRequest{})
	if err != nil || len(idx.Models) != 2 || idx.Models[0].State != StateReady {
		t.Fatalf("index %v, %v", idx, err)
	}
	if _, err := c.RepositoryModelUnload(ctx, &pb.RepositoryModelUnloadRequest{ModelName: "face"}); err != nil {
		t.Fatal(err)
	}
	if r, err := c.ModelReady(ctx, &pb.ModelReadyRequest{Name: "face"}); err != nil || r.Ready {
		t.Fatalf("face ready after unload: %v %v", r, err)
	}
	// a model deliberately unloaded does not make the server unready
	// (clients of its other models stay healthy)
	if r, err := c.ServerReady(ctx, &pb.ServerReadyRequest{}); err != nil || !r.Ready {
		t.Fatalf("server not ready with one model unloaded: %v %v", r, err)
	}
	_, err = c.ModelInfer(ctx, req)
	wantCode(t, err, codes.FailedPrecondition, "model face is not loaded (unloaded); RepositoryModelLoad loads it")
	idx, _ = c.RepositoryIndex(ctx, &pb.RepositoryIndexRequest{Ready: true})
	if len(idx.Models) != 1 || idx.Models[0].Name != "resnet" {
		t.Fatalf("ready index %v", idx)
	}
	_, err = c.RepositoryModelLoad(ctx, &pb.RepositoryModelLoadRequest{ModelName: "nope"})
	wantCode(t, err, codes.NotFound, `"nope"`)
	if _, err := c.RepositoryModelLoad(ctx, &pb.RepositoryModelLoadRequest{ModelName: "face"}); err != nil {
		t.Fatal(err)
	}
	if r, err := c.ModelReady(ctx, &pb.ModelReadyRequest{Name: "face"}); err != nil || !r.Ready {
		t.Fatalf("face not ready after load: %v %v", r, err)
	}
}

// A backend that is not a Loader: the repository RPCs say so.
func TestRepositoryUnimplemented(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) }) // after serve's cleanup
	s, _ := newFake(t)
	c := serve(t, s)
	ctx := context.Background()
	_, err := c.RepositoryIndex(ctx, &pb.RepositoryIndexRequest{})
	wantCode(t, err, codes.Unimplemented, "model repository extension", "cannot unload")
	_, err = c.RepositoryModelLoad(ctx, &pb.RepositoryModelLoadRequest{ModelName: "twice"})
	wantCode(t, err, codes.Unimplemented)
	_, err = c.RepositoryModelUnload(ctx, &pb.RepositoryModelUnloadRequest{ModelName: "twice"})
	wantCode(t, err, codes.Unimplemented)
}

func TestNewServerRefuses(t *testing.T) {
	for _, tc := range []struct {
		name string
		b    []Backend
		says string
	}{
		{"twice the same models", []Backend{&fake{}, &fake{}}, "model twice is served by two backends"},
		{"nothing", nil, "no models"},
		{"bad dtype", []Backend{metaOnly{{Name: "m", Inputs: []TensorMeta{{Name: "x", DType: "int64", Shape: []int64{1}}}, Outputs: []TensorMeta{{Name: "y", DType: "float32", Shape: []int64{1}}}}}}, "tensor 'x'"},
		{"batch not leading", []Backend{metaOnly{{Name: "m", MaxBatch: 2, Inputs: []TensorMeta{{Name: "x", DType: "float32", Shape: []int64{3}}}, Outputs: []TensorMeta{{Name: "y", DType: "float32", Shape: []int64{-1}}}}}}, "leading dimension must be -1"},
		{"no outputs", []Backend{metaOnly{{Name: "m", Inputs: []TensorMeta{{Name: "x", DType: "float32", Shape: []int64{3}}}}}}, "0 outputs"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewServer("mdag", "test", tc.b...)
			if err == nil || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("error %v, want one that says %q", err, tc.says)
			}
		})
	}
}

type metaOnly []ModelMeta

func (m metaOnly) Models() []ModelMeta { return m }
func (m metaOnly) Infer(context.Context, string, []Tensor) ([]Tensor, error) {
	return nil, errors.New("meta only")
}

// FuzzModelInfer: no request bytes crash the server; whatever it answers
// is an answer or a status error.
func FuzzModelInfer(f *testing.F) {
	key := fmt.Sprintf("/mdag-srv-fuzz-%d", os.Getpid())
	mem, err := CreateRegion(key, 4096)
	if err != nil {
		f.Fatal(err)
	}
	defer mem.Close()
	s, err := NewServer("mdag", "fuzz", &fake{})
	if err != nil {
		f.Fatal(err)
	}
	defer s.Close()
	if _, err := s.SystemSharedMemoryRegister(context.Background(), &pb.SystemSharedMemoryRegisterRequest{Name: "r", Key: key, Offset: 10, ByteSize: 1000}); err != nil {
		f.Fatal(err)
	}
	seeds := []*pb.ModelInferRequest{twiceReq(1), twiceReq(4),
		{ModelName: "twice", Inputs: []*pb.ModelInferRequest_InferInputTensor{{Name: "x", Datatype: "FP32", Shape: []int64{1, 2, 3}, Parameters: shmP("r", 24, 0)}},
			Outputs: []*pb.ModelInferRequest_InferRequestedOutputTensor{{Name: "y", Parameters: shmP("r", 24, 900)}}},
		{ModelName: "fixed", Inputs: []*pb.ModelInferRequest_InferInputTensor{{Name: "u", Datatype: "UINT8", Shape: []int64{2, 2}, Contents: &pb.InferTensorContents{UintContents: []uint32{1, 2, 3, 4}}}}},
		{ModelName: "half", Inputs: []*pb.ModelInferRequest_InferInputTensor{{Name: "h", Datatype: "FP16", Shape: []int64{1, 4}}}, RawInputContents: [][]byte{make([]byte, 8)}},
	}
	for _, r := range seeds {
		b, err := proto.Marshal(r)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var r pb.ModelInferRequest
		if proto.Unmarshal(b, &r) != nil {
			return
		}
		if r.ModelName == "block" {
			return // waits for its context by design
		}
		resp, err := s.ModelInfer(context.Background(), &r)
		if err != nil {
			if _, ok := status.FromError(err); !ok {
				t.Fatalf("a non-status error: %v", err)
			}
			return
		}
		if resp.ModelName != r.ModelName {
			t.Fatalf("answer for %q to a request for %q", resp.ModelName, r.ModelName)
		}
	})
}
