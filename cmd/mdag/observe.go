package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/mdag/mdag/allocator/milp"
	"github.com/mdag/mdag/coordinator"
	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/egress"
	"github.com/mdag/mdag/gpu"
	"github.com/mdag/mdag/gpu/nvml"
	"github.com/mdag/mdag/ingest"
	"github.com/mdag/mdag/internal/auth"
	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/media"
	"github.com/mdag/mdag/observe/dashboard"
	"github.com/mdag/mdag/observe/metrics"
	"github.com/mdag/mdag/outputs"
	"github.com/mdag/mdag/profile"
)

// newMetrics is the process's metrics with the runtime collectors and this
// machine's GPU telemetry.
func newMetrics() *metrics.Metrics {
	mx := metrics.New(true)
	mx.SetGPU(gpuMetrics)
	return mx
}

// gpuMetrics reads NVML for the exposition.
func gpuMetrics() metrics.GPUSnapshot { return toGPUMetrics(nvml.Telemetry()) }

// toGPUMetrics converts NVML telemetry (MiB, percent) to the exposition's
// units (bytes, ratio).
func toGPUMetrics(s nvml.Snapshot) metrics.GPUSnapshot {
	out := metrics.GPUSnapshot{Available: s.Available}
	for _, d := range s.Devices {
		gd := metrics.GPUDevice{Index: strconv.Itoa(d.Index), Name: d.Name, UtilRatio: float64(d.UtilGPU) / 100,
			MemUsed: d.MemUsedMiB << 20, MemTotal: d.MemTotalMiB << 20, Processes: len(d.Processes)}
		for _, p := range d.Processes {
			if p.Current {
				gd.CurrentUsed += p.MemMiB << 20
			}
		}
		out.Devices = append(out.Devices, gd)
	}
	return out
}

// observed is the HTTP face of a coordinator: status, metrics, the
// dashboard and WHIP ingest on one mux.
type observed struct {
	e       *coordinator.Engine
	mx      *metrics.Metrics
	rec     *dashboard.Recorder
	ws      webIngest   // nil: no WHIP ingest (the lean build has none)
	auth    *auth.Store // --tokens (nil: none): the API needs an api token
	hosts   []string    // --allowed-hosts: Host names a loopback --listen answers besides local ones
	log     *slog.Logger
	results *frameSink                   // the engine's OnFrame: results to the WHIP server
	outs    *outputs.Hub                 // the app's outputs (nil: none)
	clips   atomic.Pointer[clipRecorder] // the app's clips (nil: none)
	// eg keeps the frames of streams someone watches over WHEP and draws
	// their results (a stream nobody watches costs a timestamp a frame);
	// whep serves them (nil: none, the lean build has no WebRTC).
	eg   *egress.Hub
	whep http.Handler
	// whepSummary is WHEP's line in serve's summary ("": no WHEP).
	whepSummary func() string
}

// webIngest is WebRTC (WHIP) ingest as the HTTP face and the summaries
// see it: a *whip.Server (whip.go, set by setWhip) in the full build.
type webIngest interface {
	Handler() http.Handler
	RequireToken(h http.Handler) http.Handler
	Admission() ingest.Admission
}

// whipFlagNames are the flags addWhipFlags gives serve and coordinator,
// and whipBoolFlags those of them that take no value. The lean build
// refuses each by name (whip_lean.go); TestWhipFlagNames checks the lists
// against the full build's flags.
var (
	whipFlagNames = []string{"allow-origin", "token-file", "open", "offer-rate", "offer-burst", "offer-rate-ip", "offer-burst-ip", "max-streams", "max-pending", "connect-timeout", "cpu-cores",
		"cpu-ceiling", "stream-cost", "cpu-machine", "shed-after", "max-resolution", "oversize", "udp-ports", "public-ip", "emulate-objects", "codecs",
		"whep-max-viewers", "whep-max-per-stream", "whep-bitrate"}
	whipBoolFlags = []string{"open", "cpu-machine"}
)

// frameSink is an engine OnFrame that forwards results to the WHIP
// server's clients, once one is set, and the boxes of each result that is
// not a drop to the stream's dashboard thumbnail.
type frameSink struct {
	publish atomic.Pointer[func(coordinator.FrameResult)]
	thumbs  atomic.Pointer[dashboard.Thumbs]
	outputs atomic.Pointer[outputs.Hub]
	egress  atomic.Pointer[egress.Hub]
	clips   atomic.Pointer[clipRecorder]
}

func (f *frameSink) onFrame(r coordinator.FrameResult) {
	if th := f.thumbs.Load(); th != nil && r.Outcome != coordinator.Dropped {
		th.SetBoxes(r.Stream, r.Boxes)
	}
	if p := f.publish.Load(); p != nil {
		(*p)(r)
	}
	if h := f.outputs.Load(); h != nil {
		h.Add(outputResult(r))
	}
	if h := f.egress.Load(); h != nil {
		h.Result(egress.Result{Stream: r.Stream, Seq: r.Seq, Dropped: r.Outcome == coordinator.Dropped, Boxes: r.Boxes, Tracks: r.Tracks, Labels: r.Labels})
	}
	if c := f.clips.Load(); c != nil && len(r.Events) > 0 {
		c.onFrame(r)
	}
}

// startObserved starts an engine with metrics and its results wired
// (embedded, with in-process workers up to limits; or, with limits nil, a
// coordinator whose workers register), deploys app and starts the
// dashboard's recorder. Close stops both. In-process emulated GPUs get the
// realistic variance model (startObservedWith chooses another).
func startObserved(cfg coordinator.Config, limits map[profile.WorkerTypeID]int, app *dag.App, prof *profile.File) (*observed, error) {
	return startObservedWith(cfg, limits, app, prof, gpu.Realistic())
}

// startObservedWith is startObserved with the in-process emulated GPUs'
// variance model v (`--variance`).
func startObservedWith(cfg coordinator.Config, limits map[profile.WorkerTypeID]int, app *dag.App, prof *profile.File, v gpu.Variance) (*observed, error) {
	// the WHEP ring holds a watched stream's frames until their results
	// come (the SLO and a second, at least 2 s, at the app's rate, at
	// least 64 frames): a frame leaves it with its result, so it holds
	// about the frames in flight, which the engine holds too; the viewers'
	// limits bound how many streams are watched
	age := max(2*time.Second, app.SLO+time.Second)
	frames := max(64, int(math.Ceil(max(app.FPS, 30)*age.Seconds())))
	o := &observed{mx: newMetrics(), results: &frameSink{}, log: cfg.Log,
		eg: egress.New(egress.Config{MaxAge: age, MaxFrames: frames, MaxBytes: int64(frames) * 1920 * 1080 * 3})}
	o.results.egress.Store(o.eg)
	if o.log == nil {
		o.log = slog.New(slog.DiscardHandler)
	}
	cfg.OnFrame, cfg.Observer, cfg.Ops = o.results.onFrame, coordinator.Observe(o.mx), ops()
	if cfg.MILPSolver == nil {
		cfg.MILPSolver = milp.Solver{} // the engine plans with the MILP (lp_solve), handed in here
	}
	var err error
	if limits != nil {
		var l *coordinator.Local
		if o.e, l, err = coordinator.NewEmbedded(cfg, limits); err == nil {
			l.Variance = v // before Start: the loop starts the instances
		}
	} else {
		o.e, err = coordinator.New(cfg)
	}
	if err != nil {
		return nil, err
	}
	o.e.Start()
	o.mx.SetLoop(func() metrics.Loop { l := o.e.Loop(); return metrics.Loop{Busy: l.Busy, Events: l.Events} })
	if err := o.e.Deploy(app, prof); err != nil {
		o.e.Close()
		return nil, err
	}
	o.rec = dashboard.New(dashboard.Config{Log: cfg.Log, Thumbs: thumbEncoder}, o.e.Status)
	o.results.thumbs.Store(o.rec.Thumbs())
	o.rec.Start()
	return o, nil
}

// settle waits (at most the SLO and 2 s) for the frames in flight to end,
// so a summary accounts for all of them.
func (o *observed) settle(slo time.Duration) {
	end := time.Now().Add(slo + 2*time.Second)
	for time.Now().Before(end) && o.e.Status().Sessions[0].Open > 0 {
		<-time.After(20 * time.Millisecond)
	}
}

// serveHTTP listens on addr and serves every endpoint; it returns the
// base URL and the server to close.
func (o *observed) serveHTTP(addr string) (string, *http.Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, err
	}
	hs := newHTTPServer(o.handler(), ln, o.hosts)
	go func() { _ = hs.Serve(ln) }()
	return "http://" + ln.Addr().String(), hs, nil
}

// sink is the engine as a WHIP sink whose frames also feed the thumbnails.
func (o *observed) sink() tapSink { return tapSink{o.e, o.rec.Thumbs(), o.eg, &o.clips} }

// ingest is e.Ingest feeding the thumbnails (for in-process sources).
func (o *observed) ingest(stream string, seq uint64, capture time.Time, f *media.Frame, truth []media.Box) error {
	return o.sink().Ingest(stream, seq, capture, f, truth)
}

// startOutputs starts the app's outputs (its `outputs:`), their spools
// under stateDir when the YAML names no directory, and puts their figures
// in the metrics, the dashboard and GET /v1/outputs.
func (o *observed) startOutputs(app *dag.App, stateDir string) error {
	h, err := startOutputs(app, stateDir, o.log)
	if err != nil || h == nil {
		return err
	}
	o.outs = h
	o.results.outputs.Store(h)
	o.rec.SetOutputs(h.Status)
	o.mx.SetOutputs(func() []metrics.Output {
		var out []metrics.Output
		for _, s := range h.Status() {
			out = append(out, metrics.Output{App: string(app.Name), Name: s.Name, Connected: s.Connected, Published: s.Published, Retried: s.Retried,
				Rejected: s.Rejected, DroppedFull: s.DroppedFull, Expired: s.Expired, DroppedBusy: s.DroppedBusy, Corrupt: s.Corrupt, Unspooled: s.Unspooled, Waiting: s.Waiting,
				SpoolBytes: s.SpoolBytes, LagSeconds: s.LagSeconds})
		}
		return out
	})
	return nil
}

// flushOutputs waits, at most limit, for the outputs to send what waits
// in their spools (an output that is down is not waited for: its
// messages stay spooled for the next start).
func (o *observed) flushOutputs(limit time.Duration) {
	if o.outs == nil {
		return
	}
	for end := time.Now().Add(limit); time.Now().Before(end); {
		busy := false
		for _, s := range o.outs.Status() {
			busy = busy || s.Queued > 0 || (s.Waiting > 0 && s.Connected)
		}
		if !busy {
			return
		}
		<-time.After(20 * time.Millisecond)
	}
}

// startClips starts the app's clips (its `clips:`): frames ingested feed
// their rings, results' events make clips, GET /v1/clips lists them.
func (o *observed) startClips(app *dag.App, stateDir string) error {
	c, err := startClips(app, stateDir, o.log)
	if err != nil || c == nil {
		return err
	}
	o.clips.Store(c)
	o.results.clips.Store(c)
	o.rec.SetClips(c.status)
	o.mx.SetClips(func() []metrics.Clips { return []metrics.Clips{c.metrics()} })
	return nil
}

// closeClips writes the clips being recorded (the run has ended: serve's
// summary counts them) and returns the recorder, nil without clips. The
// clips stay listed and served.
func (o *observed) closeClips() *clipRecorder {
	c := o.clips.Load()
	if c != nil {
		c.Close()
	}
	return c
}

// Close stops the recorder, then the coordinator, then the clips (the
// clips being recorded are written) and the outputs (what they have not
// sent stays in their spools for the next start).
func (o *observed) Close() {
	o.rec.Close()
	o.e.Close()
	if c := o.clips.Load(); c != nil {
		o.results.clips.Store(nil)
		o.clips.Store(nil)
		c.Close()
	}
	if o.outs != nil {
		o.results.outputs.Store(nil)
		o.outs.Close()
	}
}

// handler routes every endpoint; "/" is the dashboard. With --tokens the
// status, the dashboard (its page, history, event stream and thumbnails),
// event clips (/v1/clips) and /metrics need an api token (Authorization: Bearer; the dashboard's
// page, history, event stream, thumbnails and clips also take ?access_token=,
// for the browser's EventSource and img; /v1/status and /metrics take the
// header only; a browser opening / without a valid token gets the 401 as
// the dashboard's sign-in page, dashboard.SignIn); /healthz and the
// dashboard's static code (/dashboard/: no data) stay open.
func (o *observed) handler() http.Handler {
	api := func(h http.Handler) http.Handler { return o.auth.Require(auth.API, true, h) }
	// what only programs read (curl, Prometheus, mdag status) takes the
	// header alone: a token in a URL lands in proxy and access logs
	apiHeader := func(h http.Handler) http.Handler { return o.auth.Require(auth.API, false, h) }
	logs := &auth.LogLimiter{Clock: clock.Real{}, Log: o.log, Every: 10 * time.Second}
	o.auth.OnRefuse(func(r *http.Request) {
		o.mx.HTTPRefused("unauthorized")
		logs.Warn("unauthorized", "HTTP API request refused: no valid api token", "method", r.Method, "path", r.URL.Path, "client", r.RemoteAddr)
	})
	mux := http.NewServeMux()
	if o.ws != nil {
		h := o.ws.Handler()
		for _, p := range []string{"/whip/", "/v1/streams", "/v1/streams/", "/v1/ingest", "/stream/", "/static/"} {
			mux.Handle(p, h)
		}
	}
	if o.whep != nil {
		// annotated video is camera pixels: the thumbnails' rule
		var h http.Handler
		switch {
		case o.auth.GatesAPI():
			h = api(o.whep)
		case o.ws != nil:
			h = o.ws.RequireToken(o.whep)
		default:
			h = o.whep
		}
		mux.Handle("/whep/", h)
		mux.Handle("GET /v1/whep", h)
	}
	// the player (the stream page's and the dashboard's) is code, no
	// data: open, like /dashboard/; without WHEP a stub that defines
	// nothing, so the pages hide their players
	mux.HandleFunc("GET /whep/player.js", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/javascript; charset=utf-8")
		w.Header().Set("Cache-Control", "no-cache")
		if o.whep != nil {
			_, _ = w.Write(whepPlayerJS)
			return
		}
		_, _ = io.WriteString(w, "// no WHEP (annotated video out) on this server: "+noWhepWhy+"\n")
	})
	mux.Handle("GET /metrics", apiHeader(o.mx.Handler()))
	d := o.rec.Handler()
	// a browser opening the page without a valid token is shown how to
	// get one (401, the sign-in page); programs get the plain 401
	mux.Handle("GET /{$}", o.auth.RequirePage(auth.API, dashboard.SignIn(), d))
	for _, p := range []string{"GET /v1/dashboard", "GET /v1/dashboard/events"} {
		mux.Handle(p, api(d))
	}
	mux.Handle("GET /dashboard/", d)
	// Thumbnails are camera pixels: they need a token when ingest does
	// (the page passes its own ?access_token= on), an api token with
	// --tokens.
	// Event clips are camera pixels too, gated the same way (the
	// dashboard's links carry its ?access_token=).
	pixels := func(h http.Handler) http.Handler {
		switch {
		case o.auth.GatesAPI():
			return api(h)
		case o.ws != nil:
			return o.ws.RequireToken(h)
		}
		return h
	}
	mux.Handle("GET /v1/thumbs/{stream}", pixels(d))
	mux.Handle("GET /v1/clips", pixels(clipsList(o.clips.Load)))
	mux.Handle("GET /v1/clips/{name}", pixels(clipFile(o.clips.Load)))
	st := statusHandler(o.e)
	mux.Handle("GET /v1/status", apiHeader(st))
	mux.Handle("POST /v1/instances/{id}/drain", sameOrigin(apiHeader(drainHandler(o.e, o.log))))
	mux.Handle("GET /healthz", st)
	mux.Handle("GET /v1/outputs", apiHeader(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var st []outputs.Status
		if o.outs != nil {
			st = o.outs.Status()
		}
		if st == nil {
			st = []outputs.Status{}
		}
		w.Header().Set("Content-Type", "application/json")
		writeJSON(w, st, true)
	})))
	try := "/ for the dashboard, /metrics, /v1/status, /v1/outputs, /v1/clips, POST /v1/instances/{id}/drain"
	if o.ws != nil {
		try += ", /v1/streams, /whip/{app}"
	}
	if o.whep != nil {
		try += ", /whep/{app}/{stream}, /v1/whep"
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, fmt.Sprintf("no such endpoint: %s %s (try %s)", r.Method, r.URL.Path, try), http.StatusNotFound)
	})
	return mux
}

type tapSink struct {
	e      *coordinator.Engine
	thumbs *dashboard.Thumbs
	eg     *egress.Hub                   // nil: no WHEP out
	clips  *atomic.Pointer[clipRecorder] // nil or holding nil: no clips
}

func (t tapSink) Join(app dag.AppID, id string) error { return t.e.Join(app, id) }

// Admit forwards to the engine (whip.Admitter): a session whose plan is
// degraded or whose ingest is saturated refuses new streams.
func (t tapSink) Admit(app dag.AppID) error { return t.e.Admit(app) }

// Saturated forwards to the engine (whip.Saturation): frames reaching the
// session later than half the SLO make the server shed its newest streams.
func (t tapSink) Saturated(app dag.AppID) bool { return t.e.Saturated(app) }

func (t tapSink) Leave(id string) error {
	if c := t.clipRec(); c != nil {
		c.EndStream(id)
	}
	return t.e.Leave(id)
}

func (t tapSink) clipRec() *clipRecorder {
	if t.clips == nil {
		return nil
	}
	return t.clips.Load()
}

// Ingest hands the frame on first: a thumbnail (about 1 ms once a second
// per stream) never delays it. Frames are read-only once ingested.
func (t tapSink) Ingest(id string, seq uint64, capture time.Time, f *media.Frame, truth []media.Box) error {
	if t.eg != nil {
		// before the engine: a frame it drops at once (shed, no plan)
		// reports its result inside Ingest, and is sent undrawn
		t.eg.Ingest(id, seq, f)
	}
	err := t.e.Ingest(id, seq, capture, f, truth)
	if err == nil {
		t.thumbs.Offer(id, f)
		if c := t.clipRec(); c != nil { // queued for the stream's encoder (clips: the app's clips section); never waits for it
			c.Frame(id, seq, capture, f)
		}
	}
	return err
}

// sameOrigin refuses (403) a state-changing request that a web page of
// another origin sent: a browser marks it (Sec-Fetch-Site other than
// same-origin or none, or an Origin whose host is not the request's).
// Without it a page the operator opened drained an instance with a plain
// cross-site POST (202, a re-plan), token or not when none is required.
// Programs (curl, mdag) send neither header and pass.
func sameOrigin(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		why := ""
		if s := r.Header.Get("Sec-Fetch-Site"); s != "" && s != "same-origin" && s != "none" {
			why = "Sec-Fetch-Site " + s
		}
		if o := r.Header.Get("Origin"); o != "" && why == "" {
			if u, err := url.Parse(o); err != nil || u.Host != r.Host {
				why = "Origin " + o + " is not " + r.Host
			}
		}
		if why != "" {
			http.Error(w, fmt.Sprintf("%s %s: refused: a cross-site request (%s); send it from a program or this server's own pages", r.Method, r.URL.Path, why), http.StatusForbidden)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// drainHandler is POST /v1/instances/{id}/drain: the coordinator moves
// everything off the instance (stateful modules' state with their
// streams) and keeps it empty; 202 with what it does, 404 for an unknown
// instance.
func drainHandler(e *coordinator.Engine, log *slog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		if err := e.Drain(id); err != nil {
			code := http.StatusInternalServerError
			if errors.Is(err, coordinator.ErrUnknownInstance) {
				code = http.StatusNotFound
			}
			http.Error(w, fmt.Sprintf("drain %s: %v", id, err), code)
			return
		}
		log.Info("drain requested over the API", "instance", id, "client", r.RemoteAddr)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusAccepted)
		fmt.Fprintf(w, "{\"instance\": %q, \"state\": \"draining\", \"what\": \"the next plan moves its modules elsewhere; stateful modules move each stream's state with it; see /v1/status\"}\n", id)
	})
}

// checkpointFlag maps --checkpoint to coordinator.Config.Checkpoint: 0
// (never) is negative there, where 0 means the default.
func checkpointFlag(d time.Duration) time.Duration {
	if d <= 0 {
		return -1
	}
	return d
}
