package kserve

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"runtime/debug"
	"slices"
	"sort"
	"strings"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/mdag/mdag/api/kserve"
	"github.com/mdag/mdag/gpu/prep"
)

// MaxMessageBytes bounds one gRPC message either way: a batch of 128
// float32 224x224x3 tensors is 77 MB, so the default 4 MiB would refuse
// every real batch. Client and server use the same bound (ServerOptions,
// DialOptions).
const MaxMessageBytes = 512 << 20

// ServerOptions are the grpc.Server options a protocol server needs (the
// message limits).
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.MaxRecvMsgSize(MaxMessageBytes), grpc.MaxSendMsgSize(MaxMessageBytes)}
}

// DialOptions are the dial options a protocol client needs to talk to
// Server (the same message limits).
func DialOptions() []grpc.DialOption {
	return []grpc.DialOption{grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxMessageBytes), grpc.MaxCallSendMsgSize(MaxMessageBytes))}
}

// Tensor is one tensor of a request or a response: raw little-endian
// bytes, row-major, of a registry dtype (float32, float16, uint8).
type Tensor struct {
	Name  string
	DType string // registry dtype
	Shape []int64
	Data  []byte
}

// TensorMeta describes a model's input or output; -1 marks the batch
// dimension (the leading one) and any other variable dimension.
type TensorMeta struct {
	Name  string
	DType string // registry dtype
	Shape []int64
}

// ModelMeta describes a model a Backend serves.
type ModelMeta struct {
	Name     string
	Platform string // onnxruntime_onnx, mdag_emulated, ...
	MaxBatch int    // > 0: the leading dimension of every input and output is the batch, up to MaxBatch
	Inputs   []TensorMeta
	Outputs  []TensorMeta
}

// Backend runs models for Server.
type Backend interface {
	// Models lists the models it serves (loaded or not, for a Loader).
	Models() []ModelMeta
	// Infer runs one request: the inputs as Server checked them against
	// the model's metadata (every input once, in metadata order, one batch
	// size as the leading dimension), every output of the model back. It
	// must return early with ctx's error when ctx ends. The input bytes
	// may live in a shared memory region: they are valid until Infer
	// returns, must not be kept, and must be read on the calling goroutine
	// (a fault there, from an object truncated under the mapping, becomes
	// the request's error; on another goroutine it would end the process).
	Infer(ctx context.Context, model string, in []Tensor) ([]Tensor, error)
}

// Loader is a Backend that loads and unloads models on request (the
// model repository extension). Server never runs Infer on a model between
// Unload and a later successful Load.
type Loader interface {
	Load(ctx context.Context, model string) error
	Unload(ctx context.Context, model string) error
}

// The model states of the repository extension.
const (
	StateReady       = "READY"
	StateUnavailable = "UNAVAILABLE"
	StateLoading     = "LOADING"
	StateUnloading   = "UNLOADING"
)

// ModelVersion is the one version every model has here.
const ModelVersion = "1"

// Server serves the Open Inference Protocol over Backends. Every model is
// ready when the server starts; a Loader backend's models can be unloaded
// and loaded again (RepositoryModelUnload/Load).
type Server struct {
	pb.UnimplementedGRPCInferenceServiceServer

	Name, Version string // ServerMetadata's

	models map[string]*served
	names  []string

	mu      sync.Mutex
	regions map[string]*region
	mapped  uint64    // byte_size of the regions in regions, summed
	limits  ShmLimits // SetShmLimits
	closed  bool
}

// ShmLimits bound what the shared memory extension holds for its callers:
// a SystemSharedMemoryRegister past either is refused (ResourceExhausted)
// before the object is opened. Every region counts from the moment it is
// registered until it is unregistered.
type ShmLimits struct {
	MaxRegions int    // regions registered at once
	MaxBytes   uint64 // their byte_size summed
}

// DefaultShmLimits are NewServer's limits: 1024 regions, 4 GiB (a client
// registers a region or two per concurrency slot).
var DefaultShmLimits = ShmLimits{MaxRegions: 1024, MaxBytes: 4 << 30}

// MaxRegionName is the longest shared memory region name (bytes) the
// server takes: it keeps the names, and a longer one is refused before
// anything is held.
const MaxRegionName = 256

// SetShmLimits replaces the shared memory limits (regions already
// registered stay, but count). Both must be positive.
func (s *Server) SetShmLimits(l ShmLimits) error {
	if l.MaxRegions <= 0 || l.MaxBytes == 0 {
		return fmt.Errorf("shared memory limits: %d regions and %d bytes: want both > 0", l.MaxRegions, l.MaxBytes)
	}
	s.mu.Lock()
	s.limits = l
	s.mu.Unlock()
	return nil
}

// checkRegionName refuses a region name too long to keep (without echoing
// it back).
func checkRegionName(name, what string) error {
	if len(name) > MaxRegionName {
		return status.Errorf(codes.InvalidArgument, "%s: a shared memory region name of %d bytes: at most %d", what, len(name), MaxRegionName)
	}
	return nil
}

type served struct {
	meta    ModelMeta
	backend Backend
	in      map[string]int // input name -> index
	out     map[string]int

	mu       sync.Mutex
	state    string
	reason   string
	inflight sync.WaitGroup // requests running on the backend
}

// region is a registered system shared memory region. A request that
// reads or writes it counts itself in users (taken under Server.mu while
// the region is registered); Unregister removes it from the map, waits for
// the users, then unmaps it.
type region struct {
	users  sync.WaitGroup
	r      *Region // nil while it is being mapped
	key    string
	offset uint64
	size   uint64
}

// NewServer serves every model of the backends; a model name served by two
// backends, a model without inputs or outputs, or a dtype the protocol
// here does not carry is an error.
func NewServer(name, version string, backends ...Backend) (*Server, error) {
	s := &Server{Name: name, Version: version, models: map[string]*served{}, regions: map[string]*region{}, limits: DefaultShmLimits}
	var errs []error
	for _, b := range backends {
		for _, m := range b.Models() {
			if _, dup := s.models[m.Name]; dup {
				errs = append(errs, fmt.Errorf("model %s is served by two backends", m.Name))
				continue
			}
			if err := checkMeta(m); err != nil {
				errs = append(errs, err)
				continue
			}
			sm := &served{meta: m, backend: b, in: map[string]int{}, out: map[string]int{}, state: StateReady}
			for i, t := range m.Inputs {
				sm.in[t.Name] = i
			}
			for i, t := range m.Outputs {
				sm.out[t.Name] = i
			}
			s.models[m.Name] = sm
			s.names = append(s.names, m.Name)
		}
	}
	if len(errs) == 0 && len(s.models) == 0 {
		errs = append(errs, errors.New("no models to serve"))
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	sort.Strings(s.names)
	return s, nil
}

func checkMeta(m ModelMeta) error {
	if m.Name == "" {
		return errors.New("a model without a name")
	}
	if len(m.Inputs) == 0 || len(m.Outputs) == 0 {
		return fmt.Errorf("model %s: %d inputs and %d outputs: want at least one of each", m.Name, len(m.Inputs), len(m.Outputs))
	}
	for _, t := range slices.Concat(m.Inputs, m.Outputs) {
		if _, err := WireDType(t.DType); err != nil {
			return fmt.Errorf("model %s: tensor '%s': %w", m.Name, t.Name, err)
		}
		if m.MaxBatch > 0 && (len(t.Shape) == 0 || t.Shape[0] != -1) {
			return fmt.Errorf("model %s: tensor '%s' shape %v: with max_batch %d its leading dimension must be -1 (the batch)", m.Name, t.Name, t.Shape, m.MaxBatch)
		}
	}
	return nil
}

// Models lists the served models' names.
func (s *Server) Models() []string { return slices.Clone(s.names) }

// Register registers s on g.
func (s *Server) Register(g *grpc.Server) { pb.RegisterGRPCInferenceServiceServer(g, s) }

// Close unregisters (unmaps) every shared memory region, once requests
// using them end; later registrations are refused.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	return s.unregister("")
}

func (s *Server) known() string { return strings.Join(s.names, ", ") }

// model finds a model (and version) or says NotFound with the known ones.
func (s *Server) model(name, version string) (*served, error) {
	m := s.models[name]
	if m == nil {
		return nil, status.Errorf(codes.NotFound, "model %q is not served here (served: %s)", name, s.known())
	}
	if version != "" && version != ModelVersion {
		return nil, status.Errorf(codes.NotFound, "model %s has no version %q (versions: %s)", name, version, ModelVersion)
	}
	return m, nil
}

func (m *served) get() (state, reason string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.state, m.reason
}

// ServerLive implements the protocol: the process answers.
func (s *Server) ServerLive(context.Context, *pb.ServerLiveRequest) (*pb.ServerLiveResponse, error) {
	return &pb.ServerLiveResponse{Live: true}, nil
}

// ServerReady implements the protocol: the server is up and not closing.
// Models are not counted (ModelReady says each): one deliberately
// unloaded (RepositoryModelUnload) does not make the server unready, as
// with Triton's explicit model control, so clients of its other models
// stay healthy.
func (s *Server) ServerReady(context.Context, *pb.ServerReadyRequest) (*pb.ServerReadyResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return &pb.ServerReadyResponse{Ready: !s.closed}, nil
}

// ModelReady implements the protocol.
func (s *Server) ModelReady(_ context.Context, r *pb.ModelReadyRequest) (*pb.ModelReadyResponse, error) {
	m, err := s.model(r.GetName(), r.GetVersion())
	if err != nil {
		return nil, err
	}
	st, _ := m.get()
	return &pb.ModelReadyResponse{Ready: st == StateReady}, nil
}

// ServerMetadata implements the protocol.
func (s *Server) ServerMetadata(context.Context, *pb.ServerMetadataRequest) (*pb.ServerMetadataResponse, error) {
	ext := []string{"system_shared_memory"}
	if s.anyLoader() {
		ext = append([]string{"model_repository"}, ext...)
	}
	return &pb.ServerMetadataResponse{Name: s.Name, Version: s.Version, Extensions: ext}, nil
}

func (s *Server) anyLoader() bool {
	for _, m := range s.models {
		if _, ok := m.backend.(Loader); ok {
			return true
		}
	}
	return false
}

func metaOf(ts []TensorMeta) []*pb.ModelMetadataResponse_TensorMetadata {
	out := make([]*pb.ModelMetadataResponse_TensorMetadata, len(ts))
	for i, t := range ts {
		w, _ := WireDType(t.DType) // checked by NewServer
		out[i] = &pb.ModelMetadataResponse_TensorMetadata{Name: t.Name, Datatype: w, Shape: slices.Clone(t.Shape)}
	}
	return out
}

// ModelMetadata implements the protocol; the batch dimension is -1.
func (s *Server) ModelMetadata(_ context.Context, r *pb.ModelMetadataRequest) (*pb.ModelMetadataResponse, error) {
	m, err := s.model(r.GetName(), r.GetVersion())
	if err != nil {
		return nil, err
	}
	return &pb.ModelMetadataResponse{
		Name: m.meta.Name, Versions: []string{ModelVersion}, Platform: m.meta.Platform,
		Inputs: metaOf(m.meta.Inputs), Outputs: metaOf(m.meta.Outputs),
	}, nil
}

// shmParams reads the shared memory parameters of a tensor: ok false when
// it names no region.
func shmParams(p map[string]*pb.InferParameter, what string) (name string, size, offset uint64, ok bool, err error) {
	rp, has := p[ParamRegion]
	if !has {
		for _, k := range []string{ParamByteSize, ParamOffset} {
			if _, stray := p[k]; stray {
				return "", 0, 0, false, status.Errorf(codes.InvalidArgument, "%s: parameter %s without %s", what, k, ParamRegion)
			}
		}
		return "", 0, 0, false, nil
	}
	sp, isStr := rp.GetParameterChoice().(*pb.InferParameter_StringParam)
	if !isStr || sp.StringParam == "" {
		return "", 0, 0, false, status.Errorf(codes.InvalidArgument, "%s: parameter %s must be a non-empty string", what, ParamRegion)
	}
	if err := checkRegionName(sp.StringParam, what); err != nil {
		return "", 0, 0, false, err
	}
	num := func(k string, required bool) (uint64, error) {
		v, has := p[k]
		if !has {
			if required {
				return 0, status.Errorf(codes.InvalidArgument, "%s: shared memory region %q needs parameter %s", what, sp.StringParam, k)
			}
			return 0, nil
		}
		switch x := v.GetParameterChoice().(type) {
		case *pb.InferParameter_Int64Param:
			if x.Int64Param < 0 {
				return 0, status.Errorf(codes.InvalidArgument, "%s: parameter %s is %d: must be >= 0", what, k, x.Int64Param)
			}
			return uint64(x.Int64Param), nil
		case *pb.InferParameter_Uint64Param:
			return x.Uint64Param, nil
		}
		return 0, status.Errorf(codes.InvalidArgument, "%s: parameter %s must be an integer (int64_param or uint64_param)", what, k)
	}
	if size, err = num(ParamByteSize, true); err != nil {
		return
	}
	if offset, err = num(ParamOffset, false); err != nil {
		return
	}
	return sp.StringParam, size, offset, true, nil
}

// lookup finds a registered region and counts the caller among its users
// (released with users.Done). The range [offset, offset+size) must lie
// inside it.
func (s *Server) lookup(name string, offset, size uint64, what string) (*region, error) {
	s.mu.Lock()
	rg := s.regions[name]
	if rg == nil || rg.r == nil {
		known := s.regionNames()
		s.mu.Unlock()
		return nil, status.Errorf(codes.NotFound, "%s: shared memory region %q is not registered (registered: %s)", what, name, known)
	}
	if offset > rg.size || size > rg.size-offset {
		s.mu.Unlock()
		return nil, status.Errorf(codes.InvalidArgument, "%s: offset %d + byte_size %d is outside shared memory region %q of %d bytes", what, offset, size, name, rg.size)
	}
	rg.users.Add(1)
	s.mu.Unlock()
	return rg, nil
}

// regionNames lists the registered regions for an error (under s.mu):
// the first few of them, sorted, and how many there are.
func (s *Server) regionNames() string {
	if len(s.regions) == 0 {
		return "none"
	}
	var n []string
	for k := range s.regions {
		n = append(n, k)
	}
	sort.Strings(n)
	const show = 16
	if len(n) > show {
		return fmt.Sprintf("%s, ... (%d in all)", strings.Join(n[:show], ", "), len(n))
	}
	return strings.Join(n, ", ")
}

// dims formats a shape as the messages show it: [2 3 224 224].
func dims(s []int64) string { return fmt.Sprint(s) }

// elements is the product of a shape's dimensions, or an error when one
// is negative or the product overflows.
func elements(shape []int64) (int64, bool) {
	n := int64(1)
	for _, d := range shape {
		if d < 0 || (d > 0 && n > math.MaxInt64/d) {
			return 0, false
		}
		n *= d
	}
	return n, true
}

// ModelInfer implements the protocol: inputs from raw_input_contents,
// typed contents or shared memory; outputs as raw_output_contents or into
// shared memory.
func (s *Server) ModelInfer(ctx context.Context, r *pb.ModelInferRequest) (resp *pb.ModelInferResponse, err error) {
	// A region's owner can truncate its object under the mapping: reading
	// or writing past the end is then SIGBUS. This goroutine turns such a
	// fault into a panic, and the panic into the request's error.
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if p := recover(); p != nil {
			f, ok := p.(interface{ Addr() uintptr })
			if !ok {
				panic(p)
			}
			resp, err = nil, status.Errorf(codes.InvalidArgument, "model %s: a shared memory region faulted at %#x: was its object truncated under the mapping? (%v)", r.GetModelName(), f.Addr(), p)
		}
	}()
	m, err := s.model(r.GetModelName(), r.GetModelVersion())
	if err != nil {
		return nil, err
	}
	var held []*region
	defer func() {
		for _, rg := range held {
			rg.users.Done()
		}
	}()
	in, batch, err := s.inputs(m, r, &held)
	if err != nil {
		return nil, err
	}
	outs, err := s.requested(m, r, batch, &held)
	if err != nil {
		return nil, err
	}
	// the model must be ready, and stays loaded while the backend runs
	m.mu.Lock()
	if m.state != StateReady {
		st, why := m.state, m.reason
		m.mu.Unlock()
		if st == StateUnavailable {
			return nil, status.Errorf(codes.FailedPrecondition, "model %s is not loaded%s; RepositoryModelLoad loads it", m.meta.Name, why)
		}
		return nil, status.Errorf(codes.Unavailable, "model %s is %s; try again when ModelReady says ready", m.meta.Name, strings.ToLower(st))
	}
	m.inflight.Add(1)
	m.mu.Unlock()
	if err := ctx.Err(); err != nil {
		m.inflight.Done()
		return nil, status.FromContextError(err).Err()
	}
	res, err := m.backend.Infer(ctx, m.meta.Name, in)
	m.inflight.Done()
	if err != nil {
		if ce := ctx.Err(); ce != nil {
			return nil, status.Errorf(status.FromContextError(ce).Code(), "model %s, batch of %d: %v", m.meta.Name, batch, err)
		}
		return nil, status.Errorf(codes.Internal, "model %s, batch of %d: %v", m.meta.Name, batch, err)
	}
	return s.respond(m, r, batch, res, outs)
}

// inputs checks the request's inputs against the model and reads their
// bytes; regions used are appended to held (still in use).
func (s *Server) inputs(m *served, r *pb.ModelInferRequest, held *[]*region) ([]Tensor, int64, error) {
	name := m.meta.Name
	if len(r.Inputs) != len(m.meta.Inputs) {
		return nil, 0, status.Errorf(codes.InvalidArgument, "model %s takes %d inputs (%s), the request has %d", name, len(m.meta.Inputs), tensorNames(m.meta.Inputs), len(r.Inputs))
	}
	// raw_input_contents go, in order, to the inputs that are neither in
	// shared memory nor in typed contents
	wantRaw := 0
	for _, t := range r.Inputs {
		if _, has := t.GetParameters()[ParamRegion]; !has && t.GetContents() == nil {
			wantRaw++
		}
	}
	if len(r.RawInputContents) > 0 && len(r.RawInputContents) != wantRaw {
		return nil, 0, status.Errorf(codes.InvalidArgument, "model %s: %d raw_input_contents for %d inputs that are not in shared memory or contents: want one each, in order", name, len(r.RawInputContents), wantRaw)
	}
	if len(r.RawInputContents) == 0 && wantRaw > 0 {
		return nil, 0, status.Errorf(codes.InvalidArgument, "model %s: %d inputs carry no data: send raw_input_contents, contents or a shared memory region", name, wantRaw)
	}
	out := make([]Tensor, len(m.meta.Inputs))
	seen := make([]bool, len(m.meta.Inputs))
	batch := int64(-1)
	raw := 0
	for _, t := range r.Inputs {
		idx, ok := m.in[t.Name]
		if !ok {
			return nil, 0, status.Errorf(codes.InvalidArgument, "model %s has no input '%s' (inputs: %s)", name, t.Name, tensorNames(m.meta.Inputs))
		}
		if seen[idx] {
			return nil, 0, status.Errorf(codes.InvalidArgument, "model %s: input '%s' given twice", name, t.Name)
		}
		seen[idx] = true
		want := m.meta.Inputs[idx]
		ww, _ := WireDType(want.DType)
		if t.Datatype != ww {
			return nil, 0, status.Errorf(codes.InvalidArgument, "input '%s' datatype %s: model %s wants %s", t.Name, t.Datatype, name, ww)
		}
		if ok, why := checkShape(t.Shape, want.Shape, m.meta.MaxBatch); !ok {
			return nil, 0, status.Errorf(codes.InvalidArgument, "input '%s' shape %s: model %s wants %s%s", t.Name, dims(t.Shape), name, dims(want.Shape), why)
		}
		if m.meta.MaxBatch > 0 {
			if batch >= 0 && t.Shape[0] != batch {
				return nil, 0, status.Errorf(codes.InvalidArgument, "input '%s' has batch %d, an earlier input %d: model %s wants one batch size", t.Name, t.Shape[0], batch, name)
			}
			batch = t.Shape[0]
			if batch < 1 || batch > int64(m.meta.MaxBatch) {
				return nil, 0, status.Errorf(codes.InvalidArgument, "input '%s' shape %s: batch %d, model %s takes 1..%d (max_batch)", t.Name, dims(t.Shape), batch, name, m.meta.MaxBatch)
			}
		}
		n, _ := elements(t.Shape) // checkShape bounded it
		need := n * int64(prep.DTypeSize(want.DType))
		var data []byte
		rname, size, off, inShm, err := shmParams(t.GetParameters(), fmt.Sprintf("input '%s'", t.Name))
		switch {
		case err != nil:
			return nil, 0, err
		case inShm:
			if t.GetContents() != nil {
				return nil, 0, status.Errorf(codes.InvalidArgument, "input '%s' has contents and a shared memory region: give one", t.Name)
			}
			if size != uint64(need) {
				return nil, 0, status.Errorf(codes.InvalidArgument, "input '%s': %s %d, shape %s * %s needs %d", t.Name, ParamByteSize, size, dims(t.Shape), ww, need)
			}
			rg, err := s.lookup(rname, off, size, fmt.Sprintf("input '%s'", t.Name))
			if err != nil {
				return nil, 0, err
			}
			*held = append(*held, rg)
			data = rg.r.Data[off : off+size]
		case t.GetContents() != nil:
			if data, err = fromContents(t.GetContents(), want.DType, n); err != nil {
				return nil, 0, status.Errorf(codes.InvalidArgument, "input '%s' contents: %v", t.Name, err)
			}
		default:
			data = r.RawInputContents[raw]
			if int64(len(data)) != need {
				return nil, 0, status.Errorf(codes.InvalidArgument, "raw_input_contents[%d] (input '%s') has %d bytes, shape %s * %s needs %d", raw, t.Name, len(data), dims(t.Shape), ww, need)
			}
			raw++
		}
		out[idx] = Tensor{Name: want.Name, DType: want.DType, Shape: slices.Clone(t.Shape), Data: data}
	}
	return out, max(batch, 0), nil
}

// checkShape compares a request's shape with the model's (-1: any size >= 1
// for a variable dimension; the batch is checked by the caller).
func checkShape(got, want []int64, maxBatch int) (ok bool, why string) {
	if len(got) != len(want) {
		return false, fmt.Sprintf(" (rank %d, not %d)", len(got), len(want))
	}
	for i, d := range got {
		if i == 0 && maxBatch > 0 {
			continue
		}
		if d < 0 || (want[i] >= 0 && d != want[i]) {
			return false, ""
		}
	}
	n, ok := elements(got)
	if !ok || n > 1<<40 {
		return false, " (too many elements)"
	}
	return true, ""
}

// fromContents turns typed contents into raw bytes: FP32 from
// fp32_contents, UINT8 from uint_contents (FP16 has no typed field: raw
// only).
func fromContents(c *pb.InferTensorContents, dtype string, n int64) ([]byte, error) {
	switch dtype {
	case "float32":
		if int64(len(c.Fp32Contents)) != n {
			return nil, fmt.Errorf("%d fp32_contents, the shape has %d elements", len(c.Fp32Contents), n)
		}
		b := make([]byte, 4*n)
		for i, v := range c.Fp32Contents {
			u := math.Float32bits(v)
			b[4*i], b[4*i+1], b[4*i+2], b[4*i+3] = byte(u), byte(u>>8), byte(u>>16), byte(u>>24)
		}
		return b, nil
	case "uint8":
		if int64(len(c.UintContents)) != n {
			return nil, fmt.Errorf("%d uint_contents, the shape has %d elements", len(c.UintContents), n)
		}
		b := make([]byte, n)
		for i, v := range c.UintContents {
			if v > 255 {
				return nil, fmt.Errorf("uint_contents[%d] is %d: UINT8 holds 0..255", i, v)
			}
			b[i] = byte(v)
		}
		return b, nil
	}
	return nil, fmt.Errorf("FP16 has no typed contents field: send raw_input_contents (little-endian halves)")
}

// outSpec is one requested output: its index in the model's outputs and
// where it goes.
type outSpec struct {
	idx    int
	region *region // nil: raw_output_contents
	name   string
	offset uint64
	size   uint64
}

// requested reads the requested outputs (none: every output, raw).
func (s *Server) requested(m *served, r *pb.ModelInferRequest, batch int64, held *[]*region) ([]outSpec, error) {
	if len(r.Outputs) == 0 {
		out := make([]outSpec, len(m.meta.Outputs))
		for i := range out {
			out[i].idx = i
		}
		return out, nil
	}
	var out []outSpec
	seen := map[string]bool{}
	for _, o := range r.Outputs {
		idx, ok := m.out[o.Name]
		if !ok {
			return nil, status.Errorf(codes.InvalidArgument, "model %s has no output '%s' (outputs: %s)", m.meta.Name, o.Name, tensorNames(m.meta.Outputs))
		}
		if seen[o.Name] {
			return nil, status.Errorf(codes.InvalidArgument, "model %s: output '%s' requested twice", m.meta.Name, o.Name)
		}
		seen[o.Name] = true
		sp := outSpec{idx: idx}
		what := fmt.Sprintf("output '%s'", o.Name)
		name, size, off, inShm, err := shmParams(o.GetParameters(), what)
		if err != nil {
			return nil, err
		}
		if inShm {
			rg, err := s.lookup(name, off, size, what)
			if err != nil {
				return nil, err
			}
			*held = append(*held, rg)
			sp.region, sp.name, sp.offset, sp.size = rg, name, off, size
		}
		out = append(out, sp)
	}
	return out, nil
}

// respond checks the backend's outputs and builds the response.
func (s *Server) respond(m *served, r *pb.ModelInferRequest, batch int64, res []Tensor, outs []outSpec) (*pb.ModelInferResponse, error) {
	name := m.meta.Name
	byName := map[string]Tensor{}
	for _, t := range res {
		byName[t.Name] = t
	}
	resp := &pb.ModelInferResponse{ModelName: name, ModelVersion: ModelVersion, Id: r.Id}
	for _, o := range outs {
		want := m.meta.Outputs[o.idx]
		t, ok := byName[want.Name]
		if !ok {
			return nil, status.Errorf(codes.Internal, "model %s: the backend returned no output '%s'", name, want.Name)
		}
		n, ok := elements(t.Shape)
		if !ok || n*int64(prep.DTypeSize(t.DType)) != int64(len(t.Data)) || t.DType != want.DType {
			return nil, status.Errorf(codes.Internal, "model %s: the backend's output '%s' is %s%s with %d bytes", name, want.Name, t.DType, dims(t.Shape), len(t.Data))
		}
		if m.meta.MaxBatch > 0 && (len(t.Shape) == 0 || t.Shape[0] != batch) {
			return nil, status.Errorf(codes.Internal, "model %s: the backend's output '%s' has shape %s: its leading dimension is not the batch of %d", name, want.Name, dims(t.Shape), batch)
		}
		w, _ := WireDType(t.DType)
		ot := &pb.ModelInferResponse_InferOutputTensor{Name: t.Name, Datatype: w, Shape: slices.Clone(t.Shape)}
		if o.region != nil {
			if uint64(len(t.Data)) > o.size {
				return nil, status.Errorf(codes.InvalidArgument, "output '%s' is %d bytes (shape %s * %s): shared memory region %q was given %s %d", t.Name, len(t.Data), dims(t.Shape), w, o.name, ParamByteSize, o.size)
			}
			// lookup bounded [offset, offset+size) by the region, and the
			// output fits size: the write stays in the caller's range
			copy(o.region.r.Data[o.offset:o.offset+o.size], t.Data)
			ot.Parameters = map[string]*pb.InferParameter{
				ParamRegion:   {ParameterChoice: &pb.InferParameter_StringParam{StringParam: o.name}},
				ParamByteSize: {ParameterChoice: &pb.InferParameter_Int64Param{Int64Param: int64(len(t.Data))}},
			}
			if o.offset > 0 {
				ot.Parameters[ParamOffset] = &pb.InferParameter{ParameterChoice: &pb.InferParameter_Int64Param{Int64Param: int64(o.offset)}}
			}
		} else {
			resp.RawOutputContents = append(resp.RawOutputContents, t.Data)
		}
		resp.Outputs = append(resp.Outputs, ot)
	}
	return resp, nil
}

func tensorNames(ts []TensorMeta) string {
	n := make([]string, len(ts))
	for i, t := range ts {
		n[i] = fmt.Sprintf("'%s' %s%s", t.Name, t.DType, dims(t.Shape))
	}
	return strings.Join(n, ", ")
}

// RepositoryIndex implements the repository extension: every model with
// its state (ready: only the ready ones).
func (s *Server) RepositoryIndex(_ context.Context, r *pb.RepositoryIndexRequest) (*pb.RepositoryIndexResponse, error) {
	if !s.anyLoader() {
		return nil, s.noRepository()
	}
	resp := &pb.RepositoryIndexResponse{}
	for _, n := range s.names {
		st, why := s.models[n].get()
		if r.Ready && st != StateReady {
			continue
		}
		resp.Models = append(resp.Models, &pb.RepositoryIndexResponse_ModelIndex{Name: n, Version: ModelVersion, State: st, Reason: why})
	}
	return resp, nil
}

func (s *Server) noRepository() error {
	return status.Errorf(codes.Unimplemented, "the model repository extension: these backends load every model at start and cannot unload (served: %s)", s.known())
}

// loader finds a model whose backend is a Loader.
func (s *Server) loader(name string) (*served, Loader, error) {
	if !s.anyLoader() {
		return nil, nil, s.noRepository()
	}
	m, err := s.model(name, "")
	if err != nil {
		return nil, nil, err
	}
	l, ok := m.backend.(Loader)
	if !ok {
		return nil, nil, status.Errorf(codes.Unimplemented, "model %s: its backend loads it at start and cannot unload it", name)
	}
	return m, l, nil
}

// RepositoryModelLoad implements the repository extension: a model not
// loaded is loaded (LOADING meanwhile); a ready one stays as it is.
func (s *Server) RepositoryModelLoad(ctx context.Context, r *pb.RepositoryModelLoadRequest) (*pb.RepositoryModelLoadResponse, error) {
	m, l, err := s.loader(r.GetModelName())
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	switch m.state {
	case StateReady:
		m.mu.Unlock()
		return &pb.RepositoryModelLoadResponse{}, nil
	case StateLoading, StateUnloading:
		st := m.state
		m.mu.Unlock()
		return nil, status.Errorf(codes.Unavailable, "model %s is %s already", m.meta.Name, strings.ToLower(st))
	}
	m.state, m.reason = StateLoading, ""
	m.mu.Unlock()
	err = l.Load(ctx, m.meta.Name)
	m.mu.Lock()
	defer m.mu.Unlock()
	if err != nil {
		m.state, m.reason = StateUnavailable, fmt.Sprintf(" (its last load failed: %v)", err)
		return nil, status.Errorf(codes.Internal, "model %s: load: %v", m.meta.Name, err)
	}
	m.state = StateReady
	return &pb.RepositoryModelLoadResponse{}, nil
}

// RepositoryModelUnload implements the repository extension: new requests
// are refused at once (UNLOADING), the ones running finish, then the
// backend unloads it.
func (s *Server) RepositoryModelUnload(ctx context.Context, r *pb.RepositoryModelUnloadRequest) (*pb.RepositoryModelUnloadResponse, error) {
	m, l, err := s.loader(r.GetModelName())
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	switch m.state {
	case StateUnavailable:
		m.mu.Unlock()
		return &pb.RepositoryModelUnloadResponse{}, nil
	case StateLoading, StateUnloading:
		st := m.state
		m.mu.Unlock()
		return nil, status.Errorf(codes.Unavailable, "model %s is %s already", m.meta.Name, strings.ToLower(st))
	}
	m.state, m.reason = StateUnloading, ""
	m.mu.Unlock()
	m.inflight.Wait()
	err = l.Unload(ctx, m.meta.Name)
	m.mu.Lock()
	defer m.mu.Unlock()
	if err != nil {
		m.state, m.reason = StateReady, ""
		return nil, status.Errorf(codes.Internal, "model %s: unload: %v (it stays loaded)", m.meta.Name, err)
	}
	m.state, m.reason = StateUnavailable, " (unloaded)"
	return &pb.RepositoryModelUnloadResponse{}, nil
}

// SystemSharedMemoryRegister implements the shared memory extension: the
// object key is mapped from offset for byte_size bytes.
func (s *Server) SystemSharedMemoryRegister(_ context.Context, r *pb.SystemSharedMemoryRegisterRequest) (*pb.SystemSharedMemoryRegisterResponse, error) {
	if r.Name == "" {
		return nil, status.Error(codes.InvalidArgument, "shared memory register: the region needs a name")
	}
	if err := checkRegionName(r.Name, "shared memory register"); err != nil {
		return nil, err
	}
	if err := checkKey(r.Key); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "shared memory region %q: %v", r.Name, err)
	}
	if r.ByteSize == 0 {
		return nil, status.Errorf(codes.InvalidArgument, "shared memory region %q: byte_size 0", r.Name)
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, status.Error(codes.Unavailable, "the server is closing")
	}
	if old := s.regions[r.Name]; old != nil {
		s.mu.Unlock()
		return nil, status.Errorf(codes.AlreadyExists, "shared memory region %q is registered already (key %s); unregister it first", r.Name, old.key)
	}
	// the limits hold before anything is opened or kept
	if lim := s.limits; len(s.regions) >= lim.MaxRegions || s.mapped > lim.MaxBytes || r.ByteSize > lim.MaxBytes-s.mapped {
		n, b := len(s.regions), s.mapped
		s.mu.Unlock()
		return nil, status.Errorf(codes.ResourceExhausted, "shared memory region %q of %d bytes: %d regions of %d bytes are registered, and the server holds at most %d regions of %d bytes in all; unregister some first",
			r.Name, r.ByteSize, n, b, lim.MaxRegions, lim.MaxBytes)
	}
	// reserve the name (and its bytes) while mapping (unmapped: lookups
	// see r == nil)
	rg := &region{key: r.Key, offset: r.Offset, size: r.ByteSize}
	s.regions[r.Name] = rg
	s.mapped += rg.size
	s.mu.Unlock()
	mp, err := OpenRegion(r.Key, r.Offset, r.ByteSize)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		if s.regions[r.Name] == rg {
			delete(s.regions, r.Name)
			s.mapped -= rg.size
		}
		code := codes.InvalidArgument
		switch {
		case errors.Is(err, os.ErrNotExist):
			code = codes.NotFound
		case errors.Is(err, ErrNotShm), errors.Is(err, os.ErrPermission):
			code = codes.PermissionDenied
		}
		return nil, status.Errorf(code, "shared memory region %q: %v", r.Name, err)
	}
	if s.regions[r.Name] != rg { // unregistered (Close) while mapping
		mp.Close()
		return nil, status.Errorf(codes.Unavailable, "shared memory region %q was unregistered while it was being mapped", r.Name)
	}
	rg.r = mp
	return &pb.SystemSharedMemoryRegisterResponse{}, nil
}

// SystemSharedMemoryStatus implements the shared memory extension.
func (s *Server) SystemSharedMemoryStatus(_ context.Context, r *pb.SystemSharedMemoryStatusRequest) (*pb.SystemSharedMemoryStatusResponse, error) {
	if err := checkRegionName(r.Name, "shared memory status"); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	resp := &pb.SystemSharedMemoryStatusResponse{Regions: map[string]*pb.SystemSharedMemoryStatusResponse_RegionStatus{}}
	for n, rg := range s.regions {
		if r.Name != "" && n != r.Name {
			continue
		}
		resp.Regions[n] = &pb.SystemSharedMemoryStatusResponse_RegionStatus{Name: n, Key: rg.key, Offset: rg.offset, ByteSize: rg.size}
	}
	if r.Name != "" && len(resp.Regions) == 0 {
		return nil, status.Errorf(codes.NotFound, "shared memory region %q is not registered", r.Name)
	}
	return resp, nil
}

// SystemSharedMemoryUnregister implements the shared memory extension:
// one region, or every one when the name is empty; requests using it
// finish first.
func (s *Server) SystemSharedMemoryUnregister(_ context.Context, r *pb.SystemSharedMemoryUnregisterRequest) (*pb.SystemSharedMemoryUnregisterResponse, error) {
	if err := checkRegionName(r.Name, "shared memory unregister"); err != nil {
		return nil, err
	}
	if r.Name != "" {
		s.mu.Lock()
		_, ok := s.regions[r.Name]
		s.mu.Unlock()
		if !ok {
			return nil, status.Errorf(codes.NotFound, "shared memory region %q is not registered", r.Name)
		}
	}
	if err := s.unregister(r.Name); err != nil {
		return nil, status.Errorf(codes.Internal, "shared memory unregister: %v", err)
	}
	return &pb.SystemSharedMemoryUnregisterResponse{}, nil
}

func (s *Server) unregister(name string) error {
	s.mu.Lock()
	var gone []*region
	for n, rg := range s.regions {
		if name == "" || n == name {
			if rg.r != nil { // one being mapped is left to its Register, which sees it gone
				gone = append(gone, rg)
			}
			delete(s.regions, n)
			s.mapped -= rg.size
		}
	}
	s.mu.Unlock()
	var errs []error
	for _, rg := range gone {
		rg.users.Wait() // requests using it end first
		if err := rg.r.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
