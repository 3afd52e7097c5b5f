package remote

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/mdag/mdag/api"
	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/internal/pki"
)

// handshakeServer serves srv's TLS port (no engine: these tests stop at
// the handshake) on 127.0.0.1 with the coordinator's material in dir;
// tune changes the server before it serves.
func handshakeServer(t *testing.T, dir string, srv *Server, tune func(*TLSServer)) (*TLSServer, string) {
	t.Helper()
	g := NewTLSGRPC(srv, material(t, pki.DirFiles(dir, pki.Coordinator), pki.Coordinator))
	if tune != nil {
		tune(g)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- g.Serve(ln) }()
	t.Cleanup(func() {
		g.Stop()
		if err := <-served; err != nil {
			t.Errorf("Serve returned %v after Stop, want nil", err)
		}
	})
	return g, ln.Addr().String()
}

// dialFrom opens a TCP connection to addr from the loopback address from
// (127.0.0.0/8 is all loopback on Linux), closed when the test ends.
func dialFrom(t *testing.T, from, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 10 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		// some sandboxes route only 127.0.0.1: the test needs several
		// source addresses, so it cannot say anything there
		t.Skipf("dial %s from %s (a loopback address besides 127.0.0.1): %v", addr, from, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestTLSHandshakesPerIP (issue 36, finding 6): 300 connections from one
// address that never start their handshake hold at most MaxHandshakesPerIP
// handshake slots; the rest are closed at once and counted, and a worker
// with a valid certificate from another address completes its handshake
// on its first connection (before, the 256 global slots were all taken,
// and it was closed unanswered for as long as the idle peers stayed).
func TestTLSHandshakesPerIP(t *testing.T) {
	dir := t.TempDir()
	if _, err := pki.Init(dir, pki.InitOptions{}); err != nil {
		t.Fatal(err)
	}
	srv := &Server{Heartbeat: time.Second}
	// silence is not cut short here: only the per-address bound is at work
	g, addr := handshakeServer(t, dir, srv, func(g *TLSServer) { g.firstByteTimeout, g.handshakeTimeout = time.Minute, time.Minute })
	const idle = 300
	for range idle {
		dialFrom(t, "127.0.0.2", addr)
	}
	// Connections are accepted in order, so the idle ones are all in or
	// refused by the time the worker's is accepted.
	wk := material(t, pki.DirFiles(dir, pki.Worker), pki.Worker)
	raw := dialFrom(t, "127.0.0.1", addr)
	_ = raw.SetDeadline(time.Now().Add(20 * time.Second))
	tc := tls.Client(raw, wk.ClientConfig("127.0.0.1"))
	if err := tc.Handshake(); err != nil {
		t.Fatalf("a worker with a valid certificate behind %d idle connections from another address: handshake: %v", idle, err)
	}
	if got, want := srv.Refused()[RefusedHandshakesIP], uint64(idle-MaxHandshakesPerIP); got != want {
		t.Errorf("%s refusals %d, want %d", RefusedHandshakesIP, got, want)
	}
	g.mu.Lock()
	held := g.perIP["127.0.0.2"]
	g.mu.Unlock()
	if held != MaxHandshakesPerIP {
		t.Errorf("127.0.0.2 holds %d handshakes, want %d", held, MaxHandshakesPerIP)
	}
}

// TestTLSFirstByteTimeout (finding 6): a connection that sends nothing is
// closed after firstByteTimeout, well before the handshake's own timeout,
// and counted as a refused handshake that says why.
func TestTLSFirstByteTimeout(t *testing.T) {
	dir := t.TempDir()
	if _, err := pki.Init(dir, pki.InitOptions{}); err != nil {
		t.Fatal(err)
	}
	lb := &logBuf{}
	srv := &Server{Heartbeat: time.Second, Log: slog.New(slog.NewTextHandler(lb, nil))}
	_, addr := handshakeServer(t, dir, srv, func(g *TLSServer) { g.firstByteTimeout, g.handshakeTimeout = 50*time.Millisecond, time.Hour })
	c := dialFrom(t, "127.0.0.1", addr)
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second)) // far below the hour of the handshake's timeout
	if n, err := c.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("a silent connection: read %d bytes, %v; want it closed by the server (EOF)", n, err)
	}
	if n := srv.Refused()[RefusedTLS]; n != 1 {
		t.Errorf("%s refusals %d, want 1", RefusedTLS, n)
	}
	if !strings.Contains(lb.String(), "no ClientHello within 50ms of connecting") {
		t.Errorf("the log does not say why the connection was closed:\n%s", lb.String())
	}
}

// TestTLSHandshakeLogThrottled (finding 6): refused handshakes are all
// counted, but logged logBurst lines at once and then one per LogEvery,
// which says how many were refused in between.
func TestTLSHandshakeLogThrottled(t *testing.T) {
	dir := t.TempDir()
	if _, err := pki.Init(dir, pki.InitOptions{}); err != nil {
		t.Fatal(err)
	}
	lb := &logBuf{}
	clk := clock.NewFake(time.Unix(1000, 0))
	srv := &Server{Heartbeat: time.Second, Clock: clk, Log: slog.New(slog.NewTextHandler(lb, nil)), Limits: Limits{LogEvery: 10 * time.Second}}
	_, addr := handshakeServer(t, dir, srv, nil)
	// refuse sends bytes that are not TLS and waits for the server to close
	// the connection (it logs before it closes).
	refuse := func() {
		c := dialFrom(t, "127.0.0.1", addr)
		_ = c.SetDeadline(time.Now().Add(30 * time.Second))
		if _, err := c.Write([]byte("GET / HTTP/1.0\r\n\r\n")); err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(io.Discard, c); err != nil {
			t.Fatalf("waiting for the server to close a plaintext connection: %v", err)
		}
		c.Close()
	}
	lines := func() int { return strings.Count(lb.String(), "gRPC TLS handshake refused") }
	const n = 40
	for range n {
		refuse()
	}
	if got := srv.Refused()[RefusedTLS]; got != n {
		t.Errorf("%s refusals %d, want %d", RefusedTLS, got, n)
	}
	if got := lines(); got != logBurst {
		t.Fatalf("%d refused handshakes logged %d lines, want %d:\n%s", n, got, logBurst, lb.String())
	}
	clk.Advance(10 * time.Second)
	refuse()
	if got := lines(); got != logBurst+1 {
		t.Fatalf("after LogEvery: %d lines, want %d:\n%s", got, logBurst+1, lb.String())
	}
	if want := "also_refused_since_last_log=" + strconv.Itoa(n-logBurst); !strings.Contains(lb.String(), want) {
		t.Errorf("the line after the quiet interval does not say %s:\n%s", want, lb.String())
	}
}

// TestCallRefusalLogThrottled: calls refused for their certificate's role
// are all counted (`role`) but logged logBurst lines at once, then one per
// LogEvery saying how many were refused since.
func TestCallRefusalLogThrottled(t *testing.T) {
	ca, err := pki.NewCA("test", time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	src, err := ca.Issue(pki.Request{Role: pki.Source, Name: "cam", Now: time.Now(), Valid: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1},
		AuthInfo: credentials.TLSInfo{State: tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{src.Cert}}}}})
	lb := &logBuf{}
	clk := clock.NewFake(time.Unix(1000, 0))
	s := &Server{Clock: clk, Log: slog.New(slog.NewTextHandler(lb, nil)), Limits: Limits{LogEvery: 10 * time.Second}}
	lines := func() int { return strings.Count(lb.String(), "gRPC call refused") }
	const n = 40
	for range n {
		if err := s.authorize(ctx, api.Coordinator_Connect_FullMethodName); status.Code(err) != codes.PermissionDenied {
			t.Fatalf("a source calling Connect: %v, want PermissionDenied", err)
		}
	}
	if got := s.Refused()[RefusedRole]; got != n {
		t.Errorf("%s refusals %d, want %d", RefusedRole, got, n)
	}
	if got := lines(); got != logBurst {
		t.Fatalf("%d refused calls logged %d lines, want %d:\n%s", n, got, logBurst, lb.String())
	}
	clk.Advance(10 * time.Second)
	_ = s.authorize(ctx, api.Coordinator_Connect_FullMethodName)
	if got := lines(); got != logBurst+1 || !strings.Contains(lb.String(), "also_refused_since_last_log="+strconv.Itoa(n-logBurst)) {
		t.Errorf("after LogEvery: %d lines, want %d, the last saying %d more were refused:\n%s", got, logBurst+1, n-logBurst, lb.String())
	}
}

// TestHostOfGroupsIPv6 (review): the per-address handshake bound counts
// an IPv6 peer by its /64, as the HTTP rate limits do; IPv4 by address.
func TestHostOfGroupsIPv6(t *testing.T) {
	for addr, want := range map[string]string{
		"192.0.2.7:4000":           "192.0.2.7",
		"[2001:db8:1:2::7]:4000":   "2001:db8:1:2::/64",
		"[2001:db8:1:2:ffff::1]:1": "2001:db8:1:2::/64",
		"[2001:db8:1:3::7]:4000":   "2001:db8:1:3::/64",
		"[::ffff:192.0.2.7]:4000":  "192.0.2.7",
	} {
		a, err := net.ResolveTCPAddr("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		if got := hostOf(a); got != want {
			t.Errorf("hostOf(%s) = %s, want %s", addr, got, want)
		}
	}
}
