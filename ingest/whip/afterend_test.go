package whip

import (
	"context"
	"testing"
	"time"

	"github.com/mdag/mdag/ingest/synth"
)

// TestResultsAfterEnd: results of frames still in flight when the client
// deletes its stream are counted in the ended stream's info (issue 18:
// they were counted neither sent nor dropped).
func TestResultsAfterEnd(t *testing.T) {
	srv, sink, hs := newTestServer(t, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	p, err := Publish(ctx, ClientConfig{Server: hs.URL, App: "face", Width: 64, Height: 64})
	if err != nil {
		t.Fatal(err)
	}
	pat, err := synth.NewPattern(64, 64, 1)
	if err != nil {
		t.Fatal(err)
	}
	sendPattern(t, p, pat, 10, 30)
	waitFor(t, "frames to reach the session", 10*time.Second, func() bool { return sink.count(p.Stream) > 0 })
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the stream to end", 10*time.Second, func() bool {
		for _, s := range srv.Streams() {
			if s.ID == p.Stream && s.Ended != "" {
				return true
			}
		}
		return false
	})
	const late = 3 // the engine answers for frames that were in flight
	for i := range late {
		srv.Publish(Result{Stream: p.Stream, Frame: uint64(1000 + i), Outcome: "late"})
	}
	srv.Publish(Result{Stream: "no-such-stream", Outcome: "finished"}) // nothing to count, nothing to break
	// The stream's media goroutine may still be between handing its last
	// frame to the session and counting it: the counters must add up once
	// it is done (a result never counted would never add up).
	var last StreamInfo
	adds := func() bool {
		for _, s := range srv.Streams() {
			if s.ID == p.Stream {
				last = s
				return s.ResultsSent+s.ResultsDropped+s.ResultsAfterEnd == s.Ingested+late
			}
		}
		return false
	}
	deadline := time.After(5 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
wait:
	for !adds() {
		select {
		case <-deadline:
			break wait // reported below, with the counters
		case <-tick.C:
		}
	}
	if last.ID == "" {
		t.Fatal("the ended stream is not listed")
	}
	if last.ResultsAfterEnd != late {
		t.Errorf("results after end %d, want %d", last.ResultsAfterEnd, late)
	}
	if got := last.ResultsSent + last.ResultsDropped + last.ResultsAfterEnd; got != last.Ingested+late {
		t.Errorf("results %d sent + %d dropped + %d after end != %d ingested + %d in flight", last.ResultsSent, last.ResultsDropped, last.ResultsAfterEnd, last.Ingested, late)
	}
}
