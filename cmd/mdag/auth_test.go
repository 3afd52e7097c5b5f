package main

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/mdag/mdag/coordinator"
	"github.com/mdag/mdag/internal/auth"
	"go.uber.org/goleak"
)

const (
	testAPIToken    = "api-token-for-tests-0123456789"
	testIngestToken = "ingest-token-for-tests-012345"
)

// testTokens is a tokens file with an api token and an ingest token.
func testTokens(t *testing.T) *auth.Store {
	t.Helper()
	ha, _ := auth.Hash(testAPIToken)
	hi, _ := auth.Hash(testIngestToken)
	s, err := auth.Parse("tokens.yaml", []byte("tokens:\n  - {name: ops, hash: "+ha+", role: api}\n  - {name: cam, hash: "+hi+", role: ingest, apps: [traffic]}\n"))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// startTestObserved is a coordinator (no workers) for the example app
// with its HTTP face, the recorder running.
func startTestObserved(t *testing.T, store *auth.Store) *observed {
	t.Helper()
	app, prof, err := appInputs{example: "traffic"}.load()
	if err != nil {
		t.Fatal(err)
	}
	obs, err := startObserved(coordinator.Config{}, nil, app, prof)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(obs.Close)
	obs.auth = store
	return obs
}

// TestAPITokens: with --tokens the status, the dashboard and its data,
// thumbnails and /metrics need an api token (header, or ?access_token=
// for the browser's page); an ingest token or none gets the same 401;
// /healthz and the dashboard's static code stay open. Without --tokens
// everything is open as before.
func TestAPITokens(t *testing.T) {
	cases := []struct {
		name, path, token string
		query             bool
		gated, open       int // with --tokens, without
	}{
		{"status no token", "/v1/status", "", false, 401, 200},
		{"status ingest token", "/v1/status", testIngestToken, false, 401, 200},
		{"status wrong token", "/v1/status", "nope-nope-nope-nope-nope", false, 401, 200},
		{"status api token", "/v1/status", testAPIToken, false, 200, 200},
		{"status api token in the header", "/v1/status", testAPIToken, false, 200, 200},
		// programs read status and metrics: a token in a URL would land in access logs
		{"status api token in the query", "/v1/status", testAPIToken, true, 401, 200},
		{"metrics api token in the query", "/metrics", testAPIToken, true, 401, 200},
		{"metrics no token", "/metrics", "", false, 401, 200},
		{"metrics api token", "/metrics", testAPIToken, false, 200, 200},
		{"dashboard page no token", "/", "", false, 401, 200},
		{"dashboard page api token", "/", testAPIToken, true, 200, 200},
		{"dashboard history no token", "/v1/dashboard", "", false, 401, 200},
		{"dashboard history api token", "/v1/dashboard", testAPIToken, true, 200, 200},
		{"dashboard events no token", "/v1/dashboard/events", "", false, 401, 0},
		{"thumbnail no token", "/v1/thumbs/s1", "", false, 401, 404},
		{"thumbnail ingest token", "/v1/thumbs/s1", testIngestToken, true, 401, 404},
		{"thumbnail api token", "/v1/thumbs/s1", testAPIToken, true, 404, 404},
		// event clips are camera pixels, gated like thumbnails (the dashboard's links carry ?access_token=)
		{"clips no token", "/v1/clips", "", false, 401, 200},
		{"clips api token in the query", "/v1/clips", testAPIToken, true, 200, 200},
		{"clip no token", "/v1/clips/x.mp4", "", false, 401, 404},
		{"clip api token", "/v1/clips/x.mp4", testAPIToken, true, 404, 404},
		{"healthz", "/healthz", "", false, 200, 200},
		{"dashboard code", "/dashboard/app.js", "", false, 200, 200},
	}
	for _, mode := range []string{"gated", "open"} {
		var store *auth.Store
		if mode == "gated" {
			store = testTokens(t)
		}
		obs := startTestObserved(t, store)
		h := obs.handler()
		refused := 0
		for _, c := range cases {
			want := c.gated
			if mode == "open" {
				want = c.open
			}
			if want == 0 {
				continue // an open event stream does not end
			}
			if want == 401 {
				refused++
			}
			t.Run(mode+"/"+c.name, func(t *testing.T) {
				req := httptest.NewRequest("GET", c.path, nil)
				switch {
				case c.token != "" && c.query:
					req.URL.RawQuery = "access_token=" + c.token
				case c.token != "":
					req.Header.Set("Authorization", "Bearer "+c.token)
				}
				w := httptest.NewRecorder()
				h.ServeHTTP(w, req)
				if w.Code != want {
					t.Fatalf("GET %s: %d %q, want %d", c.path, w.Code, w.Body.String(), want)
				}
				if w.Code == 401 && (w.Header().Get("WWW-Authenticate") == "" || strings.TrimSpace(w.Body.String()) != auth.UnauthorizedBody) {
					t.Fatalf("401: WWW-Authenticate %q, body %q", w.Header().Get("WWW-Authenticate"), w.Body.String())
				}
			})
		}
		// Every refusal is counted.
		want := fmt.Sprintf("mdag_http_requests_refused_total{reason=\"unauthorized\"} %d\n", refused)
		if refused == 0 {
			want = "" // no series before a refusal
		}
		req := httptest.NewRequest("GET", "/metrics", nil)
		req.Header.Set("Authorization", "Bearer "+testAPIToken)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if got := w.Body.String(); !strings.Contains(got, want) || (refused == 0 && strings.Contains(got, "mdag_http_requests_refused_total{")) {
			t.Errorf("%s: want %q in /metrics", mode, want)
		}
	}
}

// TestMetricsListen: --metrics-listen serves /metrics without a token
// while the main address needs one, and serves nothing else.
func TestMetricsListen(t *testing.T) {
	before := goleak.IgnoreCurrent()                   // other tests' goroutines
	t.Cleanup(func() { goleak.VerifyNone(t, before) }) // after obs.Close: the servers and the recorder are gone
	obs := startTestObserved(t, testTokens(t))
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	addr, ms, err := obs.serveMetrics("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ms.Close()
	get := func(url string) (int, string) {
		resp, err := client.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("http://" + addr + "/metrics"); code != 200 || !strings.Contains(body, "mdag_") {
		t.Fatalf("/metrics on --metrics-listen: %d %.200q", code, body)
	}
	if code, body := get("http://" + addr + "/v1/status"); code != 404 || !strings.Contains(body, "/metrics and /healthz only") {
		t.Fatalf("/v1/status on --metrics-listen: %d %q", code, body)
	}
	main := httptest.NewServer(obs.handler())
	defer main.Close()
	if code, _ := get(main.URL + "/metrics"); code != 401 {
		t.Fatalf("/metrics on --listen without a token: %d", code)
	}
	if _, _, err := obs.serveMetrics(addr); err == nil || !strings.Contains(err.Error(), "--metrics-listen") {
		t.Fatalf("a taken address: %v", err)
	}
	if a, s, err := obs.serveMetrics(""); a != "" || s != nil || err != nil {
		t.Fatal("an empty --metrics-listen serves something")
	}
}

// TestTokenCommand: token new prints a token and an entry that loads and
// finds it with its caps; token hash of the same token prints the same
// hash; a short token is refused; bad flags are refused.
func TestTokenCommand(t *testing.T) {
	var out, errb bytes.Buffer
	if code := tokenCmd(strings.Fields("new --app traffic --max-streams 2 --max-resolution 640x360 --max-fps 5"), nil, &out, &errb); code != exitOK {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	tok, entry, ok := strings.Cut(out.String(), "\n")
	tok = strings.TrimPrefix(tok, "token: ")
	if !ok || !strings.HasPrefix(tok, "mdag_") {
		t.Fatalf("output %q", out.String())
	}
	body := entry[strings.Index(entry, "  - name:"):]
	s, err := auth.Parse("new", []byte("tokens:\n"+body))
	if err != nil {
		t.Fatalf("the printed entry does not load: %v\n%s", err, body)
	}
	tk := s.Lookup(tok)
	if tk == nil || !tk.MayStream("traffic") || tk.MaxStreams != 2 || tk.MaxWidth != 640 || tk.MaxFPS != 5 {
		t.Fatalf("token from the entry: %+v", tk)
	}
	for _, app := range []string{"a", "ab", "abc"} { // names shorter than the suffix's window
		if code := tokenCmd([]string{"new", "--app", app}, nil, io.Discard, &errb); code != exitOK {
			t.Fatalf("new --app %s: exit %d: %s", app, code, errb.String())
		}
	}
	out.Reset()
	if code := tokenCmd([]string{"hash"}, strings.NewReader(tok+"\n"), &out, &errb); code != exitOK {
		t.Fatalf("hash: exit %d: %s", code, errb.String())
	}
	if !strings.Contains(body, strings.TrimSpace(out.String())) {
		t.Fatalf("hash %q is not the entry's:\n%s", out.String(), body)
	}
	cases := []struct {
		args  string
		stdin string
		says  string
	}{
		{"hash", "short\n", "too short"},
		{"new --app traffic --role admin", "", `role "admin"`},
		{"new --role ingest", "", "needs apps"},
		{"new --app traffic --max-resolution huge", "", "max_resolution"},
		{"new --role boss --max-streams -1", "", "role \"boss\": want ingest or api\nmdag token new: the new entry:5: tokens[0].max_streams: max_streams -1: want >= 0 (0: no limit but the server's)\n3 problems found"},
		{"", "", "Usage: mdag token"},
	}
	for _, c := range cases {
		errb.Reset()
		if code := tokenCmd(strings.Fields(c.args), strings.NewReader(c.stdin), io.Discard, &errb); code != exitInvalid || !strings.Contains(errb.String(), c.says) {
			t.Errorf("token %s: exit %d %q, want %d saying %q", c.args, code, errb.String(), exitInvalid, c.says)
		}
	}
}

// TestStatusToken: mdag status sends the api token from $MDAG_TOKEN, and
// without one says what the 401 means.
func TestStatusToken(t *testing.T) {
	obs := startTestObserved(t, testTokens(t))
	srv := httptest.NewServer(obs.handler())
	defer srv.Close()
	t.Setenv("MDAG_TOKEN", "")
	var out, errb bytes.Buffer
	if code := run([]string{"status", "--server", srv.URL, "-o", "json"}, &out, &errb); code != exitFailure || !strings.Contains(errb.String(), "put an api token in $MDAG_TOKEN") {
		t.Fatalf("no token: exit %d %q", code, errb.String())
	}
	t.Setenv("MDAG_TOKEN", testAPIToken)
	errb.Reset()
	if code := run([]string{"status", "--server", srv.URL, "-o", "json"}, &out, &errb); code != exitOK || !strings.Contains(out.String(), "traffic") {
		t.Fatalf("api token: exit %d %q %.200q", code, errb.String(), out.String())
	}
}

// TestDrainCrossSite (issue 36, finding 3): a web page the operator opened
// drained an instance with a cross-site POST (202, re-plan), with no token
// required. A request a browser marks as cross-site is now refused before
// the engine sees it; programs (no Origin, no Sec-Fetch-Site) and the
// server's own origin reach it (404 here: no such instance).
func TestDrainCrossSite(t *testing.T) {
	obs := startTestObserved(t, nil)
	h := obs.handler()
	for _, c := range []struct {
		name    string
		headers map[string]string
		want    int
	}{
		{"a program", nil, 404},
		{"same origin", map[string]string{"Origin": "http://example.com", "Sec-Fetch-Site": "same-origin"}, 404},
		{"another origin", map[string]string{"Origin": "http://evil.example"}, 403},
		{"cross-site fetch", map[string]string{"Sec-Fetch-Site": "cross-site"}, 403},
		{"same-site, another port", map[string]string{"Origin": "http://example.com:8081", "Sec-Fetch-Site": "same-site"}, 403},
		{"opaque origin", map[string]string{"Origin": "null"}, 403},
	} {
		t.Run(c.name, func(t *testing.T) {
			req := httptest.NewRequest("POST", "http://example.com/v1/instances/CPU-0-nope/drain", nil)
			for k, v := range c.headers {
				req.Header.Set(k, v)
			}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, req)
			if w.Code != c.want {
				t.Fatalf("POST drain: %d %q, want %d", w.Code, w.Body.String(), c.want)
			}
			if c.want == 403 && !strings.Contains(w.Body.String(), "cross-site") {
				t.Errorf("403 body %q: want the reason", w.Body.String())
			}
		})
	}
}
