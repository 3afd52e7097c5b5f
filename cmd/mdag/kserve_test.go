package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/mdag/mdag/api/kserve"
)

// The kserve executor from the CLI (both builds): serve with GPU modules
// on an Open Inference Protocol server (a small fake here: the real one,
// mdag infer-server, is tested in gpu/kserve), a dead endpoint, a worker
// whose server is down, and the refusals.

// classifyServer answers every ModelInfer of model tiny with 10 class
// scores an item, raw bytes; it offers no shared memory (the executor's
// auto falls back to raw bytes).
type classifyServer struct {
	pb.UnimplementedGRPCInferenceServiceServer
	infers atomic.Int64
}

func (s *classifyServer) ServerLive(context.Context, *pb.ServerLiveRequest) (*pb.ServerLiveResponse, error) {
	return &pb.ServerLiveResponse{Live: true}, nil
}

func (s *classifyServer) ServerReady(context.Context, *pb.ServerReadyRequest) (*pb.ServerReadyResponse, error) {
	return &pb.ServerReadyResponse{Ready: true}, nil
}

func (s *classifyServer) ModelReady(_ context.Context, r *pb.ModelReadyRequest) (*pb.ModelReadyResponse, error) {
	return &pb.ModelReadyResponse{Ready: r.Name == "tiny"}, nil
}

func (s *classifyServer) ServerMetadata(context.Context, *pb.ServerMetadataRequest) (*pb.ServerMetadataResponse, error) {
	return &pb.ServerMetadataResponse{Name: "classify-fake"}, nil
}

func (s *classifyServer) ModelInfer(_ context.Context, r *pb.ModelInferRequest) (*pb.ModelInferResponse, error) {
	s.infers.Add(1)
	if r.ModelName != "tiny" {
		return nil, status.Errorf(codes.NotFound, "model %s unknown", r.ModelName)
	}
	if len(r.Inputs) != 1 || len(r.Inputs[0].Shape) != 4 || len(r.RawInputContents) != 1 {
		return nil, status.Error(codes.InvalidArgument, "want one input of rank 4, raw bytes")
	}
	b := r.Inputs[0].Shape[0]
	if int64(len(r.RawInputContents[0])) != b*3*64*64*4 {
		return nil, status.Errorf(codes.InvalidArgument, "input has %d bytes for a batch of %d", len(r.RawInputContents[0]), b)
	}
	out := make([]byte, b*10*4)
	for i := range b * 10 {
		binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(float32(i%10)/10))
	}
	return &pb.ModelInferResponse{ModelName: "tiny",
		Outputs:           []*pb.ModelInferResponse_InferOutputTensor{{Name: "probs", Datatype: "FP32", Shape: []int64{b, 10}}},
		RawOutputContents: [][]byte{out}}, nil
}

func startClassifyServer(t *testing.T) (*classifyServer, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &classifyServer{}
	g := grpc.NewServer()
	pb.RegisterGRPCInferenceServiceServer(g, s)
	done := make(chan struct{})
	go func() { defer close(done); _ = g.Serve(ln) }()
	t.Cleanup(func() { g.Stop(); <-done })
	return s, ln.Addr().String()
}

// deadEndpoint is a local address nothing listens on.
func deadEndpoint(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// kserveRegistry writes a registry serving model tiny (the app's) at
// endpoint.
func kserveRegistry(t *testing.T, endpoint string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "models.yaml")
	reg := fmt.Sprintf("models:\n  tiny:\n    format: kserve\n    kserve: {endpoint: %q, model: tiny}\n"+
		"    input: {name: input, dtype: float32, layout: NCHW, width: 64, height: 64, scale: 0.00392156862745098}\n"+
		"    max_batch: 8\n    decoder: {name: classify, top_k: 1}\n", endpoint)
	if err := os.WriteFile(p, []byte(reg), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestServeKServe(t *testing.T) {
	if testing.Short() {
		t.Skip("runs 3 s of live streams")
	}
	srv, addr := startClassifyServer(t)
	var out, errb bytes.Buffer
	code := run(strings.Fields("serve -f testdata/onnx/app.yaml -p testdata/onnx/profiles.yaml --executor kserve --models "+kserveRegistry(t, addr)+
		" --synthetic 4 --duration 3s --listen 127.0.0.1:0"), &out, &errb)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	// every batch ran: no frame dropped by the executor, frames finished;
	// how many finish is a speed figure (under -race on 2 loaded cores a
	// loopback gRPC call can outlast the profile and frames are dropped
	// cannot-finish), not asserted here
	s := out.String()
	if strings.Contains(s, "executor=") {
		t.Errorf("frames dropped by the executor:\n%s", s)
	}
	var finished int
	if i := strings.Index(s, "finished "); i < 0 {
		t.Fatalf("no summary:\n%s", s)
	} else if _, err := fmt.Sscanf(s[i:], "finished %d,", &finished); err != nil || finished == 0 {
		t.Errorf("finished %d frames (%v):\n%s", finished, err, s)
	}
	t.Logf("finished %d frames", finished)
	if srv.infers.Load() == 0 {
		t.Error("the server saw no request")
	}
	if want := "GPU modules run on Open Inference Protocol over gRPC, 4 slots per model: tiny -> tiny at " + addr + " (raw bytes (the server does not list the system_shared_memory extension))"; !strings.Contains(errb.String(), want) {
		t.Errorf("the log lacks %q:\n%s", want, errb.String())
	}
}

// A dead endpoint: serve warns at start and every frame of the GPU module
// is dropped by the executor (the error as detail).
func TestServeKServeDown(t *testing.T) {
	if testing.Short() {
		t.Skip("runs 2 s of live streams")
	}
	dead := deadEndpoint(t)
	var out, errb bytes.Buffer
	code := run(strings.Fields("serve -f testdata/onnx/app.yaml -p testdata/onnx/profiles.yaml --executor kserve --models "+kserveRegistry(t, dead)+
		" --synthetic 2 --duration 2s --listen 127.0.0.1:0 -v"), &out, &errb)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if s := out.String(); !strings.Contains(s, "finished 0,") || !strings.Contains(s, "classify: executor=") {
		t.Errorf("want every frame dropped by the executor:\n%s", s)
	}
	for _, want := range []string{"mdag serve: warning: kserve: endpoint " + dead + ": cannot reach the server", "kserve: model tiny at " + dead + ": cannot reach the server"} {
		if !strings.Contains(errb.String(), want) {
			t.Errorf("stderr lacks %q:\n%.3000s", want, errb.String())
		}
	}
}

// A worker whose server is down does not register: it says why and
// retries until its --duration ends.
func TestWorkerKServeNotServing(t *testing.T) {
	dead := deadEndpoint(t)
	var out, errb bytes.Buffer
	code := run(strings.Fields("worker --type ORT --coordinator "+deadEndpoint(t)+" --executor kserve --models "+kserveRegistry(t, dead)+" --duration 1s"), &out, &errb)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	for _, want := range []string{"kserve executor: not serving yet", "executor not serving; retrying",
		"not registering: executor kserve unhealthy: kserve: endpoint " + dead + ": cannot reach the server"} {
		if !strings.Contains(errb.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, errb.String())
		}
	}
}

func TestKServeRefusals(t *testing.T) {
	reg := kserveRegistry(t, "127.0.0.1:1")
	other := filepath.Join(t.TempDir(), "models.yaml")
	b, err := os.ReadFile(reg)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(other, bytes.Replace(b, []byte("  tiny:"), []byte("  small:"), 1), 0o644); err != nil {
		t.Fatal(err)
	}
	httpReg := filepath.Join(t.TempDir(), "models.yaml")
	if err := os.WriteFile(httpReg, bytes.Replace(b, []byte(`"127.0.0.1:1"`), []byte(`"http://127.0.0.1:8000"`), 1), 0o644); err != nil {
		t.Fatal(err)
	}
	app := "-f testdata/onnx/app.yaml -p testdata/onnx/profiles.yaml"
	for _, tc := range []struct{ name, args, want string }{
		{"serve model not in registry", "serve " + app + " --executor kserve --models " + other,
			`testdata/onnx/app.yaml:9: modules[0].model: "tiny" is not in the model registry ` + other + " (it has: small)"},
		{"worker needs models", "worker --type ORT --executor kserve", "--executor kserve needs --models models.yaml"},
		{"slots without kserve", "worker --type ORT --slots 2", "--slots need --executor kserve"},
		{"shared memory with onnx", "serve " + app + " --executor onnx --models " + reg + " --shared-memory on", "--shared-memory need --executor kserve"},
		{"onnx flag with kserve", "worker --type ORT --executor kserve --models " + reg + " --sessions 3", "--sessions need --executor onnx"},
		{"shared memory mode", "worker --type ORT --executor kserve --models " + reg + " --shared-memory always", `kserve: shared memory "always": want auto, on or off`},
		{"http endpoint", "worker --type ORT --executor kserve --models " + httpReg, "model tiny: endpoint http://127.0.0.1:8000: the kserve executor speaks the protocol's gRPC binding"},
		{"opencv model flag", "worker --type ORT --executor kserve --models " + reg + " --model a=classify:x.onnx", "--model is the opencv executor's"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			code := run(strings.Fields(tc.args), &out, &errb)
			if code != exitInvalid || !strings.Contains(errb.String(), tc.want) {
				t.Fatalf("exit %d, stderr:\n%s\nwant exit %d and %q", code, errb.String(), exitInvalid, tc.want)
			}
		})
	}
	var out, errb bytes.Buffer
	if code := run(strings.Fields("validate -f testdata/onnx/app.yaml --models "+reg), &out, &errb); code != exitOK {
		t.Fatalf("validate with a kserve registry: exit %d: %s", code, errb.String())
	}
}
