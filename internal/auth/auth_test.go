package auth

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/mdag/mdag/internal/clock"
)

func mustHash(t testing.TB, tok string) string {
	t.Helper()
	h, err := Hash(tok)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

const (
	camTok = "camera-token-0123456789"
	apiTok = "api-token-0123456789abc"
)

func testFile(t testing.TB) string {
	return "tokens:\n" +
		"  - name: cam\n    hash: " + mustHash(t, camTok) + "\n    role: ingest\n    apps: [lobby]\n    max_streams: 2\n    max_resolution: 640x480\n    max_fps: 5\n" +
		"  - name: ops\n    hash: " + mustHash(t, apiTok) + "\n    role: api\n"
}

// TestParseAndLookup: a valid file's tokens are found by their secret
// only, with their role, apps and caps; an unknown or empty token is not.
func TestParseAndLookup(t *testing.T) {
	s, err := Parse("tokens.yaml", []byte(testFile(t)))
	if err != nil {
		t.Fatal(err)
	}
	if !s.GatesAPI() || s.Len() != 2 || s.Count(Ingest) != 1 || s.Count(API) != 1 {
		t.Fatalf("store: gates %v, %d tokens, %d ingest, %d api", s.GatesAPI(), s.Len(), s.Count(Ingest), s.Count(API))
	}
	cam := s.Lookup(camTok)
	if cam == nil || cam.Name != "cam" || !cam.MayStream("lobby") || cam.MayStream("other") || cam.Has(API) ||
		cam.MaxStreams != 2 || cam.MaxWidth != 640 || cam.MaxHeight != 480 || cam.MaxFPS != 5 {
		t.Fatalf("cam token: %+v", cam)
	}
	ops := s.Lookup(apiTok)
	if ops == nil || !ops.Has(API) || ops.MayStream("lobby") {
		t.Fatalf("ops token: %+v", ops)
	}
	for _, bad := range []string{"", "x", camTok + " ", strings.ToUpper(camTok), mustHash(t, camTok)} {
		if got := s.Lookup(bad); got != nil {
			t.Errorf("Lookup(%q) = %s, want none", bad, got.Name)
		}
	}
	var none *Store
	if none.Lookup(camTok) != nil || none.GatesAPI() || none.Len() != 0 {
		t.Error("a nil store accepts something")
	}
}

// TestParseErrors: each mistake is reported with file:line and what to do.
func TestParseErrors(t *testing.T) {
	h := mustHash(t, camTok)
	cases := []struct {
		name, doc string
		want      []string
	}{
		{"empty", "", []string{"empty document"}},
		{"no tokens", "tokens: []\n", []string{"no tokens in the file"}},
		{"unknown key", "tokens:\n  - name: a\n    hash: " + h + "\n    role: api\n    colour: red\n", []string{"t.yaml:5", "colour"}},
		{"no name", "tokens:\n  - hash: " + h + "\n    role: api\n", []string{"t.yaml:2", "name is required"}},
		{"bad hash", "tokens:\n  - name: a\n    hash: md5:abc\n    role: api\n", []string{"t.yaml:3", "want sha256:"}},
		{"plaintext as hash", "tokens:\n  - name: a\n    hash: " + camTok + "\n    role: api\n", []string{"t.yaml:3", "mdag token hash"}},
		{"no role", "tokens:\n  - name: a\n    hash: " + h + "\n", []string{"t.yaml:2", "role is required"}},
		{"bad role", "tokens:\n  - name: a\n    hash: " + h + "\n    role: admin\n", []string{"t.yaml:4", `role "admin"`}},
		{"role and roles", "tokens:\n  - name: a\n    hash: " + h + "\n    role: api\n    roles: [ingest]\n    apps: [x]\n", []string{"t.yaml:4", "not both"}},
		{"ingest without apps", "tokens:\n  - name: a\n    hash: " + h + "\n    role: ingest\n", []string{"t.yaml:2", "needs apps"}},
		{"caps on api", "tokens:\n  - name: a\n    hash: " + h + "\n    role: api\n    max_fps: 5\n", []string{"ingest tokens only"}},
		{"bad resolution", "tokens:\n  - name: a\n    hash: " + h + "\n    role: ingest\n    apps: [x]\n    max_resolution: big\n", []string{"t.yaml:6", "WxH"}},
		{"negative streams", "tokens:\n  - name: a\n    hash: " + h + "\n    role: ingest\n    apps: [x]\n    max_streams: -1\n", []string{"t.yaml:6", "max_streams -1"}},
		{"bad fps", "tokens:\n  - name: a\n    hash: " + h + "\n    role: ingest\n    apps: [x]\n    max_fps: 5000\n", []string{"t.yaml:6", "max_fps"}},
		{"wrong type", "tokens:\n  - name: a\n    hash: " + h + "\n    role: ingest\n    apps: [x]\n    max_streams: many\n", []string{"t.yaml:6"}},
		{"duplicate name and hash", "tokens:\n  - name: a\n    hash: " + h + "\n    role: api\n  - name: a\n    hash: " + h + "\n    role: api\n",
			[]string{"t.yaml:5", `name "a" is also tokens[0]`, "t.yaml:6", "same token as tokens[0]"}},
		{"two errors at once", "tokens:\n  - name: a\n    hash: nope\n    role: nope\n", []string{"t.yaml:3", "t.yaml:4"}},
		{"decoding and semantic errors at once", "tokens:\n  - name: a\n    hash: nope\n    role: api\n    colour: red\n", []string{"t.yaml:3", "want sha256:", "t.yaml:5", "colour"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, err := Parse("t.yaml", []byte(c.doc))
			if err == nil {
				t.Fatalf("accepted (%d tokens)", s.Len())
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

// TestHashAndNewToken: Hash refuses short or spaced tokens; NewToken's
// tokens are distinct and hash to what Parse accepts.
func TestHashAndNewToken(t *testing.T) {
	for _, bad := range []string{"", "short", "has a space in it ok", "tab\tseparated-token-123"} {
		if _, err := Hash(bad); err == nil {
			t.Errorf("Hash(%q) accepted", bad)
		}
	}
	a, b := NewToken(), NewToken()
	if a == b || len(a) < 40 {
		t.Fatalf("NewToken: %q, %q", a, b)
	}
	s, err := Parse("t", []byte("tokens:\n  - name: n\n    hash: "+mustHash(t, a)+"\n    roles: [ingest, api]\n    apps: ['*']\n"))
	if err != nil {
		t.Fatal(err)
	}
	if tk := s.Lookup(a); tk == nil || !tk.MayStream("anything") || !tk.Has(API) {
		t.Fatalf("lookup of a new token: %+v", tk)
	}
	if s.Lookup(b) != nil {
		t.Fatal("another new token matches")
	}
}

// TestFromPlain: the simple form guards WHIP and results (both roles,
// every app) but not the API.
func TestFromPlain(t *testing.T) {
	s := FromPlain([]string{"alpha", "beta"})
	if s.GatesAPI() || s.Len() != 2 {
		t.Fatalf("gates %v, %d tokens", s.GatesAPI(), s.Len())
	}
	if tk := s.Lookup("beta"); tk == nil || !tk.MayStream("x") || !tk.Has(API) || tk.Name != "token-file:2" {
		t.Fatalf("beta: %+v", tk)
	}
	if s.Lookup("gamma") != nil {
		t.Fatal("gamma accepted")
	}
}

// TestRequire: a gating store lets a token with the role through and
// answers anything else with the same 401 (header and body); query tokens
// only where allowed; a store that does not gate lets everything through.
func TestRequire(t *testing.T) {
	s, err := Parse("t", []byte(testFile(t)))
	if err != nil {
		t.Fatal(err)
	}
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusTeapot) })
	cases := []struct {
		name, header, query string
		allowQuery          bool
		want                int
	}{
		{"api header", "Bearer " + apiTok, "", false, http.StatusTeapot},
		{"api lower-case scheme", "bearer " + apiTok, "", false, http.StatusTeapot},
		{"api query allowed", "", apiTok, true, http.StatusTeapot},
		{"api query not allowed", "", apiTok, false, http.StatusUnauthorized},
		{"none", "", "", true, http.StatusUnauthorized},
		{"unknown", "Bearer nope-nope-nope-nope", "", false, http.StatusUnauthorized},
		{"ingest token for api", "Bearer " + camTok, "", false, http.StatusUnauthorized},
		{"basic scheme", "Basic " + apiTok, "", false, http.StatusUnauthorized},
	}
	var body401 string
	refusals := 0
	s.OnRefuse(func(*http.Request) { refusals++ })
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := httptest.NewRequest("GET", "/v1/status", nil)
			if c.header != "" {
				r.Header.Set("Authorization", c.header)
			}
			if c.query != "" {
				r.URL.RawQuery = "access_token=" + c.query
			}
			w := httptest.NewRecorder()
			s.Require(API, c.allowQuery, ok).ServeHTTP(w, r)
			if w.Code != c.want {
				t.Fatalf("status %d, want %d", w.Code, c.want)
			}
			if c.want == http.StatusUnauthorized {
				if !strings.HasPrefix(w.Header().Get("WWW-Authenticate"), "Bearer") {
					t.Errorf("WWW-Authenticate %q", w.Header().Get("WWW-Authenticate"))
				}
				if body401 == "" {
					body401 = w.Body.String()
				} else if w.Body.String() != body401 {
					t.Errorf("body %q differs from another refusal's %q", w.Body.String(), body401)
				}
			}
		})
	}
	wantRefused := 0
	for _, c := range cases {
		if c.want == http.StatusUnauthorized {
			wantRefused++
		}
	}
	if refusals != wantRefused {
		t.Errorf("OnRefuse called %d times for %d refusals", refusals, wantRefused)
	}
	w := httptest.NewRecorder()
	FromPlain([]string{"a"}).Require(API, false, ok).ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
	if w.Code != http.StatusTeapot {
		t.Fatalf("a non-gating store: %d", w.Code)
	}
}

// TestLimiter: per-client and global buckets refill at their rate on the
// fake clock; a refusal names its scope and a Retry-After that is enough.
func TestLimiter(t *testing.T) {
	clk := clock.NewFake(time.Unix(1000, 0))
	l := NewLimiter(Rates{PerClient: 1, PerClientBurst: 3, Global: 2, GlobalBurst: 5}, clk)
	type step struct {
		advance time.Duration
		client  string
		ok      bool
		scope   string
		retry   time.Duration
	}
	steps := []step{
		{0, "a", true, "", 0}, {0, "a", true, "", 0}, {0, "a", true, "", 0},
		{0, "a", false, ScopeClient, time.Second},    // a's burst spent
		{0, "b", true, "", 0}, {0, "b", true, "", 0}, // global: 5 spent
		{0, "c", false, ScopeGlobal, time.Second},  // c has tokens, the global has none
		{500 * time.Millisecond, "c", true, "", 0}, // global +1
		{0, "a", false, ScopeClient, time.Second},  // a: 0.5 token
		{500 * time.Millisecond, "a", true, "", 0}, // a: 1, global: 1
		{0, "b", false, ScopeGlobal, time.Second},
		{10 * time.Second, "a", true, "", 0},
	}
	for i, s := range steps {
		clk.Advance(s.advance)
		ok, scope, retry := l.Allow(s.client)
		if ok != s.ok || scope != s.scope || retry != s.retry {
			t.Fatalf("step %d (%s): ok %v scope %q retry %v, want %v %q %v", i, s.client, ok, scope, retry, s.ok, s.scope, s.retry)
		}
	}
	if NewLimiter(Rates{}, clk) != nil {
		t.Fatal("zero rates make a limiter")
	}
	var none *Limiter
	if ok, _, _ := none.Allow("x"); !ok {
		t.Fatal("a nil limiter refuses")
	}
}

// TestLimiterBounded: client buckets are bounded; full ones are dropped to
// make room, and with no room a client is held to the global bucket.
func TestLimiterBounded(t *testing.T) {
	clk := clock.NewFake(time.Unix(0, 0))
	l := NewLimiter(Rates{PerClient: 1, PerClientBurst: 1, Global: 1000, GlobalBurst: 1000}, clk)
	l.maxClients = 3
	for _, c := range []string{"a", "b", "c", "d"} {
		if ok, _, _ := l.Allow(c); !ok {
			t.Fatalf("%s refused", c)
		}
	}
	if n := l.Clients(); n != 3 {
		t.Fatalf("%d client buckets, want 3", n)
	}
	clk.Advance(2 * time.Second) // a, b, c refill: dropped when e arrives
	if ok, _, _ := l.Allow("e"); !ok {
		t.Fatal("e refused")
	}
	if n := l.Clients(); n != 1 {
		t.Fatalf("%d client buckets after the sweep, want 1", n)
	}
}

// FuzzParse: no tokens file crashes the parser, and what it accepts has a
// name, a role and a hash that is only found by its own secret.
func FuzzParse(f *testing.F) {
	f.Add([]byte(testFile(f)))
	f.Add([]byte("tokens:\n  - name: a\n    hash: sha256:zz\n"))
	f.Add([]byte("tokens: &a [*a]\n"))
	f.Add([]byte("{"))
	f.Add([]byte("tokens:\n  - {name: x, hash: " + mustHash(f, camTok) + ", roles: [ingest], apps: ['*'], max_resolution: 1x1}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := Parse("f.yaml", data)
		if err != nil {
			if s != nil {
				t.Fatal("a store with an error")
			}
			if !strings.Contains(err.Error(), "f.yaml") {
				t.Fatalf("error without the file: %v", err)
			}
			return
		}
		if s.Len() == 0 {
			t.Fatal("accepted a file with no tokens")
		}
		for _, tk := range s.tokens {
			if tk.Name == "" || len(tk.Roles) == 0 || (tk.Has(Ingest) && len(tk.Apps) == 0) {
				t.Fatalf("accepted an incomplete token %+v", tk)
			}
		}
		if s.Lookup(string(data)) != nil {
			t.Fatal("the file itself is a token")
		}
	})
}

// TestLogLimiter: one line per reason and interval, the next one counting
// those left out.
func TestLogLimiter(t *testing.T) {
	clk := clock.NewFake(time.Unix(0, 0))
	var b strings.Builder
	l := &LogLimiter{Clock: clk, Log: slog.New(slog.NewTextHandler(&b, nil)), Every: 10 * time.Second}
	for range 5 {
		l.Warn("a", "refused")
	}
	l.Warn("b", "refused")
	clk.Advance(9 * time.Second)
	l.Warn("a", "refused")
	if n := strings.Count(b.String(), "\n"); n != 2 {
		t.Fatalf("%d lines, want 2 (a, b):\n%s", n, b.String())
	}
	clk.Advance(time.Second)
	l.Warn("a", "refused")
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 3 || !strings.Contains(lines[2], "reason=a not_logged_since_last=5") {
		t.Fatalf("lines:\n%s", b.String())
	}
}

// TestRequireThrottlesFailures (issue 36, Low: 401s were not rate-limited
// off the WHIP path): after FailRates' burst of failures an address's
// failures get 429 on the API until its bucket refills on the clock; its
// valid tokens are still served (a proxy's clients share the address),
// and so is another address. An IPv6 address counts by its /64.
func TestRequireThrottlesFailures(t *testing.T) {
	s, err := Parse("t", []byte(testFile(t)))
	if err != nil {
		t.Fatal(err)
	}
	clk := clock.NewFake(time.Unix(1_000_000, 0))
	s.UseClock(clk)
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusTeapot) })
	h := s.Require(API, false, ok)
	get := func(tok, remote string) *httptest.ResponseRecorder {
		r := httptest.NewRequest("GET", "/v1/status", nil)
		r.Header.Set("Authorization", "Bearer "+tok)
		r.RemoteAddr = remote
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	for _, from := range [][2]string{{"203.0.113.1:1", "203.0.113.1:2"}, {"[2001:db8::1]:1", "[2001:db8::2]:1"}} {
		for i := range int(FailRates.PerClientBurst) {
			if c := get("nope-nope-nope-nope", from[0]).Code; c != http.StatusUnauthorized {
				t.Fatalf("%s: failure %d: %d", from[0], i+1, c)
			}
		}
		if w := get("nope-nope-nope-nope", from[1]); w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") == "" {
			t.Fatalf("%s after %s's failures: %d, want 429 with Retry-After", from[1], from[0], w.Code)
		}
		if c := get(apiTok, from[1]).Code; c != http.StatusTeapot {
			t.Fatalf("the api token from the throttled address: %d", c)
		}
	}
	if c := get("nope-nope-nope-nope", "203.0.113.2:1").Code; c != http.StatusUnauthorized {
		t.Fatalf("another address: %d", c)
	}
	clk.Advance(time.Second)
	if c := get("nope-nope-nope-nope", "203.0.113.1:3").Code; c != http.StatusUnauthorized {
		t.Fatalf("a second later: %d, want 401", c)
	}
}

// TestRequirePage: a browser opening a page without a valid token gets
// the page (401, WWW-Authenticate, text/html, the page's headers), the
// same bytes whatever was wrong; a program (no text/html in Accept) gets
// Unauthorized's body as before; a valid token, in the header or the
// query, reaches the handler; refusals are counted and throttled alike.
func TestRequirePage(t *testing.T) {
	s, err := Parse("t", []byte(testFile(t)))
	if err != nil {
		t.Fatal(err)
	}
	clk := clock.NewFake(time.Unix(1_000_000, 0))
	s.UseClock(clk)
	refusals := 0
	s.OnRefuse(func(*http.Request) { refusals++ })
	page := Page{HTML: []byte("<!doctype html><p>sign in</p>\n"), Header: http.Header{"Content-Security-Policy": {"default-src 'none'"}}}
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusTeapot) })
	h := s.RequirePage(API, page, ok)
	const browser = "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,*/*;q=0.8"
	get := func(accept, header, query, remote string) *httptest.ResponseRecorder {
		r := httptest.NewRequest("GET", "/", nil)
		if accept != "" {
			r.Header.Set("Accept", accept)
		}
		if header != "" {
			r.Header.Set("Authorization", header)
		}
		if query != "" {
			r.URL.RawQuery = "access_token=" + query
		}
		if remote != "" {
			r.RemoteAddr = remote
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	cases := []struct {
		name, accept, header, query string
		want                        int
		html                        bool
	}{
		{"browser no token", browser, "", "", 401, true},
		{"browser unknown token in the query", browser, "", "nope-nope-nope-nope", 401, true},
		{"browser ingest token in the query", browser, "", camTok, 401, true},
		{"browser unknown token in the header", browser, "Bearer nope-nope-nope-nope", "", 401, true},
		{"browser api token in the query", browser, "", apiTok, http.StatusTeapot, false},
		{"browser api token in the header", browser, "Bearer " + apiTok, "", http.StatusTeapot, false},
		{"curl no token", "*/*", "", "", 401, false},
		{"no Accept", "", "", "", 401, false},
		{"json", "application/json", "Bearer " + camTok, "", 401, false},
		{"html refused", "text/html;q=0, */*", "", "", 401, false},
		{"fetch with the api token", "*/*", "Bearer " + apiTok, "", http.StatusTeapot, false},
	}
	wantRefused := 0
	for _, c := range cases {
		if c.want == 401 {
			wantRefused++
		}
		t.Run(c.name, func(t *testing.T) {
			w := get(c.accept, c.header, c.query, "")
			if w.Code != c.want {
				t.Fatalf("status %d, want %d", w.Code, c.want)
			}
			if c.want != 401 {
				return
			}
			if w.Header().Get("WWW-Authenticate") != `Bearer realm="mdag"` {
				t.Errorf("WWW-Authenticate %q", w.Header().Get("WWW-Authenticate"))
			}
			if c.html {
				if w.Body.String() != string(page.HTML) || w.Header().Get("Content-Type") != "text/html; charset=utf-8" ||
					w.Header().Get("Content-Security-Policy") != "default-src 'none'" || w.Header().Get("Cache-Control") != "no-store" ||
					w.Header().Get("X-Content-Type-Options") != "nosniff" {
					t.Errorf("browser: %v %q, want the page", w.Header(), w.Body.String())
				}
			} else if strings.TrimSpace(w.Body.String()) != UnauthorizedBody || !strings.HasPrefix(w.Header().Get("Content-Type"), "text/plain") ||
				w.Header().Get("Content-Security-Policy") != "" {
				t.Errorf("program: %v %q, want Unauthorized's body", w.Header(), w.Body.String())
			}
		})
	}
	if refusals != wantRefused {
		t.Errorf("OnRefuse called %d times for %d refusals", refusals, wantRefused)
	}
	// The throttle applies to browsers as to programs.
	for i := range int(FailRates.PerClientBurst) {
		if c := get(browser, "", "nope-nope-nope-nope", "203.0.113.9:1").Code; c != 401 {
			t.Fatalf("failure %d: %d", i+1, c)
		}
	}
	if w := get(browser, "", "", "203.0.113.9:2"); w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") == "" {
		t.Fatalf("a browser after its address's failures: %d, want 429", w.Code)
	}
	if c := get(browser, "", apiTok, "203.0.113.9:3").Code; c != http.StatusTeapot {
		t.Fatalf("the api token from the throttled address: %d", c)
	}
	w := httptest.NewRecorder()
	FromPlain([]string{"a-plain-token-0123456789"}).RequirePage(API, page, ok).ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
	if w.Code != http.StatusTeapot {
		t.Fatalf("a non-gating store: %d", w.Code)
	}
}

// TestAcceptsHTML: text/html named (any case, not at q=0) is a browser's
// page load; a wildcard or other types are not.
func TestAcceptsHTML(t *testing.T) {
	for accept, want := range map[string]bool{
		"text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8": true,
		"TEXT/HTML":                          true,
		"application/json, text/html; q=0.5": true,
		"text/html;q=0":                      false,
		"text/html; q=0.0, */*":              false,
		"*/*":                                false,
		"text/*":                             false,
		"":                                   false,
		"application/json":                   false,
		"text/event-stream":                  false,
	} {
		r := httptest.NewRequest("GET", "/", nil)
		if accept != "" {
			r.Header.Set("Accept", accept)
		}
		if got := AcceptsHTML(r); got != want {
			t.Errorf("Accept %q: %v, want %v", accept, got, want)
		}
	}
}
