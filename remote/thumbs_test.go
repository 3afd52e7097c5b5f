package remote

import (
	"context"
	"testing"
	"time"

	"github.com/mdag/mdag/api"
	"github.com/mdag/mdag/remote/wire"
)

// TestThumbnails: WantThumbs asks only the ingest workers that said they
// send thumbnails, at most once every 2 s; a thumbnail is taken only of a
// stream joined on the worker that sent it, at most wire.MaxThumbBytes
// and a JPEG; each other is refused, counted as "thumbnail".
func TestThumbnails(t *testing.T) {
	app, prof := loadExample(t, "traffic")
	thumbs := &thumbSink{}
	c := startServer(t, app, prof, &Server{Heartbeat: time.Second, Thumbs: thumbs.put})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := api.NewCoordinatorClient(c.cc).Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	reg := &api.Register{Id: "w1", Type: "CPU", Executor: "emulated", PeerAddr: "127.0.0.1:1", IngestAddr: "127.0.0.1:2", Thumbnails: true}
	if err := st.Send(&api.WorkerMessage{Msg: &api.WorkerMessage_Register{Register: reg}}); err != nil {
		t.Fatal(err)
	}
	if m, err := st.Recv(); err != nil || m.GetRegistered() == nil {
		t.Fatalf("register: %v %v", m, err)
	}
	msgs := make(chan *api.CoordinatorMessage, 64)
	go func() {
		for {
			m, err := st.Recv()
			if err != nil {
				close(msgs)
				return
			}
			if b := m.GetBatch(); b != nil {
				for _, in := range b.Msgs {
					msgs <- in
				}
				continue
			}
			msgs <- m
		}
	}()
	next := func(what string, pick func(*api.CoordinatorMessage) bool) *api.CoordinatorMessage {
		t.Helper()
		tm := time.After(20 * time.Second)
		for {
			select {
			case m, ok := <-msgs:
				if !ok {
					t.Fatalf("the stream ended waiting for %s", what)
				}
				if pick(m) {
					return m
				}
			case <-tm:
				t.Fatalf("no %s within 20 s", what)
			}
		}
	}
	send := func(m *api.WorkerMessage) {
		if err := st.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the worker to be routed to", 20*time.Second, func() bool { return ingestReady(c.srv) })
	rt, err := api.NewCoordinatorClient(c.cc).Route(context.Background(), &api.RouteRequest{App: "traffic", Stream: "cam-1"})
	if err != nil || rt.Worker != "w1" {
		t.Fatalf("route: %+v %v", rt, err)
	}
	send(&api.WorkerMessage{Msg: &api.WorkerMessage_StreamJoin{StreamJoin: &api.StreamJoin{Id: 1, App: "traffic", Stream: "cam-1", Ticket: rt.Ticket}}})
	if j := next("the join's answer", func(m *api.CoordinatorMessage) bool { return m.GetStreamJoined() != nil }).GetStreamJoined(); j.Code != 0 {
		t.Fatalf("join: %+v", j)
	}

	jpeg := []byte{0xFF, 0xD8, 0xFF, 0xE0, 'o', 'k'}
	// before the dashboard asked: refused
	send(&api.WorkerMessage{Msg: &api.WorkerMessage_Thumbnail{Thumbnail: &api.Thumbnail{Stream: "cam-1", Jpeg: jpeg}}})
	waitFor(t, "a thumbnail not asked for refused", 20*time.Second, func() bool { return c.srv.Refused()[RefusedThumbnail] == 1 })
	c.srv.WantThumbs()
	asked := c.srv.thumbsAsked.Load()
	w := next("ThumbsWanted", func(m *api.CoordinatorMessage) bool { return m.GetThumbsWanted() != nil }).GetThumbsWanted()
	if time.Duration(w.ForNs) != thumbsFor {
		t.Errorf("thumbnails wanted for %v, want %v", time.Duration(w.ForNs), thumbsFor)
	}
	c.srv.WantThumbs() // within 2 s of the last: not asked again
	if c.srv.thumbsAsked.Load() != asked {
		t.Error("asked again within 2 s")
	}

	for _, th := range []*api.Thumbnail{
		{Stream: "cam-2", Jpeg: jpeg},                               // not joined here
		{Stream: "cam-1", Jpeg: []byte("GIF89a")},                   // not a JPEG
		{Stream: "cam-1", Jpeg: make([]byte, wire.MaxThumbBytes+1)}, // too large
		{Stream: "cam-1", Jpeg: jpeg},                               // taken
	} {
		send(&api.WorkerMessage{Msg: &api.WorkerMessage_Thumbnail{Thumbnail: th}})
	}
	waitFor(t, "cam-1's thumbnail", 20*time.Second, func() bool { return string(thumbs.get("cam-1")) == string(jpeg) })
	if thumbs.get("cam-2") != nil {
		t.Error("a thumbnail of a stream not joined on the worker was taken")
	}
	waitFor(t, "three more thumbnails refused", 20*time.Second, func() bool { return c.srv.Refused()[RefusedThumbnail] == 4 })
}
