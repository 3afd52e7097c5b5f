package whip

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/ingest/synth"
	"github.com/mdag/mdag/media"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// pion's ICE/mDNS helpers and net/http's keep-alive connections
		// end asynchronously after Close.
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"),
	)
}

// fakeSink records what the server hands to the session; it answers every
// frame with a result through the server, as the engine's OnFrame does.
type fakeSink struct {
	mu        sync.Mutex
	joined    map[string]dag.AppID
	left      map[string]bool
	frames    map[string][]ingested
	audio     map[string][]chunk // IngestAudio's (audio_test.go)
	srv       *Server
	joinErr   error
	ingestErr error // Ingest's answer while set
	saturated bool  // Saturation's answer for every app
}

// Saturated implements Saturation.
func (f *fakeSink) Saturated(dag.AppID) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.saturated
}

type ingested struct {
	seq     uint64
	capture time.Time
	at      time.Time
	w, h    int
}

func newSink() *fakeSink {
	return &fakeSink{joined: map[string]dag.AppID{}, left: map[string]bool{}, frames: map[string][]ingested{}}
}

func (f *fakeSink) Join(app dag.AppID, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.joinErr != nil {
		return f.joinErr
	}
	f.joined[id] = app
	return nil
}

func (f *fakeSink) Leave(id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.joined[id]; !ok {
		return errors.New("unknown stream")
	}
	f.left[id] = true
	return nil
}

func (f *fakeSink) Ingest(id string, seq uint64, capture time.Time, fr *media.Frame, _ []media.Box) error {
	if err := fr.Valid(); err != nil {
		return err
	}
	f.mu.Lock()
	if f.ingestErr != nil {
		defer f.mu.Unlock()
		return f.ingestErr
	}
	f.frames[id] = append(f.frames[id], ingested{seq: seq, capture: capture, at: time.Now(), w: fr.W, h: fr.H})
	srv := f.srv
	f.mu.Unlock()
	if srv != nil {
		srv.Publish(Result{Stream: id, Frame: seq, Outcome: "finished", LatencyMS: 1.5,
			Boxes: []Box{{X: 1, Y: 2, W: 3, H: 4, Class: "face"}}, Counts: map[string]int{"face": 1}})
	}
	return nil
}

func (f *fakeSink) count(id string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.frames[id])
}

func newTestServer(t *testing.T, cfg Config) (*Server, *fakeSink, *httptest.Server) {
	t.Helper()
	if cfg.Apps == nil {
		cfg.Apps = map[dag.AppID]float64{"face": 10}
	}
	if cfg.CPUTime == nil {
		// The test process's CPU (race detector, a loaded machine) must
		// not refuse streams: CPU admission has its own test.
		cfg.CPUTime = func() time.Duration { return 0 }
	}
	sink := newSink()
	srv, err := New(cfg, sink)
	if err != nil {
		t.Fatal(err)
	}
	sink.srv = srv
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		srv.Close()
		hs.Close()
	})
	return srv, sink, hs
}

// sendPattern sends n pattern frames at fps from a Publisher.
func sendPattern(t *testing.T, p *Publisher, pat *synth.Pattern, n int, fps float64) {
	t.Helper()
	start := time.Now()
	period := time.Duration(float64(time.Second) / fps)
	for i := range n {
		at := start.Add(time.Duration(i) * period)
		time.Sleep(time.Until(at)) // pacing a real-time source, not waiting for logic
		f, _, err := pat.Frame(0, uint64(i))
		if err != nil {
			t.Fatal(err)
		}
		if err := p.WriteFrame(f, at); err != nil {
			t.Fatal(err)
		}
	}
}

func waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.After(timeout)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-deadline:
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		case <-tick.C:
		}
	}
}

// TestLoopback: a Go publisher streams to the server; frames reach the
// session at the app's rate with capture times, results come back on the
// DataChannel and as SSE, DELETE leaves the session.
func TestLoopback(t *testing.T) {
	for _, codec := range []string{CodecVP8, CodecH264} {
		t.Run(codec, func(t *testing.T) { testLoopback(t, codec) })
	}
}

func testLoopback(t *testing.T, codec string) {
	srv, sink, hs := newTestServer(t, Config{})
	pat, err := synth.NewPattern(320, 240, 2)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var mu sync.Mutex
	var results []Result
	p, err := Publish(ctx, ClientConfig{Server: hs.URL, App: "face", Width: 320, Height: 240, FPS: 30, Codec: codec,
		OnResult: func(r Result) { mu.Lock(); results = append(results, r); mu.Unlock() }})
	if err != nil {
		t.Fatal(err)
	}
	if p.Stream == "" || !strings.HasSuffix(p.Results, "/v1/streams/"+p.Stream+"/results") {
		t.Fatalf("stream %q, results %q", p.Stream, p.Results)
	}
	// SSE subscriber.
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, p.Results, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("SSE content type %q", ct)
	}
	sse := make(chan Result, 1024)
	sseEnd := make(chan string, 1)
	go readSSE(resp, sse, sseEnd)

	sendPattern(t, p, pat, 60, 30) // 2 s at 30 fps; the app samples 10 fps
	waitFor(t, "frames at the session", 5*time.Second, func() bool { return sink.count(p.Stream) >= 18 })
	waitFor(t, "results on the DataChannel", 5*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return len(results) >= 18 })

	sink.mu.Lock()
	got := sink.frames[p.Stream]
	sink.mu.Unlock()
	if n := len(got); n < 18 || n > 21 {
		t.Errorf("ingested %d frames of 60 at 30 fps into a 10 fps app, want about 20", n)
	}
	for i, f := range got {
		if f.w != 320 || f.h != 240 || f.seq != uint64(i+1) {
			t.Fatalf("frame %d: %dx%d seq %d", i, f.w, f.h, f.seq)
		}
		if lat := f.at.Sub(f.capture); lat < 0 || lat > time.Second {
			t.Errorf("frame %d: glass-to-session %v", i, lat)
		}
		// From the second gap on: the first frame's capture time comes from
		// its arrival, later ones from the sender's RTCP sender reports.
		if i > 1 {
			if gap := f.capture.Sub(got[i-1].capture); gap < 80*time.Millisecond || gap > 120*time.Millisecond {
				t.Errorf("frame %d: capture gap %v, want 100 ms (10 fps)", i, gap)
			}
		}
	}
	mu.Lock()
	r0 := results[0]
	mu.Unlock()
	if r0.Stream != p.Stream || r0.Outcome != "finished" || len(r0.Boxes) != 1 || r0.Width != 320 || r0.Counts["face"] != 1 {
		t.Errorf("first result %+v", r0)
	}
	waitFor(t, "SSE results", 5*time.Second, func() bool { return len(sse) >= 18 })

	info := srv.Streams()
	if len(info) != 1 || info[0].Codec != codec || info[0].Ingested < 18 || info[0].Sampled < 36 || info[0].DecodeErrors != 0 || info[0].PLIs < 1 {
		t.Errorf("stream info %+v", info)
	}
	if tot := srv.IngestTotals(); len(tot) != 1 || tot[0].Streams != 1 || tot[0].Ingested < info[0].Ingested || tot[0].Packets < info[0].Packets {
		t.Errorf("ingest totals while live %+v, stream %+v", tot, info[0])
	}
	if err := p.Close(); err != nil {
		t.Error(err)
	}
	select {
	case why := <-sseEnd:
		if !strings.Contains(why, "deleted") {
			t.Errorf("SSE end %q", why)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("SSE did not end after DELETE")
	}
	sink.mu.Lock()
	left := sink.left[p.Stream]
	sink.mu.Unlock()
	if !left {
		t.Error("DELETE did not leave the session")
	}
	st := srv.Streams()
	if len(st) != 1 || st[0].Ended != "deleted by the client" {
		t.Fatalf("after DELETE: %+v", st)
	}
	// The ended stream's counters stay in the totals (they are counters).
	if tot := srv.IngestTotals(); len(tot) != 1 || tot[0].Streams != 0 || tot[0].Ingested != st[0].Ingested || tot[0].PLIs != st[0].PLIs {
		t.Errorf("ingest totals after DELETE %+v, stream %+v", tot, st[0])
	}
}

func readSSE(resp *http.Response, out chan<- Result, end chan<- string) {
	sc := bufio.NewScanner(resp.Body)
	var event string
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			event = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			data := strings.TrimPrefix(line, "data: ")
			if event == "end" {
				var why string
				_ = json.Unmarshal([]byte(data), &why)
				end <- why
				return
			}
			var r Result
			if json.Unmarshal([]byte(data), &r) == nil {
				out <- r
			}
		}
	}
}

// TestHTTPErrors: every bad request gets its status and a reason.
func TestHTTPErrors(t *testing.T) {
	srv, sink, hs := newTestServer(t, Config{MaxStreams: 1, Tokens: []string{"s3cret"}})
	goodOffer := offerSDP(t)
	h264 := strings.NewReplacer("VP8/90000", "H264/90000").Replace(goodOffer)
	audioOnly := "v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\na=rtpmap:111 opus/48000/2\r\n"
	recvonly := strings.Replace(goodOffer, "a=sendonly", "a=recvonly", 1)
	inactive := strings.Replace(goodOffer, "a=sendonly", "a=inactive", 1)
	// Direction at session level only (the media section has none).
	sessionRecvonly := strings.Replace(strings.Replace(goodOffer, "a=sendonly\r\n", "", 1), "t=0 0\r\n", "t=0 0\r\na=recvonly\r\n", 1)
	if recvonly == goodOffer {
		t.Fatal("the offer has no a=sendonly to turn into recvonly")
	}
	cases := []struct {
		name, method, path, ctype, body, token string
		want                                   int
		says                                   string
	}{
		{"no token", "POST", "/whip/face", "application/sdp", goodOffer, "", 401, "unauthorized: a valid bearer token"},
		{"bad token", "POST", "/whip/face", "application/sdp", goodOffer, "nope", 401, "unauthorized: a valid bearer token"},
		{"unknown app", "POST", "/whip/nope", "application/sdp", goodOffer, "s3cret", 404, `unknown app "nope" (deployed: face)`},
		{"content type", "POST", "/whip/face", "text/plain", goodOffer, "s3cret", 415, "application/sdp"},
		{"malformed", "POST", "/whip/face", "application/sdp", "hello", "s3cret", 400, "malformed SDP"},
		{"no video", "POST", "/whip/face", "application/sdp", audioOnly, "s3cret", 400, "no video"},
		{"no codec", "POST", "/whip/face", "application/sdp", h264, "s3cret", 400, "offered: H264 (packetization-mode 0)); supported: VP8, H264 (packetization-mode 1"},
		{"recvonly", "POST", "/whip/face", "application/sdp", recvonly, "s3cret", 400, "video section is recvonly: a WHIP offer must send video"},
		{"inactive", "POST", "/whip/face", "application/sdp", inactive, "s3cret", 400, "video section is inactive"},
		{"session recvonly", "POST", "/whip/face", "application/sdp", sessionRecvonly, "s3cret", 400, "video section is recvonly"},
		{"too big", "POST", "/whip/face", "application/sdp", strings.Repeat("a", maxOffer+1), "s3cret", 413, "limit"},
		{"delete unknown", "DELETE", "/whip/face/abc", "", "", "s3cret", 404, "no stream"},
		{"patch", "PATCH", "/whip/face/abc", "application/trickle-ice-sdpfrag", "", "s3cret", 405, "trickle ICE"},
		{"preflight", "OPTIONS", "/whip/face", "", "", "", 204, ""},
		{"results unknown", "GET", "/v1/streams/abc/results", "", "", "s3cret", 404, "no live stream"},
		{"results no token", "GET", "/v1/streams/abc/results", "", "", "", 401, "bearer"},
		{"page unknown app", "GET", "/stream/nope", "", "", "", 404, "unknown app"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req, _ := http.NewRequest(c.method, hs.URL+c.path, strings.NewReader(c.body))
			if c.ctype != "" {
				req.Header.Set("Content-Type", c.ctype)
			}
			if c.token != "" {
				req.Header.Set("Authorization", "Bearer "+c.token)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var b strings.Builder
			_, _ = bufio.NewReader(resp.Body).WriteTo(&b)
			if resp.StatusCode != c.want || !strings.Contains(b.String(), c.says) {
				t.Errorf("%s %s: %d %q, want %d containing %q", c.method, c.path, resp.StatusCode, b.String(), c.want, c.says)
			}
			if h := resp.Header.Get("Access-Control-Allow-Origin"); h != "" {
				t.Errorf("CORS header %q for a request without Origin", h)
			}
		})
	}
	if len(sink.joined) != 0 {
		t.Errorf("bad requests joined the session: %v", sink.joined)
	}
	if got := srv.Admission().Refused; got[RefusedRecvonly] != 3 {
		t.Errorf("refusals %v, want recvonly = 3", got)
	}

	// The limits: a first stream is pending until its first frame decodes,
	// so a second gets 503 for the pending limit (MaxPending defaults to
	// MaxStreams = 1); once the first is admitted, the stream limit.
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	p, err := Publish(ctx, ClientConfig{Server: hs.URL, App: "face", Token: "s3cret", Width: 64, Height: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	_, err = Publish(ctx, ClientConfig{Server: hs.URL, App: "face", Token: "s3cret", Width: 64, Height: 64})
	var he *HTTPError
	if !errors.As(err, &he) || he.Status != 503 || he.RetryAfter != "5" || !strings.Contains(he.Msg, "pending limit reached (1 streams") {
		t.Errorf("second stream while the first is pending: %v", err)
	}
	pat, err := synth.NewPattern(64, 64, 1)
	if err != nil {
		t.Fatal(err)
	}
	sendPattern(t, p, pat, 10, 30)
	waitFor(t, "the first stream admitted", 5*time.Second, func() bool { sink.mu.Lock(); defer sink.mu.Unlock(); return sink.joined[p.Stream] != "" })
	_, err = Publish(ctx, ClientConfig{Server: hs.URL, App: "face", Token: "s3cret", Width: 64, Height: 64})
	if !errors.As(err, &he) || he.Status != 503 || he.RetryAfter != "5" || !strings.Contains(he.Msg, "stream limit reached (1 streams)") {
		t.Errorf("second stream while the first is admitted: %v", err)
	}
	if got := srv.Admission().Refused; got[RefusedPendingLimit] != 1 || got[RefusedStreamLimit] != 1 {
		t.Errorf("refusals %v, want pending-limit = 1, stream-limit = 1", got)
	}
}

// offerSDP is a real VP8 offer from our client's stack.
func offerSDP(t testing.TB) string {
	t.Helper()
	return offerWith(t, []string{CodecVP8})
}

// TestIdleTimeout: a stream that connects but sends nothing is ended, and
// never joins the session (it never decoded a frame).
func TestIdleTimeout(t *testing.T) {
	srv, sink, hs := newTestServer(t, Config{IdleTimeout: 500 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	// The idle timer runs from the offer: on a loaded machine it may end
	// the stream before the client's connection is up (Publish then fails);
	// either way the server must end it as idle.
	if p, err := Publish(ctx, ClientConfig{Server: hs.URL, App: "face", Width: 64, Height: 64}); err == nil {
		defer p.Close()
	} else {
		t.Logf("Publish: %v (the idle timeout came first)", err)
	}
	waitFor(t, "idle stream ended", 15*time.Second, func() bool {
		st := srv.Streams()
		return len(st) == 1 && st[0].State == StateEnded
	})
	st := srv.Streams()
	if len(st) != 1 || !strings.Contains(st[0].Ended, "no media") || st[0].EndKind != EndIdle {
		t.Errorf("%+v", st)
	}
	sink.mu.Lock()
	defer sink.mu.Unlock()
	if len(sink.joined) != 0 || len(sink.left) != 0 {
		t.Errorf("a stream that never sent a frame reached the session: joined %v, left %v", sink.joined, sink.left)
	}
}

// TestJoinRefused: the session refuses the stream when its first frame
// decodes; the stream ends with that reason, which the client gets as the
// last DataChannel message and the SSE end event, and the ended-streams
// info and counters show.
func TestJoinRefused(t *testing.T) {
	srv, sink, hs := newTestServer(t, Config{})
	sink.joinErr = fmt.Errorf("session full")
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	p, err := Publish(ctx, ClientConfig{Server: hs.URL, App: "face", Width: 64, Height: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, p.Results, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sseEnd := make(chan string, 1)
	go readSSE(resp, make(chan Result, 16), sseEnd)
	pat, err := synth.NewPattern(64, 64, 1)
	if err != nil {
		t.Fatal(err)
	}
	// The stream ends at its first frame: WriteFrame fails from then on.
	for i := range 30 {
		f, _, err := pat.Frame(0, uint64(i))
		if err != nil {
			t.Fatal(err)
		}
		if p.WriteFrame(f, time.Now()) != nil {
			break
		}
		<-time.After(30 * time.Millisecond) // pacing a real-time source
	}
	select {
	case <-p.Done():
		var e *EndedError
		if !errors.As(p.Err(), &e) || e.Kind != EndJoinFailed || !strings.Contains(e.Reason, "session full") {
			t.Errorf("end %#v", p.Err())
		}
	case <-ctx.Done():
		t.Fatalf("no end message on the DataChannel; streams %+v", srv.Streams())
	}
	select {
	case why := <-sseEnd:
		if !strings.Contains(why, "session full") {
			t.Errorf("SSE end %q", why)
		}
	case <-ctx.Done():
		t.Fatal("SSE did not end")
	}
	st := srv.Streams()
	if len(st) != 1 || st[0].EndKind != EndJoinFailed || !strings.Contains(st[0].Ended, "joining app face: session full") || st[0].Ingested != 0 {
		t.Errorf("%+v", st)
	}
	if got := srv.Admission().Ended[EndJoinFailed]; got != 1 {
		t.Errorf("ended join-failed = %d, want 1", got)
	}
	sink.mu.Lock()
	defer sink.mu.Unlock()
	if len(sink.left) != 0 || len(sink.frames) != 0 {
		t.Errorf("a refused stream left the session or sent frames: %v %v", sink.left, sink.frames)
	}
}
