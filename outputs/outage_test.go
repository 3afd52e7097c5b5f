package outputs_test

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/packets"
	"github.com/eclipse/paho.golang/paho"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/mdag/mdag/internal/brokertest"
	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/media"
	"github.com/mdag/mdag/outputs"
	"github.com/mdag/mdag/outputs/mqtt"
	"github.com/mdag/mdag/outputs/nats"
	"github.com/mdag/mdag/outputs/spool"
)

// outage is how long the broker is down mid-run (the 30 s;
// MDAG_OUTAGE shortens it for a quick local run).
func outage(t *testing.T) time.Duration {
	if s := os.Getenv("MDAG_OUTAGE"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("MDAG_OUTAGE: %v", err)
		}
		return d
	}
	return 30 * time.Second
}

// arrived is what a subscriber got: each message's id and frame number,
// in arrival order.
type arrived struct {
	mu   sync.Mutex
	ids  []string
	seqs []uint64
	bad  []string
}

func (a *arrived) add(t *testing.T, schema *jsonschema.Schema, payload []byte) {
	var b outputs.Body
	err := json.Unmarshal(payload, &b)
	if err == nil {
		var doc any
		if doc, err = jsonschema.UnmarshalJSON(strings.NewReader(string(payload))); err == nil {
			err = schema.Validate(doc)
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if err != nil {
		a.bad = append(a.bad, err.Error())
		return
	}
	a.ids, a.seqs = append(a.ids, b.ID), append(a.seqs, b.Seq)
}

// check: every frame 0..n-1 arrived, first arrivals in order, and a
// frame that arrived twice had the same id both times.
func (a *arrived) check(t *testing.T, n int) {
	t.Helper()
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.bad) > 0 {
		t.Fatalf("%d messages not of the schema, the first: %s", len(a.bad), a.bad[0])
	}
	first := map[uint64]string{}
	next, dups := uint64(0), 0
	for i, s := range a.seqs {
		if id, seen := first[s]; seen {
			dups++
			if id != a.ids[i] {
				t.Fatalf("frame %d arrived twice with ids %s and %s: a duplicate must keep its id", s, id, a.ids[i])
			}
			continue
		}
		if s != next {
			t.Fatalf("frame %d arrived first after frame %d: out of order or one lost", s, next-1)
		}
		first[s] = a.ids[i]
		next++
	}
	if next != uint64(n) {
		t.Fatalf("%d of %d events arrived", next, n)
	}
	t.Logf("%d events arrived in order, %d duplicates (same id)", n, dups)
}

func (a *arrived) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.seqs)
}

func loadSchema(t *testing.T) *jsonschema.Schema {
	t.Helper()
	c := jsonschema.NewCompiler()
	s, err := c.Compile("../docs/outputs.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// runOutage produces an event every 50 ms into a hub whose output is tr,
// stops the broker for outage(t) mid-run and starts it again: the spool's
// figures say the output is down and what waits; once it is back the
// spool drains. It returns how many events were produced.
func runOutage(t *testing.T, b *brokertest.Broker, tr outputs.Transport) (int, outputs.Status) {
	t.Helper()
	sp, err := spool.Open(spool.Options{Dir: t.TempDir(), MaxBytes: 64 << 20, MaxAge: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	h, err := outputs.Start(outputs.Config{App: "lot", Clock: clock.Real{}, BackoffMax: time.Second,
		Outputs: []outputs.Output{{Name: "o", Kinds: []string{outputs.KindEvent}, Transport: tr, Spool: sp}}})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	n := 0
	produce := func(d time.Duration) {
		for end := time.Now().Add(d); time.Now().Before(end); n++ {
			now := time.Now()
			h.Add(outputs.Result{App: "lot", Stream: "gate-1", Seq: uint64(n), Outcome: "finished", Finished: now, Latency: 30 * time.Millisecond,
				Events: []media.Event{{Kind: "line-cross", Rule: "gate", Track: uint64(n % 7)}}})
			time.Sleep(50 * time.Millisecond) // the camera's pace
		}
	}
	produce(2 * time.Second)
	waitFor(t, "the first events delivered", func() bool { return h.Status()[0].Published > 0 })
	b.Stop()
	produce(outage(t))
	down := h.Status()[0]
	if down.Connected || down.Waiting == 0 || down.Retried == 0 || down.DownSince.IsZero() || down.LagSeconds <= 0 {
		t.Errorf("while the broker is down the status says %+v: want down, with messages waiting and retries", down)
	}
	t.Logf("after %v down: %d waiting (%d bytes, lag %.1f s), %d retries, last error %q", outage(t), down.Waiting, down.SpoolBytes, down.LagSeconds, down.Retried, down.LastError)
	b.Start()
	produce(2 * time.Second)
	waitFor(t, "the spool drained", func() bool { st := h.Status()[0]; return st.Waiting == 0 && st.Connected })
	st := h.Status()[0]
	if st.Published < uint64(n) || st.Dropped() != 0 {
		t.Errorf("status %+v: want all %d published, none dropped", st, n)
	}
	return n, st
}

// TestOutageMQTT: events through a real mosquitto (MQTT 5, QoS 1, a
// persistent subscriber session) arrive in order and of the schema;
// after the broker is stopped for 30 s and started again, every event
// produced meanwhile arrives (duplicates only with the same id).
func TestOutageMQTT(t *testing.T) {
	t.Parallel()
	b := brokertest.StartMosquitto(t, brokertest.MosquittoOptions{})
	schema := loadSchema(t)
	got := &arrived{}
	stop := subscribeMQTT(t, b.Addr(), got, schema)
	tr, err := mqtt.New(mqtt.Config{URL: b.URL(), ClientID: "mdag-outage"})
	if err != nil {
		t.Fatal(err)
	}
	n, _ := runOutage(t, b, tr)
	stop()
	// the subscriber's session kept what came while it was away
	stop = subscribeMQTT(t, b.Addr(), got, schema)
	defer stop()
	waitFor(t, "every event at the subscriber", func() bool { return got.count() >= n })
	got.check(t, n)
}

// TestOutageNATS: the same through a real nats-server with JetStream (a
// file stream that survives the restart): every event is stored once
// (JetStream de-duplicates by Nats-Msg-Id), in order.
func TestOutageNATS(t *testing.T) {
	t.Parallel()
	b := brokertest.StartNATS(t, brokertest.NATSOptions{JetStream: true})
	schema := loadSchema(t)
	nc, err := natsgo.Connect(b.URL())
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "MDAG", Subjects: []string{"mdag.>"}, Storage: jetstream.FileStorage, Duplicates: 10 * time.Minute}); err != nil {
		t.Fatal(err)
	}
	cancel()
	nc.Close()
	tr, err := nats.New(nats.Config{URL: b.URL(), JetStream: true})
	if err != nil {
		t.Fatal(err)
	}
	n, _ := runOutage(t, b, tr)
	nc, err = natsgo.Connect(b.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ = jetstream.New(nc)
	ctx, cancel = context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, "MDAG")
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := &arrived{}
	for seq := uint64(1); seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatalf("stream message %d: %v", seq, err)
		}
		if m.Subject != "mdag.lot.gate-1.event" {
			t.Errorf("subject %q", m.Subject)
		}
		got.add(t, schema, m.Data)
	}
	got.check(t, n)
	if int(info.State.Msgs) != n {
		t.Errorf("the stream holds %d messages for %d events: JetStream should have dropped the duplicates by id", info.State.Msgs, n)
	}
}

// subscribeMQTT connects a subscriber with a persistent session (client
// id e2e-sub, session kept an hour) to mdag/lot/+/event at QoS 1.
func subscribeMQTT(t *testing.T, addr string, got *arrived, schema *jsonschema.Schema) func() {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c := paho.NewClient(paho.ClientConfig{
		ClientID: "e2e-sub",
		Conn:     packets.NewThreadSafeConn(nc),
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){func(pr paho.PublishReceived) (bool, error) {
			got.add(t, schema, pr.Packet.Payload)
			return true, nil
		}},
	})
	exp := uint32(3600)
	if _, err := c.Connect(ctx, &paho.Connect{ClientID: "e2e-sub", KeepAlive: 30, Properties: &paho.ConnectProperties{SessionExpiryInterval: &exp}}); err != nil {
		t.Fatalf("subscriber connect: %v", err)
	}
	if _, err := c.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: "mdag/lot/+/event", QoS: 1}}}); err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	return func() {
		_ = c.Disconnect(&paho.Disconnect{})
		<-c.Done()
	}
}

// TestFullSpoolMQTT: while mosquitto is down a 64 KiB drop-newest spool
// fills; what does not fit is dropped and counted, what fits arrives in
// order when the broker is back: the delivered and the dropped add up to
// every event, and the dropped are the newest.
func TestFullSpoolMQTT(t *testing.T) {
	t.Parallel()
	b := brokertest.StartMosquitto(t, brokertest.MosquittoOptions{})
	schema := loadSchema(t)
	got := &arrived{}
	stop := subscribeMQTT(t, b.Addr(), got, schema)
	defer func() { stop() }()
	tr, err := mqtt.New(mqtt.Config{URL: b.URL(), ClientID: "mdag-full"})
	if err != nil {
		t.Fatal(err)
	}
	sp, err := spool.Open(spool.Options{Dir: t.TempDir(), MaxBytes: 64 << 10, MaxAge: time.Hour, WhenFull: spool.DropNewest})
	if err != nil {
		t.Fatal(err)
	}
	h, err := outputs.Start(outputs.Config{App: "lot", Clock: clock.Real{}, BackoffMax: 500 * time.Millisecond,
		Outputs: []outputs.Output{{Name: "o", Kinds: []string{outputs.KindEvent}, Transport: tr, Spool: sp}}})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	b.Stop()
	const n = 400 // about 270 bytes each: 108 KB for a 64 KiB spool
	for i := range n {
		h.Add(outputs.Result{App: "lot", Stream: "gate-1", Seq: uint64(i), Outcome: "finished", Finished: time.Now(),
			Events: []media.Event{{Kind: "line-cross", Rule: "gate"}}})
	}
	waitFor(t, "every event spooled or dropped", func() bool {
		st := h.Status()[0]
		return st.Queued == 0 && uint64(st.Waiting)+st.DroppedFull == n
	})
	full := h.Status()[0]
	if full.DroppedFull == 0 || full.Connected || full.SpoolBytes > 64<<10 {
		t.Fatalf("status %+v: want the spool full, drops counted, the output down", full)
	}
	b.Start()
	waitFor(t, "the spool drained", func() bool { st := h.Status()[0]; return st.Waiting == 0 && st.Connected })
	st := h.Status()[0]
	kept := n - int(st.DroppedFull)
	if int(st.Published) != kept || st.Dropped() != st.DroppedFull {
		t.Fatalf("status %+v: want %d published (%d events less %d dropped)", st, kept, n, st.DroppedFull)
	}
	// drop-newest: the first `kept` events arrive, the rest never
	stop()
	stop = subscribeMQTT(t, b.Addr(), got, schema)
	waitFor(t, "the kept events at the subscriber", func() bool { return got.count() >= kept })
	got.check(t, kept)
	t.Logf("%d events into a 64 KiB spool while the broker was down: %d kept and delivered, %d dropped (drop-newest)", n, kept, st.DroppedFull)
}
