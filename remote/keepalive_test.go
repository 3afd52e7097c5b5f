package remote

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/mdag/mdag/remote/client"
)

// blackhole forwards TCP connections to target until cut is called; from
// then on it neither reads nor writes, and keeps every connection open: a
// half-open network path (a cable pulled, a NAT that forgot the flow).
type blackhole struct {
	ln    net.Listener
	once  sync.Once
	cut   chan struct{}
	mu    sync.Mutex
	conns []net.Conn
}

func newBlackhole(t *testing.T, target string) *blackhole {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &blackhole{ln: ln, cut: make(chan struct{})}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			b.mu.Lock()
			b.conns = append(b.conns, c, s)
			b.mu.Unlock()
			go b.pipe(c, s)
			go b.pipe(s, c)
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		b.mu.Lock()
		for _, c := range b.conns {
			c.Close()
		}
		b.mu.Unlock()
	})
	return b
}

func (b *blackhole) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		select {
		case <-b.cut:
			return // nothing more crosses; the connections stay open
		default:
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (b *blackhole) stop() { b.once.Do(func() { close(b.cut) }) }

// TestWorkerKeepalive: a worker whose connection to the coordinator goes
// silent without closing (half-open) ends its session within its
// keepalive's time and timeout (it then stops the cameras it reads, and
// reconnects), rather than after TCP's quarter of an hour.
func TestWorkerKeepalive(t *testing.T) {
	if testing.Short() {
		t.Skip("waits ~25 s for a keepalive to fail")
	}
	app, prof := loadExample(t, "traffic")
	c := startServer(t, app, prof, &Server{Heartbeat: 100 * time.Millisecond})
	b := newBlackhole(t, c.addr)
	cc, err := client.Dial(b.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ended := make(chan error, 1)
	go func() { ended <- client.RunWorker(ctx, cc, client.WorkerConfig{ID: "w1", Type: "CPU"}) }()
	waitFor(t, "the worker registered", 20*time.Second, func() bool { return len(c.srv.Workers()) == 1 })
	b.stop()
	at := time.Now()
	limit := client.KeepaliveTime + client.KeepaliveTimeout + 20*time.Second // a loaded machine
	select {
	case err := <-ended:
		t.Logf("the session ended %v after the cut: %v", time.Since(at).Round(time.Second), err)
		if err == nil {
			t.Error("the session ended without an error")
		}
	case <-time.After(limit):
		t.Fatalf("the worker's session outlived a silent coordinator by %v", limit)
	}
}
