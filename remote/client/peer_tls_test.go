package client

import (
	"context"
	"crypto/tls"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/internal/pki"
	"github.com/mdag/mdag/media"
)

// TestPeerMutualTLS: on the peer port a worker fetches from a worker
// with their certificates from the CA; a source's or a coordinator's
// certificate, on either end, or another CA's worker, gets nothing.
func TestPeerMutualTLS(t *testing.T) {
	dir, other := t.TempDir(), t.TempDir()
	for _, d := range []string{dir, other} {
		if _, err := pki.Init(d, pki.InitOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	load := func(d string, role pki.Role) *pki.Material {
		m, err := pki.Load(pki.DirFiles(d, role), role, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	worker, source, coord := load(dir, pki.Worker), load(dir, pki.Source), load(dir, pki.Coordinator)
	stranger := load(other, pki.Worker)

	clk := clock.NewFake(t0)
	serve := func(serverCfg *tls.Config) (string, uint64) {
		st := &Store{Clock: clk}
		id, _ := st.Put(frameOf(2, 2, 5), t0.Add(time.Hour))
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		g := NewPeerGRPC(&PeerServer{ID: "gpu-a", Store: st}, grpc.Creds(credentials.NewTLS(serverCfg)))
		done := make(chan struct{})
		go func() { defer close(done); _ = g.Serve(ln) }()
		t.Cleanup(func() { g.Stop(); <-done })
		return ln.Addr().String(), id
	}
	// A coordinator's certificate on the server side: served with the
	// worker's configuration shape but the coordinator's material.
	cases := []struct {
		name   string
		server *pki.Material
		client *pki.Material
		ok     bool
		want   string
	}{
		{"worker to worker", worker, worker, true, ""},
		{"a source fetches", worker, source, false, ""},
		{"a coordinator fetches", worker, coord, false, ""},
		{"another CA's worker fetches", worker, stranger, false, ""},
		{"the server is a coordinator", coord, worker, false, "coordinator"},
		{"the server is another CA's worker", stranger, worker, false, "certificate"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			addr, id := serve(c.server.PeerServerConfig())
			fx := newFetcher("cpu-a", &DataPlane{FetchTimeout: 5 * time.Second, Dial: func(a string) (*grpc.ClientConn, error) { return DialPeerTLS(a, c.client) }}, clk)
			defer fx.close()
			items := []*media.Item{refItem(1, frameOf(2, 2, 0), "gpu-a", addr, id)}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			err := fx.resolve(ctx, items)
			if c.ok {
				if err != nil || items[0].Frame.Pix[0] != 5 {
					t.Fatalf("fetch: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("fetched across a refused handshake")
			}
			if c.want != "" && !strings.Contains(err.Error(), c.want) {
				t.Errorf("err %v: want it to mention %q", err, c.want)
			}
		})
	}
}
