package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/mdag/mdag/coordinator"
	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/gpu"
	"github.com/mdag/mdag/ingest/synth"
	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/profile"
	"github.com/mdag/mdag/scheduler"
)

const serveSynopsis = "(-f app.yaml -p profiles.yaml | --example NAME) [flags]"

func runServe(args []string, stdout, stderr io.Writer) int {
	return execute("serve", serveSynopsis, new(serveCmd), args, stdout, stderr)
}

// serveCmd is mdag serve's options.
type serveCmd struct {
	in                                 appInputs
	api                                apiFlags
	workers, policy, executor          string
	objects, size, scene               string
	headroom, fps                      float64
	warmup, verbose                    bool
	checkpoint, objectsEvery, duration time.Duration
	synthetic                          int
	variance                           *varianceFlag
	ox                                 *onnxFlags
	kx                                 *kserveFlags
	counts                             []int          // --objects' values, by validate
	pat                                *synth.Pattern // the synthetic source, by validate
}

func (c *serveCmd) flags(fs *flag.FlagSet) {
	c.in.flags(fs, "serve")
	c.api.flags(fs)
	fs.StringVar(&c.workers, "workers", "", "in-process instances allowed per worker type, e.g. V100=4,CPU=2 (default 8 of every type in the profiles)")
	fs.StringVar(&c.policy, "policy", string(coordinator.DefaultPolicy), "GPU batching policy: symphony, clockwork or lazy")
	fs.Float64Var(&c.headroom, "headroom", 1.25, headroomHelp)
	fs.BoolVar(&c.warmup, "warmup", true, warmupHelp)
	fs.DurationVar(&c.checkpoint, "checkpoint", 2*time.Second, "copy each stream's state at a stateful module (track, window...) to the coordinator this often, to restore it when its worker is lost; 0: never (a lost worker's streams start fresh)")
	fs.IntVar(&c.synthetic, "synthetic", 0, "streams of the synthetic source to run (0: none): moving shapes, or for an app with media: audio chirps with silence between them (48 kHz mono); with --warmup they send once their instances are warm")
	fs.Float64Var(&c.fps, "fps", 0, "synthetic source frame rate (default: the app's fps); an audio app's chunks per second, each 1/fps long")
	fs.StringVar(&c.objects, "objects", "3", "objects per synthetic frame; a list (e.g. 2,6,1,8) steps through its values every --objects-every, so the app's fan-out changes (scaling)")
	fs.DurationVar(&c.objectsEvery, "objects-every", time.Minute, "how long each value of an --objects list lasts")
	fs.StringVar(&c.size, "size", "320x240", "synthetic frame size WxH")
	fs.StringVar(&c.scene, "scene", "shapes", sceneHelp)
	fs.DurationVar(&c.duration, "duration", 0, "stop after this long (0: run until interrupted); with --synthetic and --warmup, counted from when the warm streams start sending")
	fs.BoolVar(&c.verbose, "v", false, "log debug events (every drop with its reason)")
	fs.StringVar(&c.executor, "executor", "emulated", "GPU executor of the in-process workers: emulated (profiled times), onnx (registry models on ONNX Runtime; --models) "+
		"or kserve (registry models on Open Inference Protocol servers over gRPC; --models)")
	c.variance = addVarianceFlag(fs)
	c.ox = addONNXFlags(fs)
	c.kx = addKServeFlags(fs)
}

func (c *serveCmd) validate(fs *flag.FlagSet) []error {
	var errs []error
	if err := c.in.problem(); err != nil {
		errs = append(errs, err)
	}
	if !validHeadroom(c.headroom) {
		errs = append(errs, fmt.Errorf("--headroom %v: want a number >= 1", c.headroom))
	}
	errs = append(errs, c.executorProblems(fs)...)
	if _, err := parseWorkers(c.workers); err != nil {
		errs = append(errs, fmt.Errorf("--workers: %w", err))
	}
	if !validPolicy(c.policy) {
		errs = append(errs, fmt.Errorf("--policy %q: want symphony, clockwork or lazy", c.policy))
	}
	errs = append(errs, c.api.check()...)
	return append(errs, c.syntheticProblems()...)
}

// executorProblems checks --executor and the flags that go with it
// (buildExecutor checks them again when it builds it).
func (c *serveCmd) executorProblems(fs *flag.FlagSet) []error {
	var errs []error
	if c.executor != "emulated" {
		if err := c.variance.only("--executor " + c.executor); err != nil {
			errs = append(errs, err)
		}
	}
	if err := checkExecutor(c.executor, fs, c.ox, c.kx, nil, false); err != nil {
		errs = append(errs, err)
	}
	return errs
}

// syntheticProblems reads --objects, --objects-every, --size and --scene
// into the synthetic source.
func (c *serveCmd) syntheticProblems() []error {
	var errs []error
	var err error
	if c.counts, err = parseObjects(c.objects); err != nil {
		errs = append(errs, err)
		c.counts = []int{0}
	}
	if c.objectsEvery <= 0 {
		errs = append(errs, fmt.Errorf("--objects-every %v: want > 0", c.objectsEvery))
	}
	if c.pat, err = newPattern(c.size, c.counts[0], c.scene); err != nil {
		errs = append(errs, err)
	}
	return errs
}

func (c *serveCmd) run(env *cmdEnv) error {
	s, err := c.build(env)
	if err != nil {
		return err
	}
	defer s.close()
	if err := c.joinSynthetic(s); err != nil {
		return err
	}
	ctx, cancel := runContext(c.duration)
	defer cancel()
	var wg sync.WaitGroup
	c.sendSynthetic(ctx, &wg, s)
	<-ctx.Done()
	s.cams.Stop()
	wg.Wait()
	c.summary(env.stdout, s)
	return nil
}

// serving is serve's running parts: the engine and its API (embedded),
// and the cameras.
type serving struct {
	embedded
	cams *cameraRun
}

// build starts serve's parts; on an error it closes those it started.
func (c *serveCmd) build(env *cmdEnv) (*serving, error) {
	app, prof, err := c.in.load()
	if err != nil {
		return nil, invalid(err)
	}
	if c.fps == 0 {
		c.fps = app.FPS
	}
	s := &serving{embedded: embedded{app: app, log: newLogger(env.stderr, c.verbose)}}
	if err := c.start(env, s, prof); err != nil {
		s.close()
		return nil, err
	}
	return s, nil
}

// start starts the engine on the executor, its API and the cameras.
func (c *serveCmd) start(env *cmdEnv, s *serving, prof *profile.File) error {
	cfg := coordinator.Config{Policy: scheduler.Policy(c.policy), Headroom: c.headroom, Warmup: c.warmup,
		Checkpoint: checkpointFlag(c.checkpoint), Log: s.log}
	note, err := c.buildExecutor(env, s, &cfg)
	if err != nil {
		return err
	}
	limits, err := c.limits(s, prof)
	if err != nil {
		return err
	}
	closeState, err := openState(*c.api.stateDir, &cfg, s.log)
	if err != nil {
		return err
	}
	s.onClose(closeState) // after the engine's last save
	if err := s.startEngine(cfg, limits, prof, c.variance.v); err != nil {
		return invalid(err)
	}
	if err := s.serveAPI(&c.api); err != nil {
		return err
	}
	c.logServing(s, note)
	if s.cams, err = c.api.cf.start(s.app, s.obs, s.log); err != nil {
		return invalid(err)
	}
	s.onClose(s.cams.Stop) // before the WHIP server closes
	return nil
}

// buildExecutor builds --executor for the in-process workers (the app's
// models checked against its registry) into cfg; it returns the startup
// note that says where GPU modules run.
func (c *serveCmd) buildExecutor(env *cmdEnv, s *serving, cfg *coordinator.Config) (string, error) {
	bx, err := buildExecutor(c.executor, env.fs, c.ox, c.kx, nil, false)
	if err != nil {
		return "", invalid(err)
	}
	s.onClose(bx.close)
	if bx.reg != nil {
		if err := checkAppModels(s.app, bx.reg); err != nil {
			return "", invalid(err)
		}
	}
	if bx.kserve != nil {
		if err := checkServers(bx.kserve); err != nil {
			// batches fail (frames dropped: executor) until it is up
			fmt.Fprintf(env.stderr, "mdag serve: warning: %v\n", err)
		}
	}
	x := bx.exec
	if x == nil {
		return "embedded mode: coordinator, GPU scheduler and in-process workers with emulated GPUs in one process", nil
	}
	// one executor for every in-process worker: its sessions (onnx) or
	// slots (kserve) per model are the concurrency; the scheduler decides
	// the batches
	cfg.Executor = func(string, profile.WorkerTypeID) (gpu.Executor, error) { return x, nil }
	return "embedded mode: coordinator, GPU scheduler and in-process workers in one process; GPU modules run on " + bx.describe(), nil
}

// limits are the in-process instances --workers allows of each type of
// the profiles; with the onnx executor on the CPU, every instance's model
// runs on this host's cores, which bound them.
func (c *serveCmd) limits(s *serving, prof *profile.File) (map[profile.WorkerTypeID]int, error) {
	limits, err := parseLimits(c.workers, prof)
	if err != nil {
		return nil, invalidf("--workers: %v", err)
	}
	if c.executor == "onnx" && *c.ox.device == "cpu" {
		var notes []string
		limits, notes = hostLimits(limits, prof, runtime.NumCPU(), c.workers != "")
		for _, n := range notes {
			s.log.Warn("embedded mode on this host's cores", "limit", n)
		}
	}
	return limits, nil
}

// logServing says where everything is served.
func (c *serveCmd) logServing(s *serving, note string) {
	base := s.base
	where := []any{"app", s.app.Name, "dashboard", base + "/", "status", base + "/v1/status", "metrics", base + "/metrics"}
	if s.obs.ws != nil {
		where = append(where, "whip", base+"/whip/"+string(s.app.Name), "page", base+"/stream/"+string(s.app.Name))
	}
	if c.executor == "emulated" {
		where = append(where, "variance", c.variance.v.String())
	}
	s.log.Info("serving", append(where, "policy", c.policy, "note", note)...)
}

// joinSynthetic joins the synthetic streams and, with --warmup, waits for
// the instances planned for them to warm up.
func (c *serveCmd) joinSynthetic(s *serving) error {
	for i := range c.synthetic {
		if err := s.obs.e.Join(s.app.Name, fmt.Sprintf("synthetic-%d", i)); err != nil {
			return err
		}
	}
	if c.synthetic > 0 && c.warmup {
		// --duration counts from here: that long of frames.
		s.waitWarm(30*time.Second, "the synthetic streams start cold")
	}
	return nil
}

// sendSynthetic sends the synthetic streams' frames (an audio app: chirps
// and silence, chunks of 1/fps at fps) until ctx ends, stepping through
// an --objects list.
func (c *serveCmd) sendSynthetic(ctx context.Context, wg *sync.WaitGroup, s *serving) {
	for i := range c.synthetic {
		id := fmt.Sprintf("synthetic-%d", i)
		wg.Go(func() {
			var err error
			if s.app.Media == dag.Audio {
				err = synth.NewTone().Generate(ctx, clock.Real{}, i, id, c.fps, 0, s.obs.e.IngestAudio)
			} else {
				err = c.pat.Generate(ctx, clock.Real{}, i, id, c.fps, 0, s.obs.ingest)
			}
			if err != nil {
				s.log.Error("synthetic source stopped", "stream", id, "err", err)
			}
		})
	}
	if len(c.counts) > 1 {
		wg.Go(func() { c.stepObjects(ctx, s) })
	}
}

// stepObjects changes the objects per synthetic frame every
// --objects-every, through the --objects list, until ctx ends.
func (c *serveCmd) stepObjects(ctx context.Context, s *serving) {
	for i := 1; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-time.After(c.objectsEvery):
		}
		n := c.counts[i%len(c.counts)]
		c.pat.SetObjects(n)
		s.log.Info("synthetic objects per frame changed", "objects", n)
	}
}

// summary prints serve's summary once the frames in flight have ended.
func (c *serveCmd) summary(w io.Writer, s *serving) {
	obs := s.obs
	obs.settle(s.app.SLO)
	st, replans := finalStatus(obs.e, 30*time.Second)
	writeStatusTable(w, st)
	if obs.ws != nil {
		writeIngestLine(w, obs.ws.Admission())
	}
	if obs.whepSummary != nil {
		fmt.Fprintln(w, obs.whepSummary())
	}
	writeCameraTable(w, s.cams.Status())
	obs.flushOutputs(5 * time.Second)
	writeOutputLines(w, obs.outs)
	writeClipLine(w, obs.closeClips())
	writeReplanSummary(w, st, replans)
}

// finalStatus is the engine's status and re-plans for serve's summary,
// taken once the re-plans the run's end set off (the cameras' streams
// leaving, the last frames ending) are applied and logged, or after limit
// (a plan that takes longer is not waited for): the summary shows the
// instances and cost of the last plan, after its log line.
func finalStatus(e *coordinator.Engine, limit time.Duration) (coordinator.Status, []coordinator.Replan) {
	end := time.Now().Add(limit)
	for e.Planning() && time.Now().Before(end) {
		<-time.After(10 * time.Millisecond)
	}
	return e.Status(), e.Replans()
}

// parseObjects reads --objects: N or N,N,... (each >= 0).
func parseObjects(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 0 {
			return nil, fmt.Errorf("--objects %q: want a count >= 0 or a comma-separated list of them", s)
		}
		out = append(out, n)
	}
	return out, nil
}

// writeReplanSummary counts the re-plans by kind and those that changed
// nothing (which should be none: such a re-plan is churn for no gain).
func writeReplanSummary(w io.Writer, st coordinator.Status, rs []coordinator.Replan) {
	kinds := map[string]int{}
	var unchanged []string
	for _, r := range rs {
		for _, k := range r.Kinds {
			kinds[string(k)]++
		}
		if r.Unchanged {
			unchanged = append(unchanged, fmt.Sprintf("#%d %s", r.N, r.Trigger))
		}
	}
	names := make([]string, 0, len(kinds))
	for k := range kinds {
		names = append(names, fmt.Sprintf("%s=%d", k, kinds[k]))
	}
	sort.Strings(names)
	fmt.Fprintf(w, "re-plans: %d (last %d by kind: %s); changed nothing: %d\n", st.ReplansTotal, len(rs), strings.Join(names, " "), st.ReplansUnchanged)
	for _, u := range unchanged {
		fmt.Fprintf(w, "  unchanged %s\n", u)
	}
}
