package whip

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/ingest/synth"
)

// workerDelegate is a coordinator's Delegator in tests: the offers go to
// another server (the ingest worker's) through Accept.
type workerDelegate struct {
	worker *Server
	mu     sync.Mutex
	ended  []string
	refuse error
	// lost: the stream is ended (its worker lost) while the worker answers
	lost func(id string)
}

func (d *workerDelegate) Delegate(_ context.Context, app dag.AppID, id string, offer []byte, caps DelegateCaps) ([]byte, string, error) {
	if d.refuse != nil {
		return nil, "", d.refuse
	}
	answer, code, err := d.worker.Accept(app, id, offer, caps)
	if err != nil {
		return nil, "", &StatusError{Code: code, Msg: err.Error()}
	}
	if d.lost != nil {
		d.lost(id)
	}
	return []byte(answer), "w1", nil
}

func (d *workerDelegate) Result(id string, r Result) { d.worker.Deliver(r) }

func (d *workerDelegate) End(id string) {
	d.mu.Lock()
	d.ended = append(d.ended, id)
	d.mu.Unlock()
	d.worker.End(id)
}

// TestDelegate: a WHIP POST to the coordinator's server is answered by the
// ingest worker's (Accept): the client's media goes to the worker, whose
// sink gets the frames, and none to the coordinator's; the stream is
// listed at the coordinator on the worker, its results published there
// reach the client's event stream; the client's DELETE there ends it on
// the worker, whose end (OnEnded -> EndDelegated) ends the event stream.
// A delegate's refusal is the POST's status, counted "delegate";
// ErrNotDelegated makes the coordinator take the stream itself.
func TestDelegate(t *testing.T) {
	var coord *Server
	// the worker's word comes back over the network: asynchronously
	worker, wsink, _ := newTestServer(t, Config{OnEnded: func(id, kind, why string) {
		go coord.EndDelegated(id, kind, "on the worker: "+why)
	}})
	d := &workerDelegate{worker: worker}
	coord, csink, hs := newTestServer(t, Config{Delegate: d})
	pat, err := synth.NewPattern(320, 240, 2)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var dc sync.Mutex
	var dcResults []Result
	p, err := Publish(ctx, ClientConfig{Server: hs.URL, App: "face", Width: 320, Height: 240, FPS: 30,
		OnResult: func(r Result) { dc.Lock(); dcResults = append(dcResults, r); dc.Unlock() }})
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, p.Results, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sse, sseEnd := make(chan Result, 64), make(chan string, 1)
	go readSSE(resp, sse, sseEnd)
	sendPattern(t, p, pat, 30, 30)
	waitFor(t, "frames at the worker's sink", 10*time.Second, func() bool { return wsink.count(p.Stream) >= 5 })
	if n := csink.count(p.Stream); n != 0 {
		t.Fatalf("the coordinator's sink got %d frames: the media went through it", n)
	}
	if st := coord.Streams(); len(st) != 1 || st[0].State != StateOnWorker || st[0].Worker != "w1" || st[0].ID != p.Stream {
		t.Fatalf("coordinator streams: %+v", st)
	}
	if adm := coord.Admission(); len(adm.Streams) != 1 || adm.Streams[0].ReadBy != "w1" || adm.Admitted != 0 || adm.Pending != 0 {
		t.Fatalf("admission: %+v (a delegated stream takes no place here)", adm)
	}
	// (the worker's test sink publishes its own results there: this one
	// is told apart by its number)
	coord.Publish(Result{Stream: p.Stream, Frame: 1 << 40, Outcome: "finished"})
	select {
	case r := <-sse:
		if r.Frame != 1<<40 {
			t.Fatalf("result %+v", r)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no result on the coordinator's event stream")
	}
	// and on the client's DataChannel, which ends on the worker
	waitFor(t, "the result on the DataChannel", 10*time.Second, func() bool {
		dc.Lock()
		defer dc.Unlock()
		return slices.ContainsFunc(dcResults, func(r Result) bool { return r.Frame == 1<<40 })
	})
	del, _ := http.NewRequest(http.MethodDelete, hs.URL+"/whip/face/"+p.Stream, nil)
	dr, err := http.DefaultClient.Do(del)
	if err != nil || dr.StatusCode != http.StatusOK {
		t.Fatalf("DELETE: %v %v", dr, err)
	}
	dr.Body.Close()
	select {
	case why := <-sseEnd:
		if why == "" {
			t.Fatal("no reason at the end")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the event stream did not end")
	}
	waitFor(t, "the stream ended on the worker", 10*time.Second, func() bool {
		st := worker.Streams()
		return len(st) == 1 && st[0].State == StateEnded
	})
	p.Close()

	// refused by the workers: the POST says so
	d.refuse = &StatusError{Code: http.StatusServiceUnavailable, Msg: "every ingest worker is full"}
	resp2, err := http.Post(hs.URL+"/whip/face", "application/sdp", strings.NewReader(offerSDP(t)))
	if err != nil {
		t.Fatal(err)
	}
	resp2.Body.Close()
	if resp2.StatusCode != http.StatusServiceUnavailable || resp2.Header.Get("Retry-After") == "" || coord.Admission().Refused[RefusedDelegate] != 1 {
		t.Fatalf("refused by the workers: %d %v, refused %v", resp2.StatusCode, resp2.Header, coord.Admission().Refused)
	}
	// the stream ends (its worker lost) while the worker answers: the POST
	// fails, the worker is told, the token's slot is not kept
	d.refuse = nil
	d.lost = func(id string) { coord.EndDelegated(id, EndWorker, "its ingest worker was lost") }
	resp3, err := http.Post(hs.URL+"/whip/face", "application/sdp", strings.NewReader(offerSDP(t)))
	if err != nil {
		t.Fatal(err)
	}
	resp3.Body.Close()
	d.mu.Lock()
	endedOnWorker := len(d.ended)
	d.mu.Unlock()
	if resp3.StatusCode != http.StatusServiceUnavailable || endedOnWorker != 2 || len(coord.Streams()) != 1 {
		t.Fatalf("ended while answered: %d, %d ends on the worker, streams %+v", resp3.StatusCode, endedOnWorker, coord.Streams())
	}
	d.lost = nil
	// no worker: the coordinator takes it
	d.refuse = ErrNotDelegated
	p3, err := Publish(ctx, ClientConfig{Server: hs.URL, App: "face", Width: 320, Height: 240, FPS: 30})
	if err != nil {
		t.Fatal(err)
	}
	defer p3.Close()
	sendPattern(t, p3, pat, 30, 30)
	waitFor(t, "frames at the coordinator's sink", 10*time.Second, func() bool { return csink.count(p3.Stream) >= 5 })
}
