// Package dashboard is the operator's view served by `mdag serve` and
// `mdag coordinator` at /: per app the finish rate of every one-second
// window, latency, cost, instances by type, streams with live thumbnails,
// per-module rate, execution time, batch size, scaling and ballooning
// factors, and the timeline of re-plans with their trigger and what they
// changed.
//
// A Recorder samples the engine's status once a second (on the injected
// clock) and keeps the history; GET /v1/dashboard returns it whole and
// GET /v1/dashboard/events streams each new sample as a Server-Sent Event.
// The page (static/, embedded; plain SVG, no third-party code) draws from
// those two and needs nothing from the network.
package dashboard

import (
	"embed"
	"encoding/json"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/mdag/mdag/coordinator"
	"github.com/mdag/mdag/ingest"
	"github.com/mdag/mdag/internal/auth"
	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/outputs"
)

//go:embed static
var static embed.FS

// Config configures a Recorder.
type Config struct {
	Clock    clock.Clock
	Interval time.Duration // sampling period; default 1 s
	Keep     int           // samples and windows kept per app; default 900 (15 min)
	Log      *slog.Logger
	Thumbs   Encoder // thumbnail encoder; default JPEG (pure Go)
}

// Point is one sample of an app.
type Point struct {
	T             int64          `json:"t"` // Unix ms
	Streams       int            `json:"streams"`
	CostWhole     float64        `json:"cost_whole"`
	CostAllocated float64        `json:"cost_allocated"`
	Instances     map[string]int `json:"instances"` // instances serving the app, by worker type
	Modules       []ModulePoint  `json:"modules"`
}

// ModulePoint is one module in a sample.
type ModulePoint struct {
	Module  string  `json:"module"`
	RateIn  float64 `json:"rate_in"`
	ExecMS  float64 `json:"exec_ms"`
	LatMS   float64 `json:"latency_ms"`
	Batch   float64 `json:"batch"`
	Scale   float64 `json:"scale"`
	Balloon float64 `json:"balloon"`
}

// Window is one second of capture times: how its frames ended.
type Window struct {
	T          int64             `json:"t"` // Unix ms of the second's start
	Sent       uint64            `json:"sent"`
	Finished   uint64            `json:"finished"`
	Late       uint64            `json:"late"`
	Dropped    uint64            `json:"dropped"`
	FinishRate float64           `json:"finish_rate"`
	P50MS      float64           `json:"p50_ms"`
	P99MS      float64           `json:"p99_ms"`
	Drops      map[string]uint64 `json:"drops,omitempty"`
}

// App is an app's history and its latest state.
type App struct {
	App     string                     `json:"app"`
	SLOMS   float64                    `json:"slo_ms"`
	FPS     float64                    `json:"fps"`
	Points  []Point                    `json:"points"`
	Windows []Window                   `json:"windows"`
	Latest  *coordinator.SessionStatus `json:"latest,omitempty"`
	Thumbs  []string                   `json:"thumbs"` // streams with a thumbnail (GET /v1/thumbs/{stream})
}

// Snapshot is what the page draws: the whole history (GET /v1/dashboard)
// or what is new since the last sample (each SSE event).
type Snapshot struct {
	Now       int64                        `json:"now"`
	Policy    string                       `json:"policy"`
	Interval  float64                      `json:"interval_s"`
	Apps      []App                        `json:"apps"`
	Replans   []coordinator.Replan         `json:"replans"`
	Instances []coordinator.InstanceStatus `json:"instances"`
	// Ingest is the WebRTC ingest's admission state (refused, pending,
	// shed streams, the decoding load); nil without WHIP ingest.
	Ingest *ingest.Admission `json:"ingest,omitempty"`
	// Outputs are the app outputs' delivery figures (MQTT, NATS,
	// webhooks); none without outputs.
	Outputs []outputs.Status `json:"outputs,omitempty"`
	// Clips are the event clips' figures and the latest clips; nil
	// without a clips section.
	Clips *Clips `json:"clips,omitempty"`
}

// Clips is the event clips' state: what was recorded, written, skipped,
// lost and removed, and the latest clips (GET /v1/clips lists them all).
type Clips struct {
	Dir           string     `json:"dir"`
	Streams       int        `json:"streams"` // being recorded
	Frames        int64      `json:"frames"`
	FramesDropped int64      `json:"frames_dropped"` // the encoder behind
	EncodeErrors  int64      `json:"encode_errors"`
	Events        int64      `json:"events"`
	Limited       int64      `json:"limited"` // events past max_clips_per_stream_per_minute
	Missed        int64      `json:"missed"`  // events with no video
	Written       int64      `json:"written"`
	WriteErrors   int64      `json:"write_errors"`
	RingDrops     int64      `json:"ring_drops"`
	RemovedBytes  int64      `json:"removed_for_bytes"` // clips retention removed to fit max_bytes
	RemovedAge    int64      `json:"removed_for_age"`
	OnDisk        int        `json:"on_disk"`
	DiskBytes     int64      `json:"disk_bytes"`
	MaxBytes      int64      `json:"max_bytes"`
	Latest        []ClipItem `json:"latest"` // newest first
}

// ClipItem is one clip in Clips.Latest.
type ClipItem struct {
	Name          string  `json:"name"` // GET /v1/clips/{name}
	Stream        string  `json:"stream"`
	Start         int64   `json:"start_ms"`
	Seconds       float64 `json:"duration_s"`
	Frames        int     `json:"frames"`
	FramesDropped int     `json:"frames_dropped"`
	Event         string  `json:"event"` // the first event: kind, and rule
	Events        int     `json:"events"`
}

// Recorder samples a status source and keeps its history.
type Recorder struct {
	cfg    Config
	status func() coordinator.Status
	thumbs *Thumbs
	ingest func() ingest.Admission // guarded by mu
	outs   func() []outputs.Status // guarded by mu
	clips  func() *Clips           // guarded by mu

	mu       sync.Mutex
	apps     map[string]*App
	lastWin  map[string]int64
	replans  []coordinator.Replan
	lastPlan int
	latest   Snapshot
	subs     map[chan Snapshot]string // each event stream's client (auth.ClientKey)
	perCli   map[string]int           // event streams per client
	tm       clock.Timer
	closed   bool
}

// New returns a recorder of status (coordinator.Status); Start begins sampling.
func New(cfg Config, status func() coordinator.Status) *Recorder {
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.Interval <= 0 {
		cfg.Interval = time.Second
	}
	if cfg.Keep <= 0 {
		cfg.Keep = 900
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Recorder{cfg: cfg, status: status, thumbs: NewThumbs(cfg.Clock, cfg.Thumbs), apps: map[string]*App{}, lastWin: map[string]int64{},
		subs: map[chan Snapshot]string{}, perCli: map[string]int{}}
}

// Thumbs is the recorder's thumbnail store (offer frames to it).
func (r *Recorder) Thumbs() *Thumbs { return r.thumbs }

// SetIngest adds the WHIP server's admission state (whip.Server.Admission)
// to each sample.
func (r *Recorder) SetIngest(f func() ingest.Admission) {
	r.mu.Lock()
	r.ingest = f
	r.mu.Unlock()
}

// SetOutputs adds the outputs' figures (outputs.Hub.Status) to each
// sample.
func (r *Recorder) SetOutputs(f func() []outputs.Status) {
	r.mu.Lock()
	r.outs = f
	r.mu.Unlock()
}

// SetClips adds the event clips' state to each sample.
func (r *Recorder) SetClips(f func() *Clips) {
	r.mu.Lock()
	r.clips = f
	r.mu.Unlock()
}

// Start samples now and then every Interval until Close.
func (r *Recorder) Start() {
	r.Sample()
	r.arm()
}

func (r *Recorder) arm() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	r.tm = r.cfg.Clock.AfterFunc(r.cfg.Interval, func() {
		r.Sample()
		r.arm()
	})
}

// Close stops sampling and ends the event streams.
func (r *Recorder) Close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	if r.tm != nil {
		r.tm.Stop()
	}
	for ch := range r.subs {
		close(ch)
		delete(r.subs, ch)
	}
	clear(r.perCli)
}

// Sample takes one sample, adds it to the history and sends what is new
// to the subscribers.
func (r *Recorder) Sample() {
	st := r.status()
	r.mu.Lock()
	admission, outs, clipsF := r.ingest, r.outs, r.clips
	r.mu.Unlock()
	var cl *Clips
	if clipsF != nil {
		cl = clipsF()
	}
	var adm *ingest.Admission
	if admission != nil {
		a := admission()
		adm = &a
	}
	var outSt []outputs.Status
	if outs != nil {
		outSt = outs()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	now := r.cfg.Clock.Now()
	delta := Snapshot{Now: now.UnixMilli(), Policy: st.Policy, Interval: r.cfg.Interval.Seconds(), Instances: st.Instances, Ingest: adm, Outputs: outSt, Clips: cl}
	byApp := instancesByApp(st.Instances)
	for i := range st.Sessions {
		s := st.Sessions[i]
		id := string(s.App)
		a := r.apps[id]
		if a == nil {
			a = &App{App: id}
			r.apps[id] = a
		}
		a.SLOMS, a.FPS = s.SLOMS, s.FPS
		p := Point{T: now.UnixMilli(), Streams: s.Streams, CostWhole: s.CostWhole, CostAllocated: s.CostFractional,
			Instances: byApp[id]}
		if p.Instances == nil {
			p.Instances = map[string]int{}
		}
		for _, m := range s.Modules {
			p.Modules = append(p.Modules, ModulePoint{Module: string(m.Module), RateIn: m.RateIn, ExecMS: m.ExecMS, LatMS: m.LatencyMS, Batch: m.MeanBatch, Scale: m.Scale, Balloon: m.Balloon})
		}
		a.Points = keepLast(append(a.Points, p), r.cfg.Keep)
		d := App{App: id, SLOMS: s.SLOMS, FPS: s.FPS, Points: []Point{p}, Windows: []Window{}, Latest: &s, Thumbs: r.thumbs.Have(s.StreamIDs)}
		for _, w := range s.Windows {
			t := w.Start.UnixMilli()
			if t <= r.lastWin[id] {
				continue
			}
			r.lastWin[id] = t
			win := Window{T: t, Sent: w.Sent, Finished: w.Finished, Late: w.Late, Dropped: w.Dropped, FinishRate: w.FinishRate,
				P50MS: w.P50MS, P99MS: w.P99MS, Drops: w.Drops}
			a.Windows = keepLast(append(a.Windows, win), r.cfg.Keep)
			d.Windows = append(d.Windows, win)
		}
		a.Latest, a.Thumbs = &s, d.Thumbs
		delta.Apps = append(delta.Apps, d)
	}
	for _, rp := range st.Replans {
		if rp.N > r.lastPlan {
			r.lastPlan = rp.N
			r.replans = keepLast(append(r.replans, rp), 200)
			delta.Replans = append(delta.Replans, rp)
		}
	}
	r.latest = delta
	for ch := range r.subs {
		select {
		case ch <- delta:
		default: // a slow page misses a sample; it re-reads the history on reconnect
		}
	}
}

func keepLast[T any](s []T, n int) []T {
	if len(s) > n {
		return slices.Clone(s[len(s)-n:])
	}
	return s
}

// instancesByApp counts, per app, the live instances hosting one of its
// modules, by worker type.
func instancesByApp(ins []coordinator.InstanceStatus) map[string]map[string]int {
	out := map[string]map[string]int{}
	for _, in := range ins {
		if in.State == "warm" {
			continue
		}
		seen := map[string]bool{}
		for _, m := range in.Modules {
			app, _, _ := strings.Cut(m, "/")
			if seen[app] {
				continue
			}
			seen[app] = true
			if out[app] == nil {
				out[app] = map[string]int{}
			}
			out[app][in.Type]++
		}
	}
	return out
}

// History is the whole record.
func (r *Recorder) History() Snapshot {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := Snapshot{Now: r.latest.Now, Policy: r.latest.Policy, Interval: r.cfg.Interval.Seconds(), Instances: r.latest.Instances,
		Replans: slices.Clone(r.replans), Ingest: r.latest.Ingest}
	ids := make([]string, 0, len(r.apps))
	for id := range r.apps {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		a := *r.apps[id]
		a.Points, a.Windows = slices.Clone(a.Points), slices.Clone(a.Windows)
		out.Apps = append(out.Apps, a)
	}
	if out.Replans == nil {
		out.Replans = []coordinator.Replan{}
	}
	return out
}

func (r *Recorder) subscribe(client string) (_ chan Snapshot, _ func(), refused string) {
	ch := make(chan Snapshot, 8)
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		close(ch)
		return ch, func() {}, ""
	}
	if len(r.subs) >= MaxEventSubscribers {
		r.mu.Unlock()
		return nil, nil, fmt.Sprintf("the dashboard has %d event streams open, the most it serves: close one (a tab) first", MaxEventSubscribers)
	}
	if r.perCli[client] >= MaxEventSubscribersPerClient {
		r.mu.Unlock()
		return nil, nil, fmt.Sprintf("this address has %d dashboard event streams open, the most one client is served: close one (a tab) first", MaxEventSubscribersPerClient)
	}
	r.subs[ch] = client
	r.perCli[client]++
	r.mu.Unlock()
	return ch, func() {
		r.mu.Lock()
		if c, ok := r.subs[ch]; ok {
			delete(r.subs, ch)
			if r.perCli[c]--; r.perCli[c] <= 0 {
				delete(r.perCli, c)
			}
			close(ch)
		}
		r.mu.Unlock()
	}, ""
}

// Handler serves the page (GET / and /dashboard/...), the history and the
// event stream, and the stream thumbnails.
func (r *Recorder) Handler() http.Handler {
	mux := http.NewServeMux()
	sub, _ := fs.Sub(static, "static")
	files := http.FileServerFS(sub)
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, req *http.Request) {
		pageHeaders(w.Header())
		w.Header().Set("Cache-Control", "no-cache")
		http.ServeFileFS(w, req, sub, "index.html")
	})
	mux.Handle("GET /dashboard/", http.StripPrefix("/dashboard/", http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		pageHeaders(w.Header())
		files.ServeHTTP(w, req)
	})))
	mux.HandleFunc("GET /v1/dashboard", func(w http.ResponseWriter, req *http.Request) {
		r.thumbs.watched()
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		_ = json.NewEncoder(w).Encode(r.History())
	})
	mux.HandleFunc("GET /v1/dashboard/events", r.serveEvents)
	mux.HandleFunc("GET /v1/thumbs/{stream}", r.thumbs.serve)
	return mux
}

// pageHeader is what the dashboard's pages (the dashboard, its sign-in
// page) and static code are sent with: a Content-Security-Policy that
// lets them load only this server's own scripts, styles, images and data
// (no inline script or style, no plugins, no other origin), not be
// framed (clickjacking) and post forms only here; no MIME sniffing; no
// Referer (which can hold ?access_token=) to other origins.
var pageHeader = http.Header{
	"Content-Security-Policy": {"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; " +
		"form-action 'self'; base-uri 'none'; frame-ancestors 'none'"},
	"X-Content-Type-Options": {"nosniff"},
	"X-Frame-Options":        {"DENY"},
	"Referrer-Policy":        {"same-origin"},
}

func pageHeaders(h http.Header) {
	for k, v := range pageHeader {
		h[k] = slices.Clone(v)
	}
}

// SignIn is the page a browser is shown (401, auth.RequirePage) when it
// opens the dashboard without a valid api token (mdag serve --tokens):
// what an api token is, how to create one (mdag token new --role api)
// and a field for it. It is static: the same bytes whatever was wrong
// with the request, and no data. Its script (/dashboard/signin.js) keeps
// the token in the tab's sessionStorage, fetches the dashboard with it in
// an Authorization header and shows it in place; app.js passes the kept
// token on as it does ?access_token=.
func SignIn() auth.Page {
	html, err := static.ReadFile("static/signin.html")
	if err != nil {
		panic(err) // embedded
	}
	h := http.Header{}
	pageHeaders(h)
	return auth.Page{HTML: html, Header: h}
}

// MaxEventSubscribers bounds the dashboard's event streams at once (each
// holds a goroutine and a queue), MaxEventSubscribersPerClient one
// client's (its address, an IPv6 one's /64: auth.ClientKey), so that one
// client cannot take them all; EventWriteTimeout bounds one event's
// write, so a browser that stops reading is cut off rather than holding
// its stream (a variable for tests).
const (
	MaxEventSubscribers          = 64
	MaxEventSubscribersPerClient = 8
)

var EventWriteTimeout = 10 * time.Second

func (r *Recorder) serveEvents(w http.ResponseWriter, req *http.Request) {
	ch, cancel, refused := r.subscribe(auth.ClientKey(req))
	if refused != "" {
		http.Error(w, refused, http.StatusTooManyRequests)
		return
	}
	defer cancel()
	rc := http.NewResponseController(w)
	send := func(format string, a ...any) bool {
		_ = rc.SetWriteDeadline(time.Now().Add(EventWriteTimeout))
		if _, err := fmt.Fprintf(w, format, a...); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	if !send("retry: 2000\n\n") {
		return
	}
	for {
		select {
		case <-req.Context().Done():
			return
		case s, ok := <-ch:
			if !ok {
				send("event: end\ndata: {}\n\n")
				return
			}
			b, err := json.Marshal(s)
			if err != nil {
				r.cfg.Log.Error("dashboard event", "err", err)
				return
			}
			if !send("event: sample\ndata: %s\n\n", b) {
				return
			}
			r.thumbs.watched()
		}
	}
}

// MeanCost is the mean cost per hour over the samples (whole instances,
// allocated), summed over the apps.
func (s Snapshot) MeanCost() (whole, allocated float64) {
	for _, a := range s.Apps {
		if len(a.Points) == 0 {
			continue
		}
		var w, al float64
		for _, p := range a.Points {
			w += p.CostWhole
			al += p.CostAllocated
		}
		whole += w / float64(len(a.Points))
		allocated += al / float64(len(a.Points))
	}
	return whole, allocated
}
