package whep

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/mdag/mdag/egress"
	"github.com/mdag/mdag/internal/browsertest"
)

// playerPage plays /whep/app/cam with the player (/whep/player.js) and
// the token "tok"; window.probe() samples the video into a canvas and
// counts the rows with a run of >= 24 px near the colour (r, g, b).
const playerPage = `<!doctype html><html><body>
<video id="v" autoplay muted playsinline></video>
<script src="/whep/player.js"></script>
<script>
window.st = {state: "starting", error: ""};
whepPlay("/whep/app/cam", document.getElementById("v"), "tok", (s) => { window.st.state = s; })
  .then((s) => { window.session = s; }, (e) => { window.st.error = String(e.message || e); });
window.probe = (r, g, b) => {
  const v = document.getElementById("v");
  const out = {w: v.videoWidth, h: v.videoHeight, t: v.currentTime, rows: 0, state: window.st.state, error: window.st.error};
  if (!v.videoWidth) return out;
  const c = document.createElement("canvas");
  c.width = v.videoWidth; c.height = v.videoHeight;
  const g2 = c.getContext("2d");
  g2.drawImage(v, 0, 0);
  const d = g2.getImageData(0, 0, c.width, c.height).data;
  for (let y = 0; y < c.height; y++) {
    let run = 0, best = 0;
    for (let x = 0; x < c.width; x++) {
      const i = 4 * (y * c.width + x);
      if (Math.abs(d[i] - r) <= 60 && Math.abs(d[i+1] - g) <= 60 && Math.abs(d[i+2] - b) <= 60) { run++; best = Math.max(best, run); } else run = 0;
    }
    if (best >= 24) out.rows++;
  }
  return out;
};
</script></body></html>`

type probe struct {
	W, H  int
	T     float64
	Rows  int
	State string
	Error string
}

// TestChromium: headless Chromium plays the annotated stream with the
// browser player (player.js, the one the stream page and the dashboard
// use): the token goes as Authorization: Bearer on the POST and the
// DELETE, the <video> decodes 320x240 frames, its time advances, and a
// canvas sample shows the drawn boxes' colour; stopping the player
// DELETEs the viewer and the encoder stops.
func TestChromium(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	ctx := browsertest.New(t, 60*time.Second)
	s, hub, _ := newServer(t, Config{})
	source(t, hub, "cam", 15)
	var posts, deletes, bad atomic.Int64
	h := s.Handler()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprint(w, playerPage)
	})
	mux.Handle("GET "+PlayerPath, h) // no token: a <script src> sends none
	mux.Handle("/whep/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer tok" {
			bad.Add(1)
			http.Error(w, "no token", http.StatusUnauthorized)
			return
		}
		switch r.Method {
		case http.MethodPost:
			posts.Add(1)
		case http.MethodDelete:
			deletes.Add(1)
		}
		h.ServeHTTP(w, r)
	}))
	hs := httptest.NewServer(mux)
	t.Cleanup(hs.Close)

	if _, err := chromedp.Run(ctx, chromedp.Navigate(hs.URL+"/")); err != nil {
		t.Fatal(err)
	}
	c := egress.ClassColor("car")
	expr := fmt.Sprintf("window.probe(%d, %d, %d)", c.R, c.G, c.B)
	// decoded frames, a second of play, and a sample with box edges
	// (bounded for a loaded 2-core machine; done as soon as it holds)
	var first probe
	p, err := chromedp.Run(ctx, chromedp.Poll[probe](`(() => { const p = `+expr+`; return (p.error || (p.w > 0 && p.t > 1 && p.rows >= 2)) ? p : null; })()`,
		chromedp.WithPollingInterval(200*time.Millisecond), chromedp.WithPollingTimeout(30*time.Second)))
	if err != nil {
		last, _ := chromedp.Run(ctx, chromedp.Evaluate[probe](expr))
		t.Fatalf("the player did not show annotated video in 30 s: %v; page %+v; server %+v", err, last, s.Stats())
	}
	first = p
	t.Logf("player: %+v; server: %+v", p, s.Stats())
	if p.Error != "" {
		t.Fatalf("player error: %s", p.Error)
	}
	if p.W != 320 || p.H != 240 {
		t.Errorf("video %dx%d: want 320x240", p.W, p.H)
	}
	// the time keeps advancing
	p, err = chromedp.Run(ctx, chromedp.Poll[probe](`(() => { const p = `+expr+`; return p.t > `+fmt.Sprint(first.T+0.5)+` ? p : null; })()`,
		chromedp.WithPollingInterval(200*time.Millisecond), chromedp.WithPollingTimeout(15*time.Second)))
	if err != nil {
		t.Fatalf("the video's time stopped at %.2f s: %v", first.T, err)
	}
	if st := s.Stats(); st.Viewers != 1 || len(st.Streams) != 1 || st.Streams[0].Encoded == 0 {
		t.Errorf("server stats %+v: want one viewer of an encoding stream", st)
	}
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[any](`window.session.stop()`, chromedp.EvalAwaitPromise)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the player's DELETE to end the viewer", func() bool { st := s.Stats(); return st.Viewers == 0 && len(st.Streams) == 0 })
	if posts.Load() != 1 || deletes.Load() != 1 || bad.Load() != 0 {
		t.Errorf("POSTs %d, DELETEs %d, without the token %d: want 1, 1, 0", posts.Load(), deletes.Load(), bad.Load())
	}
	if s := s.Stats(); s.Totals.Encoded == 0 || s.Started != 1 {
		t.Errorf("totals %+v, started %d: want frames encoded by one viewer", s.Totals, s.Started)
	}
}
