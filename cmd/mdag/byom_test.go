package main

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mdag/mdag/gpu/onnx"
	"github.com/mdag/mdag/gpu/registry"
	"github.com/mdag/mdag/ingest/synth"
	"github.com/mdag/mdag/media"
	"github.com/mdag/mdag/profile"
)

// Bring your own model (issue 35): two ONNX models the project never saw,
// written by tools/models/byom.py into the test's directory, registered by
// testdata/byom/models.yaml, profiled by `mdag profile` with its defaults
// and served unedited as testdata/byom/app.yaml (detect -> crop -> classify
// -> count, SLO 600 ms, 5 fps) on the onnx executor with serve's defaults.

const (
	byomWorker = "CPU" // the worker type `mdag profile` is told (with --price, its two required flags)
	byomPrice  = "0.1"
	byomCrops  = 3 // boxes the detector finds on every frame (byom.py), crop's scale in app.yaml
	byomFPS    = 5 // app.yaml's fps
)

// byomSetup is the models, the registry, the app and the profiles in one
// directory, and what the profiles say the executor can carry.
type byomSetup struct {
	dir, models, app, profiles string
	best                       map[string]float64 // per model: the best measured items/s of any point
	capacity                   float64            // frames/s: 1 / (1/best detector + crops/best classifier)
}

// requireModelTools skips unless /usr/bin/python3 can import onnx and
// numpy (make models-deps), or fails when MDAG_REQUIRE_MODELS is set.
func requireModelTools(t *testing.T) {
	t.Helper()
	out, err := exec.Command("/usr/bin/python3", "-c", "import onnx, numpy").CombinedOutput()
	if err != nil {
		if os.Getenv("MDAG_REQUIRE_MODELS") != "" {
			t.Fatalf("MDAG_REQUIRE_MODELS is set and /usr/bin/python3 cannot import onnx and numpy (make models-deps): %v %s", err, out)
		}
		t.Skipf("/usr/bin/python3 cannot import onnx and numpy (make models-deps installs python3-onnx): %v", err)
	}
}

// setupBYOM writes the models, copies the registry and the app beside them
// and profiles both models and the CPU ops (mdag profile --op)
// into one profiles document: each run's output as written, its entries
// after the first's.
func setupBYOM(t *testing.T) *byomSetup {
	t.Helper()
	requireORT(t)
	requireModelTools(t)
	s := &byomSetup{dir: t.TempDir(), best: map[string]float64{}}
	if out, err := exec.Command("/usr/bin/python3", "../../tools/models/byom.py", s.dir).CombinedOutput(); err != nil {
		t.Fatalf("byom.py: %v\n%s", err, out)
	}
	s.models, s.app, s.profiles = filepath.Join(s.dir, "models.yaml"), filepath.Join(s.dir, "app.yaml"), filepath.Join(s.dir, "profiles.yaml")
	for _, f := range []string{"models.yaml", "app.yaml"} {
		b, err := os.ReadFile(filepath.Join("testdata", "byom", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(s.dir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	checkDetections(t, s.models)

	var docs [][]byte
	mdag := func(args ...string) []byte {
		var out, errb bytes.Buffer
		start := time.Now()
		if code := run(args, &out, &errb); code != exitOK {
			t.Fatalf("mdag %s: exit %d\n%s", strings.Join(args, " "), code, errb.String())
		}
		t.Logf("mdag %s (%.1fs)", strings.Join(args, " "), time.Since(start).Seconds())
		return out.Bytes()
	}
	for _, m := range []string{"byom-detector", "byom-classifier"} {
		docs = append(docs, mdag("profile", "--models", s.models, "--model", m, "--worker-type", byomWorker, "--price", byomPrice))
	}
	// The CPU ops are measured too (mdag profile --op): nothing hand-written.
	docs = append(docs,
		mdag("profile", "--op", "crop", "--target", "crop", "--boxes", strconv.Itoa(byomCrops), "--worker-type", byomWorker, "--price", byomPrice),
		mdag("profile", "--op", "count", "--target", "count", "--worker-type", byomWorker, "--price", byomPrice))
	doc, err := joinProfiles(docs...)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(s.profiles, doc, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("profiles (unedited mdag profile output, one document):\n%s", doc)
	pf, err := profile.Load(s.profiles)
	if err != nil {
		t.Fatal(err)
	}
	for _, pr := range pf.Profiles {
		for _, p := range pr.Points {
			tp := p.Throughput
			if tp == 0 {
				tp = float64(p.Batch*p.Concurrency) / p.Latency.Seconds()
			}
			s.best[pr.Target] = max(s.best[pr.Target], tp)
		}
	}
	det, cls := s.best["byom-detector"], s.best["byom-classifier"]
	if det <= 0 || cls <= 0 {
		t.Fatalf("no measured throughput for the models: %v", s.best)
	}
	s.capacity = 1 / (1/det + byomCrops/cls)
	t.Logf("executor capacity from the profiles: detector %.0f items/s, classifier %.0f items/s: %.1f frames/s (1 detection + %d classifications each)",
		det, cls, s.capacity, byomCrops)
	return s
}

// checkDetections runs the detector alone on the frames serve's synthetic
// source sends: byom.py's biases make it find exactly byomCrops boxes on
// any frame, so crop -> classify gets that many items per frame (crop's
// scale in app.yaml).
func checkDetections(t *testing.T, models string) {
	t.Helper()
	reg, err := registry.Load(models)
	if err != nil {
		t.Fatal(err)
	}
	x, err := onnx.New(reg, onnx.Config{IntraThreads: 1, Sessions: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	pat, err := synth.NewPattern(320, 240, 3)
	if err != nil {
		t.Fatal(err)
	}
	for stream := range 2 {
		for seq := range uint64(10) {
			f, _, err := pat.Frame(stream, seq*7)
			if err != nil {
				t.Fatal(err)
			}
			out, err := x.Run(context.Background(), "byom-detector", []*media.Item{{Frame: f}})
			if err != nil {
				t.Fatal(err)
			}
			if n := len(out[0][0].Boxes); n != byomCrops {
				t.Fatalf("stream %d frame %d: the detector found %d boxes (%v), want %d (byom.py's biases)", stream, seq*7, n, out[0][0].Boxes, byomCrops)
			}
		}
	}
}

// joinProfiles makes one profiles document of several that mdag profile
// wrote for the same worker type: the first as it is, then each other's
// entries (the lines after its profiles: line), unchanged. The result must
// parse.
func joinProfiles(docs ...[]byte) ([]byte, error) {
	var b bytes.Buffer
	for i, d := range docs {
		if i == 0 {
			b.Write(d)
			continue
		}
		_, entries, ok := bytes.Cut(d, []byte("\nprofiles:\n"))
		if !ok {
			return nil, fmt.Errorf("profiles document %d has no profiles: line:\n%s", i+1, d)
		}
		b.Write(entries)
	}
	if _, err := profile.Parse("joined.yaml", b.Bytes()); err != nil {
		return nil, fmt.Errorf("the joined profiles do not parse: %w\n%s", err, b.Bytes())
	}
	return b.Bytes(), nil
}

// serveSummary is the frame line of serve's summary.
type serveSummary struct {
	sent, finished, late, dropped, open int
	out                                 string
}

var frameLine = regexp.MustCompile(`frames sent (\d+), finished (\d+), late (\d+), dropped (\d+), open (\d+);`)

func (s serveSummary) rate() float64 { return float64(s.finished) / float64(max(s.sent, 1)) }

// serveBYOM runs mdag serve on the setup with streams synthetic streams
// for d and reads its summary.
func serveBYOM(t *testing.T, s *byomSetup, streams int, d time.Duration) serveSummary {
	t.Helper()
	args := []string{"serve", "-f", s.app, "-p", s.profiles, "--executor", "onnx", "--models", s.models,
		"--synthetic", strconv.Itoa(streams), "--duration", d.String(), "--listen", "127.0.0.1:0"}
	var out, errb bytes.Buffer
	if code := run(args, &out, &errb); code != exitOK {
		t.Fatalf("mdag %s: exit %d\n%s", strings.Join(args, " "), code, errb.String())
	}
	r := serveSummary{out: out.String()}
	m := frameLine.FindStringSubmatch(r.out)
	if m == nil {
		t.Fatalf("no frames line in serve's summary:\n%s", r.out)
	}
	for i, p := range []*int{&r.sent, &r.finished, &r.late, &r.dropped, &r.open} {
		*p, _ = strconv.Atoi(m[i+1])
	}
	t.Logf("mdag %s\n%s", strings.Join(args, " "), r.out)
	return r
}

// TestBYOM serves the bring-your-own-model pipeline at 2 streams (the
// issue's case: 150 frames) and at 80% of the executor's capacity the
// profiles measured (streams = 0.8 x capacity / 5 fps): >= 99% of the
// frames finish within the SLO and every frame is accounted for (sent =
// finished + late + dropped, none open).
//
// Under the race detector (make test) the capacity case runs at
// byomRaceShare of the capacity and wants byomRaceRate; the 2-stream case
// keeps 99%. The tight figure at capacity is this test without -race and
// tools/served-ratio.sh's (docs/benchmarks.md).
func TestBYOM(t *testing.T) {
	if testing.Short() {
		t.Skip("profiles two models and serves 25 s of streams")
	}
	s := setupBYOM(t)
	share, want := 0.8, 0.99
	if raceEnabled {
		share, want = byomRaceShare, byomRaceRate
	}
	cases := []struct {
		name    string
		streams int
		d       time.Duration
		want    float64
	}{
		{"2 streams", 2, 15 * time.Second, 0.99},
		{fmt.Sprintf("%.0f%% of capacity", 100*share), max(int(math.Floor(share*s.capacity/byomFPS)), 1), 10 * time.Second, want},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := serveBYOM(t, s, c.streams, c.d)
			if r.sent == 0 || r.open != 0 || r.finished+r.late+r.dropped != r.sent {
				t.Errorf("%d streams: sent %d, finished %d + late %d + dropped %d, open %d: not every frame accounted for",
					c.streams, r.sent, r.finished, r.late, r.dropped, r.open)
			}
			t.Logf("%d streams (%d frames/s offered, capacity %.1f): %d of %d finished (%.1f%%)",
				c.streams, c.streams*byomFPS, s.capacity, r.finished, r.sent, 100*r.rate())
			if r.rate() < c.want {
				t.Errorf("%d streams: %d of %d frames finished (%.1f%%), want >= %.0f%% (serve's summary above: drops by module and reason, BUDGET MS, EXEC MS against the profile)",
					c.streams, r.finished, r.sent, 100*r.rate(), 100*c.want)
			}
		})
	}
}

// Under -race every Go instruction is instrumented (5-10x slower) while
// ONNX Runtime is not: at 80% of capacity ONNX Runtime alone wants ~80% of
// the cores the profiles measured on (both, at concurrency 2), and the Go
// side of each frame (the synthetic source drawing it, preprocessing,
// routing, crop, count; ~1 ms a frame without -race, measured with perf on
// face-live) no longer fits beside it: a run at 16 streams under -race saw
// frames reach the session 0.9 s after capture (p95), more than the SLO
// allows. Half the load (40%: ONNX Runtime ~0.8 cores, the instrumented Go
// side ~0.3) leaves room on a loaded 2-core machine, and 95% still fails a
// runtime that drops frames it could run.
const (
	byomRaceShare = 0.4
	byomRaceRate  = 0.95
)
