package whip

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/ingest/synth"
	"github.com/mdag/mdag/internal/clock"
)

// postOffer POSTs a real offer whose peer never does ICE (its peer
// connection is closed at once): an offer that never sends media. It
// returns the status, the body and the stream ID (201 only).
func postOffer(t *testing.T, base string) (int, string, string, http.Header) {
	t.Helper()
	resp, err := http.Post(base+"/whip/face", "application/sdp", strings.NewReader(offerSDP(t)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header.Get("Mdag-Stream"), resp.Header
}

// TestOffersWithoutMedia (issue 18 item 6): offers that never do ICE are
// pending, bounded apart from admitted streams: they do not stop a real
// client from streaming, never reach the session (Sink.Join, so the
// planner never sees them), are refused past MaxPending, and are ended and
// counted at ConnectTimeout while the real stream goes on.
func TestOffersWithoutMedia(t *testing.T) {
	const n = 6
	clk := clock.NewFake(time.Now())
	srv, sink, hs := newTestServer(t, Config{Apps: map[dag.AppID]float64{"face": 0}, MaxStreams: 2, MaxPending: n + 1,
		ConnectTimeout: 10 * time.Second, IdleTimeout: time.Hour, Clock: clk})
	var ghosts []string
	for i := range n {
		code, body, id, _ := postOffer(t, hs.URL)
		if code != http.StatusCreated {
			t.Fatalf("offer %d: %d %s", i, code, body)
		}
		ghosts = append(ghosts, id)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	p, err := Publish(ctx, ClientConfig{Server: hs.URL, App: "face", Width: 64, Height: 64})
	if err != nil {
		t.Fatalf("a real client with %d offers pending: %v", n, err)
	}
	defer p.Close()
	pat, err := synth.NewPattern(64, 64, 1)
	if err != nil {
		t.Fatal(err)
	}
	sendPattern(t, p, pat, 10, 30)
	waitFor(t, "the real stream's frames", 5*time.Second, func() bool { return sink.count(p.Stream) >= 5 })
	adm := srv.Admission()
	if adm.Admitted != 1 || adm.Pending != n {
		t.Errorf("admission %+v, want 1 admitted, %d pending", adm, n)
	}
	// The pending limit: n ghosts and the real stream's slot is free again,
	// so one more ghost fits and the next is refused.
	if code, body, _, _ := postOffer(t, hs.URL); code != http.StatusCreated {
		t.Fatalf("offer %d: %d %s", n+1, code, body)
	}
	code, body, _, h := postOffer(t, hs.URL)
	if code != http.StatusServiceUnavailable || h.Get("Retry-After") == "" || !strings.Contains(body, "pending limit reached (7 streams") {
		t.Errorf("past MaxPending: %d %q (Retry-After %q)", code, body, h.Get("Retry-After"))
	}
	clk.Advance(10 * time.Second)
	waitFor(t, "pending offers ended", 5*time.Second, func() bool { return srv.Admission().Pending == 0 })
	sent := sink.count(p.Stream)
	sendPattern(t, p, pat, 5, 30)
	waitFor(t, "the real stream goes on", 5*time.Second, func() bool { return sink.count(p.Stream) >= sent+3 })
	adm = srv.Admission()
	if adm.Ended[EndConnectTimeout] != n+1 || adm.Refused[RefusedPendingLimit] != 1 || adm.Admitted != 1 {
		t.Errorf("admission %+v, want connect-timeout = %d, pending-limit = 1, 1 admitted", adm, n+1)
	}
	for _, info := range srv.Streams() {
		if info.ID == p.Stream {
			if info.State != StateAdmitted {
				t.Errorf("real stream %+v", info)
			}
		} else if info.EndKind != EndConnectTimeout || !strings.Contains(info.Ended, "no video frame decoded within 10s") {
			t.Errorf("ghost %+v", info)
		}
	}
	sink.mu.Lock()
	defer sink.mu.Unlock()
	if len(sink.joined) != 1 || sink.joined[p.Stream] == "" || len(sink.left) != 0 {
		t.Errorf("session saw joined %v, left %v; want only the real stream", sink.joined, sink.left)
	}
}

// admitSink is a sink that refuses new streams (an overloaded engine).
type admitSink struct {
	*fakeSink
	err error
}

func (a admitSink) Admit(dag.AppID) error { return a.err }

// TestAdmitterRefuses: a sink's Admitter error is a 503 with Retry-After
// and the error as the reason; the stream never exists.
func TestAdmitterRefuses(t *testing.T) {
	cases := []struct {
		name string
		err  error
		want int
	}{
		{"refuses", errors.New("session traffic overloaded: ingest delay 310 ms past the 200 ms reserve"), http.StatusServiceUnavailable},
		{"admits", nil, http.StatusCreated},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			sink := newSink()
			srv, err := New(Config{Apps: map[dag.AppID]float64{"face": 10}, RetryAfter: 3 * time.Second}, admitSink{sink, c.err})
			if err != nil {
				t.Fatal(err)
			}
			defer srv.Close()
			hs := newHTTPTest(t, srv)
			code, body, _, h := postOffer(t, hs)
			if code != c.want {
				t.Fatalf("%d %q, want %d", code, body, c.want)
			}
			refused := srv.Admission().Refused[RefusedSession]
			if c.err == nil {
				if refused != 0 {
					t.Errorf("refused %d", refused)
				}
				return
			}
			if h.Get("Retry-After") != "3" || !strings.Contains(body, "app face refuses new streams: "+c.err.Error()) {
				t.Errorf("%q, Retry-After %q", body, h.Get("Retry-After"))
			}
			if refused != 1 || len(srv.Streams()) != 0 {
				t.Errorf("refused %d, streams %+v", refused, srv.Streams())
			}
		})
	}
}

// TestCPUAdmission (issue 18 item 5): admission follows the CPU-load
// estimate, fed deterministically through the CPUTime seam and the fake
// clock: a POST that does not fit gets 503 with Retry-After and the
// figures, and so does a stream whose first frame decodes when the load
// has grown; a load above capacity for ShedAfter ends the newest stream
// (overload), the next not before two intervals, and none once it fits.
func TestCPUAdmission(t *testing.T) {
	clk := clock.NewFake(time.Now())
	var cpu time.Duration // guarded by being read in Advance, on this goroutine
	srv, sink, hs := newTestServer(t, Config{MaxStreams: 10, CPUCores: 1, CPUCeiling: 0.5, StreamCost: 0.1,
		LoadInterval: time.Second, ShedAfter: 3 * time.Second, IdleTimeout: time.Hour, ConnectTimeout: time.Hour, Clock: clk,
		CPUTime: func() time.Duration { return cpu }})
	// admit posts an offer and lets it in as its first frame would.
	admit := func(name string) *stream {
		t.Helper()
		code, body, id, _ := postOffer(t, hs.URL)
		if code != http.StatusCreated {
			t.Fatalf("%s: %d %s", name, code, body)
		}
		st := srv.lookup(id)
		if kind, why := st.admitFirst(); kind != "" {
			t.Fatalf("%s: first frame refused: %s %s", name, kind, why)
		}
		return st
	}
	// tick spends load cores of CPU for one interval and samples.
	tick := func(load float64) {
		cpu += time.Duration(load * float64(time.Second))
		clk.Advance(time.Second)
	}
	a := admit("a")
	for range 3 { // the first sample starts the meter; a is reflected two later
		tick(0.2)
	}
	if adm := srv.Admission(); !nearF(adm.LoadCores, 0.2) || !nearF(adm.StreamCost, 0.2) || !nearF(adm.CapacityCores, 0.5) {
		t.Fatalf("after a's measurement: %+v", adm)
	}
	b := admit("b") // 0.2 measured + 0.2 predicted for b <= 0.5
	code, body, _, h := postOffer(t, hs.URL)
	if code != http.StatusServiceUnavailable || h.Get("Retry-After") != "5" ||
		!strings.Contains(body, "no CPU capacity: CPU load 0.40 cores predicted (0.20 measured) of a capacity of 0.50; a new stream needs about 0.20") {
		t.Errorf("third stream: %d %q (Retry-After %q)", code, body, h.Get("Retry-After"))
	}
	if got := srv.Admission().Refused[RefusedCapacity]; got != 1 {
		t.Errorf("refused capacity = %d, want 1", got)
	}
	// b turns out cheap: once the load reflects it (two samples after the
	// one it started in), a new stream fits again; but the load grows
	// before that stream's first frame decodes: it is refused then.
	for range 3 {
		tick(0.22)
	}
	code, body, id, _ := postOffer(t, hs.URL)
	if code != http.StatusCreated {
		t.Fatalf("c: %d %s (%+v)", code, body, srv.Admission())
	}
	c := srv.lookup(id)
	for range 2 {
		tick(0.42)
	}
	if kind, why := c.admitFirst(); kind != EndCapacity || !strings.Contains(why, "no CPU capacity") {
		t.Errorf("c's first frame with the load at %.2f: %q %q", srv.Admission().LoadCores, kind, why)
	}
	// Sustained overload: after 3 s above the 0.5 capacity the newest (b)
	// is shed; a second interval over sheds nothing more (two intervals
	// apart); then the load fits and a stays.
	tick(0.8)
	if adm := srv.Admission(); adm.LoadCores <= 0.5 || adm.OverloadedFor != 0 {
		t.Fatalf("overload start: %+v", adm)
	}
	for range 2 {
		tick(0.8)
	}
	if adm := srv.Admission(); adm.OverloadedFor != 2*time.Second || adm.Ended[EndOverload] != 0 {
		t.Fatalf("2 s into the overload: %+v", adm)
	}
	tick(0.8)
	waitFor(t, "b shed", 5*time.Second, func() bool { return srv.lookup(b.id) == nil })
	tick(0.8)
	if srv.lookup(a.id) == nil || srv.Admission().Ended[EndOverload] != 1 {
		t.Fatalf("a shed one interval after b: %+v", srv.Admission())
	}
	for range 3 {
		tick(0.45)
	}
	adm := srv.Admission()
	if adm.Ended[EndOverload] != 1 || adm.Admitted != 1 || srv.lookup(a.id) == nil || adm.OverloadedFor != 0 {
		t.Errorf("after shedding: %+v", adm)
	}
	var bInfo StreamInfo
	for _, info := range srv.Streams() {
		if info.ID == b.id {
			bInfo = info
		}
	}
	if bInfo.EndKind != EndOverload || !strings.Contains(bInfo.Ended, "overload: CPU load 0.80 cores above the capacity of 0.50 for 3s; the newest 1 streams are ended") {
		t.Errorf("b: %+v", bInfo)
	}
	sink.mu.Lock()
	defer sink.mu.Unlock()
	if !sink.left[b.id] || sink.left[a.id] || sink.joined[c.id] != "" {
		t.Errorf("session: joined %v, left %v", sink.joined, sink.left)
	}
}

func nearF(a, b float64) bool { return a-b < 1e-6 && b-a < 1e-6 }

// newHTTPTest serves srv until the test ends.
func newHTTPTest(t *testing.T, srv *Server) string {
	t.Helper()
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	return hs.URL
}

// TestShedMany: a load far above capacity sheds as many of the newest
// streams as the excess over the per-stream cost, at once, never the last
// one; the machine's busy cores count when larger than the process's.
func TestShedMany(t *testing.T) {
	cases := []struct {
		name    string
		streams int
		proc    float64 // the process's cores per interval once all are in
		machine float64 // the machine's busy cores (0: no machine reading)
		shed    int
	}{
		{"excess over cost", 5, 1.0, 0, 3}, // (1.0 - 0.5) / (1.0 / 5) = 2.5: 3
		{"never the last", 3, 3.0, 0, 2},   // (3.0 - 0.5) / 1.0 = 2.5: 3, but the oldest stays
		{"machine busy", 4, 0.4, 0.9, 3},   // max(0.4, 0.9): (0.9 - 0.5) / (0.4 / 4) = 4, the oldest stays
		{"fits", 4, 0.4, 0, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			clk := clock.NewFake(time.Now())
			var cpu, busy, total time.Duration
			cfg := Config{MaxStreams: 10, CPUCores: 1, CPUCeiling: 0.5, StreamCost: 0.01, ShedAfter: 2 * time.Second,
				IdleTimeout: time.Hour, ConnectTimeout: time.Hour, Clock: clk, CPUTime: func() time.Duration { return cpu }}
			if c.machine > 0 {
				cfg.MachineCPU = func() (time.Duration, time.Duration, int) { return busy, total, 1 }
			}
			srv, _, hs := newTestServer(t, cfg)
			in := admitStreams(t, srv, hs.URL, clk, c.streams)
			// Over from the second sample; shed at the fourth (ShedAfter
			// 2 s); the fifth, one interval later, sheds nothing more.
			for range 5 {
				cpu += time.Duration(c.proc * float64(time.Second))
				busy += time.Duration(c.machine * float64(time.Second))
				total += time.Second
				clk.Advance(time.Second)
			}
			waitFor(t, "shedding", 5*time.Second, func() bool { return srv.Admission().Admitted == c.streams-c.shed })
			if got := srv.Admission().Ended[EndOverload]; got != uint64(c.shed) {
				t.Errorf("ended overload = %d, want %d", got, c.shed)
			}
			for i, st := range in {
				gone := srv.lookup(st.id) == nil
				if want := i >= c.streams-c.shed; gone != want {
					t.Errorf("stream %d (of %d, oldest first): shed %v, want %v; %+v", i, c.streams, gone, want, srv.Admission())
				}
			}
		})
	}
}

// TestMachineCPUTime reads this Linux machine's /proc/stat: every core,
// busy time within the total, both growing.
// admitStreams posts n offers and admits each as if its first frame had
// decoded, a millisecond apart on clk (in[i] is older than in[i+1]).
func admitStreams(t *testing.T, srv *Server, base string, clk *clock.Fake, n int) []*stream {
	t.Helper()
	var in []*stream
	for i := range n {
		code, body, id, _ := postOffer(t, base)
		if code != http.StatusCreated {
			t.Fatalf("stream %d: %d %s", i, code, body)
		}
		st := srv.lookup(id)
		if kind, why := st.admitFirst(); kind != "" {
			t.Fatalf("stream %d: %s %s", i, kind, why)
		}
		in = append(in, st)
		clk.Advance(time.Millisecond)
	}
	return in
}

// TestShedOnSaturation: the sink (the engine) says the app's frames reach
// it later than half the SLO while the CPU estimate fits (a busy
// neighbour, say): the newest streams are shed one at a time, never the
// last, and shedding stops when the sink recovers.
func TestShedOnSaturation(t *testing.T) {
	clk := clock.NewFake(time.Now())
	var cpu time.Duration
	cfg := Config{MaxStreams: 10, CPUCores: 1, CPUCeiling: 0.5, StreamCost: 0.01, ShedAfter: 2 * time.Second,
		IdleTimeout: time.Hour, ConnectTimeout: time.Hour, Clock: clk, CPUTime: func() time.Duration { return cpu }}
	srv, sink, hs := newTestServer(t, cfg)
	in := admitStreams(t, srv, hs.URL, clk, 3)
	tick := func(n int) {
		for range n {
			cpu += 100 * time.Millisecond // 0.1 cores: the CPU estimate fits
			clk.Advance(time.Second)
		}
	}
	tick(2)
	if got := srv.Admission().Admitted; got != 3 {
		t.Fatalf("admitted %d before saturation, want 3", got)
	}
	sink.mu.Lock()
	sink.saturated = true
	sink.mu.Unlock()
	tick(4) // over from the first; shed at ShedAfter
	waitFor(t, "the newest stream shed", 5*time.Second, func() bool { return srv.lookup(in[2].id) == nil })
	tick(4) // two intervals on: the next one
	waitFor(t, "the next stream shed", 5*time.Second, func() bool { return srv.lookup(in[1].id) == nil })
	tick(6)
	if srv.lookup(in[0].id) == nil {
		t.Fatal("the last stream was shed")
	}
	sink.mu.Lock()
	sink.saturated = false
	sink.mu.Unlock()
	tick(6)
	if a := srv.Admission(); a.Admitted != 1 || a.Ended[EndOverload] != 2 {
		t.Errorf("admitted %d, ended overload %d; want 1 and 2", a.Admitted, a.Ended[EndOverload])
	}
	for _, si := range srv.Streams() {
		if si.EndKind == EndOverload && !strings.Contains(si.Ended, "later than half its SLO") {
			t.Errorf("shed stream %s says %q: it should name the saturation", si.ID, si.Ended)
		}
	}
}

func TestMachineCPUTime(t *testing.T) {
	busy, total, cores := MachineCPUTime()
	if cores != runtime.NumCPU() || busy <= 0 || busy > total {
		t.Fatalf("busy %v, total %v, cores %d (NumCPU %d)", busy, total, cores, runtime.NumCPU())
	}
	if p := ProcessCPUTime(); p <= 0 {
		t.Errorf("process CPU time %v", p)
	}
}
