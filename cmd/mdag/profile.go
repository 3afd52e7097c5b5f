package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/mdag/mdag/gpu"
	"github.com/mdag/mdag/gpu/kserve"
	"github.com/mdag/mdag/gpu/onnx"
	"github.com/mdag/mdag/gpu/registry"
	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/media"
	"github.com/mdag/mdag/modules"
	"github.com/mdag/mdag/profile"
	"github.com/mdag/mdag/profile/measure"
	"github.com/mdag/mdag/profile/serf"
	"gopkg.in/yaml.v3"
)

// intsFlag is a comma-separated list of positive integers (--batches 1,2,4).
type intsFlag []int

func (l *intsFlag) String() string {
	s := make([]string, len(*l))
	for i, v := range *l {
		s[i] = strconv.Itoa(v)
	}
	return strings.Join(s, ",")
}

func (l *intsFlag) Set(v string) error {
	var out []int
	for _, f := range strings.Split(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return fmt.Errorf("%q: want positive integers separated by commas, e.g. 1,2,4,8", v)
		}
		out = append(out, n)
	}
	*l = out
	return nil
}

// frameList is a comma-separated list of frame sizes (--frame 320x240,640x480).
type frameList []profile.FrameSize

func (l *frameList) String() string {
	s := make([]string, len(*l))
	for i, f := range *l {
		s[i] = f.String()
	}
	return strings.Join(s, ",")
}

func (l *frameList) Set(v string) error {
	var out frameList
	for _, f := range strings.Split(v, ",") {
		fs, err := profile.ParseFrameSize(f)
		if err != nil {
			return err
		}
		if slices.Contains(out, fs) {
			return fmt.Errorf("%q: frame size %s given twice", v, fs)
		}
		out = append(out, fs)
	}
	*l = out
	return nil
}

// profileOutput is `mdag profile -o json`.
type profileOutput struct {
	Worker profile.WorkerType `json:"worker"`
	// Sweep is the first --frame size's sweep (Sweeps has every size's).
	Sweep   *measure.Result    `json:"sweep,omitempty"`
	Sweeps  []*measure.Result  `json:"sweeps,omitempty"`
	Rates   []serf.Rates       `json:"rates,omitempty"`
	Serf    []serf.Operating   `json:"serf,omitempty"`
	Check   []measure.CheckRow `json:"check,omitempty"`
	Profile profile.File       `json:"profiles"`
	YAML    string             `json:"yaml"`
}

const profileSynopsis = "(--models models.yaml --model NAME [--executor onnx|kserve|opencv|emulated] | --op NAME [--params YAML] [--boxes N]) " +
	"--worker-type T --price P [--target MODULE] [--frame WxH,...] [--batches 1,2,4,8] [--concurrency 1,2] [--iterations N] [--duration D] [--warmup N] " +
	"[--serf [--check]] [--quantile p99] [--append FILE | -o yaml|json]"

func runProfile(args []string, stdout, stderr io.Writer) int {
	return execute("profile", profileSynopsis, new(profileCmd), args, stdout, stderr)
}

// profileCmd is mdag profile's options. A run measures one model (--model,
// on an executor) or one CPU op (--op) in one of three modes, each a
// method: sweepModel (batch x concurrency at each --frame size), sweepOp
// (the same for an op, a batch's items one at a time) and serfPoints
// (--serf: SERF's operating points for a CPU worker type).
type profileCmd struct {
	models, model, op, params, target  string // what is measured
	executor, device, shm, lib, emuLat string // and on what
	boxes, intra                       int
	spin                               bool
	batches, conc                      intsFlag // the sweep
	iters, warmup                      int
	dur                                time.Duration
	frames                             frameList
	wtype, gpuName, quantile           string // the worker type and the document
	appendTo, out                      string
	price                              float64
	cpus                               int
	serf, check                        bool // --serf and its --check
	threads                            intsFlag
	budget, gap, checkDur              time.Duration
	maxRho                             float64
	seed                               uint64
	remeasure                          int

	// filled by validate
	old         []byte         // --append's file as it was; nil: a new file
	opParams    map[string]any // --params
	alpha, beta time.Duration  // --emulated-latency
}

func (c *profileCmd) flags(fs *flag.FlagSet) {
	fs.StringVar(&c.models, "models", "", "the model registry (models.yaml) that names the model (not needed with --executor emulated)")
	fs.StringVar(&c.model, "model", "", "the registry `model` to profile (this or --op)")
	fs.StringVar(&c.op, "op", "", "the CPU `op` to profile instead of a model ("+strings.Join(ops().Implemented(), ", ")+"): each in-flight slot runs a batch's items one at a time, as a worker does")
	fs.StringVar(&c.params, "params", "", "with --op: the op's params as a YAML mapping, e.g. '{classes: [face]}' (default: none, the op's defaults)")
	fs.IntVar(&c.boxes, "boxes", 0, "with --op: detections (class object) on each input item, for ops that read them (crop, count, track)")
	fs.StringVar(&c.target, "target", "", "the profile's target: the app's module name (default: the model or op name)")
	fs.StringVar(&c.executor, "executor", "onnx", "the executor that runs it: onnx (ONNX Runtime), kserve (an Open Inference Protocol server: the registry's endpoint), opencv (OpenCV DNN, full build) or emulated (l(b) from --emulated-latency)")
	fs.StringVar(&c.device, "device", "cpu", "with --executor onnx: cpu or cuda")
	fs.StringVar(&c.shm, "shared-memory", "auto", "with --executor kserve: auto, on or off (the system shared memory extension; a model's kserve.shared_memory overrides it)")
	fs.StringVar(&c.lib, "ort-lib", onnx.DefaultLib(), "with --executor onnx: the ONNX Runtime shared library (env "+onnx.LibEnv+"; make deps installs it)")
	fs.BoolVar(&c.spin, "spin", true, "with --executor onnx: let ONNX Runtime's intra-op threads spin while waiting for work (its default); --spin=false frees idle cores")
	fs.IntVar(&c.intra, "intra-threads", 1, "with --executor onnx: intra-op threads per session for the sweep (0: ONNX Runtime's default, the cores); --serf measures several")
	c.batches, c.conc = intsFlag{1, 2, 4, 8}, intsFlag{1, 2}
	fs.Var(&c.batches, "batches", "batch sizes to measure, comma-separated (capped at the model's max_batch; with --op default 1)")
	fs.Var(&c.conc, "concurrency", "batches in flight at once to measure, comma-separated (the onnx executor gets that many sessions)")
	fs.IntVar(&c.iters, "iterations", 20, "measured batches per in-flight slot at each point")
	fs.DurationVar(&c.dur, "duration", 4*time.Second, "at most this long measuring one point (0: no bound; each slot runs at least one batch)")
	fs.IntVar(&c.warmup, "warmup", 2, "batches per slot before each point's measurement")
	fs.StringVar(&c.emuLat, "emulated-latency", "1ms,4ms", "with --executor emulated: `ALPHA,BETA` of its batch time l(b) = ALPHA*b + BETA")
	c.frames = frameList{{W: 640, H: 480}}
	fs.Var(&c.frames, "frame", "input frame sizes `WxH`, comma-separated: one profile (frame: WxH) per size (the executor resizes each frame to the model's input, as for live frames)")
	fs.StringVar(&c.wtype, "worker-type", "", "the worker `type` the profile is for (required)")
	fs.Float64Var(&c.price, "price", 0, "the worker type's price in dollars per hour (required; with --append, default the file's for this type)")
	fs.IntVar(&c.cpus, "cpus", runtime.NumCPU(), "the worker type's CPUs (the cores --serf divides; with --append, default the file's for this type)")
	fs.StringVar(&c.gpuName, "gpu", "", "the worker type's GPU model, written as gpu: NAME, gpus: 1 (GPU modules are placed on it); empty: a CPU worker type (with --append, default the file's for this type)")
	fs.StringVar(&c.quantile, "quantile", "p99", "the quantile the written plan: line tells the planner to plan on: p99 (each point's p99) or p50 (its latency)")
	fs.StringVar(&c.appendTo, "append", "", "add this run's profiles to `FILE`, a profiles document mdag profile wrote, and rewrite it in place (its header lists every command that wrote it); a FILE that does not exist is created")
	fs.BoolVar(&c.serf, "serf", false, "SERF for CPU worker types: measure mu_i at parallelism i = 1..cpus/t for each intra-op thread count t and write SERF's operating points instead of the sweep's")
	c.threads = intsFlag{}
	fs.Var(&c.threads, "threads", "with --serf: the intra-op thread counts (default 1,2,4,... up to --cpus)")
	fs.DurationVar(&c.budget, "budget", 0, "with --serf: the mean latency an operating point may have (0: none, only --max-rho bounds the rate)")
	fs.Float64Var(&c.maxRho, "max-rho", 0.85, "with --serf: the highest utilisation lambda/(c mu_c) an operating point is offered at")
	fs.BoolVar(&c.check, "check", false, "with --serf: also offer each (c, t) Poisson load at rho 0.3, 0.5, 0.7, 0.85 and compare the measured mean latency with SERF's (stderr table; -o json has it)")
	fs.DurationVar(&c.checkDur, "check-duration", 8*time.Second, "with --check: the length of each load level")
	fs.Uint64Var(&c.seed, "seed", 1, "with --check: the Poisson arrivals' seed")
	fs.DurationVar(&c.gap, "gap", 0, "with --serf: an idle pause after each profiling request, so that mu_i is measured on cores left idle as under open-loop load (0: back to back, as SERF profiles)")
	fs.IntVar(&c.remeasure, "remeasure", 0, "with --check: measure each (c, t)'s mu_1..mu_c again (this many requests per slot) just before its load levels and predict with those (0: use the profiled rates)")
	fs.StringVar(&c.out, "o", "yaml", "output `format`: yaml (a profiles document for validate and allocate) or json")
}

func (c *profileCmd) validate(fs *flag.FlagSet) []error {
	errs := c.readAppend(fs)
	if c.op != "" && !flagGiven(fs, "batches") {
		c.batches = intsFlag{1} // an op's batch is its items one after another
	}
	if c.target == "" {
		c.target = cmp.Or(c.op, c.model)
	}
	errs = append(errs, c.problems()...)
	if c.model != "" {
		errs = append(errs, c.modelProblems()...)
	}
	if c.op != "" {
		errs = append(errs, c.opProblems(fs)...)
	}
	return errs
}

// readAppend reads --append's file, whose entry for --worker-type fills
// --price, --cpus and --gpu where they are not given.
func (c *profileCmd) readAppend(fs *flag.FlagSet) []error {
	if c.appendTo == "" {
		return nil
	}
	var errs []error
	if c.out != "yaml" {
		errs = append(errs, fmt.Errorf("--append rewrites a profiles document (YAML): -o %s does not apply", c.out))
	}
	old, err := os.ReadFile(c.appendTo)
	switch {
	case errors.Is(err, os.ErrNotExist): // a new file: the run's document, written there
		if st, err := os.Stat(filepath.Dir(c.appendTo)); err != nil || !st.IsDir() {
			errs = append(errs, fmt.Errorf("--append %s: no such directory %s", c.appendTo, filepath.Dir(c.appendTo)))
		}
		return errs
	case err != nil:
		return append(errs, fmt.Errorf("--append: %v", err))
	}
	f, err := profile.Parse(c.appendTo, old)
	if err != nil {
		return append(errs, err)
	}
	c.old = old
	if w, ok := f.Worker(profile.WorkerTypeID(c.wtype)); ok {
		if !flagGiven(fs, "price") {
			c.price = w.Price
		}
		if !flagGiven(fs, "cpus") {
			c.cpus = w.CPUs
		}
		if !flagGiven(fs, "gpu") {
			c.gpuName = w.GPU
		}
	}
	return errs
}

// problems are the options' problems in every mode.
func (c *profileCmd) problems() []error {
	return failed(
		problem{c.model == "" && c.op == "", "--model is required (or --op to profile a CPU op)"},
		problem{c.model != "" && c.op != "", "--model and --op: profile one model or one op per run (--append adds to a file)"},
		problem{c.wtype == "", "--worker-type is required: the worker type the profile is for"},
		problem{c.price <= 0, fmt.Sprintf("--price must be > 0 dollars per hour, got %g", c.price)},
		problem{c.out != "yaml" && c.out != "json", fmt.Sprintf("-o %q: want yaml or json", c.out)},
		problem{c.quantile != string(profile.P50) && c.quantile != string(profile.P99), fmt.Sprintf("--quantile %q: want p50 or p99", c.quantile)},
		problem{c.cpus < 1, fmt.Sprintf("--cpus %d: must be >= 1", c.cpus)},
		problem{c.iters < 1, fmt.Sprintf("--iterations %d: must be >= 1", c.iters)},
		problem{c.boxes < 0, fmt.Sprintf("--boxes %d: must be >= 0", c.boxes)},
		problem{!(c.maxRho > 0 && c.maxRho < 1), fmt.Sprintf("--max-rho %g: must be in (0, 1)", c.maxRho)},
		problem{c.check && !c.serf, "--check checks SERF's predictions: it needs --serf"},
		problem{c.serf && c.executor == "emulated", "--serf measures interference between concurrent requests on CPU cores; the emulated executor has none (use --executor onnx)"},
		problem{c.serf && len(c.frames) > 1, "--serf measures at one --frame size, got " + c.frames.String()},
		problem{c.op == "" && (c.params != "" || c.boxes > 0), "--params and --boxes are for --op"},
	)
}

// modelProblems are --model's: the executor and what it needs.
func (c *profileCmd) modelProblems() []error {
	switch c.executor {
	case "emulated":
		a, b, ok := strings.Cut(c.emuLat, ",")
		alpha, err1 := time.ParseDuration(strings.TrimSpace(a))
		beta, err2 := time.ParseDuration(strings.TrimSpace(b))
		if !ok || err1 != nil || err2 != nil || alpha < 0 || beta < 0 || alpha+beta <= 0 {
			return []error{fmt.Errorf("--emulated-latency %q: want ALPHA,BETA durations, e.g. 1ms,4ms", c.emuLat)}
		}
		c.alpha, c.beta = alpha, beta
	case "onnx", "kserve", "opencv":
		if c.models == "" {
			return []error{fmt.Errorf("--executor %s needs --models models.yaml (the registry that names --model)", c.executor)}
		}
	default:
		return []error{fmt.Errorf("--executor %q: want onnx, kserve, opencv or emulated", c.executor)}
	}
	return nil
}

// opProblems are --op's: it runs in this process, on its --params.
func (c *profileCmd) opProblems(fs *flag.FlagSet) []error {
	badParams := c.params != "" && (yaml.Unmarshal([]byte(c.params), &c.opParams) != nil || c.opParams == nil)
	return failed(
		problem{c.serf, "--serf measures a model's intra-op threads; --op runs a CPU op (no --serf)"},
		problem{flagGiven(fs, "executor") || flagGiven(fs, "models"), "--op runs the CPU op itself: --executor and --models are for --model"},
		problem{badParams, fmt.Sprintf("--params %q: want a YAML mapping such as '{classes: [face]}'", c.params)},
	)
}

// profiling is a run's results as they accrue: the profiles document and
// what -o json adds to it.
type profiling struct {
	ctx    context.Context // cancelled by SIGINT: a sweep stops early
	stderr io.Writer       // progress, on a terminal
	doc    measure.Document
	res    profileOutput
}

// profileMode is one of profile's measurements, with what build made for
// it: it adds its entries to the document.
type profileMode func(p *profiling) error

func (c *profileCmd) run(env *cmdEnv) error {
	mode, err := c.build(env.stderr)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	p := c.start(ctx, env)
	if err := mode(p); err != nil {
		return err
	}
	if c.appendTo != "" {
		return c.appendFile(env.stderr, p.doc)
	}
	return c.print(env.stdout, p)
}

// build makes what the measurement runs on, the op's processor or the
// executor factory of --model, and picks the mode (which releases what
// build made for it when it ends).
func (c *profileCmd) build(stderr io.Writer) (profileMode, error) {
	if c.op != "" {
		proc, err := ops().New(modules.OpID(c.op), c.opParams)
		if err != nil {
			return nil, invalidf("--op %s: %v", c.op, err)
		}
		return func(p *profiling) error {
			defer proc.Close()
			return c.sweepOp(p, proc)
		}, nil
	}
	factory, err := c.modelFactory(stderr)
	if err != nil {
		return nil, err
	}
	if c.serf {
		return func(p *profiling) error { return c.serfPoints(p, factory) }, nil
	}
	return func(p *profiling) error { return c.sweepModel(p, factory) }, nil
}

// start begins the document: the worker type, the quantile the plan is
// made on, and the command line that wrote it (with --append, one more
// line of the file's header).
func (c *profileCmd) start(ctx context.Context, env *cmdEnv) *profiling {
	w := profile.WorkerType{Type: profile.WorkerTypeID(c.wtype), Price: c.price, CPUs: c.cpus}
	if c.gpuName != "" {
		w.GPU, w.GPUs = c.gpuName, 1
	}
	doc := measure.Document{Plan: &profile.Plan{Quantile: profile.Quantile(c.quantile)}, Worker: w,
		Header: []string{commandLine(env.args) + " (" + time.Now().UTC().Format(time.RFC3339) + ")"}}
	return &profiling{ctx: ctx, stderr: env.stderr, doc: doc, res: profileOutput{Worker: w}}
}

// modelFactory is the factory of the executors that run --model, one per
// (intra-op threads, sessions) measured; it caps --batches at the model's
// max_batch. The executors are not buildExecutor's, which makes one
// executor of a whole registry from the worker's flags: a sweep needs a
// fresh one per point, of the one model, with --spin and n opencv instances.
func (c *profileCmd) modelFactory(stderr io.Writer) (measure.Factory, error) {
	if c.executor == "emulated" {
		name, alpha, beta := c.model, c.alpha, c.beta
		return func(int, int) (gpu.Executor, func(), error) {
			return gpu.NewEmulated(clock.Real{}, func(m string, n int) (time.Duration, bool) {
				return alpha*time.Duration(n) + beta, m == name
			}), func() {}, nil
		}, nil
	}
	one, m, err := c.registryEntry()
	if err != nil {
		return nil, err
	}
	if err := c.capBatches(m.MaxBatch); err != nil {
		return nil, err
	}
	switch c.executor {
	case "kserve":
		return c.kserveFactory(one, stderr), nil
	case "onnx":
		return func(t, n int) (gpu.Executor, func(), error) {
			x, err := onnx.New(one, onnx.Config{Lib: c.lib, Device: c.device, IntraThreads: t, Sessions: n, NoSpin: !c.spin})
			if err != nil {
				return nil, nil, err
			}
			return x, x.Close, nil
		}, nil
	}
	mf := gpu.ModelFile{Name: c.model, Decoder: m.Decoder.Name, Path: m.Path}
	return func(_, n int) (gpu.Executor, func(), error) {
		return newExecutor("opencv", []gpu.ModelFile{mf}, n)
	}, nil
}

// kserveFactory runs the model on its Open Inference Protocol server, n
// requests in flight; each executor checks the server and says how the
// tensors travel.
func (c *profileCmd) kserveFactory(one *registry.Registry, stderr io.Writer) measure.Factory {
	return func(_, n int) (gpu.Executor, func(), error) {
		x, err := kserve.New(one, kserve.Config{SharedMemory: c.shm, Slots: n})
		if err != nil {
			return nil, nil, err
		}
		if err := checkServers(x); err != nil {
			x.Close()
			return nil, nil, err
		}
		fmt.Fprintf(stderr, "mdag profile: %s\n", x.Describe())
		return x, x.Close, nil
	}
}

// registryEntry loads --models and --model's entry, which must be of the
// format the executor runs (with its files there, for onnx and opencv);
// one is the registry of that entry alone, what an executor loads.
func (c *profileCmd) registryEntry() (one *registry.Registry, m *registry.Model, err error) {
	format := "onnx"
	if c.executor == "kserve" {
		format = "kserve"
	}
	reg, err := registry.Load(c.models)
	if err != nil {
		return nil, nil, invalid(err)
	}
	if m, err = reg.Get(c.model); err != nil {
		return nil, nil, invalid(err)
	}
	if m.Format != format {
		other := map[string]string{"onnx": "kserve", "kserve": "onnx"}[m.Format]
		return nil, nil, invalidf("model %s is format %s: --executor %s runs format: %s entries; profile it with --executor %s", c.model, m.Format, c.executor, format, other)
	}
	if format == "onnx" {
		if err := reg.CheckFiles(); err != nil {
			// only this model's problems matter (each line is file:line: models.NAME.field: ...)
			var mine []string
			for _, l := range strings.Split(err.Error(), "\n") {
				if strings.Contains(l, " models."+c.model+".") {
					mine = append(mine, l)
				}
			}
			if len(mine) > 0 {
				return nil, nil, errors.New(strings.Join(mine, "\n"))
			}
		}
	}
	return &registry.Registry{File: reg.File, Models: map[string]*registry.Model{c.model: m}}, m, nil
}

// capBatches drops the --batches above the model's max_batch (0: none).
func (c *profileCmd) capBatches(maxBatch int) error {
	if maxBatch <= 0 {
		return nil
	}
	var kept intsFlag
	for _, b := range c.batches {
		if b <= maxBatch {
			kept = append(kept, b)
		}
	}
	if len(kept) == 0 {
		return invalidf("--batches %s: all above model %s's max_batch %d", c.batches.String(), c.model, maxBatch)
	}
	c.batches = kept
	return nil
}

// sweepModel is the GPU mode: batch x concurrency on one executor with
// as many sessions as the highest concurrency, at every frame size.
func (c *profileCmd) sweepModel(p *profiling, factory measure.Factory) error {
	maxConc := slices.Max(c.conc)
	x, release, err := factory(c.intra, maxConc)
	if err != nil {
		return err
	}
	defer release()
	note := "latency = p50 batch time, p99 = its 99th percentile, throughput = measured items/s"
	if c.executor == "onnx" {
		note += fmt.Sprintf("; intra-op threads per session: %d (0: ONNX Runtime's default), sessions: %d", c.intra, maxConc)
	}
	p.doc.Header = append(p.doc.Header, "  "+note)
	return c.sweepFrames(p, func(f profile.FrameSize) (*measure.Result, string, error) {
		sw, err := measure.Sweep(p.ctx, x, c.sweepOptions(p, c.model, func(n int) []*media.Item { return measure.Frames(n, f.W, f.H) }))
		if err != nil {
			return nil, "", err
		}
		return sw, fmt.Sprintf("model %s on %s at %s: %d points in %.1fs", c.model, sw.Executor, f, len(sw.Points), sw.Elapsed.Seconds()), nil
	})
}

// sweepOp is the CPU op mode: each in-flight slot runs a batch's items
// one after another, --boxes detections on each, at every frame size.
func (c *profileCmd) sweepOp(p *profiling, proc measure.Processor) error {
	p.doc.Header = append(p.doc.Header, fmt.Sprintf("  op %s, detections per item: %d; latency = p50 time of a batch's items one after another, p99 = its 99th percentile, throughput = measured items/s", c.op, c.boxes))
	return c.sweepFrames(p, func(f profile.FrameSize) (*measure.Result, string, error) {
		items := func(n int) []*media.Item {
			its := measure.Frames(n, f.W, f.H)
			for _, it := range its {
				it.Boxes = measure.Detections(f.W, f.H, c.boxes)
			}
			return its
		}
		sw, err := measure.SweepOp(p.ctx, proc, c.sweepOptions(p, c.op, items))
		if err != nil {
			return nil, "", err
		}
		return sw, fmt.Sprintf("op %s at %s: %d points in %.1fs", c.op, f, len(sw.Points), sw.Elapsed.Seconds()), nil
	})
}

// sweepFrames runs sweep at each --frame size and adds each result as an
// entry, titled as sweep says with the host's load over it (other work on
// the cores is in the times).
func (c *profileCmd) sweepFrames(p *profiling, sweep func(f profile.FrameSize) (*measure.Result, string, error)) error {
	for _, f := range c.frames {
		load := loadAverage()
		sw, title, err := sweep(f)
		if err != nil {
			return err
		}
		sw.Frame = f.String()
		p.res.Sweeps = append(p.res.Sweeps, sw)
		p.doc.Entries = append(p.doc.Entries, sweepEntry(sw, c.target, p.doc.Worker.Type, f, title+loadNote(load)))
	}
	p.res.Sweep = p.res.Sweeps[0]
	return nil
}

// sweepOptions are a sweep's options from the flags, with a progress bar
// on a terminal.
func (c *profileCmd) sweepOptions(p *profiling, name string, items func(n int) []*media.Item) measure.Options {
	o := measure.Options{Model: name, Batches: c.batches, Concurrency: c.conc, Iterations: c.iters, Duration: c.dur,
		Warmup: c.warmups(), Items: items}
	if isTerminal(p.stderr) {
		o.Progress = func(done, total int, pt measure.Point) {
			fmt.Fprintf(p.stderr, "\r%s %d/%d  b=%d c=%d p50 %s p99 %s %.1f items/s   ", bar(done, total, 20), done, total,
				pt.Batch, pt.Concurrency, msStr(pt.P50), msStr(pt.P99), pt.Throughput)
			if done == total {
				fmt.Fprintln(p.stderr)
			}
		}
	}
	return o
}

// warmups is --warmup as measure takes it: there 0 is the default (2), -1 none.
func (c *profileCmd) warmups() int {
	if c.warmup == 0 {
		return -1
	}
	return c.warmup
}

// serfPoints is the SERF mode for CPU worker types: mu_i for each intra-op
// thread count, then SERF's operating points at one frame size, and with
// --check its predictions against offered Poisson load.
func (c *profileCmd) serfPoints(p *profiling, factory measure.Factory) error {
	f := c.frames[0]
	items := func(n int) []*media.Item { return measure.Frames(n, f.W, f.H) }
	so := measure.SerfOptions{Model: c.model, Cores: c.cpus, Threads: c.threads, Iterations: c.iters, Warmup: c.warmups(), Gap: c.gap, Items: items}
	if isTerminal(p.stderr) {
		so.Progress = func(t, i int, mu float64) {
			fmt.Fprintf(p.stderr, "serf: t=%d i=%d mu=%.2f/s\n", t, i, mu)
		}
	}
	rates, err := measure.Rates(p.ctx, factory, so)
	if err != nil {
		return err
	}
	cfgs, err := serf.Configs(rates, c.cpus)
	if err != nil {
		return err
	}
	points, err := serf.OperatingPoints(cfgs, c.budget, c.maxRho)
	if err != nil {
		return err
	}
	p.res.Rates, p.res.Serf = rates, points
	c.serfEntry(p, f, rates, points)
	if !c.check {
		return nil
	}
	rows, err := measure.Check(p.ctx, factory, cfgs, measure.CheckOptions{Model: c.model, Duration: c.checkDur, Seed: c.seed, Items: items, Remeasure: c.remeasure, Gap: c.gap,
		Progress: func(r measure.CheckRow) {
			if isTerminal(p.stderr) {
				fmt.Fprintf(p.stderr, "check %s rho %.2f: measured %s predicted %s (%+.1f%%)\n", r.Config, r.Rho, msStr(r.Observed.Mean), msStr(r.Predicted), 100*r.Error)
			}
		}})
	if err != nil {
		return err
	}
	p.res.Check = rows
	writeCheckTable(p.stderr, rows)
	return nil
}

// serfEntry adds SERF's operating points as the entry, with the rates
// they come from in its header and each point's thread count beside it.
func (c *profileCmd) serfEntry(p *profiling, f profile.FrameSize, rates []serf.Rates, points []serf.Operating) {
	p.doc.Header = append(p.doc.Header, fmt.Sprintf("  SERF (M/D_interf/c) operating points, batch 1, %d cpus, rho <= %g, budget %v", c.cpus, c.maxRho, c.budget),
		"  each point: concurrency = c requests in service, latency = predicted mean at throughput = lambda;",
		"  the worker must run the model with the point's t intra-op threads per session (comment)")
	entry := measure.Entry{Profile: profile.Profile{Target: c.target, Worker: p.doc.Worker.Type, Frame: f}}
	for _, r := range rates {
		mus := make([]string, len(r.Mu))
		for i, mu := range r.Mu {
			mus[i] = strconv.FormatFloat(mu, 'f', 2, 64)
		}
		entry.Header = append(entry.Header, fmt.Sprintf("t=%d: mu_1..mu_%d = %s /s", r.Threads, len(r.Mu), strings.Join(mus, ", ")))
	}
	for _, op := range points {
		entry.Profile.Points = append(entry.Profile.Points, op.Point)
		entry.Comments = append(entry.Comments, fmt.Sprintf("t=%d intra-op threads, rho %.2f", op.Config.T, op.Prediction.Rho))
	}
	p.doc.Entries = append(p.doc.Entries, entry)
}

// appendFile adds the document's profiles to --append's file (or writes
// the document there, a new file) and rewrites it in place.
func (c *profileCmd) appendFile(stderr io.Writer, doc measure.Document) error {
	data, verb := doc.YAML(), "wrote %d profiles to %s (a new file)\n"
	if c.old != nil {
		var err error
		if data, err = doc.AppendTo(c.appendTo, c.old); err != nil {
			return err
		}
		verb = "added %d profiles to %s\n"
	} else if _, err := profile.Parse(c.appendTo, data); err != nil {
		return unparsable(err, data)
	}
	if err := writeFileAtomic(c.appendTo, data); err != nil {
		return err
	}
	fmt.Fprintf(stderr, "mdag profile: "+verb, len(doc.Entries), c.appendTo)
	return nil
}

// print writes the document on stdout: YAML, or with -o json the
// measurements with it.
func (c *profileCmd) print(stdout io.Writer, p *profiling) error {
	data := p.doc.YAML()
	f, err := profile.Parse("mdag-profile.yaml", data)
	if err != nil {
		return unparsable(err, data)
	}
	if c.out != "json" {
		stdout.Write(data)
		return nil
	}
	p.res.Profile, p.res.YAML = *f, string(data)
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(p.res)
}

// unparsable is a document profile wrote that does not parse: a bug here,
// not the user's, so the document goes with it.
func unparsable(err error, data []byte) error {
	return fmt.Errorf("the written profile does not parse: %v\n%s", err, bytes.TrimRight(data, "\n"))
}

// sweepEntry is a sweep's profile entry: its points at frame f, a header
// line and the fits l(b) per concurrency.
func sweepEntry(sw *measure.Result, target string, w profile.WorkerTypeID, f profile.FrameSize, title string) measure.Entry {
	e := measure.Entry{Profile: profile.Profile{Target: target, Worker: w, Frame: f, Points: sw.ProfilePoints()}, Header: []string{title}}
	for _, fit := range sw.Fits {
		sign, beta := "+", fit.Beta
		if beta < 0 {
			sign, beta = "-", -beta
		}
		e.Header = append(e.Header, fmt.Sprintf("concurrency %d: l(b) = %s*b %s %s (R^2 %.4f, %d points)", fit.Concurrency, msStr(fit.Alpha), sign, msStr(beta), fit.R2, fit.Points))
	}
	return e
}

// profileOp measures a CPU op of this binary's registry at every frame
// size: one entry each.

// writeFileAtomic replaces path with data (a temporary file renamed over
// it), keeping path's mode.
func writeFileAtomic(path string, data []byte) error {
	mode := os.FileMode(0o644)
	if st, err := os.Stat(path); err == nil {
		mode = st.Mode().Perm()
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // after the rename, nothing
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// loadAverage is the host's 1-minute load average (Linux), "" elsewhere.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return ""
	}
	return f[0]
}

// loadNote says what the host's load was over a measurement that began at
// load before: other work on the cores is in the times.
func loadNote(before string) string {
	after := loadAverage()
	if before == "" || after == "" {
		return ""
	}
	return fmt.Sprintf(" (host load average %s at the start, %s at the end)", before, after)
}

// commandLine is `mdag profile ARGS` as a shell would take it back.
func commandLine(args []string) string {
	out := []string{"mdag", "profile"}
	for _, a := range args {
		out = append(out, shellQuote(a))
	}
	return strings.Join(out, " ")
}

func shellQuote(s string) string {
	plain := s != ""
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./,:=@+%", r)) {
			plain = false
			break
		}
	}
	if plain {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// writeCheckTable writes SERF's prediction against the measurement as a
// markdown table with the median and worst |error|.
func writeCheckTable(w io.Writer, rows []measure.CheckRow) {
	fmt.Fprintln(w, "| config | mu_1..mu_c (1/s) | rho | lambda (1/s) | requests | service under load (ms) | measured W (ms) | predicted W (ms) | error | W at load's service (ms) | its error |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|")
	for _, r := range rows {
		mus := make([]string, len(r.Config.Mu))
		for i, mu := range r.Config.Mu {
			mus[i] = strconv.FormatFloat(mu, 'f', 1, 64)
		}
		al, ae := "unstable", ""
		if r.AtLoad > 0 {
			al, ae = strconv.FormatFloat(ms(r.AtLoad), 'f', 2, 64), fmt.Sprintf("%+.1f%%", 100*r.AtLoadError)
		}
		fmt.Fprintf(w, "| %s | %s | %.2f | %.2f | %d | %.2f | %.2f +- %.2f | %.2f | %+.1f%% | %s | %s |\n", r.Config, strings.Join(mus, " "), r.Rho, r.Observed.Lambda,
			r.Observed.Requests, ms(r.Observed.Service), ms(r.Observed.Mean), ms(r.Observed.HalfWidth), ms(r.Predicted), 100*r.Error, al, ae)
	}
	med, worst := measure.ErrorSummary(rows)
	fmt.Fprintf(w, "\nmedian |error| %.1f%%, worst %.1f%% over %d load levels\n", 100*med, 100*worst, len(rows))
	var at []measure.CheckRow
	for _, r := range rows {
		if r.AtLoad > 0 {
			at = append(at, measure.CheckRow{Error: r.AtLoadError})
		}
	}
	med, worst = measure.ErrorSummary(at)
	fmt.Fprintf(w, "diagnostic, rates scaled to the service time measured under load: median |error| %.1f%%, worst %.1f%% over %d\n", 100*med, 100*worst, len(at))
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func msStr(d time.Duration) string { return strconv.FormatFloat(ms(d), 'f', 3, 64) + "ms" }

func bar(done, total, width int) string {
	n := done * width / max(total, 1)
	return "[" + strings.Repeat("#", n) + strings.Repeat(" ", width-n) + "]"
}

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
