//go:build !lean

package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/ingest/whip"
	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/media"
)

// answerSink is a session that takes every frame and answers it at once
// (a finished result on the stream's DataChannel).
type answerSink struct{ srv atomic.Pointer[whip.Server] }

func (*answerSink) Join(dag.AppID, string) error { return nil }
func (*answerSink) Leave(string) error           { return nil }
func (s *answerSink) Ingest(id string, seq uint64, _ time.Time, _ *media.Frame, _ []media.Box) error {
	if srv := s.srv.Load(); srv != nil {
		srv.Publish(whip.Result{Stream: id, Frame: seq, Outcome: "finished", LatencyMS: 1})
	}
	return nil
}

// TestClientIngestToken: under --tokens, `mdag client` with an ingest
// token (which may not list streams) counts INGESTED from its own
// stream's results: non-zero, and the server refuses none of its
// requests (no GET /v1/streams it may not make, no 401 counted).
func TestClientIngestToken(t *testing.T) {
	if testing.Short() {
		t.Skip("streams for a few seconds")
	}
	sink := &answerSink{}
	srv, err := whip.New(whip.Config{Apps: map[dag.AppID]float64{"traffic": 10}, Auth: testTokens(t),
		CPUTime: func() time.Duration { return 0 }}, sink) // CPU admission has its own tests
	if err != nil {
		t.Fatal(err)
	}
	sink.srv.Store(srv)
	var unauthorized, listed atomic.Int64
	h := srv.Handler()
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && r.URL.Path == "/v1/streams" {
			listed.Add(1)
		}
		rec := &codeRecorder{ResponseWriter: w}
		h.ServeHTTP(rec, r)
		if rec.code == http.StatusUnauthorized {
			unauthorized.Add(1)
		}
	}))
	defer hs.Close()
	defer srv.Close()

	var out, errb bytes.Buffer
	code := run([]string{"client", "--server", hs.URL, "--app", "traffic", "--token", testIngestToken, "--clients", "2",
		"--size", "64x64", "--fps", "10", "--duration", "2s", "-o", "json"}, &out, &errb)
	var sum struct {
		Clients []clientSummary `json:"clients"`
		Total   clientSummary   `json:"total"`
	}
	if err := json.Unmarshal(out.Bytes(), &sum); err != nil || code != exitOK {
		t.Fatalf("client exit %d, output %q, stderr %q: %v", code, out.String(), errb.String(), err)
	}
	for _, c := range sum.Clients {
		if c.Ingested == 0 || c.Results == 0 || c.Ingested > c.Sent || uint64(c.Results) > c.Ingested || c.Error != "" {
			t.Errorf("client %+v: want frames ingested (from its results), results <= ingested <= sent", c)
		}
	}
	if n := listed.Load(); n != 0 {
		t.Errorf("the client listed streams %d times with an ingest token", n)
	}
	if n := unauthorized.Load(); n != 0 {
		t.Errorf("%d requests answered 401", n)
	}
	for _, tot := range srv.IngestTotals() {
		if n := tot.Refused[whip.RefusedUnauthorized]; n != 0 {
			t.Errorf("app %q: %d unauthorized refusals counted", tot.App, n)
		}
	}
}

// codeRecorder notes the status a handler answers.
type codeRecorder struct {
	http.ResponseWriter
	code int
}

func (r *codeRecorder) WriteHeader(code int) {
	if r.code == 0 {
		r.code = code
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *codeRecorder) Flush() {
	if f, ok := r.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// TestClientSettled: a client counting from its own results (a token)
// waits for the results of the frames in flight: until every frame up to
// the highest numbered one has answered and none came for three mean gaps
// (at least minResultQuiet, at most maxResultQuiet), and finishWait at
// most.
func TestClientSettled(t *testing.T) {
	t0 := time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	cases := []struct {
		name    string
		frames  []uint64 // results' frame numbers, 100 ms apart from t0
		now     int      // ms
		settled bool
	}{
		{"no results", nil, 10000, false},
		{"one result, quiet 250 ms", []uint64{1}, 250, true},
		{"one result, quiet 249 ms", []uint64{1}, 249, false},
		{"every 100 ms, quiet 300 ms after the last", []uint64{1, 2, 3, 4, 5}, 400 + 300, true},
		{"every 100 ms, quiet 299 ms after the last", []uint64{1, 2, 3, 4, 5}, 400 + 299, false},
		{"a frame not answered yet", []uint64{1, 2, 4, 5}, 5000, false},
		{"out of order, all answered", []uint64{2, 1, 3}, 200 + 300, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			fc := clock.NewFake(t0)
			var sum clientSummary
			var mu sync.Mutex
			count := countResult(&sum, &mu, fc, func(whip.Result) {})
			for i, f := range c.frames {
				fc.Set(at(100 * i))
				count(whip.Result{Frame: f, Outcome: "finished"})
			}
			if got := sum.settled(at(c.now)); got != c.settled {
				t.Errorf("settled at %d ms: %v, want %v (summary %+v)", c.now, got, c.settled, sum)
			}
		})
	}
	// Slow results: the quiet is at most maxResultQuiet.
	var sum clientSummary
	fc := clock.NewFake(t0)
	count := countResult(&sum, &sync.Mutex{}, fc, func(whip.Result) {})
	for i := range 3 {
		fc.Set(at(2000 * i))
		count(whip.Result{Frame: uint64(i + 1)})
	}
	if !sum.settled(at(4000).Add(maxResultQuiet)) || sum.settled(at(4000).Add(maxResultQuiet-time.Millisecond)) {
		t.Errorf("results 2 s apart: want settled %v after the last", maxResultQuiet)
	}
}

// TestClientWaitOwn: waitOwn returns once the results are settled, on the
// injected clock, and at finishWait when they never are.
func TestClientWaitOwn(t *testing.T) {
	t0 := time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		name   string
		frames []uint64      // results' frame numbers, 100 ms apart
		want   time.Duration // when waitOwn returns, after the last result
	}{
		{"settles", []uint64{1, 2}, 300 * time.Millisecond}, // gap 100 ms: quiet 300 ms
		{"never settles", []uint64{1, 3}, finishWait},       // frame 2 never answered
	} {
		t.Run(c.name, func(t *testing.T) {
			fc := clock.NewFake(t0)
			var sum clientSummary
			var mu sync.Mutex
			count := countResult(&sum, &mu, fc, func(whip.Result) {})
			for i, f := range c.frames {
				fc.Set(t0.Add(time.Duration(i) * 100 * time.Millisecond))
				count(whip.Result{Frame: f, Outcome: "finished"})
			}
			start := fc.Now()
			done := make(chan time.Time, 1)
			go func() {
				waitOwn(fc, &sum, &mu)
				done <- fc.Now()
			}()
			for {
				select {
				case end := <-done:
					if got := end.Sub(start); got != c.want {
						t.Errorf("waitOwn returned %v after the last result, want %v", got, c.want)
					}
					return
				default:
				}
				if fc.Pending() == 0 {
					runtime.Gosched() // waitOwn is between looks
					continue
				}
				fc.Advance(finishPoll)
			}
		})
	}
}
