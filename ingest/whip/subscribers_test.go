package whip

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/internal/clock"
)

// resultsServer is a WHIP server (open ingest) holding one live stream
// "s" of app "a", served over loopback HTTP.
func resultsServer(t *testing.T) (*Server, *stream, *httptest.Server) {
	t.Helper()
	srv, err := New(Config{Apps: map[dag.AppID]float64{"a": 10}, Clock: clock.NewFake(time.Unix(1e9, 0)),
		CPUTime: func() time.Duration { return 0 }}, nil)
	if err != nil {
		t.Fatal(err)
	}
	st := &stream{id: "s", s: srv, app: "a", subs: map[chan Result]struct{}{}, done: make(chan struct{})}
	srv.mu.Lock()
	srv.streams["s"] = st
	srv.mu.Unlock()
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		st.endAs(EndClient, "test over")
		hs.Close()
		srv.Close()
	})
	return srv, st, hs
}

// TestResultSubscribersBounded: a stream takes MaxSubscribers result
// subscribers; one more is refused 429 with the reason, not given a
// goroutine and a queue (issue 36 finding 9: any number were taken); a
// DataChannel still gets its results.
func TestResultSubscribersBounded(t *testing.T) {
	_, st, hs := resultsServer(t)
	var open []*http.Response
	defer func() {
		for _, r := range open {
			r.Body.Close()
		}
	}()
	for i := range MaxSubscribers + 1 {
		resp, err := http.Get(hs.URL + "/v1/streams/s/results")
		if err != nil {
			t.Fatal(err)
		}
		open = append(open, resp)
		if i < MaxSubscribers {
			if resp.StatusCode != 200 {
				t.Fatalf("subscriber %d: %d", i+1, resp.StatusCode)
			}
			// the first line says the subscription is in place
			if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
				t.Fatal(err)
			}
			continue
		}
		var b strings.Builder
		_, _ = bufio.NewReader(resp.Body).WriteTo(&b)
		if resp.StatusCode != http.StatusTooManyRequests || !strings.Contains(b.String(), "result subscribers") {
			t.Fatalf("subscriber %d: %d %q, want 429 with the reason", i+1, resp.StatusCode, b.String())
		}
	}
	st.mu.Lock()
	n := len(st.subs)
	st.mu.Unlock()
	if n != MaxSubscribers {
		t.Fatalf("%d subscribers held, want %d", n, MaxSubscribers)
	}
	// the event streams' readers do not keep the sender's own DataChannel
	// from its results: the kinds are bounded apart
	_, unsub, ok := st.subscribe(subDataChannel)
	if !ok {
		t.Fatalf("a DataChannel refused after %d event stream readers", MaxSubscribers)
	}
	unsub()
}

// TestStalledResultReaderCutOff: a subscriber that stops reading is cut
// off once a write cannot finish within SSEWriteTimeout, its
// subscription freed and the result counted dropped (issue 36 finding 9:
// its handler blocked in the write for as long as the client liked).
func TestStalledResultReaderCutOff(t *testing.T) {
	old := SSEWriteTimeout
	SSEWriteTimeout = 100 * time.Millisecond
	defer func() { SSEWriteTimeout = old }()
	_, st, hs := resultsServer(t)
	c, err := net.Dial("tcp", strings.TrimPrefix(hs.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// a tiny receive window, so the server's writes block soon
	_ = c.(*net.TCPConn).SetReadBuffer(4096)
	fmt.Fprintf(c, "GET /v1/streams/s/results HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
	// the response's head comes after the subscription is made: read it,
	// then publish large results and read no more
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("subscribing: %v %v", resp, err)
	}
	deadline := time.Now().Add(30 * time.Second)
	big := strings.Repeat("x", 64<<10)
	for i := 0; ; i++ {
		st.mu.Lock()
		n := len(st.subs)
		st.mu.Unlock()
		if n == 0 {
			break // cut off
		}
		if time.Now().After(deadline) {
			t.Fatalf("a reader that stopped reading still holds its subscription after %d results", i)
		}
		st.publish(Result{Stream: "s", Frame: uint64(i), Reason: big})
		time.Sleep(time.Millisecond) // pace the results: the cut-off is a real socket's write deadline
	}
	if st.c.resultsDropped.Load() == 0 {
		t.Fatal("no result counted dropped")
	}
}

// TestSlowOfferBodyTimesOut: an offer whose body trickles is answered 408
// once OfferReadTimeout passes, not held open for as long as the client
// likes (issue 36 finding 9: only the headers had a timeout).
func TestSlowOfferBodyTimesOut(t *testing.T) {
	old := OfferReadTimeout
	OfferReadTimeout = 100 * time.Millisecond
	defer func() { OfferReadTimeout = old }()
	_, _, hs := resultsServer(t)
	c, err := net.Dial("tcp", strings.TrimPrefix(hs.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "POST /whip/a HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/sdp\r\nContent-Length: 1000\r\n\r\nv=0\r\n")
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer to a trickling offer: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusRequestTimeout {
		t.Fatalf("trickling offer: %d, want 408", resp.StatusCode)
	}
}
