package whip

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/internal/auth"
	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/media"
)

const (
	tokA   = "token-for-app-a-0123456789"
	tokAll = "token-for-every-app-01234"
	tokAPI = "token-for-the-api-0123456"
	tokCap = "token-capped-two-0123456"
)

// testStore is a tokens file: an ingest token for app a, one for every
// app, an api token, and one for a with 2 streams at 640x360, 5 fps.
func testStore(t testing.TB) *auth.Store {
	t.Helper()
	h := func(tok string) string {
		s, err := auth.Hash(tok)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	doc := "tokens:\n" +
		"  - {name: cam-a, hash: " + h(tokA) + ", role: ingest, apps: [a]}\n" +
		"  - {name: cam-all, hash: " + h(tokAll) + ", role: ingest, apps: ['*']}\n" +
		"  - {name: ops, hash: " + h(tokAPI) + ", role: api}\n" +
		"  - {name: capped, hash: " + h(tokCap) + ", role: ingest, apps: [a], max_streams: 2, max_resolution: 640x360, max_fps: 5}\n" +
		"  - {name: ghost, hash: " + h(tokGhost) + ", role: ingest, apps: [a, ghost]}\n"
	s, err := auth.Parse("tokens.yaml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func do(t *testing.T, h http.Handler, method, path, token, ctype, body, remote string) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	if remote != "" {
		req.RemoteAddr = remote
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	return w
}

// TestTokenAuth: with a tokens file, a missing, unknown, wrong-app or
// wrong-role token gets the same 401 (status, WWW-Authenticate, body:
// nothing learnt, not even whether the app exists); a token for its app
// gets its stream; the API endpoints need the api token; results of a
// stream are not found with a token of another app. Refusals are counted.
func TestTokenAuth(t *testing.T) {
	srv, _, _ := newTestServer(t, Config{Apps: map[dag.AppID]float64{"a": 10, "b": 10}, Auth: testStore(t)})
	h := srv.Handler()
	offer := offerSDP(t)
	var streamB string
	cases := []struct {
		name, method, path, token string
		want                      int
	}{
		{"no token", "POST", "/whip/a", "", 401},
		{"unknown token", "POST", "/whip/a", "not-a-token-at-all-000", 401},
		{"unknown token, unknown app", "POST", "/whip/nope", "not-a-token-at-all-000", 401},
		{"token for a, app b", "POST", "/whip/b", tokA, 401},
		{"token for a, unknown app", "POST", "/whip/nope", tokA, 401},
		{"api token cannot stream", "POST", "/whip/a", tokAPI, 401},
		{"hash as token", "POST", "/whip/a", strings.TrimPrefix(mustHashT(t, tokA), auth.HashPrefix), 401},
		{"token for a, app a", "POST", "/whip/a", tokA, 201},
		{"token for every app, app b", "POST", "/whip/b", tokAll, 201},
		{"every-app token, unknown app", "POST", "/whip/nope", tokAll, 404},
		{"list: no token", "GET", "/v1/streams", "", 401},
		{"list: ingest token", "GET", "/v1/streams", tokAll, 401},
		{"list: api token", "GET", "/v1/streams", tokAPI, 200},
		{"ingest state: no token", "GET", "/v1/ingest", "", 401},
		{"ingest state: api token", "GET", "/v1/ingest", tokAPI, 200},
		{"results of b's stream: token for a", "GET", "/v1/streams/{b}/results", tokA, 404},
		{"delete b's stream: token for a", "DELETE", "/whip/b/{b}", tokA, 401},
		{"delete b's stream: every-app token", "DELETE", "/whip/b/{b}", tokAll, 200},
	}
	var body401 string
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := strings.ReplaceAll(c.path, "{b}", streamB)
			ctype, body := "", ""
			if c.method == "POST" {
				ctype, body = "application/sdp", offer
			}
			w := do(t, h, c.method, path, c.token, ctype, body, "")
			if w.Code != c.want {
				t.Fatalf("%s %s: %d %q, want %d", c.method, path, w.Code, w.Body.String(), c.want)
			}
			if w.Code == 201 && path == "/whip/b" {
				streamB = w.Header().Get("Mdag-Stream")
			}
			if w.Code != 401 {
				return
			}
			if w.Header().Get("WWW-Authenticate") == "" {
				t.Error("401 without WWW-Authenticate")
			}
			if body401 == "" {
				body401 = w.Body.String()
			} else if w.Body.String() != body401 {
				t.Errorf("401 body %q differs from another's %q", w.Body.String(), body401)
			}
		})
	}
	if !strings.Contains(body401, auth.UnauthorizedBody) {
		t.Fatalf("401 body %q", body401)
	}
	totals := map[string]uint64{}
	for _, tt := range srv.IngestTotals() {
		totals[tt.App] += tt.Refused[RefusedUnauthorized]
	}
	// a: no token, unknown, api token, hash; b: token for a (POST,
	// DELETE); -: two POSTs to an unknown app and three API reads (the
	// results read is a 404, not a refusal).
	if totals["a"] != 4 || totals["b"] != 2 || totals[AppUnknown] != 5 {
		t.Errorf("unauthorized refusals by app: %v, want a 4, b 2, %s 5", totals, AppUnknown)
	}
}

// testLogger is a text logger into b, safe for concurrent writes.
func testLogger(b *strings.Builder) *slog.Logger {
	return slog.New(slog.NewTextHandler(&lockedWriter{b: b}, nil))
}

type lockedWriter struct {
	mu sync.Mutex
	b  *strings.Builder
}

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func mustHashT(t *testing.T, tok string) string {
	t.Helper()
	h, err := auth.Hash(tok)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// TestTokenStreamLimit: a token's max_streams are live at once; the next
// POST gets 429 saying which limit, and ending one frees its slot.
func TestTokenStreamLimit(t *testing.T) {
	srv, _, _ := newTestServer(t, Config{Apps: map[dag.AppID]float64{"a": 10}, Auth: testStore(t)})
	h := srv.Handler()
	offer := offerSDP(t)
	var ids []string
	for i := range 2 {
		w := do(t, h, "POST", "/whip/a", tokCap, "application/sdp", offer, "")
		if w.Code != 201 {
			t.Fatalf("POST %d: %d %q", i+1, w.Code, w.Body.String())
		}
		ids = append(ids, w.Header().Get("Mdag-Stream"))
	}
	w := do(t, h, "POST", "/whip/a", tokCap, "application/sdp", offer, "")
	if w.Code != http.StatusTooManyRequests || !strings.Contains(w.Body.String(), `token "capped" has its limit of 2 streams`) || w.Header().Get("Retry-After") == "" {
		t.Fatalf("third POST: %d %q Retry-After %q", w.Code, w.Body.String(), w.Header().Get("Retry-After"))
	}
	// Another token is not held to capped's limit.
	if w := do(t, h, "POST", "/whip/a", tokA, "application/sdp", offer, ""); w.Code != 201 {
		t.Fatalf("another token: %d %q", w.Code, w.Body.String())
	}
	if got := srv.TokenStreams(); got["capped"] != 2 || got["cam-a"] != 1 {
		t.Fatalf("streams by token %v", got)
	}
	byToken := map[string]int{}
	for _, si := range srv.Streams() {
		byToken[si.Token]++
	}
	if byToken["capped"] != 2 || byToken["cam-a"] != 1 {
		t.Fatalf("/v1/streams' token names: %v", byToken)
	}
	if w := do(t, h, "DELETE", "/whip/a/"+ids[0], tokCap, "", "", ""); w.Code != 200 {
		t.Fatalf("DELETE: %d %q", w.Code, w.Body.String())
	}
	if w := do(t, h, "POST", "/whip/a", tokCap, "application/sdp", offer, ""); w.Code != 201 {
		t.Fatalf("POST after a DELETE: %d %q", w.Code, w.Body.String())
	}
	if got := srv.Admission().Refused[RefusedTokenLimit]; got != 1 {
		t.Fatalf("token-limit refusals %d, want 1", got)
	}
}

// TestTokenCaps: a token's caps narrow the app's rate and the server's
// resolution, never widen them; a capped stream's frames are downscaled
// to its cap (or refused with Oversize reject).
func TestTokenCaps(t *testing.T) {
	cases := []struct {
		name           string
		appFPS         float64
		tok            *auth.Token
		fps            float64
		maxW, maxH     int
		token          string
		frameW, frameH int
		oversize       Oversize
		outW, outH     int // 0: refused
	}{
		{"no token", 10, nil, 10, 1920, 1080, "", 1280, 720, Downscale, 1280, 720},
		{"caps below", 10, &auth.Token{Name: "t", MaxFPS: 5, MaxWidth: 640, MaxHeight: 360}, 5, 640, 360, "t", 1280, 720, Downscale, 640, 360},
		{"caps above the server's", 10, &auth.Token{Name: "t", MaxFPS: 30, MaxWidth: 4096, MaxHeight: 4096}, 10, 1920, 1080, "t", 1280, 720, Downscale, 1280, 720},
		{"app takes every frame", 0, &auth.Token{Name: "t", MaxFPS: 2}, 2, 1920, 1080, "t", 320, 240, Downscale, 320, 240},
		{"no caps", 0, &auth.Token{Name: "t"}, 0, 1920, 1080, "t", 320, 240, Downscale, 320, 240},
		{"reject above the cap", 10, &auth.Token{Name: "t", MaxWidth: 640, MaxHeight: 360}, 10, 640, 360, "t", 1280, 720, Reject, 0, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			srv, err := New(Config{Apps: map[dag.AppID]float64{"a": c.appFPS}, Oversize: c.oversize, CPUTime: func() time.Duration { return 0 }}, newSink())
			if err != nil {
				t.Fatal(err)
			}
			defer srv.Close()
			caps := srv.capsFor(c.appFPS, c.tok)
			if caps.fps != c.fps || caps.maxW != c.maxW || caps.maxH != c.maxH || caps.token != c.token {
				t.Fatalf("caps %+v, want fps %g %dx%d token %q", caps, c.fps, c.maxW, c.maxH, c.token)
			}
			st := newStream(srv, "s", "a", caps.fps, nil)
			st.maxW, st.maxH = caps.maxW, caps.maxH
			out, err := st.fit(media.NewFrame(c.frameW, c.frameH))
			switch {
			case c.outW == 0 && err == nil:
				t.Fatalf("a %dx%d frame passed a %dx%d cap with reject", c.frameW, c.frameH, c.maxW, c.maxH)
			case c.outW == 0:
				if !strings.Contains(err.Error(), "above the limit") {
					t.Fatalf("refusal %q", err)
				}
			case err != nil:
				t.Fatal(err)
			case out.W != c.outW || out.H != c.outH:
				t.Fatalf("frame %dx%d, want %dx%d", out.W, out.H, c.outW, c.outH)
			}
		})
	}
}

// TestOfferRateLimit: a flood of offers from one address gets its burst,
// then 429 with Retry-After, counted and logged once; other addresses
// still get through until the global bucket is empty; both refill on the
// fake clock.
func TestOfferRateLimit(t *testing.T) {
	clk := clock.NewFake(time.Unix(1_000_000, 0))
	var logs strings.Builder
	srv, err := New(Config{Apps: map[dag.AppID]float64{"a": 10}, Clock: clk, CPUTime: func() time.Duration { return 0 },
		OfferRates: auth.Rates{PerClient: 1, PerClientBurst: 3, Global: 2, GlobalBurst: 6}, Log: testLogger(&logs)}, newSink())
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	h := srv.Handler()
	// Offers with a wrong Content-Type: past the limiter, refused before
	// any WebRTC work, so the flood costs nothing but the limiter.
	post := func(remote string) *httptest.ResponseRecorder {
		return do(t, h, "POST", "/whip/a", "", "text/plain", "x", remote)
	}
	codes := map[int]int{}
	for range 100 {
		codes[post("192.0.2.1:5000").Code]++
	}
	if codes[http.StatusUnsupportedMediaType] != 3 || codes[http.StatusTooManyRequests] != 97 {
		t.Fatalf("a flood of 100 from one address: %v, want 3 through and 97 limited", codes)
	}
	w := post("192.0.2.1:5001") // another port, the same address
	if w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") != "1" || !strings.Contains(w.Body.String(), "from this address") {
		t.Fatalf("limited: %d %q Retry-After %q", w.Code, w.Body.String(), w.Header().Get("Retry-After"))
	}
	for i, ip := range []string{"192.0.2.2", "192.0.2.3", "192.0.2.4"} {
		if c := post(ip + ":1").Code; c != http.StatusUnsupportedMediaType {
			t.Fatalf("address %d: %d", i, c)
		}
	}
	w = post("192.0.2.5:1") // the global bucket (6) is empty
	if w.Code != http.StatusTooManyRequests || !strings.Contains(w.Body.String(), "in all") {
		t.Fatalf("global: %d %q", w.Code, w.Body.String())
	}
	clk.Advance(time.Second) // global +2, each address +1
	for _, ip := range []string{"192.0.2.1", "192.0.2.5"} {
		if c := post(ip + ":1").Code; c != http.StatusUnsupportedMediaType {
			t.Fatalf("%s after a second: %d", ip, c)
		}
	}
	if got := srv.Admission().Refused[RefusedRateLimit]; got != 99 {
		t.Fatalf("rate-limit refusals %d, want 99", got)
	}
	if n := strings.Count(logs.String(), "rate-limited"); n != 1 {
		t.Fatalf("%d log lines for 99 refusals in one interval, want 1:\n%s", n, logs.String())
	}
	clk.Advance(10 * time.Second)
	for range 10 {
		post("192.0.2.9:1")
	}
	if !strings.Contains(logs.String(), "not_logged_since_last=98") {
		t.Fatalf("the next line does not count those left out:\n%s", logs.String())
	}
}

// FuzzWHIPRequest: any method, path, Authorization, Content-Type and body
// against a server with tokens and rate limits: nothing crashes, no 5xx
// but a 503, a stream starts only for a token of its app, and every 401
// has the one body.
func FuzzWHIPRequest(f *testing.F) {
	offer := offerSDP(f)
	f.Add("POST", "/whip/a", "Bearer "+tokA, "application/sdp", offer)
	f.Add("POST", "/whip/b", "Bearer "+tokA, "application/sdp", offer)
	f.Add("POST", "/whip/a", "bearer  "+tokAll+" ", "application/SDP; charset=x", offer)
	f.Add("DELETE", "/whip/a/../b/x", "Bearer "+tokAPI, "", "")
	f.Add("GET", "/v1/streams/%00/results?access_token="+tokAPI, "", "", "")
	f.Add("GET", "/v1/ingest", "Basic "+tokAPI, "", "")
	f.Add("POST", "/whip/", "Bearer", "application/sdp", "v=0\r\n")
	store := testStore(f)
	srv, err := New(Config{Apps: map[dag.AppID]float64{"a": 5, "b": 5}, MaxStreams: 1 << 20, Auth: store,
		OfferRates: auth.Rates{PerClient: 1e9, PerClientBurst: 1e9}, CPUTime: func() time.Duration { return 0 }}, newSink())
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(srv.Close)
	h := srv.Handler()
	f.Fuzz(func(t *testing.T, method, path, authz, ctype, body string) {
		req, err := http.NewRequest(method, "http://mdag"+path, strings.NewReader(body))
		if err != nil || req.URL.Path == "" || req.URL.Path[0] != '/' {
			return // not a request a server can receive
		}
		req.RemoteAddr = "192.0.2.1:1"
		req.Header.Set("Authorization", authz)
		req.Header.Set("Content-Type", ctype)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		b, _ := io.ReadAll(w.Result().Body)
		switch {
		case w.Code >= 500 && w.Code != http.StatusServiceUnavailable:
			t.Fatalf("%s %q: %d %q", method, path, w.Code, b)
		case w.Code == http.StatusUnauthorized && strings.TrimSpace(string(b)) != auth.UnauthorizedBody:
			t.Fatalf("401 body %q", b)
		case w.Code == http.StatusCreated:
			id := w.Header().Get("Mdag-Stream")
			st := srv.lookup(id)
			if st == nil {
				t.Fatalf("201 without a live stream %q", id)
			}
			tok, _ := auth.Bearer(req, false)
			if tk := store.Lookup(tok); tk == nil || !tk.MayStream(string(st.app)) {
				t.Fatalf("stream into %s without a token for it (Authorization %q)", st.app, authz)
			}
			st.endAs(EndClient, "fuzz")
		}
	})
}

// An IPv6 host holds a /64: its addresses share one offer bucket.
func TestRateKey(t *testing.T) {
	for _, tc := range []struct{ ip, want string }{
		{"192.0.2.7", "192.0.2.7"},
		{"2001:db8:1:2:aaaa::1", "2001:db8:1:2::/64"},
		{"2001:db8:1:2:bbbb::9", "2001:db8:1:2::/64"},
		{"2001:db8:1:3::1", "2001:db8:1:3::/64"},
		{"::ffff:192.0.2.7", "::ffff:192.0.2.7"},
		{"not an address", "not an address"},
	} {
		if got := auth.AddrKey(tc.ip); got != tc.want {
			t.Errorf("auth.AddrKey(%q) = %q, want %q", tc.ip, got, tc.want)
		}
	}
}

// tokGhost may stream into a and into ghost, which is not deployed.
const tokGhost = "ghost-token-0123456789abcdef"

// A token for some apps that names an undeployed one gets 404 without the
// list of deployed apps (it learns of no app beyond its own); an every-app
// token may see them.
func TestUnknownAppHidesOthers(t *testing.T) {
	srv, _, _ := newTestServer(t, Config{Apps: map[dag.AppID]float64{"a": 10, "b": 10}, Auth: testStore(t)})
	h := srv.Handler()
	w := do(t, h, "POST", "/whip/ghost", tokGhost, "application/sdp", offerSDP(t), "192.0.2.1:5000")
	if w.Code != 404 || strings.Contains(w.Body.String(), "deployed:") || strings.Contains(w.Body.String(), `"b"`) {
		t.Errorf("a token for [a ghost] POSTing to ghost: %d %q; want 404 naming no other app", w.Code, w.Body.String())
	}
	w = do(t, h, "POST", "/whip/nope", tokAll, "application/sdp", offerSDP(t), "192.0.2.2:5000")
	if w.Code != 404 || !strings.Contains(w.Body.String(), "deployed: a, b") {
		t.Errorf("an every-app token POSTing to nope: %d %q; want 404 with the deployed apps", w.Code, w.Body.String())
	}
}

// TestGlobalOfferBucketAfterAuth (issue 36, Low): offers without a valid
// token, from however many addresses, spend only their own addresses'
// buckets: a token holder still gets through the global one (before, ten
// addresses guessing emptied it for everyone).
func TestGlobalOfferBucketAfterAuth(t *testing.T) {
	clk := clock.NewFake(time.Unix(1_000_000, 0))
	srv, err := New(Config{Apps: map[dag.AppID]float64{"a": 10}, Clock: clk, CPUTime: func() time.Duration { return 0 }, Auth: testStore(t),
		OfferRates: auth.Rates{PerClient: 1, PerClientBurst: 3, Global: 1, GlobalBurst: 3}}, newSink())
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	h := srv.Handler()
	for i := range 10 {
		if c := do(t, h, "POST", "/whip/a", "guess-guess-guess-guess", "text/plain", "x", fmt.Sprintf("198.51.100.%d:1", i)).Code; c != http.StatusUnauthorized {
			t.Fatalf("a guess from address %d: %d, want 401", i, c)
		}
	}
	if w := do(t, h, "POST", "/whip/a", tokA, "text/plain", "x", "192.0.2.7:1"); w.Code != http.StatusUnsupportedMediaType {
		t.Fatalf("the token holder after 10 guessing addresses: %d %q, want past the limiter (415 for its Content-Type)", w.Code, w.Body.String())
	}
}

// TestFailedAuthThrottled (issue 36, Low): an address whose tokens failed
// FailRates' burst times gets 429 with Retry-After for its failures until
// its bucket refills on the server's clock; a valid token from the same
// address (clients behind one proxy share it) is still served, and other
// addresses are not affected.
func TestFailedAuthThrottled(t *testing.T) {
	clk := clock.NewFake(time.Unix(1_000_000, 0))
	srv, _, _ := newTestServer(t, Config{Apps: map[dag.AppID]float64{"a": 10}, Auth: testStore(t), Clock: clk})
	h := srv.Handler()
	burst := int(auth.FailRates.PerClientBurst)
	for i := range burst {
		if c := do(t, h, "GET", "/v1/streams", "guess-guess-guess-guess", "", "", "203.0.113.9:1").Code; c != http.StatusUnauthorized {
			t.Fatalf("guess %d: %d, want 401", i+1, c)
		}
	}
	w := do(t, h, "GET", "/v1/streams", "guess-guess-guess-guess", "", "", "203.0.113.9:2")
	if w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") == "" || !strings.Contains(w.Body.String(), "failed authentications") {
		t.Fatalf("a failure after %d: %d %q, want 429 with Retry-After", burst, w.Code, w.Body.String())
	}
	if c := do(t, h, "GET", "/v1/streams", tokAPI, "", "", "203.0.113.9:3").Code; c != http.StatusOK {
		t.Fatalf("the api token from the throttled address: %d, want 200", c)
	}
	if c := do(t, h, "GET", "/v1/streams", "guess-guess-guess-guess", "", "", "203.0.113.10:1").Code; c != http.StatusUnauthorized {
		t.Fatalf("another address's failure: %d, want 401", c)
	}
	clk.Advance(time.Second)
	if c := do(t, h, "GET", "/v1/streams", "guess-guess-guess-guess", "", "", "203.0.113.9:4").Code; c != http.StatusUnauthorized {
		t.Fatalf("a second later: %d, want 401 (one try refilled)", c)
	}
}
