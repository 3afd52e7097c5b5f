package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"os"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/mdag/mdag/coordinator"
	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/examples"
	"github.com/mdag/mdag/gpu"
	"github.com/mdag/mdag/ingest"
	"github.com/mdag/mdag/ingest/synth"
	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/profile"
	"github.com/mdag/mdag/scheduler"
)

func runServe(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("serve", "(-f app.yaml -p profiles.yaml | --example NAME) [flags]", stderr)
	file := fs.String("f", "", "app YAML file")
	profiles := fs.String("p", "", "profiles YAML file (with -f)")
	example := fs.String("example", "", "serve an embedded example app instead of -f/-p (e.g. traffic)")
	listen := fs.String("listen", "127.0.0.1:8080", "HTTP address for /v1/status and /healthz")
	workers := fs.String("workers", "", "in-process instances allowed per worker type, e.g. V100=4,CPU=2 (default 8 of every type in the profiles)")
	policy := fs.String("policy", string(coordinator.DefaultPolicy), "GPU batching policy: symphony, clockwork or lazy")
	headroom := fs.Float64("headroom", 1.25, headroomHelp)
	warmup := fs.Bool("warmup", true, warmupHelp)
	checkpoint := fs.Duration("checkpoint", 2*time.Second, "copy each stream's state at a stateful module (track, window...) to the coordinator this often, to restore it when its worker is lost; 0: never (a lost worker's streams start fresh)")
	synthetic := fs.Int("synthetic", 0, "streams of the synthetic source to run (0: none): moving shapes, or for an app with media: audio chirps with silence between them (48 kHz mono); with --warmup they send once their instances are warm")
	fps := fs.Float64("fps", 0, "synthetic source frame rate (default: the app's fps); an audio app's chunks per second, each 1/fps long")
	objects := fs.String("objects", "3", "objects per synthetic frame; a list (e.g. 2,6,1,8) steps through its values every --objects-every, so the app's fan-out changes (scaling)")
	objectsEvery := fs.Duration("objects-every", time.Minute, "how long each value of an --objects list lasts")
	size := fs.String("size", "320x240", "synthetic frame size WxH")
	scene := fs.String("scene", "shapes", sceneHelp)
	duration := fs.Duration("duration", 0, "stop after this long (0: run until interrupted); with --synthetic and --warmup, counted from when the warm streams start sending")
	verbose := fs.Bool("v", false, "log debug events (every drop with its reason)")
	executor := fs.String("executor", "emulated", "GPU executor of the in-process workers: emulated (profiled times), onnx (registry models on ONNX Runtime; --models) "+
		"or kserve (registry models on Open Inference Protocol servers over gRPC; --models)")
	variance := addVarianceFlag(fs)
	ox := addONNXFlags(fs)
	kx := addKServeFlags(fs)
	wf := addWhipFlags(fs)
	af := addAuthFlags(fs)
	cf := addCameraFlags(fs)
	stateDir := addStateFlag(fs)
	if code, ok := parseFlags(fs, args); !ok {
		return code
	}
	app, prof, err := serveInputs("serve", *file, *profiles, *example)
	if err != nil {
		printErrors(stderr, err)
		return exitInvalid
	}
	if !validHeadroom(*headroom) {
		fmt.Fprintf(stderr, "mdag serve: --headroom %v: want a number >= 1\n", *headroom)
		return exitInvalid
	}
	cfg := coordinator.Config{Policy: scheduler.Policy(*policy), Headroom: *headroom}
	cfg.Warmup = *warmup
	cfg.Checkpoint = checkpointFlag(*checkpoint)
	note := "embedded mode: coordinator, GPU scheduler and in-process workers with emulated GPUs in one process"
	if *executor != "emulated" {
		if err := variance.only("serve", "--executor "+*executor); err != nil {
			fmt.Fprintln(stderr, err)
			return exitInvalid
		}
	}
	bx, err := buildExecutor(*executor, fs, ox, kx, nil, false)
	if err == nil && bx.reg != nil {
		if err = checkAppModels(app, bx.reg); err != nil {
			bx.close()
		}
	}
	if err != nil {
		printErrors(stderr, fmt.Errorf("mdag serve: %w", err))
		return exitInvalid
	}
	defer bx.close()
	if bx.kserve != nil {
		if err := checkServers(bx.kserve); err != nil {
			// batches fail (frames dropped: executor) until it is up
			fmt.Fprintf(stderr, "mdag serve: warning: %v\n", err)
		}
	}
	if x := bx.exec; x != nil {
		// one executor for every in-process worker: its sessions (onnx) or
		// slots (kserve) per model are the concurrency; the scheduler
		// decides the batches
		cfg.Executor = func(string, profile.WorkerTypeID) (gpu.Executor, error) { return x, nil }
		note = "embedded mode: coordinator, GPU scheduler and in-process workers in one process; GPU modules run on " + bx.describe()
	}
	limits, err := parseLimits(*workers, prof)
	if err != nil {
		fmt.Fprintf(stderr, "mdag serve: --workers: %v\n", err)
		return exitInvalid
	}
	var hostNotes []string
	if *executor == "onnx" && *ox.device == "cpu" {
		// Every in-process instance's model runs on this host's cores.
		limits, hostNotes = hostLimits(limits, prof, runtime.NumCPU(), *workers != "")
	}
	if !validPolicy(*policy) {
		fmt.Fprintf(stderr, "mdag serve: --policy %q: want symphony, clockwork or lazy\n", *policy)
		return exitInvalid
	}
	counts, err := parseObjects(*objects)
	if err == nil && *objectsEvery <= 0 {
		err = fmt.Errorf("--objects-every %v: want > 0", *objectsEvery)
	}
	if err != nil {
		fmt.Fprintf(stderr, "mdag serve: %v\n", err)
		return exitInvalid
	}
	pat, err := newPattern(*size, counts[0], *scene)
	if err != nil {
		fmt.Fprintf(stderr, "mdag serve: %v\n", err)
		return exitInvalid
	}
	if *fps == 0 {
		*fps = app.FPS
	}
	log := newLogger(stderr, *verbose)
	for _, n := range hostNotes {
		log.Warn("embedded mode on this host's cores", "limit", n)
	}
	cfg.Log = log
	closeState, err := openState("serve", *stateDir, &cfg, log)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return exitFailure
	}
	defer closeState() // after the engine's last save
	obs, err := startObservedWith(cfg, limits, app, prof, variance.v)
	if err != nil {
		printErrors(stderr, err)
		return exitInvalid
	}
	defer obs.Close()
	if err := obs.startOutputs(app, *stateDir); err != nil {
		fmt.Fprintf(stderr, "mdag serve: %v\n", err)
		return exitFailure
	}
	if err := obs.startClips(app, *stateDir); err != nil {
		fmt.Fprintf(stderr, "mdag serve: %v\n", err)
		return exitFailure
	}
	warnNoState(*stateDir, log)
	e := obs.e
	obs.hosts = af.hosts()
	if obs.auth, err = af.load("serve", log); err != nil {
		fmt.Fprintln(stderr, err)
		return exitInvalid
	}
	closeWhip, err := wf.attach("serve", *listen, app, obs, log)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return exitInvalid
	}
	defer closeWhip()
	if err := guardListen("serve", *listen, obs.auth, log); err != nil {
		fmt.Fprintln(stderr, err)
		return exitInvalid
	}
	metricsAddr, ms, err := obs.serveMetrics(*af.metricsListen)
	if err != nil {
		fmt.Fprintf(stderr, "mdag serve: %v\n", err)
		return exitFailure
	}
	if ms != nil {
		defer ms.Close()
		log.Info("serving /metrics without a token", "metrics_listen", "http://"+metricsAddr+"/metrics")
	}
	base, srv, err := obs.serveHTTP(*listen)
	if err != nil {
		fmt.Fprintf(stderr, "mdag serve: %v\n", err)
		return exitFailure
	}
	defer srv.Close()
	where := []any{"app", app.Name, "dashboard", base + "/", "status", base + "/v1/status", "metrics", base + "/metrics"}
	if obs.ws != nil {
		where = append(where, "whip", base+"/whip/"+string(app.Name), "page", base+"/stream/"+string(app.Name))
	}
	if *executor == "emulated" {
		where = append(where, "variance", variance.v.String())
	}
	log.Info("serving", append(where, "policy", *policy,
		"note", note)...)
	cams, err := cf.start("serve", app, obs, log)
	if err != nil {
		printErrors(stderr, err)
		return exitInvalid
	}
	defer cams.Stop() // before the WHIP server closes

	var wg sync.WaitGroup
	for i := range *synthetic {
		if err := e.Join(app.Name, fmt.Sprintf("synthetic-%d", i)); err != nil {
			fmt.Fprintf(stderr, "mdag serve: %v\n", err)
			return exitFailure
		}
	}
	if *synthetic > 0 && *warmup {
		// The synthetic cameras send once the instances planned for them
		// have warmed up, as cameras come to a service started before
		// them: their first frames would otherwise wait out the warm-up
		// (ONNX Runtime's first runs of each batch size, slower still
		// under -race; caption's S2VT 3.4 s) and miss the SLO. --duration
		// counts from here: that long of frames.
		if err := e.WaitReady(app.Name, 30*time.Second); err != nil {
			log.Warn("the synthetic streams start cold", "err", err)
		}
	}
	ctx, cancel := runContext(*duration)
	defer cancel()
	for i := range *synthetic {
		id := fmt.Sprintf("synthetic-%d", i)
		wg.Add(1)
		go func() {
			defer wg.Done()
			var err error
			if app.Media == dag.Audio {
				// an audio app: chirps and silence, chunks of 1/fps at fps
				err = synth.NewTone().Generate(ctx, clock.Real{}, i, id, *fps, 0, e.IngestAudio)
			} else {
				err = pat.Generate(ctx, clock.Real{}, i, id, *fps, 0, obs.ingest)
			}
			if err != nil {
				log.Error("synthetic source stopped", "stream", id, "err", err)
			}
		}()
	}
	if len(counts) > 1 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 1; ; i++ {
				select {
				case <-ctx.Done():
					return
				case <-time.After(*objectsEvery):
				}
				n := counts[i%len(counts)]
				pat.SetObjects(n)
				log.Info("synthetic objects per frame changed", "objects", n)
			}
		}()
	}
	<-ctx.Done()
	cams.Stop()
	wg.Wait()
	obs.settle(app.SLO)
	st, replans := finalStatus(e, 30*time.Second)
	writeStatusTable(stdout, st)
	if obs.ws != nil {
		writeIngestLine(stdout, obs.ws.Admission())
	}
	if obs.whepSummary != nil {
		fmt.Fprintln(stdout, obs.whepSummary())
	}
	writeCameraTable(stdout, cams.Status())
	obs.flushOutputs(5 * time.Second)
	writeOutputLines(stdout, obs.outs)
	writeClipLine(stdout, obs.closeClips())
	writeReplanSummary(stdout, st, replans)
	return exitOK
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

func validPolicy(p string) bool {
	return p == string(scheduler.Symphony) || p == string(scheduler.Clockwork) || p == string(scheduler.Lazy)
}

func serveInputs(cmd, file, profiles, example string) (*dag.App, *profile.File, error) {
	switch {
	case example != "" && (file != "" || profiles != ""):
		return nil, nil, fmt.Errorf("mdag %s: give --example or -f/-p, not both", cmd)
	case example != "":
		if _, err := examples.App(example); err != nil {
			return nil, nil, fmt.Errorf("mdag %s: --example %q: unknown (known: %s)", cmd, example, strings.Join(examples.Names(), ", "))
		}
		return examples.Parse(example)
	case file == "" || profiles == "":
		return nil, nil, fmt.Errorf("mdag %s: need -f app.yaml and -p profiles.yaml, or --example NAME", cmd)
	}
	app, err := dag.Load(file)
	if err != nil {
		return nil, nil, err
	}
	pf, err := profile.Load(profiles)
	return app, pf, err
}

// parseLimits reads TYPE=N,...; empty means 8 of every type in the profiles.
func parseLimits(s string, pf *profile.File) (map[profile.WorkerTypeID]int, error) {
	known := map[profile.WorkerTypeID]bool{}
	var names []string
	for _, w := range pf.Workers {
		known[w.Type] = true
		names = append(names, string(w.Type))
	}
	out := map[profile.WorkerTypeID]int{}
	if s == "" {
		for t := range known {
			out[t] = 8
		}
		return out, nil
	}
	for _, part := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		n, err := strconv.Atoi(v)
		if !ok || err != nil || n < 0 {
			return nil, fmt.Errorf("%q: want TYPE=N with N >= 0", part)
		}
		if !known[profile.WorkerTypeID(k)] {
			return nil, fmt.Errorf("worker type %q is not in the profiles (known: %s)", k, strings.Join(names, ", "))
		}
		out[profile.WorkerTypeID(k)] = n
	}
	return out, nil
}

func parseSize(s string) (int, int, error) {
	ws, hs, ok := strings.Cut(s, "x")
	w, err1 := strconv.Atoi(ws)
	h, err2 := strconv.Atoi(hs)
	if !ok || err1 != nil || err2 != nil {
		return 0, 0, fmt.Errorf("%q: want WxH, e.g. 640x480", s)
	}
	return w, h, nil
}

func statusHandler(e *coordinator.Engine) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/status", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		writeJSON(w, e.Status(), true)
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "ok") })
	return mux
}

func runStatus(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("status", "[--server ADDR] [-o table|json] [--token-env VAR]", stderr)
	server := fs.String("server", "http://127.0.0.1:8080", "the mdag serve address: host:port (http:// assumed) or an http:// or https:// URL")
	out := fs.String("o", "table", "output: table or json")
	tokenEnv := fs.String("token-env", "MDAG_TOKEN", "environment variable holding an api bearer token (a server started with --tokens needs one); not a flag, so it stays out of the shell's history")
	if code, ok := parseFlags(fs, args); !ok {
		return code
	}
	if *out != "table" && *out != "json" {
		fmt.Fprintf(stderr, "mdag status: -o %q: want table or json\n", *out)
		return exitInvalid
	}
	base, err := serverBase(*server)
	if err != nil {
		fmt.Fprintf(stderr, "mdag status: --server %q: %v\n", *server, err)
		return exitInvalid
	}
	c := &http.Client{Timeout: 5 * time.Second}
	req, err := http.NewRequest("GET", base+"/v1/status", nil)
	if err != nil {
		fmt.Fprintf(stderr, "mdag status: --server %q: %v\n", *server, err)
		return exitInvalid
	}
	if tok := os.Getenv(*tokenEnv); tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := c.Do(req)
	if err != nil {
		fmt.Fprintf(stderr, "mdag status: %v\n", err)
		return exitFailure
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusUnauthorized {
		fmt.Fprintf(stderr, "mdag status: %s answered %s: the server has --tokens; put an api token in $%s\n", *server, resp.Status, *tokenEnv)
		return exitFailure
	}
	if resp.StatusCode != http.StatusOK {
		fmt.Fprintf(stderr, "mdag status: %s answered %s\n", *server, resp.Status)
		return exitFailure
	}
	var st coordinator.Status
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		fmt.Fprintf(stderr, "mdag status: bad answer from %s: %v\n", *server, err)
		return exitFailure
	}
	if *out == "json" {
		writeJSON(stdout, st, true)
		return exitOK
	}
	writeStatusTable(stdout, st)
	// WebRTC ingest's admission (refused, pending, shed streams), where
	// the server has it.
	if req, err = http.NewRequest("GET", base+"/v1/ingest", nil); err != nil {
		return exitOK
	}
	if tok := os.Getenv(*tokenEnv); tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	if resp, err := c.Do(req); err == nil {
		var adm ingest.Admission
		if resp.StatusCode == http.StatusOK && json.NewDecoder(resp.Body).Decode(&adm) == nil {
			writeIngestLine(stdout, adm)
		}
		resp.Body.Close()
	}
	return exitOK
}

// serverBase is --server as the base URL of the API: host:port (as
// workers and sources take it; http:// is assumed) or an http:// or
// https:// URL, with any path kept and its trailing '/' removed.
func serverBase(s string) (string, error) {
	const want = "want host:port (http:// is assumed) or an http:// or https:// URL, e.g. 127.0.0.1:8080"
	s = strings.TrimSpace(s)
	raw := s
	if !strings.Contains(s, "://") {
		raw = "http://" + s
	}
	u, err := url.Parse(raw)
	switch {
	case s == "":
		return "", errors.New("empty: " + want)
	case err != nil:
		return "", errors.New("not an address: " + want)
	case u.Scheme != "http" && u.Scheme != "https":
		return "", fmt.Errorf("scheme %q: %s", u.Scheme, want)
	case u.Hostname() == "" || u.Opaque != "":
		return "", errors.New("no host: " + want)
	case u.User != nil || u.RawQuery != "" || u.Fragment != "" || strings.HasSuffix(s, "?") || strings.Contains(s, "#"):
		return "", errors.New("user information, a query or a fragment: " + want)
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return "", fmt.Errorf("port %q: want 1..65535", p)
		}
	}
	return strings.TrimRight(u.String(), "/"), nil
}

// loud is an ingest stream's waiting reason to print: what happened
// (before the first ':') in capitals, the rest (a camera's error, with its
// URL) as it is.
func loud(s string) string {
	head, rest, ok := strings.Cut(s, ":")
	if !ok {
		return strings.ToUpper(s)
	}
	return strings.ToUpper(head) + ":" + rest
}

// writeIngestLine prints the WHIP admission state: streams admitted and
// pending, the CPU load against capacity, refusals and server-ended
// streams by reason.
func writeIngestLine(w io.Writer, a ingest.Admission) {
	fmt.Fprintf(w, "ingest: %d streams admitted (max %d), %d pending (max %d); CPU load %.2f of %.2f cores admission fills, a new stream ~%.2f",
		a.Admitted, a.MaxStreams, a.Pending, a.MaxPending, a.LoadCores, a.CapacityCores, a.StreamCost)
	if a.OverloadedFor > 0 {
		fmt.Fprintf(w, "; OVERLOADED for %v", a.OverloadedFor.Round(time.Second))
	}
	fmt.Fprintln(w)
	for _, m := range []struct {
		what string
		n    map[string]uint64
	}{{"refused", a.Refused}, {"ended", a.Ended}} {
		if len(m.n) == 0 {
			continue
		}
		keys := make([]string, 0, len(m.n))
		for k := range m.n {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		fmt.Fprintf(w, "  streams %s:", m.what)
		for _, k := range keys {
			fmt.Fprintf(w, " %s=%d", k, m.n[k])
		}
		fmt.Fprintln(w)
	}
	// The live streams: codec, size, layer, where from; a lost camera
	// loudly.
	for _, s := range a.Streams {
		parts := []string{s.App, s.State, s.Codec}
		if s.Width > 0 {
			parts = append(parts, fmt.Sprintf("%dx%d", s.Width, s.Height))
		}
		if s.Layer != "" {
			l := "layer " + s.Layer + " of " + strings.Join(s.Layers, ", ")
			if s.LayerDown > 0 {
				l += fmt.Sprintf(" (%d down: decoding behind or overloaded)", s.LayerDown)
			}
			parts = append(parts, l)
		}
		parts = append(parts, s.Source)
		if s.CameraLost > 0 {
			parts = append(parts, fmt.Sprintf("camera lost %d times", s.CameraLost))
		}
		fmt.Fprintf(w, "  stream %s: %s", s.ID, strings.Join(slices.DeleteFunc(parts, func(p string) bool { return p == "" }), ", "))
		if s.Waiting != "" {
			fmt.Fprintf(w, "; %s", loud(s.Waiting))
		}
		fmt.Fprintln(w)
	}
	// The cameras: one that is not streaming says why, loudly.
	for _, c := range a.Cameras {
		fmt.Fprintf(w, "  camera %s: %s, %s, %s", c.Name, c.App, c.Source, c.State)
		if c.Reconnects > 0 || c.CameraLost > 0 {
			fmt.Fprintf(w, ", %d reconnects, lost %d times", c.Reconnects, c.CameraLost)
		}
		if c.State != "streaming" && c.LastError != "" {
			fmt.Fprintf(w, "; DOWN %v: %s", c.Down.Round(time.Second), c.LastError)
		}
		fmt.Fprintln(w)
	}
}

// writeStatusTable prints sessions, modules, instances and the last re-plans.
func writeStatusTable(w io.Writer, st coordinator.Status) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, s := range st.Sessions {
		fmt.Fprintf(tw, "app %s: %d streams at %g fps, SLO %g ms, policy %s\n", s.App, s.Streams, s.FPS, s.SLOMS, st.Policy)
		fmt.Fprintf(tw, "  frames sent %d, finished %d, late %d, dropped %d, open %d; finish rate %.2f%% (last second %.2f%%)\n",
			s.Total.Sent, s.Total.Finished, s.Total.Late, s.Total.Dropped, s.Open, 100*s.FinishRateAll, 100*s.FinishRate)
		fmt.Fprintf(tw, "  latency p50 %.1f ms, p99 %.1f ms; cost $%.2f/h whole instances, $%.2f/h allocated\n", s.P50MS, s.P99MS, s.CostWhole, s.CostFractional)
		if s.IngestP95MS > 0 || s.IngestReserve > 0 {
			fmt.Fprintf(tw, "  ingest delay p95 %.1f ms (capture to the session; the plan reserves %.0f ms of the SLO for it)\n", s.IngestP95MS, s.IngestReserve)
		}
		if s.CriticalPath != "" {
			fmt.Fprintf(tw, "  critical path %s: %.1f ms planned\n", s.CriticalPath, s.CriticalMS)
		}
		if s.Degraded != "" {
			fmt.Fprintf(tw, "  DEGRADED (plan carries %.0f%% of the frames): %s\n", 100*s.Admitted, strings.TrimPrefix(s.Degraded, "degraded: "))
		}
		if len(s.Drops) > 0 {
			keys := make([]string, 0, len(s.Drops))
			for k := range s.Drops {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			fmt.Fprint(tw, "  drops:")
			for _, k := range keys {
				fmt.Fprintf(tw, " %s=%d", k, s.Drops[k])
			}
			fmt.Fprintln(tw)
		}
		fmt.Fprintln(tw, "  MODULE\tKIND\tIN/S\tSCALE\tEXEC MS\tBALLOON\tBATCH\tBUDGET MS\tINSTANCES\tDROPPED")
		for _, m := range s.Modules {
			fmt.Fprintf(tw, "  %s\t%s\t%.1f\t%.2f\t%.2f\t%.2f\t%.2f\t%.1f\t%d\t%d\n", m.Module, m.Kind, m.RateIn, m.Scale, m.ExecMS, m.Balloon, m.MeanBatch, m.BudgetMS, m.Instances, m.Dropped)
		}
		for _, m := range s.Modules {
			if st := m.State; st != nil {
				fmt.Fprintf(tw, "  state of %s: %d streams, migrations %d (pause p50 %.2f ms, p99 %.2f ms), restores %d, resets %d, failed moves %d\n",
					m.Module, st.Streams, st.Events["migrate"], st.PauseP50MS, st.PauseP99MS, st.Events["restore"], st.Events["reset"], st.Events["failed"])
			}
		}
	}
	fmt.Fprintln(tw, "INSTANCE\tTYPE\tSTATE\tMODULES")
	for _, in := range st.Instances {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", in.ID, in.Type, in.State, strings.Join(in.Modules, " "))
	}
	tw.Flush()
	if n := len(st.Replans); n > 0 {
		fmt.Fprintf(w, "last re-plans (%d shown):\n", min(n, 5))
		for _, r := range st.Replans[max(0, n-5):] {
			fmt.Fprintf(w, "  #%d %s: %s (moves: %d, $%.2f/h)\n", r.N, r.At.Format("15:04:05.000"), r.Trigger, len(r.Moves), r.CostWhole)
		}
	}
}

// headroomHelp is --headroom's (serve and coordinator).
const headroomHelp = "plan for this many times the ingress rate, so instances run below saturation (1.25: 80% planned utilisation); 1 plans for the rate seen and leaves bursts to the finish-rate rule (cheaper: docs/evaluation.md's headroom ablation)"

// validHeadroom says whether --headroom is a finite number >= 1.
func validHeadroom(h float64) bool { return h >= 1 && !math.IsInf(h, 0) }

const warmupHelp = "warm each GPU module up where it is loaded (a batch of each power-of-two size its latency budget allows, on a blank frame) before it serves frames, so they do not meet a cold executor; false: it serves at once"
