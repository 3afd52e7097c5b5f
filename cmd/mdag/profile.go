package main

import (
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

func runProfile(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("profile", "(--models models.yaml --model NAME [--executor onnx|kserve|opencv|emulated] | --op NAME [--params YAML] [--boxes N]) "+
		"--worker-type T --price P [--target MODULE] [--frame WxH,...] [--batches 1,2,4,8] [--concurrency 1,2] [--iterations N] [--duration D] [--warmup N] "+
		"[--serf [--check]] [--quantile p99] [--append FILE | -o yaml|json]", stderr)
	models := fs.String("models", "", "the model registry (models.yaml) that names the model (not needed with --executor emulated)")
	model := fs.String("model", "", "the registry `model` to profile (this or --op)")
	op := fs.String("op", "", "the CPU `op` to profile instead of a model ("+strings.Join(ops().Implemented(), ", ")+"): each in-flight slot runs a batch's items one at a time, as a worker does")
	params := fs.String("params", "", "with --op: the op's params as a YAML mapping, e.g. '{classes: [face]}' (default: none, the op's defaults)")
	boxes := fs.Int("boxes", 0, "with --op: detections (class object) on each input item, for ops that read them (crop, count, track)")
	target := fs.String("target", "", "the profile's target: the app's module name (default: the model or op name)")
	executor := fs.String("executor", "onnx", "the executor that runs it: onnx (ONNX Runtime), kserve (an Open Inference Protocol server: the registry's endpoint), opencv (OpenCV DNN, full build) or emulated (l(b) from --emulated-latency)")
	device := fs.String("device", "cpu", "with --executor onnx: cpu or cuda")
	shm := fs.String("shared-memory", "auto", "with --executor kserve: auto, on or off (the system shared memory extension; a model's kserve.shared_memory overrides it)")
	lib := fs.String("ort-lib", onnx.DefaultLib(), "with --executor onnx: the ONNX Runtime shared library (env "+onnx.LibEnv+"; make deps installs it)")
	spin := fs.Bool("spin", true, "with --executor onnx: let ONNX Runtime's intra-op threads spin while waiting for work (its default); --spin=false frees idle cores")
	intra := fs.Int("intra-threads", 1, "with --executor onnx: intra-op threads per session for the sweep (0: ONNX Runtime's default, the cores); --serf measures several")
	batches, conc := intsFlag{1, 2, 4, 8}, intsFlag{1, 2}
	fs.Var(&batches, "batches", "batch sizes to measure, comma-separated (capped at the model's max_batch; with --op default 1)")
	fs.Var(&conc, "concurrency", "batches in flight at once to measure, comma-separated (the onnx executor gets that many sessions)")
	iters := fs.Int("iterations", 20, "measured batches per in-flight slot at each point")
	dur := fs.Duration("duration", 4*time.Second, "at most this long measuring one point (0: no bound; each slot runs at least one batch)")
	warmup := fs.Int("warmup", 2, "batches per slot before each point's measurement")
	emuLat := fs.String("emulated-latency", "1ms,4ms", "with --executor emulated: `ALPHA,BETA` of its batch time l(b) = ALPHA*b + BETA")
	frames := frameList{{W: 640, H: 480}}
	fs.Var(&frames, "frame", "input frame sizes `WxH`, comma-separated: one profile (frame: WxH) per size (the executor resizes each frame to the model's input, as for live frames)")
	wtype := fs.String("worker-type", "", "the worker `type` the profile is for (required)")
	price := fs.Float64("price", 0, "the worker type's price in dollars per hour (required; with --append, default the file's for this type)")
	cpus := fs.Int("cpus", runtime.NumCPU(), "the worker type's CPUs (the cores --serf divides; with --append, default the file's for this type)")
	gpuName := fs.String("gpu", "", "the worker type's GPU model, written as gpu: NAME, gpus: 1 (GPU modules are placed on it); empty: a CPU worker type (with --append, default the file's for this type)")
	quantile := fs.String("quantile", "p99", "the quantile the written plan: line tells the planner to plan on: p99 (each point's p99) or p50 (its latency)")
	appendTo := fs.String("append", "", "add this run's profiles to `FILE`, a profiles document mdag profile wrote, and rewrite it in place (its header lists every command that wrote it); a FILE that does not exist is created")
	doSerf := fs.Bool("serf", false, "SERF for CPU worker types: measure mu_i at parallelism i = 1..cpus/t for each intra-op thread count t and write SERF's operating points instead of the sweep's")
	threads := intsFlag{}
	fs.Var(&threads, "threads", "with --serf: the intra-op thread counts (default 1,2,4,... up to --cpus)")
	budget := fs.Duration("budget", 0, "with --serf: the mean latency an operating point may have (0: none, only --max-rho bounds the rate)")
	maxRho := fs.Float64("max-rho", 0.85, "with --serf: the highest utilisation lambda/(c mu_c) an operating point is offered at")
	check := fs.Bool("check", false, "with --serf: also offer each (c, t) Poisson load at rho 0.3, 0.5, 0.7, 0.85 and compare the measured mean latency with SERF's (stderr table; -o json has it)")
	checkDur := fs.Duration("check-duration", 8*time.Second, "with --check: the length of each load level")
	seed := fs.Uint64("seed", 1, "with --check: the Poisson arrivals' seed")
	gap := fs.Duration("gap", 0, "with --serf: an idle pause after each profiling request, so that mu_i is measured on cores left idle as under open-loop load (0: back to back, as SERF profiles)")
	remeasure := fs.Int("remeasure", 0, "with --check: measure each (c, t)'s mu_1..mu_c again (this many requests per slot) just before its load levels and predict with those (0: use the profiled rates)")
	out := fs.String("o", "yaml", "output `format`: yaml (a profiles document for validate and allocate) or json")
	if code, ok := parseFlags(fs, args); !ok {
		return code
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	usageErr := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "mdag profile: "+format+"\n", a...)
		return exitInvalid
	}
	// --append: the file's worker type fills the flags not given
	var old []byte
	if *appendTo != "" && *out != "yaml" {
		return usageErr("--append rewrites a profiles document (YAML): -o %s does not apply", *out)
	}
	if *appendTo != "" {
		var err error
		old, err = os.ReadFile(*appendTo)
		switch {
		case errors.Is(err, os.ErrNotExist):
			// a new file: the run's document, written there
			if st, err := os.Stat(filepath.Dir(*appendTo)); err != nil || !st.IsDir() {
				return usageErr("--append %s: no such directory %s", *appendTo, filepath.Dir(*appendTo))
			}
		case err != nil:
			return usageErr("--append: %v", err)
		}
	}
	if old != nil {
		of, err := profile.Parse(*appendTo, old)
		if err != nil {
			printErrors(stderr, err)
			return exitInvalid
		}
		if w, ok := of.Worker(profile.WorkerTypeID(*wtype)); ok {
			if !set["price"] {
				*price = w.Price
			}
			if !set["cpus"] {
				*cpus = w.CPUs
			}
			if !set["gpu"] {
				*gpuName = w.GPU
			}
		}
	}
	switch {
	case *model == "" && *op == "":
		return usageErr("--model is required (or --op to profile a CPU op)")
	case *model != "" && *op != "":
		return usageErr("--model and --op: profile one model or one op per run (--append adds to a file)")
	case *wtype == "":
		return usageErr("--worker-type is required: the worker type the profile is for")
	case *price <= 0:
		return usageErr("--price must be > 0 dollars per hour, got %g", *price)
	case *out != "yaml" && *out != "json":
		return usageErr("-o %q: want yaml or json", *out)
	case *quantile != string(profile.P50) && *quantile != string(profile.P99):
		return usageErr("--quantile %q: want p50 or p99", *quantile)
	case *cpus < 1:
		return usageErr("--cpus %d: must be >= 1", *cpus)
	case *iters < 1:
		return usageErr("--iterations %d: must be >= 1", *iters)
	case *boxes < 0:
		return usageErr("--boxes %d: must be >= 0", *boxes)
	case !(*maxRho > 0 && *maxRho < 1):
		return usageErr("--max-rho %g: must be in (0, 1)", *maxRho)
	case *check && !*doSerf:
		return usageErr("--check checks SERF's predictions: it needs --serf")
	case *doSerf && *executor == "emulated":
		return usageErr("--serf measures interference between concurrent requests on CPU cores; the emulated executor has none (use --executor onnx)")
	case *doSerf && len(frames) > 1:
		return usageErr("--serf measures at one --frame size, got %s", frames.String())
	case *op != "" && *doSerf:
		return usageErr("--serf measures a model's intra-op threads; --op runs a CPU op (no --serf)")
	case *op != "" && (set["executor"] || set["models"]):
		return usageErr("--op runs the CPU op itself: --executor and --models are for --model")
	case *op == "" && (*params != "" || *boxes > 0):
		return usageErr("--params and --boxes are for --op")
	}
	name := *model
	if *op != "" {
		name = *op
		if !set["batches"] {
			batches = intsFlag{1}
		}
	}
	if *target == "" {
		*target = name
	}
	w := profile.WorkerType{Type: profile.WorkerTypeID(*wtype), Price: *price, CPUs: *cpus}
	if *gpuName != "" {
		w.GPU, w.GPUs = *gpuName, 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	tty := isTerminal(stderr)
	doc := measure.Document{Plan: &profile.Plan{Quantile: profile.Quantile(*quantile)}, Worker: w,
		Header: []string{commandLine(args) + " (" + time.Now().UTC().Format(time.RFC3339) + ")"}}
	res := profileOutput{Worker: w}

	so := sweepOptions{batches: batches, conc: conc, iters: *iters, dur: *dur, warmup: *warmup}
	if tty {
		so.progress = func(done, total int, p measure.Point) {
			fmt.Fprintf(stderr, "\r%s %d/%d  b=%d c=%d p50 %s p99 %s %.1f items/s   ", bar(done, total, 20), done, total,
				p.Batch, p.Concurrency, msStr(p.P50), msStr(p.P99), p.Throughput)
			if done == total {
				fmt.Fprintln(stderr)
			}
		}
	}
	var code int
	if *op != "" {
		code = profileOp(ctx, *op, *params, *boxes, *target, frames, so, &doc, &res, usageErr, stderr)
	} else {
		mo := modelOptions{models: *models, model: *model, target: *target, executor: *executor, device: *device, shm: *shm, lib: *lib,
			spin: *spin, intra: *intra, emuLat: *emuLat, cpus: *cpus, frames: frames}
		var factory measure.Factory
		if factory, so.batches, code = modelFactory(mo, batches, usageErr, stderr); factory == nil {
			return code
		}
		if !*doSerf {
			code = profileSweeps(ctx, factory, mo, so, &doc, &res, stderr)
		} else {
			code = profileSerf(ctx, factory, mo, serfFlags{threads: threads, iters: *iters, warmup: *warmup, gap: *gap, budget: *budget, maxRho: *maxRho,
				check: *check, checkDur: *checkDur, seed: *seed, remeasure: *remeasure, tty: tty}, &doc, &res, stderr)
		}
	}
	if code != exitOK {
		return code
	}
	return writeProfile(doc, res, *appendTo, old, *out, stdout, stderr)
}

// sweepOptions are the sweep flags shared by models and ops.
type sweepOptions struct {
	batches, conc intsFlag
	iters, warmup int
	dur           time.Duration
	progress      func(done, total int, p measure.Point)
}

func (so sweepOptions) options(name string, items func(n int) []*media.Item) measure.Options {
	o := measure.Options{Model: name, Batches: so.batches, Concurrency: so.conc, Iterations: so.iters, Duration: so.dur,
		Warmup: so.warmup, Items: items, Progress: so.progress}
	if so.warmup == 0 {
		o.Warmup = -1 // none (0 is the default, 2)
	}
	return o
}

// modelOptions are the flags of a model's profile.
type modelOptions struct {
	models, model, target, executor, device, shm, lib, emuLat string
	spin                                                      bool
	intra, cpus                                               int
	frames                                                    frameList
}

// modelFactory builds the executor factory for --model and the batch sizes
// it can run (the model's max_batch); on a problem it has said what.
func modelFactory(mo modelOptions, batches intsFlag, usageErr func(string, ...any) int, stderr io.Writer) (measure.Factory, intsFlag, int) {
	var factory measure.Factory
	maxBatch := 0
	switch mo.executor {
	case "emulated":
		a, b, ok := strings.Cut(mo.emuLat, ",")
		alpha, err1 := time.ParseDuration(strings.TrimSpace(a))
		beta, err2 := time.ParseDuration(strings.TrimSpace(b))
		if !ok || err1 != nil || err2 != nil || alpha < 0 || beta < 0 || alpha+beta <= 0 {
			return nil, nil, usageErr("--emulated-latency %q: want ALPHA,BETA durations, e.g. 1ms,4ms", mo.emuLat)
		}
		name := mo.model
		factory = func(int, int) (gpu.Executor, func(), error) {
			return gpu.NewEmulated(clock.Real{}, func(m string, n int) (time.Duration, bool) {
				return alpha*time.Duration(n) + beta, m == name
			}), func() {}, nil
		}
	case "kserve":
		reg, m, code := profileEntry(mo.models, mo.model, mo.executor, "kserve", usageErr, stderr)
		if m == nil {
			return nil, nil, code
		}
		maxBatch = m.MaxBatch
		one := &registry.Registry{File: reg.File, Models: map[string]*registry.Model{mo.model: m}}
		factory = func(_, n int) (gpu.Executor, func(), error) {
			x, err := kserve.New(one, kserve.Config{SharedMemory: mo.shm, Slots: n})
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
	case "onnx", "opencv":
		reg, m, code := profileEntry(mo.models, mo.model, mo.executor, "onnx", usageErr, stderr)
		if m == nil {
			return nil, nil, code
		}
		maxBatch = m.MaxBatch
		if err := reg.CheckFiles(); err != nil {
			// only this model's problems matter (each line is file:line: models.NAME.field: ...)
			var mine []string
			for _, l := range strings.Split(err.Error(), "\n") {
				if strings.Contains(l, " models."+mo.model+".") {
					mine = append(mine, l)
				}
			}
			if len(mine) > 0 {
				printErrors(stderr, fmt.Errorf("%s", strings.Join(mine, "\n")))
				return nil, nil, exitFailure
			}
		}
		if mo.executor == "onnx" {
			one := &registry.Registry{File: reg.File, Models: map[string]*registry.Model{mo.model: m}}
			factory = func(t, n int) (gpu.Executor, func(), error) {
				x, err := onnx.New(one, onnx.Config{Lib: mo.lib, Device: mo.device, IntraThreads: t, Sessions: n, NoSpin: !mo.spin})
				if err != nil {
					return nil, nil, err
				}
				return x, x.Close, nil
			}
		} else {
			mf := gpu.ModelFile{Name: mo.model, Decoder: m.Decoder.Name, Path: m.Path}
			factory = func(_, n int) (gpu.Executor, func(), error) {
				return newExecutor("opencv", []gpu.ModelFile{mf}, n)
			}
		}
	default:
		return nil, nil, usageErr("--executor %q: want onnx, kserve, opencv or emulated", mo.executor)
	}
	if maxBatch > 0 {
		var kept intsFlag
		for _, b := range batches {
			if b <= maxBatch {
				kept = append(kept, b)
			}
		}
		if len(kept) == 0 {
			return nil, nil, usageErr("--batches %s: all above model %s's max_batch %d", batches.String(), mo.model, maxBatch)
		}
		batches = kept
	}
	return factory, batches, exitOK
}

// profileSweeps measures the model at every frame size: one entry each.
func profileSweeps(ctx context.Context, factory measure.Factory, mo modelOptions, so sweepOptions, doc *measure.Document, res *profileOutput, stderr io.Writer) int {
	maxConc := slices.Max(so.conc)
	x, release, err := factory(mo.intra, maxConc)
	if err != nil {
		fmt.Fprintf(stderr, "mdag profile: %v\n", err)
		return exitFailure
	}
	defer release()
	note := "latency = p50 batch time, p99 = its 99th percentile, throughput = measured items/s"
	if mo.executor == "onnx" {
		note += fmt.Sprintf("; intra-op threads per session: %d (0: ONNX Runtime's default), sessions: %d", mo.intra, maxConc)
	}
	doc.Header = append(doc.Header, "  "+note)
	for _, f := range mo.frames {
		load := loadAverage()
		sw, err := measure.Sweep(ctx, x, so.options(mo.model, func(n int) []*media.Item { return measure.Frames(n, f.W, f.H) }))
		if err != nil {
			fmt.Fprintf(stderr, "mdag profile: %v\n", err)
			return exitFailure
		}
		sw.Frame = f.String()
		res.Sweeps = append(res.Sweeps, sw)
		doc.Entries = append(doc.Entries, sweepEntry(sw, mo.target, doc.Worker.Type, f,
			fmt.Sprintf("model %s on %s at %s: %d points in %.1fs%s", mo.model, sw.Executor, f, len(sw.Points), sw.Elapsed.Seconds(), loadNote(load))))
	}
	res.Sweep = res.Sweeps[0]
	return exitOK
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
func profileOp(ctx context.Context, op, params string, boxes int, target string, frames frameList, so sweepOptions,
	doc *measure.Document, res *profileOutput, usageErr func(string, ...any) int, stderr io.Writer) int {
	var raw map[string]any
	if params != "" {
		if err := yaml.Unmarshal([]byte(params), &raw); err != nil || raw == nil {
			return usageErr("--params %q: want a YAML mapping such as '{classes: [face]}'", params)
		}
	}
	proc, err := ops().New(modules.OpID(op), raw)
	if err != nil {
		return usageErr("--op %s: %v", op, err)
	}
	defer proc.Close()
	doc.Header = append(doc.Header, fmt.Sprintf("  op %s, detections per item: %d; latency = p50 time of a batch's items one after another, p99 = its 99th percentile, throughput = measured items/s", op, boxes))
	for _, f := range frames {
		items := func(n int) []*media.Item {
			its := measure.Frames(n, f.W, f.H)
			for _, it := range its {
				it.Boxes = measure.Detections(f.W, f.H, boxes)
			}
			return its
		}
		load := loadAverage()
		sw, err := measure.SweepOp(ctx, proc, so.options(op, items))
		if err != nil {
			fmt.Fprintf(stderr, "mdag profile: %v\n", err)
			return exitFailure
		}
		sw.Frame = f.String()
		res.Sweeps = append(res.Sweeps, sw)
		doc.Entries = append(doc.Entries, sweepEntry(sw, target, doc.Worker.Type, f,
			fmt.Sprintf("op %s at %s: %d points in %.1fs%s", op, f, len(sw.Points), sw.Elapsed.Seconds(), loadNote(load))))
	}
	res.Sweep = res.Sweeps[0]
	return exitOK
}

// serfFlags are --serf's flags.
type serfFlags struct {
	threads       intsFlag
	iters, warmup int
	remeasure     int
	gap, budget   time.Duration
	checkDur      time.Duration
	maxRho        float64
	check, tty    bool
	seed          uint64
}

// profileSerf writes SERF's operating points (one frame size).
func profileSerf(ctx context.Context, factory measure.Factory, mo modelOptions, sf serfFlags, doc *measure.Document, res *profileOutput, stderr io.Writer) int {
	f := mo.frames[0]
	items := func(n int) []*media.Item { return measure.Frames(n, f.W, f.H) }
	so := measure.SerfOptions{Model: mo.model, Cores: mo.cpus, Threads: sf.threads, Iterations: sf.iters, Warmup: sf.warmup, Gap: sf.gap, Items: items}
	if sf.warmup == 0 {
		so.Warmup = -1 // none (0 is the default, 2)
	}
	if sf.tty {
		so.Progress = func(t, i int, mu float64) {
			fmt.Fprintf(stderr, "serf: t=%d i=%d mu=%.2f/s\n", t, i, mu)
		}
	}
	rates, err := measure.Rates(ctx, factory, so)
	if err != nil {
		fmt.Fprintf(stderr, "mdag profile: %v\n", err)
		return exitFailure
	}
	cfgs, err := serf.Configs(rates, mo.cpus)
	if err != nil {
		fmt.Fprintf(stderr, "mdag profile: %v\n", err)
		return exitFailure
	}
	ops, err := serf.OperatingPoints(cfgs, sf.budget, sf.maxRho)
	if err != nil {
		fmt.Fprintf(stderr, "mdag profile: %v\n", err)
		return exitFailure
	}
	res.Rates, res.Serf = rates, ops
	doc.Header = append(doc.Header, fmt.Sprintf("  SERF (M/D_interf/c) operating points, batch 1, %d cpus, rho <= %g, budget %v", mo.cpus, sf.maxRho, sf.budget),
		"  each point: concurrency = c requests in service, latency = predicted mean at throughput = lambda;",
		"  the worker must run the model with the point's t intra-op threads per session (comment)")
	entry := measure.Entry{Profile: profile.Profile{Target: mo.target, Worker: doc.Worker.Type, Frame: f}}
	for _, r := range rates {
		mus := make([]string, len(r.Mu))
		for i, mu := range r.Mu {
			mus[i] = strconv.FormatFloat(mu, 'f', 2, 64)
		}
		entry.Header = append(entry.Header, fmt.Sprintf("t=%d: mu_1..mu_%d = %s /s", r.Threads, len(r.Mu), strings.Join(mus, ", ")))
	}
	for _, op := range ops {
		entry.Profile.Points = append(entry.Profile.Points, op.Point)
		entry.Comments = append(entry.Comments, fmt.Sprintf("t=%d intra-op threads, rho %.2f", op.Config.T, op.Prediction.Rho))
	}
	doc.Entries = append(doc.Entries, entry)
	if sf.check {
		rows, err := measure.Check(ctx, factory, cfgs, measure.CheckOptions{Model: mo.model, Duration: sf.checkDur, Seed: sf.seed, Items: items, Remeasure: sf.remeasure, Gap: sf.gap,
			Progress: func(r measure.CheckRow) {
				if sf.tty {
					fmt.Fprintf(stderr, "check %s rho %.2f: measured %s predicted %s (%+.1f%%)\n", r.Config, r.Rho, msStr(r.Observed.Mean), msStr(r.Predicted), 100*r.Error)
				}
			}})
		if err != nil {
			fmt.Fprintf(stderr, "mdag profile: %v\n", err)
			return exitFailure
		}
		res.Check = rows
		writeCheckTable(stderr, rows)
	}
	return exitOK
}

// writeProfile prints the document (YAML or JSON), or with --append adds
// it to the file and rewrites that in place.
func writeProfile(doc measure.Document, res profileOutput, appendTo string, old []byte, format string, stdout, stderr io.Writer) int {
	if appendTo != "" {
		data, verb := doc.YAML(), "wrote %d profiles to %s (a new file)\n"
		if old != nil {
			var err error
			if data, err = doc.AppendTo(appendTo, old); err != nil {
				printErrors(stderr, err)
				return exitFailure
			}
			verb = "added %d profiles to %s\n"
		} else if _, err := profile.Parse(appendTo, data); err != nil {
			fmt.Fprintf(stderr, "mdag profile: the written profile does not parse: %v\n%s", err, data)
			return exitFailure
		}
		if err := writeFileAtomic(appendTo, data); err != nil {
			fmt.Fprintf(stderr, "mdag profile: %v\n", err)
			return exitFailure
		}
		fmt.Fprintf(stderr, "mdag profile: "+verb, len(doc.Entries), appendTo)
		return exitOK
	}
	data := doc.YAML()
	f, err := profile.Parse("mdag-profile.yaml", data)
	if err != nil {
		// a bug here, not the user's: the document must parse as written
		fmt.Fprintf(stderr, "mdag profile: the written profile does not parse: %v\n%s", err, data)
		return exitFailure
	}
	if format == "json" {
		res.Profile, res.YAML = *f, string(data)
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(res); err != nil {
			fmt.Fprintf(stderr, "mdag profile: %v\n", err)
			return exitFailure
		}
		return exitOK
	}
	stdout.Write(data)
	return exitOK
}

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

// profileEntry loads the registry and the entry --model names, which must
// be of the format the executor runs; on a problem it has said what (and
// returns a nil entry and the exit code).
func profileEntry(models, model, executor, format string, usageErr func(string, ...any) int, stderr io.Writer) (*registry.Registry, *registry.Model, int) {
	if models == "" {
		return nil, nil, usageErr("--executor %s needs --models models.yaml (the registry that names --model)", executor)
	}
	reg, err := registry.Load(models)
	if err != nil {
		printErrors(stderr, err)
		return nil, nil, exitInvalid
	}
	m, err := reg.Get(model)
	if err != nil {
		return nil, nil, usageErr("%v", err)
	}
	if m.Format != format {
		other := map[string]string{"onnx": "kserve", "kserve": "onnx"}[m.Format]
		return nil, nil, usageErr("model %s is format %s: --executor %s runs format: %s entries; profile it with --executor %s", model, m.Format, executor, format, other)
	}
	return reg, m, exitOK
}
