package kserve

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "github.com/mdag/mdag/api/kserve"
	"github.com/mdag/mdag/gpu/prep"
	"github.com/mdag/mdag/gpu/registry"
	"github.com/mdag/mdag/media"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeModel is a model of the fake server: the input it takes and a
// deterministic answer. Each item's class is round(first input value *
// mul) mod 10, scored 0.9 (the rest 0.01), so a uniform frame of red r
// classifies as r mod 10 when preprocessing is right.
type fakeModel struct {
	dtype string  // the input's protocol datatype
	shape []int64 // the input's shape, -1 the batch
	mul   float64
	out   string // the output's datatype: FP32 or FP16
	block bool   // answer only when the call's context ends
	fault string // missing (output named other), size (4 bytes short), batch (shape [b*10]), unavailable (the server answers Unavailable)
}

// fakeServer is a small Open Inference Protocol server over gRPC, in this
// test only (the real one is gpu/kserve's Server): raw bytes and the
// system shared memory extension, metadata and health.
type fakeServer struct {
	pb.UnimplementedGRPCInferenceServiceServer
	models      map[string]fakeModel
	shm         bool // lists system_shared_memory
	live, ready atomic.Bool
	infers      atomic.Int64
	shmInfers   atomic.Int64 // requests whose input came by shared memory
	noRecord    bool         // benchmarks: keep no copy of the input

	mu      sync.Mutex
	regions map[string]*Region
	last    []byte // the last request's input bytes
}

var fakeModels = map[string]fakeModel{
	"cls":     {dtype: "FP32", shape: []int64{-1, 3, 8, 8}, mul: 255, out: "FP32"},
	"u8":      {dtype: "UINT8", shape: []int64{-1, 8, 8, 3}, mul: 1, out: "FP32"},
	"half":    {dtype: "FP16", shape: []int64{-1, 3, 8, 8}, mul: 255, out: "FP16"},
	"block":   {dtype: "FP32", shape: []int64{-1, 3, 8, 8}, mul: 255, out: "FP32", block: true},
	"missing": {dtype: "FP32", shape: []int64{-1, 3, 8, 8}, mul: 255, out: "FP32", fault: "missing"},
	"size":    {dtype: "FP32", shape: []int64{-1, 3, 8, 8}, mul: 255, out: "FP32", fault: "size"},
	"batch":   {dtype: "FP32", shape: []int64{-1, 3, 8, 8}, mul: 255, out: "FP32", fault: "batch"},
	"unavail": {dtype: "FP32", shape: []int64{-1, 3, 8, 8}, mul: 255, out: "FP32", fault: "unavailable"},
}

// startFake serves a fake on 127.0.0.1:0 until the test ends.
func startFake(t testing.TB, shm bool) (*fakeServer, string) {
	t.Helper()
	f := &fakeServer{models: fakeModels, shm: shm, regions: map[string]*Region{}}
	f.live.Store(true)
	f.ready.Store(true)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(ServerOptions()...)
	pb.RegisterGRPCInferenceServiceServer(g, f)
	done := make(chan struct{})
	go func() { defer close(done); _ = g.Serve(ln) }()
	t.Cleanup(func() {
		g.Stop()
		<-done
		f.mu.Lock()
		defer f.mu.Unlock()
		for _, r := range f.regions {
			r.Close()
		}
	})
	return f, ln.Addr().String()
}

func (f *fakeServer) ServerLive(context.Context, *pb.ServerLiveRequest) (*pb.ServerLiveResponse, error) {
	return &pb.ServerLiveResponse{Live: f.live.Load()}, nil
}

func (f *fakeServer) ServerReady(context.Context, *pb.ServerReadyRequest) (*pb.ServerReadyResponse, error) {
	return &pb.ServerReadyResponse{Ready: f.ready.Load()}, nil
}

func (f *fakeServer) ModelReady(_ context.Context, r *pb.ModelReadyRequest) (*pb.ModelReadyResponse, error) {
	_, ok := f.models[r.Name]
	return &pb.ModelReadyResponse{Ready: ok}, nil
}

func (f *fakeServer) ServerMetadata(context.Context, *pb.ServerMetadataRequest) (*pb.ServerMetadataResponse, error) {
	md := &pb.ServerMetadataResponse{Name: "fake", Version: "0"}
	if f.shm {
		md.Extensions = []string{"system_shared_memory"}
	}
	return md, nil
}

func (f *fakeServer) ModelMetadata(_ context.Context, r *pb.ModelMetadataRequest) (*pb.ModelMetadataResponse, error) {
	m, ok := f.models[r.Name]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "model %s unknown", r.Name)
	}
	return &pb.ModelMetadataResponse{Name: r.Name,
		Inputs:  []*pb.ModelMetadataResponse_TensorMetadata{{Name: "input", Datatype: m.dtype, Shape: m.shape}},
		Outputs: []*pb.ModelMetadataResponse_TensorMetadata{{Name: "probs", Datatype: m.out, Shape: []int64{-1, 10}}}}, nil
}

func (f *fakeServer) SystemSharedMemoryRegister(_ context.Context, r *pb.SystemSharedMemoryRegisterRequest) (*pb.SystemSharedMemoryRegisterResponse, error) {
	reg, err := OpenRegion(r.Key, r.Offset, r.ByteSize)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.regions[r.Name]; ok {
		reg.Close()
		return nil, status.Errorf(codes.AlreadyExists, "region %s registered already", r.Name)
	}
	f.regions[r.Name] = reg
	return &pb.SystemSharedMemoryRegisterResponse{}, nil
}

func (f *fakeServer) SystemSharedMemoryUnregister(_ context.Context, r *pb.SystemSharedMemoryUnregisterRequest) (*pb.SystemSharedMemoryUnregisterResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for n, reg := range f.regions {
		if r.Name == "" || r.Name == n {
			reg.Close()
			delete(f.regions, n)
		}
	}
	return &pb.SystemSharedMemoryUnregisterResponse{}, nil
}

func (f *fakeServer) registered() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for n := range f.regions {
		out = append(out, n)
	}
	return out
}

// window is a tensor's bytes in a registered region, from its parameters.
func (f *fakeServer) window(p map[string]*pb.InferParameter) ([]byte, bool, error) {
	rp, ok := p[ParamRegion]
	if !ok {
		return nil, false, nil
	}
	f.mu.Lock()
	reg := f.regions[rp.GetStringParam()]
	f.mu.Unlock()
	off, size := p[ParamOffset].GetInt64Param(), p[ParamByteSize].GetInt64Param()
	if reg == nil || off < 0 || size < 0 || off+size > int64(len(reg.Data)) {
		return nil, true, status.Errorf(codes.InvalidArgument, "region %q [%d, +%d) not registered or too small", rp.GetStringParam(), off, size)
	}
	return reg.Data[off : off+size], true, nil
}

func (f *fakeServer) ModelInfer(ctx context.Context, r *pb.ModelInferRequest) (*pb.ModelInferResponse, error) {
	f.infers.Add(1)
	m, ok := f.models[r.ModelName]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "model %s unknown", r.ModelName)
	}
	if m.fault == "unavailable" {
		return nil, status.Errorf(codes.Unavailable, "model %s is unloading", r.ModelName)
	}
	if m.block {
		<-ctx.Done()
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	if len(r.Inputs) != 1 {
		return nil, status.Errorf(codes.InvalidArgument, "want 1 input, have %d", len(r.Inputs))
	}
	in := r.Inputs[0]
	bad := in.Name != "input" || in.Datatype != m.dtype || len(in.Shape) != len(m.shape)
	for i := 1; !bad && i < len(m.shape); i++ {
		bad = in.Shape[i] != m.shape[i]
	}
	if bad {
		return nil, status.Errorf(codes.InvalidArgument, "input '%s' %s%v: expected 'input' %s%v", in.Name, in.Datatype, in.Shape, m.dtype, m.shape)
	}
	b := int(in.Shape[0])
	data, viaShm, err := f.window(in.Parameters)
	if err != nil {
		return nil, err
	}
	if viaShm {
		f.shmInfers.Add(1)
	} else if len(r.RawInputContents) == 1 {
		data = r.RawInputContents[0]
	}
	dt, _ := RegistryDType(m.dtype)
	per := prep.DTypeSize(dt)
	for _, d := range m.shape[1:] {
		per *= int(d)
	}
	if len(data) != b*per {
		return nil, status.Errorf(codes.InvalidArgument, "input has %d bytes, want %d", len(data), b*per)
	}
	if !f.noRecord {
		f.mu.Lock()
		f.last = slices.Clone(data)
		f.mu.Unlock()
	}
	odt, _ := RegistryDType(m.out)
	osz := prep.DTypeSize(odt)
	out := make([]byte, b*10*osz)
	for i := range b {
		v, _ := prep.Floats(dt, data[i*per:i*per+prep.DTypeSize(dt)])
		c := int(math.Round(float64(v[0])*m.mul)) % 10
		for k := range 10 {
			s := float32(0.01)
			if k == c {
				s = 0.9
			}
			j := (i*10 + k) * osz
			if osz == 2 {
				binary.LittleEndian.PutUint16(out[j:], prep.ToHalf(float64(s)))
			} else {
				binary.LittleEndian.PutUint32(out[j:], math.Float32bits(s))
			}
		}
	}
	o := &pb.ModelInferResponse_InferOutputTensor{Name: "probs", Datatype: m.out, Shape: []int64{int64(b), 10}}
	switch m.fault {
	case "missing":
		o.Name = "other"
	case "size":
		out = out[:len(out)-4]
	case "batch":
		o.Shape = []int64{int64(b) * 10}
	}
	resp := &pb.ModelInferResponse{ModelName: r.ModelName, Outputs: []*pb.ModelInferResponse_InferOutputTensor{o}}
	for _, ro := range r.Outputs {
		if ro.Name != "probs" {
			continue
		}
		w, ok, err := f.window(ro.Parameters)
		if err != nil {
			return nil, err
		}
		if ok {
			if len(w) < len(out) {
				return nil, status.Errorf(codes.InvalidArgument, "output region of %d bytes, need %d", len(w), len(out))
			}
			copy(w, out)
			return resp, nil
		}
	}
	resp.RawOutputContents = [][]byte{out}
	return resp, nil
}

// entry is a registry entry for the fake's models.
func entry(name, server, endpoint, input, extra string) string {
	return fmt.Sprintf(`
  %s:
    format: kserve
    kserve: {endpoint: %q, model: %s%s}
    input: {name: input, %s, width: 8, height: 8}
    max_batch: 4
    decoder: {name: classify}
`, name, endpoint, server, extra, input)
}

const (
	inF32 = "dtype: float32, layout: NCHW, scale: 0.00392156862745098"
	u8    = "dtype: uint8, layout: NHWC"
	f16   = "dtype: float16, layout: NCHW, scale: 0.00392156862745098"
)

func writeRegistry(t testing.TB, entries ...string) *registry.Registry {
	t.Helper()
	p := filepath.Join(t.TempDir(), "models.yaml")
	if err := os.WriteFile(p, []byte("models:"+strings.Join(entries, "")), 0o644); err != nil {
		t.Fatal(err)
	}
	r, err := registry.Load(p)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func newExec(t testing.TB, cfg Config, entries ...string) *Executor {
	t.Helper()
	x, err := New(writeRegistry(t, entries...), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(x.Close)
	return x
}

// frame is a 16x12 frame of one colour, red r (frames are BGR).
func frame(r byte) *media.Frame {
	f := media.NewFrame(16, 12)
	for i := 0; i < len(f.Pix); i += 3 {
		f.Pix[i], f.Pix[i+1], f.Pix[i+2] = 200, 100, r
	}
	return f
}

func items(reds ...byte) []*media.Item {
	out := make([]*media.Item, len(reds))
	for i, r := range reds {
		out[i] = &media.Item{Frame: frame(r)}
	}
	return out
}

// Every dtype and layout, every batch size, raw bytes and shared memory:
// the server receives exactly prep.Pack's bytes, each item comes back with
// its own class (the batch split in order), and the item carries its frame.
func TestRun(t *testing.T) {
	for _, shm := range []string{"off", "on"} {
		f, addr := startFake(t, true)
		x := newExec(t, Config{SharedMemory: shm},
			entry("cls", "cls", addr, inF32, ""), entry("u8", "u8", addr, u8, ""), entry("half", "half", addr, f16, ""))
		for _, name := range []string{"cls", "u8", "half"} {
			for _, reds := range [][]byte{{13}, {21, 32, 47}, {250, 3, 88, 119}} {
				t.Run(fmt.Sprintf("%s/%s/b%d", shm, name, len(reds)), func(t *testing.T) {
					before := f.shmInfers.Load()
					its := items(reds...)
					out, err := x.Run(context.Background(), name, its)
					if err != nil {
						t.Fatal(err)
					}
					if len(out) != len(reds) {
						t.Fatalf("%d outputs for %d items", len(out), len(reds))
					}
					for i, r := range reds {
						want := fmt.Sprintf("class%d", r%10)
						if len(out[i]) != 1 || len(out[i][0].Labels) != 1 || out[i][0].Labels[0] != want || out[i][0].Frame != its[i].Frame {
							t.Errorf("item %d (red %d): %+v, want label %s and its frame", i, r, out[i][0], want)
						}
					}
					frames := make([]*media.Frame, len(its))
					for i, it := range its {
						frames[i] = it.Frame
					}
					m := x.models[name].m
					want, err := prep.Pack(make([]byte, prep.ItemBytes(&m.Input)*len(frames)), &m.Input, frames, nil)
					if err != nil {
						t.Fatal(err)
					}
					f.mu.Lock()
					got := f.last
					f.mu.Unlock()
					if !bytes.Equal(got, want) {
						t.Errorf("the server received %d bytes unlike prep.Pack's %d", len(got), len(want))
					}
					if used := f.shmInfers.Load() > before; used != (shm == "on") {
						t.Errorf("shared memory %s: the request used it: %v", shm, used)
					}
				})
			}
		}
		if shm == "on" && !strings.Contains(x.Describe(), "cls -> cls at "+addr+" (shared memory)") {
			t.Errorf("Describe: %s", x.Describe())
		}
	}
}

// Phases times each successful batch's parts: every part is counted per
// batch, the call is never free, and the copy into shared memory takes
// time only when the request uses it. A model not loaded has none.
func TestPhases(t *testing.T) {
	for _, shm := range []string{"off", "on"} {
		t.Run(shm, func(t *testing.T) {
			_, addr := startFake(t, true)
			x := newExec(t, Config{SharedMemory: shm}, entry("u8", "u8", addr, u8, ""))
			for range 3 {
				if _, err := x.Run(context.Background(), "u8", items(1, 2, 3)); err != nil {
					t.Fatal(err)
				}
			}
			ph := x.Phases("u8")
			var names []string
			for _, p := range ph {
				names = append(names, p.Name)
				if p.Batches != 3 {
					t.Errorf("%s: %d batches, want 3", p.Name, p.Batches)
				}
			}
			if want := []string{"pack", "shm-write", "call", "split"}; !slices.Equal(names, want) {
				t.Fatalf("phases %v, want %v", names, want)
			}
			if ph[2].Total <= 0 {
				t.Errorf("the call took %v", ph[2].Total)
			}
			if wrote := ph[1].Total > 0; wrote != (shm == "on") {
				t.Errorf("shared memory %s: the copy into the region took %v", shm, ph[1].Total)
			}
			if x.Phases("nope") != nil {
				t.Error("a model not loaded has phases")
			}
		})
	}
}

// Shared memory and raw bytes give the same outputs, value for value, and
// the tensor the server reads is what the frames say independently of
// prep: a uniform red r is r/255 in every R value of a float32 input.
func TestSharedMemorySameResults(t *testing.T) {
	_, addr := startFake(t, true)
	on := newExec(t, Config{SharedMemory: "on"}, entry("cls", "cls", addr, inF32, ""))
	off := newExec(t, Config{SharedMemory: "off"}, entry("cls", "cls", addr, inF32, ""))
	frames := []*media.Frame{frame(7), frame(99), frame(255)}
	a, err := on.RunRaw(context.Background(), "cls", frames)
	if err != nil {
		t.Fatal(err)
	}
	b, err := off.RunRaw(context.Background(), "cls", frames)
	if err != nil {
		t.Fatal(err)
	}
	for i := range frames {
		if len(a[i]) != 1 || len(b[i]) != 1 || !slices.Equal(a[i][0].Data, b[i][0].Data) || !slices.Equal(a[i][0].Shape, []int64{10}) {
			t.Errorf("item %d: shared memory %v, raw %v", i, a[i], b[i])
		}
	}
	s := on.models["cls"].all[0] // the first taken, by the one batch
	if s.region == nil {
		t.Fatal("no region on a slot with shared memory on")
	}
	v, _ := prep.Floats("float32", s.region.Data[:4])
	if math.Abs(float64(v[0])-7.0/255) > 1e-6 {
		t.Errorf("the first value of a slot's input is %g, want 7/255", v[0])
	}
}

// What the executor refuses and what the server says, each error naming
// the model and the endpoint.
func TestRunErrors(t *testing.T) {
	for _, shm := range []string{"off", "on"} {
		t.Run("shm "+shm, func(t *testing.T) { testRunErrors(t, shm) })
	}
}

func testRunErrors(t *testing.T, shm string) {
	_, addr := startFake(t, true)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := ln.Addr().String()
	ln.Close()
	x := newExec(t, Config{SharedMemory: shm},
		entry("cls", "cls", addr, inF32, ""),
		entry("resnet50", "block", addr, inF32, ""),
		entry("nope", "nope", addr, inF32, ""),
		entry("wide", "cls", addr, strings.Replace(inF32, "layout: NCHW", "layout: NHWC", 1), ""),
		strings.Replace(entry("missing", "missing", addr, inF32, ""), "max_batch:", "outputs: [probs]\n    max_batch:", 1),
		entry("size", "size", addr, inF32, ""),
		entry("batch", "batch", addr, inF32, ""),
		entry("down", "cls", down, inF32, ", shared_memory: \"off\""),
		entry("unavail", "unavail", addr, inF32, ""),
	)
	bad := &media.Item{Frame: &media.Frame{W: 4, H: 4, Pix: make([]byte, 5)}}
	late := items(1, 2) // deadlines set when its case runs
	for _, tc := range []struct {
		name, model string
		items       []*media.Item
		timeout     time.Duration
		want        []string
	}{
		{"max batch", "cls", items(1, 2, 3, 4, 5), 0, []string{"kserve: model cls at " + addr + ": batch of 5 exceeds its max_batch 4"}},
		{"no frame", "cls", []*media.Item{{}}, 0, []string{"kserve: model cls at " + addr + ": item 0 has no frame"}},
		{"invalid frame", "cls", []*media.Item{bad}, 0, []string{"kserve: model cls at " + addr + ": item 0: "}},
		{"not loaded", "other", items(1), 0, []string{`kserve: model "other" is not loaded here (loaded: `}},
		{"deadline", "resnet50", items(1), 50 * time.Millisecond, []string{"kserve: model resnet50 at " + addr + ": deadline exceeded after "}},
		{"items' deadline", "resnet50", late, 0, []string{"kserve: model resnet50 at " + addr + ": deadline exceeded after "}},
		{"not found", "nope", items(1), 0, []string{"kserve: model nope at " + addr + ": the server does not serve server model nope: model nope unknown"}},
		{"invalid argument", "wide", items(1, 2), 0, []string{"kserve: model wide at " + addr + ": the server refused input 'input' FP32[2 8 8 3]: input 'input' FP32[2 8 8 3]: expected 'input' FP32[-1 3 8 8]"}},
		{"output missing", "missing", items(1), 0, []string{"kserve: model missing at " + addr + ", batch of 1: output 'probs' missing from the response (it has: other)"}},
		{"output size", "size", items(1, 2), 0, []string{"kserve: model size at " + addr + ", batch of 2: output 'probs' FP32[2 10] has 76 bytes, want 80"}},
		{"not batch-led", "batch", items(1, 2), 0, []string{"kserve: model batch at " + addr + ", batch of 2: output 'probs' has shape [20]: its leading dimension is not the batch of 2"}},
		{"down", "down", items(1), 0, []string{"kserve: model down at " + down + ": cannot reach the server: "}},
		{"server unavailable", "unavail", items(1), 0, []string{"kserve: model unavail at " + addr + ": the server answered Unavailable: model unavail is unloading"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name == "output size" && shm == "on" {
				t.Skip("in shared memory the region has the room: the response's shape is the size")
			}
			start := time.Now()
			if tc.name == "items' deadline" {
				late[0].Deadline, late[1].Deadline = start.Add(20*time.Millisecond), start.Add(50*time.Millisecond)
			}
			ctx := context.Background()
			if tc.timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tc.timeout)
				defer cancel()
			}
			out, err := x.Run(ctx, tc.model, tc.items)
			if err == nil {
				t.Fatalf("no error: %v", out)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error\n%v\nlacks\n%s", err, w)
				}
			}
			// the deadline is the gRPC deadline: the call ends with it
			// (the bound is loose for a loaded machine under -race)
			if tc.timeout > 0 && (time.Since(start) < tc.timeout || time.Since(start) > tc.timeout+10*time.Second) {
				t.Errorf("returned after %v with a deadline of %v", time.Since(start), tc.timeout)
			}
			if d, ok := lastDeadline(tc.items); ok && time.Now().Before(d) {
				t.Errorf("returned before the items' last deadline")
			}
		})
	}
}

// Health: live, ready, each model ready; the first failure says where.
// Check adds shared memory: on where the server lacks it fails.
func TestHealth(t *testing.T) {
	f, addr := startFake(t, false)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := ln.Addr().String()
	ln.Close()
	ok := newExec(t, Config{}, entry("cls", "cls", addr, inF32, ""))
	unknown := newExec(t, Config{}, entry("cls", "cls", addr, inF32, ""), entry("gone", "gone", addr, inF32, ""))
	dead := newExec(t, Config{}, entry("cls", "cls", down, inF32, ""))
	shmOn := newExec(t, Config{SharedMemory: "on"}, entry("cls", "cls", addr, inF32, ""))
	_, shmAddr := startFake(t, true)
	noOut := newExec(t, Config{}, strings.Replace(entry("cls", "cls", shmAddr, inF32, ""), "max_batch:", "outputs: [scores]\n    max_batch:", 1))
	ctx := context.Background()
	for _, tc := range []struct {
		name        string
		x           *Executor
		live, ready bool
		check       bool
		want        string // "" = healthy
	}{
		{"healthy", ok, true, true, true, ""},
		{"not live", ok, false, true, false, "kserve: endpoint " + addr + ": the server is not live"},
		// ServerReady is not asked: Triton is not ready while a model
		// is unloaded, which says nothing of this worker's models
		{"server not ready, models ready", ok, true, false, false, ""},
		{"model not ready", unknown, true, true, false, "kserve: model gone at " + addr + ": server model gone is not ready on the server"},
		{"down", dead, true, true, false, "kserve: endpoint " + down + ": cannot reach the server"},
		// permanent misconfigurations fail Health itself (the worker
		// does not register and says why), not only Check at start
		{"shared memory on, not offered", shmOn, true, true, false,
			"kserve: model cls at " + addr + ": shared memory on, but the server does not list the system_shared_memory extension"},
		{"output the server lacks", noOut, true, true, false,
			"kserve: model cls at " + shmAddr + ": the server's server model cls has no output 'scores' (it has: probs)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f.live.Store(tc.live)
			f.ready.Store(tc.ready)
			err := tc.x.Health(ctx)
			if tc.check {
				err = tc.x.Check(ctx)
			}
			switch {
			case tc.want == "" && err != nil:
				t.Fatal(err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want %q", err, tc.want)
			}
		})
	}
	f.live.Store(true)
	f.ready.Store(true)
	// auto falls back to raw bytes where the server lacks the extension
	auto := newExec(t, Config{}, entry("cls", "cls", addr, inF32, ""))
	if err := auto.Check(ctx); err != nil {
		t.Fatal(err)
	}
	if d := auto.Describe(); !strings.Contains(d, "raw bytes (the server does not list the system_shared_memory extension)") {
		t.Errorf("Describe: %s", d)
	}
}

// Shared memory per model: the registry's kserve.shared_memory overrides
// the executor's, each slot registers one region once, Close unregisters
// and removes them; two models on one endpoint share one connection.
func TestSharedMemoryLifecycle(t *testing.T) {
	f, addr := startFake(t, true)
	x, err := New(writeRegistry(t, entry("a", "cls", addr, inF32, ""), entry("b", "cls", addr, inF32, ", shared_memory: \"off\"")), Config{SharedMemory: "on", Slots: 3})
	if err != nil {
		t.Fatal(err)
	}
	if len(x.conns) != 1 {
		t.Errorf("%d connections for one endpoint", len(x.conns))
	}
	ctx := context.Background()
	for range 3 {
		for _, m := range []string{"a", "b"} {
			if _, err := x.Run(ctx, m, items(1, 2)); err != nil {
				t.Fatal(err)
			}
		}
	}
	regs := f.registered()
	if len(regs) != 3 {
		t.Fatalf("%d regions registered (%v), want one per slot of a: 3", len(regs), regs)
	}
	var files []string
	for _, r := range regs {
		if !strings.HasPrefix(r, fmt.Sprintf("mdag-%d-", os.Getpid())) {
			t.Errorf("region %s: want mdag-<pid>-<n>", r)
		}
		files = append(files, filepath.Join(ShmDir, r))
	}
	if f.shmInfers.Load() != 3 || f.infers.Load() != 6 {
		t.Errorf("%d of %d requests by shared memory, want 3 of 6 (b is off)", f.shmInfers.Load(), f.infers.Load())
	}
	x.Close()
	if regs := f.registered(); len(regs) != 0 {
		t.Errorf("after Close the server still has %v", regs)
	}
	for _, p := range files {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("after Close %s: %v", p, err)
		}
	}
	if _, err := x.Run(ctx, "a", items(1)); err == nil || !strings.Contains(err.Error(), "closed") {
		t.Errorf("Run after Close: %v", err)
	}
	// nothing negotiates or makes regions after Close (a Check or batch
	// racing it)
	a := x.models["a"]
	if err := a.prepare(ctx); !errors.Is(err, errClosed) {
		t.Errorf("prepare after Close: %v", err)
	}
	if _, err := a.attach(ctx, a.all[0]); !errors.Is(err, errClosed) {
		t.Errorf("attach after Close: %v", err)
	}
	if ours, _ := filepath.Glob(filepath.Join(ShmDir, fmt.Sprintf("mdag-%d-*", os.Getpid()))); len(ours) != 0 || len(f.registered()) != 0 {
		t.Errorf("after Close: files %v, registered %v", ours, f.registered())
	}
}

// Concurrent batches share the slots (2 here): each gets its own answer.
func TestConcurrentRuns(t *testing.T) {
	for _, shm := range []string{"off", "on"} {
		_, addr := startFake(t, true)
		x := newExec(t, Config{SharedMemory: shm, Slots: 2}, entry("cls", "cls", addr, inF32, ""))
		var wg sync.WaitGroup
		errs := make(chan error, 16)
		for g := range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				reds := []byte{byte(g), byte(g + 1), byte(g + 2)}
				out, err := x.Run(context.Background(), "cls", items(reds...))
				if err != nil {
					errs <- err
					return
				}
				for i, r := range reds {
					if l := out[i][0].Labels; len(l) != 1 || l[0] != fmt.Sprintf("class%d", r%10) {
						errs <- fmt.Errorf("goroutine %d item %d: %v, want class%d", g, i, l, r%10)
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Errorf("shared memory %s: %v", shm, err)
		}
	}
}

func TestNewErrors(t *testing.T) {
	for _, tc := range []struct {
		name    string
		cfg     Config
		entries []string
		want    string
	}{
		{"http", Config{}, []string{entry("m", "m", "http://127.0.0.1:8000", inF32, "")}, "model m: endpoint http://127.0.0.1:8000: the kserve executor speaks the protocol's gRPC binding"},
		{"remote shm on", Config{}, []string{entry("m", "m", "gpu-box:8001", inF32, ", shared_memory: \"on\"")}, "model m: kserve.shared_memory is on, but endpoint gpu-box:8001 is not on this host"},
		{"remote shm on (config)", Config{SharedMemory: "on"}, []string{entry("m", "m", "gpu-box:8001", inF32, "")}, "model m: the executor's shared memory setting (--shared-memory) is on, but endpoint gpu-box:8001"},
		{"mode", Config{SharedMemory: "sometimes"}, []string{entry("m", "m", "127.0.0.1:1", inF32, "")}, `kserve: shared memory "sometimes": want auto, on or off`},
		{"no kserve", Config{}, []string{"\n  o:\n    format: onnx\n    file: x.onnx\n    input: {name: input, dtype: float32, layout: NCHW, width: 8, height: 8}\n    max_batch: 1\n    decoder: {name: classify}\n"}, "has no kserve models"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x, err := New(writeRegistry(t, tc.entries...), tc.cfg)
			if err == nil {
				x.Close()
				t.Fatal("no error")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
		})
	}
	for ep, want := range map[string]bool{"127.0.0.1:8001": true, "localhost:1": true, "[::1]:8001": true, "unix:/tmp/s.sock": true, "gpu-box:8001": false, "10.0.0.1:8001": false} {
		if Local(ep) != want {
			t.Errorf("Local(%s) = %v", ep, !want)
		}
	}
}

// BenchmarkKServeRun is the protocol's cost on this machine: one
// ModelInfer of a batch of 224x224 float32 NCHW frames to the in-test
// fake (which reads the first value of each item and answers 10 scores an
// item), raw bytes against shared memory. Preprocessing (prep.Pack of
// 224x224 frames) is included, as in Run; pack/bN is it alone, so the
// protocol's cost is the difference.
//
// u8shm/bN is the runners/torch wire format (uint8 NHWC, what
// tools/gpu-check serves) over shared memory: prep.FillU8, the copy into
// the region and the call.
func BenchmarkKServeRun(b *testing.B) {
	fakeModels["big"] = fakeModel{dtype: "FP32", shape: []int64{-1, 3, 224, 224}, mul: 255, out: "FP32"}
	fakeModels["bigu8"] = fakeModel{dtype: "UINT8", shape: []int64{-1, 224, 224, 3}, mul: 1, out: "FP32"}
	defer delete(fakeModels, "big")
	defer delete(fakeModels, "bigu8")
	f, addr := startFake(b, true)
	f.noRecord = true
	ent := func(shm string) string {
		if shm == "u8shm" {
			return strings.Replace(entry("big", "bigu8", addr, u8, ", shared_memory: \"on\""), "width: 8, height: 8", "width: 224, height: 224", 1)
		}
		return strings.Replace(entry("big", "big", addr, inF32, ", shared_memory: \""+shm+"\""), "width: 8, height: 8", "width: 224, height: 224", 1)
	}
	for _, shm := range []string{"off", "on", "u8shm"} {
		reg := writeRegistry(b, strings.Replace(ent(shm), "max_batch: 4", "max_batch: 32", 1))
		x, err := New(reg, Config{})
		if err != nil {
			b.Fatal(err)
		}
		for _, n := range []int{1, 8, 32} {
			its := make([]*media.Item, n)
			for i := range its {
				f := media.NewFrame(224, 224)
				f.Pix[2] = byte(i)
				its[i] = &media.Item{Frame: f}
			}
			name := map[string]string{"off": "raw", "on": "shm", "u8shm": "u8shm"}[shm]
			b.Run(fmt.Sprintf("%s/b%d", name, n), func(b *testing.B) {
				per := 4
				if shm == "u8shm" {
					per = 1
				}
				b.SetBytes(int64(n * 3 * 224 * 224 * per))
				for b.Loop() {
					if _, err := x.Run(context.Background(), "big", its); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
		x.Close()
	}
	in := &registry.Input{Name: "input", DType: "float32", Layout: "NCHW", Width: 224, Height: 224, Colour: "rgb", Scale: 1.0 / 255, Mean: []float64{0, 0, 0}, Std: []float64{1, 1, 1}, Resize: "stretch"}
	for _, n := range []int{1, 8, 32} {
		frames := make([]*media.Frame, n)
		for i := range frames {
			frames[i] = media.NewFrame(224, 224)
		}
		buf := make([]byte, prep.ItemBytes(in)*n)
		scratch := make([]float32, 3*224*224)
		b.Run(fmt.Sprintf("pack/b%d", n), func(b *testing.B) {
			b.SetBytes(int64(len(buf)))
			for b.Loop() {
				if _, err := prep.Pack(buf, in, frames, scratch); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// Regions that do not fit in /dev/shm's free space are not made (writing a
// mapping of a full tmpfs faults): auto falls back to raw bytes, on fails.
func TestSharedMemoryTooBig(t *testing.T) {
	_, addr := startFake(t, true)
	huge := func(shm string) string {
		e := entry("cls", "cls", addr, inF32, ", shared_memory: \""+shm+"\"")
		return strings.Replace(strings.Replace(e, "width: 8, height: 8", "width: 8192, height: 8192", 1), "max_batch: 4", "max_batch: 1024", 1)
	}
	auto := newExec(t, Config{}, huge("auto"))
	if err := auto.Check(context.Background()); err != nil {
		t.Fatal(err)
	}
	if d := auto.Describe(); !strings.Contains(d, "raw bytes (4 regions of ") || !strings.Contains(d, "MB free") {
		t.Errorf("Describe: %s", d)
	}
	on := newExec(t, Config{}, huge("on"))
	if err := on.Check(context.Background()); err == nil || !strings.Contains(err.Error(), "shared memory on, but 4 regions of ") {
		t.Errorf("Check with shared memory on: %v", err)
	}
}

// A server's metadata and response are outside input: whatever they say
// (output shapes that overflow, negative, not batch-led, short or missing
// contents, a region offset past the end), layout places outputs without
// a wrapped size and within a message, and split, with those places,
// returns outputs or an error, never panics or reads outside the region,
// and what it returns has one list per item.
func FuzzSplit(f *testing.F) {
	reg := writeRegistry(f, entry("cls", "cls", "127.0.0.1:1", inF32, ""))
	x, err := New(reg, Config{SharedMemory: "off"})
	if err != nil {
		f.Fatal(err)
	}
	defer x.Close()
	m := x.models["cls"]
	region, err := CreateRegion(fmt.Sprintf("/mdag-fuzz-%d", os.Getpid()), 4096)
	if err != nil {
		f.Fatal(err)
	}
	defer region.Close()
	s := &slot{region: region, name: "r"}
	seed := func(r *pb.ModelInferResponse) []byte {
		b, err := proto.Marshal(r)
		if err != nil {
			f.Fatal(err)
		}
		return b
	}
	out := make([]byte, 80)
	f.Add(seed(&pb.ModelInferResponse{Outputs: []*pb.ModelInferResponse_InferOutputTensor{{Name: "probs", Datatype: "FP32", Shape: []int64{2, 10}}}, RawOutputContents: [][]byte{out}}), uint8(2), false, "FP32", int64(10), int64(1))
	f.Add(seed(&pb.ModelInferResponse{Outputs: []*pb.ModelInferResponse_InferOutputTensor{{Name: "probs", Datatype: "FP32", Shape: []int64{2, 10}}}}), uint8(2), true, "FP32", int64(10), int64(1))
	f.Add(seed(&pb.ModelInferResponse{Outputs: []*pb.ModelInferResponse_InferOutputTensor{{Name: "probs", Datatype: "FP32", Shape: []int64{4, 500}}}}), uint8(4), true, "FP32", int64(500), int64(1))
	f.Add(seed(&pb.ModelInferResponse{Outputs: []*pb.ModelInferResponse_InferOutputTensor{{Name: "probs", Datatype: "FP16", Shape: []int64{2, 1 << 40}}}}), uint8(2), true, "FP16", int64(1<<60), int64(16))
	f.Add(seed(&pb.ModelInferResponse{Outputs: []*pb.ModelInferResponse_InferOutputTensor{{Name: "probs", Datatype: "UINT8", Shape: []int64{1, -3}}}}), uint8(1), true, "UINT8", int64(-1), int64(3))
	f.Fuzz(func(t *testing.T, b []byte, n uint8, useShm bool, dtype string, d1, d2 int64) {
		var resp pb.ModelInferResponse
		if proto.Unmarshal(b, &resp) != nil {
			return
		}
		md := &pb.ModelMetadataResponse{Outputs: []*pb.ModelMetadataResponse_TensorMetadata{{Name: "probs", Datatype: dtype, Shape: []int64{-1, d1, d2}}}}
		places, err := m.layout(md)
		if err != nil {
			t.Fatal(err)
		}
		for i, p := range places {
			if p.per < 0 || int64(p.per)*int64(m.m.MaxBatch) > MaxMessageBytes || p.offset%64 != 0 || (i > 0 && p.offset < places[i-1].offset) {
				t.Fatalf("layout of %s[-1 %d %d]: %+v", dtype, d1, d2, places)
			}
		}
		batch := int(n%4) + 1
		outs, err := m.split(&resp, s, batch, useShm, places[:len(places)-1])
		if err == nil && len(outs) != batch {
			t.Fatalf("%d output lists for a batch of %d", len(outs), batch)
		}
	})
}
