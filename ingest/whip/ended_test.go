package whip

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mdag/mdag/ingest/synth"
)

// TestServerEndsStream: whatever ends a stream on the server's side, the
// Publisher notices within a bound: Done closes, Err and WriteFrame say
// why (the server's reason, from its goodbye on the DataChannel, or from
// its stream list when the connection closed without one).
func TestServerEndsStream(t *testing.T) {
	const bound = 5 * time.Second // the goodbye is acknowledged within a round trip; the list lookup is bounded by 3 s
	cases := []struct {
		name string
		cfg  Config
		size int
		end  func(t *testing.T, srv *Server, hs string, p *Publisher)
		says string
	}{
		{"deleted by someone else", Config{}, 64, func(t *testing.T, _ *Server, hs string, p *Publisher) {
			req, _ := http.NewRequest(http.MethodDelete, hs+"/whip/face/"+p.Stream, nil)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("DELETE: %s", resp.Status)
			}
		}, "ended by the server: deleted by the client"},
		// The idle clock starts at the answer: a timeout shorter than ICE
		// takes to connect on 2 busy cores under -race ended the stream
		// before it connected ("ICE did not connect"): 3 s, not 500 ms.
		{"idle timeout", Config{IdleTimeout: 3 * time.Second}, 64, nil, "ended by the server: no media for 3s"},
		{"server shutdown", Config{}, 64, func(t *testing.T, srv *Server, _ string, _ *Publisher) { srv.Close() },
			"ended by the server: server shutting down"},
		{"refused mid-stream", Config{MaxWidth: 32, MaxHeight: 32, Oversize: Reject}, 64, nil,
			"ended by the server: resolution 64x64 above the limit 32x32"},
		{"connection closed without a goodbye", Config{}, 64, func(t *testing.T, srv *Server, _ string, p *Publisher) {
			st := srv.lookup(p.Stream)
			if st == nil {
				t.Fatal("no such stream")
			}
			_ = st.pc.Close() // as a crashing server would, no DataChannel message
		}, "peer connection closed"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			srv, _, hs := newTestServer(t, c.cfg)
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			p, err := Publish(ctx, ClientConfig{Server: hs.URL, App: "face", Width: c.size, Height: c.size, FPS: 30})
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			pat, err := synth.NewPattern(c.size, c.size, 1)
			if err != nil {
				t.Fatal(err)
			}
			if c.name != "idle timeout" {
				// Media flows before the end (the oversize refusal needs a frame).
				for i := range 5 {
					f, _, _ := pat.Frame(0, uint64(i))
					if err := p.WriteFrame(f, time.Now()); err != nil {
						break
					}
				}
			}
			start := time.Now()
			if c.end != nil {
				c.end(t, srv, hs.URL, p)
			}
			select {
			case <-p.Done():
			case <-time.After(bound + 5*time.Second): // the idle timeout runs first
				t.Fatalf("the publisher did not notice the end in %v", bound+5*time.Second)
			}
			took := time.Since(start)
			var ee *EndedError
			if err := p.Err(); !errors.As(err, &ee) || ee.Stream != p.Stream || !strings.Contains(ee.Reason, c.says) {
				t.Fatalf("Err() = %v, want an EndedError saying %q", err, c.says)
			}
			if c.end != nil && took > bound {
				t.Errorf("noticed after %v, want within %v", took, bound)
			}
			t.Logf("noticed in %v: %v", took, p.Err())
			f, _, _ := pat.Frame(0, 9)
			if err := p.WriteFrame(f, time.Now()); !errors.As(err, &ee) {
				t.Errorf("WriteFrame after the end: %v", err)
			}
		})
	}
}

// TestCloseIsNotAnEnd: the client's own Close is not reported as the
// server ending the stream.
func TestCloseIsNotAnEnd(t *testing.T) {
	_, _, hs := newTestServer(t, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	p, err := Publish(ctx, ClientConfig{Server: hs.URL, App: "face", Width: 64, Height: 64})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.Done():
	default:
		t.Fatal("Done open after Close")
	}
	if err := p.Err(); err != nil {
		t.Errorf("Err after Close: %v", err)
	}
}
