package client

import (
	"net"
	"testing"

	"github.com/mdag/mdag/internal/h2test"
)

// TestPeerMaxConcurrentStreams (issue 36, finding 8): a worker's peer port
// announces MaxPeerStreams as HTTP/2's SETTINGS_MAX_CONCURRENT_STREAMS, so
// one connection cannot open streams without bound (before: no limit).
func TestPeerMaxConcurrentStreams(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := NewPeerGRPC(&PeerServer{ID: "w1", Store: &Store{}})
	go func() { _ = g.Serve(ln) }()
	defer g.Stop()
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if v := h2test.MaxConcurrentStreams(t, conn); v != MaxPeerStreams {
		t.Errorf("SETTINGS_MAX_CONCURRENT_STREAMS %d, want %d", v, MaxPeerStreams)
	}
}
