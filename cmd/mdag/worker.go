package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/mdag/mdag/gpu"
	"github.com/mdag/mdag/gpu/nvml"
	"github.com/mdag/mdag/gpu/onnx"
	"github.com/mdag/mdag/internal/pki"
	"github.com/mdag/mdag/remote/client"
)

// `mdag worker` is one instance of a worker type: it registers with the
// coordinator over gRPC and runs the modules it is given on its executor,
// reconnecting when the coordinator goes away.

const workerSynopsis = "--type TYPE [flags]"

func runWorker(args []string, stdout, stderr io.Writer) int {
	return execute("worker", workerSynopsis, new(workerCmd), args, stdout, stderr)
}

// workerCmd is mdag worker's options.
type workerCmd struct {
	coord, typ, id    string
	executor, emulate string
	models            []gpu.ModelFile
	onnx              *onnxFlags
	kserve            *kserveFlags
	slowdown          float64
	variance          *varianceFlag
	duration          time.Duration
	verbose           bool
	peer              *peerFlags
	tls               *tlsFlags
	emulated          []string // --emulate's models, by validate
}

func (c *workerCmd) flags(fs *flag.FlagSet) {
	fs.StringVar(&c.coord, "coordinator", "127.0.0.1:7070", "the coordinator's gRPC address: HOST:PORT, or unix:/PATH (the coordinator's Unix socket: it is talked to only when the coordinator runs as this uid or root)")
	fs.StringVar(&c.typ, "type", "", "this worker's type, one of the deployed profiles' worker types (required)")
	host, _ := os.Hostname()
	fs.StringVar(&c.id, "id", fmt.Sprintf("%s-%d", host, os.Getpid()), "instance ID, unique among connected workers "+
		"(with TLS: the certificate's name by default, the only ID the coordinator accepts from it unless it is declared --shared-cert)")
	fs.StringVar(&c.executor, "executor", "emulated", executorHelp)
	decs := strings.Join(decoders(), ", ")
	if decs == "" {
		decs = "none in the " + buildName + " build"
	}
	fs.Func("model", "with --executor opencv: a model as NAME=DECODER:PATH (repeatable), NAME being the app's `model:`; decoders: "+decs, func(s string) error {
		m, err := gpu.ParseModelFile(s)
		if err == nil {
			c.models = append(c.models, m)
		}
		return err
	})
	c.onnx = addONNXFlags(fs)
	c.kserve = addKServeFlags(fs)
	fs.Float64Var(&c.slowdown, "slowdown", 1, "multiply the emulated executor's times (inject ballooning)")
	c.variance = addVarianceFlag(fs)
	fs.StringVar(&c.emulate, "emulate", "", "with --executor onnx or kserve: `MODELS` (comma-separated) that run on the emulated executor instead "+
		"(profiled times; detections echo the synthetic sources' objects), e.g. the detector in front of a real classifier")
	fs.DurationVar(&c.duration, "duration", 0, "stop after this long (0: run until interrupted)")
	fs.BoolVar(&c.verbose, "v", false, "log debug events")
	c.peer = addPeerFlags(fs)
	c.tls = addTLSFlags(fs, true)
}

func (c *workerCmd) validate(fs *flag.FlagSet) []error {
	var errs []error
	if c.typ == "" {
		errs = append(errs, errors.New("--type is required"))
	}
	if err := checkExecutor(c.executor, fs, c.onnx, c.kserve, c.models, true); err != nil {
		errs = append(errs, err)
	}
	c.emulated = splitList(c.emulate)
	if len(c.emulated) > 0 && c.executor != "onnx" && c.executor != "kserve" {
		errs = append(errs, fmt.Errorf("--emulate routes some models of a real executor to the emulated one: it needs --executor onnx or kserve, not %s", c.executor))
	}
	if c.executor != "emulated" && len(c.emulated) == 0 {
		if err := c.variance.only("--executor " + c.executor + " (without --emulate)"); err != nil {
			errs = append(errs, err)
		}
	}
	if c.slowdown <= 0 {
		errs = append(errs, fmt.Errorf("--slowdown %g: want > 0", c.slowdown))
	}
	mode, err := c.tls.mode("--coordinator", c.coord)
	if err != nil {
		errs = append(errs, err)
	}
	return append(errs, c.peer.check(c.coord, mode == mutualTLS)...)
}

// workerParts are what a worker serves with.
type workerParts struct {
	exec *builtExecutor
	cc   *grpc.ClientConn
	dp   *client.DataPlane
	log  *slog.Logger
}

func (c *workerCmd) run(env *cmdEnv) error {
	var td teardown
	defer td.run()
	w, err := c.build(env, &td)
	if err != nil {
		return err
	}
	ctx, cancel := runContext(c.duration)
	defer cancel()
	if err := c.serve(ctx, w); err != nil {
		return err
	}
	fmt.Fprintf(env.stdout, "worker %s stopped\n", c.id)
	return nil
}

// build readies the executor, the connection to the coordinator (with
// TLS, the ID is the certificate's name unless --id says otherwise) and
// the data plane. td closes them.
func (c *workerCmd) build(env *cmdEnv, td *teardown) (*workerParts, error) {
	bx, err := buildExecutor(c.executor, env.fs, c.onnx, c.kserve, c.models, true)
	if err != nil {
		return nil, invalid(err)
	}
	td.add(bx.close)
	w := &workerParts{exec: bx, log: newLogger(env.stderr, c.verbose).With("worker", c.id)}
	describeExecutor(bx, w.log)
	cc, mat, err := c.tls.dial(pki.Worker, c.coord, w.log)
	if err != nil {
		return nil, invalid(err)
	}
	td.add(func() { cc.Close() })
	w.cc = cc
	if mat != nil && !flagGiven(env.fs, "id") {
		// the coordinator binds a worker's ID to its certificate's name
		if _, name, err := pki.RoleOf(mat.Certificate()); err == nil {
			c.id = name
			w.log = newLogger(env.stderr, c.verbose).With("worker", c.id)
		}
	}
	dp, stopPeer, err := c.peer.start(c.id, c.coord, mat, w.log)
	if err != nil {
		return nil, invalid(err)
	}
	td.add(stopPeer)
	w.dp = dp
	return w, nil
}

// describeExecutor logs what a real executor runs; the kserve executor's
// servers may come up after the worker: it says if they are not serving
// yet (RunWorker probes them before registering and while connected).
func describeExecutor(bx *builtExecutor, log *slog.Logger) {
	if x, ok := bx.exec.(*onnx.Executor); ok {
		log.Info("onnx executor", "runs", x.Describe())
	}
	if bx.kserve != nil {
		if err := checkServers(bx.kserve); err != nil {
			log.Warn("kserve executor: not serving yet", "err", err)
		}
		log.Info("kserve executor", "runs", bx.kserve.Describe())
	}
}

// serve registers with the coordinator and serves it until ctx ends; it
// reconnects with backoff when the stream breaks, and gives up on what
// retrying cannot fix.
func (c *workerCmd) serve(ctx context.Context, w *workerParts) error {
	cfg := client.WorkerConfig{ID: c.id, Type: c.typ, Exec: w.exec.exec, Ops: ops(), Log: w.log, Slowdown: c.slowdown,
		Variance: c.variance.v, Emulate: c.emulated, Data: w.dp}
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		start := time.Now()
		cfg.GPU = nvml.Telemetry().Summary()
		err := client.RunWorker(ctx, w.cc, cfg)
		if ctx.Err() != nil {
			break
		}
		if workerRefused(err) {
			return invalid(err)
		}
		if time.Since(start) > 10*time.Second {
			backoff = 100 * time.Millisecond
		}
		if strings.HasPrefix(err.Error(), "not registering: ") {
			w.log.Warn("executor not serving; retrying", "err", err, "in", backoff)
		} else {
			w.log.Warn("disconnected; reconnecting", "err", c.tls.explain(err), "in", backoff)
		}
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
		}
		backoff = min(2*backoff, 2*time.Second) // a restarted coordinator is found within 2 s of being back
	}
	return nil
}

// workerRefused says whether the coordinator refused the worker for good: a
// bad registration, an ID taken, or one its certificate may not claim.
func workerRefused(err error) bool {
	switch status.Code(errors.Unwrap(err)) {
	case codes.InvalidArgument, codes.AlreadyExists, codes.PermissionDenied:
		return true
	}
	return status.Code(err) == codes.InvalidArgument
}
