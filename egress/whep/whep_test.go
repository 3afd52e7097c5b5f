package whep

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/pion/webrtc/v4"

	"github.com/mdag/mdag/egress"
	"github.com/mdag/mdag/ingest/synth"
	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/media"
)

// source feeds hub with a synthetic pattern at fps (objects of class car
// in lanes, so they never overlap) and answers each frame with its truth
// as the result, as the engine's emulated detectors do.
func source(t *testing.T, hub *egress.Hub, stream string, fps float64) {
	t.Helper()
	p, err := synth.NewPattern(320, 240, 3)
	if err != nil {
		t.Fatal(err)
	}
	p.Classes, p.Motion = []string{"car"}, synth.Lanes
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = p.Generate(ctx, clock.Real{}, 0, stream, fps, 0, func(s string, seq uint64, _ time.Time, f *media.Frame, truth []media.Box) error {
			hub.Ingest(s, seq, f)
			hub.Result(egress.Result{Stream: s, Seq: seq, Boxes: truth})
			return nil
		})
	}()
	t.Cleanup(func() { cancel(); <-done })
	// wait until the stream is live
	for end := time.Now().Add(5 * time.Second); !hub.IsLive(stream); {
		if time.Now().After(end) {
			t.Fatal("the source never started")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func newServer(t *testing.T, cfg Config) (*Server, *egress.Hub, *httptest.Server) {
	t.Helper()
	hub := egress.New(egress.Config{})
	cfg.Apps = []string{"app"}
	s, err := New(cfg, hub)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(s.Handler())
	t.Cleanup(func() { s.Close(); hs.Close() })
	return s, hub, hs
}

// pionViewer is a WHEP viewer in this process: it counts the RTP packets
// it receives (no decoding).
type pionViewer struct {
	pc       *webrtc.PeerConnection
	location string
	packets  atomic.Int64
}

func offerPion(t *testing.T, url string) (*pionViewer, int, string) {
	t.Helper()
	pc, err := webrtc.NewPeerConnection(webrtc.Configuration{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pc.Close() })
	v := &pionViewer{pc: pc}
	if _, err := pc.AddTransceiverFromKind(webrtc.RTPCodecTypeVideo, webrtc.RTPTransceiverInit{Direction: webrtc.RTPTransceiverDirectionRecvonly}); err != nil {
		t.Fatal(err)
	}
	pc.OnTrack(func(tr *webrtc.TrackRemote, _ *webrtc.RTPReceiver) {
		for {
			if _, _, err := tr.ReadRTP(); err != nil {
				return
			}
			v.packets.Add(1)
		}
	})
	offer, err := pc.CreateOffer(nil)
	if err != nil {
		t.Fatal(err)
	}
	gathered := webrtc.GatheringCompletePromise(pc)
	if err := pc.SetLocalDescription(offer); err != nil {
		t.Fatal(err)
	}
	<-gathered
	resp, err := http.Post(url, "application/sdp", strings.NewReader(pc.LocalDescription().SDP))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusCreated {
		return nil, resp.StatusCode, string(body)
	}
	v.location = resp.Header.Get("Location")
	if err := pc.SetRemoteDescription(webrtc.SessionDescription{Type: webrtc.SDPTypeAnswer, SDP: string(body)}); err != nil {
		t.Fatal(err)
	}
	return v, resp.StatusCode, string(body)
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(15 * time.Second); !cond(); {
		if time.Now().After(end) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestViewers: unknown streams are 404 naming the live ones; viewers get
// packets from one encoder, are counted and bounded per stream and in
// total (503, with the reason); DELETE ends a viewer and the last one
// stops the encoder.
func TestViewers(t *testing.T) {
	s, hub, hs := newServer(t, Config{MaxPerStream: 2, MaxViewers: 3})
	source(t, hub, "cam-a", 15)
	source(t, hub, "cam-b", 15)

	resp, err := http.Post(hs.URL+"/whep/app/nope", "application/sdp", strings.NewReader("v=0\r\nm=video"))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 404 || !strings.Contains(string(b), "cam-a, cam-b") {
		t.Errorf("unknown stream: %d %q, want 404 naming cam-a, cam-b", resp.StatusCode, b)
	}
	if resp, err := http.Post(hs.URL+"/whep/other/cam-a", "application/sdp", strings.NewReader("")); err != nil || resp.StatusCode != 404 {
		t.Errorf("unknown app: %v %v", resp, err)
	}
	if st := s.Stats(); strings.Join(st.Live, ",") != "cam-a,cam-b" || st.Refused[RefusedUnknown] != 2 {
		t.Errorf("stats: live %v, refused %v: want cam-a,cam-b and 2 unknown", st.Live, st.Refused)
	}
	if resp, err := http.Get(hs.URL + PlayerPath); err != nil || resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/javascript") {
		t.Errorf("GET %s: %v %v", PlayerPath, resp, err)
	} else {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.Contains(string(b), "async function whepPlay(") {
			t.Errorf("GET %s is not the player", PlayerPath)
		}
	}

	v1, code, _ := offerPion(t, hs.URL+"/whep/app/cam-a")
	v2, code2, _ := offerPion(t, hs.URL+"/whep/app/cam-a")
	if code != 201 || code2 != 201 {
		t.Fatalf("viewers: %d %d", code, code2)
	}
	waitFor(t, "both viewers' packets", func() bool { return v1.packets.Load() > 20 && v2.packets.Load() > 20 })
	if _, code, body := offerPion(t, hs.URL+"/whep/app/cam-a"); code != 503 || !strings.Contains(body, "limit of 2") {
		t.Errorf("third viewer of a stream: %d %q, want 503 (per-stream limit)", code, body)
	}
	v3, code, _ := offerPion(t, hs.URL+"/whep/app/cam-b")
	if code != 201 {
		t.Fatalf("cam-b viewer: %d", code)
	}
	if _, code, body := offerPion(t, hs.URL+"/whep/app/cam-b"); code != 503 || !strings.Contains(body, "limit of 3") {
		t.Errorf("fourth viewer: %d %q, want 503 (total limit)", code, body)
	}
	st := s.Stats()
	if st.Viewers != 3 || len(st.Streams) != 2 || st.Streams[0].Viewers != 2 || st.Refused[RefusedStreamFull] != 1 || st.Refused[RefusedFull] != 1 {
		t.Errorf("stats %+v", st)
	}
	waitFor(t, "cam-b packets", func() bool { return v3.packets.Load() > 10 })

	// DELETE: one viewer of cam-a goes; the encoder stays for the other
	del := func(loc string) int {
		req, _ := http.NewRequest(http.MethodDelete, hs.URL+loc, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if c := del(v1.location); c != 200 {
		t.Errorf("DELETE: %d", c)
	}
	if c := del(v1.location); c != 404 {
		t.Errorf("second DELETE: %d, want 404", c)
	}
	n := v2.packets.Load()
	waitFor(t, "packets after a viewer left", func() bool { return v2.packets.Load() > n+10 })
	del(v2.location)
	waitFor(t, "cam-a's encoder to stop", func() bool {
		st := s.Stats()
		return len(st.Streams) == 1 && st.Streams[0].Stream == "cam-b"
	})
	for _, e := range hub.Stats() {
		if e.Stream == "cam-a" {
			t.Errorf("cam-a still watched: %+v", e)
		}
	}
	// a viewer that closes its connection is removed too
	_ = v3.pc.Close()
	waitFor(t, "the closed viewer to go", func() bool { return s.Stats().Viewers == 0 })
}

// requireInterop: as ingest/whip's (make test requires the third-party
// stacks).
func requireInterop(t *testing.T, what, hint string) {
	if os.Getenv("MDAG_REQUIRE_INTEROP") == "1" {
		t.Fatalf("%s is missing (%s); make deps installs it", what, hint)
	}
	t.Skipf("%s is missing (%s); run make deps, or make test, which requires it", what, hint)
}

type aiortcSummary struct {
	Frames       int    `json:"frames"`
	WithBox      int    `json:"with_box"`
	LongestRun   int    `json:"longest_run"`
	Width        int    `json:"width"`
	Height       int    `json:"height"`
	Status       int    `json:"status"`
	DeleteStatus int    `json:"delete_status"`
	Error        string `json:"error"`
}

func runAiortc(t testing.TB, ctx context.Context, url string, secs float64, extra ...string) aiortcSummary {
	args := append([]string{"../../tools/whep_aiortc.py", url, strconv.FormatFloat(secs, 'f', -1, 64)}, extra...)
	out, err := exec.CommandContext(ctx, "/usr/bin/python3", args...).Output()
	var sum aiortcSummary
	if jerr := json.Unmarshal(out, &sum); jerr != nil || err != nil {
		stderr := ""
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("aiortc viewer: %v %v\nstdout: %s\nstderr: %s", err, jerr, out, stderr)
	}
	return sum
}

// TestAiortc: Debian's aiortc plays the annotated stream over WHEP and
// decodes it; most frames show the drawn box colour in a run as long as
// most of a box's top or bottom edge (the pattern's boxes are 30 px; the
// pattern's own fill is far from every drawn colour).
func TestAiortc(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	if exec.Command("/usr/bin/python3", "-c", "import aiortc").Run() != nil {
		requireInterop(t, "python3-aiortc", "import aiortc under /usr/bin/python3 failed")
	}
	s, hub, hs := newServer(t, Config{})
	source(t, hub, "cam", 15)
	c := egress.ClassColor("car")
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	sum := runAiortc(t, ctx, hs.URL+"/whep/app/cam", 5, "--colour", fmt.Sprintf("%d,%d,%d", c.B, c.G, c.R), "--min-run", "24")
	t.Logf("aiortc: %+v; server: %+v", sum, s.Stats())
	if sum.Status != 201 || sum.Width != 320 || sum.Height != 240 || sum.DeleteStatus != 200 {
		t.Errorf("aiortc: %+v: want 201, 320x240 frames, DELETE 200", sum)
	}
	// 15 fps for 5 s: the first second may go to ICE and the first key frame
	if sum.Frames < 30 || sum.WithBox < sum.Frames*8/10 {
		t.Errorf("%d frames decoded, %d with a drawn box edge (longest run %d px): want >= 30 and >= 80%%", sum.Frames, sum.WithBox, sum.LongestRun)
	}
	waitFor(t, "the encoder to stop after the DELETE", func() bool { return len(s.Stats().Streams) == 0 })
	// the same check against the colour of a class nobody drew finds none
	sum = runAiortc(t, ctx, hs.URL+"/whep/app/cam", 2, "--colour", "255,0,0", "--min-run", "24")
	if sum.Frames < 10 {
		t.Errorf("the second viewer decoded %d frames: the check against an undrawn colour needs some", sum.Frames)
	}
	if (c.B != 255 || c.G != 0 || c.R != 0) && sum.WithBox != 0 {
		t.Errorf("colour B,G,R 255,0,0, which nothing draws, found in %d of %d frames", sum.WithBox, sum.Frames)
	}
}

// cpuTime is this process's user+system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestViewerCost measures the server's CPU for 0, 1, 4 and 8 aiortc
// viewers of one 320x240 15 fps stream (the viewers run in their own
// processes, so the process CPU is the source, the egress and the
// server's WebRTC). Opt-in: MDAG_WHEP_COST=1 (it takes ~25 s and wants
// idle cores; aiortc decoding 8 streams needs more than 2).
func TestViewerCost(t *testing.T) {
	if os.Getenv("MDAG_WHEP_COST") != "1" {
		t.Skip("set MDAG_WHEP_COST=1 to measure the cost of WHEP per viewer")
	}
	s, hub, hs := newServer(t, Config{MaxPerStream: 16, MaxViewers: 16})
	source(t, hub, "cam", 15)
	const window = 3 * time.Second
	for _, n := range []int{0, 1, 4, 8} {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		var wg sync.WaitGroup
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_ = exec.CommandContext(ctx, "/usr/bin/python3", "../../tools/whep_aiortc.py", hs.URL+"/whep/app/cam", "6", "--no-decode-check").Run()
			}()
		}
		if n > 0 {
			waitFor(t, fmt.Sprintf("%d viewers", n), func() bool { return s.Stats().Viewers == n })
		}
		time.Sleep(time.Second) // ICE and the first key frame
		c0, w0 := cpuTime(), time.Now()
		time.Sleep(window)
		cpu, wall := cpuTime()-c0, time.Since(w0)
		t.Logf("%d viewers: server process CPU %.1f ms/s (%.3f cores)", n, float64(cpu.Milliseconds())/wall.Seconds(), cpu.Seconds()/wall.Seconds())
		wg.Wait()
		cancel()
		waitFor(t, "the viewers to leave", func() bool { return s.Stats().Viewers == 0 })
	}
}
