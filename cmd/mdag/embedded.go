package main

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/mdag/mdag/coordinator"
	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/examples"
	"github.com/mdag/mdag/gpu"
	"github.com/mdag/mdag/profile"
	"github.com/mdag/mdag/scheduler"
)

// What the commands that run an engine in this process share (serve and
// demo; the coordinator's flags and helpers too): the running parts and
// the flags of the app and of the API around the engine.

// embedded is an engine running in this process, observed (metrics, the
// dashboard), and its HTTP API: the running parts serve and demo share.
// close stops what was started, the last first, as deferred calls would.
type embedded struct {
	app  *dag.App
	log  *slog.Logger
	obs  *observed
	base string // the HTTP API's URL
	td   teardown
}

// onClose has close call f (before what was started earlier).
func (r *embedded) onClose(f func()) { r.td.add(f) }

// close stops everything started, the last first.
func (r *embedded) close() { r.td.run() }

// startEngine starts the engine with in-process workers up to limits (the
// emulated GPUs' variance v) and deploys the app.
func (r *embedded) startEngine(cfg coordinator.Config, limits map[profile.WorkerTypeID]int, prof *profile.File, v gpu.Variance) error {
	obs, err := startObservedWith(cfg, limits, r.app, prof, v)
	if err != nil {
		return err
	}
	r.obs = obs
	r.onClose(obs.Close)
	return nil
}

// listen serves the HTTP API (every endpoint) on addr.
func (r *embedded) listen(addr string) error {
	base, hs, err := r.obs.serveHTTP(addr)
	if err != nil {
		return err
	}
	r.base = base
	r.onClose(func() { _ = hs.Close() })
	return nil
}

// waitWarm waits, at most limit, for the instances planned for the app's
// first streams to warm up, as cameras come to a service started before
// them: their first frames would otherwise wait out the warm-up (ONNX
// Runtime's first runs of each batch size, slower still under -race;
// caption's S2VT 3.4 s, more than its SLO) and miss the SLO. Past limit,
// they start cold, logged as cold.
func (r *embedded) waitWarm(limit time.Duration, cold string) {
	if err := r.obs.e.WaitReady(r.app.Name, limit); err != nil {
		r.log.Warn(cold, "err", err)
	}
}

// apiFlags are the flags of what serve (and the coordinator) run around
// the engine: the HTTP API and its credentials, WHIP ingest, RTSP cameras
// and the state store.
type apiFlags struct {
	listen   string
	stateDir *string
	wf       *whipFlags
	af       *authFlags
	cf       *cameraFlags
}

func (a *apiFlags) flags(fs *flag.FlagSet) {
	fs.StringVar(&a.listen, "listen", "127.0.0.1:8080", "HTTP address for /v1/status and /healthz")
	a.wf = addWhipFlags(fs)
	a.af = addAuthFlags(fs)
	a.cf = addCameraFlags(fs)
	a.stateDir = addStateFlag(fs)
}

// check reports every problem with the flags alone (WHIP's and WHEP's;
// the files they name are read when start loads them).
func (a *apiFlags) check() []error { return a.wf.check() }

// serveAPI starts what runs around the engine (apiFlags.start), then the
// HTTP API on --listen.
func (r *embedded) serveAPI(a *apiFlags) error {
	if err := a.start(r.obs, r.app, r.log, &r.td); err != nil {
		return err
	}
	return r.listen(a.listen)
}

// start starts, for app on obs, what runs around the engine before the
// cameras: the app's outputs and clips, the HTTP API's credentials, WHIP
// ingest, the guard on a non-loopback --listen and /metrics without a
// token (--metrics-listen); td stops them.
func (a *apiFlags) start(obs *observed, app *dag.App, log *slog.Logger, td *teardown) error {
	if err := obs.startOutputs(app, *a.stateDir); err != nil {
		return err
	}
	if err := obs.startClips(app, *a.stateDir); err != nil {
		return err
	}
	warnNoState(*a.stateDir, log)
	obs.hosts = a.af.hosts()
	var err error
	if obs.auth, err = a.af.load(log); err != nil {
		return invalid(err)
	}
	closeWhip, err := a.wf.attach(a.listen, app, obs, log)
	if err != nil {
		return invalid(err)
	}
	td.add(closeWhip)
	if err := guardListen(a.listen, obs.auth, log); err != nil {
		return invalid(err)
	}
	addr, ms, err := obs.serveMetrics(*a.af.metricsListen)
	if err != nil {
		return err
	}
	if ms != nil {
		td.add(func() { _ = ms.Close() })
		log.Info("serving /metrics without a token", "metrics_listen", "http://"+addr+"/metrics")
	}
	return nil
}

// appInputs are -f, -p and --example: the app a command runs and its
// profiles.
type appInputs struct{ file, profiles, example string }

// flags binds them; verb says what the command does with an example.
func (in *appInputs) flags(fs *flag.FlagSet, verb string) {
	fs.StringVar(&in.file, "f", "", "app YAML file")
	fs.StringVar(&in.profiles, "p", "", "profiles YAML file (with -f)")
	fs.StringVar(&in.example, "example", "", verb+" an embedded example app instead of -f/-p (e.g. traffic)")
}

// problem says what is wrong with the flags given (nil: nothing); load
// finds what is wrong with the files.
func (in appInputs) problem() error {
	switch {
	case in.example != "" && (in.file != "" || in.profiles != ""):
		return errors.New("give --example or -f/-p, not both")
	case in.example != "":
		if _, err := examples.App(in.example); err != nil {
			return fmt.Errorf("--example %q: unknown (known: %s)", in.example, strings.Join(examples.Names(), ", "))
		}
	case in.file == "" || in.profiles == "":
		return errors.New("need -f app.yaml and -p profiles.yaml, or --example NAME")
	}
	return nil
}

// load parses the app and its profiles.
func (in appInputs) load() (*dag.App, *profile.File, error) {
	if in.example != "" {
		return examples.Parse(in.example)
	}
	app, err := dag.Load(in.file)
	if err != nil {
		return nil, nil, err
	}
	pf, err := profile.Load(in.profiles)
	return app, pf, err
}

// parseWorkers reads --workers' TYPE=N,... (N >= 0); parseLimits checks
// the types against the profiles.
func parseWorkers(s string) (map[profile.WorkerTypeID]int, error) {
	out := map[profile.WorkerTypeID]int{}
	if s == "" {
		return out, nil
	}
	for _, part := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		n, err := strconv.Atoi(v)
		if !ok || err != nil || n < 0 {
			return nil, fmt.Errorf("%q: want TYPE=N with N >= 0", part)
		}
		out[profile.WorkerTypeID(k)] = n
	}
	return out, nil
}

// parseLimits reads TYPE=N,...; empty means 8 of every type in the profiles.
func parseLimits(s string, pf *profile.File) (map[profile.WorkerTypeID]int, error) {
	out, err := parseWorkers(s)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, w := range pf.Workers {
		names = append(names, string(w.Type))
		if s == "" {
			out[w.Type] = 8
		}
	}
	for _, t := range slices.Sorted(maps.Keys(out)) {
		if !slices.Contains(names, string(t)) {
			return nil, fmt.Errorf("worker type %q is not in the profiles (known: %s)", t, strings.Join(names, ", "))
		}
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

func validPolicy(p string) bool {
	return p == string(scheduler.Symphony) || p == string(scheduler.Clockwork) || p == string(scheduler.Lazy)
}

// headroomHelp is --headroom's (serve and coordinator).
const headroomHelp = "plan for this many times the ingress rate, so instances run below saturation (1.25: 80% planned utilisation); 1 plans for the rate seen and leaves bursts to the finish-rate rule (cheaper: docs/evaluation.md's headroom ablation)"

// validHeadroom says whether --headroom is a finite number >= 1.
func validHeadroom(h float64) bool { return h >= 1 && !math.IsInf(h, 0) }

const warmupHelp = "warm each GPU module up where it is loaded (a batch of each power-of-two size its latency budget allows, on a blank frame) before it serves frames, so they do not meet a cold executor; false: it serves at once"
