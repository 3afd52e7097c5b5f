package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/mdag/mdag/gpu"
	"github.com/mdag/mdag/gpu/kserve"
	"github.com/mdag/mdag/gpu/onnx"
	"github.com/mdag/mdag/gpu/registry"
	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/media"
	"github.com/mdag/mdag/profile"
	"github.com/mdag/mdag/profile/measure"
	"github.com/mdag/mdag/profile/serf"
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

// profileOutput is `mdag profile -o json`.
type profileOutput struct {
	Worker  profile.WorkerType `json:"worker"`
	Sweep   *measure.Result    `json:"sweep,omitempty"`
	Rates   []serf.Rates       `json:"rates,omitempty"`
	Serf    []serf.Operating   `json:"serf,omitempty"`
	Check   []measure.CheckRow `json:"check,omitempty"`
	Profile profile.File       `json:"profiles"`
	YAML    string             `json:"yaml"`
}

func runProfile(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("profile", "--models models.yaml --model NAME [--executor onnx|opencv|emulated] --worker-type T --price P "+
		"[--batches 1,2,4,8] [--concurrency 1,2] [--iterations N] [--duration D] [--warmup N] [--serf [--check]] [-o yaml|json]", stderr)
	models := fs.String("models", "", "the model registry (models.yaml) that names the model (not needed with --executor emulated)")
	model := fs.String("model", "", "the registry `model` to profile (required)")
	executor := fs.String("executor", "onnx", "the executor that runs it: onnx (ONNX Runtime), kserve (an Open Inference Protocol server: the registry's endpoint), opencv (OpenCV DNN, full build) or emulated (l(b) from --emulated-latency)")
	device := fs.String("device", "cpu", "with --executor onnx: cpu or cuda")
	shm := fs.String("shared-memory", "auto", "with --executor kserve: auto, on or off (the system shared memory extension; a model's kserve.shared_memory overrides it)")
	lib := fs.String("ort-lib", onnx.DefaultLib(), "with --executor onnx: the ONNX Runtime shared library (env "+onnx.LibEnv+"; make deps installs it)")
	spin := fs.Bool("spin", true, "with --executor onnx: let ONNX Runtime's intra-op threads spin while waiting for work (its default); --spin=false frees idle cores")
	intra := fs.Int("intra-threads", 1, "with --executor onnx: intra-op threads per session for the sweep (0: ONNX Runtime's default, the cores); --serf measures several")
	batches, conc := intsFlag{1, 2, 4, 8}, intsFlag{1, 2}
	fs.Var(&batches, "batches", "batch sizes to measure, comma-separated (capped at the model's max_batch)")
	fs.Var(&conc, "concurrency", "batches in flight at once to measure, comma-separated (the onnx executor gets that many sessions)")
	iters := fs.Int("iterations", 20, "measured batches per in-flight slot at each point")
	dur := fs.Duration("duration", 4*time.Second, "at most this long measuring one point (0: no bound; each slot runs at least one batch)")
	warmup := fs.Int("warmup", 2, "batches per slot before each point's measurement")
	emuLat := fs.String("emulated-latency", "1ms,4ms", "with --executor emulated: `ALPHA,BETA` of its batch time l(b) = ALPHA*b + BETA")
	frame := fs.String("frame", "640x480", "input frame size `WxH` (the executor resizes it to the model's input, as for live frames)")
	wtype := fs.String("worker-type", "", "the worker `type` the profile is for (required)")
	price := fs.Float64("price", 0, "the worker type's price in dollars per hour (required)")
	cpus := fs.Int("cpus", runtime.NumCPU(), "the worker type's CPUs (the cores --serf divides)")
	gpuName := fs.String("gpu", "", "the worker type's GPU model, written as gpu: NAME, gpus: 1 (GPU modules are placed on it); empty: a CPU worker type")
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
	usageErr := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "mdag profile: "+format+"\n", a...)
		return exitInvalid
	}
	switch {
	case *model == "":
		return usageErr("--model is required")
	case *wtype == "":
		return usageErr("--worker-type is required: the worker type the profile is for")
	case *price <= 0:
		return usageErr("--price must be > 0 dollars per hour, got %g", *price)
	case *out != "yaml" && *out != "json":
		return usageErr("-o %q: want yaml or json", *out)
	case *cpus < 1:
		return usageErr("--cpus %d: must be >= 1", *cpus)
	case *iters < 1:
		return usageErr("--iterations %d: must be >= 1", *iters)
	case !(*maxRho > 0 && *maxRho < 1):
		return usageErr("--max-rho %g: must be in (0, 1)", *maxRho)
	case *check && !*doSerf:
		return usageErr("--check checks SERF's predictions: it needs --serf")
	case *doSerf && *executor == "emulated":
		return usageErr("--serf measures interference between concurrent requests on CPU cores; the emulated executor has none (use --executor onnx)")
	}
	var fw, fh int
	if _, err := fmt.Sscanf(*frame, "%dx%d", &fw, &fh); err != nil || fw < 1 || fh < 1 {
		return usageErr("--frame %q: want WxH, e.g. 640x480", *frame)
	}
	items := func(n int) []*media.Item { return measure.Frames(n, fw, fh) }

	maxConc := 0
	for _, c := range conc {
		maxConc = max(maxConc, c)
	}
	// factory builds the executor with t intra-op threads and n sessions.
	var factory measure.Factory
	maxBatch := 0
	switch *executor {
	case "emulated":
		a, b, ok := strings.Cut(*emuLat, ",")
		alpha, err1 := time.ParseDuration(strings.TrimSpace(a))
		beta, err2 := time.ParseDuration(strings.TrimSpace(b))
		if !ok || err1 != nil || err2 != nil || alpha < 0 || beta < 0 || alpha+beta <= 0 {
			return usageErr("--emulated-latency %q: want ALPHA,BETA durations, e.g. 1ms,4ms", *emuLat)
		}
		name := *model
		factory = func(int, int) (gpu.Executor, func(), error) {
			return gpu.NewEmulated(clock.Real{}, func(m string, n int) (time.Duration, bool) {
				return alpha*time.Duration(n) + beta, m == name
			}), func() {}, nil
		}
	case "kserve":
		reg, m, code := profileEntry(*models, *model, *executor, "kserve", usageErr, stderr)
		if m == nil {
			return code
		}
		maxBatch = m.MaxBatch
		one := &registry.Registry{File: reg.File, Models: map[string]*registry.Model{*model: m}}
		factory = func(_, n int) (gpu.Executor, func(), error) {
			x, err := kserve.New(one, kserve.Config{SharedMemory: *shm, Slots: n})
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
		reg, m, code := profileEntry(*models, *model, *executor, "onnx", usageErr, stderr)
		if m == nil {
			return code
		}
		maxBatch = m.MaxBatch
		if err := reg.CheckFiles(); err != nil {
			// only this model's problems matter (each line is file:line: models.NAME.field: ...)
			var mine []string
			for _, l := range strings.Split(err.Error(), "\n") {
				if strings.Contains(l, " models."+*model+".") {
					mine = append(mine, l)
				}
			}
			if len(mine) > 0 {
				printErrors(stderr, fmt.Errorf("%s", strings.Join(mine, "\n")))
				return exitFailure
			}
		}
		if *executor == "onnx" {
			one := &registry.Registry{File: reg.File, Models: map[string]*registry.Model{*model: m}}
			factory = func(t, n int) (gpu.Executor, func(), error) {
				x, err := onnx.New(one, onnx.Config{Lib: *lib, Device: *device, IntraThreads: t, Sessions: n, NoSpin: !*spin})
				if err != nil {
					return nil, nil, err
				}
				return x, x.Close, nil
			}
		} else {
			mf := gpu.ModelFile{Name: *model, Decoder: m.Decoder.Name, Path: m.Path}
			factory = func(_, n int) (gpu.Executor, func(), error) {
				return newExecutor("opencv", []gpu.ModelFile{mf}, n)
			}
		}
	default:
		return usageErr("--executor %q: want onnx, kserve, opencv or emulated", *executor)
	}
	if maxBatch > 0 {
		var kept intsFlag
		for _, b := range batches {
			if b <= maxBatch {
				kept = append(kept, b)
			}
		}
		if len(kept) == 0 {
			return usageErr("--batches %s: all above model %s's max_batch %d", batches.String(), *model, maxBatch)
		}
		batches = kept
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	tty := isTerminal(stderr)
	w := profile.WorkerType{Type: profile.WorkerTypeID(*wtype), Price: *price, CPUs: *cpus}
	if *gpuName != "" {
		w.GPU, w.GPUs = *gpuName, 1
	}
	res := profileOutput{Worker: w}
	header := []string{fmt.Sprintf("mdag profile --model %s --executor %s --device %s (%s)", *model, *executor, *device, time.Now().UTC().Format(time.RFC3339))}
	entry := measure.Entry{Profile: profile.Profile{Target: *model, Worker: w.Type}}

	if !*doSerf {
		x, release, err := factory(*intra, maxConc)
		if err != nil {
			fmt.Fprintf(stderr, "mdag profile: %v\n", err)
			return exitFailure
		}
		o := measure.Options{Model: *model, Batches: batches, Concurrency: conc, Iterations: *iters, Duration: *dur,
			Warmup: *warmup, Items: items}
		if *warmup == 0 {
			o.Warmup = -1
		}
		if tty {
			o.Progress = func(done, total int, p measure.Point) {
				fmt.Fprintf(stderr, "\r%s %d/%d  b=%d c=%d p50 %s p99 %s %.1f items/s   ", bar(done, total, 20), done, total,
					p.Batch, p.Concurrency, msStr(p.P50), msStr(p.P99), p.Throughput)
				if done == total {
					fmt.Fprintln(stderr)
				}
			}
		}
		sw, err := measure.Sweep(ctx, x, o)
		release()
		if err != nil {
			fmt.Fprintf(stderr, "mdag profile: %v\n", err)
			return exitFailure
		}
		res.Sweep = sw
		entry.Profile.Points = sw.ProfilePoints()
		header = append(header, fmt.Sprintf("%d points in %.1fs; latency = p50 batch time, throughput = measured items/s", len(sw.Points), sw.Elapsed.Seconds()))
		if *executor == "onnx" {
			header = append(header, fmt.Sprintf("intra-op threads per session: %d (0: ONNX Runtime's default)", *intra))
		}
		for _, f := range sw.Fits {
			sign, beta := "+", f.Beta
			if beta < 0 {
				sign, beta = "-", -beta
			}
			entry.Header = append(entry.Header, fmt.Sprintf("concurrency %d: l(b) = %s*b %s %s (R^2 %.4f, %d points)", f.Concurrency, msStr(f.Alpha), sign, msStr(beta), f.R2, f.Points))
		}
		for _, p := range sw.Points {
			entry.Comments = append(entry.Comments, fmt.Sprintf("p99 %s", msStr(p.P99)))
		}
	} else {
		so := measure.SerfOptions{Model: *model, Cores: *cpus, Threads: threads, Iterations: *iters, Warmup: *warmup, Gap: *gap, Items: items}
		if *warmup == 0 {
			so.Warmup = -1 // none (0 is the default, 2)
		}
		if tty {
			so.Progress = func(t, i int, mu float64) {
				fmt.Fprintf(stderr, "serf: t=%d i=%d mu=%.2f/s\n", t, i, mu)
			}
		}
		rates, err := measure.Rates(ctx, factory, so)
		if err != nil {
			fmt.Fprintf(stderr, "mdag profile: %v\n", err)
			return exitFailure
		}
		cfgs, err := serf.Configs(rates, *cpus)
		if err != nil {
			fmt.Fprintf(stderr, "mdag profile: %v\n", err)
			return exitFailure
		}
		ops, err := serf.OperatingPoints(cfgs, *budget, *maxRho)
		if err != nil {
			fmt.Fprintf(stderr, "mdag profile: %v\n", err)
			return exitFailure
		}
		res.Rates, res.Serf = rates, ops
		header = append(header, fmt.Sprintf("SERF (M/D_interf/c) operating points, batch 1, %d cpus, rho <= %g, budget %v", *cpus, *maxRho, *budget),
			"each point: concurrency = c requests in service, latency = predicted mean at throughput = lambda;",
			"the worker must run the model with the point's t intra-op threads per session (comment)")
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
		if *check {
			rows, err := measure.Check(ctx, factory, cfgs, measure.CheckOptions{Model: *model, Duration: *checkDur, Seed: *seed, Items: items, Remeasure: *remeasure, Gap: *gap,
				Progress: func(r measure.CheckRow) {
					if tty {
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
	}
	doc := measure.YAML(header, w, []measure.Entry{entry})
	f, err := profile.Parse("mdag-profile.yaml", doc)
	if err != nil {
		// a bug here, not the user's: the document must parse as written
		fmt.Fprintf(stderr, "mdag profile: the written profile does not parse: %v\n%s", err, doc)
		return exitFailure
	}
	if *out == "json" {
		res.Profile, res.YAML = *f, string(doc)
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(res); err != nil {
			fmt.Fprintf(stderr, "mdag profile: %v\n", err)
			return exitFailure
		}
		return exitOK
	}
	stdout.Write(doc)
	return exitOK
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
