package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	pb "github.com/mdag/mdag/api/kserve"
	"github.com/mdag/mdag/gpu/kserve"
	"github.com/mdag/mdag/gpu/onnx"
	"github.com/mdag/mdag/gpu/prep"
	"github.com/mdag/mdag/gpu/registry"
	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/internal/unixsock"
	"github.com/mdag/mdag/media"
	"github.com/mdag/mdag/profile"
)

// inferFlags parses onnx flags as the command would.
func inferFlags(t *testing.T, args ...string) *onnxFlags {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	ox := addONNXFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return ox
}

// startInfer serves is on 127.0.0.1:0 (serveInfer, as the command does)
// and returns a client; the server stops gracefully at the test's end.
func startInfer(t *testing.T, s *kserve.Server) pb.GRPCInferenceServiceClient {
	cc, err := grpc.NewClient(serveInferAt(t, s), append(kserve.DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return pb.NewGRPCInferenceServiceClient(cc)
}

func testFrame(seed, w, h int) *media.Frame {
	f := media.NewFrame(w, h)
	for i := range f.Pix {
		f.Pix[i] = byte((i*13 + seed*29 + (i/(w*3))*seed) % 253)
	}
	return f
}

// The onnx executor over the protocol answers exactly what the in-process
// executor answers for the same frames: raw bytes and shared memory both
// ways; its errors come back with their codes.
func TestInferServerONNX(t *testing.T) {
	requireORT(t)
	t.Cleanup(func() { goleak.VerifyNone(t) })
	is, err := newInferServer("onnx", inferFlags(t, "--models", "testdata/onnx/models.yaml", "--intra-threads", "1", "--sessions", "1"), "", "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(is.close)
	c := startInfer(t, is.srv)
	ctx := context.Background()

	md, err := c.ModelMetadata(ctx, &pb.ModelMetadataRequest{Name: "tiny"})
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(md.Platform, " ", md.Inputs[0].Name, " ", md.Inputs[0].Datatype, md.Inputs[0].Shape, " ", md.Outputs[0].Name, " ", md.Outputs[0].Datatype, md.Outputs[0].Shape); got != "onnxruntime_onnx input FP32[-1 3 64 64] probs FP32[-1 10]" {
		t.Fatalf("metadata %s", got)
	}

	// the reference: the in-process executor on the same registry
	reg, err := registry.Load("testdata/onnx/models.yaml")
	if err != nil {
		t.Fatal(err)
	}
	ref, err := onnx.New(reg, onnx.Config{IntraThreads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer ref.Close()
	in := &reg.Models["tiny"].Input
	frames := []*media.Frame{testFrame(1, 64, 64), testFrame(2, 100, 80), testFrame(3, 48, 90)}
	want, err := ref.RunRaw("tiny", frames)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := prep.Pack(make([]byte, 3*prep.ItemBytes(in)), in, frames, nil)
	if err != nil {
		t.Fatal(err)
	}
	same := func(t *testing.T, out []byte) {
		t.Helper()
		vals, err := prep.Floats("float32", out)
		if err != nil || len(vals) != 30 {
			t.Fatalf("%d values (%v), want 30", len(vals), err)
		}
		for i := range frames {
			if a, b := fmt.Sprint(vals[i*10:(i+1)*10]), fmt.Sprint(want[i][0].Data); a != b {
				t.Fatalf("item %d: over the protocol %s, in process %s", i, a, b)
			}
		}
	}
	req := &pb.ModelInferRequest{ModelName: "tiny",
		Inputs:           []*pb.ModelInferRequest_InferInputTensor{{Name: "input", Datatype: "FP32", Shape: []int64{3, 3, 64, 64}}},
		RawInputContents: [][]byte{raw}}
	r, err := c.ModelInfer(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(r.Outputs[0].Name, r.Outputs[0].Shape) != "probs[3 10]" {
		t.Fatalf("output %v", r.Outputs[0])
	}
	same(t, r.RawOutputContents[0])

	t.Run("concurrent", func(t *testing.T) {
		// 6 clients at once on 1 session per model: each gets its own
		// batch's answer
		errs := make(chan error, 6)
		for g := range 6 {
			go func() {
				n := 1 + g%3
				fr := frames[:n]
				want, err := ref.RunRaw("tiny", fr)
				if err != nil {
					errs <- err
					return
				}
				r, err := c.ModelInfer(ctx, &pb.ModelInferRequest{ModelName: "tiny",
					Inputs:           []*pb.ModelInferRequest_InferInputTensor{{Name: "input", Datatype: "FP32", Shape: []int64{int64(n), 3, 64, 64}}},
					RawInputContents: [][]byte{raw[:n*prep.ItemBytes(in)]}})
				if err != nil {
					errs <- err
					return
				}
				vals, _ := prep.Floats("float32", r.RawOutputContents[0])
				for i := range n {
					if a, b := fmt.Sprint(vals[i*10:(i+1)*10]), fmt.Sprint(want[i][0].Data); a != b {
						errs <- fmt.Errorf("client %d item %d: %s, want %s", g, i, a, b)
						return
					}
				}
				errs <- nil
			}()
		}
		for range 6 {
			if err := <-errs; err != nil {
				t.Error(err)
			}
		}
	})

	t.Run("shared memory", func(t *testing.T) {
		key := fmt.Sprintf("/mdag-infer-server-test-%d", os.Getpid())
		mem, err := kserve.CreateRegion(key, len(raw)+4096)
		if err != nil {
			t.Fatal(err)
		}
		defer mem.Close()
		copy(mem.Data, raw)
		for _, rg := range []*pb.SystemSharedMemoryRegisterRequest{
			{Name: "in", Key: key, ByteSize: uint64(len(raw))},
			{Name: "out", Key: key, Offset: uint64(len(raw)), ByteSize: 4096},
		} {
			if _, err := c.SystemSharedMemoryRegister(ctx, rg); err != nil {
				t.Fatal(err)
			}
		}
		defer c.SystemSharedMemoryUnregister(ctx, &pb.SystemSharedMemoryUnregisterRequest{})
		p := func(name string, size int) map[string]*pb.InferParameter {
			return map[string]*pb.InferParameter{
				kserve.ParamRegion:   {ParameterChoice: &pb.InferParameter_StringParam{StringParam: name}},
				kserve.ParamByteSize: {ParameterChoice: &pb.InferParameter_Int64Param{Int64Param: int64(size)}},
			}
		}
		r, err := c.ModelInfer(ctx, &pb.ModelInferRequest{ModelName: "tiny",
			Inputs:  []*pb.ModelInferRequest_InferInputTensor{{Name: "input", Datatype: "FP32", Shape: []int64{3, 3, 64, 64}, Parameters: p("in", len(raw))}},
			Outputs: []*pb.ModelInferRequest_InferRequestedOutputTensor{{Name: "probs", Parameters: p("out", 4096)}}})
		if err != nil {
			t.Fatal(err)
		}
		if len(r.RawOutputContents) != 0 || r.Outputs[0].Parameters[kserve.ParamByteSize].GetInt64Param() != 120 {
			t.Fatalf("response %v: want probs in the region, 120 bytes", r)
		}
		same(t, mem.Data[len(raw):len(raw)+120])
	})

	for _, tc := range []struct {
		name string
		mod  func(r *pb.ModelInferRequest)
		code codes.Code
		says string
	}{
		{"unknown model", func(r *pb.ModelInferRequest) { r.ModelName = "resnet" }, codes.NotFound, `model "resnet" is not served here (served: tiny)`},
		{"wrong shape", func(r *pb.ModelInferRequest) { r.Inputs[0].Shape = []int64{3, 3, 224, 224} }, codes.InvalidArgument, "input 'input' shape [3 3 224 224]: model tiny wants [-1 3 64 64]"},
		{"batch > max_batch", func(r *pb.ModelInferRequest) { r.Inputs[0].Shape[0] = 9 }, codes.InvalidArgument, "batch 9, model tiny takes 1..8 (max_batch)"},
		{"bytes", func(r *pb.ModelInferRequest) { r.RawInputContents[0] = raw[:100] }, codes.InvalidArgument, "raw_input_contents[0] (input 'input') has 100 bytes, shape [3 3 64 64] * FP32 needs 147456"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &pb.ModelInferRequest{ModelName: "tiny",
				Inputs:           []*pb.ModelInferRequest_InferInputTensor{{Name: "input", Datatype: "FP32", Shape: []int64{3, 3, 64, 64}}},
				RawInputContents: [][]byte{raw}}
			tc.mod(r)
			_, err := c.ModelInfer(ctx, r)
			if status.Code(err) != tc.code || !strings.Contains(status.Convert(err).Message(), tc.says) {
				t.Fatalf("error %v, want %s saying %q", err, tc.code, tc.says)
			}
		})
	}

	// the repository extension: unload frees the sessions, load makes them
	// again, and the model answers as before
	if _, err := c.RepositoryModelUnload(ctx, &pb.RepositoryModelUnloadRequest{ModelName: "tiny"}); err != nil {
		t.Fatal(err)
	}
	if r, err := c.ModelReady(ctx, &pb.ModelReadyRequest{Name: "tiny"}); err != nil || r.Ready {
		t.Fatalf("ready after unload: %v %v", r, err)
	}
	if _, err := c.ModelInfer(ctx, req); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "model tiny is not loaded (unloaded)") {
		t.Fatalf("infer after unload: %v", err)
	}
	if _, err := c.RepositoryModelLoad(ctx, &pb.RepositoryModelLoadRequest{ModelName: "tiny"}); err != nil {
		t.Fatal(err)
	}
	if r, err = c.ModelInfer(ctx, req); err != nil {
		t.Fatal(err)
	}
	same(t, r.RawOutputContents[0])
}

// --executor emulated: the registry's tensors, l(b) from the profiles,
// zeros back.
func TestInferServerEmulated(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	is, err := newInferServer("emulated", inferFlags(t, "--models", "testdata/onnx/models.yaml"), "testdata/onnx/profiles.yaml", "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(is.close)
	c := startInfer(t, is.srv)
	r, err := c.ModelInfer(context.Background(), &pb.ModelInferRequest{ModelName: "tiny",
		Inputs:           []*pb.ModelInferRequest_InferInputTensor{{Name: "input", Datatype: "FP32", Shape: []int64{2, 3, 64, 64}}},
		RawInputContents: [][]byte{make([]byte, 2*3*64*64*4)}})
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(r.Outputs[0].Name, r.Outputs[0].Datatype, r.Outputs[0].Shape) != "outputFP32[2 1]" || string(r.RawOutputContents[0]) != string(make([]byte, 8)) {
		t.Fatalf("response %v", r)
	}
	md, _ := c.ModelMetadata(context.Background(), &pb.ModelMetadataRequest{Name: "tiny"})
	if md.Platform != kserve.PlatformEmulated {
		t.Fatalf("platform %q", md.Platform)
	}
}

// l(b) from the profiles: the points, interpolated between and
// extrapolated beyond; a model without a profile or an unclear worker
// type is refused with what to do.
func TestProfileLatency(t *testing.T) {
	reg, err := registry.Load("testdata/onnx/models.yaml")
	if err != nil {
		t.Fatal(err)
	}
	pf, err := profile.Load("testdata/onnx/profiles.yaml")
	if err != nil {
		t.Fatal(err)
	}
	l, err := profileLatency(pf, "", reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		b    int
		want time.Duration
	}{{1, 8 * time.Millisecond}, {2, 10 * time.Millisecond}, {3, 12 * time.Millisecond}, {6, 18 * time.Millisecond}, {8, 22 * time.Millisecond}, {10, 26 * time.Millisecond}} {
		if got, ok := l("tiny", tc.b); !ok || got != tc.want {
			t.Errorf("l(%d) = %v %v, want %v", tc.b, got, ok, tc.want)
		}
	}
	if _, ok := l("other", 1); ok {
		t.Error("l of a model not in the registry")
	}
	two, err := profile.Parse("two.yaml", []byte(`workers:
  - {type: A, price: 1, gpu: X}
  - {type: B, price: 1, gpu: X}
profiles:
  - {target: tiny, worker: A, points: [{batch: 1, latency: 5ms}]}
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		worker, says string
	}{
		{"", "two.yaml has worker types A, B: choose one with --worker-type"},
		{"C", "--worker-type C is not in two.yaml (it has: A, B)"},
		{"B", "model tiny has no profile on worker type B in two.yaml"},
	} {
		if _, err := profileLatency(two, tc.worker, reg); err == nil || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("worker %q: %v, want %q", tc.worker, err, tc.says)
		}
	}
	if l, err := profileLatency(two, "A", reg); err != nil {
		t.Fatal(err)
	} else if d, ok := l("tiny", 7); !ok || d != 5*time.Millisecond {
		t.Errorf("one point: l(7) = %v, want 5ms", d)
	}
}

// A stop (SIGINT, SIGTERM, --duration) lets a request that is running
// finish, then serveInfer returns.
func TestInferServerGracefulStop(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	reg, err := registry.Load("testdata/onnx/models.yaml")
	if err != nil {
		t.Fatal(err)
	}
	clk := clock.NewFake(time.Unix(0, 0))
	e, err := kserve.NewEmulated(reg, clk, func(string, int) (time.Duration, bool) { return time.Second, true })
	if err != nil {
		t.Fatal(err)
	}
	s, err := kserve.NewServer("mdag", "test", e)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- serveInfer(ctx, s, lis, time.Minute, newLogger(io.Discard, false)) }()
	cc, err := grpc.NewClient(lis.Addr().String(), append(kserve.DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	answered := make(chan error, 1)
	go func() {
		_, err := pb.NewGRPCInferenceServiceClient(cc).ModelInfer(context.Background(), &pb.ModelInferRequest{ModelName: "tiny",
			Inputs:           []*pb.ModelInferRequest_InferInputTensor{{Name: "input", Datatype: "FP32", Shape: []int64{1, 3, 64, 64}}},
			RawInputContents: [][]byte{make([]byte, 3*64*64*4)}})
		answered <- err
	}()
	for limit := time.Now().Add(10 * time.Second); clk.Pending() == 0; runtime.Gosched() {
		if time.Now().After(limit) {
			t.Fatal("the request never reached the backend")
		}
	}
	cancel() // stop while it runs
	select {
	case err := <-served:
		t.Fatalf("serveInfer returned with a request running: %v", err)
	case err := <-answered:
		t.Fatalf("the request ended before its time: %v", err)
	default:
	}
	clk.Advance(time.Second)
	if err := <-answered; err != nil {
		t.Fatalf("the running request: %v", err)
	}
	if err := <-served; err != nil {
		t.Fatal(err)
	}
}

func TestInferServerCommand(t *testing.T) {
	dir := t.TempDir()
	shared := filepath.Join(dir, "shared") // as /tmp
	if err := os.Mkdir(shared, 0o700); err != nil || os.Chmod(shared, 0o777|os.ModeSticky) != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args string
		code int
		says string
	}{
		{"unknown executor", "--executor torch --models testdata/onnx/models.yaml", exitInvalid, `--executor "torch": want onnx or emulated`},
		{"onnx without models", "--executor onnx", exitInvalid, "--executor onnx needs --models models.yaml"},
		{"emulated without profiles", "--executor emulated --models testdata/onnx/models.yaml", exitInvalid, "--executor emulated needs --models models.yaml (the tensors) and --profiles"},
		{"onnx flag with emulated", "--executor emulated --sessions 3 --models testdata/onnx/models.yaml --profiles testdata/onnx/profiles.yaml", exitInvalid, "--sessions needs --executor onnx"},
		{"profiles with onnx", "--models testdata/onnx/models.yaml --profiles testdata/onnx/profiles.yaml", exitInvalid, "--profiles and --worker-type are the emulated executor's"},
		{"missing registry", "--executor emulated --models " + filepath.Join(dir, "none.yaml") + " --profiles testdata/onnx/profiles.yaml", exitInvalid, "none.yaml"},
		{"bad listen", "--executor emulated --models testdata/onnx/models.yaml --profiles testdata/onnx/profiles.yaml --listen 127.0.0.1:99999", exitInvalid, "--listen 127.0.0.1:99999"},
		{"arguments", "--executor emulated extra", exitInvalid, "unexpected arguments: extra"},
		{"not loopback", "--executor emulated --models testdata/onnx/models.yaml --profiles testdata/onnx/profiles.yaml --listen 0.0.0.0:0", exitInvalid, "--listen 0.0.0.0:0 is not a loopback address"},
		{"bad grace", "--grace -1s --executor emulated --models testdata/onnx/models.yaml --profiles testdata/onnx/profiles.yaml", exitInvalid, "--grace -1s"},
		{"no shm regions", "--shm-max-regions 0 --executor emulated --models testdata/onnx/models.yaml --profiles testdata/onnx/profiles.yaml", exitInvalid, "--shm-max-regions 0 and --shm-max-bytes 4294967296: want both > 0"},
		{"no shm bytes", "--shm-max-bytes 0 --executor emulated --models testdata/onnx/models.yaml --profiles testdata/onnx/profiles.yaml", exitInvalid, "--shm-max-bytes 0: want both > 0"},
		{"open unix", "--open --listen unix:" + filepath.Join(dir, "s.sock") + " --executor emulated --models testdata/onnx/models.yaml --profiles testdata/onnx/profiles.yaml", exitInvalid, "--open is for a TCP --listen"},
		{"unix in a shared directory", "--listen unix:" + filepath.Join(shared, "s.sock") + " --executor emulated --models testdata/onnx/models.yaml --profiles testdata/onnx/profiles.yaml", exitInvalid, "is mode 0777: writable by group or others"},
		{"unix relative", "--listen unix:s.sock --executor emulated --models testdata/onnx/models.yaml --profiles testdata/onnx/profiles.yaml", exitInvalid, `socket path "s.sock": want an absolute path`},
		// every problem at once, counted, not the first
		{"every problem", "--executor torch --listen 0.0.0.0:0 --grace -1s --shm-max-bytes 0", exitInvalid,
			"mdag infer-server: --listen 0.0.0.0:0 is not a loopback address: the Open Inference Protocol port has no authentication, so anyone who can reach it could run the models; " +
				"keep it on 127.0.0.1 (the worker's shared memory needs one host anyway), or give --open on a trusted network\n" +
				"mdag infer-server: --executor \"torch\": want onnx or emulated\nmdag infer-server: --grace -1s: want >= 0\n" +
				"mdag infer-server: --shm-max-regions 1024 and --shm-max-bytes 0: want both > 0\n4 problems found\nRun 'mdag infer-server -h' for its flags.\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			code := run(append([]string{"infer-server"}, strings.Fields(tc.args)...), &out, &errb)
			if code != tc.code || !strings.Contains(errb.String(), tc.says) {
				t.Fatalf("exit %d, want %d; stderr does not say %q:\n%s", code, tc.code, tc.says, errb.String())
			}
		})
	}
	t.Run("serves until --duration", func(t *testing.T) {
		var out, errb bytes.Buffer
		code := run(strings.Fields("infer-server --executor emulated --models testdata/onnx/models.yaml --profiles testdata/onnx/profiles.yaml --listen 127.0.0.1:0 --duration 200ms"), &out, &errb)
		if code != exitOK {
			t.Fatalf("exit %d: %s", code, errb.String())
		}
		for _, want := range []string{"serving the Open Inference Protocol", "grpc=127.0.0.1:", "name=tiny platform=mdag_emulated", `inputs="input FP32[-1 3 64 64]"`} {
			if !strings.Contains(errb.String(), want) {
				t.Errorf("the log lacks %q:\n%s", want, errb.String())
			}
		}
		if !strings.Contains(out.String(), "stopped") {
			t.Errorf("stdout %q", out.String())
		}
	})
	t.Run("serves on a unix socket", func(t *testing.T) {
		var out, errb bytes.Buffer
		sock := filepath.Join(dir, "run", "infer.sock")
		code := run(strings.Fields("infer-server --executor emulated --models testdata/onnx/models.yaml --profiles testdata/onnx/profiles.yaml --shm-max-regions 3 --shm-max-bytes 4096 --duration 200ms --listen unix:"+sock), &out, &errb)
		if code != exitOK {
			t.Fatalf("exit %d: %s", code, errb.String())
		}
		for _, want := range []string{"grpc=unix:" + sock, "shm_max_regions=3 shm_max_bytes=4096"} {
			if !strings.Contains(errb.String(), want) {
				t.Errorf("the log lacks %q:\n%s", want, errb.String())
			}
		}
		if !strings.Contains(out.String(), "infer-server on unix:"+sock+" stopped") {
			t.Errorf("stdout %q", out.String())
		}
		if _, err := os.Lstat(sock); !os.IsNotExist(err) {
			t.Errorf("the socket is left after the stop: %v", err)
		}
	})
}

// newEmulated builds the emulated infer server of testdata/onnx.
func newEmulated(t *testing.T) *kserve.Server {
	t.Helper()
	is, err := newInferServer("emulated", inferFlags(t, "--models", "testdata/onnx/models.yaml"), "testdata/onnx/profiles.yaml", "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(is.close)
	return is.srv
}

// --listen unix:/PATH (unixsock.Listen: internal/unixsock tests the
// socket's modes, the peer checks and what is at the path): the server
// answers over it to a client that checks who serves it (unixsock.Dial, as
// the kserve executor dials a unix: endpoint), and the socket goes with
// the server.
func TestInferServerUnixSocket(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	path := filepath.Join(t.TempDir(), "run", "infer.sock")
	lis, err := unixsock.Listen(path, newLogger(io.Discard, false))
	if err != nil {
		t.Fatal(err)
	}
	if got := grpcAddr(lis); got != "unix:"+path {
		t.Errorf("grpcAddr %q, want unix:%s", got, path)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serveInfer(ctx, newEmulated(t), lis, 5*time.Second, newLogger(io.Discard, false)) }()
	cc, err := grpc.NewClient("unix:"+path, append(kserve.DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithContextDialer(unixsock.Dial))...)
	if err != nil {
		t.Fatal(err)
	}
	live, err := pb.NewGRPCInferenceServiceClient(cc).ServerLive(context.Background(), &pb.ServerLiveRequest{})
	cc.Close()
	if err != nil || !live.Live {
		t.Fatalf("ServerLive over unix:%s: %v, %v", path, live, err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(path); !os.IsNotExist(err) {
		t.Fatalf("the socket is left after the stop: %v", err)
	}
}

// TestInferServerModelFilter (issue 43): --model serves only the named
// registry entries, so an emulated server needs profiles for those alone
// (the README's `mdag profile` then `infer-server --model blazeface`);
// an unknown name is refused with the registry's names. Before, every
// entry needed a profile and there was no way to choose.
func TestInferServerModelFilter(t *testing.T) {
	dir := t.TempDir()
	models := filepath.Join(dir, "models.yaml")
	reg, err := os.ReadFile("testdata/onnx/models.yaml")
	if err != nil {
		t.Fatal(err)
	}
	// a second entry the profiles do not have
	extra := strings.Replace(string(reg), "  tiny:", "  other:\n    format: kserve\n    kserve: {endpoint: \"127.0.0.1:1\", model: other}\n    input: {name: input, dtype: float32, layout: NCHW, width: 64, height: 64}\n    max_batch: 4\n    decoder: {name: classify, top_k: 1}\n  tiny:", 1)
	extra = strings.ReplaceAll(extra, "file: ", "file: "+filepath.Join(mustAbs(t, "testdata/onnx"), ""))
	if err := os.WriteFile(models, []byte(extra), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := newInferServer("emulated", inferFlags(t, "--models", models), "testdata/onnx/profiles.yaml", ""); err == nil || !strings.Contains(err.Error(), "model other has no profile") {
		t.Fatalf("every model without --model: %v; want other's missing profile", err)
	}
	ox := inferFlags(t, "--models", models)
	ox.keep = []string{"tiny"}
	is, err := newInferServer("emulated", ox, "testdata/onnx/profiles.yaml", "")
	if err != nil {
		t.Fatalf("--model tiny: %v", err)
	}
	defer is.close()
	if got := is.srv.Models(); len(got) != 1 || got[0] != "tiny" {
		t.Errorf("served %v, want [tiny]", got)
	}
	ox.keep = []string{"nope"}
	if _, err := newInferServer("emulated", ox, "testdata/onnx/profiles.yaml", ""); err == nil || !strings.Contains(err.Error(), "--model nope: not in") || !strings.Contains(err.Error(), "other, tiny") {
		t.Errorf("--model nope: %v; want refused with the registry's names", err)
	}
}

func mustAbs(t *testing.T, p string) string {
	t.Helper()
	a, err := filepath.Abs(p)
	if err != nil {
		t.Fatal(err)
	}
	return a + string(filepath.Separator)
}
