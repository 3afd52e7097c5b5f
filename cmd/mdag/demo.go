//go:build !lean

package main

import (
	"context"
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
	"github.com/mdag/mdag/examples"
	"github.com/mdag/mdag/gpu"
	"github.com/mdag/mdag/gpu/onnx"
	"github.com/mdag/mdag/gpu/registry"
	"github.com/mdag/mdag/ingest/whip"
	"github.com/mdag/mdag/observe/dashboard"
	"github.com/mdag/mdag/profile"
)

// vtest is the sample video Debian's opencv-doc installs (people walking).
const vtest = "/usr/share/doc/opencv-doc/examples/data/vtest.avi"

// megamindVideo is the other sample video of opencv-doc (a face looking
// at the camera most of the time): face-live's source.
const megamindVideo = "/usr/share/doc/opencv-doc/examples/data/Megamind.avi"

// demoSchedule is how many WHIP clients stream at each step: they join and
// leave, and every change re-plans.
var demoSchedule = []int{3, 5, 4, 6, 3}

// faceLiveSchedule is face-live's: every client's frames go through one
// ONNX Runtime worker on this machine's CPU.
var faceLiveSchedule = []int{1, 2, 3, 2}

// realDemo is an example the demo runs on its real models (ONNX Runtime
// on this machine's CPU): its registry, its video, the clients' schedule
// and what to say.
type realDemo struct {
	models   string // the default --models
	video    string
	schedule []int
	intro    string // gets the SLO, the fps and the executor
	look     string
}

// realDemos are face-live (BlazeFace) and text-reader (PP-OCRv4).
var realDemos = map[string]realDemo{
	"face-live": {models: "examples/models.yaml", video: megamindVideo, schedule: faceLiveSchedule,
		intro: `the face-live app (detect -> faces / boxes, SLO %v at %g fps per camera): BlazeFace with its
  real weights on %s,
  batched across the streams, then CPU ops counting the faces and returning the boxes, in this one process.
  The boxes come back to each client on its DataChannel; the stream page draws them over the video and
  the dashboard draws the latest ones on each stream's thumbnail.`,
		look: `detect's batch size grows with the streams
    (one model call for the frames of every stream that are waiting); its latency is ONNX Runtime's, measured`},
	"text-reader": {models: "examples/text-reader/models.yaml", video: "build/textclip/text-clip.avi", schedule: []int{1, 2, 1},
		intro: `the text-reader app (detect text -> lines -> read -> texts, SLO %v at %g fps per camera): PaddleOCR's
  PP-OCRv4 detector and recogniser with their real weights on %s;
  each line read is a box classed by its string, back to each client on its DataChannel: the stream page
  draws the strings over the video (the clip make models renders: signs of known text over vtest.avi).`,
		look: `read's batches gather the text lines of every stream
    (one recogniser call for the lines waiting); its latency is ONNX Runtime's, measured`},
}

// demoApp is what the demo runs: the app, its worker limits, the executor
// (nil: emulated), the default video, the client schedule and the intro.
type demoApp struct {
	app      *dag.App
	prof     *profile.File
	limits   map[profile.WorkerTypeID]int
	exec     coordinator.ExecutorFactory
	close    func()
	video    string
	schedule []int
	intro    string
	look     string // the dashboard's module rates, in words
}

// emulatedDemo is how the demo runs an example app on emulated GPUs: the
// worker limits (a few of each GPU type, so the allocator's mix changes
// with the load), the video the clients stream, their schedule, and what
// to say: the pipeline (intro, which gets the SLO and fps) and what to
// look at on the dashboard.
type emulatedDemo struct {
	limits   map[profile.WorkerTypeID]int
	video    string
	schedule []int
	pipeline string
	look     string
}

// motionLook is what the emulated detector does with the demo's video.
const motionLook = `the emulated detector reports the moving
    regions of the video (background subtraction; tall ones are people)`

// emulatedDemos are the example apps the demo runs on emulated GPUs, by
// --app. The people apps stream vtest.avi (people walking); caption, whose
// S2VT takes about a second per frame at batch 1 on a GPU of its own, the
// pattern, at most two streams. The audio app is not here: its clients
// send audio, the demo's send video.
var emulatedDemos = map[string]emulatedDemo{
	"traffic": {map[profile.WorkerTypeID]int{"P100": 2, "V100": 4, "CPU": 2}, vtest, demoSchedule,
		`detect -> crop -> classify / face -> count`,
		motionLook + `; as people walk in and out the
    crop and face rates change, and 'scaling' re-plans resize the downstream modules`},
	"face": {map[profile.WorkerTypeID]int{"P100": 2, "V100": 2, "CPU": 2}, vtest, []int{2, 4, 3, 4, 2},
		`detect -> crop -> PRNet keypoints per face`,
		motionLook + `; each region is cropped and
    its keypoints extracted, so the keypoints rate follows the people in view`},
	"tracker": {map[profile.WorkerTypeID]int{"P100": 2, "V100": 2, "CPU": 2}, vtest, []int{2, 4, 3, 4, 2},
		`detect -> crop people -> re-identification -> track (stateful: each stream's tracks live on one instance)`,
		motionLook + `; track keeps each stream's
    tracks (its state on the dashboard: streams held, moves); each result carries the tracked boxes`},
	"pose": {map[profile.WorkerTypeID]int{"P100": 2, "V100": 2, "CPU": 2}, vtest, demoSchedule,
		`OpenPose keypoints -> window of each stream's last 8 poses (stateful) -> action recogniser`,
		`window turns each frame into one item
    carrying the stream's last 8 poses; its state line says how many streams it holds`},
	"caption": {map[profile.WorkerTypeID]int{"P100": 12, "V100": 4, "CPU": 2}, "pattern", []int{1, 2, 1},
		`AlexNet features -> sequence (stateful: frame order and context per stream) -> S2VT captions`,
		`S2VT takes about a second per frame at batch 1,
    so each stream needs several GPUs: watch the instances chart grow with the second stream`},
	"actdet": {map[profile.WorkerTypeID]int{"P100": 2, "V100": 2, "CPU": 2}, vtest, demoSchedule,
		`detect -> crop people -> track (stateful) and re-identification -> activity rules (stateful; a fork-join)`,
		motionLook + `; activity fires the rules of
    examples/actdet/app.yaml (people crossing x = 160, staying 2 s at the left edge): each result's labels
    name the events of its frame`},
}

// demoWarm are the demos kept warm for more than their schedule's fewest
// clients. caption: S2VT's first batch on a new instance takes ~3.4 s
// (cold), more than the whole 2.5 s SLO, so the second client's join cost
// the first ~3 frames while five more P100s warmed up (98.6%); with two
// clients' worth warm it joins onto warm GPUs (99.6%, at 1.4x the mean
// cost).
var demoWarm = map[string]int{"caption": 2}

// demoAppNames are the apps --app takes: the emulated ones, sorted, then
// the real ones.
func demoAppNames() []string {
	names := make([]string, 0, len(emulatedDemos)+len(realDemos))
	for n := range emulatedDemos {
		names = append(names, n)
	}
	sort.Strings(names)
	return append(names, "face-live", "text-reader")
}

// loadDemoApp prepares --app: an example on emulated GPUs (emulatedDemos),
// or face-live with BlazeFace on the onnx executor (the registry models, 1
// intra-op thread, 2 sessions).
func loadDemoApp(name, models string) (*demoApp, error) {
	ed, emulated := emulatedDemos[name]
	rd, real := realDemos[name]
	if !emulated && !real {
		return nil, fmt.Errorf("--app %q: want one of %s", name, strings.Join(demoAppNames(), ", "))
	}
	app, prof, err := examples.Parse(name)
	if err != nil {
		return nil, err
	}
	d := &demoApp{app: app, prof: prof, close: func() {}}
	if emulated {
		d.limits, d.video, d.schedule, d.look = ed.limits, ed.video, ed.schedule, ed.look
		var gpus []string
		for _, w := range prof.Workers {
			if n := ed.limits[w.Type]; n > 0 && w.Type != "CPU" {
				gpus = append(gpus, fmt.Sprintf("%d %ss", n, w.Type))
			}
		}
		sort.Strings(gpus)
		d.intro = fmt.Sprintf(`the %s app (%s; SLO %v at %g fps per camera)
  on emulated GPU workers (at most %s: the allocator picks the cheapest mix for the streams of the moment) and
  the real CPU ops, in this one process.`, name, ed.pipeline, app.SLO, app.FPS, strings.Join(gpus, " and "))
		return d, nil
	}
	if models == "" {
		models = rd.models
	}
	reg, err := registry.Load(models)
	if err != nil {
		return nil, fmt.Errorf("%w (make models builds the model files)", err)
	}
	if err := checkAppModels(app, reg); err != nil {
		return nil, err
	}
	// load only the app's models (the registry has larger ones)
	keep := map[string]*registry.Model{}
	for _, m := range app.Modules {
		if m.Kind == dag.GPU {
			keep[m.Model] = reg.Models[m.Model]
		}
	}
	reg.Models = keep
	x, err := onnx.New(reg, onnx.Config{IntraThreads: 1, Sessions: 2})
	if err != nil {
		return nil, fmt.Errorf("%w (make models builds the model files)", err)
	}
	d.exec = func(string, profile.WorkerTypeID) (gpu.Executor, error) { return x, nil }
	d.close = x.Close
	d.limits = map[profile.WorkerTypeID]int{"ORT-CPU": 1}
	d.video, d.schedule = rd.video, rd.schedule
	d.intro = fmt.Sprintf(rd.intro, app.SLO, app.FPS, x.Describe())
	d.look = rd.look
	return d, nil
}

func runDemo(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("demo", "[--app "+strings.Join(demoAppNames(), "|")+"] [--duration D] [flags]", stderr)
	appName := fs.String("app", "traffic", "the app: "+strings.Join(demoAppNames()[:len(emulatedDemos)], ", ")+
		" (emulated GPUs; vtest.avi, caption the pattern), face-live (BlazeFace on ONNX Runtime, Megamind.avi) or text-reader (PP-OCRv4 on ONNX Runtime, the text clip); the last two need make models")
	models := fs.String("models", "", "with --app face-live or text-reader: the model registry (default examples/models.yaml, examples/text-reader/models.yaml)")
	duration := fs.Duration("duration", 0, "run this long, then print the summary (0: until Ctrl-C)")
	listen := fs.String("listen", "127.0.0.1:8080", "HTTP address of the dashboard, /metrics and WHIP (loopback only)")
	source := fs.String("source", "", "video FILE the clients stream, or pattern (default: "+vtest+", with --app caption the pattern, with --app face-live "+megamindVideo+", when installed, else the pattern)")
	step := fs.Duration("step", 8*time.Second, "clients join or leave every step (schedule "+fmt.Sprint(demoSchedule)+" for traffic, pose and actdet, [2 4 3 4 2] for face and tracker, [1 2 1] for caption, face-live "+fmt.Sprint(faceLiveSchedule)+", repeating)")
	verbose := fs.Bool("v", false, "log debug events (every drop with its reason)")
	warm := fs.Int("warm", -1, "keep capacity planned and warm for this many clients while fewer are connected (the app's warm:, see the YAML reference); the clients start once it is warm (default: the schedule's fewest clients, caption 2; 0: none, instances start with the clients)")
	variance := addVarianceFlag(fs)
	if code, ok := parseFlags(fs, args); !ok {
		return code
	}
	if !loopback(*listen) {
		fmt.Fprintf(stderr, "mdag demo: --listen %s: the demo's ingest is open, so it listens on loopback only (use mdag serve --token-file for more)\n", *listen)
		return exitInvalid
	}
	if *step <= 0 {
		fmt.Fprintf(stderr, "mdag demo: --step %v: want > 0\n", *step)
		return exitInvalid
	}
	if _, ok := realDemos[*appName]; ok {
		if err := variance.only("demo", "--app "+*appName); err != nil {
			fmt.Fprintln(stderr, err)
			return exitInvalid
		}
	}
	if _, ok := emulatedDemos[*appName]; !ok && realDemos[*appName].models == "" {
		why := ""
		if *appName == "audio" {
			why = " (the audio app takes audio; the demo's clients send video)"
		}
		fmt.Fprintf(stderr, "mdag demo: --app %q: want one of %s%s\n", *appName, strings.Join(demoAppNames(), ", "), why)
		return exitInvalid
	}
	d, err := loadDemoApp(*appName, *models)
	if err != nil {
		printErrors(stderr, fmt.Errorf("mdag demo: %w", err))
		return exitFailure
	}
	defer d.close()
	app, prof := d.app, d.prof
	switch {
	case *warm > dag.MaxWarm:
		fmt.Fprintf(stderr, "mdag demo: --warm %d: want 0 to %d\n", *warm, dag.MaxWarm)
		return exitInvalid
	case *warm >= 0:
		app.Warm = *warm
	default:
		app.Warm = max(demoWarm[*appName], slices.Min(d.schedule))
	}
	src := *source
	if src == "" {
		src = "pattern"
		if _, err := os.Stat(d.video); err == nil && d.video != "pattern" {
			src = d.video
		}
	}
	open, err := sourceOpener(src, "640x480", 3, true)
	if err != nil {
		fmt.Fprintf(stderr, "mdag demo: --source: %v\n", err)
		return exitInvalid
	}
	log := newLogger(stderr, *verbose)
	obs, err := startObservedWith(coordinator.Config{Log: log, Executor: d.exec, Warmup: true}, d.limits, app, prof, variance.v)
	if err != nil {
		printErrors(stderr, err)
		return exitFailure
	}
	defer obs.Close()
	if app.Warm > 0 {
		// A model's first batches run cold (S2VT's first takes 3.4 s of
		// caption's 2.5 s SLO): the clients come once the instances for
		// the first of them have warmed up, as cameras would come to a
		// service that was started before them.
		log.Info("demo warming up", "app", app.Name, "streams", app.Warm)
		if err := obs.e.WaitReady(app.Name, 60*time.Second); err != nil {
			log.Warn("demo: the clients start cold", "err", err)
		}
	}
	// The demo's clients encode in this process: admission may fill every
	// core with this process's CPU (their encoders count in it).
	ws, err := whip.New(whip.Config{Apps: map[dag.AppID]float64{app.Name: app.FPS}, Scale: scaler, Objects: motionObjects, CPUCeiling: 1,
		Log: log}, obs.sink())
	if err != nil {
		fmt.Fprintf(stderr, "mdag demo: %v\n", err)
		return exitFailure
	}
	defer ws.Close()
	obs.setWhip(ws)
	base, hs, err := obs.serveHTTP(*listen)
	if err != nil {
		fmt.Fprintf(stderr, "mdag demo: %v (another mdag running? give --listen 127.0.0.1:0 for any free port)\n", err)
		return exitFailure
	}
	defer hs.Close()
	srcName := src
	switch {
	case src == "pattern" && d.video == "pattern":
		srcName = "the generated moving-shapes pattern"
	case src == "pattern":
		srcName = "the generated moving-shapes pattern (" + d.video + " is not installed)"
	}
	stop := "Ctrl-C stops it and prints the summary"
	if *duration > 0 {
		stop = fmt.Sprintf("it stops after %v and prints the summary", *duration)
	}
	fmt.Fprintf(stdout, `mdag demo: %s
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

`, d.intro, srcName, *step, d.schedule, stop, base, base, base, base, base, base, app.Name, d.look)
	if d.exec == nil {
		log.Info("demo serving", "dashboard", base+"/", "source", src, "variance", variance.v.String())
	} else {
		log.Info("demo serving", "dashboard", base+"/", "source", src)
	}

	ctx, cancel := runContext(*duration)
	defer cancel()
	// Half-size video (384x288 from vtest.avi): six encoders, their
	// decoders and the app share this machine's cores.
	c := &demoClients{open: open, o: clientOpts{server: base, app: string(app.Name), fps: app.FPS, bitrate: 600, maxWidth: 384}}
	start := time.Now()
	for i := 0; ; i++ {
		c.resize(ctx, d.schedule[i%len(d.schedule)])
		select {
		case <-ctx.Done():
		case <-time.After(*step):
		}
		if ctx.Err() != nil {
			break
		}
	}
	ran := time.Since(start).Round(time.Second)
	sums := c.stopAll()
	obs.settle(app.SLO)
	return writeDemoSummary(stdout, ran, obs.e.Status(), obs.e.Replans(), obs.rec.History(), sums)
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
func writeDemoSummary(w io.Writer, ran time.Duration, st coordinator.Status, replans []coordinator.Replan, hist dashboard.Snapshot, sums []clientSummary) int {
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
		return exitFailure
	}
	return exitOK
}
