package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sort"
	"strings"
	"time"

	"google.golang.org/grpc"

	pb "github.com/mdag/mdag/api/kserve"
	"github.com/mdag/mdag/gpu"
	"github.com/mdag/mdag/gpu/kserve"
	"github.com/mdag/mdag/gpu/onnx"
	"github.com/mdag/mdag/gpu/registry"
	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/internal/unixsock"
	"github.com/mdag/mdag/profile"
)

// `mdag infer-server` serves the Open Inference Protocol (KServe v2 /
// Triton gRPC) over one of mdag's executors (both builds): the onnx
// executor's sessions, or the emulated model (the protocol's cost without
// compute).

const inferServerSynopsis = "--models models.yaml [--executor onnx|emulated] [flags]"

func runInferServer(args []string, stdout, stderr io.Writer) int {
	return execute("infer-server", inferServerSynopsis, new(inferServerCmd), args, stdout, stderr)
}

// inferServerCmd is mdag infer-server's options.
type inferServerCmd struct {
	listen, executor string
	profiles, worker string
	onnx             *onnxFlags
	duration, grace  time.Duration
	verbose, open    bool
	shm              kserve.ShmLimits
	unixPath         string // --listen's socket, by validate
	unix             bool
}

func (c *inferServerCmd) flags(fs *flag.FlagSet) {
	fs.StringVar(&c.listen, "listen", "127.0.0.1:8001", "the gRPC address: HOST:PORT over TCP (Triton's gRPC port is 8001), or unix:/PATH, a Unix socket (mode 0600, in a directory only its owner may write; "+
		"the path at most 107 bytes) that only the server's own uid and root may use, each connection's peer checked (SO_PEERCRED); "+
		"mdag's kserve executor in turn talks to a unix: endpoint only when its server is of the worker's own uid or root")
	fs.StringVar(&c.executor, "executor", "onnx", "onnx: the registry's onnx models on ONNX Runtime; emulated: every registry model, answered after its profiled l(b) with zeros (the protocol's cost without compute)")
	c.onnx = addONNXFlags(fs)
	fs.Lookup("models").Usage = "the model registry (models.yaml): onnx serves its onnx entries, emulated every entry's input tensor and max_batch"
	fs.StringVar(&c.profiles, "profiles", "", "with --executor emulated: profiles YAML whose points give each model's l(b)")
	fs.StringVar(&c.worker, "worker-type", "", "with --executor emulated: the profiles' worker type to take l(b) from (default: the only one)")
	fs.DurationVar(&c.duration, "duration", 0, "stop after this long (0: until SIGINT/SIGTERM)")
	fs.DurationVar(&c.grace, "grace", 5*time.Second, "on stop, how long requests running may take to finish")
	fs.BoolVar(&c.verbose, "v", false, "log debug events")
	fs.Func("model", "serve only these of the registry's models (comma-separated, repeatable; default: all): e.g. the one a profiles file has, with --executor emulated", func(v string) error {
		for n := range strings.SplitSeq(v, ",") {
			if n = strings.TrimSpace(n); n == "" {
				return fmt.Errorf("an empty model name in %q", v)
			}
			c.onnx.keep = append(c.onnx.keep, n)
		}
		return nil
	})
	fs.BoolVar(&c.open, "open", false, "allow a --listen that is not loopback: the protocol has no authentication here, so anyone who can reach the port can run the models and register shared memory; only on a trusted network")
	fs.IntVar(&c.shm.MaxRegions, "shm-max-regions", kserve.DefaultShmLimits.MaxRegions, "the most shared memory regions registered at once (all clients together); one more is refused with ResourceExhausted")
	fs.Uint64Var(&c.shm.MaxBytes, "shm-max-bytes", kserve.DefaultShmLimits.MaxBytes, "the most bytes of shared memory registered at once (the regions' byte_size summed)")
}

func (c *inferServerCmd) validate(fs *flag.FlagSet) []error {
	var errs []error
	c.unixPath, c.unix = unixsock.Path(c.listen)
	if c.unix && c.open {
		errs = append(errs, fmt.Errorf("--open is for a TCP --listen: --listen %s is the server's own uid's only", c.listen))
	}
	if !c.unix && !loopback(c.listen) && !c.open {
		errs = append(errs, fmt.Errorf("--listen %s is not a loopback address: the Open Inference Protocol port has no authentication, "+
			"so anyone who can reach it could run the models; keep it on 127.0.0.1 (the worker's shared memory needs one host anyway), or give --open on a trusted network", c.listen))
	}
	errs = append(errs, c.executorProblems(fs)...)
	if c.grace < 0 {
		errs = append(errs, fmt.Errorf("--grace %v: want >= 0", c.grace))
	}
	if c.shm.MaxRegions <= 0 || c.shm.MaxBytes == 0 {
		errs = append(errs, fmt.Errorf("--shm-max-regions %d and --shm-max-bytes %d: want both > 0", c.shm.MaxRegions, c.shm.MaxBytes))
	}
	return errs
}

// executorProblems are the problems with --executor and the flags of
// the executor it did not choose.
func (c *inferServerCmd) executorProblems(fs *flag.FlagSet) []error {
	var errs []error
	switch c.executor {
	case "onnx":
		if c.profiles != "" || c.worker != "" {
			errs = append(errs, errors.New("--profiles and --worker-type are the emulated executor's; --executor onnx runs the models"))
		}
	case "emulated":
		for _, g := range c.onnx.set(fs) {
			if g != "--models" {
				errs = append(errs, fmt.Errorf("%s needs --executor onnx", g))
			}
		}
		if *c.onnx.models == "" || c.profiles == "" {
			errs = append(errs, errors.New("--executor emulated needs --models models.yaml (the tensors) and --profiles profiles.yaml (l(b) of each model)"))
		}
	default:
		errs = append(errs, fmt.Errorf("--executor %q: want onnx or emulated", c.executor))
	}
	return errs
}

func (c *inferServerCmd) run(env *cmdEnv) error {
	is, err := newInferServer(c.executor, c.onnx, c.profiles, c.worker)
	if err != nil {
		return invalid(err)
	}
	defer is.close()
	if err := is.srv.SetShmLimits(c.shm); err != nil {
		return invalid(err)
	}
	log := newLogger(env.stderr, c.verbose)
	lis, err := c.listenOn(log)
	if err != nil {
		return invalid(err)
	}
	c.announce(is, lis, log)
	ctx, cancel := runContext(c.duration)
	defer cancel()
	if err := serveInfer(ctx, is.srv, lis, c.grace, log); err != nil {
		return err
	}
	fmt.Fprintf(env.stdout, "infer-server on %s stopped\n", grpcAddr(lis))
	return nil
}

// listenOn listens on --listen: a TCP port or a Unix socket.
func (c *inferServerCmd) listenOn(log *slog.Logger) (net.Listener, error) {
	var lis net.Listener
	var err error
	if c.unix {
		lis, err = unixsock.Listen(c.unixPath, log)
	} else {
		lis, err = net.Listen("tcp", c.listen)
	}
	if err != nil {
		return nil, fmt.Errorf("--listen %s: %w", c.listen, err)
	}
	return lis, nil
}

// announce logs where the server serves, with what, and each model.
func (c *inferServerCmd) announce(is *inferServer, lis net.Listener, log *slog.Logger) {
	log.Info("serving the Open Inference Protocol (KServe v2 gRPC)", "grpc", grpcAddr(lis), "executor", is.what,
		"shm_max_regions", c.shm.MaxRegions, "shm_max_bytes", c.shm.MaxBytes)
	for _, m := range is.srv.Models() {
		md, _ := is.srv.ModelMetadata(context.Background(), &pb.ModelMetadataRequest{Name: m})
		log.Info("model", "name", m, "platform", md.Platform, "inputs", tensorList(md.Inputs), "outputs", tensorList(md.Outputs))
	}
}

// inferServer is a built server and what it holds.
type inferServer struct {
	srv   *kserve.Server
	close func()
	what  string // the executor, for the log
}

// newInferServer builds the server of the flags: executor is onnx or
// emulated, with its flags (validate checked them).
func newInferServer(executor string, ox *onnxFlags, profiles, worker string) (*inferServer, error) {
	if executor == "onnx" {
		x, _, err := ox.executor()
		if err != nil {
			return nil, err
		}
		s, err := kserve.NewServer("mdag", version, onnxBackend{x})
		if err != nil {
			x.Close()
			return nil, err
		}
		return &inferServer{srv: s, close: x.Close, what: x.Describe()}, nil
	}
	reg, err := ox.registry()
	if err != nil {
		return nil, err
	}
	pf, err := profile.Load(profiles)
	if err != nil {
		return nil, err
	}
	l, err := profileLatency(pf, worker, reg)
	if err != nil {
		return nil, err
	}
	e, err := kserve.NewEmulated(reg, clock.Real{}, l)
	if err != nil {
		return nil, err
	}
	s, err := kserve.NewServer("mdag", version, e)
	if err != nil {
		return nil, err
	}
	return &inferServer{srv: s, close: func() {}, what: "emulated (profiled l(b) from " + profiles + ", zeros back)"}, nil
}

// serveInfer serves s on lis until ctx ends, then stops gracefully (at
// most grace for requests running).
func serveInfer(ctx context.Context, s *kserve.Server, lis net.Listener, grace time.Duration, log *slog.Logger) error {
	g := grpc.NewServer(kserve.ServerOptions()...)
	s.Register(g)
	errc := make(chan error, 1)
	go func() { errc <- g.Serve(lis) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	log.Info("stopping: requests running finish first", "grace", grace)
	stopped := make(chan struct{})
	go func() { g.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(grace):
		g.Stop()
		<-stopped
	}
	<-errc
	return s.Close()
}

// PlatformONNX is the platform ModelMetadata reports for the onnx
// executor's models (Triton's name for ONNX Runtime).
const PlatformONNX = "onnxruntime_onnx"

// onnxBackend serves an onnx.Executor's models as a kserve.Backend
// (gpu/kserve does not import gpu/onnx: the adapter lives here).
type onnxBackend struct{ x *onnx.Executor }

func (b onnxBackend) Models() []kserve.ModelMeta {
	var out []kserve.ModelMeta
	for _, name := range b.x.Models() {
		m, ok := b.x.Meta(name)
		if !ok {
			continue
		}
		mm := kserve.ModelMeta{Name: name, Platform: PlatformONNX, MaxBatch: m.MaxBatch,
			Inputs: []kserve.TensorMeta{{Name: m.Input.Name, DType: m.Input.DType, Shape: m.Input.Shape}}}
		for _, o := range m.Outputs {
			mm.Outputs = append(mm.Outputs, kserve.TensorMeta{Name: o.Name, DType: o.DType, Shape: o.Shape})
		}
		out = append(out, mm)
	}
	return out
}

func (b onnxBackend) Infer(ctx context.Context, model string, in []kserve.Tensor) ([]kserve.Tensor, error) {
	if len(in) != 1 || len(in[0].Shape) == 0 {
		return nil, fmt.Errorf("onnx: model %s takes one batched input", model)
	}
	outs, err := b.x.Infer(ctx, model, int(in[0].Shape[0]), in[0].Data)
	if err != nil {
		return nil, err
	}
	res := make([]kserve.Tensor, len(outs))
	for i, o := range outs {
		res[i] = kserve.Tensor{Name: o.Name, DType: o.DType, Shape: o.Shape, Data: o.Data}
	}
	return res, nil
}

// Load implements kserve.Loader: the model's sessions again.
func (b onnxBackend) Load(_ context.Context, model string) error { return b.x.Load(model) }

// Unload implements kserve.Loader: the model's sessions freed.
func (b onnxBackend) Unload(_ context.Context, model string) error { return b.x.Unload(model) }

// profileLatency is l(b) of every model of reg from the profiles on one
// worker type: the profiled batch sizes at the lowest concurrency
// profiled, linearly interpolated between them and extrapolated beyond
// the last two (a single point is every batch's time). Every model needs
// a profile on that worker type.
func profileLatency(pf *profile.File, worker string, reg *registry.Registry) (gpu.LatencyFunc, error) {
	if worker == "" {
		var types []string
		for _, w := range pf.Workers {
			types = append(types, string(w.Type))
		}
		if len(types) != 1 {
			return nil, fmt.Errorf("%s has worker types %s: choose one with --worker-type", pf.Path, strings.Join(types, ", "))
		}
		worker = types[0]
	} else if _, ok := pf.Worker(profile.WorkerTypeID(worker)); !ok {
		var types []string
		for _, w := range pf.Workers {
			types = append(types, string(w.Type))
		}
		return nil, fmt.Errorf("--worker-type %s is not in %s (it has: %s)", worker, pf.Path, strings.Join(types, ", "))
	}
	type pt struct {
		b int
		l time.Duration
	}
	curves := map[string][]pt{}
	var errs []error
	for _, name := range reg.Names() {
		conc := 0
		var pts []pt
		// a model profiled at several frame sizes: the planning size's points
		if p, ok := pf.ProfileAt(name, profile.WorkerTypeID(worker), profile.FrameSize{}); ok {
			for _, q := range p.Points {
				switch {
				case conc == 0 || q.Concurrency < conc:
					conc, pts = q.Concurrency, []pt{{q.Batch, q.Latency}}
				case q.Concurrency == conc:
					pts = append(pts, pt{q.Batch, q.Latency})
				}
			}
		}
		if len(pts) == 0 {
			errs = append(errs, fmt.Errorf("model %s has no profile on worker type %s in %s", name, worker, pf.Path))
			continue
		}
		sort.Slice(pts, func(i, j int) bool { return pts[i].b < pts[j].b })
		curves[name] = pts
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return func(model string, b int) (time.Duration, bool) {
		pts := curves[model]
		if len(pts) == 0 || b < 1 {
			return 0, false
		}
		if len(pts) == 1 {
			return pts[0].l, true
		}
		i := sort.Search(len(pts), func(i int) bool { return pts[i].b >= b })
		switch {
		case i < len(pts) && pts[i].b == b:
			return pts[i].l, true
		case i == 0:
			i = 1
		case i == len(pts):
			i = len(pts) - 1
		}
		a, c := pts[i-1], pts[i]
		l := a.l + time.Duration(float64(c.l-a.l)*float64(b-a.b)/float64(c.b-a.b))
		return max(l, 0), true
	}, nil
}

// tensorList says tensors as the log shows them: input FP32[-1 3 64 64].
func tensorList(ts []*pb.ModelMetadataResponse_TensorMetadata) string {
	var out []string
	for _, t := range ts {
		out = append(out, fmt.Sprintf("%s %s%v", t.Name, t.Datatype, t.Shape))
	}
	return strings.Join(out, ", ")
}

// grpcAddr says a listener's address as a client dials it: host:port, or
// unix:/PATH.
func grpcAddr(lis net.Listener) string {
	if a := lis.Addr(); a.Network() == "unix" {
		return "unix:" + a.String()
	}
	return lis.Addr().String()
}
