package metrics

import (
	"time"

	"github.com/mdag/mdag/ingest"
	"github.com/prometheus/client_golang/prometheus"
)

// GPUSnapshot is the machine's GPU telemetry (NVML) at scrape time.
type GPUSnapshot struct {
	Available bool
	Devices   []GPUDevice
}

// GPUDevice is one GPU.
type GPUDevice struct {
	Index       string
	Name        string
	UtilRatio   float64 // share of the last sample period a kernel ran
	MemUsed     uint64  // bytes
	MemTotal    uint64  // bytes
	Processes   int
	CurrentUsed uint64 // bytes this process holds
}

// SetIngest registers the source of the ingest counters (the WHIP server).
func (m *Metrics) SetIngest(f func() []ingest.Totals) {
	if m == nil {
		return
	}
	m.mu.Lock()
	m.ingest = f
	m.mu.Unlock()
}

// SetIngestLoad registers the source of the CPU load WHIP admission
// measures, as a share of the capacity it fills (the WHIP server).
func (m *Metrics) SetIngestLoad(f func() float64) {
	if m == nil {
		return
	}
	m.mu.Lock()
	m.load = f
	m.mu.Unlock()
}

// Camera is one RTSP camera's counters at scrape time (ingest/rtsp's
// status). The exposition sums them per app (no per-stream labels); the
// camera-lost events are the ingest server's (mdag_ingest_camera_lost_total).
type Camera struct {
	App        string
	State      string // connecting, streaming, reconnecting, failed, stopped
	Reconnects uint64 // connection attempts after the first, failed ones included
}

// SetCameras registers the source of the RTSP cameras' counters.
func (m *Metrics) SetCameras(f func() []Camera) {
	if m == nil {
		return
	}
	m.mu.Lock()
	m.cameras = f
	m.mu.Unlock()
}

// GRPC is what the coordinator's gRPC port reports (remote.Server's
// Refused and Plane).
type GRPC struct {
	Refused map[string]uint64 // refusals by reason
	// The frames of workers' results by how they came: with their pixels
	// (relayed: frames and bytes) or as references (the direct data plane).
	RelayedFrames, RelayedBytes, RefFrames uint64
	// Hops: tasks that ran, by what each spent outside its module's run
	// (down, the worker's queue, the fetch, up): cumulative counts by
	// upper bound in seconds, and their sum.
	Hops       uint64
	HopBuckets map[float64]uint64
	HopSum     time.Duration
	// Received: bytes the port received on the wire, by sender (workers,
	// sources, other).
	Received map[string]uint64
	// Ingest on the workers (issue 41): camera streams joined on workers
	// now, and the frames they announced, taken or refused.
	IngestStreams                int
	IngestFrames, IngestRejected uint64
}

// SetGRPC registers the source of the coordinator's gRPC figures.
func (m *Metrics) SetGRPC(f func() GRPC) {
	if m == nil {
		return
	}
	m.mu.Lock()
	m.grpc = f
	m.mu.Unlock()
}

// Loop is the coordinator's engine loop's work (coordinator.LoopStats).
type Loop struct {
	Busy   time.Duration
	Events int64
}

// SetLoop registers the source of the engine loop's counters.
func (m *Metrics) SetLoop(f func() Loop) {
	if m == nil {
		return
	}
	m.mu.Lock()
	m.loop = f
	m.mu.Unlock()
}

var (
	loopBusy   = desc("engine", "loop_busy_seconds_total", "Time the coordinator's engine loop (one goroutine: admission, routing, GPU batching, accounting) spent running events; its rate near 1 means the loop is the coordinator's limit.")
	loopEvents = desc("engine", "loop_events_total", "Events the engine loop ran (results, frames, timers, calls).")
)

type loopCollector struct{ m *Metrics }

func (loopCollector) Describe(ch chan<- *prometheus.Desc) { ch <- loopBusy; ch <- loopEvents }

func (c loopCollector) Collect(ch chan<- prometheus.Metric) {
	c.m.mu.Lock()
	f := c.m.loop
	c.m.mu.Unlock()
	if f == nil {
		return
	}
	l := f()
	ch <- prometheus.MustNewConstMetric(loopBusy, prometheus.CounterValue, l.Busy.Seconds())
	ch <- prometheus.MustNewConstMetric(loopEvents, prometheus.CounterValue, float64(l.Events))
}

// SetGPU registers the source of GPU telemetry.
func (m *Metrics) SetGPU(f func() GPUSnapshot) {
	if m == nil {
		return
	}
	m.mu.Lock()
	m.gpu = f
	m.mu.Unlock()
}

func desc(sub, name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(prometheus.BuildFQName("mdag", sub, name), help, labels, nil)
}

var (
	ingestStreams  = desc("ingest", "streams", "Live WebRTC (WHIP) ingest connections.", "app")
	ingestPackets  = desc("ingest", "packets_total", "RTP packets received.", "app")
	ingestFrames   = desc("ingest", "frames_total", "Video frames assembled from RTP packets (cameras: access units received).", "app")
	ingestIngested = desc("ingest", "frames_ingested_total", "Frames decoded and handed to the app's session (after fps sampling).", "app")
	ingestLost     = desc("ingest", "frames_lost_total", "Frames lost in transport (incomplete or missing packets).", "app")
	ingestDecode   = desc("ingest", "decode_errors_total", "Frames the decoder (libvpx, libavcodec) failed to decode.", "app")
	ingestPLIs     = desc("ingest", "plis_total", "Picture loss indications sent to senders (asking for a key frame).", "app")
	ingestDiscard  = desc("ingest", "packets_discarded_total", "RTP packets discarded: not of the stream's codec, duplicates, late packets of frames already released or given up.", "app")
	ingestRestarts = desc("ingest", "timeline_restarts_total", "Times a sender's RTP timestamps jumped back (a new timeline; capture clock re-anchored).", "app")
	ingestPending  = desc("ingest", "pending_streams", "Ingest connections not yet admitted: no frame decoded yet (they are not in the app's session).", "app")
	ingestRefused  = desc("ingest", "streams_refused_total", "WHIP offers and ingest requests refused, by reason (stream-limit, pending-limit, capacity, session, shutdown: 503; recvonly: 400; rate-limit, token-limit: 429; unauthorized: 401, app - when the path names no deployed app).", "app", "reason")
	ingestEnded    = desc("ingest", "streams_ended_total", "Ingest streams that ended, by kind (client, idle, connect-timeout, ice-failed, join-failed, stream-limit, capacity, overload, error, setup-failed, shutdown).", "app", "kind")
	ingestCodecs   = desc("ingest", "codec_streams", "Live ingest streams by video codec (vp8, h264 over WHIP; h264, h265 from cameras).", "app", "codec")
	ingestRefusedF = desc("ingest", "frames_refused_total", "Frames decoded but refused by the app's session (the stream is not in it, the coordinator is unreachable); 10 in a row end the stream (kind error).", "app")
	ingestCamLost  = desc("ingest", "camera_lost_total", "Times a camera's connection was lost (its stream waits while the camera is reconnected).", "app")
	ingestLoad     = desc("ingest", "cpu_load_ratio", "The process's CPU load as a share of the capacity WHIP admission fills (cores x ceiling); new streams that would push it above 1 get 503, and above 1 for long the newest stream is shed.")

	gpuAvailable = desc("gpu", "telemetry_available", "1 when NVML reports this machine's NVIDIA GPUs; 0 without a driver (emulated GPUs only).")
	gpuUtil      = desc("gpu", "utilization_ratio", "Share of the last NVML sample period a kernel ran on the GPU.", "gpu", "name")
	gpuMemUsed   = desc("gpu", "memory_used_bytes", "GPU memory in use (all processes).", "gpu", "name")
	gpuMemTotal  = desc("gpu", "memory_total_bytes", "GPU memory installed.", "gpu", "name")
	gpuMemSelf   = desc("gpu", "process_memory_used_bytes", "GPU memory this process holds.", "gpu", "name")
	gpuProcs     = desc("gpu", "processes", "Compute processes on the GPU.", "gpu", "name")
)

var (
	grpcRefused       = desc("grpc", "refused_total", "Requests the coordinator's gRPC port refused, by reason (message-size, frame-size, boxes, result-items, source-streams, worker-streams, rate-peer, rate-global: limits; unknown-task: a result for a task the worker was not given or had answered; frame-ref: a frame reference the worker may not make; ticket: a stream join without Route's ticket for it; ingested: an ingested frame of a stream not joined on that worker; thumbnail: a worker's thumbnail not asked for, of a stream not joined on it, too large or not a JPEG; handshakes, handshakes-ip, tls-handshake: TLS handshakes over the bounds or failed; first-message: no register or join in time; identity: an ID or stream the certificate may not claim; register: a malformed registration; role: a call the certificate's role may not make).", "reason")
	grpcFrames        = desc("grpc", "result_frames_total", "Frames in workers' results by data plane: relay (the pixels came through the coordinator) or direct (a reference; the next module's worker fetches the pixels from the worker holding them).", "plane")
	grpcBytes         = desc("grpc", "relayed_bytes_total", "Pixel bytes of workers' results that came through the coordinator: every frame on the relay; on the direct data plane only frames under the worker's --peer-inline (crops).")
	grpcRecv          = desc("grpc", "received_bytes_total", "Bytes the coordinator's gRPC port received on the wire, by sender: workers (results, heartbeats: references on the direct data plane), sources (mdag source and gRPC cameras: their frames' pixels, unless routed to ingest workers: then routes only) and other (calls of no known method). Divided by the frames sent, what a frame costs the coordinator to take in.", "from")
	grpcHops          = desc("grpc", "hop_seconds", "What a task spent outside its module's run, from the coordinator sending it to its result: the task down, the worker's queue, the fetch of its frames (direct data plane) and the result up.")
	grpcIngestStreams = desc("grpc", "worker_ingest_streams", "Camera streams joined on ingest workers now (mdag worker --ingest-listen): their frames stay there and the coordinator gets each one's identity.")
	grpcIngestFrames  = desc("grpc", "worker_ingest_frames_total", "Frames ingest workers announced, by outcome: taken (handed to the engine as references) or refused (a stream not joined on the worker, not its own reference, the engine's error).", "outcome")
)

type grpcCollector struct{ m *Metrics }

func (grpcCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{grpcRefused, grpcFrames, grpcBytes, grpcRecv, grpcHops, grpcIngestStreams, grpcIngestFrames} {
		ch <- d
	}
}

func (c grpcCollector) Collect(ch chan<- prometheus.Metric) {
	c.m.mu.Lock()
	f := c.m.grpc
	c.m.mu.Unlock()
	if f == nil {
		return
	}
	g := f()
	for r, n := range g.Refused {
		ch <- prometheus.MustNewConstMetric(grpcRefused, prometheus.CounterValue, float64(n), r)
	}
	ch <- prometheus.MustNewConstMetric(grpcFrames, prometheus.CounterValue, float64(g.RelayedFrames), "relay")
	ch <- prometheus.MustNewConstMetric(grpcFrames, prometheus.CounterValue, float64(g.RefFrames), "direct")
	ch <- prometheus.MustNewConstMetric(grpcBytes, prometheus.CounterValue, float64(g.RelayedBytes))
	for from, n := range g.Received {
		ch <- prometheus.MustNewConstMetric(grpcRecv, prometheus.CounterValue, float64(n), from)
	}
	ch <- prometheus.MustNewConstHistogram(grpcHops, g.Hops, g.HopSum.Seconds(), g.HopBuckets)
	ch <- prometheus.MustNewConstMetric(grpcIngestStreams, prometheus.GaugeValue, float64(g.IngestStreams))
	ch <- prometheus.MustNewConstMetric(grpcIngestFrames, prometheus.CounterValue, float64(g.IngestFrames), "taken")
	ch <- prometheus.MustNewConstMetric(grpcIngestFrames, prometheus.CounterValue, float64(g.IngestRejected), "refused")
}

type ingestCollector struct{ m *Metrics }

func (ingestCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{ingestStreams, ingestPackets, ingestFrames, ingestIngested, ingestLost, ingestDecode, ingestPLIs,
		ingestDiscard, ingestRestarts, ingestPending, ingestRefused, ingestEnded, ingestCodecs, ingestCamLost, ingestRefusedF, ingestLoad} {
		ch <- d
	}
}

func (c ingestCollector) Collect(ch chan<- prometheus.Metric) {
	c.m.mu.Lock()
	f, load := c.m.ingest, c.m.load
	c.m.mu.Unlock()
	if load != nil {
		ch <- prometheus.MustNewConstMetric(ingestLoad, prometheus.GaugeValue, load())
	}
	if f == nil {
		return
	}
	for _, t := range f() {
		ch <- prometheus.MustNewConstMetric(ingestStreams, prometheus.GaugeValue, float64(t.Streams), t.App)
		ch <- prometheus.MustNewConstMetric(ingestPending, prometheus.GaugeValue, float64(t.Pending), t.App)
		for r, n := range t.Refused {
			ch <- prometheus.MustNewConstMetric(ingestRefused, prometheus.CounterValue, float64(n), t.App, r)
		}
		for k, n := range t.Ended {
			ch <- prometheus.MustNewConstMetric(ingestEnded, prometheus.CounterValue, float64(n), t.App, k)
		}
		for c, n := range t.Codecs {
			ch <- prometheus.MustNewConstMetric(ingestCodecs, prometheus.GaugeValue, float64(n), t.App, c)
		}
		for _, v := range []struct {
			d *prometheus.Desc
			n uint64
		}{{ingestPackets, t.Packets}, {ingestFrames, t.Frames}, {ingestIngested, t.Ingested}, {ingestLost, t.Lost}, {ingestDecode, t.DecodeErrors}, {ingestPLIs, t.PLIs}, {ingestDiscard, t.Discarded}, {ingestRestarts, t.Restarts}, {ingestCamLost, t.CameraLost}, {ingestRefusedF, t.FramesRefused}} {
			ch <- prometheus.MustNewConstMetric(v.d, prometheus.CounterValue, float64(v.n), t.App)
		}
	}
}

var (
	cameraReconnects = desc("ingest", "camera_reconnects_total", "Connection attempts to RTSP cameras after each one's first, failed ones included.", "app")
	cameraStreams    = desc("ingest", "camera_streams", "RTSP cameras by state: connecting, streaming, reconnecting (waiting or connecting again), failed (not retried), stopped.", "app", "state")
)

// cameraStates are the states every app's cameras are reported in (0
// included), so a camera changing state moves between series.
var cameraStates = []string{"connecting", "streaming", "reconnecting", "failed", "stopped"}

type cameraCollector struct{ m *Metrics }

func (cameraCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- cameraReconnects
	ch <- cameraStreams
}

func (c cameraCollector) Collect(ch chan<- prometheus.Metric) {
	c.m.mu.Lock()
	f := c.m.cameras
	c.m.mu.Unlock()
	if f == nil {
		return
	}
	type perApp struct {
		reconnects uint64
		states     map[string]int
	}
	apps := map[string]*perApp{}
	for _, cam := range f() {
		a := apps[cam.App]
		if a == nil {
			a = &perApp{states: map[string]int{}}
			apps[cam.App] = a
		}
		a.reconnects += cam.Reconnects
		a.states[cam.State]++
	}
	for app, a := range apps {
		ch <- prometheus.MustNewConstMetric(cameraReconnects, prometheus.CounterValue, float64(a.reconnects), app)
		for _, st := range cameraStates {
			ch <- prometheus.MustNewConstMetric(cameraStreams, prometheus.GaugeValue, float64(a.states[st]), app, st)
		}
	}
}

type gpuCollector struct{ m *Metrics }

func (gpuCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{gpuAvailable, gpuUtil, gpuMemUsed, gpuMemTotal, gpuMemSelf, gpuProcs} {
		ch <- d
	}
}

func (c gpuCollector) Collect(ch chan<- prometheus.Metric) {
	c.m.mu.Lock()
	f := c.m.gpu
	c.m.mu.Unlock()
	if f == nil {
		return
	}
	s := f()
	avail := 0.0
	if s.Available {
		avail = 1
	}
	ch <- prometheus.MustNewConstMetric(gpuAvailable, prometheus.GaugeValue, avail)
	for _, d := range s.Devices {
		ch <- prometheus.MustNewConstMetric(gpuUtil, prometheus.GaugeValue, d.UtilRatio, d.Index, d.Name)
		ch <- prometheus.MustNewConstMetric(gpuMemUsed, prometheus.GaugeValue, float64(d.MemUsed), d.Index, d.Name)
		ch <- prometheus.MustNewConstMetric(gpuMemTotal, prometheus.GaugeValue, float64(d.MemTotal), d.Index, d.Name)
		ch <- prometheus.MustNewConstMetric(gpuMemSelf, prometheus.GaugeValue, float64(d.CurrentUsed), d.Index, d.Name)
		ch <- prometheus.MustNewConstMetric(gpuProcs, prometheus.GaugeValue, float64(d.Processes), d.Index, d.Name)
	}
}
