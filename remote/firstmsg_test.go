package remote

import (
	"context"
	"crypto/tls"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/mdag/mdag/api"
	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/internal/h2test"
	"github.com/mdag/mdag/internal/pki"
)

// TestFirstMessageTimeout (issue 36, finding 8): a Connect stream that
// never registers and an Ingest stream that never joins are ended after
// Limits.FirstMessage (on the server's clock) with DeadlineExceeded and
// counted; before, they stayed open, each holding its handler, for the
// life of the connection. A stream that has not joined counts against
// its source's stream limit meanwhile.
func TestFirstMessageTimeout(t *testing.T) {
	app, prof := loadExample(t, "traffic")
	clk := clock.NewFake(time.Unix(1000, 0))
	c := startServer(t, app, prof, &Server{Heartbeat: time.Hour, Clock: clk, Limits: Limits{FirstMessage: 10 * time.Second, MaxSourceStreams: 1}})
	cl := api.NewCoordinatorClient(c.cc)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	in, err := cl.Ingest(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wk, err := cl.Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// both handlers wait for their first message on the server's clock
	waitFor(t, "both streams to wait for their first message", 20*time.Second, func() bool { return clk.Pending() == 2 })

	// the silent Ingest stream holds the source's only stream
	second, err := cl.Ingest(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := second.CloseAndRecv(); status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "already has 1 streams open") {
		t.Errorf("a second stream while one has not joined: %v; want ResourceExhausted (the source's stream limit)", err)
	}

	clk.Advance(10 * time.Second)
	if _, err := in.CloseAndRecv(); status.Code(err) != codes.DeadlineExceeded || !strings.Contains(err.Error(), "ingest: no join message within 10s") {
		t.Errorf("an Ingest stream that never joined: %v; want DeadlineExceeded, no join message within 10s", err)
	}
	if _, err := wk.Recv(); status.Code(err) != codes.DeadlineExceeded || !strings.Contains(err.Error(), "connect: no register message within 10s") {
		t.Errorf("a Connect stream that never registered: %v; want DeadlineExceeded, no register message within 10s", err)
	}
	if n := c.srv.Refused()[RefusedFirstMessage]; n != 2 {
		t.Errorf("%s refusals %d, want 2", RefusedFirstMessage, n)
	}
}

// TestMaxConcurrentStreams (finding 8): the coordinator's gRPC servers
// (plaintext, and both role servers behind TLS) bound the streams on one
// connection; before, they announced no limit, so one connection could
// open 50,000 streams.
func TestMaxConcurrentStreams(t *testing.T) {
	want := uint32(DefaultLimits.MaxConnStreams)
	t.Run("plaintext", func(t *testing.T) {
		app, prof := loadExample(t, "traffic")
		c := startServer(t, app, prof, &Server{Heartbeat: time.Second})
		conn, err := net.Dial("tcp", c.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if got := h2test.MaxConcurrentStreams(t, conn); got != want {
			t.Errorf("SETTINGS_MAX_CONCURRENT_STREAMS %d, want %d", got, want)
		}
	})
	dir := t.TempDir()
	if _, err := pki.Init(dir, pki.InitOptions{}); err != nil {
		t.Fatal(err)
	}
	_, addr := handshakeServer(t, dir, &Server{Heartbeat: time.Second}, nil)
	for _, role := range []pki.Role{pki.Worker, pki.Source} {
		t.Run(string(role), func(t *testing.T) {
			cfg := material(t, pki.DirFiles(dir, role), role).ClientConfig("127.0.0.1")
			cfg.NextProtos = []string{"h2"}
			conn, err := tls.Dial("tcp", addr, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if got := h2test.MaxConcurrentStreams(t, conn); got != want {
				t.Errorf("SETTINGS_MAX_CONCURRENT_STREAMS %d, want %d", got, want)
			}
		})
	}
	if l, err := (Limits{MaxSourceStreams: 5000}).withDefaults(); err != nil || l.MaxConnStreams != 5000 {
		t.Errorf("MaxConnStreams %d (err %v) with MaxSourceStreams 5000, want 5000 (a source's streams fit one connection)", l.MaxConnStreams, err)
	}
}
