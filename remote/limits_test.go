package remote

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"net"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/mdag/mdag/api"
	"github.com/mdag/mdag/ingest/synth"
	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/internal/pki"
	"github.com/mdag/mdag/remote/client"
	"github.com/mdag/mdag/remote/source"
)

// TestRegistrationBuckets: the per-peer and global token buckets on a
// fake clock. A refused attempt takes no token; time refills both.
func TestRegistrationBuckets(t *testing.T) {
	l := mustLimits(t, Limits{PeerRate: 1, PeerBurst: 2, GlobalRate: 2, GlobalBurst: 3})
	t0 := time.Unix(1000, 0)
	type try struct {
		at   time.Duration // since t0
		peer string
		want string // "" admitted, else the reason
	}
	tests := []struct {
		name  string
		tries []try
	}{
		{"peer burst then refused", []try{{0, "a", ""}, {0, "a", ""}, {0, "a", RefusedRatePeer}, {0, "a", RefusedRatePeer}}},
		{"peer refills at its rate", []try{{0, "a", ""}, {0, "a", ""}, {500 * time.Millisecond, "a", RefusedRatePeer}, {time.Second, "a", ""}, {time.Second, "a", RefusedRatePeer}}},
		{"global burst across peers", []try{{0, "a", ""}, {0, "b", ""}, {0, "c", ""}, {0, "d", RefusedRateGlobal}, {500 * time.Millisecond, "d", ""}}},
		{"a refused peer takes no global token", []try{{0, "a", ""}, {0, "a", ""}, {0, "a", RefusedRatePeer}, {0, "a", RefusedRatePeer}, {0, "b", ""}, {0, "c", RefusedRateGlobal}}},
		{"burst caps the refill", []try{{time.Hour, "a", ""}, {time.Hour, "a", ""}, {time.Hour, "a", RefusedRatePeer}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var g registrations
			for i, tr := range tc.tries {
				if got := g.allow(t0.Add(tr.at), tr.peer, l); got != tr.want {
					t.Fatalf("try %d (%s at +%v): got %q, want %q", i, tr.peer, tr.at, got, tr.want)
				}
			}
		})
	}
}

// TestRegistrationBucketsBounded: past maxPeerBuckets peers, the buckets of
// peers that are full again are forgotten, so a spray of addresses cannot
// grow the map without bound.
func TestRegistrationBucketsBounded(t *testing.T) {
	l := mustLimits(t, Limits{PeerRate: 1, PeerBurst: 1, GlobalRate: 1e9, GlobalBurst: 1e9})
	var g registrations
	t0 := time.Unix(1000, 0)
	for i := range 3 * maxPeerBuckets {
		if got := g.allow(t0.Add(time.Duration(i)*time.Second), "peer-"+string(rune('a'+i%26))+strings.Repeat("x", i/26), l); got != "" {
			t.Fatalf("peer %d refused: %s", i, got)
		}
	}
	if n := len(g.peers); n > maxPeerBuckets {
		t.Fatalf("%d peer buckets kept, want at most %d", n, maxPeerBuckets)
	}
}

// Every bucket in use (peers that keep connecting, none full again): a new
// peer is held to the global bucket, and the map does not grow.
func TestRegistrationBucketsAllInUse(t *testing.T) {
	l := mustLimits(t, Limits{PeerRate: 0.001, PeerBurst: 2, GlobalRate: 1e9, GlobalBurst: 1e9})
	var g registrations
	t0 := time.Unix(1000, 0)
	for i := range maxPeerBuckets + 100 {
		if got := g.allow(t0, fmt.Sprintf("127.0.%d.%d", i/256, i%256), l); got != "" {
			t.Fatalf("peer %d refused: %s", i, got)
		}
	}
	if n := len(g.peers); n != maxPeerBuckets {
		t.Fatalf("%d peer buckets kept, want %d", n, maxPeerBuckets)
	}
}

// TestConnectRateLimited: a flood of Connect attempts over real gRPC gets
// ResourceExhausted past the burst, each refusal is counted, the log says
// it once per interval (with how many were not logged), and the fake
// clock's refill admits the peer again.
func TestConnectRateLimited(t *testing.T) {
	app, prof := loadExample(t, "traffic")
	clk := clock.NewFake(time.Unix(1000, 0))
	var logs logBuf
	c := startServer(t, app, prof, &Server{Heartbeat: time.Hour, Clock: clk, Log: slog.New(slog.NewTextHandler(&logs, nil)),
		Limits: Limits{PeerRate: 1, PeerBurst: 3, GlobalRate: 100, GlobalBurst: 100, LogEvery: 10 * time.Second}})
	cl := api.NewCoordinatorClient(c.cc)
	// attempt registers an unknown type: admitted attempts end in
	// InvalidArgument (after the rate check), refused ones in
	// ResourceExhausted.
	attempt := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		st, err := cl.Connect(ctx)
		if err != nil {
			return err
		}
		if err := st.Send(&api.WorkerMessage{Msg: &api.WorkerMessage_Register{Register: &api.Register{Id: "x", Type: "TPU"}}}); err != nil {
			_, err = st.Recv()
			return err
		}
		_, err = st.Recv()
		return err
	}
	var codesGot []codes.Code
	for range 8 {
		err := attempt()
		codesGot = append(codesGot, status.Code(err))
		if status.Code(err) == codes.ResourceExhausted && !strings.Contains(err.Error(), "127.0.0.1 connects more often than 1 a second (burst 3)") {
			t.Errorf("refusal says %q", err)
		}
	}
	want := []codes.Code{codes.InvalidArgument, codes.InvalidArgument, codes.InvalidArgument}
	for range 5 {
		want = append(want, codes.ResourceExhausted)
	}
	if !equalCodes(codesGot, want) {
		t.Fatalf("codes %v, want %v", codesGot, want)
	}
	if n := c.srv.Refused()[RefusedRatePeer]; n != 5 {
		t.Errorf("counted %d rate-peer refusals, want 5", n)
	}
	if n := strings.Count(logs.String(), "reason=rate-peer"); n != 1 {
		t.Errorf("logged %d rate-peer lines in one interval, want 1:\n%s", n, logs.String())
	}
	// One second refills one token; the next interval logs again and says
	// how many were refused quietly.
	clk.Advance(time.Second)
	if err := attempt(); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("after a second: %v, want admitted (InvalidArgument for type TPU)", err)
	}
	clk.Advance(10 * time.Second) // refills the bucket to 3
	for range 4 {
		_ = attempt()
	}
	if n := c.srv.Refused()[RefusedRatePeer]; n != 6 {
		t.Errorf("counted %d rate-peer refusals, want 6", n)
	}
	if n := strings.Count(logs.String(), "reason=rate-peer"); n != 2 || !strings.Contains(logs.String(), "also_refused_since_last_log=4") {
		t.Errorf("want a second line saying 4 more were refused:\n%s", logs.String())
	}
}

func equalCodes(a, b []codes.Code) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// ingestOnce opens an Ingest stream, joins stream s of traffic and sends
// msgs; it returns how the stream ended.
func ingestOnce(cl api.CoordinatorClient, s string, msgs ...*api.IngestMessage) (*api.IngestReply, error) {
	// A bound on the call, not its expected time: a 192 MB message
	// under -race on a loaded 2-core machine took 26 s.
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	st, err := cl.Ingest(ctx)
	if err != nil {
		return nil, err
	}
	for _, m := range append([]*api.IngestMessage{{Join: &api.Join{App: "traffic", Stream: s}}}, msgs...) {
		if err := st.Send(m); err != nil {
			break // the server ended the stream; CloseAndRecv says why
		}
	}
	return st.CloseAndRecv()
}

// TestIngestLimits: each source cap refuses with a code and a message that
// says what and the limit, and is counted by reason; a frame inside the
// caps is still accepted.
func TestIngestLimits(t *testing.T) {
	app, prof := loadExample(t, "traffic")
	c := startServer(t, app, prof, &Server{Heartbeat: time.Second, Limits: Limits{MaxFrameW: 64, MaxFrameH: 48, MaxBoxes: 4}})
	cl := api.NewCoordinatorClient(c.cc)
	now := time.Now().UnixNano()
	frame := func(w, h, n int) *api.Frame {
		return &api.Frame{Width: int32(w), Height: int32(h), Bgr: make([]byte, n)}
	}
	boxes := func(n int, class string) []*api.Box {
		out := make([]*api.Box, n)
		for i := range out {
			out[i] = &api.Box{W: 1, H: 1, Class: class}
		}
		return out
	}
	tests := []struct {
		name   string
		msg    *api.IngestMessage
		code   codes.Code
		want   string
		reason string
	}{
		{"inside the caps", &api.IngestMessage{Seq: 1, CaptureUnixNs: now, Frame: frame(64, 48, 64*48*3), Truth: boxes(4, "car")}, codes.OK, "", ""},
		{"too wide", &api.IngestMessage{Seq: 1, CaptureUnixNs: now, Frame: frame(65, 48, 65*48*3)}, codes.InvalidArgument, "ingest stream s frame 1: frame over the size limit: 65x48 is larger than 64x48 (--max-frame)", RefusedFrameSize},
		{"declared huge, no payload", &api.IngestMessage{Seq: 2, CaptureUnixNs: now, Frame: frame(1<<30, 1<<30, 0)}, codes.InvalidArgument, "1073741824x1073741824 is larger than 64x48", RefusedFrameSize},
		{"too many boxes", &api.IngestMessage{Seq: 3, CaptureUnixNs: now, Frame: frame(4, 4, 48), Truth: boxes(5, "car")}, codes.InvalidArgument, "too many boxes: 5 ground-truth boxes on one frame, the limit is 4", RefusedBoxes},
		{"message too large", &api.IngestMessage{Seq: 4, CaptureUnixNs: now, Frame: frame(4, 4, 48), Truth: boxes(4, strings.Repeat("c", 64<<10))}, codes.ResourceExhausted, "ingest stream s frame 4: the message is", RefusedMessage},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := c.srv.Refused()[tc.reason]
			r, err := ingestOnce(cl, "s", tc.msg)
			if status.Code(err) != tc.code || (tc.want != "" && !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("got %v, want %v containing %q", err, tc.code, tc.want)
			}
			if tc.code == codes.OK {
				if r.Accepted != 1 {
					t.Errorf("reply %+v: want the frame accepted", r)
				}
				return
			}
			if got := c.srv.Refused()[tc.reason]; got != before+1 {
				t.Errorf("%s refusals went %d -> %d, want one more", tc.reason, before, got)
			}
		})
	}
}

// TestSourceStreamLimit: a source (here one IP address, plaintext) may
// hold MaxSourceStreams Ingest streams at once; one more is refused, and
// closing one frees its place.
func TestSourceStreamLimit(t *testing.T) {
	app, prof := loadExample(t, "traffic")
	c := startServer(t, app, prof, &Server{Heartbeat: time.Second, Limits: Limits{MaxSourceStreams: 2}})
	cl := api.NewCoordinatorClient(c.cc)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var open []api.Coordinator_IngestClient
	for _, s := range []string{"a", "b"} {
		st, err := cl.Ingest(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Send(&api.IngestMessage{Join: &api.Join{App: "traffic", Stream: s}}); err != nil {
			t.Fatal(err)
		}
		open = append(open, st)
	}
	waitFor(t, "two streams open", 5*time.Second, func() bool {
		c.srv.mu.Lock()
		defer c.srv.mu.Unlock()
		return c.srv.sources["127.0.0.1"] == 2
	})
	_, err := ingestOnce(cl, "c")
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "source 127.0.0.1 already has 2 streams open, the limit (--max-source-streams)") {
		t.Fatalf("third stream: %v, want ResourceExhausted naming the limit", err)
	}
	if n := c.srv.Refused()[RefusedStreams]; n != 1 {
		t.Errorf("counted %d source-streams refusals, want 1", n)
	}
	if _, err := open[0].CloseAndRecv(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the closed stream to free its place", 5*time.Second, func() bool {
		c.srv.mu.Lock()
		defer c.srv.mu.Unlock()
		return c.srv.sources["127.0.0.1"] == 1
	})
	if r, err := ingestOnce(cl, "c"); err != nil {
		t.Fatalf("after one closed: %v %v", r, err)
	}
}

// TestPeerID: limits key on the certificate name with TLS, the IP address
// (no port) without.
func TestPeerID(t *testing.T) {
	ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: &fakeAddr{"10.1.2.3:5555"}})
	if got := peerID(ctx); got != "10.1.2.3" {
		t.Errorf("peerID = %q, want 10.1.2.3", got)
	}
	if got := peerID(metadata.NewIncomingContext(context.Background(), nil)); got != "unknown" {
		t.Errorf("peerID without a peer = %q, want unknown", got)
	}
}

type fakeAddr struct{ s string }

func (a *fakeAddr) Network() string { return "tcp" }
func (a *fakeAddr) String() string  { return a.s }

// sendHugeFrame sends one 8000x8000 BGR frame (192 MB) on cc's Ingest,
// closes cc (the test's client shares the process: its send buffers must
// go too) and returns how the stream ended with the heap in use before
// and after. After is polled for up to 10 s until it is within 64 MiB of
// before, as the client's transport ends asynchronously.
func sendHugeFrame(cc *grpc.ClientConn) (before, after uint64, err error) {
	before = heapInuse()
	err = func() error {
		big := &api.IngestMessage{Seq: 7, CaptureUnixNs: time.Now().UnixNano(), Frame: &api.Frame{Width: 8000, Height: 8000, Bgr: make([]byte, 8000*8000*3)}}
		_, err := ingestOnce(api.NewCoordinatorClient(cc), "source/big", big) // a stream the default source certificate may join
		return err
	}()
	cc.Close()
	deadline := time.Now().Add(10 * time.Second)
	for after = heapInuse(); after > before+64<<20 && time.Now().Before(deadline); after = heapInuse() {
		<-time.After(20 * time.Millisecond)
	}
	return before, after, err
}

func heapInuse() uint64 {
	runtime.GC()
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// TestHugeFrameRefused: a 192 MB frame (8000x8000 BGR), what a fake source
// sent in issue 22, is refused with a clear error under the default limits
// (its declared size, before a frame is made of it) and, with a lower
// MaxMessage, by gRPC from the length prefix without reading it; either
// way it is counted and the coordinator's heap is back within 64 MiB of
// where it was.
func TestHugeFrameRefused(t *testing.T) {
	if testing.Short() {
		t.Skip("sends 192 MB")
	}
	app, prof := loadExample(t, "traffic")
	tests := []struct {
		name   string
		limits Limits
		code   codes.Code
		want   string
		reason string
	}{
		{"default limits", Limits{}, codes.InvalidArgument, "ingest stream source/big frame 7: frame over the size limit: 8000x8000 is larger than 1920x1080 (--max-frame)", RefusedFrameSize},
		{"max message 16 MiB", Limits{MaxMessage: 16 << 20}, codes.ResourceExhausted, "larger than max", RefusedMessage},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := startServer(t, app, prof, &Server{Heartbeat: time.Second, Limits: tc.limits})
			// A normal stream first, so the session and its buffers exist
			// before the baseline.
			pat, err := synth.NewPattern(320, 240, 1)
			if err != nil {
				t.Fatal(err)
			}
			if r, err := source.Stream(context.Background(), c.cc, "traffic", "warm", pat, 0, 1000, 3); err != nil || r.Accepted != 3 {
				t.Fatalf("warm-up stream: %v %v", r, err)
			}
			cc, err := client.Dial(c.addr)
			if err != nil {
				t.Fatal(err)
			}
			before, after, err := sendHugeFrame(cc)
			if status.Code(err) != tc.code || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want %v containing %q", err, tc.code, tc.want)
			}
			if n := c.srv.Refused()[tc.reason]; n != 1 {
				t.Errorf("counted %d %s refusals, want 1", n, tc.reason)
			}
			grew := int64(after) - int64(before)
			t.Logf("heap in use: %.1f MiB before, %.1f MiB after (%+.1f MiB)", float64(before)/(1<<20), float64(after)/(1<<20), float64(grew)/(1<<20))
			if grew > 64<<20 {
				t.Errorf("the heap grew %.1f MiB after refusing the frame, want under 64 MiB", float64(grew)/(1<<20))
			}
		})
	}
}

// TestTLSReceiveLimitByRole: with mutual TLS each connection goes to the
// gRPC server of its certificate's role. A source's 192 MB frame is refused
// by gRPC from its length prefix, unread (ResourceExhausted, counted as
// message-size), and the heap is back within 64 MiB; a worker's message
// larger than a source may send (a 10 MB result) is still read, and here
// refused only because its task was never given.
func TestTLSReceiveLimitByRole(t *testing.T) {
	if testing.Short() {
		t.Skip("sends 192 MB")
	}
	dir := t.TempDir()
	if _, err := pki.Init(dir, pki.InitOptions{}); err != nil {
		t.Fatal(err)
	}
	// The hand-driven worker below never beats: a heartbeat of 200 ms (4
	// missed: 800 ms) could end its stream before its 10 MB message is read
	// on a loaded machine, and the refusal this test waits for never come.
	c := startTLSWith(t, dir, func(s *Server) { s.Heartbeat = 30 * time.Second })
	srcConn, err := client.DialTLS(c.addr, material(t, pki.DirFiles(dir, pki.Source), pki.Source), "")
	if err != nil {
		t.Fatal(err)
	}
	wk := api.NewCoordinatorClient(dialTLS(t, c.addr, material(t, pki.DirFiles(dir, pki.Worker), pki.Worker)))

	before, after, err := sendHugeFrame(srcConn)
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "received message larger than max") || !strings.Contains(err.Error(), fmt.Sprint(c.srv.limits.SourceMessage())) {
		t.Fatalf("a source's 192 MB frame: %v, want ResourceExhausted naming the source limit %d", err, c.srv.limits.SourceMessage())
	}
	grew := int64(after) - int64(before)
	t.Logf("heap in use: %.1f MiB before, %.1f MiB after (%+.1f MiB)", float64(before)/(1<<20), float64(after)/(1<<20), float64(grew)/(1<<20))
	if grew > 64<<20 {
		t.Errorf("the heap grew %.1f MiB after refusing the frame, want under 64 MiB", float64(grew)/(1<<20))
	}
	waitFor(t, "the refusal to be counted", 5*time.Second, func() bool { return c.srv.Refused()[RefusedMessage] == 1 })

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := wk.Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&api.WorkerMessage{Msg: &api.WorkerMessage_Register{Register: &api.Register{Id: "worker", Type: "CPU"}}}); err != nil {
		t.Fatal(err)
	}
	if m, err := st.Recv(); err != nil || m.GetRegistered() == nil {
		t.Fatalf("register: %v %v", m, err)
	}
	detail := strings.Repeat("x", 10<<20)
	if err := st.Send(&api.WorkerMessage{Msg: &api.WorkerMessage_Result{Result: &api.Result{Task: 1 << 40, Outcome: api.Outcome_OUTCOME_MODULE_ERROR, Detail: detail}}}); err != nil {
		t.Fatal(err)
	}
	// read, and refused for its task alone (the refusals are in the
	// failure: a slow read on a loaded machine and a refusal for another
	// reason look alike otherwise)
	for end := time.Now().Add(60 * time.Second); c.srv.Refused()[RefusedUnknownTask] != 1; <-time.After(20 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("the worker's 10 MB message was not refused as unknown-task within 60 s; refusals so far: %v", c.srv.Refused())
		}
	}
	if n := c.srv.Refused()[RefusedMessage]; n != 1 {
		t.Errorf("message-size refusals %d, want 1 (the worker's message is within its limit)", n)
	}
}

// TestTLSServerStopsDuringHandshake: a peer that connects and never starts
// its TLS handshake does not hold Stop up (the handshake is cut), and no
// goroutine is left behind (goleak in TestMain).
func TestTLSServerStopsDuringHandshake(t *testing.T) {
	dir := t.TempDir()
	if _, err := pki.Init(dir, pki.InitOptions{}); err != nil {
		t.Fatal(err)
	}
	m := material(t, pki.DirFiles(dir, pki.Coordinator), pki.Coordinator)
	app, prof := loadExample(t, "traffic")
	c := startServer(t, app, prof, &Server{Heartbeat: time.Second}) // an engine; its plaintext port is not used here
	g := NewTLSGRPC(&Server{Engine: c.e, Heartbeat: time.Second}, m)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- g.Serve(ln) }()
	raw, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	waitFor(t, "the connection to be in its handshake", 5*time.Second, func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		return len(g.pending) == 1
	})
	stopped := make(chan struct{})
	go func() { g.Stop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(5 * time.Second): // the handshake timeout is 10 s
		t.Fatal("Stop waited on a silent peer's handshake")
	}
	if err := <-served; err != nil {
		t.Errorf("Serve returned %v after Stop, want nil", err)
	}
}

// TestTLSHandshakesBounded: peers that open connections and never start
// their handshake hold at most MaxHandshakes of them; the rest are closed
// at once and counted. The peers come from many loopback addresses, each
// within MaxHandshakesPerIP (TestTLSHandshakesPerIP is the bound per
// address).
func TestTLSHandshakesBounded(t *testing.T) {
	dir := t.TempDir()
	if _, err := pki.Init(dir, pki.InitOptions{}); err != nil {
		t.Fatal(err)
	}
	m := material(t, pki.DirFiles(dir, pki.Coordinator), pki.Coordinator)
	app, prof := loadExample(t, "traffic")
	c := startServer(t, app, prof, &Server{Heartbeat: time.Second})
	srv := &Server{Engine: c.e, Heartbeat: time.Second}
	g := NewTLSGRPC(srv, m)
	g.firstByteTimeout, g.handshakeTimeout = time.Minute, time.Minute // held until the test ends
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- g.Serve(ln) }()
	const extra = 5
	for i := range MaxHandshakes + extra {
		dialFrom(t, fmt.Sprintf("127.0.0.%d", 2+i/MaxHandshakesPerIP), ln.Addr().String())
	}
	waitFor(t, "the connections beyond the bound to be refused", 20*time.Second, func() bool {
		return srv.Refused()[RefusedHandshakes] >= extra
	})
	if n := g.handshaking(); n > MaxHandshakes {
		t.Errorf("%d handshakes in progress, want at most %d", n, MaxHandshakes)
	}
	g.Stop()
	if err := <-served; err != nil {
		t.Errorf("Serve returned %v after Stop, want nil", err)
	}
}

func mustLimits(t *testing.T, l Limits) Limits {
	t.Helper()
	l, err := l.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestLimitsOutOfRange: a negative limit is an error naming the field (as
// internal/defaults reports every config's), never a value silently
// replaced by the default; a server holding one refuses every stream.
func TestLimitsOutOfRange(t *testing.T) {
	for _, tc := range []struct {
		l    Limits
		want string
	}{
		{Limits{MaxBoxes: -1}, "remote.Limits.MaxBoxes = -1: must be >= 0"},
		{Limits{MaxAudioBytes: -5}, "remote.Limits.MaxAudioBytes = -5"},
		{Limits{PeerRate: -1}, "remote.Limits.PeerRate = -1: must be >= 0"},
		{Limits{GlobalBurst: math.NaN()}, "remote.Limits.GlobalBurst = NaN"},
		{Limits{FirstMessage: -time.Second}, "remote.Limits.FirstMessage = -1s"},
		{Limits{MaxFrameW: -1, MaxFrameH: -2}, "MaxFrameH = -2"},
	} {
		err := tc.l.Check()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want an error with %q", tc.l, err, tc.want)
		}
		s := &Server{Limits: tc.l}
		if err := s.Check(); err == nil {
			t.Errorf("%+v: the server took it", tc.l)
		}
	}
	if err := (Limits{}).Check(); err != nil {
		t.Errorf("zero limits (every default): %v", err)
	}
	if err := (Limits{PeerRate: math.Inf(1), GlobalBurst: math.Inf(1)}).Check(); err != nil {
		t.Errorf("infinite rate and burst (no limit): %v", err)
	}
}
