package main

import (
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/gpu"
	"github.com/mdag/mdag/ingest/whip"
	"github.com/mdag/mdag/internal/dashboard"
	"github.com/mdag/mdag/internal/engine"
	"github.com/mdag/mdag/internal/metrics"
	"github.com/mdag/mdag/modules"
)

// newMetrics is the process's metrics with the runtime collectors and this
// machine's GPU telemetry.
func newMetrics() *metrics.Metrics {
	mx := metrics.New(true)
	mx.SetGPU(gpuMetrics)
	return mx
}

// gpuMetrics reads NVML for the exposition.
func gpuMetrics() metrics.GPUSnapshot { return toGPUMetrics(gpu.Telemetry()) }

// toGPUMetrics converts NVML telemetry (MiB, percent) to the exposition's
// units (bytes, ratio).
func toGPUMetrics(s gpu.Snapshot) metrics.GPUSnapshot {
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
	e   *engine.Engine
	mx  *metrics.Metrics
	rec *dashboard.Recorder
	ws  *whip.Server
}

// newObserved starts the dashboard's recorder on e.
func newObserved(e *engine.Engine, mx *metrics.Metrics, log *slog.Logger) *observed {
	rec := dashboard.New(dashboard.Config{Log: log}, e.Status)
	rec.Start()
	return &observed{e: e, mx: mx, rec: rec}
}

// setWhip adds the WHIP server: its routes, its ingest counters, and the
// engine's results (through the engine's OnFrame sink).
func (o *observed) setWhip(ws *whip.Server, results *frameSink) {
	o.ws = ws
	o.mx.SetIngest(ws.IngestTotals)
	results.srv.Store(ws)
}

// serveHTTP listens on addr and serves every endpoint; it returns the
// base URL and the server to close.
func (o *observed) serveHTTP(addr string) (string, *http.Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, err
	}
	hs := &http.Server{Handler: o.handler(), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = hs.Serve(ln) }()
	return "http://" + ln.Addr().String(), hs, nil
}

// sink is the engine as a WHIP sink whose frames also feed the thumbnails.
func (o *observed) sink() whip.Sink { return tapSink{o.e, o.rec.Thumbs()} }

// ingest is e.Ingest feeding the thumbnails (for in-process sources).
func (o *observed) ingest(stream string, seq uint64, capture time.Time, f *modules.Frame, truth []modules.Box) error {
	return tapSink{o.e, o.rec.Thumbs()}.Ingest(stream, seq, capture, f, truth)
}

func (o *observed) Close() { o.rec.Close() }

// handler routes every endpoint; "/" is the dashboard.
func (o *observed) handler() http.Handler {
	mux := http.NewServeMux()
	if o.ws != nil {
		h := o.ws.Handler()
		for _, p := range []string{"/whip/", "/v1/streams", "/v1/streams/", "/stream/", "/static/"} {
			mux.Handle(p, h)
		}
	}
	mux.Handle("GET /metrics", o.mx.Handler())
	d := o.rec.Handler()
	for _, p := range []string{"GET /{$}", "GET /dashboard/", "GET /v1/dashboard", "GET /v1/dashboard/events"} {
		mux.Handle(p, d)
	}
	// Thumbnails are camera pixels: they need a token when ingest does
	// (the page passes its own ?access_token= on).
	if o.ws != nil {
		mux.Handle("GET /v1/thumbs/{stream}", o.ws.RequireToken(d))
	} else {
		mux.Handle("GET /v1/thumbs/{stream}", d)
	}
	st := statusHandler(o.e)
	mux.Handle("GET /v1/status", st)
	mux.Handle("GET /healthz", st)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, fmt.Sprintf("no such endpoint: %s %s (try / for the dashboard, /metrics, /v1/status, /v1/streams, /whip/{app})", r.Method, r.URL.Path),
			http.StatusNotFound)
	})
	return mux
}

type tapSink struct {
	e      *engine.Engine
	thumbs *dashboard.Thumbs
}

func (t tapSink) Join(app dag.AppID, id string) error { return t.e.Join(app, id) }
func (t tapSink) Leave(id string) error               { return t.e.Leave(id) }

// Ingest hands the frame on first: a thumbnail (about 1 ms once a second
// per stream) never delays it. Frames are read-only once ingested.
func (t tapSink) Ingest(id string, seq uint64, capture time.Time, f *modules.Frame, truth []modules.Box) error {
	err := t.e.Ingest(id, seq, capture, f, truth)
	if err == nil {
		t.thumbs.Offer(id, f)
	}
	return err
}
