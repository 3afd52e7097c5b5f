package mqtt_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/packets"
	"github.com/eclipse/paho.golang/paho"
	pahov3 "github.com/eclipse/paho.mqtt.golang"

	"github.com/mdag/mdag/internal/brokertest"
	"github.com/mdag/mdag/outputs"
	"github.com/mdag/mdag/outputs/mqtt"
)

// got is a message a test subscriber received.
type got struct {
	topic    string
	id       string // from the body
	propID   string // MQTT 5 user property "id"
	ctype    string // MQTT 5 content type
	format   byte   // MQTT 5 payload format indicator
	retained bool
}

// rx collects what subscribers receive.
type rx struct {
	mu     sync.Mutex
	msgs   []got
	notify chan struct{} // closed and replaced on each message
}

func newRx() *rx { return &rx{notify: make(chan struct{})} }

func (r *rx) add(g got) {
	r.mu.Lock()
	r.msgs = append(r.msgs, g)
	close(r.notify)
	r.notify = make(chan struct{})
	r.mu.Unlock()
}

// waitFor waits until ok holds for what was received, at most d.
func (r *rx) waitFor(t *testing.T, d time.Duration, what string, ok func([]got) bool) []got {
	t.Helper()
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for {
		r.mu.Lock()
		msgs := append([]got(nil), r.msgs...)
		ch := r.notify
		r.mu.Unlock()
		if ok(msgs) {
			return msgs
		}
		select {
		case <-ch:
		case <-deadline.C:
			t.Fatalf("waiting %v for %s: received %d messages", d, what, len(msgs))
		}
	}
}

func bodyID(payload []byte) string {
	var b struct {
		ID string `json:"id"`
	}
	_ = json.Unmarshal(payload, &b)
	return b.ID
}

// subscribe connects a subscriber to topic filter at QoS 1 (clean false:
// a persistent session under clientID) and returns its closer.
func subscribe(t *testing.T, version int, url, clientID string, clean bool, filter string, r *rx, tlsCfg *tls.Config) func() {
	t.Helper()
	addr := strings.TrimPrefix(strings.TrimPrefix(url, "mqtt://"), "mqtts://")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if version == 3 {
		o := pahov3.NewClientOptions().AddBroker("tcp://" + addr).SetClientID(clientID).SetCleanSession(clean).
			SetProtocolVersion(4).SetAutoReconnect(false).
			SetDefaultPublishHandler(func(_ pahov3.Client, m pahov3.Message) {
				r.add(got{topic: m.Topic(), id: bodyID(m.Payload()), retained: m.Retained()})
			})
		c := pahov3.NewClient(o)
		if tok := c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
			t.Fatalf("subscriber connect: %v", tok.Error())
		}
		if tok := c.Subscribe(filter, 1, nil); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
			t.Fatalf("subscribe: %v", tok.Error())
		}
		return func() { c.Disconnect(0) }
	}
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c := paho.NewClient(paho.ClientConfig{
		ClientID: clientID,
		Conn:     packets.NewThreadSafeConn(nc),
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){func(pr paho.PublishReceived) (bool, error) {
			p := pr.Packet
			g := got{topic: p.Topic, id: bodyID(p.Payload), retained: p.Retain}
			if p.Properties != nil {
				g.propID = p.Properties.User.Get("id")
				g.ctype = p.Properties.ContentType
				if p.Properties.PayloadFormat != nil {
					g.format = *p.Properties.PayloadFormat
				}
			}
			r.add(g)
			return true, nil
		}},
	})
	cp := &paho.Connect{ClientID: clientID, KeepAlive: 30, CleanStart: clean}
	if !clean {
		exp := uint32(3600)
		cp.Properties = &paho.ConnectProperties{SessionExpiryInterval: &exp}
	}
	if _, err := c.Connect(ctx, cp); err != nil {
		t.Fatalf("subscriber connect: %v", err)
	}
	if _, err := c.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: filter, QoS: 1}}}); err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	return func() {
		_ = c.Disconnect(&paho.Disconnect{})
		<-c.Done()
	}
}

// batch makes n messages from number first, alternating two streams.
func batch(first, n int) []outputs.Message {
	var ms []outputs.Message
	for i := first; i < first+n; i++ {
		ms = append(ms, outputs.Message{
			ID:     fmt.Sprintf("m-%04d", i),
			App:    "actdet",
			Stream: []string{"cam/1", "cam#2"}[i%2],
			Kind:   "event",
			Body:   fmt.Appendf(nil, `{"id":"m-%04d","n":%d}`, i, i),
		})
	}
	return ms
}

func newTransport(t *testing.T, c mqtt.Config) *mqtt.Transport {
	t.Helper()
	tr, err := mqtt.New(c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	return tr
}

func send(t *testing.T, tr *mqtt.Transport, ms []outputs.Message) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n, err := tr.Send(ctx, ms)
	if err != nil || n != len(ms) {
		t.Fatalf("Send %d: acked %d, %v", len(ms), n, err)
	}
}

// firstOccurrence is the IDs in order of first arrival.
func firstOccurrence(msgs []got) []string {
	seen := map[string]bool{}
	var ids []string
	for _, m := range msgs {
		if !seen[m.id] {
			seen[m.id] = true
			ids = append(ids, m.id)
		}
	}
	return ids
}

func TestDeliverInOrder(t *testing.T) {
	for _, version := range []int{5, 3} {
		for _, qos0 := range []bool{false, true} {
			t.Run(fmt.Sprintf("v%d/qos%d", version, map[bool]int{false: 1, true: 0}[qos0]), func(t *testing.T) {
				b := brokertest.StartMosquitto(t, brokertest.MosquittoOptions{})
				r := newRx()
				defer subscribe(t, version, b.URL(), "sub", true, "mdag/#", r, nil)()
				tr := newTransport(t, mqtt.Config{URL: b.URL(), Version: version, QoS0: qos0})
				ms := batch(0, 200)
				ms[199].Kind, ms[199].Retain = "state", true
				send(t, tr, ms)
				msgs := r.waitFor(t, 10*time.Second, "200 messages", func(m []got) bool { return len(m) >= 200 })
				if len(msgs) != 200 {
					t.Fatalf("received %d messages, want 200", len(msgs))
				}
				for i, g := range msgs {
					m := ms[i]
					if g.id != m.ID {
						t.Fatalf("message %d: id %s, want %s (out of order)", i, g.id, m.ID)
					}
					if want := tr.Topic(m); g.topic != want {
						t.Errorf("message %s: topic %s, want %s", m.ID, g.topic, want)
					}
					if version == 5 && (g.propID != m.ID || g.ctype != "application/json" || g.format != 1) {
						t.Errorf("message %s: user property id %q, content type %q, format %d", m.ID, g.propID, g.ctype, g.format)
					}
				}
				if msgs[0].topic != "mdag/actdet/cam_1/event" || msgs[1].topic != "mdag/actdet/cam_2/event" {
					t.Errorf("topics %s, %s", msgs[0].topic, msgs[1].topic)
				}
				// a late subscriber gets the retained message
				late := newRx()
				defer subscribe(t, version, b.URL(), "late", true, "mdag/+/+/state", late, nil)()
				lm := late.waitFor(t, 5*time.Second, "the retained message", func(m []got) bool { return len(m) >= 1 })
				if lm[0].id != ms[199].ID || !lm[0].retained || lm[0].topic != "mdag/actdet/cam_2/state" {
					t.Errorf("late subscriber got %+v, want %s retained", lm[0], ms[199].ID)
				}
			})
		}
	}
}

func TestAuth(t *testing.T) {
	b := brokertest.StartMosquitto(t, brokertest.MosquittoOptions{Users: map[string]string{"mdag": "s3cret"}})
	for _, version := range []int{5, 3} {
		t.Run(fmt.Sprintf("v%d", version), func(t *testing.T) {
			bad := newTransport(t, mqtt.Config{URL: b.URL(), Version: version, Username: "mdag", Password: "wrong"})
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			n, err := bad.Send(ctx, batch(0, 1))
			if err == nil || n != 0 {
				t.Fatalf("wrong password: acked %d, %v", n, err)
			}
			if outputs.IsPermanent(err) {
				t.Errorf("refused connection is permanent: %v", err)
			}
			msg := err.Error()
			if !strings.Contains(msg, "refused the connection") || !(strings.Contains(msg, "not authorized") || strings.Contains(msg, "bad user name or password")) {
				t.Errorf("error does not name the reason: %v", err)
			}
			t.Logf("wrong password: %v", err)
			// the URL's user info works as credentials too
			u := strings.Replace(b.URL(), "mqtt://", "mqtt://mdag:s3cret@", 1)
			good := newTransport(t, mqtt.Config{URL: u, Version: version})
			if strings.Contains(good.Describe(), "s3cret") {
				t.Errorf("Describe shows the password: %s", good.Describe())
			}
			send(t, good, batch(0, 3))
		})
	}
}

func TestTLS(t *testing.T) {
	b := brokertest.StartMosquitto(t, brokertest.MosquittoOptions{TLS: true})
	wrongCA, _, _ := brokertest.NewCA(t, "not the broker's CA")
	wrong := x509.NewCertPool()
	wrong.AddCert(wrongCA)
	for _, version := range []int{5, 3} {
		t.Run(fmt.Sprintf("v%d", version), func(t *testing.T) {
			tr := newTransport(t, mqtt.Config{URL: b.TLSURL(), Version: version, TLS: b.TLSConfig()})
			send(t, tr, batch(0, 5))
			bad := newTransport(t, mqtt.Config{URL: b.TLSURL(), Version: version, TLS: &tls.Config{RootCAs: wrong}})
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			n, err := bad.Send(ctx, batch(0, 1))
			if err == nil || n != 0 || !strings.Contains(err.Error(), "certificate") {
				t.Fatalf("wrong CA: acked %d, %v; want a certificate error", n, err)
			}
		})
	}
}

func TestBrokerRestart(t *testing.T) {
	for _, version := range []int{5, 3} {
		t.Run(fmt.Sprintf("v%d", version), func(t *testing.T) {
			b := brokertest.StartMosquitto(t, brokertest.MosquittoOptions{})
			r := newRx()
			unsub := subscribe(t, version, b.URL(), "persistent-sub", false, "mdag/#", r, nil)
			tr := newTransport(t, mqtt.Config{URL: b.URL(), Version: version, ConnectTimeout: 2 * time.Second})
			ms := batch(0, 200)
			send(t, tr, ms[:100])
			r.waitFor(t, 10*time.Second, "the first 100", func(m []got) bool { return len(m) >= 100 })

			b.Stop()
			unsub()
			const bound = time.Second
			ctx, cancel := context.WithTimeout(context.Background(), bound)
			start := time.Now()
			n, err := tr.Send(ctx, ms[100:])
			took := time.Since(start)
			cancel()
			if err == nil || n >= 100 {
				t.Fatalf("Send with the broker down: acked %d, %v", n, err)
			}
			if took > bound+500*time.Millisecond {
				t.Errorf("Send with the broker down took %v, ctx bound %v", took, bound)
			}
			t.Logf("broker down: acked %d in %v: %v", n, took, err)

			b.Start()
			send(t, tr, ms[100+n:])
			defer subscribe(t, version, b.URL(), "persistent-sub", false, "mdag/#", r, nil)()
			msgs := r.waitFor(t, 10*time.Second, "all 200", func(m []got) bool { return len(firstOccurrence(m)) >= 200 })
			ids := firstOccurrence(msgs)
			for i, m := range ms {
				if ids[i] != m.ID {
					t.Fatalf("first occurrence %d is %s, want %s", i, ids[i], m.ID)
				}
			}
			if d := len(msgs) - 200; d > 0 {
				t.Logf("%d duplicates", d)
			}
		})
	}
}

// stallProxy forwards TCP to a broker; while stalled it drops what the
// broker sends (PUBACKs never arrive, the connection stays up).
type stallProxy struct {
	l       net.Listener
	stalled atomic.Bool
	wg      sync.WaitGroup
	mu      sync.Mutex
	conns   []net.Conn
}

func newStallProxy(t *testing.T, target string) *stallProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &stallProxy{l: l}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, up)
			p.mu.Unlock()
			p.wg.Add(2)
			go func() {
				defer p.wg.Done()
				defer up.Close()
				buf := make([]byte, 32<<10)
				for {
					n, err := c.Read(buf)
					if n > 0 {
						if _, werr := up.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
			go func() {
				defer p.wg.Done()
				defer c.Close()
				buf := make([]byte, 32<<10)
				for {
					n, err := up.Read(buf)
					if n > 0 && !p.stalled.Load() {
						if _, werr := c.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

// TestStalledBroker: a broker that stops answering (no PUBACK, the
// connection up) does not hold Send past its context; the next Send
// connects again.
func TestStalledBroker(t *testing.T) {
	for _, version := range []int{5, 3} {
		t.Run(fmt.Sprintf("v%d", version), func(t *testing.T) {
			b := brokertest.StartMosquitto(t, brokertest.MosquittoOptions{})
			p := newStallProxy(t, b.Addr())
			tr := newTransport(t, mqtt.Config{URL: "mqtt://" + p.l.Addr().String(), Version: version})
			send(t, tr, batch(0, 10))
			p.stalled.Store(true)
			const bound = 500 * time.Millisecond
			ctx, cancel := context.WithTimeout(context.Background(), bound)
			start := time.Now()
			n, err := tr.Send(ctx, batch(10, 20))
			took := time.Since(start)
			cancel()
			if err == nil || n != 0 || took > bound+500*time.Millisecond {
				t.Fatalf("stalled broker: acked %d in %v, %v; want 0 and an error within %v", n, took, err, bound)
			}
			p.stalled.Store(false)
			send(t, tr, batch(10, 20))
		})
	}
}

func TestPacketTooLargeIsPermanent(t *testing.T) {
	b := brokertest.StartMosquitto(t, brokertest.MosquittoOptions{MessageSizeLimit: 1000})
	tr := newTransport(t, mqtt.Config{URL: b.URL()})
	ms := batch(0, 3)
	ms[1].Body = fmt.Appendf(nil, `{"id":%q,"pad":%q}`, ms[1].ID, strings.Repeat("x", 2000))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n, err := tr.Send(ctx, ms)
	if n != 1 || !outputs.IsPermanent(err) || !strings.Contains(err.Error(), "0x95") {
		t.Fatalf("oversize message: acked %d, %v; want 1 and a permanent packet-too-large error", n, err)
	}
	send(t, tr, ms[2:]) // the connection is still good
}

func TestTopic(t *testing.T) {
	for _, c := range []struct {
		tpl, app, stream, kind, want string
	}{
		{"", "actdet", "cam1", "event", "mdag/actdet/cam1/event"},
		{"", "a/b", "c+d", "e#f", "mdag/a_b/c_d/e_f"},
		{"", "nul\x00", "", "frame", "mdag/nul_//frame"},
		{"site/{stream}/{app}-{kind}", "app", "st", "counts", "site/st/app-counts"},
		{"fixed", "a", "b", "c", "fixed"},
		{"{kind}{kind}", "a", "b", "x/y", "x_yx_y"},
	} {
		tr, err := mqtt.New(mqtt.Config{URL: "mqtt://broker", Topic: c.tpl})
		if err != nil {
			t.Fatal(err)
		}
		got := tr.Topic(outputs.Message{App: c.app, Stream: c.stream, Kind: c.kind})
		if got != c.want {
			t.Errorf("template %q, %q %q %q: %q, want %q", c.tpl, c.app, c.stream, c.kind, got, c.want)
		}
	}
	if got := mqtt.Sanitize("a/+#\x00b"); got != "a____b" {
		t.Errorf("Sanitize: %q", got)
	}
}

func TestConfig(t *testing.T) {
	for _, c := range []struct {
		c    mqtt.Config
		want string // in the error; "" for none
	}{
		{mqtt.Config{URL: "mqtt://broker:1883"}, ""},
		{mqtt.Config{URL: "mqtts://broker", Version: 3, QoS: 1}, ""},
		{mqtt.Config{URL: "mqtt://broker", QoS0: true}, ""},
		{mqtt.Config{URL: "http://broker"}, "scheme"},
		{mqtt.Config{URL: "broker:1883"}, "scheme"},
		{mqtt.Config{URL: "mqtt://"}, "no host"},
		{mqtt.Config{URL: "mqtt://broker/topic"}, "no path"},
		{mqtt.Config{URL: "mqtt://broker", Version: 4}, ""},
		{mqtt.Config{URL: "mqtt://broker", Version: 2}, "version"},
		{mqtt.Config{URL: "mqtt://broker", QoS: 2}, "QoS 2"},
		{mqtt.Config{URL: "mqtt://broker", Topic: "a/{app}/{camera}"}, "unknown placeholder {camera}"},
		{mqtt.Config{URL: "mqtt://broker", Topic: "a/{app"}, "without '}'"},
		{mqtt.Config{URL: "mqtt://broker", Topic: "a/app}"}, "without '{'"},
		{mqtt.Config{URL: "mqtt://broker", Topic: "a/+/{app}"}, "wildcards"},
		{mqtt.Config{URL: "mqtt://broker", Topic: "a/#"}, "wildcards"},
		{mqtt.Config{URL: "mqtt://broker", KeepAlive: -time.Second}, "keep-alive"},
	} {
		_, err := mqtt.New(c.c)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%+v: %v", c.c, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%+v: error %v, want one containing %q", c.c, err, c.want)
		}
	}
	for _, c := range []struct {
		c    mqtt.Config
		want string
	}{
		{mqtt.Config{URL: "mqtt://u:p@broker"}, "mqtt://broker:1883 (MQTT 5, QoS 1, topic mdag/{app}/{stream}/{kind})"},
		{mqtt.Config{URL: "mqtts://broker:9883", Version: 3, QoS0: true, Topic: "x/{app}"}, "mqtts://broker:9883 (MQTT 3.1.1, QoS 0, topic x/{app})"},
	} {
		tr, err := mqtt.New(c.c)
		if err != nil {
			t.Fatal(err)
		}
		if got := tr.Describe(); got != c.want {
			t.Errorf("Describe: %q, want %q", got, c.want)
		}
	}
}

// TestNoGoroutineLeak: after sending, a lost connection, a reconnection
// and Close, the goroutine count returns to where it was.
func TestNoGoroutineLeak(t *testing.T) {
	for _, version := range []int{5, 3} {
		t.Run(fmt.Sprintf("v%d", version), func(t *testing.T) {
			b := brokertest.StartMosquitto(t, brokertest.MosquittoOptions{})
			base := runtime.NumGoroutine()
			tr, err := mqtt.New(mqtt.Config{URL: b.URL(), Version: version, ConnectTimeout: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			send(t, tr, batch(0, 50))
			b.Stop()
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			if _, err := tr.Send(ctx, batch(50, 10)); err == nil {
				t.Error("Send with the broker down succeeded")
			}
			cancel()
			b.Start()
			send(t, tr, batch(50, 10))
			tr.Close()
			waitGoroutines(t, base)
		})
	}
}

func waitGoroutines(t *testing.T, base int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > base {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines after Close, %d before:\n%s", runtime.NumGoroutine(), base, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond)
	}
}
