package client

import (
	"bufio"
	"net"
	"testing"
	"time"

	"golang.org/x/net/http2"
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
	_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := conn.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(conn, bufio.NewReader(conn))
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("reading the peer port's SETTINGS: %v", err)
		}
		if sf, ok := f.(*http2.SettingsFrame); ok && !sf.IsAck() {
			if v, _ := sf.Value(http2.SettingMaxConcurrentStreams); v != MaxPeerStreams {
				t.Errorf("SETTINGS_MAX_CONCURRENT_STREAMS %d, want %d", v, MaxPeerStreams)
			}
			return
		}
	}
}
