//go:build !lean

package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/mdag/mdag/coordinator"
	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/ingest/whip"
	"github.com/mdag/mdag/observe/dashboard"
)

var demoSynopsis = "[--app " + strings.Join(demoAppNames(), "|") + "] [--duration D] [flags]"

func runDemo(args []string, stdout, stderr io.Writer) int {
	return execute("demo", demoSynopsis, new(demoCmd), args, stdout, stderr)
}

// demoCmd is mdag demo's options.
type demoCmd struct {
	app, models, listen, source string
	duration, step              time.Duration
	verbose                     bool
	warm                        int
	variance                    *varianceFlag
}

func (c *demoCmd) flags(fs *flag.FlagSet) {
	fs.StringVar(&c.app, "app", "traffic", "the app: "+strings.Join(demoAppNames()[:len(emulatedDemos)], ", ")+
		" (emulated GPUs; vtest.avi, caption the pattern), face-live (BlazeFace on ONNX Runtime, Megamind.avi) or text-reader (PP-OCRv4 on ONNX Runtime, the text clip); the last two need make models")
	fs.StringVar(&c.models, "models", "", "with --app face-live or text-reader: the model registry (default examples/models.yaml, examples/text-reader/models.yaml)")
	fs.DurationVar(&c.duration, "duration", 0, "run this long, then print the summary (0: until Ctrl-C)")
	fs.StringVar(&c.listen, "listen", "127.0.0.1:8080", "HTTP address of the dashboard, /metrics and WHIP (loopback only)")
	fs.StringVar(&c.source, "source", "", "video FILE the clients stream, or pattern (default: "+vtest+", with --app caption the pattern, with --app face-live "+megamindVideo+", when installed, else the pattern)")
	fs.DurationVar(&c.step, "step", 8*time.Second, "clients join or leave every step (schedule "+fmt.Sprint(demoSchedule)+" for traffic, pose and actdet, [2 4 3 4 2] for face and tracker, [1 2 1] for caption, face-live "+fmt.Sprint(faceLiveSchedule)+", repeating)")
	fs.BoolVar(&c.verbose, "v", false, "log debug events (every drop with its reason)")
	fs.IntVar(&c.warm, "warm", -1, "keep capacity planned and warm for this many clients while fewer are connected (the app's warm:, see the YAML reference); the clients start once it is warm (default: the schedule's fewest clients, caption 2; 0: none, instances start with the clients)")
	c.variance = addVarianceFlag(fs)
}

func (c *demoCmd) validate(*flag.FlagSet) []error {
	var errs []error
	if !loopback(c.listen) {
		errs = append(errs, fmt.Errorf("--listen %s: the demo's ingest is open, so it listens on loopback only (use mdag serve --token-file for more)", c.listen))
	}
	if c.step <= 0 {
		errs = append(errs, fmt.Errorf("--step %v: want > 0", c.step))
	}
	if _, ok := realDemos[c.app]; ok {
		if err := c.variance.only("--app " + c.app); err != nil {
			errs = append(errs, err)
		}
	}
	if _, ok := emulatedDemos[c.app]; !ok && realDemos[c.app].models == "" {
		why := ""
		if c.app == "audio" {
			why = " (the audio app takes audio; the demo's clients send video)"
		}
		errs = append(errs, fmt.Errorf("--app %q: want one of %s%s", c.app, strings.Join(demoAppNames(), ", "), why))
	}
	if c.warm > dag.MaxWarm {
		errs = append(errs, fmt.Errorf("--warm %d: want 0 to %d", c.warm, dag.MaxWarm))
	}
	return errs
}

func (c *demoCmd) run(env *cmdEnv) error {
	r, err := c.build(env)
	if err != nil {
		return err
	}
	defer r.close()
	c.intro(env.stdout, r)
	ctx, cancel := runContext(c.duration)
	defer cancel()
	ran, sums := c.drive(ctx, r)
	r.obs.settle(r.app.SLO)
	return writeDemoSummary(env.stdout, ran, r.obs.e.Status(), r.obs.e.Replans(), r.obs.rec.History(), sums)
}

// demoRun is the demo's running parts: the engine and its API (embedded)
// with WHIP ingest, and what the clients stream.
type demoRun struct {
	embedded
	d    *demoApp
	src  string // a video file or pattern
	open func() (frameSource, error)
}

// build starts the demo's parts; on an error it closes those it started.
func (c *demoCmd) build(env *cmdEnv) (*demoRun, error) {
	d, err := loadDemoApp(c.app, c.models)
	if err != nil {
		return nil, err
	}
	r := &demoRun{embedded: embedded{app: d.app, log: newLogger(env.stderr, c.verbose)}, d: d}
	r.onClose(d.close)
	if err := c.start(r); err != nil {
		r.close()
		return nil, err
	}
	return r, nil
}

// start opens the clients' source, starts the engine, waits for its warm
// capacity, and serves WHIP and the dashboard.
func (c *demoCmd) start(r *demoRun) error {
	app := r.app
	app.Warm = c.warm
	if c.warm < 0 {
		app.Warm = max(demoWarm[c.app], slices.Min(r.d.schedule))
	}
	r.src = c.source
	if r.src == "" {
		r.src = "pattern"
		if _, err := os.Stat(r.d.video); err == nil && r.d.video != "pattern" {
			r.src = r.d.video
		}
	}
	var err error
	if r.open, err = sourceOpener(r.src, "640x480", 3, true); err != nil {
		return invalidf("--source: %v", err)
	}
	if err := r.startEngine(coordinator.Config{Log: r.log, Executor: r.d.exec, Warmup: true}, r.d.limits, r.d.prof, c.variance.v); err != nil {
		return err
	}
	if app.Warm > 0 {
		r.log.Info("demo warming up", "app", app.Name, "streams", app.Warm)
		r.waitWarm(60*time.Second, "demo: the clients start cold")
	}
	// The demo's clients encode in this process: admission may fill every
	// core with this process's CPU (their encoders count in it).
	ws, err := whip.New(whip.Config{Apps: map[dag.AppID]float64{app.Name: app.FPS}, Scale: scaler, Objects: motionObjects, CPUCeiling: 1,
		Log: r.log}, r.obs.sink())
	if err != nil {
		return err
	}
	r.onClose(ws.Close)
	r.obs.setWhip(ws)
	if err := r.listen(c.listen); err != nil {
		return fmt.Errorf("%v (another mdag running? give --listen 127.0.0.1:0 for any free port)", err)
	}
	return nil
}

// intro says what the demo runs, where to look and what at.
func (c *demoCmd) intro(w io.Writer, r *demoRun) {
	srcName := r.src
	switch {
	case r.src == "pattern" && r.d.video == "pattern":
		srcName = "the generated moving-shapes pattern"
	case r.src == "pattern":
		srcName = "the generated moving-shapes pattern (" + r.d.video + " is not installed)"
	}
	stop := "Ctrl-C stops it and prints the summary"
	if c.duration > 0 {
		stop = fmt.Sprintf("it stops after %v and prints the summary", c.duration)
	}
	base := r.base
	fmt.Fprintf(w, `mdag demo: %s
  WHIP clients stream %s (at most 384 pixels wide) over WebRTC,
  joining and leaving every %v (%v clients); %s.

  dashboard   %s/
  metrics     %s/metrics
  status      %s/v1/status   (or: bin/mdag status --server %s)
  streams     %s/v1/streams
  your camera %s/stream/%s   (a browser can join too)

What to look at on the dashboard:
  - finish rate per 1 s window: frames finished within the SLO / frames sent; it should sit near 100%%
  - the purple marks and the re-plan timeline: each join or leave re-plans; the timeline says what moved and the cost
  - cost and instances by type: the allocator's cheapest mix for the current streams (whole instances vs allocated share)
  - module rates, batch sizes, scaling and ballooning factors: %s
  - the module table: each module's allocation and, under "why this allocation", the allocator's reasons

`, r.d.intro, srcName, c.step, r.d.schedule, stop, base, base, base, base, base, base, r.app.Name, r.d.look)
	if r.d.exec == nil {
		r.log.Info("demo serving", "dashboard", base+"/", "source", r.src, "variance", c.variance.v.String())
	} else {
		r.log.Info("demo serving", "dashboard", base+"/", "source", r.src)
	}
}

// drive runs the clients' schedule, a --step at a time, until ctx ends;
// it returns how long it ran and every client's summary.
func (c *demoCmd) drive(ctx context.Context, r *demoRun) (time.Duration, []clientSummary) {
	// Half-size video (384x288 from vtest.avi): six encoders, their
	// decoders and the app share this machine's cores.
	cl := &demoClients{open: r.open, o: clientOpts{server: r.base, app: string(r.app.Name), fps: r.app.FPS, bitrate: 600, maxWidth: 384}}
	start := time.Now()
	for i := 0; ; i++ {
		cl.resize(ctx, r.d.schedule[i%len(r.d.schedule)])
		select {
		case <-ctx.Done():
		case <-time.After(c.step):
		}
		if ctx.Err() != nil {
			break
		}
	}
	return time.Since(start).Round(time.Second), cl.stopAll()
}

// demoClients runs the demo's WHIP clients.
type demoClients struct {
	open func() (frameSource, error)
	o    clientOpts
	mu   sync.Mutex
	live []*demoClient
	done []clientSummary
	n    int
}

type demoClient struct {
	cancel context.CancelFunc
	sum    chan clientSummary
}

// resize starts or stops clients (newest first) until n stream.
func (c *demoClients) resize(ctx context.Context, n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for len(c.live) < n {
		cctx, cancel := context.WithCancel(ctx)
		dc := &demoClient{cancel: cancel, sum: make(chan clientSummary, 1)}
		idx := c.n
		c.n++
		go func() { dc.sum <- runOneClient(cctx, idx, c.open, c.o, func(whip.Result) {}) }()
		c.live = append(c.live, dc)
	}
	for len(c.live) > n {
		dc := c.live[len(c.live)-1]
		c.live = c.live[:len(c.live)-1]
		dc.cancel()
		go func() {
			s := <-dc.sum
			c.mu.Lock()
			c.done = append(c.done, s)
			c.mu.Unlock()
		}()
	}
}

// stopAll stops every client and returns every client's summary.
func (c *demoClients) stopAll() []clientSummary {
	c.mu.Lock()
	live := c.live
	c.live = nil
	c.mu.Unlock()
	var out []clientSummary
	for _, dc := range live {
		dc.cancel()
	}
	for _, dc := range live {
		out = append(out, <-dc.sum)
	}
	// Clients that left earlier: their summaries are in done, or on the way.
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		c.mu.Lock()
		n := len(c.done)
		c.mu.Unlock()
		if n+len(out) >= c.n {
			break
		}
		<-time.After(20 * time.Millisecond)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return append(c.done, out...)
}

// writeDemoSummary prints what the run did; it fails (exit 1) when no
// frame got through, so a broken demo cannot pass as a quiet one.
func writeDemoSummary(w io.Writer, ran time.Duration, st coordinator.Status, replans []coordinator.Replan, hist dashboard.Snapshot, sums []clientSummary) error {
	s := st.Sessions[0]
	fmt.Fprintf(w, "== mdag demo summary (%v)\n", ran)
	fmt.Fprintf(w, "frames: sent %d, finished %d, late %d, dropped %d, open %d\n", s.Total.Sent, s.Total.Finished, s.Total.Late, s.Total.Dropped, s.Open)
	fmt.Fprintf(w, "finish rate: %.2f%% (frames finished within the %g ms SLO / frames sent); latency p50 %.1f ms, p99 %.1f ms\n",
		100*s.FinishRateAll, s.SLOMS, s.P50MS, s.P99MS)
	whole, alloc := hist.MeanCost()
	fmt.Fprintf(w, "cost: mean $%.2f/h whole instances, $%.2f/h allocated over the run\n", whole, alloc)
	kinds := map[string]int{}
	for _, r := range replans {
		for _, k := range r.Kinds {
			kinds[string(k)]++
		}
	}
	keys := make([]string, 0, len(kinds))
	for k := range kinds {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, kinds[k])
	}
	fmt.Fprintf(w, "re-allocations: %d (plans by the kinds of event that asked for them: %s)\n", len(replans), strings.Join(parts, ", "))
	if len(s.Drops) > 0 {
		ks := make([]string, 0, len(s.Drops))
		for k := range s.Drops {
			ks = append(ks, k)
		}
		sort.Strings(ks)
		for i, k := range ks {
			ks[i] = fmt.Sprintf("%s = %d", k, s.Drops[k])
		}
		fmt.Fprintf(w, "drops: %s\n", strings.Join(ks, ", "))
	}
	total := sumClients(sums)
	fmt.Fprintf(w, "clients: %d WHIP streams, %d frames sent, %d ingested at %g fps, %d results back, %d errors\n",
		len(sums), total.Sent, total.Ingested, s.FPS, total.Results, total.Errors)
	for _, c := range sums {
		if c.Error != "" {
			fmt.Fprintf(w, "  client error: %s\n", c.Error)
		}
	}
	if s.Total.Sent == 0 {
		fmt.Fprintln(w, "no frame reached the app: the demo did not work (see the log above)")
		return reported(exitFailure)
	}
	return nil
}
