package whip

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestCORS: a browser page of the server's own origin or of a configured
// one may call WHIP and /v1/streams; any other origin gets 403 with the
// reason, its preflight included (no permissive headers, so the browser
// sends nothing more); clients without an Origin (not browsers) get no
// CORS headers and are served; a configured "*" allows every page.
func TestCORS(t *testing.T) {
	type endpoint struct {
		method, path string
		allowed      int // the status when the origin is allowed
	}
	endpoints := []endpoint{
		{"GET", "/v1/streams", 200},
		{"OPTIONS", "/whip/face", 204},
		{"OPTIONS", "/v1/streams/abc/results", 204},
		{"POST", "/whip/face", 415}, // admitted, then refused for its (missing) Content-Type
		{"DELETE", "/whip/face/abc", 404},
		{"PATCH", "/whip/face/abc", 405},
		{"GET", "/v1/streams/abc/results", 404},
	}
	_, _, hs := newTestServer(t, Config{Tokens: []string{"s3cret"}, AllowOrigins: []string{"https://App.example:443/", "http://127.0.0.1:9"}})
	_, _, any := newTestServer(t, Config{Tokens: []string{"s3cret"}, AllowOrigins: []string{"*"}})
	self := hs.URL // http://127.0.0.1:PORT
	cases := []struct {
		name    string
		srv     *httptest.Server
		origin  string
		allowed bool
		acao    string // Access-Control-Allow-Origin when allowed; "" none
	}{
		{"no Origin (not a browser)", hs, "", true, ""},
		{"same origin", hs, self, true, self},
		{"same host behind a TLS proxy", hs, strings.Replace(self, "http://", "https://", 1), true, strings.Replace(self, "http://", "https://", 1)},
		{"configured origin", hs, "https://app.example", true, "https://app.example"},
		{"configured origin, other port", hs, "https://app.example:8443", false, ""},
		{"configured origin, other scheme", hs, "http://app.example", false, ""},
		{"foreign origin", hs, "https://evil.example", false, ""},
		{"foreign port on our host", hs, "http://127.0.0.1:1", false, ""},
		{"opaque origin", hs, "null", false, ""},
		{"any, foreign origin", any, "https://evil.example", true, "*"},
		{"any, opaque origin", any, "null", true, "*"},
		{"any, same origin", any, any.URL, true, any.URL},
	}
	for _, c := range cases {
		for _, e := range endpoints {
			t.Run(c.name+"/"+e.method+" "+e.path, func(t *testing.T) {
				req, _ := http.NewRequest(e.method, c.srv.URL+e.path, nil)
				req.Header.Set("Authorization", "Bearer s3cret")
				if c.origin != "" {
					req.Header.Set("Origin", c.origin)
				}
				if e.method == "OPTIONS" {
					req.Header.Del("Authorization") // preflights carry no credentials
					req.Header.Set("Access-Control-Request-Method", "DELETE")
					req.Header.Set("Access-Control-Request-Headers", "authorization")
				}
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				acao, methods := resp.Header.Get("Access-Control-Allow-Origin"), resp.Header.Get("Access-Control-Allow-Methods")
				if !c.allowed {
					if resp.StatusCode != 403 || !strings.Contains(string(b), "origin") || !strings.Contains(string(b), "--allow-origin") {
						t.Errorf("%d %q, want 403 naming the origin and --allow-origin", resp.StatusCode, b)
					}
					if acao != "" || methods != "" {
						t.Errorf("refused origin got CORS headers: allow-origin %q, methods %q", acao, methods)
					}
					return
				}
				if resp.StatusCode != e.allowed {
					t.Errorf("%d %q, want %d", resp.StatusCode, b, e.allowed)
				}
				if acao != c.acao {
					t.Errorf("Access-Control-Allow-Origin %q, want %q", acao, c.acao)
				}
				if c.acao != "" && (!strings.Contains(methods, "DELETE") || !strings.Contains(resp.Header.Get("Access-Control-Allow-Headers"), "Authorization")) {
					t.Errorf("allowed origin: methods %q, headers %q", methods, resp.Header.Get("Access-Control-Allow-Headers"))
				}
				if !strings.Contains(resp.Header.Get("Vary"), "Origin") {
					t.Errorf("Vary %q: caches must key on Origin", resp.Header.Get("Vary"))
				}
			})
		}
	}
}

// TestAllowOriginsInvalid: a configured origin that is not
// scheme://host[:port] is refused with the reason.
func TestAllowOriginsInvalid(t *testing.T) {
	for _, o := range []string{"app.example", "ftp://app.example", "https://app.example/path", "https://", "https://u@app.example", ""} {
		if _, err := New(Config{AllowOrigins: []string{o}}, newSink()); err == nil || !strings.Contains(err.Error(), "scheme://host") {
			t.Errorf("origin %q: %v", o, err)
		}
	}
	for o, want := range map[string]string{"*": "*", "HTTPS://App.Example:443/": "https://app.example", "http://h:80": "http://h", "http://h:8080": "http://h:8080"} {
		if got, err := NormalizeOrigin(o); err != nil || got != want {
			t.Errorf("NormalizeOrigin(%q) = %q, %v; want %q", o, got, err, want)
		}
	}
}

// TestBearerScheme: the auth scheme is case-insensitive (RFC 9110 11.1);
// the token is not.
func TestBearerScheme(t *testing.T) {
	_, _, hs := newTestServer(t, Config{Tokens: []string{"s3cret"}})
	cases := []struct {
		header string
		want   int
		says   string
	}{
		{"Bearer s3cret", 200, ""},
		{"bearer s3cret", 200, ""},
		{"BEARER s3cret", 200, ""},
		{"bEaReR s3cret", 200, ""},
		{"Bearer   s3cret  ", 200, ""},
		{"Bearer S3CRET", 401, "unauthorized"},
		{"bearer wrong", 401, "unauthorized"},
		{"Bearer", 401, "unauthorized"},
		{"Bearers3cret", 401, "unauthorized"},
		{"Basic s3cret", 401, "unauthorized"},
		{"", 401, "unauthorized"},
	}
	for _, c := range cases {
		t.Run(c.header, func(t *testing.T) {
			req, _ := http.NewRequest("GET", hs.URL+"/v1/streams", nil)
			if c.header != "" {
				req.Header.Set("Authorization", c.header)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != c.want || !strings.Contains(string(b), c.says) {
				t.Errorf("%q: %d %q, want %d saying %q", c.header, resp.StatusCode, b, c.want, c.says)
			}
		})
	}
}
