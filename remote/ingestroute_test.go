package remote

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/mdag/mdag/api"
	"github.com/mdag/mdag/ingest/synth"
	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/internal/pki"
	"github.com/mdag/mdag/remote/client"
	"github.com/mdag/mdag/remote/source"
)

// TestTicket: a Route ticket lets exactly its worker join exactly its app's
// stream, until it expires; another server's, a changed one or one of the
// wrong size lets no one.
func TestTicket(t *testing.T) {
	clk := clock.NewFake(t0)
	s := &Server{Clock: clk}
	tk := s.ticket("traffic", "cam-1", "w1")
	if err := s.checkTicket(tk, "traffic", "cam-1", "w1"); err != nil {
		t.Fatalf("its own ticket: %v", err)
	}
	for _, c := range []struct {
		name                string
		ticket              []byte
		app, stream, worker string
		want                string
	}{
		{"another worker", tk, "traffic", "cam-1", "w2", "not the coordinator's"},
		{"another stream", tk, "traffic", "cam-2", "w1", "not the coordinator's"},
		{"another app", tk, "retail", "cam-1", "w1", "not the coordinator's"},
		{"fields shifted", s.ticket("traffic", "cam-1w", "1"), "traffic", "cam-1", "w1", "not the coordinator's"},
		{"another server's", (&Server{Clock: clk}).ticket("traffic", "cam-1", "w1"), "traffic", "cam-1", "w1", "not the coordinator's"},
		{"changed", append(append([]byte(nil), tk[:len(tk)-1]...), tk[len(tk)-1]^1), "traffic", "cam-1", "w1", "not the coordinator's"},
		{"expiry moved", append([]byte{tk[0] + 1}, tk[1:]...), "traffic", "cam-1", "w1", "not the coordinator's"},
		{"short", tk[:10], "traffic", "cam-1", "w1", "a ticket of 10 bytes"},
		{"none", nil, "traffic", "cam-1", "w1", "a ticket of 0 bytes"},
	} {
		err := s.checkTicket(c.ticket, c.app, c.stream, c.worker)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error with %q", c.name, err, c.want)
		}
	}
	clk.Advance(TicketTTL)
	if err := s.checkTicket(tk, "traffic", "cam-1", "w1"); err != nil {
		t.Errorf("at its expiry: %v", err)
	}
	clk.Advance(time.Nanosecond)
	if err := s.checkTicket(tk, "traffic", "cam-1", "w1"); err == nil || !strings.Contains(err.Error(), "expired") {
		t.Errorf("past its expiry: %v", err)
	}
}

// rawIngestWorker registers over Connect as a worker with peer and ingest
// addresses (nothing listens there: the test plays the worker's messages).
func rawIngestWorker(t *testing.T, c *loopback, id string, ingestStreams ...int32) (send func(*api.WorkerMessage), recv func() *api.CoordinatorMessage) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	st, err := api.NewCoordinatorClient(c.cc).Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	reg := &api.Register{Id: id, Type: "CPU", Executor: "emulated", PeerAddr: "127.0.0.1:1", IngestAddr: "127.0.0.1:2"}
	if len(ingestStreams) > 0 {
		reg.IngestStreams = ingestStreams[0]
	}
	if err := st.Send(&api.WorkerMessage{Msg: &api.WorkerMessage_Register{Register: reg}}); err != nil {
		t.Fatal(err)
	}
	if m, err := st.Recv(); err != nil || m.GetRegistered() == nil || !m.GetRegistered().Direct {
		t.Fatalf("register: %v %v", m, err)
	}
	send = func(m *api.WorkerMessage) {
		if err := st.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	recv = func() *api.CoordinatorMessage {
		for {
			m, err := st.Recv()
			if err != nil {
				t.Fatal(err)
			}
			if m.GetStreamJoined() != nil {
				return m
			}
		}
	}
	return send, recv
}

// TestStreamJoinRefusals: a worker joins a camera stream only with Route's
// ticket for it, and announces frames only of the streams joined on it,
// as references to its own store; everything else is refused, counted,
// and never reaches the engine.
func TestStreamJoinRefusals(t *testing.T) {
	app, prof := loadExample(t, "traffic")
	c := startCoordinator(t, app, prof, time.Second)
	send, recv := rawIngestWorker(t, c, "w1")
	waitFor(t, "the worker to be routed to", 5*time.Second, func() bool { return ingestReady(c.srv) })
	rt, err := api.NewCoordinatorClient(c.cc).Route(context.Background(), &api.RouteRequest{App: "traffic", Stream: "cam-1"})
	if err != nil || rt.Worker != "w1" || rt.Addr != "127.0.0.1:2" || len(rt.Ticket) == 0 {
		t.Fatalf("route: %+v %v", rt, err)
	}
	join := func(id uint64, app, stream string, ticket []byte) *api.StreamJoined {
		send(&api.WorkerMessage{Msg: &api.WorkerMessage_StreamJoin{StreamJoin: &api.StreamJoin{Id: id, App: app, Stream: stream, Ticket: ticket}}})
		return recv().GetStreamJoined()
	}
	ingested := func(stream string, seq uint64, holder, addr string) {
		f := &api.Frame{Width: 320, Height: 240, Ref: &api.FrameRef{Holder: holder, Addr: addr, Id: 7}}
		send(&api.WorkerMessage{Msg: &api.WorkerMessage_Ingested{Ingested: &api.Ingested{Stream: stream, Seq: seq, CaptureUnixNs: time.Now().UnixNano(), Frame: f}}})
	}
	// Frames of a stream not joined: refused.
	ingested("cam-1", 0, "w1", "127.0.0.1:1")
	for i, r := range []struct {
		app, stream string
		ticket      []byte
		code        codes.Code
	}{
		{"traffic", "cam-1", nil, codes.Unavailable},
		{"traffic", "cam-2", rt.Ticket, codes.Unavailable},
		{"traffic", "cam-1", append(append([]byte(nil), rt.Ticket[:20]...), make([]byte, len(rt.Ticket)-20)...), codes.Unavailable},
		{"traffic", strings.Repeat("x", 300), rt.Ticket, codes.InvalidArgument},
	} {
		if got := join(uint64(i+1), r.app, r.stream, r.ticket); codes.Code(got.Code) != r.code || got.Error == "" || got.Id != uint64(i+1) {
			t.Errorf("join %d (%s %s): %+v, want %v", i, r.app, r.stream, got, r.code)
		}
	}
	got := join(10, "traffic", "cam-1", rt.Ticket)
	if got.Code != 0 || got.SloNs != int64(400*time.Millisecond) || got.MaxFrameW != 1920 || got.MaxBoxes != 256 {
		t.Fatalf("join with the ticket: %+v", got)
	}
	// The stream is the engine's now: a second join of it is refused.
	if again := join(11, "traffic", "cam-1", rt.Ticket); codes.Code(again.Code) != codes.AlreadyExists {
		t.Errorf("second join: %+v, want AlreadyExists", again)
	}
	ingested("cam-1", 1, "w2", "127.0.0.1:1") // another holder's
	ingested("cam-1", 2, "w1", "127.0.0.1:9") // another address
	ingested("cam-1", 3, "w1", "127.0.0.1:1") // its own: taken
	waitFor(t, "the worker's frames handled", 5*time.Second, func() bool { in := c.srv.Ingested(); return in.Frames+in.Rejected == 4 })
	if in := c.srv.Ingested(); in.Frames != 1 || in.Rejected != 3 || in.Streams != 1 {
		t.Errorf("ingested %+v: want 1 frame taken, 3 refused, 1 stream", in)
	}
	ref := c.srv.Refused()
	if ref[RefusedTicket] != 3 || ref[RefusedIngested] != 3 {
		t.Errorf("refused %v: want 3 %s and 3 %s", ref, RefusedTicket, RefusedIngested)
	}
	if st := c.e.Status().Sessions[0]; st.Total.Sent != 1 || st.Streams != 1 {
		t.Errorf("engine: %d frames, %d streams; want 1 and 1", st.Total.Sent, st.Streams)
	}
	// A leave for a stream it does not hold changes nothing; its own
	// stream's leave ends it.
	send(&api.WorkerMessage{Msg: &api.WorkerMessage_StreamLeave{StreamLeave: &api.StreamLeave{Stream: "cam-9"}}})
	send(&api.WorkerMessage{Msg: &api.WorkerMessage_StreamLeave{StreamLeave: &api.StreamLeave{Stream: "cam-1"}}})
	waitFor(t, "the stream to leave", 5*time.Second, func() bool { return c.e.Status().Sessions[0].Streams == 0 })
}

// TestRouteRefusals: Route names no worker for an unknown app, a bad
// request or without ingest workers.
func TestRouteRefusals(t *testing.T) {
	app, prof := loadExample(t, "traffic")
	c := startCoordinator(t, app, prof, time.Second)
	cl := api.NewCoordinatorClient(c.cc)
	rt, err := cl.Route(context.Background(), &api.RouteRequest{App: "traffic", Stream: "cam-1"})
	if err != nil || rt.Addr != "" || rt.Worker != "" || !strings.Contains(rt.Why, "no worker ingests") {
		t.Errorf("no ingest worker: %+v %v", rt, err)
	}
	for _, r := range []struct {
		req  *api.RouteRequest
		code codes.Code
	}{
		{&api.RouteRequest{App: "nope", Stream: "cam-1"}, codes.NotFound},
		{&api.RouteRequest{App: "traffic"}, codes.InvalidArgument},
		{&api.RouteRequest{App: "traffic", Stream: strings.Repeat("x", 300)}, codes.InvalidArgument},
	} {
		if _, err := cl.Route(context.Background(), r.req); status.Code(err) != r.code {
			t.Errorf("route %+v: %v, want %v", r.req, err, r.code)
		}
	}
}

// TestIngestOnWorkersTLS: under mutual TLS a source routes its stream to
// the worker's ingest port with its source certificate, and the worker
// joins it: the frames reach the engine as references. The ingest port
// takes only sources' certificates of the CA, and Route holds a source to
// its certificate's streams as Ingest does.
func TestIngestOnWorkersTLS(t *testing.T) {
	dir := t.TempDir()
	if _, err := pki.Init(dir, pki.InitOptions{}); err != nil {
		t.Fatal(err)
	}
	c := startTLS(t, dir)
	wm := material(t, pki.DirFiles(dir, pki.Worker), pki.Worker)
	sm := material(t, pki.DirFiles(dir, pki.Source), pki.Source)
	listen := func() net.Listener {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		return ln
	}
	pln, iln := listen(), listen()
	store := &client.Store{}
	pg := client.NewPeerGRPC(&client.PeerServer{ID: "worker", Store: store}, grpc.Creds(credentials.NewTLS(wm.PeerServerConfig())))
	dp := &client.DataPlane{Addr: pln.Addr().String(), Store: store, Ingest: &client.IngestServer{Addr: iln.Addr().String()},
		Dial: func(a string) (*grpc.ClientConn, error) { return client.DialPeerTLS(a, wm) }}
	ig := client.NewIngestGRPC(dp.Ingest, grpc.Creds(credentials.NewTLS(wm.IngestServerConfig())))
	go func() { _ = pg.Serve(pln) }()
	go func() { _ = ig.Serve(iln) }()
	t.Cleanup(func() { ig.Stop(); pg.Stop() })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = client.RunWorker(ctx, dialTLS(t, c.addr, wm), client.WorkerConfig{ID: "worker", Type: "CPU", Data: dp})
	}()
	t.Cleanup(func() { cancel(); <-done })
	waitFor(t, "the ingest worker", 10*time.Second, func() bool { return ingestReady(c.srv) })

	pat, err := synth.NewPattern(64, 48, 1)
	if err != nil {
		t.Fatal(err)
	}
	rc := source.Reconnect{DialIngest: func(a string) (*grpc.ClientConn, error) { return client.DialIngestTLS(a, sm) }}
	res, err := source.StreamReconnecting(context.Background(), dialTLS(t, c.addr, sm), "traffic", "source/cam", pat, 0, 50, 5, rc)
	if err != nil || res.Accepted != 5 || res.Connections != 1 {
		t.Fatalf("the routed stream: %+v %v", res, err)
	}
	waitFor(t, "the frames at the engine", 10*time.Second, func() bool { return c.srv.Ingested().Frames == 5 })
	if in := dp.Ingest.Stats(); in.Joined != 1 || in.Frames != 5 {
		t.Errorf("the worker's ingest: %+v", in)
	}

	// A worker's certificate is refused on the ingest port (in the
	// handshake), and a source may route only its certificate's streams.
	ictx, icancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer icancel()
	wcc, err := client.DialIngestTLS(dp.Ingest.Addr, wm)
	if err != nil {
		t.Fatal(err)
	}
	defer wcc.Close()
	st, err := api.NewIngestClient(wcc).Ingest(ictx)
	if err == nil {
		err = st.Send(&api.IngestMessage{Join: &api.Join{App: "traffic", Stream: "worker/cam"}})
		if err == nil {
			_, err = st.CloseAndRecv()
		}
	}
	if status.Code(err) != codes.Unavailable {
		t.Errorf("a worker's certificate on the ingest port: %v, want the handshake refused", err)
	}
	_, err = api.NewCoordinatorClient(dialTLS(t, c.addr, sm)).Route(ictx, &api.RouteRequest{App: "traffic", Stream: "other/cam"})
	if status.Code(err) != codes.PermissionDenied {
		t.Errorf("route another certificate's stream: %v, want PermissionDenied", err)
	}
}

// TestWorkerBatch: a worker's batch is handled message by message, in
// order; one of more than wire.MaxBatch messages ends its stream, counted.
func TestWorkerBatch(t *testing.T) {
	app, prof := loadExample(t, "traffic")
	c := startCoordinator(t, app, prof, time.Second)
	send, recv := rawIngestWorker(t, c, "w1")
	waitFor(t, "the worker to be routed to", 5*time.Second, func() bool { return ingestReady(c.srv) })
	rt, err := api.NewCoordinatorClient(c.cc).Route(context.Background(), &api.RouteRequest{App: "traffic", Stream: "cam-1"})
	if err != nil {
		t.Fatal(err)
	}
	send(&api.WorkerMessage{Msg: &api.WorkerMessage_StreamJoin{StreamJoin: &api.StreamJoin{Id: 1, App: "traffic", Stream: "cam-1", Ticket: rt.Ticket}}})
	if j := recv().GetStreamJoined(); j.Code != 0 {
		t.Fatalf("join: %+v", j)
	}
	var msgs []*api.WorkerMessage
	for seq := range uint64(3) {
		f := &api.Frame{Width: 320, Height: 240, Ref: &api.FrameRef{Holder: "w1", Addr: "127.0.0.1:1", Id: seq + 1}}
		msgs = append(msgs, &api.WorkerMessage{Msg: &api.WorkerMessage_Ingested{Ingested: &api.Ingested{Stream: "cam-1", Seq: seq, CaptureUnixNs: time.Now().UnixNano(), Frame: f}}})
	}
	msgs = append(msgs, &api.WorkerMessage{Msg: &api.WorkerMessage_StreamLeave{StreamLeave: &api.StreamLeave{Stream: "cam-1"}}})
	send(&api.WorkerMessage{Msg: &api.WorkerMessage_Batch{Batch: &api.WorkerBatch{Msgs: msgs}}})
	// In order: the frames before the leave reach the engine.
	waitFor(t, "the batch handled", 5*time.Second, func() bool { return c.e.Status().Sessions[0].Streams == 0 && c.srv.Ingested().Frames == 3 })
	if in := c.srv.Ingested(); in.Rejected != 0 {
		t.Errorf("ingested %+v: none refused", in)
	}
	// A leave right behind its join (the worker gave up on it): whichever
	// the coordinator finishes first, the stream ends up not joined.
	rt2, err := api.NewCoordinatorClient(c.cc).Route(context.Background(), &api.RouteRequest{App: "traffic", Stream: "cam-2"})
	if err != nil {
		t.Fatal(err)
	}
	send(&api.WorkerMessage{Msg: &api.WorkerMessage_Batch{Batch: &api.WorkerBatch{Msgs: []*api.WorkerMessage{
		{Msg: &api.WorkerMessage_StreamJoin{StreamJoin: &api.StreamJoin{Id: 2, App: "traffic", Stream: "cam-2", Ticket: rt2.Ticket}}},
		{Msg: &api.WorkerMessage_StreamLeave{StreamLeave: &api.StreamLeave{Stream: "cam-2"}}},
	}}}})
	if j := recv().GetStreamJoined(); j.Id != 2 || (j.Code != 0 && codes.Code(j.Code) != codes.Unavailable) {
		t.Errorf("join then leave: %+v", j)
	}
	waitFor(t, "cam-2 not joined", 5*time.Second, func() bool { return c.e.Status().Sessions[0].Streams == 0 && c.srv.Ingested().Streams == 0 })
	hb := make([]*api.WorkerMessage, 1025)
	for i := range hb {
		hb[i] = &api.WorkerMessage{Msg: &api.WorkerMessage_Heartbeat{Heartbeat: &api.Heartbeat{}}}
	}
	send(&api.WorkerMessage{Msg: &api.WorkerMessage_Batch{Batch: &api.WorkerBatch{Msgs: hb}}})
	waitFor(t, "the worker lost for its batch", 5*time.Second, func() bool { return len(c.srv.Workers()) == 0 })
	if n := c.srv.Refused()[RefusedMessage]; n != 1 {
		t.Errorf("refused %v: want one %s", c.srv.Refused(), RefusedMessage)
	}
}

// ingestReady says whether Route would name a worker.
func ingestReady(s *Server) bool { c, _, _, _ := s.ingestWorker(); return c != nil }

// TestRouteBoundedPerSource: one source holds at most --max-source-streams
// routes not joined yet; routing a stream again replaces its route, and a
// join frees its place.
func TestRouteBoundedPerSource(t *testing.T) {
	app, prof := loadExample(t, "traffic")
	c := startServer(t, app, prof, &Server{Heartbeat: time.Second, Limits: Limits{MaxSourceStreams: 3}})
	send, recv := rawIngestWorker(t, c, "w1")
	waitFor(t, "the worker to be routed to", 5*time.Second, func() bool { return ingestReady(c.srv) })
	route := func(stream string) (*api.RouteReply, error) {
		return api.NewCoordinatorClient(c.cc).Route(context.Background(), &api.RouteRequest{App: "traffic", Stream: stream})
	}
	var first *api.RouteReply
	for i, id := range []string{"cam-1", "cam-2", "cam-3", "cam-1"} {
		rt, err := route(id)
		if err != nil {
			t.Fatalf("route %d (%s): %v", i, id, err)
		}
		if i == 3 {
			first = rt
		}
	}
	if _, err := route("cam-4"); status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "--max-source-streams") {
		t.Fatalf("a fourth stream routed and not joined: %v, want ResourceExhausted", err)
	}
	send(&api.WorkerMessage{Msg: &api.WorkerMessage_StreamJoin{StreamJoin: &api.StreamJoin{Id: 1, App: "traffic", Stream: "cam-1", Ticket: first.Ticket}}})
	if j := recv().GetStreamJoined(); j.Code != 0 {
		t.Fatalf("join cam-1: %+v", j)
	}
	waitFor(t, "cam-1's route freed by its join", 5*time.Second, func() bool { _, err := route("cam-4"); return err == nil })
	if n := c.srv.Refused()[RefusedStreams]; n == 0 {
		t.Errorf("refused %v: the fourth route counted %s", c.srv.Refused(), RefusedStreams)
	}
}

// TestRouteIngestLimit: Route counts each ingest worker's streams against
// the limit it registered (ingest_streams) and leaves out the workers at
// it. While routes not joined yet fill them (they may never join), the
// source is told to retry; when every one is full of joined streams, the
// stream goes to the coordinator, and the reply says why.
func TestRouteIngestLimit(t *testing.T) {
	app, prof := loadExample(t, "traffic")
	c := startServer(t, app, prof, &Server{Heartbeat: time.Second, Limits: Limits{MaxSourceStreams: 16}})
	send1, recv1 := rawIngestWorker(t, c, "w1", 2)
	send2, recv2 := rawIngestWorker(t, c, "w2", 1)
	waitFor(t, "both workers to be routed to", 20*time.Second, func() bool {
		c.srv.mu.Lock()
		defer c.srv.mu.Unlock()
		n := 0
		for _, w := range c.srv.workers {
			if w.ingest != "" {
				n++
			}
		}
		return n == 2
	})
	route := func(stream string) (*api.RouteReply, error) {
		return api.NewCoordinatorClient(c.cc).Route(context.Background(), &api.RouteRequest{App: "traffic", Stream: stream})
	}
	tickets := map[string][]byte{}
	for _, tc := range []struct{ stream, worker string }{{"cam-1", "w1"}, {"cam-2", "w2"}, {"cam-3", "w1"}} {
		rt, err := route(tc.stream)
		if err != nil || rt.Worker != tc.worker {
			t.Fatalf("%s routed to %+v (%v), want %q", tc.stream, rt, err, tc.worker)
		}
		tickets[tc.stream] = rt.Ticket
	}
	if _, err := route("cam-4"); status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "retry") {
		t.Fatalf("every worker full of routes not joined yet: %v, want ResourceExhausted (retry)", err)
	}
	join := func(send func(*api.WorkerMessage), recv func() *api.CoordinatorMessage, id uint64, stream string) {
		t.Helper()
		send(&api.WorkerMessage{Msg: &api.WorkerMessage_StreamJoin{StreamJoin: &api.StreamJoin{Id: id, App: "traffic", Stream: stream, Ticket: tickets[stream]}}})
		if j := recv().GetStreamJoined(); j.Code != 0 {
			t.Fatalf("join %s: %+v", stream, j)
		}
	}
	join(send1, recv1, 1, "cam-1")
	join(send1, recv1, 2, "cam-3")
	join(send2, recv2, 1, "cam-2")
	rt, err := route("cam-4")
	if err != nil || rt.Worker != "" || rt.Ticket != nil || !strings.Contains(rt.Why, "every ingest worker (2) ingests its most streams") {
		t.Fatalf("every worker full of joined streams: %+v %v: want the coordinator, saying why", rt, err)
	}
}

// TestRouteUnreachableWorker: a source routed to an ingest worker it cannot
// reach (here: nothing listens at the worker's ingest address) sends the
// stream to the coordinator instead, and says so, rather than retry the
// route for ever.
func TestRouteUnreachableWorker(t *testing.T) {
	app, prof := loadExample(t, "traffic")
	c := startCoordinator(t, app, prof, time.Second)
	rawIngestWorker(t, c, "w1") // its ingest address, 127.0.0.1:2, has nobody behind it
	waitFor(t, "the worker to be routed to", 5*time.Second, func() bool { return ingestReady(c.srv) })
	pat, err := synth.NewPattern(64, 48, 1)
	if err != nil {
		t.Fatal(err)
	}
	logs := &logBuf{}
	rc := source.Reconnect{DialIngest: client.Dial, Log: slog.New(slog.NewTextHandler(logs, nil))}
	res, err := source.StreamReconnecting(context.Background(), c.cc, "traffic", "cam-1", pat, 0, 50, 5, rc)
	if err != nil || res.Accepted != 5 || res.Connections != 1 {
		t.Fatalf("the stream: %+v %v\n%s", res, err, logs)
	}
	if !strings.Contains(logs.String(), "ingest worker unreachable") || !strings.Contains(logs.String(), "via=\"coordinator (ingest worker w1") {
		t.Errorf("the source did not say where its stream went:\n%s", logs)
	}
	waitFor(t, "the frames at the coordinator", 5*time.Second, func() bool { return c.e.Status().Sessions[0].Total.Sent == 5 })
}
