package whip

import (
	"testing"
	"time"

	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/internal/clock"
)

// Results published before a stream's first subscriber (its DataChannel
// opening) are held for it; after it, or once the stream ended, results no
// one takes are dropped and counted. (A pipeline faster than the channel's
// opening used to lose its first results.)
func TestEarlyResultsWaitForTheFirstSubscriber(t *testing.T) {
	st := &stream{id: "s", subs: map[chan Result]struct{}{}, done: make(chan struct{})}
	for i := range 3 {
		st.publish(Result{Stream: "s", Frame: uint64(i)})
	}
	if n := st.c.resultsDropped.Load(); n != 0 {
		t.Fatalf("%d dropped before the first subscriber", n)
	}
	ch, unsub, _ := st.subscribe(subDataChannel)
	for i := range 3 {
		if r := <-ch; r.Frame != uint64(i) {
			t.Fatalf("result %d: seq %d", i, r.Frame)
		}
	}
	unsub()
	st.publish(Result{Stream: "s", Frame: 3}) // the subscriber went away: dropped
	if n := st.c.resultsDropped.Load(); n != 1 {
		t.Fatalf("%d dropped after the subscriber left, want 1", n)
	}

	// A stream that ends before anyone subscribed counts what it held.
	srv, err := New(Config{Apps: map[dag.AppID]float64{"a": 10}, Clock: clock.NewFake(time.Unix(1e9, 0)),
		CPUTime: func() time.Duration { return 0 }}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	never := &stream{id: "n", s: srv, app: "a", subs: map[chan Result]struct{}{}, done: make(chan struct{})}
	for i := range subBuffer + 2 {
		never.publish(Result{Stream: "n", Frame: uint64(i)})
	}
	if n := never.c.resultsDropped.Load(); n != 2 {
		t.Fatalf("%d dropped beyond the %d held, want 2", n, subBuffer)
	}
	never.endAs(EndClient, "test")
	if n := never.c.resultsDropped.Load(); n != subBuffer+2 {
		t.Fatalf("%d dropped after the end, want %d", n, subBuffer+2)
	}
}
