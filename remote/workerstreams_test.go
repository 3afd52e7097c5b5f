package remote

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/mdag/mdag/api"
	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/internal/pki"
)

// TestWorkerStreamsPerPeer (issue 36, the --max-message finding) over
// mutual TLS: the certificate a handshake verified is what
// Limits.MaxWorkerStreams counts, and a stream over it is refused before
// its first message is read, so what one certificate makes the
// coordinator hold unread is that many messages of --max-message, not one
// per stream its connections may open. The rest (a shared certificate
// per connection, another certificate, a closed stream freeing its
// place) is TestSessionStreamsPerPeer's, on the fake clock.
func TestWorkerStreamsPerPeer(t *testing.T) {
	dir := t.TempDir()
	if _, err := pki.Init(dir, pki.InitOptions{}); err != nil {
		t.Fatal(err)
	}
	clk := clock.NewFake(time.Unix(1000, 0)) // the streams wait for their register on it: never, here
	c := startTLSWith(t, dir, func(s *Server) { s.Clock = clk })
	open := func(s *Server) map[string]int {
		s.mu.Lock()
		defer s.mu.Unlock()
		out := map[string]int{}
		for k, v := range s.workerStreams {
			out[k] = v
		}
		return out
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	connect := func(m *pki.Material) (api.Coordinator_ConnectClient, context.CancelFunc) {
		sctx, scancel := context.WithCancel(ctx)
		st, err := api.NewCoordinatorClient(dialTLS(t, c.addr, m)).Connect(sctx)
		if err != nil {
			t.Fatal(err)
		}
		return st, scancel
	}
	gpu1 := issue(t, dir, pki.Worker, "gpu-1")
	// two silent streams of gpu-1, each on its own connection
	connect(gpu1)
	connect(gpu1)
	waitFor(t, "gpu-1's two streams counted", 20*time.Second, func() bool { return open(c.srv)["mdag://worker/gpu-1"] == 2 })

	// a third is refused without its message being read: a register
	// padded to 8 MiB is never looked at
	third, _ := connect(gpu1)
	_ = third.Send(&api.WorkerMessage{Msg: &api.WorkerMessage_Register{Register: &api.Register{Id: "gpu-1", Type: strings.Repeat("x", 8<<20)}}})
	if _, err := third.Recv(); status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "already has 2 Connect streams open") {
		t.Fatalf("gpu-1's third Connect stream: %v; want ResourceExhausted, already has 2 Connect streams open", err)
	}
	if n := c.srv.Refused()[RefusedWorkerStream]; n != 1 {
		t.Errorf("%s refusals %d, want 1", RefusedWorkerStream, n)
	}
	if n := c.srv.Refused()[RefusedRegister]; n != 0 {
		t.Errorf("the refused stream's register was read (%d %s refusals)", n, RefusedRegister)
	}
}
