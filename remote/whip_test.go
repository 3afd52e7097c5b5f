package remote

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/mdag/mdag/api"
)

// whipEnds records OnWhipEnded.
type whipEnds struct {
	mu sync.Mutex
	m  map[string]string // stream -> kind
}

func (e *whipEnds) add(stream, kind, why string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.m[stream] = kind + ": " + why
}

func (e *whipEnds) get(stream string) (string, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	v, ok := e.m[stream]
	return v, ok
}

func isWhipOffer(m *api.CoordinatorMessage) bool { return m.GetWhipOffer() != nil }

// TestOfferWhip: no worker takes WHIP streams: ErrNoWhipWorker. Then an
// offer goes to a worker that does (one that ingests but takes none is
// not asked); one refusing for capacity (503) passes it to the next; the
// stream joins there without a ticket; the worker's end of it, and its
// loss, end it at the endpoint (OnWhipEnded); an end or answer of a stream
// not delegated to it is refused ("whip"); EndWhip tells the worker.
func TestOfferWhip(t *testing.T) {
	app, prof := loadExample(t, "traffic")
	ends := &whipEnds{m: map[string]string{}}
	c := startServer(t, app, prof, &Server{Heartbeat: time.Hour, OnWhipEnded: ends.add})
	offer := WhipOffer{App: "traffic", Stream: "s1", SDP: []byte("v=0 offer"), FPS: 5, MaxW: 640, MaxH: 480}
	if _, _, err := c.srv.OfferWhip(context.Background(), offer); !errors.Is(err, ErrNoWhipWorker) {
		t.Fatalf("no WHIP worker: %v", err)
	}
	lean := connectRaw(t, c, &api.Register{Id: "w0", Type: "CPU", Executor: "emulated", PeerAddr: "127.0.0.1:1", IngestAddr: "127.0.0.1:2"})
	busy := connectRaw(t, c, &api.Register{Id: "w1", Type: "CPU", Executor: "emulated", PeerAddr: "127.0.0.1:1", IngestAddr: "127.0.0.1:3", Whip: true})
	good := connectRaw(t, c, &api.Register{Id: "w2", Type: "CPU", Executor: "emulated", PeerAddr: "127.0.0.1:1", IngestAddr: "127.0.0.1:4", Whip: true})
	type got struct {
		answer []byte
		worker string
		err    error
	}
	res := make(chan got, 1)
	go func() {
		a, w, err := c.srv.OfferWhip(context.Background(), offer)
		res <- got{a, w, err}
	}()
	// w1 (the lower ID, both empty) is asked first and has no capacity
	o := busy.next("the offer", isWhipOffer).GetWhipOffer()
	if o.Stream != "s1" || o.App != "traffic" || o.Sdp != "v=0 offer" || o.Fps != 5 || o.MaxFrameW != 640 {
		t.Fatalf("offer: %+v", o)
	}
	busy.send(&api.WorkerMessage{Msg: &api.WorkerMessage_WhipAnswer{WhipAnswer: &api.WhipAnswer{Id: o.Id, Code: http.StatusServiceUnavailable, Error: "no capacity"}}})
	o = good.next("the offer, passed on", isWhipOffer).GetWhipOffer()
	good.send(&api.WorkerMessage{Msg: &api.WorkerMessage_WhipAnswer{WhipAnswer: &api.WhipAnswer{Id: o.Id, Sdp: "v=0 answer"}}})
	r := <-res
	if r.err != nil || string(r.answer) != "v=0 answer" || r.worker != "w2" {
		t.Fatalf("OfferWhip: %q %s %v", r.answer, r.worker, r.err)
	}
	if !lean.none(isWhipOffer) {
		t.Error("a worker that takes no WHIP streams was offered one")
	}
	// the stream joins on w2 without a ticket; not on w1
	busy.send(&api.WorkerMessage{Msg: &api.WorkerMessage_StreamJoin{StreamJoin: &api.StreamJoin{Id: 1, App: "traffic", Stream: "s1"}}})
	if j := busy.next("w1's join answer", func(m *api.CoordinatorMessage) bool { return m.GetStreamJoined() != nil }).GetStreamJoined(); j.Code == 0 {
		t.Fatal("a worker the stream was not delegated to joined it without a ticket")
	}
	good.send(&api.WorkerMessage{Msg: &api.WorkerMessage_StreamJoin{StreamJoin: &api.StreamJoin{Id: 1, App: "traffic", Stream: "s1"}}})
	if j := good.next("w2's join answer", func(m *api.CoordinatorMessage) bool { return m.GetStreamJoined() != nil }).GetStreamJoined(); j.Code != 0 {
		t.Fatalf("the delegated stream's join: %+v", j)
	}
	// refused: an answer no offer waits for, an end of a stream not w1's
	busy.send(&api.WorkerMessage{Msg: &api.WorkerMessage_WhipAnswer{WhipAnswer: &api.WhipAnswer{Id: 999}}})
	busy.send(&api.WorkerMessage{Msg: &api.WorkerMessage_WhipEnded{WhipEnded: &api.WhipEnded{Stream: "s1", Kind: "client"}}})
	waitFor(t, "two refusals", 20*time.Second, func() bool { return c.srv.Refused()[RefusedWhip] == 2 })
	if _, ok := ends.get("s1"); ok {
		t.Fatal("another worker's end ended the stream")
	}
	// the client's DELETE: the worker is told
	c.srv.EndWhip("s1")
	if e := good.next("the end", func(m *api.CoordinatorMessage) bool { return m.GetWhipEnd() != nil }).GetWhipEnd(); e.Stream != "s1" {
		t.Fatalf("end: %+v", e)
	}
	// its worker's word that it ended is expected: taken quietly, and no
	// join of it any more
	good.send(&api.WorkerMessage{Msg: &api.WorkerMessage_WhipEnded{WhipEnded: &api.WhipEnded{Stream: "s1", Kind: "client"}}})
	good.send(&api.WorkerMessage{Msg: &api.WorkerMessage_StreamJoin{StreamJoin: &api.StreamJoin{Id: 2, App: "traffic", Stream: "s1"}}})
	if j := good.next("the ended stream's join answer", func(m *api.CoordinatorMessage) bool { return m.GetStreamJoined() != nil }).GetStreamJoined(); j.Code == 0 {
		t.Fatal("an ended stream joined again without a ticket")
	}
	if n := c.srv.Refused()[RefusedWhip]; n != 2 {
		t.Errorf("%d refusals: the expected end was refused", n)
	}
	if _, ok := ends.get("s1"); ok {
		t.Error("the coordinator's own end came back to the endpoint")
	}
	// a second stream on w2 (w1 still refuses), ended by the worker
	go func() {
		a, w, err := c.srv.OfferWhip(context.Background(), WhipOffer{App: "traffic", Stream: "s2", SDP: []byte("v=0")})
		res <- got{a, w, err}
	}()
	for {
		select {
		case m := <-busy.msgs:
			if o := m.GetWhipOffer(); o != nil {
				busy.send(&api.WorkerMessage{Msg: &api.WorkerMessage_WhipAnswer{WhipAnswer: &api.WhipAnswer{Id: o.Id, Sdp: "v=0 busy"}}})
			}
			continue
		case m := <-good.msgs:
			if o := m.GetWhipOffer(); o != nil {
				good.send(&api.WorkerMessage{Msg: &api.WorkerMessage_WhipAnswer{WhipAnswer: &api.WhipAnswer{Id: o.Id, Sdp: "v=0 good"}}})
			}
			continue
		case r = <-res:
		}
		break
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	onBusy := r.worker == "w1"
	w := map[bool]*rawWorker{true: busy, false: good}[onBusy]
	w.send(&api.WorkerMessage{Msg: &api.WorkerMessage_WhipEnded{WhipEnded: &api.WhipEnded{Stream: "s2", Kind: "idle", Why: "no media"}}})
	waitFor(t, "the worker's end at the endpoint", 20*time.Second, func() bool {
		v, ok := ends.get("s2")
		return ok && v == "idle: on ingest worker "+r.worker+": no media"
	})
	// a third, then its worker is lost
	go func() {
		a, w, err := c.srv.OfferWhip(context.Background(), WhipOffer{App: "traffic", Stream: "s3", SDP: []byte("v=0")})
		res <- got{a, w, err}
	}()
	for {
		select {
		case m := <-good.msgs:
			if o := m.GetWhipOffer(); o != nil {
				good.send(&api.WorkerMessage{Msg: &api.WorkerMessage_WhipAnswer{WhipAnswer: &api.WhipAnswer{Id: o.Id, Sdp: "v=0"}}})
			}
			continue
		case m := <-busy.msgs:
			if o := m.GetWhipOffer(); o != nil {
				busy.send(&api.WorkerMessage{Msg: &api.WorkerMessage_WhipAnswer{WhipAnswer: &api.WhipAnswer{Id: o.Id, Sdp: "v=0"}}})
			}
			continue
		case r = <-res:
		}
		break
	}
	map[string]*rawWorker{"w1": busy, "w2": good}[r.worker].cancel()
	waitFor(t, "the lost worker's stream ended at the endpoint", 20*time.Second, func() bool { _, ok := ends.get("s3"); return ok })
	if v, _ := ends.get("s3"); v != ": its ingest worker "+r.worker+" was lost: post the offer again" {
		t.Errorf("end of s3: %q", v)
	}
}
