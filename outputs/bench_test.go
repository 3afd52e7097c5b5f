package outputs_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/packets"
	"github.com/eclipse/paho.golang/paho"
	natsgo "github.com/nats-io/nats.go"

	"github.com/mdag/mdag/internal/brokertest"
	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/media"
	"github.com/mdag/mdag/outputs"
	"github.com/mdag/mdag/outputs/mqtt"
	"github.com/mdag/mdag/outputs/nats"
	"github.com/mdag/mdag/outputs/spool"
	"github.com/mdag/mdag/outputs/webhook"
)

// The outputs' benchmarks (docs/benchmarks.md): each sub-benchmark runs a
// hub with one output to a real destination (mosquitto, nats-server, an
// HTTP receiver on this host), every message through the on-disk spool.
//   throughput: b.N events added at once; msgs/s = acknowledged by the
//     destination over the time from the first Add to the last ack.
//   latency: 300 events paced 5 ms apart; latency_p50_ms, latency_p99_ms =
//     capture time (the frame's) to arrival at a subscriber (the
//     receiver), with the pipeline's own latency set to 0.

type arrivals struct {
	mu  sync.Mutex
	lat []time.Duration
	n   int
}

func (a *arrivals) add(payload []byte) {
	var b outputs.Body
	if json.Unmarshal(payload, &b) != nil {
		return
	}
	d := time.Since(b.Capture)
	a.mu.Lock()
	a.lat = append(a.lat, d)
	a.n++
	a.mu.Unlock()
}

func (a *arrivals) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.n
}

func (a *arrivals) quantile(q float64) float64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	s := slices.Clone(a.lat)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return float64(s[int(q*float64(len(s)-1))]) / float64(time.Millisecond)
}

func benchHub(b *testing.B, tr outputs.Transport) *outputs.Hub {
	sp, err := spool.Open(spool.Options{Dir: b.TempDir(), MaxBytes: 1 << 30})
	if err != nil {
		b.Fatal(err)
	}
	h, err := outputs.Start(outputs.Config{App: "bench", Clock: clock.Real{}, Queue: 1 << 20,
		Outputs: []outputs.Output{{Name: "o", Kinds: []string{outputs.KindEvent}, Transport: tr, Spool: sp}}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(h.Close)
	return h
}

func event(i int) outputs.Result {
	return outputs.Result{App: "bench", Stream: "cam", Seq: uint64(i), Outcome: "finished", Finished: time.Now(),
		Events: []media.Event{{Kind: "line-cross", Rule: "gate", Track: uint64(i)}}}
}

func waitAcked(b *testing.B, h *outputs.Hub, n int) {
	end := time.Now().Add(2 * time.Minute)
	for h.Status()[0].Published < uint64(n) {
		if time.Now().After(end) {
			b.Fatalf("%d of %d acknowledged after 2 minutes: %+v", h.Status()[0].Published, n, h.Status()[0])
		}
		time.Sleep(time.Millisecond)
	}
}

// run is the throughput and latency sub-benchmarks of one destination;
// newTr makes a transport, got counts what the subscriber received.
func run(b *testing.B, newTr func() outputs.Transport, got *arrivals) {
	b.Run("throughput", func(b *testing.B) {
		h := benchHub(b, newTr())
		b.ResetTimer()
		start := time.Now()
		for i := range b.N {
			h.Add(event(i))
		}
		waitAcked(b, h, b.N)
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
	})
	b.Run("latency", func(b *testing.B) {
		for range b.N {
			h := benchHub(b, newTr())
			*got = arrivals{}
			const n = 300
			for i := range n {
				h.Add(event(i))
				time.Sleep(5 * time.Millisecond) // a paced source: delivery latency, not queueing
			}
			waitAcked(b, h, n)
			for end := time.Now().Add(10 * time.Second); got.count() < n && time.Now().Before(end); {
				time.Sleep(time.Millisecond)
			}
			h.Close()
		}
		b.ReportMetric(got.quantile(0.5), "latency_p50_ms")
		b.ReportMetric(got.quantile(0.99), "latency_p99_ms")
	})
}

func BenchmarkMQTT(b *testing.B) {
	br := brokertest.StartMosquitto(b, brokertest.MosquittoOptions{Extra: []string{"set_tcp_nodelay true"}})
	got := &arrivals{}
	nc, err := net.Dial("tcp", br.Addr())
	if err != nil {
		b.Fatal(err)
	}
	c := paho.NewClient(paho.ClientConfig{ClientID: "bench-sub", Conn: packets.NewThreadSafeConn(nc),
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){func(pr paho.PublishReceived) (bool, error) {
			got.add(pr.Packet.Payload)
			return true, nil
		}}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Connect(ctx, &paho.Connect{ClientID: "bench-sub", KeepAlive: 30, CleanStart: true}); err != nil {
		b.Fatal(err)
	}
	if _, err := c.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: "mdag/#", QoS: 1}}}); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = c.Disconnect(&paho.Disconnect{}) }()
	run(b, func() outputs.Transport {
		tr, err := mqtt.New(mqtt.Config{URL: br.URL()})
		if err != nil {
			b.Fatal(err)
		}
		return tr
	}, got)
}

func BenchmarkNATS(b *testing.B) {
	br := brokertest.StartNATS(b, brokertest.NATSOptions{})
	got := &arrivals{}
	nc, err := natsgo.Connect(br.URL())
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	if _, err := nc.Subscribe("mdag.>", func(m *natsgo.Msg) { got.add(m.Data) }); err != nil {
		b.Fatal(err)
	}
	_ = nc.Flush()
	run(b, func() outputs.Transport {
		tr, err := nats.New(nats.Config{URL: br.URL()})
		if err != nil {
			b.Fatal(err)
		}
		return tr
	}, got)
}

func BenchmarkWebhook(b *testing.B) {
	got := &arrivals{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		got.add(body)
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	run(b, func() outputs.Transport {
		tr, err := webhook.New(webhook.Config{URL: srv.URL, Secret: []byte("k")})
		if err != nil {
			b.Fatal(err)
		}
		return tr
	}, got)
}
