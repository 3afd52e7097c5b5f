package kserve

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	pb "github.com/mdag/mdag/api/kserve"
	"github.com/mdag/mdag/gpu/decode"
	"github.com/mdag/mdag/gpu/prep"
	"github.com/mdag/mdag/gpu/registry"
	"github.com/mdag/mdag/media"
)

// DefaultSlots is Config.Slots' default.
const DefaultSlots = 4

// Config configures the executor.
type Config struct {
	// SharedMemory is auto (default: the system shared memory extension
	// when the endpoint is on this host and the server lists it), on (an
	// error where it cannot be used) or off. A registry entry's
	// kserve.shared_memory overrides it for that model.
	SharedMemory string
	// Slots bounds the requests in flight per model (default 4); a batch
	// beyond waits for a slot until its context ends. Each slot keeps its
	// input buffer (and, with shared memory, its region), so a slot is
	// also the unit of memory. The worker's module Concurrency bounds the
	// batches of one GPU module in flight: Slots at or above it (summed
	// over the modules sharing a model) never makes a batch wait here.
	Slots int
}

// Executor runs registry models (format: kserve) on Open Inference
// Protocol servers over gRPC: one ModelInfer per scheduler batch.
//
// Retries: a ModelInfer that fails Unavailable (connection-level: the
// server went away or the connection broke) is retried once, only when the
// time left before the frame deadline exceeds the time the first attempt
// took; nothing else is retried, so no retry outlives the frames.
type Executor struct {
	cfg    Config
	conns  map[string]*conn // by endpoint
	eps    []string
	models map[string]*model
	names  []string
}

// conn is one endpoint: one grpc.ClientConn every model on it shares.
type conn struct {
	endpoint string // as the registry says
	local    bool   // on this host: shared memory is possible
	cc       *grpc.ClientConn
	c        pb.GRPCInferenceServiceClient

	mu  sync.Mutex
	ext []string // ServerMetadata's extensions, once read
	got bool
}

type model struct {
	m       *registry.Model
	conn    *conn
	shm     string // auto, on, off
	wire    string // the input's protocol datatype
	item    int    // bytes of one item of the input
	decode  decode.Func
	slots   chan *slot
	all     []*slot
	stopped atomic.Bool

	mu     sync.Mutex // guards what prepare sets
	ready  bool
	useShm bool
	why    string     // why shared memory is not used (Describe)
	outs   []outPlace // with shared memory: the outputs and their place
}

// outPlace is an output's place in a slot's region: per item bytes (0:
// its size is not fixed, it comes back as raw bytes).
type outPlace struct {
	name   string
	per    int
	offset int
}

// slot is one request in flight: its input buffer and, with shared
// memory, its region (input at 0, then each output, for max_batch).
type slot struct {
	buf     []byte
	scratch []float32
	region  *Region
	name    string // the region's registered name
}

var regionSeq atomic.Uint64

// New prepares every kserve model of the registry (onnx entries are
// skipped: they run in process) with cfg.Slots slots each and one gRPC
// connection per endpoint. It does not contact the servers (a worker may
// start before its runner): Check, Health and the first batch do.
func New(reg *registry.Registry, cfg Config) (*Executor, error) {
	if cfg.SharedMemory == "" {
		cfg.SharedMemory = "auto"
	}
	if !slices.Contains([]string{"auto", "on", "off"}, cfg.SharedMemory) {
		return nil, fmt.Errorf("kserve: shared memory %q: want auto, on or off", cfg.SharedMemory)
	}
	if cfg.Slots < 0 {
		return nil, fmt.Errorf("kserve: slots %d: must be >= 1 (0: %d)", cfg.Slots, DefaultSlots)
	}
	if cfg.Slots == 0 {
		cfg.Slots = DefaultSlots
	}
	x := &Executor{cfg: cfg, conns: map[string]*conn{}, models: map[string]*model{}}
	var errs []error
	for _, name := range reg.Names() {
		m := reg.Models[name]
		if m.Format != "kserve" {
			continue
		}
		lm, err := x.load(m)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		x.models[name] = lm
		x.names = append(x.names, name)
	}
	if len(errs) == 0 && len(x.models) == 0 {
		errs = append(errs, fmt.Errorf("%s has no kserve models", reg.File))
	}
	if len(errs) > 0 {
		x.Close()
		return nil, errors.Join(errs...)
	}
	slices.Sort(x.eps)
	return x, nil
}

func (x *Executor) load(m *registry.Model) (*model, error) {
	if m.KServe == nil {
		return nil, fmt.Errorf("model %s: no kserve block", m.Name)
	}
	wire, err := WireDType(m.Input.DType)
	if err != nil {
		return nil, fmt.Errorf("model %s: input: %w", m.Name, err)
	}
	dec, ok := decode.Lookup(m.Decoder.Name)
	if !ok {
		return nil, fmt.Errorf("model %s: decoder %q unknown (known: %s)", m.Name, m.Decoder.Name, strings.Join(decode.Names(), ", "))
	}
	c, err := x.dial(m.KServe.Endpoint)
	if err != nil {
		return nil, fmt.Errorf("model %s: %w", m.Name, err)
	}
	lm := &model{m: m, conn: c, shm: x.cfg.SharedMemory, wire: wire, item: prep.ItemBytes(&m.Input), decode: dec,
		slots: make(chan *slot, x.cfg.Slots)}
	if s := m.KServe.SharedMemory; s != "" {
		lm.shm = s
	}
	if !slices.Contains([]string{"auto", "on", "off"}, lm.shm) {
		return nil, fmt.Errorf("model %s: kserve.shared_memory %q: want auto, on or off", m.Name, lm.shm)
	}
	if lm.shm == "on" && !c.local {
		from := "the executor's shared memory setting (--shared-memory)"
		if m.KServe.SharedMemory != "" {
			from = "kserve.shared_memory"
		}
		return nil, fmt.Errorf("model %s: %s is on, but endpoint %s is not on this host (127.0.0.1, localhost, ::1 or unix:)", m.Name, from, c.endpoint)
	}
	for range x.cfg.Slots {
		s := &slot{scratch: make([]float32, m.Input.Width*m.Input.Height*3)}
		lm.all = append(lm.all, s)
		lm.slots <- s
	}
	return lm, nil
}

// dial returns the endpoint's connection, made on first use. The registry
// allows http(s):// endpoints (KServe's REST protocol); this executor
// speaks gRPC only.
func (x *Executor) dial(endpoint string) (*conn, error) {
	if c := x.conns[endpoint]; c != nil {
		return c, nil
	}
	if strings.HasPrefix(endpoint, "http://") || strings.HasPrefix(endpoint, "https://") {
		return nil, fmt.Errorf("endpoint %s: the kserve executor speaks the protocol's gRPC binding; give host:port of the server's gRPC port (Triton: 8001), not its HTTP URL", endpoint)
	}
	cc, err := grpc.NewClient(endpoint, append(DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		return nil, fmt.Errorf("endpoint %s: %w", endpoint, err)
	}
	c := &conn{endpoint: endpoint, local: Local(endpoint), cc: cc, c: pb.NewGRPCInferenceServiceClient(cc)}
	x.conns[endpoint] = c
	x.eps = append(x.eps, endpoint)
	return c, nil
}

// Local reports whether a gRPC endpoint is on this host: a loopback
// address, localhost, or a unix socket.
func Local(endpoint string) bool {
	if strings.HasPrefix(endpoint, "unix:") {
		return true
	}
	host, _, err := net.SplitHostPort(endpoint)
	if err != nil {
		host = endpoint
	}
	return host == "localhost" || host == "127.0.0.1" || host == "::1"
}

// Kind implements gpu.Executor.
func (x *Executor) Kind() string { return "kserve" }

// Models lists the models.
func (x *Executor) Models() []string { return slices.Clone(x.names) }

// Describe says what runs where, for logs: per model its endpoint, the
// server's name and version, and whether tensors go by shared memory.
func (x *Executor) Describe() string {
	parts := make([]string, 0, len(x.names))
	for _, n := range x.names {
		m := x.models[n]
		k := m.m.KServe
		srv := k.Model
		if k.Version != "" {
			srv += " v" + k.Version
		}
		m.mu.Lock()
		shm := "shared memory " + m.shm + ", not yet negotiated"
		switch {
		case m.ready && m.useShm:
			shm = "shared memory"
		case m.ready:
			shm = "raw bytes (" + m.why + ")"
		}
		m.mu.Unlock()
		parts = append(parts, fmt.Sprintf("%s -> %s at %s (%s)", n, srv, m.conn.endpoint, shm))
	}
	return fmt.Sprintf("Open Inference Protocol over gRPC, %d slots per model: %s", x.cfg.Slots, strings.Join(parts, "; "))
}

// Health is what a worker probes: every endpoint live and ready, every
// model ready. The first failure is returned, saying where.
func (x *Executor) Health(ctx context.Context) error {
	for _, ep := range x.eps {
		c := x.conns[ep]
		live, err := c.c.ServerLive(ctx, &pb.ServerLiveRequest{})
		if err != nil {
			return callErr("", c.endpoint, err, 0)
		}
		if !live.Live {
			return fmt.Errorf("kserve: endpoint %s: the server is not live", ep)
		}
		ready, err := c.c.ServerReady(ctx, &pb.ServerReadyRequest{})
		if err != nil {
			return callErr("", c.endpoint, err, 0)
		}
		if !ready.Ready {
			return fmt.Errorf("kserve: endpoint %s: the server is not ready", ep)
		}
	}
	for _, n := range x.names {
		m := x.models[n]
		k := m.m.KServe
		r, err := m.conn.c.ModelReady(ctx, &pb.ModelReadyRequest{Name: k.Model, Version: k.Version})
		if err != nil {
			return callErr(n, m.conn.endpoint, err, 0)
		}
		if !r.Ready {
			return fmt.Errorf("kserve: model %s at %s: %s is not ready on the server", n, m.conn.endpoint, m.serverName())
		}
	}
	return nil
}

// Check is Health, then each model's shared memory negotiated (regions
// created and registered where used): what `mdag worker` runs before it
// serves, so a misconfiguration is said at start.
func (x *Executor) Check(ctx context.Context) error {
	if err := x.Health(ctx); err != nil {
		return err
	}
	for _, n := range x.names {
		if err := x.models[n].prepare(ctx); err != nil {
			return fmt.Errorf("kserve: model %s at %s: %w", n, x.models[n].conn.endpoint, err)
		}
	}
	return nil
}

// Close unregisters and removes every shared memory region and closes the
// connections. Batches must have ended.
func (x *Executor) Close() {
	for _, m := range x.models {
		m.close()
	}
	for _, c := range x.conns {
		_ = c.cc.Close()
	}
}

func (m *model) serverName() string {
	k := m.m.KServe
	if k.Version != "" {
		return fmt.Sprintf("server model %s version %s", k.Model, k.Version)
	}
	return "server model " + k.Model
}

// prepare decides, once it succeeds, how tensors travel: with shared
// memory it reads the server's extensions and the model's outputs, then
// creates and registers one region per slot. An unreachable server is an
// error (tried again next batch); shared memory the server lacks is one
// only for "on" ("auto" falls back to raw bytes, said by Describe).
func (m *model) prepare(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.ready {
		return nil
	}
	if m.shm == "off" {
		m.ready, m.why = true, "shared memory off"
		return nil
	}
	if !m.conn.local {
		m.ready, m.why = true, "endpoint not on this host"
		return nil
	}
	fallback := func(why string) error {
		if m.shm == "on" {
			return fmt.Errorf("shared memory on, but %s", why)
		}
		m.ready, m.why = true, why
		return nil
	}
	ext, err := m.conn.extensions(ctx)
	if err != nil {
		return err
	}
	if !slices.Contains(ext, "system_shared_memory") {
		return fallback("the server does not list the system_shared_memory extension")
	}
	k := m.m.KServe
	md, err := m.conn.c.ModelMetadata(ctx, &pb.ModelMetadataRequest{Name: k.Model, Version: k.Version})
	if err != nil {
		if status.Code(err) == codes.NotFound {
			return fmt.Errorf("the server does not serve %s: %s", m.serverName(), status.Convert(err).Message())
		}
		return errors.New(describe(err, 0))
	}
	outs, err := m.layout(md)
	if err != nil {
		return err
	}
	size := outs[len(outs)-1].offset
	outs = outs[:len(outs)-1]
	// a mapping of a full tmpfs faults (SIGBUS) when written: the regions
	// must fit in what is free there now
	var fs syscall.Statfs_t
	if err := syscall.Statfs(ShmDir, &fs); err != nil {
		return fallback(fmt.Sprintf("%s: %v", ShmDir, err))
	}
	if need, free := uint64(size)*uint64(len(m.all)), fs.Bavail*uint64(fs.Bsize); need > free {
		return fallback(fmt.Sprintf("%d regions of %d bytes (max_batch %d) need %d MB, %s has %d MB free", len(m.all), size, m.m.MaxBatch, need>>20, ShmDir, free>>20))
	}
	var made []*slot
	undo := func() {
		for _, s := range made {
			m.unregister(s)
		}
	}
	for _, s := range m.all {
		key := fmt.Sprintf("/mdag-%d-%d", os.Getpid(), regionSeq.Add(1))
		r, err := CreateRegion(key, max(size, 1))
		if err != nil {
			undo()
			return fallback(err.Error())
		}
		s.region, s.name = r, key[1:]
		made = append(made, s)
		if _, err := m.conn.c.SystemSharedMemoryRegister(ctx, &pb.SystemSharedMemoryRegisterRequest{Name: s.name, Key: key, Offset: 0, ByteSize: uint64(len(r.Data))}); err != nil {
			undo()
			if c := status.Code(err); c == codes.Unavailable || c == codes.DeadlineExceeded || c == codes.Canceled {
				return errors.New(describe(err, 0))
			}
			return fallback("registering region " + key + ": " + describe(err, 0))
		}
	}
	m.ready, m.useShm, m.outs = true, true, outs
	return nil
}

// layout places the input and each output in a region for max_batch: the
// outputs are the entry's or all the server's; an output whose size after
// the batch is not fixed comes back as raw bytes. The last spec returned is
// the end (its offset is the region's size).
func (m *model) layout(md *pb.ModelMetadataResponse) ([]outPlace, error) {
	names := m.m.Outputs
	if len(names) == 0 {
		for _, o := range md.Outputs {
			names = append(names, o.Name)
		}
	}
	align := func(n int) int { return (n + 63) &^ 63 }
	off := align(m.item * m.m.MaxBatch)
	var outs []outPlace
	for _, n := range names {
		i := slices.IndexFunc(md.Outputs, func(o *pb.ModelMetadataResponse_TensorMetadata) bool { return o.Name == n })
		if i < 0 {
			have := make([]string, len(md.Outputs))
			for j, o := range md.Outputs {
				have[j] = o.Name
			}
			return nil, fmt.Errorf("the server's %s has no output '%s' (it has: %s)", m.serverName(), n, strings.Join(have, ", "))
		}
		o := md.Outputs[i]
		per := 0
		if dt, err := RegistryDType(o.Datatype); err == nil && len(o.Shape) > 0 {
			per = prep.DTypeSize(dt)
			for _, d := range o.Shape[1:] {
				if d < 0 {
					per = 0
					break
				}
				per *= int(d)
			}
		}
		outs = append(outs, outPlace{name: n, per: per, offset: off})
		off = align(off + per*m.m.MaxBatch)
	}
	return append(outs, outPlace{offset: off}), nil
}

func (m *model) unregister(s *slot) {
	if s.region == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	_, _ = m.conn.c.SystemSharedMemoryUnregister(ctx, &pb.SystemSharedMemoryUnregisterRequest{Name: s.name})
	cancel()
	_ = s.region.Close()
	s.region, s.name = nil, ""
}

func (m *model) close() {
	if m.stopped.Swap(true) {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, s := range m.all {
		m.unregister(s)
	}
	m.useShm, m.ready = false, false
}

// extensions are the server's (ServerMetadata), read once.
func (c *conn) extensions(ctx context.Context) ([]string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.got {
		return c.ext, nil
	}
	md, err := c.c.ServerMetadata(ctx, &pb.ServerMetadataRequest{})
	if err != nil {
		return nil, errors.New(describe(err, 0))
	}
	c.ext, c.got = md.Extensions, true
	return c.ext, nil
}

// Run implements gpu.Executor: the items as one ModelInfer, the batch as
// the input's leading dimension, ctx's deadline as the gRPC deadline (when
// ctx has none: the latest of the items' deadlines).
func (x *Executor) Run(ctx context.Context, name string, items []*media.Item) ([][]*media.Item, error) {
	m := x.models[name]
	if m == nil {
		return nil, fmt.Errorf("kserve: model %q is not loaded here (loaded: %s)", name, strings.Join(x.names, ", "))
	}
	if len(items) == 0 {
		return nil, nil
	}
	if len(items) > m.m.MaxBatch {
		return nil, fmt.Errorf("kserve: model %s: batch of %d exceeds its max_batch %d", name, len(items), m.m.MaxBatch)
	}
	frames := make([]*media.Frame, len(items))
	for i, it := range items {
		if it.Frame == nil {
			return nil, fmt.Errorf("kserve: model %s: item %d has no frame", name, i)
		}
		if err := it.Frame.Valid(); err != nil {
			return nil, fmt.Errorf("kserve: model %s: item %d: %w", name, i, err)
		}
		frames[i] = it.Frame
	}
	if _, ok := ctx.Deadline(); !ok {
		if d, ok := lastDeadline(items); ok {
			var cancel context.CancelFunc
			ctx, cancel = context.WithDeadline(ctx, d)
			defer cancel()
		}
	}
	outs, err := x.forward(ctx, m, frames)
	if err != nil {
		return nil, err
	}
	p := m.m.Params()
	out := make([][]*media.Item, len(items))
	for i, it := range items {
		f := it.Frame
		g := decode.Geometry{InW: m.m.Input.Width, InH: m.m.Input.Height, FrameW: f.W, FrameH: f.H, Letterbox: m.m.Input.Resize == "letterbox"}
		r, err := m.decode(outs[i], g, p)
		if err != nil {
			return nil, fmt.Errorf("kserve: model %s, batch of %d: item %d: %w", name, len(items), i, err)
		}
		o := it.Derive()
		o.Frame, o.Region = it.Frame, it.Region
		o.Boxes, o.Labels = r.Boxes, r.Labels
		out[i] = []*media.Item{o}
	}
	return out, nil
}

// lastDeadline is the latest of the items' deadlines (capture + SLO), when
// every item has one: the bound of a call whose context has none (the
// worker's module context), since its answer is of use to no item after it.
func lastDeadline(items []*media.Item) (time.Time, bool) {
	var d time.Time
	for _, it := range items {
		if it.Deadline.IsZero() {
			return time.Time{}, false
		}
		if it.Deadline.After(d) {
			d = it.Deadline
		}
	}
	return d, true
}

// RunRaw runs one batch and returns each item's outputs undecoded (tests,
// benchmarks).
func (x *Executor) RunRaw(ctx context.Context, name string, frames []*media.Frame) ([][]decode.Output, error) {
	m := x.models[name]
	if m == nil {
		return nil, fmt.Errorf("kserve: model %q is not loaded here", name)
	}
	if len(frames) == 0 || len(frames) > m.m.MaxBatch {
		return nil, fmt.Errorf("kserve: model %s: batch of %d: want 1..%d", name, len(frames), m.m.MaxBatch)
	}
	return x.forward(ctx, m, frames)
}

// forward takes a slot, packs the frames, sends one ModelInfer and splits
// each output along the batch. Every error names model and endpoint.
func (x *Executor) forward(ctx context.Context, m *model, frames []*media.Frame) ([][]decode.Output, error) {
	where := fmt.Sprintf("kserve: model %s at %s", m.m.Name, m.conn.endpoint)
	var s *slot
	select {
	case s = <-m.slots:
	case <-ctx.Done():
		return nil, fmt.Errorf("%s: %w while waiting for one of its %d slots", where, ctx.Err(), cap(m.slots))
	}
	defer func() { m.slots <- s }()
	if m.stopped.Load() {
		return nil, fmt.Errorf("%s: the executor is closed", where)
	}
	if err := m.prepare(ctx); err != nil {
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	m.mu.Lock()
	useShm, outPlaces := m.useShm && s.region != nil, m.outs
	m.mu.Unlock()
	b := len(frames)
	in := &pb.ModelInferRequest_InferInputTensor{Name: m.m.Input.Name, Datatype: m.wire, Shape: m.m.InputShape(b)}
	req := &pb.ModelInferRequest{ModelName: m.m.KServe.Model, ModelVersion: m.m.KServe.Version, Inputs: []*pb.ModelInferRequest_InferInputTensor{in}}
	var err error
	if useShm {
		if _, err = prep.Pack(s.region.Data, &m.m.Input, frames, s.scratch); err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
		in.Parameters = regionParams(s.name, m.item*b, 0)
		for _, o := range outPlaces {
			ro := &pb.ModelInferRequest_InferRequestedOutputTensor{Name: o.name}
			if o.per > 0 {
				ro.Parameters = regionParams(s.name, o.per*b, o.offset)
			}
			req.Outputs = append(req.Outputs, ro)
		}
	} else {
		if need := m.item * b; len(s.buf) < need {
			s.buf = make([]byte, need)
		}
		raw, err := prep.Pack(s.buf, &m.m.Input, frames, s.scratch)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
		req.RawInputContents = [][]byte{raw}
		for _, o := range m.m.Outputs {
			req.Outputs = append(req.Outputs, &pb.ModelInferRequest_InferRequestedOutputTensor{Name: o})
		}
	}
	resp, err := m.infer(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("%s: %s", where, err)
	}
	outs, err := m.split(resp, s, b, useShm, outPlaces)
	if err != nil {
		return nil, fmt.Errorf("%s, batch of %d: %w", where, b, err)
	}
	return outs, nil
}

func regionParams(region string, size, offset int) map[string]*pb.InferParameter {
	return map[string]*pb.InferParameter{
		ParamRegion:   {ParameterChoice: &pb.InferParameter_StringParam{StringParam: region}},
		ParamByteSize: {ParameterChoice: &pb.InferParameter_Int64Param{Int64Param: int64(size)}},
		ParamOffset:   {ParameterChoice: &pb.InferParameter_Int64Param{Int64Param: int64(offset)}},
	}
}

// infer sends the request; a connection-level Unavailable is retried once
// when more time is left before the deadline than the attempt took.
func (m *model) infer(ctx context.Context, req *pb.ModelInferRequest) (*pb.ModelInferResponse, error) {
	start := time.Now()
	resp, err := m.conn.c.ModelInfer(ctx, req)
	if err != nil && status.Code(err) == codes.Unavailable && ctx.Err() == nil {
		took := time.Since(start)
		if d, ok := ctx.Deadline(); !ok || time.Until(d) > took {
			resp, err = m.conn.c.ModelInfer(ctx, req)
		}
	}
	if err != nil {
		return nil, errors.New(m.explain(ctx, err, time.Since(start), req))
	}
	return resp, nil
}

// explain turns a call's error into what happened, with the server's
// message carried.
func (m *model) explain(ctx context.Context, err error, took time.Duration, req *pb.ModelInferRequest) string {
	st, _ := status.FromError(err)
	switch {
	case st.Code() == codes.DeadlineExceeded || errors.Is(ctx.Err(), context.DeadlineExceeded):
		return "deadline exceeded after " + took.Round(time.Millisecond).String()
	case st.Code() == codes.NotFound:
		return fmt.Sprintf("the server does not serve %s: %s", m.serverName(), st.Message())
	case st.Code() == codes.InvalidArgument:
		in := req.Inputs[0]
		return fmt.Sprintf("the server refused input '%s' %s%v: %s", in.Name, in.Datatype, in.Shape, st.Message())
	}
	return describe(err, took)
}

// describe says a gRPC error: unreachable, deadline, or the code and the
// server's message. The status error is not wrapped: its code is the
// server's, not this worker's (cmd/mdag reads codes of coordinator errors).
func describe(err error, took time.Duration) string {
	st, _ := status.FromError(err)
	switch st.Code() {
	case codes.Unavailable:
		return "cannot reach the server: " + st.Message()
	case codes.DeadlineExceeded:
		if took > 0 {
			return "deadline exceeded after " + took.Round(time.Millisecond).String()
		}
		return "deadline exceeded"
	case codes.Canceled:
		return "canceled"
	}
	return fmt.Sprintf("%s: %s", st.Code(), st.Message())
}

// callErr is describe with the model and endpoint.
func callErr(model, endpoint string, err error, took time.Duration) error {
	if model == "" {
		return fmt.Errorf("kserve: endpoint %s: %s", endpoint, describe(err, took))
	}
	return fmt.Errorf("kserve: model %s at %s: %s", model, endpoint, describe(err, took))
}

// split reads the outputs the decoder takes (the entry's, in order, or
// all the server's), from shared memory or the raw bytes, and splits each
// along its leading (batch) dimension.
func (m *model) split(resp *pb.ModelInferResponse, s *slot, b int, useShm bool, specs []outPlace) ([][]decode.Output, error) {
	inShm := map[string]outPlace{}
	if useShm {
		for _, o := range specs {
			if o.per > 0 {
				inShm[o.name] = o
			}
		}
	}
	// raw contents are one per output not written to shared memory, in
	// the response's order
	raw := map[string][]byte{}
	ri := 0
	have := make([]string, len(resp.Outputs))
	for i, o := range resp.Outputs {
		have[i] = o.Name
		if _, ok := inShm[o.Name]; ok && len(resp.RawOutputContents) < len(resp.Outputs) {
			continue
		}
		if ri < len(resp.RawOutputContents) {
			raw[o.Name] = resp.RawOutputContents[ri]
		}
		ri++
	}
	names := m.m.Outputs
	if len(names) == 0 && useShm {
		for _, o := range specs {
			names = append(names, o.name)
		}
	}
	if len(names) == 0 {
		names = have
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("the response has no outputs")
	}
	res := make([][]decode.Output, b)
	for _, n := range names {
		i := slices.Index(have, n)
		if i < 0 {
			return nil, fmt.Errorf("output '%s' missing from the response (it has: %s)", n, strings.Join(have, ", "))
		}
		o := resp.Outputs[i]
		dt, err := RegistryDType(o.Datatype)
		if err != nil {
			return nil, fmt.Errorf("output '%s': %w", n, err)
		}
		if len(o.Shape) == 0 || o.Shape[0] != int64(b) {
			return nil, fmt.Errorf("output '%s' has shape %v: its leading dimension is not the batch of %d", n, o.Shape, b)
		}
		want := int64(prep.DTypeSize(dt))
		for _, d := range o.Shape {
			if d < 0 || (d > 0 && want > math.MaxInt32/d) {
				return nil, fmt.Errorf("output '%s' has shape %v: not a size", n, o.Shape)
			}
			want *= d
		}
		var data []byte
		if sp, ok := inShm[n]; ok && raw[n] == nil {
			if want > int64(sp.per*b) {
				return nil, fmt.Errorf("output '%s' %s%v is %d bytes, more than the %d its shared memory holds", n, o.Datatype, o.Shape, want, sp.per*b)
			}
			data = s.region.Data[sp.offset : sp.offset+int(want)]
		} else {
			data = raw[n]
			if data == nil && o.Contents != nil && len(o.Contents.Fp32Contents) > 0 && dt == "float32" {
				data = make([]byte, 0, 4*len(o.Contents.Fp32Contents))
				for _, v := range o.Contents.Fp32Contents {
					u := math.Float32bits(v)
					data = append(data, byte(u), byte(u>>8), byte(u>>16), byte(u>>24))
				}
			}
			if data == nil {
				return nil, fmt.Errorf("output '%s' has no contents in the response", n)
			}
		}
		if int64(len(data)) != want {
			return nil, fmt.Errorf("output '%s' %s%v has %d bytes, want %d", n, o.Datatype, o.Shape, len(data), want)
		}
		vals, err := prep.Floats(dt, data)
		if err != nil {
			return nil, fmt.Errorf("output '%s': %w", n, err)
		}
		per := len(vals) / b
		for i := range b {
			res[i] = append(res[i], decode.Output{Name: n, Shape: slices.Clone(o.Shape[1:]), Data: vals[i*per : (i+1)*per]})
		}
	}
	return res, nil
}
