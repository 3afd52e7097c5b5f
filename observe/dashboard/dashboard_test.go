package dashboard

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/mdag/mdag/coordinator"
	"github.com/mdag/mdag/ingest"
	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/media"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var t0 = time.Unix(1_800_000_000, 0)

// fakeEngine is a status source whose windows and re-plans the test adds.
type fakeEngine struct {
	mu      sync.Mutex
	windows []coordinator.WindowStatus
	replans []coordinator.Replan
	streams []string
}

func (f *fakeEngine) status() coordinator.Status {
	f.mu.Lock()
	defer f.mu.Unlock()
	w := f.windows[max(0, len(f.windows)-10):] // the engine shows the last 10
	return coordinator.Status{Policy: "clockwork", Sessions: []coordinator.SessionStatus{{App: "traffic", Streams: len(f.streams), StreamIDs: f.streams,
		FPS: 10, SLOMS: 400, CostWhole: 2.9, CostFractional: 1.4, Windows: append([]coordinator.WindowStatus(nil), w...),
		Modules: []coordinator.ModuleStatus{{Module: "detect", Kind: "gpu", RateIn: 30, MeanBatch: 2, Scale: 1, Balloon: 1}}}},
		Instances: []coordinator.InstanceStatus{{ID: "P100-0", Type: "P100", State: "active", Modules: []string{"traffic/detect"}},
			{ID: "V100-0", Type: "V100", State: "warm"}},
		Replans: append([]coordinator.Replan(nil), f.replans[max(0, len(f.replans)-20):]...)}
}

func (f *fakeEngine) second(clk *clock.Fake, finished, sent uint64) {
	f.mu.Lock()
	f.windows = append(f.windows, coordinator.WindowStatus{Start: clk.Now().Add(-time.Second).UTC(), Counts: coordinator.Counts{Sent: sent, Finished: finished},
		FinishRate: float64(finished) / float64(sent)})
	f.mu.Unlock()
	clk.Advance(time.Second)
}

// TestHistory: every window is recorded once however many samples see it,
// re-plans once by number, history is bounded, and the instances count
// per app leaves warm ones out.
func TestHistory(t *testing.T) {
	clk := clock.NewFake(t0)
	f := &fakeEngine{streams: []string{"s1"}}
	r := New(Config{Clock: clk, Keep: 30}, f.status)
	r.Start()
	defer r.Close()
	for i := range 50 {
		f.mu.Lock()
		if i%7 == 0 {
			f.replans = append(f.replans, coordinator.Replan{N: len(f.replans) + 1, Trigger: "join"})
		}
		f.mu.Unlock()
		f.second(clk, uint64(i%10), 10)
	}
	h := r.History()
	if len(h.Apps) != 1 {
		t.Fatalf("apps %+v", h.Apps)
	}
	a := h.Apps[0]
	if len(a.Points) != 30 || len(a.Windows) != 30 {
		t.Errorf("kept %d points, %d windows; want 30 each", len(a.Points), len(a.Windows))
	}
	for i := 1; i < len(a.Windows); i++ {
		if a.Windows[i].T-a.Windows[i-1].T != 1000 {
			t.Fatalf("windows %d and %d are %d ms apart: duplicated or lost", i-1, i, a.Windows[i].T-a.Windows[i-1].T)
		}
	}
	if last := a.Windows[len(a.Windows)-1]; last.FinishRate != 0.9 || last.Finished != 9 {
		t.Errorf("last window %+v", last)
	}
	if len(h.Replans) != 8 || h.Replans[7].N != 8 {
		t.Errorf("replans %d (want 8, each once)", len(h.Replans))
	}
	if p := a.Points[len(a.Points)-1]; p.Instances["P100"] != 1 || p.Instances["V100"] != 0 || p.CostWhole != 2.9 {
		t.Errorf("last point %+v", p)
	}
	if w, al := h.MeanCost(); math.Abs(w-2.9) > 1e-9 || math.Abs(al-1.4) > 1e-9 {
		t.Errorf("mean cost %g, %g", w, al)
	}
}

// TestEvents: the SSE stream carries each sample's new windows and ends
// with an end event when the recorder closes.
func TestEvents(t *testing.T) {
	clk := clock.NewFake(t0)
	f := &fakeEngine{}
	r := New(Config{Clock: clk}, f.status)
	r.Start()
	hs := httptest.NewServer(r.Handler())
	defer hs.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", hs.URL+"/v1/dashboard/events", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("Content-Type %q", ct)
	}
	events := make(chan string, 16)
	go func() {
		defer close(events)
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		var ev string
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.HasPrefix(line, "event: "):
				ev = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "data: "):
				events <- ev + " " + strings.TrimPrefix(line, "data: ")
			}
		}
	}()
	// The subscription exists once the handler has written its preamble
	// (the response headers arrived): each second from now is an event.
	seen := 0
	for i := range 3 {
		f.second(clk, 10, 10)
		select {
		case e := <-events:
			kind, data, _ := strings.Cut(e, " ")
			var s Snapshot
			if err := json.Unmarshal([]byte(data), &s); err != nil || kind != "sample" {
				t.Fatalf("event %q: %v", e, err)
			}
			seen += len(s.Apps[0].Windows)
			if i > 0 && len(s.Apps[0].Windows) != 1 {
				t.Errorf("sample %d carries %d windows, want the 1 new one", i, len(s.Apps[0].Windows))
			}
		case <-ctx.Done():
			t.Fatal("no sample event")
		}
	}
	if seen != 3 {
		t.Errorf("%d windows over 3 samples", seen)
	}
	r.Close()
	for e := range events {
		if strings.HasPrefix(e, "end ") {
			return
		}
	}
	t.Error("no end event after Close")
}

// TestPages: the page and its assets are served from the binary; the
// history is JSON; a missing thumbnail is a 404 that says why.
func TestPages(t *testing.T) {
	clk := clock.NewFake(t0)
	f := &fakeEngine{}
	r := New(Config{Clock: clk}, f.status)
	r.Start()
	defer r.Close()
	hs := httptest.NewServer(r.Handler())
	defer hs.Close()
	for _, c := range []struct {
		path, ctype, body string
		code              int
	}{
		{"/", "text/html", `<script src="/dashboard/app.js">`, 200},
		{"/dashboard/app.js", "javascript", "EventSource", 200},
		{"/dashboard/style.css", "text/css", ".chart", 200},
		{"/v1/dashboard", "application/json", `"apps":[{"app":"traffic"`, 200},
		{"/v1/thumbs/nope", "text/plain", "no thumbnail for stream nope", 404},
		{"/dashboard/missing.js", "text/plain", "404", 404},
	} {
		resp, err := http.Get(hs.URL + c.path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.code || !strings.Contains(resp.Header.Get("Content-Type"), c.ctype) || !strings.Contains(string(b), c.body) {
			t.Errorf("GET %s: %d %q %.120q", c.path, resp.StatusCode, resp.Header.Get("Content-Type"), b)
		}
	}
}

// TestThumbs: a frame becomes a small JPEG, refreshed at most once a
// second per stream, forgotten 30 s after its stream stops.
func TestThumbs(t *testing.T) {
	clk := clock.NewFake(t0)
	th := NewThumbs(clk, nil)
	f := &media.Frame{W: 640, H: 480, Pix: make([]byte, 640*480*3)}
	th.Offer("s1", f)
	a := th.Get("s1")
	if len(a) < 100 || a[0] != 0xFF || a[1] != 0xD8 {
		t.Fatalf("thumbnail is not a JPEG: % x", a[:min(4, len(a))])
	}
	bright := &media.Frame{W: 640, H: 480, Pix: make([]byte, 640*480*3)}
	for i := range bright.Pix {
		bright.Pix[i] = 200
	}
	th.Offer("s1", bright)
	if b := th.Get("s1"); string(b) != string(a) {
		t.Error("refreshed within a second")
	}
	clk.Advance(time.Second)
	th.Offer("s1", bright)
	if b := th.Get("s1"); string(b) == string(a) {
		t.Error("not refreshed after a second")
	}
	if got := th.Have([]string{"s1", "s2"}); len(got) != 1 || got[0] != "s1" {
		t.Errorf("Have %v", got)
	}
	clk.Advance(31 * time.Second)
	th.Offer("s2", f)
	if th.Get("s1") != nil {
		t.Error("thumbnail of a silent stream kept past 30 s")
	}
	th.Offer("bad", &media.Frame{W: 0, H: 0})
	if th.Get("bad") != nil {
		t.Error("thumbnail of an empty frame")
	}
}

// TestThumbsPutAndWatch: a thumbnail encoded elsewhere (a worker's) is
// served as it came and expires like the others; reading the dashboard
// (its history, a sample of its event stream) calls the watch hook, which
// is how the thumbnails of worker-ingested streams are asked for.
func TestThumbsPutAndWatch(t *testing.T) {
	clk := clock.NewFake(t0)
	r := New(Config{Clock: clk}, func() coordinator.Status { return coordinator.Status{} })
	watched := 0
	r.Thumbs().SetWatch(func() { watched++ })
	jpeg := []byte{0xFF, 0xD8, 0xFF, 0xE0, 1, 2, 3}
	r.Thumbs().Put("w1", jpeg)
	if got := r.Thumbs().Have([]string{"w1", "w2"}); len(got) != 1 || got[0] != "w1" {
		t.Fatalf("Have %v after Put", got)
	}
	h := r.Handler()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/v1/thumbs/w1", nil))
	if rec.Code != 200 || rec.Body.String() != string(jpeg) || rec.Header().Get("Content-Type") != "image/jpeg" {
		t.Fatalf("GET /v1/thumbs/w1: %d %q %q", rec.Code, rec.Body.String(), rec.Header().Get("Content-Type"))
	}
	if watched != 0 {
		t.Fatalf("a thumbnail's read called the watch hook %d times", watched)
	}
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/v1/dashboard", nil))
	if watched != 1 {
		t.Fatalf("reading the dashboard called the watch hook %d times, want 1", watched)
	}
	clk.Advance(31 * time.Second)
	if r.Thumbs().Get("w1") != nil || len(r.Thumbs().Have([]string{"w1"})) != 0 {
		t.Error("a thumbnail over 30 s old served or listed (no Put or Offer swept it)")
	}
	r.Thumbs().Put("w2", jpeg)
	if r.Thumbs().Get("w1") != nil || r.Thumbs().Get("w2") == nil {
		t.Error("a worker's thumbnail kept past 30 s, or the new one lost")
	}
}

// TestThumbBoxes: the boxes of a stream's latest result are drawn on its
// next thumbnail (green outlines, inside the frame however far a box
// reaches), and the frame offered is left as it was.
func TestThumbBoxes(t *testing.T) {
	clk := clock.NewFake(t0)
	var drawn *media.Frame
	th := NewThumbs(clk, func(f *media.Frame, w int) ([]byte, error) { drawn = f; return []byte{1}, nil })
	f := &media.Frame{W: 640, H: 480, Pix: make([]byte, 640*480*3)}
	green := func(g *media.Frame, x, y int) bool {
		p := g.Pix[(y*g.W+x)*3:]
		return p[0] == 0 && p[1] == 255 && p[2] == 0
	}
	cases := []struct {
		name    string
		boxes   []media.Box
		on, off [][2]int // pixels on an outline, pixels not
	}{
		{"none", nil, nil, [][2]int{{100, 100}, {0, 0}}},
		{"one face", []media.Box{{X: 100, Y: 50, W: 200, H: 150, Class: "face"}},
			[][2]int{{100, 50}, {299, 199}, {200, 51}, {101, 120}}, [][2]int{{200, 120}, {99, 50}, {300, 200}}},
		{"past the edge", []media.Box{{X: 600, Y: -20, W: 100, H: 100}}, [][2]int{{600, 0}, {639, 79}}, [][2]int{{620, 40}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			th.SetBoxes("s", c.boxes)
			clk.Advance(time.Second)
			th.Offer("s", f)
			if drawn == nil {
				t.Fatal("nothing encoded")
			}
			for _, p := range c.on {
				if !green(drawn, p[0], p[1]) {
					t.Errorf("(%d,%d) is not on an outline", p[0], p[1])
				}
			}
			for _, p := range c.off {
				if green(drawn, p[0], p[1]) {
					t.Errorf("(%d,%d) is drawn", p[0], p[1])
				}
			}
			for _, b := range f.Pix {
				if b != 0 {
					t.Fatal("the offered frame was drawn on")
				}
			}
		})
	}
}

// BenchmarkThumbOffer: a 640x480 frame into a fresh thumbnail (scale and
// JPEG), and into one refreshed less than a second ago (the common case).
func BenchmarkThumbOffer(b *testing.B) {
	f := &media.Frame{W: 640, H: 480, Pix: make([]byte, 640*480*3)}
	for i := range f.Pix {
		f.Pix[i] = byte(i * 7)
	}
	b.Run("encode", func(b *testing.B) {
		clk := clock.NewFake(t0)
		th := NewThumbs(clk, nil)
		for b.Loop() {
			clk.Advance(time.Second)
			th.Offer("s", f)
		}
	})
	b.Run("fresh", func(b *testing.B) {
		th := NewThumbs(clock.NewFake(t0), nil)
		th.Offer("s", f)
		for b.Loop() {
			th.Offer("s", f)
		}
	})
}

// TestIngestAdmission: with WHIP ingest, each sample and the history carry
// its admission state (refused, pending, shed streams, the CPU load) for
// the page's ingest line; without, none.
func TestIngestAdmission(t *testing.T) {
	clk := clock.NewFake(t0)
	f := &fakeEngine{streams: []string{"s1"}}
	r := New(Config{Clock: clk}, f.status)
	r.Start()
	defer r.Close()
	f.second(clk, 1, 1)
	if h := r.History(); h.Ingest != nil {
		t.Fatalf("ingest without a source: %+v", h.Ingest)
	}
	n := 0
	r.SetIngest(func() ingest.Admission {
		n++
		return ingest.Admission{Admitted: 3, Pending: n, LoadCores: 1.5, CapacityCores: 1.4, Refused: map[string]uint64{"capacity": 2}}
	})
	f.second(clk, 1, 1)
	f.second(clk, 1, 1)
	h := r.History()
	if h.Ingest == nil || h.Ingest.Pending != 2 || h.Ingest.Refused["capacity"] != 2 || h.Ingest.LoadCores != 1.5 {
		t.Errorf("history's ingest %+v, want the latest sample's", h.Ingest)
	}
}

// TestEventSubscribersBounded: the dashboard serves MaxEventSubscribers
// event streams at once, MaxEventSubscribersPerClient to one client (its
// address); one more is refused 429 with the reason rather than given a
// goroutine and a queue (issue 36 finding 9). Before the per-client bound
// one client took every stream and the operator's tab got none.
func TestEventSubscribersBounded(t *testing.T) {
	clk := clock.NewFake(t0)
	f := &fakeEngine{}
	r := New(Config{Clock: clk}, f.status)
	r.Start()
	defer r.Close()
	// the test's clients all dial from 127.0.0.1: a header says whom each
	// request stands for
	h := r.Handler()
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		req.RemoteAddr = req.Header.Get("X-Client") + ":1234"
		h.ServeHTTP(w, req)
	}))
	defer hs.Close()
	var bodies []io.Closer
	defer func() { // before hs.Close, which waits for the streams' handlers
		for _, b := range bodies {
			b.Close()
		}
	}()
	open := func(client string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", hs.URL+"/v1/dashboard/events", nil)
		req.Header.Set("X-Client", client)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		bodies = append(bodies, resp.Body)
		line, _ := bufio.NewReader(resp.Body).ReadString('\n')
		return resp.StatusCode, line
	}
	// one client: its share, then 429
	for i := range MaxEventSubscribersPerClient {
		if code, line := open("192.0.2.1"); code != 200 || !strings.HasPrefix(line, "retry:") {
			t.Fatalf("client 192.0.2.1's stream %d: %d %q", i+1, code, line)
		}
	}
	if code, line := open("192.0.2.1"); code != http.StatusTooManyRequests || !strings.Contains(line, "this address has 8 dashboard event streams open") {
		t.Fatalf("client 192.0.2.1's stream %d: %d %q, want 429 with the reason", MaxEventSubscribersPerClient+1, code, line)
	}
	// an IPv6 client counts by its /64
	for i := range MaxEventSubscribersPerClient {
		if code, _ := open(fmt.Sprintf("[2001:db8::%x]", i+1)); code != 200 {
			t.Fatalf("client 2001:db8::%x: %d", i+1, code)
		}
	}
	if code, _ := open("[2001:db8::ff]"); code != http.StatusTooManyRequests {
		t.Fatalf("a ninth stream from 2001:db8::/64: %d, want 429", code)
	}
	// others: until the dashboard's whole bound
	for i := 2 * MaxEventSubscribersPerClient; i < MaxEventSubscribers; i++ {
		if code, line := open(fmt.Sprintf("198.51.100.%d", i)); code != 200 {
			t.Fatalf("stream %d: %d %q", i+1, code, line)
		}
	}
	if code, line := open("203.0.113.1"); code != http.StatusTooManyRequests || !strings.Contains(line, "event streams open, the most it serves") {
		t.Fatalf("stream %d: %d %q, want 429 with the reason", MaxEventSubscribers+1, code, line)
	}
}

// TestSignIn: the sign-in page says what is needed and how to create it,
// offers a field for the token, carries no data (it is static: the same
// bytes for every request) and loads only its own script, under the same
// strict headers as the dashboard's page and code.
func TestSignIn(t *testing.T) {
	p := SignIn()
	page := string(p.HTML)
	for _, want := range []string{
		"needs an api token", "mdag token new --role api --name NAME", "--tokens",
		`<form id="signin" method="get" action="/">`, `name="access_token" type="password"`, `<button type="submit">`,
		`<script src="/dashboard/signin.js"></script>`, "sessionStorage",
	} {
		if !strings.Contains(page, want) {
			t.Errorf("sign-in page lacks %q", want)
		}
	}
	// no inline script or style, nothing from elsewhere, no data
	for _, bad := range []string{"<script>", "style=", "http://", "https://", "traffic", "/v1/dashboard", "/v1/thumbs"} {
		if strings.Contains(page, bad) {
			t.Errorf("sign-in page holds %q", bad)
		}
	}
	if string(SignIn().HTML) != page {
		t.Error("the sign-in page differs between calls")
	}
	csp := p.Header.Get("Content-Security-Policy")
	for _, want := range []string{"default-src 'none'", "script-src 'self'", "connect-src 'self'", "frame-ancestors 'none'", "form-action 'self'"} {
		if !strings.Contains(csp, want) {
			t.Errorf("CSP %q lacks %q", csp, want)
		}
	}
	clk := clock.NewFake(t0)
	f := &fakeEngine{}
	r := New(Config{Clock: clk}, f.status)
	r.Start()
	defer r.Close()
	hs := httptest.NewServer(r.Handler())
	defer hs.Close()
	for path, body := range map[string]string{
		"/":                    `<script src="/dashboard/app.js">`,
		"/dashboard/app.js":    `sessionStorage.getItem("mdag.access_token")`,
		"/dashboard/signin.js": `sessionStorage.setItem(KEY, tok)`,
		"/dashboard/style.css": ".signin",
	} {
		resp, err := http.Get(hs.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(b), body) {
			t.Errorf("GET %s: %d %.120q, want %q", path, resp.StatusCode, b, body)
		}
		for k := range p.Header {
			if got, want := resp.Header.Get(k), p.Header.Get(k); got != want {
				t.Errorf("GET %s: %s %q, want the sign-in page's %q", path, k, got, want)
			}
		}
	}
}
