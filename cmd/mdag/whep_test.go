//go:build !lean

package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/mdag/mdag/coordinator"
	"github.com/mdag/mdag/egress"
	"github.com/mdag/mdag/egress/whep"
	"github.com/mdag/mdag/examples"
	"github.com/mdag/mdag/ingest/synth"
	"github.com/mdag/mdag/internal/browsertest"
	"github.com/mdag/mdag/internal/clock"
)

// TestWhepServe: serve's wiring end to end. The tracker app on emulated
// GPUs with an in-process synthetic stream (its objects, of class person,
// come back as the app's tracks); aiortc plays /whep/tracker/cam and most
// decoded frames show a box edge in the tracks' class colour.
func TestWhepServe(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	if exec.Command("/usr/bin/python3", "-c", "import aiortc").Run() != nil {
		if os.Getenv("MDAG_REQUIRE_INTEROP") == "1" {
			t.Fatal("python3-aiortc is missing and MDAG_REQUIRE_INTEROP=1 (make deps installs it)")
		}
		t.Skip("python3-aiortc is missing")
	}
	app, prof, err := examples.Parse("tracker")
	if err != nil {
		t.Fatal(err)
	}
	limits, err := parseLimits("", prof)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(&testLogWriter{t: t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	obs, err := startObserved(coordinator.Config{Log: log}, limits, app, prof)
	if err != nil {
		t.Fatal(err)
	}
	defer obs.Close()
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	wf := addWhipFlags(fs)
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	closeWhip, err := wf.attach("127.0.0.1:0", app, obs, log)
	if err != nil {
		t.Fatal(err)
	}
	defer closeWhip()
	var mu sync.Mutex
	classes := map[string]int{}
	publish := func(r coordinator.FrameResult) {
		mu.Lock()
		for _, b := range r.Boxes {
			classes[b.Class]++
		}
		for _, tr := range r.Tracks {
			classes[tr.Box.Class]++
		}
		mu.Unlock()
	}
	obs.results.publish.Store(&publish)
	base, hs, err := obs.serveHTTP("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer hs.Close()

	if err := obs.e.Join(app.Name, "cam"); err != nil {
		t.Fatal(err)
	}
	pat, err := synth.NewPattern(320, 240, 3)
	if err != nil {
		t.Fatal(err)
	}
	pat.Motion, pat.Classes = synth.Lanes, []string{"person"}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = pat.Generate(ctx, clock.Real{}, 0, "cam", app.FPS, 0, obs.ingest)
	}()
	defer func() { cancel(); <-done }()
	for end := time.Now().Add(10 * time.Second); !obs.eg.IsLive("cam"); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("the synthetic stream never reached the egress")
		}
	}
	// the class the app's results draw in
	class := ""
	for end := time.Now().Add(15 * time.Second); class == ""; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("no result with boxes or tracks came")
		}
		mu.Lock()
		for k, n := range classes {
			if class == "" || n > classes[class] {
				class = k
			}
		}
		mu.Unlock()
	}
	c := egress.ClassColor(class)
	out, err := exec.CommandContext(ctx, "/usr/bin/python3", "../../tools/whep_aiortc.py", base+"/whep/"+string(app.Name)+"/cam", "5",
		"--colour", fmt.Sprintf("%d,%d,%d", c.B, c.G, c.R), "--min-run", "24").Output()
	if err != nil {
		t.Fatalf("aiortc: %v: %s", err, out)
	}
	var sum struct {
		Frames, WithBox, Width, Height, Status int
		LongestRun                             int `json:"longest_run"`
	}
	if err := json.Unmarshal(out, &sum); err != nil {
		t.Fatalf("%q: %v", out, err)
	}
	sum.WithBox = withBox(out)
	mu.Lock()
	t.Logf("aiortc: %s; result boxes by class %v", out, classes)
	mu.Unlock()
	// the traffic app runs at its own rate (10 fps): 5 s is ~50 frames
	if sum.Status != 201 || sum.Frames < 20 || sum.WithBox < sum.Frames*7/10 {
		t.Errorf("%d frames, %d with class %q's drawn colour (status %d): want >= 20 and >= 70%%", sum.Frames, sum.WithBox, class, sum.Status)
	}
	// the built-in pages play it: the stream page's "watch" section and
	// the dashboard's watch link (egress/whep's TestChromium checks the
	// player's pixels; this checks the pages' wiring)
	t.Run("pages", func(t *testing.T) {
		bctx := browsertest.New(t, 60*time.Second)
		playing := func(page, video string, start func() error) {
			t.Helper()
			if _, err := chromedp.Run(bctx, chromedp.Navigate(base+page)); err != nil {
				t.Fatal(err)
			}
			if err := start(); err != nil {
				t.Fatalf("%s: %v", page, err)
			}
			v := `document.getElementById("` + video + `")`
			if _, err := chromedp.Run(bctx, chromedp.Poll[bool](v+`.videoWidth > 0 && `+v+`.currentTime > 0.5`,
				chromedp.WithPollingInterval(200*time.Millisecond), chromedp.WithPollingTimeout(30*time.Second))); err != nil {
				st, _ := chromedp.Run(bctx, chromedp.Evaluate[string](`document.body.innerText`))
				t.Fatalf("%s: the annotated video did not play in 30 s: %v\n%s", page, err, st)
			}
			n, _ := chromedp.Run(bctx, chromedp.Evaluate[int](`fetch("/v1/whep").then(r => r.json()).then(s => s.viewers)`, chromedp.EvalAwaitPromise))
			if n != 1 {
				t.Errorf("%s: %d WHEP viewers while playing: want 1", page, n)
			}
		}
		playing("/stream/"+string(app.Name), "annotated", func() error {
			_, err := chromedp.Run(bctx, chromedp.Evaluate[any](`window.mdagWatch("cam")`, chromedp.EvalAwaitPromise))
			return err
		})
		if _, err := chromedp.Run(bctx, chromedp.Evaluate[any](`window.mdagUnwatch()`, chromedp.EvalAwaitPromise)); err != nil {
			t.Fatal(err)
		}
		// the dashboard: its thumbnail's watch link
		playing("/", "watchvideo", func() error {
			_, err := chromedp.Run(bctx, chromedp.Poll[bool](`(() => { const a = document.querySelector('.thumbs a.watch[data-stream="cam"]'); if (a) a.click(); return !!a; })()`,
				chromedp.WithPollingInterval(200*time.Millisecond), chromedp.WithPollingTimeout(30*time.Second)))
			return err
		})
		cap, _ := chromedp.Run(bctx, chromedp.Poll[string](`(() => { const f = document.querySelector('.thumbs figcaption'); return f && /1 watching/.test(f.textContent) ? f.textContent : null; })()`,
			chromedp.WithPollingInterval(200*time.Millisecond), chromedp.WithPollingTimeout(15*time.Second)))
		if !strings.Contains(cap, "1 watching") {
			t.Errorf("the dashboard's thumbnail caption %q: want 1 watching", cap)
		}
		if _, err := chromedp.Run(bctx, chromedp.Evaluate[any](`window.mdagUnwatch()`, chromedp.EvalAwaitPromise)); err != nil {
			t.Fatal(err)
		}
	})
}

func withBox(out []byte) int {
	var m map[string]any
	_ = json.Unmarshal(out, &m)
	f, _ := m["with_box"].(float64)
	return int(f)
}

// TestWhepSummary: serve's WHEP line and the metrics' figures say the
// refusals and encoder errors.
func TestWhepSummary(t *testing.T) {
	st := whep.Stats{Apps: []string{"traffic"}, Started: 5, Viewers: 1, MaxPerStream: 8, MaxViewers: 32,
		Refused: map[string]uint64{"stream_full": 2, "full": 1}, Totals: whep.Totals{Encoded: 900, Errors: 3, Evicted: 4}}
	got := whepSummary(st)
	want := "WHEP: 5 viewers served (1 now, limits 8 a stream, 32 in all), 900 frames encoded; 3 refused (full 1, stream_full 2); 3 ENCODER ERRORS; 4 frames evicted before their result"
	if got != want {
		t.Errorf("summary\n%s\nwant\n%s", got, want)
	}
	m := egressMetrics(st)
	if len(m) != 1 || m[0].App != "traffic" || m[0].Viewers != 1 || m[0].Refused["full"] != 1 || m[0].Errors != 3 || m[0].Evicted != 4 || m[0].Encoded != 900 {
		t.Errorf("metrics %+v", m)
	}
}
