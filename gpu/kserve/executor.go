package kserve

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	pb "github.com/mdag/mdag/api/kserve"
	"github.com/mdag/mdag/gpu"
	"github.com/mdag/mdag/gpu/decode"
	"github.com/mdag/mdag/gpu/prep"
	"github.com/mdag/mdag/gpu/queue"
	"github.com/mdag/mdag/gpu/registry"
	"github.com/mdag/mdag/internal/unixsock"
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
// Retries: a ModelInfer that fails Unavailable at the connection level
// (the server went away or the connection broke; not an Unavailable the
// server answered, such as a model unloading) is retried once, only when
// the time left before the frame deadline exceeds the time the first
// attempt took. A batch whose shared memory region the server does not
// know (it restarted and lost the registrations) or whose region faulted
// makes the model negotiate again (every slot registers a fresh region
// when it next runs) and is tried once more under the same rule. Nothing
// else is retried, so no retry outlives the frames.
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

	mu     sync.Mutex // guards what prepare and attach set
	ready  bool
	useShm bool
	why    string     // why shared memory is not used (Describe)
	outs   []outPlace // with shared memory: the outputs and their place
	size   int        // with shared memory: a slot region's bytes
	gen    uint64     // negotiations so far: a slot registered at an older one registers again

	phases [nPhases]atomic.Int64 // nanoseconds per part of a batch (Phases)
	timed  atomic.Int64          // batches timed
}

// The parts of a batch Phases reports: packing the frames (prep.Pack, on
// several goroutines), copying them into the shared memory region, the
// ModelInfer call (the protocol both ways and all the server does), and
// splitting the outputs into items.
var phaseNames = [...]string{"pack", "shm-write", "call", "split"}

const nPhases = len(phaseNames)

// Phases implements gpu.Phased.
func (x *Executor) Phases(name string) []gpu.Phase {
	m := x.models[name]
	if m == nil {
		return nil
	}
	out := make([]gpu.Phase, nPhases)
	n := m.timed.Load()
	for i := range out {
		out[i] = gpu.Phase{Name: phaseNames[i], Total: time.Duration(m.phases[i].Load()), Batches: n}
	}
	return out
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
	gen     uint64 // the model's negotiation it was registered at
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
	removeStale()
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
// speaks gRPC only. A unix: endpoint is talked to only when the server's
// uid is this process's or root's (unixsock.Dial checks SO_PEERCRED).
func (x *Executor) dial(endpoint string) (*conn, error) {
	if c := x.conns[endpoint]; c != nil {
		return c, nil
	}
	if strings.HasPrefix(endpoint, "http://") || strings.HasPrefix(endpoint, "https://") {
		return nil, fmt.Errorf("endpoint %s: the kserve executor speaks the protocol's gRPC binding; give host:port of the server's gRPC port (Triton: 8001), not its HTTP URL", endpoint)
	}
	opts := append(DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if unixsock.IsTarget(endpoint) {
		// a socket another user serves (bound first at the path) is
		// refused: the frames would go to them
		opts = append(opts, grpc.WithContextDialer(unixsock.Dial))
	}
	cc, err := grpc.NewClient(endpoint, opts...)
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

// Health is what a worker probes: every endpoint live, every model ready
// on its server, and each model's transport negotiated where the server
// answers (a permanent misconfiguration, such as shared memory on where
// the server lacks it or an output the server's model lacks, fails here
// too, so the worker does not register and says why). ServerReady is not
// asked: a server with explicit model control (Triton) is not ready while
// a model it was told to unload is unloaded, which says nothing of this
// worker's models. The first failure is returned, saying where.
func (x *Executor) Health(ctx context.Context) error {
	for _, ep := range x.eps {
		c := x.conns[ep]
		live, err := c.c.ServerLive(ctx, &pb.ServerLiveRequest{})
		if status.Code(err) == codes.Unavailable && ctx.Err() == nil {
			// the first probe after the server restarted finds the old
			// connection broken: give gRPC half a second to reconnect
			// before calling the endpoint down (a worker leaving re-plans)
			wctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
			if l, err2 := c.c.ServerLive(wctx, &pb.ServerLiveRequest{}, grpc.WaitForReady(true)); err2 == nil {
				live, err = l, nil
			}
			cancel()
		}
		if err != nil {
			return fmt.Errorf("kserve: endpoint %s: %s", c.endpoint, c.describe(err, 0))
		}
		if !live.Live {
			return fmt.Errorf("kserve: endpoint %s: the server is not live", ep)
		}
	}
	for _, n := range x.names {
		m := x.models[n]
		k := m.m.KServe
		r, err := m.conn.c.ModelReady(ctx, &pb.ModelReadyRequest{Name: k.Model, Version: k.Version})
		if err != nil {
			return fmt.Errorf("kserve: model %s at %s: %s", n, m.conn.endpoint, m.conn.describe(err, 0))
		}
		if !r.Ready {
			return fmt.Errorf("kserve: model %s at %s: %s is not ready on the server", n, m.conn.endpoint, m.serverName())
		}
		if err := m.prepare(ctx); err != nil {
			return fmt.Errorf("kserve: model %s at %s: %w", n, m.conn.endpoint, err)
		}
		m.checkRegions(ctx)
	}
	return nil
}

// checkRegions asks the server (SystemSharedMemoryStatus) for one of the
// model's registered regions: one it does not know (it restarted) makes
// the model negotiate again, before a batch finds out. Other answers
// (a server without the RPC) change nothing.
func (m *model) checkRegions(ctx context.Context) {
	m.mu.Lock()
	name := ""
	if m.ready && m.useShm {
		for _, s := range m.all {
			if s.name != "" && s.gen == m.gen {
				name = s.name
				break
			}
		}
	}
	m.mu.Unlock()
	if name == "" {
		return
	}
	st, err := m.conn.c.SystemSharedMemoryStatus(ctx, &pb.SystemSharedMemoryStatusRequest{Name: name})
	if c := status.Code(err); c == codes.NotFound || c == codes.InvalidArgument || (err == nil && st.Regions[name] == nil) {
		m.lost()
	}
}

// Check is Health, then each slot's shared memory region created and
// registered where used: what `mdag worker` runs before it serves, so a
// misconfiguration is said at start.
func (x *Executor) Check(ctx context.Context) error {
	if err := x.Health(ctx); err != nil {
		return err
	}
	for _, n := range x.names {
		m := x.models[n]
		for range m.all {
			var s *slot
			select {
			case s = <-m.slots:
			case <-ctx.Done():
				return fmt.Errorf("kserve: model %s at %s: %w while waiting for a slot", n, m.conn.endpoint, ctx.Err())
			}
			_, err := m.attach(ctx, s)
			defer func() { m.slots <- s }() // every slot held until all are checked
			if err != nil {
				return fmt.Errorf("kserve: model %s at %s: %w", n, m.conn.endpoint, err)
			}
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

// removeStale removes the regions (ShmDir/mdag-PID-N, this executor's
// naming) of processes that are gone: what a worker that crashed left.
func removeStale() {
	paths, _ := filepath.Glob(filepath.Join(ShmDir, "mdag-*-*"))
	for _, p := range paths {
		pid, n, ok := strings.Cut(strings.TrimPrefix(filepath.Base(p), "mdag-"), "-")
		id, err := strconv.Atoi(pid)
		if _, err2 := strconv.ParseUint(n, 10, 64); !ok || err != nil || err2 != nil || id <= 0 || id == os.Getpid() {
			continue
		}
		if err := syscall.Kill(id, 0); errors.Is(err, syscall.ESRCH) {
			_ = os.Remove(p)
		}
	}
}

func (m *model) serverName() string {
	k := m.m.KServe
	if k.Version != "" {
		return fmt.Sprintf("server model %s version %s", k.Model, k.Version)
	}
	return "server model " + k.Model
}

// errClosed is a batch's error after Close.
var errClosed = errors.New("the executor is closed")

// prepare decides, once it succeeds (and again after the server lost the
// regions: lost), how tensors travel: with shared memory it reads the
// server's extensions and the model's outputs and lays out a slot's
// region; each slot creates and registers its own when it next runs
// (attach). An unreachable server is an error (tried again next batch);
// shared memory the server lacks is one only for "on" ("auto" falls back
// to raw bytes, said by Describe).
func (m *model) prepare(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stopped.Load() {
		return errClosed
	}
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
	ext, err := m.conn.extensions(ctx)
	if err != nil {
		return err
	}
	if !slices.Contains(ext, "system_shared_memory") {
		return m.fallback("the server does not list the system_shared_memory extension")
	}
	k := m.m.KServe
	md, err := m.conn.c.ModelMetadata(ctx, &pb.ModelMetadataRequest{Name: k.Model, Version: k.Version})
	if err != nil {
		if status.Code(err) == codes.NotFound {
			return fmt.Errorf("the server does not serve %s: %s", m.serverName(), status.Convert(err).Message())
		}
		return errors.New(m.conn.describe(err, 0))
	}
	outs, err := m.layout(md)
	if err != nil {
		return err
	}
	size := outs[len(outs)-1].offset
	outs = outs[:len(outs)-1]
	// the regions must fit in what is free there now (CreateRegion
	// reserves each one's pages)
	var fs syscall.Statfs_t
	if err := syscall.Statfs(ShmDir, &fs); err != nil {
		return m.fallback(fmt.Sprintf("%s: %v", ShmDir, err))
	}
	if need, free := uint64(size)*uint64(len(m.all)), fs.Bavail*uint64(fs.Bsize); need > free {
		return m.fallback(fmt.Sprintf("%d regions of %d bytes (max_batch %d) need %d MB, %s has %d MB free", len(m.all), size, m.m.MaxBatch, need>>20, ShmDir, free>>20))
	}
	m.ready, m.useShm, m.outs, m.size, m.why = true, true, outs, max(size, 1), ""
	m.gen++
	return nil
}

// fallback is shared memory not used, for why: an error for "on", raw
// bytes for "auto". Under m.mu.
func (m *model) fallback(why string) error {
	if m.shm == "on" {
		return fmt.Errorf("shared memory on, but %s", why)
	}
	m.ready, m.useShm, m.why = true, false, why
	return nil
}

// attach gives slot s (held by the caller) a region registered at the
// model's current negotiation, when shared memory is used, and says
// whether it is. Under m.mu, so Close never races it; its RPCs are bounded
// by ctx (the batch's).
func (m *model) attach(ctx context.Context, s *slot) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stopped.Load() {
		return false, errClosed
	}
	if !m.ready || !m.useShm {
		return false, nil
	}
	if s.region != nil && s.gen == m.gen && len(s.region.Data) == m.size {
		return true, nil
	}
	m.unregister(ctx, s) // registered at an older negotiation
	key := fmt.Sprintf("/mdag-%d-%d", os.Getpid(), regionSeq.Add(1))
	r, err := CreateRegion(key, m.size)
	if err != nil {
		return false, m.fallback(err.Error())
	}
	s.region, s.name = r, key[1:]
	if _, err := m.conn.c.SystemSharedMemoryRegister(ctx, &pb.SystemSharedMemoryRegisterRequest{Name: s.name, Key: key, Offset: 0, ByteSize: uint64(len(r.Data))}); err != nil {
		_ = s.region.Close()
		s.region, s.name = nil, ""
		if c := status.Code(err); c == codes.Unavailable || c == codes.DeadlineExceeded || c == codes.Canceled {
			return false, fmt.Errorf("registering shared memory region %s: %s", key, m.conn.describe(err, 0))
		}
		return false, m.fallback("registering region " + key + ": " + m.conn.describe(err, 0))
	}
	s.gen = m.gen
	return true, nil
}

// lost is the server not knowing a slot's region (it restarted) or a
// region faulting: negotiate again (extensions, outputs) and have every
// slot register a fresh region when it next runs.
func (m *model) lost() {
	m.mu.Lock()
	m.ready = false
	m.mu.Unlock()
	m.conn.mu.Lock()
	m.conn.got = false
	m.conn.mu.Unlock()
}

// layout places the input and each output in a region for max_batch: the
// outputs are the entry's or all the server's; an output whose size after
// the batch is not fixed, or whose max_batch items exceed MaxMessageBytes
// (what the server's metadata says is outside input), comes back as raw
// bytes. The last spec returned is the end (its offset is the region's
// size).
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
		per := int64(0)
		if dt, err := RegistryDType(o.Datatype); err == nil && len(o.Shape) > 0 {
			per = int64(prep.DTypeSize(dt))
			for _, d := range o.Shape[1:] {
				if d < 0 || (d > 0 && per > MaxMessageBytes/d) {
					per = 0
					break
				}
				per *= d
			}
			if per > MaxMessageBytes/int64(max(m.m.MaxBatch, 1)) {
				per = 0
			}
		}
		outs = append(outs, outPlace{name: n, per: int(per), offset: off})
		off = align(off + int(per)*m.m.MaxBatch)
	}
	return append(outs, outPlace{offset: off}), nil
}

// unregister unregisters s's region (bounded by ctx and 2 s) and removes
// it. Under m.mu.
func (m *model) unregister(ctx context.Context, s *slot) {
	if s.region == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
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
		m.unregister(context.Background(), s)
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
		return nil, errors.New(c.describe(err, 0))
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
	where := m.where()
	if len(items) > m.m.MaxBatch {
		return nil, fmt.Errorf("%s: batch of %d exceeds its max_batch %d", where, len(items), m.m.MaxBatch)
	}
	frames := make([]*media.Frame, len(items))
	for i, it := range items {
		if it.Frame == nil {
			return nil, fmt.Errorf("%s: item %d has no frame", where, i)
		}
		if err := it.Frame.Valid(); err != nil {
			return nil, fmt.Errorf("%s: item %d: %w", where, i, err)
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
			return nil, fmt.Errorf("%s, batch of %d: item %d: %w", where, len(items), i, err)
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
		return nil, fmt.Errorf("%s: batch of %d: want 1..%d", m.where(), len(frames), m.m.MaxBatch)
	}
	return x.forward(ctx, m, frames)
}

// where is the prefix of the model's errors.
func (m *model) where() string {
	return fmt.Sprintf("kserve: model %s at %s", m.m.Name, m.conn.endpoint)
}

// forward takes a slot and runs the batch on it (attempt). When the
// server does not know the slot's shared memory region (it restarted and
// lost the registrations) or the region faulted, the model negotiates
// again and the batch is tried once more, only when the time left before
// the deadline exceeds what the first attempt took. Every error names
// model and endpoint.
func (x *Executor) forward(ctx context.Context, m *model, frames []*media.Frame) ([][]decode.Output, error) {
	where := m.where()
	var s *slot
	waited := time.Now()
	select {
	case s = <-m.slots:
	case <-ctx.Done():
		return nil, fmt.Errorf("%s: %w while waiting for one of its %d slots", where, ctx.Err(), cap(m.slots))
	}
	queue.Add(ctx, time.Since(waited))
	defer func() { m.slots <- s }()
	start := time.Now()
	outs, again, err := m.attempt(ctx, s, frames)
	if err != nil && again && ctx.Err() == nil {
		if d, ok := ctx.Deadline(); !ok || time.Until(d) > time.Since(start) {
			outs, _, err = m.attempt(ctx, s, frames)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("%s%w", where, err)
	}
	return outs, nil
}

// faultError is a shared memory region that faulted (SIGBUS: its object
// was truncated, or its tmpfs ran out of pages) while this process read or
// wrote it.
type faultError struct{ err error }

func (e *faultError) Error() string { return e.err.Error() }

// guard runs f, turning a memory fault in it into an error: f touches a
// shared memory mapping that another process can truncate.
func guard(what string, f func()) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if p := recover(); p != nil {
			fa, ok := p.(interface{ Addr() uintptr })
			if !ok {
				panic(p)
			}
			err = &faultError{fmt.Errorf("%s faulted at %#x: was its object truncated, or %s full? (%v)", what, fa.Addr(), ShmDir, p)}
		}
	}()
	f()
	return nil
}

// copyGuarded copies src into the start of dst, a shared memory mapping,
// in chunks of at least copyChunk bytes on up to GOMAXPROCS goroutines
// (one goroutine's memcpy of a batch of 32 ResNet-50 inputs, 4.8 MB, took
// 0.86 ms on an H200's host), each under guard: a fault is the copy's
// error, never a crash. A dst shorter than src is an error.
func copyGuarded(what string, dst, src []byte) error {
	if len(dst) < len(src) {
		return fmt.Errorf("%s: %d bytes do not fit in its %d", what, len(src), len(dst))
	}
	n := min(runtime.GOMAXPROCS(0), len(src)/copyChunk)
	if n <= 1 {
		return guard(what, func() { copy(dst, src) })
	}
	per := (len(src) + n - 1) / n
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		lo, hi := i*per, min((i+1)*per, len(src))
		wg.Go(func() { errs[i] = guard(what, func() { copy(dst[lo:hi], src[lo:hi]) }) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// copyChunk is the least a goroutine of copyGuarded copies.
const copyChunk = 512 << 10

// attempt packs the frames, sends one ModelInfer and splits each output
// along the batch. Its error starts with ": " or ", batch of N: " (after
// the model and endpoint); again says the model negotiates anew (a region
// the server does not know, or one that faulted), so a second attempt may
// succeed.
func (m *model) attempt(ctx context.Context, s *slot, frames []*media.Frame) (outs [][]decode.Output, again bool, err error) {
	if m.stopped.Load() {
		return nil, false, fmt.Errorf(": %w", errClosed)
	}
	if err := m.prepare(ctx); err != nil {
		return nil, false, fmt.Errorf(": %w", err)
	}
	useShm, err := m.attach(ctx, s)
	if err != nil {
		return nil, false, fmt.Errorf(": %w", err)
	}
	m.mu.Lock()
	outPlaces := m.outs
	m.mu.Unlock()
	b := len(frames)
	in := &pb.ModelInferRequest_InferInputTensor{Name: m.m.Input.Name, Datatype: m.wire, Shape: m.m.InputShape(b)}
	req := &pb.ModelInferRequest{ModelName: m.m.KServe.Model, ModelVersion: m.m.KServe.Version, Inputs: []*pb.ModelInferRequest_InferInputTensor{in}}
	// packed (on several goroutines) into the slot's own memory; with
	// shared memory then copied into the region (copyGuarded: each
	// goroutine's fault becomes the batch's error)
	if need := m.item * b; len(s.buf) < need {
		s.buf = make([]byte, need)
	}
	t0 := time.Now()
	raw, err := prep.Pack(s.buf, &m.m.Input, frames, s.scratch)
	if err != nil {
		return nil, false, fmt.Errorf(": %w", err)
	}
	t1 := time.Now()
	var t2 time.Time
	if useShm {
		err := copyGuarded("shared memory region "+s.name, s.region.Data, raw)
		t2 = time.Now()
		if err != nil {
			m.lost()
			return nil, true, fmt.Errorf(": writing the input: %w", err)
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
		t2 = t1
		req.RawInputContents = [][]byte{raw}
		for _, o := range m.m.Outputs {
			req.Outputs = append(req.Outputs, &pb.ModelInferRequest_InferRequestedOutputTensor{Name: o})
		}
	}
	start := time.Now()
	resp, err := m.infer(ctx, req)
	if err != nil {
		if useShm && regionUnknown(err) {
			m.lost()
			st := status.Convert(err)
			return nil, true, fmt.Errorf(": the server does not know shared memory region %s (restarted? it is registered again): %s: %s", s.name, st.Code(), st.Message())
		}
		return nil, false, fmt.Errorf(": %s", m.explain(ctx, err, time.Since(start), req))
	}
	t3 := time.Now()
	outs, err = m.split(resp, s, b, useShm, outPlaces)
	if err != nil {
		var fe *faultError
		if errors.As(err, &fe) {
			m.lost()
			again = true
		}
		return nil, again, fmt.Errorf(", batch of %d: %w", b, err)
	}
	for k, d := range [nPhases]time.Duration{t1.Sub(t0), t2.Sub(t1), t3.Sub(start), time.Since(t3)} {
		m.phases[k].Add(int64(d))
	}
	m.timed.Add(1)
	return outs, false, nil
}

// regionUnknown says whether a ModelInfer error is the server not knowing
// a shared memory region: NotFound about a region (mdag's server), or
// InvalidArgument saying a region is not registered or not found
// (Triton: "Unable to find system shared memory region"). A region's
// other refusals (a range outside it) are not: registering again would
// not help.
func regionUnknown(err error) bool {
	st := status.Convert(err)
	msg := strings.ToLower(st.Message())
	if !strings.Contains(msg, "shared memory") && !strings.Contains(msg, "region") {
		return false
	}
	switch st.Code() {
	case codes.NotFound:
		return true
	case codes.InvalidArgument:
		for _, w := range []string{"not registered", "unable to find", "not found", "unknown", "no such"} {
			if strings.Contains(msg, w) {
				return true
			}
		}
	}
	return false
}

func regionParams(region string, size, offset int) map[string]*pb.InferParameter {
	return map[string]*pb.InferParameter{
		ParamRegion:   {ParameterChoice: &pb.InferParameter_StringParam{StringParam: region}},
		ParamByteSize: {ParameterChoice: &pb.InferParameter_Int64Param{Int64Param: int64(size)}},
		ParamOffset:   {ParameterChoice: &pb.InferParameter_Int64Param{Int64Param: int64(offset)}},
	}
}

// infer sends the request; a connection-level Unavailable (not one the
// server answered while the connection was up) is retried once when more
// time is left before the deadline than the attempt took. The error is
// the call's.
func (m *model) infer(ctx context.Context, req *pb.ModelInferRequest) (*pb.ModelInferResponse, error) {
	start := time.Now()
	resp, err := m.conn.c.ModelInfer(ctx, req)
	if err != nil && status.Code(err) == codes.Unavailable && ctx.Err() == nil && !m.conn.answered(err) {
		took := time.Since(start)
		if d, ok := ctx.Deadline(); !ok || time.Until(d) > took {
			resp, err = m.conn.c.ModelInfer(ctx, req)
		}
	}
	return resp, err
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
	return m.conn.describe(err, took)
}

// answered says whether an Unavailable error is the server's answer over
// a connection that is up (a model unloading), not the connection's
// failure: the connection is Ready and the message is none of grpc-go's
// transport errors (the state can still read Ready just after the
// connection broke).
func (c *conn) answered(err error) bool {
	st, _ := status.FromError(err)
	if st.Code() != codes.Unavailable || c.cc.GetState() != connectivity.Ready {
		return false
	}
	msg := st.Message()
	for _, t := range []string{"error reading from server", "connection error", "transport is closing", "connection closed", "connection reset", "broken pipe", "EOF", "transport: "} {
		if strings.Contains(msg, t) {
			return false
		}
	}
	return true
}

// describe is the package's describe, telling an Unavailable the server
// answered over a live connection from one where it could not be reached.
func (c *conn) describe(err error, took time.Duration) string {
	if c.answered(err) {
		return "the server answered Unavailable: " + status.Convert(err).Message()
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
			if sp.offset < 0 || int64(sp.offset)+want > int64(len(s.region.Data)) {
				return nil, fmt.Errorf("output '%s' %s%v: %d bytes at offset %d are outside shared memory region %s of %d bytes", n, o.Datatype, o.Shape, want, sp.offset, s.name, len(s.region.Data))
			}
			// copied out on this goroutine: a truncated object faults
			data = make([]byte, want)
			if err := guard("shared memory region "+s.name, func() { copy(data, s.region.Data[sp.offset:]) }); err != nil {
				return nil, fmt.Errorf("output '%s': %w", n, err)
			}
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
