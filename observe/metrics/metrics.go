// Package metrics is mdag's Prometheus exposition: one registry per
// process (never the global one), names mdag_<subsystem>_<what>_<unit>,
// histograms rather than summaries, and no per-stream label values (apps,
// modules, models, worker types and reasons are bounded by the deployed
// YAML; stream IDs are not).
//
// The engine reports events as they happen (frames, tasks, scheduler
// decisions, plans) from its loop; gauges that describe state (finish rate,
// cost, instances, scaling and ballooning factors) are set when an
// adaptation window closes. Ingest counters and GPU telemetry are read at
// scrape time from the sources registered with SetIngest and SetGPU. Every
// method is safe on a nil *Metrics, so components run without metrics.
package metrics

import (
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/mdag/mdag/coordinator/why"
	"github.com/mdag/mdag/ingest"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Metrics holds mdag's collectors and its registry.
type Metrics struct {
	reg *prometheus.Registry

	framesSent    *prometheus.CounterVec
	frames        *prometheus.CounterVec
	framesDropped *prometheus.CounterVec
	latency       *prometheus.HistogramVec
	ingestDelay   *prometheus.HistogramVec
	finishRate    *prometheus.GaugeVec
	streams       *prometheus.GaugeVec
	costSession   *prometheus.GaugeVec
	admitted      *prometheus.GaugeVec
	refused       *prometheus.CounterVec

	moduleItems   *prometheus.CounterVec
	moduleExec    *prometheus.HistogramVec
	moduleQueue   *prometheus.HistogramVec
	moduleScale   *prometheus.GaugeVec
	moduleBalloon *prometheus.GaugeVec
	stateEvents   *prometheus.CounterVec
	statePause    *prometheus.HistogramVec

	batchSize     *prometheus.HistogramVec
	schedBatches  *prometheus.CounterVec
	schedDrops    *prometheus.CounterVec
	schedRejected *prometheus.CounterVec

	instances *prometheus.GaugeVec
	cost      *prometheus.GaugeVec

	solve    *prometheus.HistogramVec
	triggers *prometheus.CounterVec
	replans  prometheus.Counter

	httpRefused *prometheus.CounterVec

	mu      sync.Mutex
	ingest  func() []ingest.Totals
	load    func() float64
	gpu     func() GPUSnapshot
	cameras func() []Camera
	outputs func() []Output
	egress  func() []Egress
	clips   func() []Clips
	// grpc is the coordinator's gRPC port: refusals, data plane, hops.
	grpc    func() GRPC
	loop    func() Loop
	instSet map[[2]string]bool // (type, state) series set last time
}

// Frame outcomes, as the engine names them.
const (
	Finished = "finished"
	Late     = "late"
	Dropped  = "dropped"
)

// New returns metrics on a fresh registry. withRuntime adds the Go runtime
// and process collectors (the service does; golden tests do not).
func New(withRuntime bool) *Metrics {
	reg := prometheus.NewRegistry()
	f := factory{reg}
	lat := []float64{.005, .01, .025, .05, .1, .2, .3, .4, .5, .75, 1, 2, 5}
	small := []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1}
	m := &Metrics{reg: reg, instSet: map[[2]string]bool{},
		framesSent: f.counter("session", "frames_sent_total", "Frames handed to an app's session (after the ingest's fps sampling).", "app"),
		frames: f.counter("session", "frames_total",
			"Frames that ended, by outcome: finished (within the SLO), late (completed after the deadline), dropped (see mdag_session_frames_dropped_total for where and why).", "app", "outcome"),
		framesDropped: f.counter("session", "frames_dropped_total",
			"Dropped frames by the module where the drop happened ('-': before any, shed, lost past their deadline, cut off by a restart) and the reason ("+dropList()+").", "app", "module", "reason"),
		latency: f.histogram("session", "latency_seconds", "End-to-end latency, capture to the last module's output, of completed (finished or late) frames.", lat, "app"),
		ingestDelay: f.histogram("session", "ingest_delay_seconds",
			"Delay from a frame's capture to its arrival in the session (encode, network, decode); plans keep its p95 out of the graph's latency budget.",
			[]float64{.001, .0025, .005, .01, .025, .05, .1, .2, .4}, "app"),
		finishRate: f.gauge("session", "finish_rate_ratio",
			"Frames finished within the SLO / frames sent, over the last complete one-second window of capture times.", "app"),
		streams: f.gauge("session", "streams", "Streams joined to the app's session.", "app"),
		costSession: f.gauge("session", "cost_dollars_per_hour",
			"The app's cost: basis=allocated is the allocator's fractional cost (partial instances at their share), basis=whole charges whole instances, shared pro rata.", "app", "basis"),
		admitted: f.gauge("session", "admitted_ratio",
			"Share of the app's frames its current plan carries: below 1 the workers cannot carry the full rate within the SLO and every stream sheds the rest at ingest (dropped, reason shed).", "app"),
		refused: f.counter("session", "streams_refused_total",
			"Streams the session refused to admit (its plan is degraded or its frames arrive later than half the SLO); the WHIP endpoint answers 503 with Retry-After.", "app"),

		moduleItems: f.counter("module", "items_total", "Items that entered the module.", "app", "module"),
		moduleExec: f.histogram("module", "exec_seconds", "Execution time of one task (a batch on GPU modules, one item on CPU modules) as the worker measured it.",
			small, "app", "module"),
		moduleQueue: f.histogram("module", "queue_seconds",
			"Time an item spent between entering the module and its task starting (scheduler wait, worker queue and transport).", small, "app", "module"),
		moduleScale: f.gauge("module", "scale_ratio", "Observed scaling factor over the last adaptation window: items out per item in.", "app", "module"),
		moduleBalloon: f.gauge("module", "balloon_ratio",
			"Observed ballooning factor over the last adaptation window: measured / profiled execution time.", "app", "module"),

		stateEvents: f.counter("module", "state_events_total",
			"State events of a stateful module's streams: migrate (the state followed its stream to another instance), restore (restored from a checkpoint after its worker was lost), reset (lost with no checkpoint: the stream starts fresh), failed (an export or import failed).", "app", "module", "kind"),
		statePause: f.histogram("module", "migration_pause_seconds",
			"How long a stream's frames waited at a stateful module while its state moved between instances (export, transfer, import).", small, "app", "module"),

		batchSize: f.histogram("scheduler", "batch_size", "Items per GPU batch the central scheduler dispatched.",
			[]float64{1, 2, 4, 8, 16, 32, 64, 128}, "app", "module", "model"),
		schedBatches: f.counter("scheduler", "batches_total", "GPU batches the central scheduler dispatched.", "app", "module", "model"),
		schedDrops: f.counter("scheduler", "drops_total",
			"Requests the central scheduler dropped, by reason ("+strings.Join([]string{string(why.CannotFinish), string(why.ActionRejected), string(why.NoGPUForModel), string(why.EarlyDrop)}, ", ")+").", "app", "module", "reason"),
		schedRejected: f.counter("scheduler", "rejected_total",
			"Batches a worker refused because they could not start inside their action window (Clockwork); the requests are re-scheduled.", "app", "module"),

		instances: f.gauge("cluster", "instances", "Worker instances by type and state (active, warm, starting).", "type", "state"),
		cost: f.gauge("cluster", "cost_dollars_per_hour",
			"Cost of the cluster: basis=whole is every active instance at its price, basis=allocated the sum of the apps' fractional allocations.", "basis"),

		solve: f.histogram("planner", "solve_seconds", "Wall time of one planning step: stage=allocate (the MILP, all apps), stage=place (bin packing).",
			[]float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5}, "stage"),
		triggers: f.counter("planner", "triggers_total",
			"Events that asked for a re-plan, by kind ("+triggerList()+"; finish-rate: windows below target, more headroom; turn-off: a warm instance reached the turn-off delay).", "kind"),
		replans: f.counter1("planner", "replans_total", "Plans applied (one plan may answer several triggers)."),

		httpRefused: f.counter("http", "requests_refused_total",
			"HTTP API requests refused (status, dashboard, thumbnails, /metrics with --tokens), by reason (unauthorized: 401); WHIP's refusals are mdag_ingest_streams_refused_total.", "reason"),
	}
	reg.MustRegister(ingestCollector{m}, gpuCollector{m}, cameraCollector{m}, grpcCollector{m}, outputCollector{m}, egressCollector{m}, clipCollector{m}, loopCollector{m})
	if withRuntime {
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	return m
}

type factory struct{ reg *prometheus.Registry }

func (f factory) counter(sub, name, help string, labels ...string) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "mdag", Subsystem: sub, Name: name, Help: help}, labels)
	f.reg.MustRegister(c)
	return c
}

func (f factory) counter1(sub, name, help string) prometheus.Counter {
	c := prometheus.NewCounter(prometheus.CounterOpts{Namespace: "mdag", Subsystem: sub, Name: name, Help: help})
	f.reg.MustRegister(c)
	return c
}

func (f factory) gauge(sub, name, help string, labels ...string) *prometheus.GaugeVec {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "mdag", Subsystem: sub, Name: name, Help: help}, labels)
	f.reg.MustRegister(g)
	return g
}

func (f factory) histogram(sub, name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
	h := prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "mdag", Subsystem: sub, Name: name, Help: help, Buckets: buckets}, labels)
	f.reg.MustRegister(h)
	return h
}

// Registry is the registry (for tests and extra collectors).
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the exposition (text or OpenMetrics by negotiation).
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg, EnableOpenMetrics: true})
}

// ---- sessions ----

// AppMetrics are an app's hot-path series, resolved once (label lookups
// cost more than the increments). Methods are no-ops on nil.
type AppMetrics struct {
	m                       *Metrics
	app                     string
	sent                    prometheus.Counter
	finished, late, dropped prometheus.Counter
	latency, ingest         prometheus.Observer

	mu    sync.Mutex
	drops map[[2]string]prometheus.Counter // (module, reason): drops come in bursts of the same few
}

// App returns an app's series, creating them at zero so rates and ratios
// are defined before its first frame (nil on nil metrics).
func (m *Metrics) App(app string) *AppMetrics {
	if m == nil {
		return nil
	}
	m.streams.WithLabelValues(app)
	m.admitted.WithLabelValues(app).Set(1)
	m.refused.WithLabelValues(app)
	return &AppMetrics{m: m, app: app, drops: map[[2]string]prometheus.Counter{}, sent: m.framesSent.WithLabelValues(app), finished: m.frames.WithLabelValues(app, Finished),
		late: m.frames.WithLabelValues(app, Late), dropped: m.frames.WithLabelValues(app, Dropped), latency: m.latency.WithLabelValues(app),
		ingest: m.ingestDelay.WithLabelValues(app)}
}

// FrameSent counts a frame entering the session.
func (a *AppMetrics) FrameSent() {
	if a == nil {
		return
	}
	a.sent.Inc()
}

// Admitted sets the share of the app's frames its plan carries.
func (a *AppMetrics) Admitted(f float64) {
	if a == nil {
		return
	}
	a.m.admitted.WithLabelValues(a.app).Set(f)
}

// Refused counts a stream the session would not admit.
func (a *AppMetrics) Refused() {
	if a == nil {
		return
	}
	a.m.refused.WithLabelValues(a.app).Inc()
}

// IngestDelay records a frame's delay from capture to the session
// (encode, network, decode: the part of the SLO the graph cannot spend).
func (a *AppMetrics) IngestDelay(d time.Duration) {
	if a == nil {
		return
	}
	a.ingest.Observe(max(0, d).Seconds())
}

// Frame counts a frame's outcome; module and reason matter for drops,
// latency for completed frames.
func (a *AppMetrics) Frame(outcome, module string, reason why.Drop, latency time.Duration) {
	if a == nil {
		return
	}
	switch outcome {
	case Dropped:
		a.dropped.Inc()
		k := [2]string{module, string(reason)}
		a.mu.Lock()
		c := a.drops[k]
		if c == nil {
			c = a.m.framesDropped.WithLabelValues(a.app, module, string(reason))
			a.drops[k] = c
		}
		a.mu.Unlock()
		c.Inc()
		return
	case Late:
		a.late.Inc()
	default:
		a.finished.Inc()
	}
	a.latency.Observe(latency.Seconds())
}

// ModuleMetrics are a module's hot-path series. Methods are no-ops on nil.
type ModuleMetrics struct {
	m                  *Metrics
	app, module, model string
	items              prometheus.Counter
	exec, queue        prometheus.Observer
	batch              prometheus.Observer // GPU modules only
	batches            prometheus.Counter
}

// Module returns a module's series, created at zero (nil on nil metrics).
func (m *Metrics) Module(app, module, model string, gpu bool) *ModuleMetrics {
	if m == nil {
		return nil
	}
	mm := &ModuleMetrics{m: m, app: app, module: module, model: model, items: m.moduleItems.WithLabelValues(app, module),
		exec: m.moduleExec.WithLabelValues(app, module), queue: m.moduleQueue.WithLabelValues(app, module)}
	if gpu {
		mm.batch = m.batchSize.WithLabelValues(app, module, model)
		mm.batches = m.schedBatches.WithLabelValues(app, module, model)
	}
	return mm
}

// In counts an item entering the module.
func (mm *ModuleMetrics) In() {
	if mm == nil {
		return
	}
	mm.items.Inc()
}

// Exec records a completed task's measured execution time.
func (mm *ModuleMetrics) Exec(d time.Duration) {
	if mm == nil {
		return
	}
	mm.exec.Observe(d.Seconds())
}

// Queued records an item's time from entering the module to its task's
// start (negative values, from clock skew between machines, count as 0).
func (mm *ModuleMetrics) Queued(d time.Duration) {
	if mm == nil {
		return
	}
	mm.queue.Observe(max(0, d).Seconds())
}

// Batch records a GPU batch the scheduler dispatched.
func (mm *ModuleMetrics) Batch(size int) {
	if mm == nil || mm.batch == nil {
		return
	}
	mm.batches.Inc()
	mm.batch.Observe(float64(size))
}

// SchedulerDrop counts a request the scheduler dropped.
func (mm *ModuleMetrics) SchedulerDrop(reason why.Drop) {
	if mm == nil {
		return
	}
	mm.m.schedDrops.WithLabelValues(mm.app, mm.module, string(reason)).Inc()
}

// Rejected counts a batch a worker refused.
func (mm *ModuleMetrics) Rejected() {
	if mm == nil {
		return
	}
	mm.m.schedRejected.WithLabelValues(mm.app, mm.module).Inc()
}

// StateEvent counts a stateful module's state event.
func (mm *ModuleMetrics) StateEvent(kind string) {
	if mm == nil {
		return
	}
	mm.m.stateEvents.WithLabelValues(mm.app, mm.module, kind).Inc()
}

// MigrationPause records a state move's pause.
func (mm *ModuleMetrics) MigrationPause(d time.Duration) {
	if mm == nil {
		return
	}
	mm.m.statePause.WithLabelValues(mm.app, mm.module).Observe(d.Seconds())
}

// Session sets an app's state gauges.
func (m *Metrics) Session(app string, streams int, finishRate float64, haveRate bool, costAllocated, costWhole float64) {
	if m == nil {
		return
	}
	m.streams.WithLabelValues(app).Set(float64(streams))
	if haveRate {
		m.finishRate.WithLabelValues(app).Set(finishRate)
	}
	m.costSession.WithLabelValues(app, "allocated").Set(costAllocated)
	m.costSession.WithLabelValues(app, "whole").Set(costWhole)
}

// ---- modules and the scheduler ----

// ModuleFactors sets a module's observed scaling and ballooning factors.
func (m *Metrics) ModuleFactors(app, module string, scale, balloon float64) {
	if m == nil {
		return
	}
	m.moduleScale.WithLabelValues(app, module).Set(scale)
	m.moduleBalloon.WithLabelValues(app, module).Set(balloon)
}

// ---- the cluster and the planner ----

// Instances sets the instance counts by (type, state); series of pairs
// that no longer exist are set to zero rather than removed, so a graph
// shows the drop.
func (m *Metrics) Instances(counts map[[2]string]int) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for k := range m.instSet {
		if _, ok := counts[k]; !ok {
			m.instances.WithLabelValues(k[0], k[1]).Set(0)
		}
	}
	for k, n := range counts {
		m.instances.WithLabelValues(k[0], k[1]).Set(float64(n))
		m.instSet[k] = true
	}
}

// Cost sets the cluster's cost per hour.
func (m *Metrics) Cost(whole, allocated float64) {
	if m == nil {
		return
	}
	m.cost.WithLabelValues("whole").Set(whole)
	m.cost.WithLabelValues("allocated").Set(allocated)
}

// Solve records one planning step's wall time (stage allocate or place).
func (m *Metrics) Solve(stage string, d time.Duration) {
	if m == nil {
		return
	}
	m.solve.WithLabelValues(stage).Observe(d.Seconds())
}

// Trigger counts an event that asked for a re-plan.
func (m *Metrics) Trigger(kind why.Trigger) {
	if m == nil {
		return
	}
	m.triggers.WithLabelValues(string(kind)).Inc()
}

// Replanned counts an applied plan.
func (m *Metrics) Replanned() {
	if m == nil {
		return
	}
	m.replans.Inc()
}

// HTTPRefused counts an HTTP API request refused for reason.
func (m *Metrics) HTTPRefused(reason string) {
	if m == nil {
		return
	}
	m.httpRefused.WithLabelValues(reason).Inc()
}

// dropList and triggerList name every label value of the drop reasons and
// the trigger kinds, from the coordinator's vocabulary (coordinator/why),
// for the help texts.
func dropList() string {
	var out []string
	for _, d := range why.Drops() {
		out = append(out, string(d))
	}
	return strings.Join(out, ", ")
}

func triggerList() string {
	var out []string
	for _, t := range why.Triggers() {
		out = append(out, string(t))
	}
	return strings.Join(out, ", ")
}
