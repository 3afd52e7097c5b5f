package metrics

import (
	"bytes"
	"encoding/json"
	"flag"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/mdag/mdag/ingest"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden")

// scripted feeds one of everything into a fresh Metrics: a deterministic
// stand-in for a few seconds of the traffic app.
func scripted() *Metrics {
	m := New(false)
	a := m.App("traffic")
	det := m.Module("traffic", "detect", "ssd-inception", true)
	cnt := m.Module("traffic", "count", "", false)
	for i := range 10 {
		a.FrameSent()
		a.IngestDelay(time.Duration(3+4*i) * time.Millisecond)
	}
	for i := range 7 {
		a.Frame(Finished, "", "", time.Duration(40+10*i)*time.Millisecond)
	}
	a.Frame(Late, "", "", 450*time.Millisecond)
	a.Frame(Dropped, "detect", "cannot-finish", 0)
	a.Frame(Dropped, "-", "lost", 0)
	det.In()
	det.In()
	det.Exec(38 * time.Millisecond)
	det.Queued(2 * time.Millisecond)
	det.Queued(7 * time.Millisecond)
	cnt.Exec(300 * time.Microsecond)
	cnt.Queued(-time.Microsecond)
	cnt.Batch(3) // a CPU module has no batch series
	det.Batch(2)
	det.Batch(5)
	det.SchedulerDrop("deadline")
	det.Rejected()
	m.ModuleFactors("traffic", "detect", 3.5, 1.1)
	m.Session("traffic", 4, 0.7, true, 1.39, 2.9)
	m.Instances(map[[2]string]int{{"P100", "active"}: 1, {"CPU", "active"}: 1, {"V100", "warm"}: 1})
	m.Instances(map[[2]string]int{{"P100", "active"}: 2, {"CPU", "active"}: 1}) // V100 released: its series reads 0
	m.Cost(4.97, 1.39)
	m.Solve("allocate", 3*time.Millisecond)
	m.Solve("place", 400*time.Microsecond)
	m.Trigger("join")
	m.Trigger("scaling")
	m.Replanned()
	m.HTTPRefused("unauthorized")
	m.HTTPRefused("unauthorized")
	m.SetIngest(func() []ingest.Totals {
		return []ingest.Totals{{App: "traffic", Streams: 2, Pending: 1, Packets: 900, Frames: 300, Ingested: 100, Lost: 1, DecodeErrors: 0, PLIs: 3,
			Discarded: 4, Restarts: 1, CameraLost: 2, FramesRefused: 5, Codecs: map[string]int{"h264": 1, "vp8": 1}, Refused: map[string]uint64{"capacity": 4, "pending-limit": 1}, Ended: map[string]uint64{"client": 3, "overload": 1}}}
	})
	m.SetIngestLoad(func() float64 { return 0.85 })
	m.SetEgress(func() []Egress {
		return []Egress{{App: "traffic", Viewers: 3, Streams: 2, Refused: map[string]uint64{"stream_full": 2, "unknown_stream": 1},
			Encoded: 900, EncodedBytes: 1 << 20, Errors: 1, Evicted: 4, Skipped: 7}}
	})
	m.SetCameras(func() []Camera {
		return []Camera{{App: "traffic", State: "streaming", Reconnects: 3}, {App: "traffic", State: "reconnecting", Reconnects: 4}, {App: "traffic", State: "streaming"}}
	})
	m.SetLoop(func() Loop { return Loop{Busy: 1500 * time.Millisecond, Events: 42000} })
	m.SetGRPC(func() GRPC {
		return GRPC{Refused: map[string]uint64{"frame-size": 2, "unknown-task": 1}, RelayedFrames: 3, RelayedBytes: 3 * 230400, RefFrames: 40,
			Hops: 43, HopBuckets: map[float64]uint64{0.0005: 10, 0.001: 40, 0.0025: 43}, HopSum: 30 * time.Millisecond,
			Received: map[string]uint64{"workers": 64500, "sources": 9912360, "other": 0}}
	})
	m.SetClips(func() []Clips {
		return []Clips{{App: "traffic", Streams: 2, Frames: 600, FramesDropped: 3, EncodeErrors: 1, Written: 4, WrittenBytes: 4 << 20, WriteErrors: 1,
			Limited: 2, Missed: 1, RemovedForBytes: 1, RemovedForAge: 2, RemovedBytes: 3 << 20, RingDrops: 1, StoredBytes: 1 << 20}}
	})
	m.SetGPU(func() GPUSnapshot {
		return GPUSnapshot{Available: true, Devices: []GPUDevice{{Index: "0", Name: "NVIDIA H100", UtilRatio: 0.42,
			MemUsed: 3 << 30, MemTotal: 80 << 30, Processes: 1, CurrentUsed: 1 << 30}}}
	})
	return m
}

func exposition(t *testing.T, m *Metrics) []byte {
	t.Helper()
	fams, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	for _, f := range fams {
		if _, err := expfmt.MetricFamilyToText(&b, f); err != nil {
			t.Fatal(err)
		}
	}
	return b.Bytes()
}

// TestExpositionGolden pins every metric's name, type, help, labels and
// the values a scripted sequence of events gives.
func TestExpositionGolden(t *testing.T) {
	got := exposition(t, scripted())
	path := filepath.Join("testdata", "exposition.golden")
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./observe/metrics -update)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("exposition differs from %s (go test ./observe/metrics -update, then review the diff):\n%s", path, diffLines(string(want), string(got)))
	}
}

// TestLint runs client_golang's promlint (the checks of `promtool check
// metrics`) and mdag's own conventions on the exposition.
func TestLint(t *testing.T) {
	m := scripted()
	problems, err := testutil.GatherAndLint(m.Registry())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
	fams, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	name := regexp.MustCompile(`^mdag_(session|module|scheduler|cluster|planner|engine|ingest|gpu|grpc|http|egress|output|clips)_[a-z_]+$`)
	units := regexp.MustCompile(`_(total|seconds|ratio|bytes|size|dollars_per_hour|streams|instances|processes|available|viewers)$`)
	for _, f := range fams {
		n := f.GetName()
		if !name.MatchString(n) {
			t.Errorf("%s: not mdag_<subsystem>_<what>", n)
		}
		if !units.MatchString(n) {
			t.Errorf("%s: no unit or kind suffix", n)
		}
		if f.GetHelp() == "" {
			t.Errorf("%s: no help", n)
		}
		if f.GetType() == dto.MetricType_SUMMARY {
			t.Errorf("%s: a summary; use a histogram", n)
		}
		for _, mt := range f.GetMetric() {
			for _, l := range mt.GetLabel() {
				if l.GetName() == "stream" {
					t.Errorf("%s: per-stream label", n)
				}
			}
		}
	}
}

// TestNil: every method is a no-op on nil metrics.
func TestNil(t *testing.T) {
	var m *Metrics
	a := m.App("a")
	a.FrameSent()
	a.IngestDelay(0)
	a.Frame(Dropped, "b", "r", 0)
	mm := m.Module("a", "b", "c", true)
	mm.In()
	mm.Exec(0)
	mm.Queued(0)
	mm.Batch(1)
	mm.SchedulerDrop("c")
	mm.Rejected()
	m.Session("a", 1, 1, true, 1, 1)
	m.ModuleFactors("a", "b", 1, 1)
	m.Instances(nil)
	m.Cost(1, 1)
	m.Solve("place", 0)
	m.Trigger("join")
	m.Replanned()
	m.SetIngest(nil)
	m.SetIngestLoad(nil)
	m.SetGPU(nil)
	m.SetCameras(nil)
	m.SetClips(nil)
}

// TestHandler serves the text exposition with the runtime collectors.
func TestHandler(t *testing.T) {
	m := New(true)
	_ = m.App("traffic")
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body := rec.Body.String()
	for _, want := range []string{"# TYPE mdag_session_frames_total counter", `mdag_session_frames_total{app="traffic",outcome="finished"} 0`, "go_goroutines"} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if ct := rec.Header().Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Errorf("Content-Type %q", ct)
	}
}

// TestNoGPU: without NVML only the availability gauge is exposed, at 0.
func TestNoGPU(t *testing.T) {
	m := New(false)
	m.SetGPU(func() GPUSnapshot { return GPUSnapshot{} })
	got := string(exposition(t, m))
	if !strings.Contains(got, "mdag_gpu_telemetry_available 0") || strings.Contains(got, "mdag_gpu_utilization_ratio{") {
		t.Errorf("exposition without a GPU:\n%s", got)
	}
}

func diffLines(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var b strings.Builder
	in := map[string]bool{}
	for _, l := range w {
		in[l] = true
	}
	out := map[string]bool{}
	for _, l := range g {
		out[l] = true
		if !in[l] {
			b.WriteString("+ " + l + "\n")
		}
	}
	for _, l := range w {
		if !out[l] {
			b.WriteString("- " + l + "\n")
		}
	}
	return b.String()
}

// TestGrafanaDashboard: deploy/grafana/mdag.json is valid JSON, queries
// only metrics that exist, and shows every metric mdag exposes.
func TestGrafanaDashboard(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "..", "deploy", "grafana", "mdag.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Type    string `json:"type"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("mdag.json: %v", err)
	}
	fams, err := scripted().Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	exposed := map[string]bool{}
	for _, f := range fams {
		exposed[f.GetName()] = true
	}
	used := map[string]bool{}
	name := regexp.MustCompile(`mdag_[a-z_]+`)
	for _, p := range d.Panels {
		if p.Type != "row" && len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			for _, n := range name.FindAllString(tg.Expr, -1) {
				base := n
				for _, suf := range []string{"_bucket", "_sum", "_count"} {
					if b, ok := strings.CutSuffix(n, suf); ok && exposed[b] {
						base = b
					}
				}
				if !exposed[base] {
					t.Errorf("panel %q queries %s, which mdag does not expose", p.Title, n)
				}
				used[base] = true
			}
		}
	}
	for n := range exposed {
		if !used[n] {
			t.Errorf("%s is exposed but no panel of deploy/grafana/mdag.json shows it", n)
		}
	}
}

// BenchmarkScrape is one /metrics request's work on a registry with the
// traffic app's series (Gather and text encoding).
func BenchmarkScrape(b *testing.B) {
	m := scripted()
	for _, mod := range []string{"crop-vehicles", "crop-people", "classify", "face", "count"} {
		mm := m.Module("traffic", mod, "m", true)
		mm.Exec(time.Millisecond)
		mm.Queued(time.Millisecond)
	}
	h := m.Handler()
	b.ReportAllocs()
	for b.Loop() {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		if rec.Code != 200 {
			b.Fatal(rec.Code)
		}
	}
}

// BenchmarkFrame is the cost the engine's loop pays per ended frame.
func BenchmarkFrame(b *testing.B) {
	a := scripted().App("traffic")
	b.ReportAllocs()
	for b.Loop() {
		a.Frame(Finished, "", "", 50*time.Millisecond)
	}
}
