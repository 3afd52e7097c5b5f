//go:build !lean

package main

import (
	"bytes"
	"flag"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/examples"
	"github.com/mdag/mdag/ingest/whip"
	"github.com/mdag/mdag/internal/auth"
	"github.com/mdag/mdag/media"
)

// TestAllowOriginFlag: --allow-origin, repeated or comma-separated, lets
// those pages call WHIP from a browser and no others; "*" is allowed but
// warned about; a malformed origin is refused at parse time.
func TestAllowOriginFlag(t *testing.T) {
	app, _, err := examples.Parse("traffic")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name    string
		args    []string
		parse   string   // a parse error containing this; "" none
		allowed []string // origins that get CORS headers
		refused []string
		warn    bool
	}{
		{"default: own pages only", nil, "", nil, []string{"https://a.example"}, false},
		{"repeated", []string{"--allow-origin", "https://a.example", "--allow-origin", "http://b.example:8080"}, "",
			[]string{"https://a.example", "http://b.example:8080"}, []string{"https://c.example", "http://b.example"}, false},
		{"comma-separated", []string{"--allow-origin", "https://a.example, http://b.example:8080"}, "",
			[]string{"https://a.example", "http://b.example:8080"}, []string{"https://c.example"}, false},
		{"any", []string{"--allow-origin", "*"}, "", []string{"https://a.example", "null"}, nil, true},
		{"malformed", []string{"--allow-origin", "a.example"}, "want scheme://host", nil, nil, false},
		{"with a path", []string{"--allow-origin", "https://a.example/app"}, "want scheme://host", nil, nil, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			fs := flag.NewFlagSet("serve", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			wf := addWhipFlags(fs)
			err := fs.Parse(c.args)
			if c.parse != "" {
				if err == nil || !strings.Contains(err.Error(), c.parse) {
					t.Fatalf("parse: %v, want an error saying %q", err, c.parse)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var logs bytes.Buffer
			srv, err := wf.server("127.0.0.1:0", app, nil, nil, slog.New(slog.NewTextHandler(&logs, nil)))
			if err != nil {
				t.Fatal(err)
			}
			defer srv.Close()
			if got := strings.Contains(logs.String(), "level=WARN msg=\"--allow-origin *"); got != c.warn {
				t.Errorf("warning about * logged: %v, want %v:\n%s", got, c.warn, logs.String())
			}
			for _, o := range append(append([]string{}, c.allowed...), c.refused...) {
				req := httptest.NewRequest(http.MethodGet, "/v1/streams", nil)
				req.Header.Set("Origin", o)
				w := httptest.NewRecorder()
				srv.Handler().ServeHTTP(w, req)
				ok := w.Code == 200 && w.Header().Get("Access-Control-Allow-Origin") != ""
				if want := !slices.Contains(c.refused, o); ok != want {
					t.Errorf("origin %q: %d, Access-Control-Allow-Origin %q; allowed: want %v", o, w.Code, w.Header().Get("Access-Control-Allow-Origin"), want)
				}
			}
		})
	}
}

// endSink is a session that takes every frame.
type endSink struct{}

func (endSink) Join(dag.AppID, string) error { return nil }
func (endSink) Leave(string) error           { return nil }
func (endSink) Ingest(string, uint64, time.Time, *media.Frame, []media.Box) error {
	return nil
}

// TestClientServerEnded: `mdag client` notices a stream the server ended,
// stops at once, prints why and exits 4.
func TestClientServerEnded(t *testing.T) {
	const bound = 5 * time.Second
	cases := []struct {
		name string
		cfg  whip.Config
		end  func(t *testing.T, srv *whip.Server, url, stream string)
		says string
	}{
		{"deleted by someone else", whip.Config{}, func(t *testing.T, _ *whip.Server, url, stream string) {
			req, _ := http.NewRequest(http.MethodDelete, url+"/whip/face/"+stream, nil)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
		}, "ended by the server: deleted by the client"},
		{"server shutdown", whip.Config{}, func(_ *testing.T, srv *whip.Server, _, _ string) { srv.Close() }, "ended by the server: server shutting down"},
		{"refused mid-stream", whip.Config{MaxWidth: 32, MaxHeight: 32, Oversize: whip.Reject}, nil, "resolution 64x64 above the limit 32x32"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.cfg.Apps = map[dag.AppID]float64{"face": 10}
			// CPU admission has its own tests: a loaded machine must not
			// refuse these streams.
			c.cfg.CPUTime = func() time.Duration { return 0 }
			srv, err := whip.New(c.cfg, endSink{})
			if err != nil {
				t.Fatal(err)
			}
			hs := httptest.NewServer(srv.Handler())
			defer hs.Close()
			defer srv.Close()
			type result struct {
				code     int
				out, err string
				at       time.Time
			}
			done := make(chan result, 1)
			go func() {
				var out, errb bytes.Buffer
				code := run([]string{"client", "--server", hs.URL, "--app", "face", "--size", "64x64", "--fps", "10", "--duration", "60s", "-o", "json"}, &out, &errb)
				done <- result{code, out.String(), errb.String(), time.Now()}
			}()
			var stream string
			waitFor(t, "the client's stream", 20*time.Second, func() bool {
				for _, s := range srv.Streams() {
					if s.Ingested > 0 || s.Ended != "" {
						stream = s.ID
						return true
					}
				}
				return false
			})
			start := time.Now()
			if c.end != nil {
				c.end(t, srv, hs.URL, stream)
			}
			var r result
			select {
			case r = <-done:
			case <-time.After(bound + 5*time.Second):
				t.Fatalf("mdag client still running %v after the server ended its stream", bound+5*time.Second)
			}
			if took := r.at.Sub(start); took > bound {
				t.Errorf("client returned %v after the end, want within %v", took, bound)
			}
			want := "mdag client: stream " + stream + ": "
			if r.code != exitEnded || !strings.Contains(r.err, want) || !strings.Contains(r.err, c.says) || !strings.Contains(r.out, c.says) {
				t.Errorf("exit %d, want %d; stderr %q, want %q...%q; stdout %q", r.code, exitEnded, r.err, want, c.says, r.out)
			}
		})
	}
}

// TestWhipTokensFlags: --tokens secures a non-loopback --listen (no --open
// needed) and WHIP then takes ingest tokens for the app only; --tokens
// and --token-file together are refused; so are bad offer rates; neither
// on a non-loopback address is refused without --open.
func TestWhipTokensFlags(t *testing.T) {
	app, _, err := examples.Parse("traffic")
	if err != nil {
		t.Fatal(err)
	}
	tokenFile := filepath.Join(t.TempDir(), "tokens.txt")
	if err := os.WriteFile(tokenFile, []byte("plain-token-1-abcdefgh\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		args   []string
		store  bool
		listen string
		says   string // "": accepted
	}{
		{"tokens on a public address", nil, true, "0.0.0.0:8080", ""},
		{"no tokens on a public address", nil, false, "0.0.0.0:8080", "no --tokens or --token-file"},
		{"token-file on a public address", []string{"--token-file", tokenFile}, false, "0.0.0.0:8080", ""},
		{"both", []string{"--token-file", tokenFile}, true, "127.0.0.1:0", "--token-file and --tokens: give one"},
		{"negative rate", []string{"--offer-rate-ip", "-1"}, false, "127.0.0.1:0", "--offer-rate-ip -1"},
		{"burst below one", []string{"--offer-burst", "0.5"}, false, "127.0.0.1:0", "want >= 1"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			fs := flag.NewFlagSet("serve", flag.ContinueOnError)
			wf := addWhipFlags(fs)
			if err := fs.Parse(c.args); err != nil {
				t.Fatal(err)
			}
			var store *auth.Store
			if c.store {
				store = testTokens(t)
			}
			srv, err := wf.server(c.listen, app, nil, store, slog.New(slog.DiscardHandler))
			if c.says != "" {
				if err == nil || !strings.Contains(err.Error(), c.says) {
					t.Fatalf("error %v, want one saying %q", err, c.says)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer srv.Close()
			if srv.Open() {
				t.Fatal("the server is open")
			}
			if !c.store {
				return
			}
			// The api token cannot stream; the ingest token's app is traffic.
			for tok, want := range map[string]int{testAPIToken: 401, testIngestToken: 415} {
				req := httptest.NewRequest(http.MethodPost, "/whip/traffic", strings.NewReader("x"))
				req.Header.Set("Authorization", "Bearer "+tok)
				w := httptest.NewRecorder()
				srv.Handler().ServeHTTP(w, req)
				if w.Code != want {
					t.Errorf("POST with %s: %d %q, want %d", tok, w.Code, w.Body.String(), want)
				}
			}
		})
	}
}

// WHIP's and WHEP's flags are checked with the command's others, before
// anything starts: every problem at once.
func TestWhipFlagsValidated(t *testing.T) {
	for _, cmd := range []string{"serve", "coordinator"} {
		var out, errb bytes.Buffer
		args := []string{cmd, "--example", "traffic", "--policy", "fifo", "--max-streams", "0", "--udp-ports", "9-1", "--whep-bitrate", "10", "--codecs", "av1"}
		code := run(args, &out, &errb)
		want := "mdag " + cmd + ": --policy \"fifo\": want symphony, clockwork or lazy\n"
		if code != exitInvalid || !strings.HasPrefix(errb.String(), want) {
			t.Errorf("%s: exit %d, stderr\n%s\nwant exit %d, starting %q", cmd, code, errb.String(), exitInvalid, want)
		}
		for _, p := range []string{
			"mdag " + cmd + ": --codecs: ", "mdag " + cmd + ": --max-streams 0: want > 0", "mdag " + cmd + ": --udp-ports \"9-1\": want MIN-MAX",
			"mdag " + cmd + ": --whep-max-viewers and --whep-max-per-stream must be at least 1, --whep-bitrate at least 50 (kbit/s); got 32, 8, 10",
			"5 problems found\nRun 'mdag " + cmd + " -h' for its flags.\n",
		} {
			if !strings.Contains(errb.String(), p) {
				t.Errorf("%s: stderr lacks %q:\n%s", cmd, p, errb.String())
			}
		}
	}
}
