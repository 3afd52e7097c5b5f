package whip

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/mdag/mdag/allocator/milp"
	"github.com/mdag/mdag/coordinator"
	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/examples"
	"github.com/mdag/mdag/internal/browsertest"
	"github.com/mdag/mdag/profile"
)

// requireInterop: `make test` sets MDAG_REQUIRE_INTEROP=1 (its deps install
// aiortc and Chromium), so a missing third-party stack fails there instead
// of skipping.
func requireInterop(t *testing.T, what, hint string) {
	if os.Getenv("MDAG_REQUIRE_INTEROP") == "1" {
		t.Fatalf("%s is missing (%s); make deps installs it", what, hint)
	}
	t.Skipf("%s is missing (%s); run make deps, or make test, which requires it", what, hint)
}

// engineServer is a WHIP server in front of a real embedded engine running
// the traffic example (emulated GPUs).
func engineServer(t *testing.T) (*Server, *httptest.Server, *atomic.Int64) {
	t.Helper()
	app, prof, err := examples.Parse("traffic")
	if err != nil {
		t.Fatal(err)
	}
	limits := map[profile.WorkerTypeID]int{}
	for _, w := range prof.Workers {
		limits[w.Type] = 8
	}
	var srv atomic.Pointer[Server]
	var finished atomic.Int64
	e, _ := coordinator.MustEmbedded(coordinator.Config{MILPSolver: milp.Solver{}, OnFrame: func(r coordinator.FrameResult) {
		if r.Outcome == coordinator.Finished {
			finished.Add(1)
		}
		if s := srv.Load(); s != nil {
			s.Publish(Result{Stream: r.Stream, Frame: r.Seq, Outcome: string(r.Outcome), Module: string(r.Module), Reason: r.Reason})
		}
	}}, limits)
	e.Start()
	if err := e.Deploy(app, prof); err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{Apps: map[dag.AppID]float64{app.Name: app.FPS}}, e)
	if err != nil {
		t.Fatal(err)
	}
	srv.Store(s)
	hs := httptest.NewServer(s.Handler())
	t.Cleanup(func() {
		s.Close()
		hs.Close()
		e.Close()
	})
	return s, hs, &finished
}

func interopSeconds(def float64) float64 {
	if v, err := time.ParseDuration(os.Getenv("MDAG_INTEROP_DURATION")); err == nil && v > 0 {
		return v.Seconds()
	}
	return def
}

// TestAiortc: Debian's aiortc (another WebRTC stack) streams a VP8 pattern
// over WHIP; frames reach the app and results come back on the
// DataChannel aiortc opens and as SSE. With a DataChannel aiortc offers two
// media sections with their own ICE credentials in one BUNDLE group (pion
// refused that before bundleOffer); without one, a single section.
func TestAiortc(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	if exec.Command("/usr/bin/python3", "-c", "import aiortc").Run() != nil {
		requireInterop(t, "python3-aiortc", "import aiortc under /usr/bin/python3 failed")
	}
	for _, c := range []struct {
		name        string
		datachannel bool
	}{{"datachannel", true}, {"sse only", false}} {
		t.Run(c.name, func(t *testing.T) {
			srv, hs, finished := engineServer(t)
			secs := interopSeconds(12)
			ctx, cancel := context.WithTimeout(context.Background(), time.Duration(secs+40)*time.Second)
			defer cancel()
			args := []string{"../../tools/whip_aiortc.py", hs.URL + "/whip/traffic", strconv.FormatFloat(secs, 'f', -1, 64)}
			if !c.datachannel {
				args = append(args, "--no-datachannel")
			}
			out, err := exec.CommandContext(ctx, "/usr/bin/python3", args...).Output()
			if err != nil {
				stderr := ""
				if ee, ok := err.(*exec.ExitError); ok {
					stderr = string(ee.Stderr)
				}
				t.Fatalf("aiortc client: %v\nstdout: %s\nstderr: %s", err, out, stderr)
			}
			var sum struct {
				Results    int            `json:"results"`
				Outcomes   map[string]int `json:"outcomes"`
				DCOpened   bool           `json:"dc_opened"`
				DCResults  int            `json:"dc_results"`
				DCOutcomes map[string]int `json:"dc_outcomes"`
				DCErrors   int            `json:"dc_errors"`
				DCEnded    string         `json:"dc_ended"`
				Ended      string         `json:"ended"`
				SSEError   string         `json:"sse_error"`
			}
			if err := json.Unmarshal(out, &sum); err != nil {
				t.Fatalf("summary %q: %v", out, err)
			}
			st := srv.Streams()
			if len(st) != 1 {
				t.Fatalf("streams %+v", st)
			}
			t.Logf("aiortc: %+v; server: %+v; finished %d", sum, st[0], finished.Load())
			// The traffic app samples 10 fps of aiortc's 30: expect most of them.
			if want := uint64(secs * 10 * 0.6); st[0].Ingested < want || st[0].Width != 320 {
				t.Errorf("ingested %d frames at %dx%d, want >= %d at 320x240", st[0].Ingested, st[0].Width, st[0].Height, want)
			}
			if sum.Results < int(float64(st[0].Ingested)*0.9) || sum.Outcomes["finished"] == 0 || sum.SSEError != "" {
				t.Errorf("SSE delivered %d results for %d frames (%v, error %q)", sum.Results, st[0].Ingested, sum.Outcomes, sum.SSEError)
			}
			if c.datachannel && (!sum.DCOpened || sum.DCResults < int(float64(st[0].Ingested)*0.9) || sum.DCOutcomes["finished"] == 0 || sum.DCErrors != 0) {
				t.Errorf("DataChannel (opened %v) delivered %d results for %d frames (%v, %d unreadable)", sum.DCOpened, sum.DCResults, st[0].Ingested, sum.DCOutcomes, sum.DCErrors)
			}
			if !c.datachannel && (sum.DCOpened || sum.DCResults != 0) {
				t.Errorf("no DataChannel was offered, yet %d results came on one", sum.DCResults)
			}
			if c.datachannel && !strings.Contains(sum.DCEnded, "deleted") {
				t.Errorf("DataChannel goodbye %q: want the reason, the client's DELETE", sum.DCEnded)
			}
			if !strings.Contains(st[0].Ended, "deleted") || !strings.Contains(sum.Ended, "deleted") {
				t.Errorf("ended %q, SSE end %q: want the client's DELETE", st[0].Ended, sum.Ended)
			}
		})
	}
}

// TestChromium: a real browser (headless Chromium, fake camera) opens
// /stream/{app}, streams for 10 s over WHIP and draws the results it gets
// on the DataChannel.
func TestChromium(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	ctx := browsertest.New(t, 90*time.Second,
		chromedp.Flag("use-fake-device-for-media-stream", true),
		chromedp.Flag("use-fake-ui-for-media-stream", true))
	srv, hs, _ := engineServer(t)
	secs := interopSeconds(10)
	type pageStats struct {
		State    string         `json:"state"`
		Results  int            `json:"results"`
		Finished int            `json:"finished"`
		Error    string         `json:"error"`
		Last     map[string]any `json:"last"`
	}
	if _, err := chromedp.Run(ctx, chromedp.Navigate(hs.URL+"/stream/traffic?autostart")); err != nil {
		t.Fatal(err)
	}
	// The browser streams in real time: let it run, then read the page.
	if _, err := chromedp.Run(ctx, chromedp.Sleep(time.Duration(secs*float64(time.Second)))); err != nil {
		t.Fatal(err)
	}
	stats, err := chromedp.Run(ctx, chromedp.Evaluate[pageStats](`window.mdagStats`))
	if err != nil {
		t.Fatal(err)
	}
	st := srv.Streams()
	t.Logf("browser: %+v; server: %+v", stats, st)
	if stats.Error != "" || stats.State != "connected" && stats.State != "streaming" {
		t.Fatalf("page state %q, error %q", stats.State, stats.Error)
	}
	if len(st) != 1 || st[0].Ingested < uint64(secs*10*0.5) {
		t.Fatalf("server streams %+v: want one with >= %d frames", st, int(secs*10*0.5))
	}
	if stats.Results < int(st[0].Ingested)/2 || stats.Finished == 0 {
		t.Errorf("page got %d results (%d finished) for %d frames", stats.Results, stats.Finished, st[0].Ingested)
	}
	// Stop: the page's DELETE leaves the session.
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[any](`window.mdagStop()`, chromedp.EvalAwaitPromise)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the page's DELETE", 5*time.Second, func() bool {
		s := srv.Streams()
		return len(s) == 1 && s[0].Ended != ""
	})
	// Again, and this time the stream is ended on the server's side: the
	// page hears why on its DataChannel and says so.
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[any](`window.mdagStart()`, chromedp.EvalAwaitPromise)); err != nil {
		t.Fatal(err)
	}
	var second string
	waitFor(t, "the page's second stream", 15*time.Second, func() bool {
		for _, s := range srv.Streams() {
			if s.Ended == "" && s.Ingested > 0 {
				second = s.ID
				return true
			}
		}
		return false
	})
	req, _ := http.NewRequest(http.MethodDelete, hs.URL+"/whip/traffic/"+second, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	waitFor(t, "the page to say the server ended its stream", 5*time.Second, func() bool {
		s, err := chromedp.Run(ctx, chromedp.Evaluate[pageStats](`window.mdagStats`))
		return err == nil && s.State == "ended" && strings.Contains(s.Error, "the server ended the stream: deleted")
	})
}
