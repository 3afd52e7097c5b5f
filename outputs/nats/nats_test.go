package nats_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mdag/mdag/internal/brokertest"
	"github.com/mdag/mdag/outputs"
	"github.com/mdag/mdag/outputs/nats"
)

// batch makes n messages from number first, alternating two streams.
func batch(first, n int) []outputs.Message {
	var ms []outputs.Message
	for i := first; i < first+n; i++ {
		ms = append(ms, outputs.Message{
			ID:     fmt.Sprintf("m-%04d", i),
			App:    "actdet",
			Stream: []string{"cam.1", "cam 2"}[i%2],
			Kind:   "event",
			Body:   fmt.Appendf(nil, `{"id":"m-%04d","n":%d}`, i, i),
		})
	}
	return ms
}

func newTransport(t *testing.T, c nats.Config) *nats.Transport {
	t.Helper()
	tr, err := nats.New(c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	return tr
}

func send(t *testing.T, tr *nats.Transport, ms []outputs.Message) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n, err := tr.Send(ctx, ms)
	if err != nil || n != len(ms) {
		t.Fatalf("Send %d: acked %d, %v", len(ms), n, err)
	}
}

// rx collects what a core subscriber receives.
type rx struct {
	mu     sync.Mutex
	msgs   []*natsgo.Msg
	notify chan struct{}
}

func (r *rx) add(m *natsgo.Msg) {
	r.mu.Lock()
	r.msgs = append(r.msgs, m)
	close(r.notify)
	r.notify = make(chan struct{})
	r.mu.Unlock()
}

func (r *rx) waitFor(t *testing.T, n int) []*natsgo.Msg {
	t.Helper()
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
	for {
		r.mu.Lock()
		msgs, ch := append([]*natsgo.Msg(nil), r.msgs...), r.notify
		r.mu.Unlock()
		if len(msgs) >= n {
			return msgs
		}
		select {
		case <-ch:
		case <-deadline.C:
			t.Fatalf("received %d messages, want %d", len(msgs), n)
		}
	}
}

// subscribe subscribes a core NATS connection to mdag.>; reconnected
// receives a value each time it reconnects.
func subscribe(t *testing.T, url string) (r *rx, nc *natsgo.Conn, reconnected chan struct{}) {
	t.Helper()
	r = &rx{notify: make(chan struct{})}
	reconnected = make(chan struct{}, 1)
	nc, err := natsgo.Connect(url, natsgo.MaxReconnects(-1), natsgo.ReconnectWait(100*time.Millisecond),
		natsgo.ReconnectHandler(func(*natsgo.Conn) {
			select {
			case reconnected <- struct{}{}:
			default:
			}
		}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	if _, err := nc.Subscribe("mdag.>", r.add); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return r, nc, reconnected
}

// makeStream creates the stream MDAG capturing mdag.>.
func makeStream(t *testing.T, url string) jetstream.Stream {
	t.Helper()
	nc, err := natsgo.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "MDAG", Subjects: []string{"mdag.>"}, Storage: jetstream.FileStorage})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func streamMsgs(t *testing.T, s jetstream.Stream) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

// storedIDs reads the stream's messages' Nats-Msg-Id headers in order.
func storedIDs(t *testing.T, s jetstream.Stream, n uint64) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var ids []string
	for seq := uint64(1); seq <= n; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, m.Header.Get("Nats-Msg-Id"))
	}
	return ids
}

func TestCoreInOrder(t *testing.T) {
	b := brokertest.StartNATS(t, brokertest.NATSOptions{})
	r, _, _ := subscribe(t, b.URL())
	tr := newTransport(t, nats.Config{URL: b.URL()})
	ms := batch(0, 200)
	send(t, tr, ms)
	msgs := r.waitFor(t, 200)
	for i, m := range msgs {
		if id := m.Header.Get("Nats-Msg-Id"); id != ms[i].ID {
			t.Fatalf("message %d: Nats-Msg-Id %s, want %s", i, id, ms[i].ID)
		}
		if m.Subject != tr.Subject(ms[i]) || m.Header.Get("Content-Type") != "application/json" || string(m.Data) != string(ms[i].Body) {
			t.Errorf("message %d: subject %s, headers %v, data %s", i, m.Subject, m.Header, m.Data)
		}
	}
	if msgs[0].Subject != "mdag.actdet.cam_1.event" || msgs[1].Subject != "mdag.actdet.cam_2.event" {
		t.Errorf("subjects %s, %s", msgs[0].Subject, msgs[1].Subject)
	}
}

func TestJetStreamDedup(t *testing.T) {
	b := brokertest.StartNATS(t, brokertest.NATSOptions{JetStream: true})
	s := makeStream(t, b.URL())
	tr := newTransport(t, nats.Config{URL: b.URL(), JetStream: true})
	ms := batch(0, 200)
	send(t, tr, ms)
	if n := streamMsgs(t, s); n != 200 {
		t.Fatalf("stream holds %d messages, want 200", n)
	}
	send(t, tr, ms[10:12]) // sent again, same IDs
	send(t, tr, []outputs.Message{ms[199], ms[199]})
	if n := streamMsgs(t, s); n != 200 {
		t.Fatalf("after resending: stream holds %d messages, want 200 (dropped by Nats-Msg-Id)", n)
	}
	ids := storedIDs(t, s, 200)
	for i, m := range ms {
		if ids[i] != m.ID {
			t.Fatalf("stored message %d is %s, want %s", i+1, ids[i], m.ID)
		}
	}
}

func TestJetStreamNoStream(t *testing.T) {
	b := brokertest.StartNATS(t, brokertest.NATSOptions{JetStream: true})
	tr := newTransport(t, nats.Config{URL: b.URL(), JetStream: true})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n, err := tr.Send(ctx, batch(0, 3))
	if n != 0 || err == nil || !strings.Contains(err.Error(), "create a stream") || outputs.IsPermanent(err) {
		t.Fatalf("no stream: acked %d, %v; want an error saying to create a stream", n, err)
	}
}

func TestRestart(t *testing.T) {
	for _, js := range []bool{false, true} {
		t.Run(map[bool]string{false: "core", true: "jetstream"}[js], func(t *testing.T) {
			b := brokertest.StartNATS(t, brokertest.NATSOptions{JetStream: js})
			var s jetstream.Stream
			var r *rx
			var sub *natsgo.Conn
			var reconnected chan struct{}
			if js {
				s = makeStream(t, b.URL())
			} else {
				r, sub, reconnected = subscribe(t, b.URL())
			}
			tr := newTransport(t, nats.Config{URL: b.URL(), JetStream: js})
			ms := batch(0, 200)
			send(t, tr, ms[:100])

			b.Stop()
			const bound = time.Second
			ctx, cancel := context.WithTimeout(context.Background(), bound)
			start := time.Now()
			n, err := tr.Send(ctx, ms[100:])
			took := time.Since(start)
			cancel()
			if err == nil || n >= 100 {
				t.Fatalf("Send with the server down: acked %d, %v", n, err)
			}
			if took > bound+500*time.Millisecond {
				t.Errorf("Send with the server down took %v, ctx bound %v", took, bound)
			}
			t.Logf("server down: acked %d in %v: %v", n, took, err)

			b.Start()
			if !js {
				// core NATS keeps nothing: the subscriber must be back first
				select {
				case <-reconnected:
				case <-time.After(10 * time.Second):
					t.Fatal("subscriber did not reconnect")
				}
				if err := sub.Flush(); err != nil {
					t.Fatal(err)
				}
			}
			send(t, tr, ms[100+n:])
			if js {
				if got := streamMsgs(t, s); got != 200 {
					t.Fatalf("stream holds %d messages after the restart, want 200", got)
				}
				ids := storedIDs(t, s, 200)
				for i, m := range ms {
					if ids[i] != m.ID {
						t.Fatalf("stored message %d is %s, want %s", i+1, ids[i], m.ID)
					}
				}
				return
			}
			msgs := r.waitFor(t, 200)
			seen := map[string]bool{}
			var ids []string
			for _, m := range msgs {
				if id := m.Header.Get("Nats-Msg-Id"); !seen[id] {
					seen[id] = true
					ids = append(ids, id)
				}
			}
			for i, m := range ms {
				if ids[i] != m.ID {
					t.Fatalf("first occurrence %d is %s, want %s", i, ids[i], m.ID)
				}
			}
		})
	}
}

func TestAuthAndTLS(t *testing.T) {
	t.Run("token", func(t *testing.T) {
		b := brokertest.StartNATS(t, brokertest.NATSOptions{Token: "t0ken"})
		bad := newTransport(t, nats.Config{URL: b.URL(), Token: "wrong"})
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if n, err := bad.Send(ctx, batch(0, 1)); err == nil || n != 0 || !strings.Contains(strings.ToLower(err.Error()), "authorization") {
			t.Errorf("wrong token: acked %d, %v", n, err)
		}
		send(t, newTransport(t, nats.Config{URL: b.URL(), Token: "t0ken"}), batch(0, 2))
	})
	t.Run("user", func(t *testing.T) {
		b := brokertest.StartNATS(t, brokertest.NATSOptions{User: "mdag", Password: "s3cret"})
		bad := newTransport(t, nats.Config{URL: b.URL(), Username: "mdag", Password: "wrong"})
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if n, err := bad.Send(ctx, batch(0, 1)); err == nil || n != 0 {
			t.Errorf("wrong password: acked %d, %v", n, err)
		}
		good := newTransport(t, nats.Config{URL: b.URL(), Username: "mdag", Password: "s3cret"})
		send(t, good, batch(0, 2))
	})
	t.Run("tls", func(t *testing.T) {
		b := brokertest.StartNATS(t, brokertest.NATSOptions{TLS: true})
		send(t, newTransport(t, nats.Config{URL: b.URL(), TLS: b.TLSConfig()}), batch(0, 2))
		wrongCA, _, _ := brokertest.NewCA(t, "not the server's CA")
		pool := x509.NewCertPool()
		pool.AddCert(wrongCA)
		bad := newTransport(t, nats.Config{URL: b.URL(), TLS: &tls.Config{RootCAs: pool}})
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if n, err := bad.Send(ctx, batch(0, 1)); err == nil || n != 0 || !strings.Contains(err.Error(), "certificate") {
			t.Errorf("wrong CA: acked %d, %v; want a certificate error", n, err)
		}
	})
}

func TestSubject(t *testing.T) {
	for _, c := range []struct {
		tpl, app, stream, kind, want string
	}{
		{"", "actdet", "cam1", "event", "mdag.actdet.cam1.event"},
		{"", "a.b", "c*d", "e>f", "mdag.a_b.c_d.e_f"},
		{"", "tab\there", "new\nline", "nul\x00", "mdag.tab_here.new_line.nul_"},
		{"", "", "sp ace", "frame", "mdag._.sp_ace.frame"},
		{"site.{stream}.{app}-{kind}", "app", "st", "counts", "site.st.app-counts"},
		{"fixed", "a", "b", "c", "fixed"},
	} {
		tr, err := nats.New(nats.Config{URL: "nats://server", Subject: c.tpl})
		if err != nil {
			t.Fatal(err)
		}
		got := tr.Subject(outputs.Message{App: c.app, Stream: c.stream, Kind: c.kind})
		if got != c.want {
			t.Errorf("template %q, %q %q %q: %q, want %q", c.tpl, c.app, c.stream, c.kind, got, c.want)
		}
	}
}

func TestConfig(t *testing.T) {
	for _, c := range []struct {
		c    nats.Config
		want string
	}{
		{nats.Config{URL: "nats://server:4222"}, ""},
		{nats.Config{URL: "tls://server:4222, nats://other:4222", JetStream: true}, ""},
		{nats.Config{}, "no url"},
		{nats.Config{URL: "http://server"}, "scheme"},
		{nats.Config{URL: "nats://"}, "no host"},
		{nats.Config{URL: "nats://server/x"}, "no path"},
		{nats.Config{URL: "nats://server", Token: "t", Username: "u"}, "not both"},
		{nats.Config{URL: "nats://server", Subject: "a.{app}.{camera}"}, "unknown placeholder {camera}"},
		{nats.Config{URL: "nats://server", Subject: "a.{app"}, "without '}'"},
		{nats.Config{URL: "nats://server", Subject: "a.*.{app}"}, "wildcards"},
		{nats.Config{URL: "nats://server", Subject: "a.>"}, "wildcards"},
		{nats.Config{URL: "nats://server", Subject: "a b"}, "whitespace"},
		{nats.Config{URL: "nats://server", Subject: "a..{app}"}, "empty token"},
		{nats.Config{URL: "nats://server", ConnectTimeout: -1}, "negative"},
	} {
		_, err := nats.New(c.c)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%+v: %v", c.c, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%+v: error %v, want one containing %q", c.c, err, c.want)
		}
	}
	tr, err := nats.New(nats.Config{URL: "nats://u:p@server:4222", JetStream: true})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := tr.Describe(), "nats://server:4222 (JetStream, subject mdag.{app}.{stream}.{kind})"; got != want {
		t.Errorf("Describe: %q, want %q", got, want)
	}
}

func TestNoGoroutineLeak(t *testing.T) {
	for _, js := range []bool{false, true} {
		t.Run(map[bool]string{false: "core", true: "jetstream"}[js], func(t *testing.T) {
			b := brokertest.StartNATS(t, brokertest.NATSOptions{JetStream: js})
			if js {
				makeStream(t, b.URL())
			}
			base := runtime.NumGoroutine()
			tr, err := nats.New(nats.Config{URL: b.URL(), JetStream: js})
			if err != nil {
				t.Fatal(err)
			}
			send(t, tr, batch(0, 50))
			b.Stop()
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			if _, err := tr.Send(ctx, batch(50, 10)); err == nil {
				t.Error("Send with the server down succeeded")
			}
			cancel()
			b.Start()
			send(t, tr, batch(50, 10))
			tr.Close()
			deadline := time.Now().Add(5 * time.Second)
			for runtime.NumGoroutine() > base {
				if time.Now().After(deadline) {
					buf := make([]byte, 1<<20)
					t.Fatalf("%d goroutines after Close, %d before:\n%s", runtime.NumGoroutine(), base, buf[:runtime.Stack(buf, true)])
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
}
