package remote

import (
	"context"
	"net"
	"strings"
	"testing"

	"google.golang.org/grpc/peer"

	"github.com/mdag/mdag/api"
)

// TestPeerHostIsCaller: a worker's peer address must be an IP literal
// equal to the address its connection comes from; otherwise it relays.
func TestPeerHostIsCaller(t *testing.T) {
	from := func(addr string) context.Context {
		a, err := net.ResolveTCPAddr("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		return peer.NewContext(context.Background(), &peer.Peer{Addr: a})
	}
	for _, c := range []struct {
		name, caller, addr, want string // want "" = accepted
	}{
		{"same IPv4", "10.1.2.3:51000", "10.1.2.3:7071", ""},
		{"loopback", "127.0.0.1:51000", "127.0.0.1:40123", ""},
		{"same IPv6", "[fd00::5]:51000", "[fd00::5]:7071", ""},
		{"another host", "10.1.2.3:51000", "169.254.169.254:80", "not the address the worker connects from"},
		{"a name", "10.1.2.3:51000", "metadata.internal:80", "want an IP address"},
		{"no port", "10.1.2.3:51000", "10.1.2.3", "want IP:PORT"},
		{"empty host", "10.1.2.3:51000", ":7071", "want IP:PORT"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := peerHostIsCaller(from(c.caller), c.addr)
			if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
				t.Errorf("%s from %s: %v, want %q", c.addr, c.caller, err, c.want)
			}
		})
	}
	if err := peerHostIsCaller(context.Background(), "10.1.2.3:7071"); err == nil {
		t.Error("accepted with no caller address")
	}
}

// TestCountFrames: a result's frames are counted by plane; a reference
// from a worker that relays, or naming another holder or address, is
// refused and counts nothing.
func TestCountFrames(t *testing.T) {
	ref := func(holder, addr string) *api.Item {
		return &api.Item{Stream: "cam", Frame: &api.Frame{Width: 2, Height: 2, Ref: &api.FrameRef{Holder: holder, Addr: addr, Id: 7}}}
	}
	inline := &api.Item{Stream: "cam", Frame: &api.Frame{Width: 2, Height: 2, Bgr: make([]byte, 12)}}
	result := func(items ...*api.Item) *api.Result {
		return &api.Result{Outputs: []*api.ItemList{{Items: items}}}
	}
	for _, c := range []struct {
		name                 string
		peer                 string // the worker's registered peer address ("" relays)
		res                  *api.Result
		want                 string // "" = accepted
		relayed, bytes, refs uint64
	}{
		{"direct", "10.0.0.7:7071", result(ref("w", "10.0.0.7:7071"), inline), "", 1, 12, 1},
		{"relay", "", result(inline, inline), "", 2, 24, 0},
		{"reference from a relaying worker", "", result(inline, ref("w", "10.0.0.7:7071")), "relays its frames", 0, 0, 0},
		{"another holder", "10.0.0.7:7071", result(ref("v", "10.0.0.7:7071")), "names holder", 0, 0, 0},
		{"another address", "10.0.0.7:7071", result(inline, ref("w", "10.0.0.8:7071")), "names holder", 0, 0, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := &Server{}
			err := s.countFrames(&conn{id: "w", peer: c.peer}, c.res)
			if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
				t.Fatalf("%v, want %q", err, c.want)
			}
			if p := s.Plane(); p.RelayedFrames != c.relayed || p.RelayedBytes != c.bytes || p.RefFrames != c.refs {
				t.Errorf("counted %+v, want %d relayed (%d bytes), %d refs", p, c.relayed, c.bytes, c.refs)
			}
		})
	}
}
