package webhook

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mdag/mdag/outputs"
)

// got is one request a receiver saw.
type got struct {
	method string
	header http.Header
	body   string
}

// receiver records requests; answer (if set) picks the answer to the
// n-th one (from 0).
type receiver struct {
	mu     sync.Mutex
	reqs   []got
	answer func(n int, w http.ResponseWriter, r *http.Request)
}

func (rc *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	rc.mu.Lock()
	n := len(rc.reqs)
	rc.reqs = append(rc.reqs, got{r.Method, r.Header.Clone(), string(b)})
	answer := rc.answer
	rc.mu.Unlock()
	if answer != nil {
		answer(n, w, r)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (rc *receiver) got() []got {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]got(nil), rc.reqs...)
}

func msgs(n int) []outputs.Message {
	var ms []outputs.Message
	for i := range n {
		ms = append(ms, outputs.Message{
			ID:     fmt.Sprintf("id-%d", i),
			App:    "app",
			Stream: "cam",
			Kind:   "event",
			Body:   fmt.Appendf(nil, `{"n":%d}`, i),
		})
	}
	return ms
}

func newT(t *testing.T, c Config) *Transport {
	t.Helper()
	tr, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	return tr
}

func TestSignedHTTPS(t *testing.T) {
	secret := []byte("s3cret")
	rc := &receiver{}
	srv := httptest.NewTLSServer(rc)
	defer srv.Close()
	pool := x509.NewCertPool()
	pool.AddCert(srv.Certificate())

	tr := newT(t, Config{
		URL:     srv.URL + "/hook?token=abc",
		Secret:  secret,
		Headers: map[string]string{"authorization": "Bearer xyz"},
		TLS:     &tls.Config{RootCAs: pool},
	})
	fixed := time.Unix(1_700_000_000, 0)
	tr.now = func() time.Time { return fixed }
	ms := msgs(1)
	ms[0].Kind = "counts"
	if n, err := tr.Send(context.Background(), ms); n != 1 || err != nil {
		t.Fatalf("Send = %d, %v", n, err)
	}
	g := rc.got()
	if len(g) != 1 {
		t.Fatalf("%d requests", len(g))
	}
	h, body := g[0].header, []byte(g[0].body)
	want := map[string]string{
		"Content-Type":     "application/json",
		"Idempotency-Key":  "id-0",
		"X-Mdag-Event":     "counts",
		"X-Mdag-Timestamp": "1700000000",
		"Authorization":    "Bearer xyz",
	}
	for k, v := range want {
		if h.Get(k) != v {
			t.Errorf("%s = %q, want %q", k, h.Get(k), v)
		}
	}
	if g[0].method != http.MethodPost || g[0].body != `{"n":0}` {
		t.Errorf("got %s %q", g[0].method, g[0].body)
	}
	sig := h.Get("X-Mdag-Signature")
	if !strings.HasPrefix(sig, "t=1700000000,v1=") {
		t.Fatalf("signature %q", sig)
	}
	if sig != Sign(secret, 1_700_000_000, body) {
		t.Errorf("signature %q != Sign", sig)
	}

	// The receiver's side.
	if err := Verify(secret, sig, body, fixed.Add(30*time.Second), 5*time.Minute); err != nil {
		t.Errorf("Verify: %v", err)
	}
	if err := Verify(secret, sig, []byte(`{"n":1}`), fixed, 5*time.Minute); !errors.Is(err, ErrSignatureMismatch) {
		t.Errorf("tampered body: %v", err)
	}
	if err := Verify([]byte("other"), sig, body, fixed, 5*time.Minute); !errors.Is(err, ErrSignatureMismatch) {
		t.Errorf("other secret: %v", err)
	}
	if err := Verify(secret, sig, body, fixed.Add(6*time.Minute), 5*time.Minute); !errors.Is(err, ErrSignatureExpired) {
		t.Errorf("old timestamp: %v", err)
	}
	if err := Verify(secret, sig, body, fixed.Add(-6*time.Minute), 5*time.Minute); !errors.Is(err, ErrSignatureExpired) {
		t.Errorf("future timestamp: %v", err)
	}
	// A replay with the timestamp moved forward no longer matches.
	moved := strings.Replace(sig, "t=1700000000", "t=1700000300", 1)
	if err := Verify(secret, moved, body, fixed.Add(6*time.Minute), 5*time.Minute); !errors.Is(err, ErrSignatureMismatch) {
		t.Errorf("moved timestamp: %v", err)
	}
	// Several v1 (a rotated secret) and unknown keys.
	multi := "t=1700000000,v0=zz,v1=" + strings.Repeat("00", 32) + "," + strings.TrimPrefix(sig, "t=1700000000,")
	if err := Verify(secret, multi, body, fixed, time.Minute); err != nil {
		t.Errorf("multi: %v", err)
	}
	for _, bad := range []string{"", "t=1700000000", "v1=00", "t=x,v1=00", "t=1,t=1,v1=00", "t=1,v1=zz", "garbage"} {
		if err := Verify(secret, bad, body, fixed, time.Minute); !errors.Is(err, ErrBadSignatureHeader) {
			t.Errorf("Verify(%q) = %v", bad, err)
		}
	}
	if err := Verify(nil, sig, body, fixed, time.Minute); err == nil {
		t.Error("Verify with no secret passed")
	}
}

func TestNoSecretNoSignature(t *testing.T) {
	rc := &receiver{}
	srv := httptest.NewServer(rc)
	defer srv.Close()
	tr := newT(t, Config{URL: srv.URL})
	if n, err := tr.Send(context.Background(), msgs(1)); n != 1 || err != nil {
		t.Fatalf("Send = %d, %v", n, err)
	}
	h := rc.got()[0].header
	if _, ok := h["X-Mdag-Signature"]; ok {
		t.Errorf("signature sent without a secret: %q", h.Get("X-Mdag-Signature"))
	}
	if h.Get("X-Mdag-Timestamp") == "" || h.Get("Idempotency-Key") != "id-0" {
		t.Errorf("headers %v", h)
	}
}

func TestOrderAndConnectionReuse(t *testing.T) {
	rc := &receiver{answer: func(n int, w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("ok ok ok")) // an answer body, drained by the client
	}}
	srv := httptest.NewUnstartedServer(rc)
	var conns atomic.Int32
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	tr := newT(t, Config{URL: srv.URL})
	ms := msgs(20)
	if n, err := tr.Send(context.Background(), ms[:10]); n != 10 || err != nil {
		t.Fatalf("Send = %d, %v", n, err)
	}
	if n, err := tr.Send(context.Background(), ms[10:]); n != 10 || err != nil {
		t.Fatalf("Send = %d, %v", n, err)
	}
	g := rc.got()
	if len(g) != 20 {
		t.Fatalf("%d requests", len(g))
	}
	for i, r := range g {
		if r.header.Get("Idempotency-Key") != ms[i].ID || r.body != string(ms[i].Body) {
			t.Errorf("request %d: %s %s", i, r.header.Get("Idempotency-Key"), r.body)
		}
	}
	if c := conns.Load(); c != 1 {
		t.Errorf("%d connections for 20 requests, want 1", c)
	}
}

func TestServerErrorThenResend(t *testing.T) {
	rc := &receiver{answer: func(n int, w http.ResponseWriter, r *http.Request) {
		if n == 1 {
			http.Error(w, "db down", http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusOK)
	}}
	srv := httptest.NewServer(rc)
	defer srv.Close()
	tr := newT(t, Config{URL: srv.URL})
	ms := msgs(3)
	n, err := tr.Send(context.Background(), ms)
	if n != 1 || err == nil || outputs.IsPermanent(err) {
		t.Fatalf("Send = %d, %v; want 1 and a transient error", n, err)
	}
	var se *StatusError
	if !errors.As(err, &se) || se.Code != 500 || se.Body != "db down" {
		t.Errorf("error %v: want a StatusError 500 \"db down\"", err)
	}
	var ra interface{ RetryAfter() time.Duration }
	if errors.As(err, &ra) {
		t.Errorf("a 500 without Retry-After carries RetryAfter: %v", err)
	}
	if n, err := tr.Send(context.Background(), ms[n:]); n != 2 || err != nil {
		t.Fatalf("second Send = %d, %v", n, err)
	}
	var keys []string
	for _, r := range rc.got() {
		keys = append(keys, r.header.Get("Idempotency-Key"))
	}
	if got, want := strings.Join(keys, " "), "id-0 id-1 id-1 id-2"; got != want {
		t.Errorf("keys %q, want %q", got, want)
	}
}

func TestTransientStatuses(t *testing.T) {
	for _, code := range []int{408, 429, 500, 502, 503, 504} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(code)
		}))
		tr := newT(t, Config{URL: srv.URL})
		n, err := tr.Send(context.Background(), msgs(2))
		if n != 0 || err == nil || outputs.IsPermanent(err) {
			t.Errorf("%d: Send = %d, %v; want a transient error", code, n, err)
		}
		srv.Close()
	}
}

func TestTimeout(t *testing.T) {
	// The handlers read the body first: only then does net/http watch
	// the connection and cancel r.Context() when the client hangs up.
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	var srv2 *httptest.Server
	defer func() {
		close(release) // before Close, which waits for the handlers
		srv.Close()
		if srv2 != nil {
			srv2.Close()
		}
	}()

	const timeout = 200 * time.Millisecond
	tr := newT(t, Config{URL: srv.URL, Timeout: timeout})
	start := time.Now()
	n, err := tr.Send(context.Background(), msgs(2))
	took := time.Since(start)
	if n != 0 || err == nil || outputs.IsPermanent(err) {
		t.Fatalf("Send = %d, %v; want a transient error", n, err)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("error %v is not a deadline", err)
	}
	if took < timeout || took > timeout+5*time.Second {
		t.Errorf("Send took %v with Timeout %v", took, timeout)
	}

	// The caller's context is honoured too: cancelled while the receiver
	// holds the request.
	entered := make(chan struct{}, 1)
	srv2 = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		entered <- struct{}{}
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	ctx, cancel := context.WithCancel(context.Background())
	tr2 := newT(t, Config{URL: srv2.URL, Timeout: time.Hour})
	go func() {
		<-entered
		cancel()
	}()
	n, err = tr2.Send(ctx, msgs(2))
	if n != 0 || !errors.Is(err, context.Canceled) || outputs.IsPermanent(err) {
		t.Errorf("cancelled Send = %d, %v", n, err)
	}
}

func TestConnectionRefused(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	tr := newT(t, Config{URL: "http://" + addr + "/hook?key=SECRETQ"})
	n, err := tr.Send(context.Background(), msgs(1))
	if n != 0 || err == nil || outputs.IsPermanent(err) {
		t.Fatalf("Send = %d, %v; want a transient error", n, err)
	}
	if strings.Contains(err.Error(), "SECRETQ") {
		t.Errorf("error shows the query: %v", err)
	}
}

func TestRetryAfter(t *testing.T) {
	for _, code := range []int{429, 503} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Retry-After", "7")
			w.WriteHeader(code)
		}))
		tr := newT(t, Config{URL: srv.URL})
		n, err := tr.Send(context.Background(), msgs(1))
		srv.Close()
		if n != 0 || err == nil || outputs.IsPermanent(err) {
			t.Fatalf("%d: Send = %d, %v", code, n, err)
		}
		var ra interface{ RetryAfter() time.Duration }
		if !errors.As(err, &ra) || ra.RetryAfter() != 7*time.Second {
			t.Errorf("%d: error %v does not carry Retry-After 7s", code, err)
		}
		var se *StatusError
		if !errors.As(err, &se) || se.Code != code {
			t.Errorf("%d: error %v has no StatusError", code, err)
		}
	}

	now := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, c := range []struct {
		v  string
		d  time.Duration
		ok bool
	}{
		{"0", 0, true},
		{" 120 ", 2 * time.Minute, true},
		{"99999999999999999999", MaxRetryAfter, true},
		{"-1", 0, false},
		{"1.5", 0, false},
		{"", 0, false},
		{"soon", 0, false},
		{now.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second, true},
		{now.Add(-time.Hour).Format(http.TimeFormat), 0, true},
		{now.Add(100 * time.Hour).Format(http.TimeFormat), MaxRetryAfter, true},
	} {
		d, ok := parseRetryAfter(c.v, now)
		if d != c.d || ok != c.ok {
			t.Errorf("parseRetryAfter(%q) = %v, %v; want %v, %v", c.v, d, ok, c.d, c.ok)
		}
	}
}

func TestPermanent(t *testing.T) {
	var hits atomic.Int32
	mux := http.NewServeMux()
	mux.HandleFunc("/bad", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusBadRequest)
		w.Write([]byte("bad \x1b[31mjson\n\x00" + strings.Repeat("x", 500)))
	})
	mux.HandleFunc("/moved", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/new", http.StatusFound)
	})
	mux.HandleFunc("/new", func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()

	tr := newT(t, Config{URL: srv.URL + "/bad"})
	n, err := tr.Send(context.Background(), msgs(3))
	if n != 0 || !outputs.IsPermanent(err) {
		t.Fatalf("400: Send = %d, %v; want permanent", n, err)
	}
	var se *StatusError
	if !errors.As(err, &se) || se.Code != 400 {
		t.Fatalf("400: %v", err)
	}
	if len(se.Body) != 200 || !strings.HasPrefix(se.Body, "bad ?[31mjson ?xxx") {
		t.Errorf("400: body snippet %q (%d bytes)", se.Body, len(se.Body))
	}
	if !strings.Contains(err.Error(), "400") {
		t.Errorf("error %q does not name the status", err)
	}

	tr = newT(t, Config{URL: srv.URL + "/moved"})
	n, err = tr.Send(context.Background(), msgs(1))
	if n != 0 || !outputs.IsPermanent(err) || !errors.As(err, &se) || se.Code != 302 {
		t.Fatalf("302: Send = %d, %v; want permanent", n, err)
	}
	if hits.Load() != 0 {
		t.Error("redirect followed")
	}
}

func TestMaxBodyBytes(t *testing.T) {
	rc := &receiver{}
	srv := httptest.NewServer(rc)
	defer srv.Close()
	tr := newT(t, Config{URL: srv.URL, MaxBodyBytes: 10})
	ms := msgs(3)
	ms[1].Body = []byte(`{"n":"0123456789"}`)
	n, err := tr.Send(context.Background(), ms)
	if n != 1 || !outputs.IsPermanent(err) {
		t.Fatalf("Send = %d, %v; want 1 and permanent", n, err)
	}
	if g := rc.got(); len(g) != 1 {
		t.Errorf("%d requests; the large message was sent", len(g))
	}
	// The runner drops it and goes on.
	if n, err := tr.Send(context.Background(), ms[2:]); n != 1 || err != nil {
		t.Fatalf("Send = %d, %v", n, err)
	}

	// A control character in the ID cannot be a header: permanent, no request.
	bad := msgs(1)
	bad[0].ID = "a\r\nX-Evil: 1"
	if n, err := tr.Send(context.Background(), bad); n != 0 || !outputs.IsPermanent(err) {
		t.Fatalf("bad ID: Send = %d, %v", n, err)
	}
	if g := rc.got(); len(g) != 2 {
		t.Errorf("%d requests", len(g))
	}
}

func TestConfig(t *testing.T) {
	for _, c := range []struct {
		name string
		c    Config
		ok   bool
		desc string
	}{
		{"https", Config{URL: "https://user:pw@hooks.example.com:8443/a/b?token=x#f"}, true, "webhook https://hooks.example.com:8443/a/b"},
		{"http loopback", Config{URL: "http://127.0.0.1:9000/h"}, true, "webhook http://127.0.0.1:9000/h"},
		{"http localhost", Config{URL: "http://localhost/h"}, true, "webhook http://localhost/h"},
		{"http ipv6 loopback", Config{URL: "http://[::1]:80/"}, true, "webhook http://[::1]:80/"},
		{"http remote", Config{URL: "http://hooks.example.com/h?k=v"}, true, "webhook http://hooks.example.com/h (plaintext)"},
		{"headers", Config{URL: "https://h/", Headers: map[string]string{"Authorization": "Bearer x", "x-tenant": "a"}}, true, "webhook https://h/"},
		{"tls", Config{URL: "https://h/", TLS: &tls.Config{}}, true, "webhook https://h/"},
		{"limits", Config{URL: "https://h/", Timeout: time.Second, MaxBodyBytes: 10}, true, "webhook https://h/"},
		{"empty", Config{}, false, ""},
		{"no scheme", Config{URL: "hooks.example.com/h"}, false, ""},
		{"ftp", Config{URL: "ftp://h/"}, false, ""},
		{"no host", Config{URL: "https:///h"}, false, ""},
		{"opaque", Config{URL: "https:h"}, false, ""},
		{"bad port", Config{URL: "https://h:99999/"}, false, ""},
		{"bad url", Config{URL: "https://h/%zz"}, false, ""},
		{"tls on http", Config{URL: "http://127.0.0.1/", TLS: &tls.Config{}}, false, ""},
		{"negative timeout", Config{URL: "https://h/", Timeout: -1}, false, ""},
		{"negative max", Config{URL: "https://h/", MaxBodyBytes: -1}, false, ""},
		{"Host", Config{URL: "https://h/", Headers: map[string]string{"Host": "x"}}, false, ""},
		{"content-length", Config{URL: "https://h/", Headers: map[string]string{"content-length": "1"}}, false, ""},
		{"Content-Type", Config{URL: "https://h/", Headers: map[string]string{"Content-Type": "text/plain"}}, false, ""},
		{"Idempotency-Key", Config{URL: "https://h/", Headers: map[string]string{"Idempotency-Key": "x"}}, false, ""},
		{"X-Mdag-Signature", Config{URL: "https://h/", Headers: map[string]string{"x-mdag-signature": "x"}}, false, ""},
		{"X-Mdag-Other", Config{URL: "https://h/", Headers: map[string]string{"X-Mdag-Other": "x"}}, false, ""},
		{"Transfer-Encoding", Config{URL: "https://h/", Headers: map[string]string{"Transfer-Encoding": "chunked"}}, false, ""},
		{"bad name", Config{URL: "https://h/", Headers: map[string]string{"Bad Name": "x"}}, false, ""},
		{"empty name", Config{URL: "https://h/", Headers: map[string]string{"": "x"}}, false, ""},
		{"bad value", Config{URL: "https://h/", Headers: map[string]string{"X-A": "a\r\nX-B: b"}}, false, ""},
	} {
		tr, err := New(c.c)
		if (err == nil) != c.ok {
			t.Errorf("%s: New: %v", c.name, err)
			continue
		}
		if err != nil {
			if strings.Contains(err.Error(), "pw@") || strings.Contains(err.Error(), "token=") {
				t.Errorf("%s: error shows a secret: %v", c.name, err)
			}
			continue
		}
		if d := tr.Describe(); d != c.desc {
			t.Errorf("%s: Describe = %q, want %q", c.name, d, c.desc)
		}
		if tr.timeout <= 0 || tr.maxBody <= 0 {
			t.Errorf("%s: timeout %v, max %d", c.name, tr.timeout, tr.maxBody)
		}
		tr.Close()
	}
	tr := newT(t, Config{URL: "https://h/"})
	if tr.timeout != DefaultTimeout || tr.maxBody != DefaultMaxBodyBytes {
		t.Errorf("defaults: %v %d", tr.timeout, tr.maxBody)
	}
}

func TestCloseLeaksNothing(t *testing.T) {
	rc := &receiver{}
	srv := httptest.NewServer(rc)
	defer srv.Close()
	base := runtime.NumGoroutine()

	tr, err := New(Config{URL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if n, err := tr.Send(context.Background(), msgs(5)); n != 5 || err != nil {
			t.Fatalf("Send = %d, %v", n, err)
		}
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Send(context.Background(), msgs(1)); err == nil {
		t.Error("Send after Close worked")
	}
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > base {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<16)
			t.Fatalf("%d goroutines after Close, %d before:\n%s",
				runtime.NumGoroutine(), base, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond)
	}
}
