package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestHostGuard: a loopback HTTP port answers only this machine's names
// and --allowed-hosts; a rebinding page's Host gets 403 with the reason
// (issue 36 finding 3: before the guard every Host was served).
func TestHostGuard(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := newHTTPServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "ok") }), ln, []string{"mdag.example.com", "proxy.example.com:8443", "[2001:db8::5]", "dot.example.com."})
	go func() { _ = hs.Serve(ln) }()
	defer hs.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	for _, tc := range []struct {
		host string
		want int
	}{
		{fmt.Sprintf("127.0.0.1:%d", port), 200},
		{fmt.Sprintf("localhost:%d", port), 200},
		{"LOCALHOST", 200},
		{"app.localhost:8080", 200},
		{fmt.Sprintf("[::1]:%d", port), 200},
		{"127.0.0.2", 200},
		{"mdag.example.com:443", 200},
		{"mdag.example.com.", 200},
		{"proxy.example.com", 200},
		{"[2001:db8::5]:443", 200},
		{"dot.example.com", 200},
		{"attacker.example:8080", 403},
		{"attacker.example", 403},
		{"localhost.attacker.example", 403},
		{"10.0.0.5:8080", 403},
		{"mdag.example.com.attacker.example", 403},
	} {
		req, _ := http.NewRequest("GET", "http://"+ln.Addr().String()+"/", nil)
		req.Host = tc.host
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("Host %s: %v", tc.host, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("Host %s: %d %q, want %d", tc.host, resp.StatusCode, body, tc.want)
		}
		if tc.want == 403 && !strings.Contains(string(body), "DNS rebinding") {
			t.Errorf("Host %s: 403 without its reason: %q", tc.host, body)
		}
	}
}

// TestHostGuardOnlyOnLoopback: a non-loopback listener is reached by
// names no one can list, so the guard stays off there (tokens guard it).
func TestHostGuardOnlyOnLoopback(t *testing.T) {
	for _, tc := range []struct {
		addr    string
		guarded bool
	}{{"127.0.0.1:8080", true}, {"[::1]:8080", true}, {"0.0.0.0:8080", false}, {"10.0.0.5:8080", false}} {
		a, err := net.ResolveTCPAddr("tcp", tc.addr)
		if err != nil {
			t.Fatal(err)
		}
		hs := newHTTPServer(http.NotFoundHandler(), fakeListener{a}, nil)
		rec := httptest.NewRecorder()
		req := httptest.NewRequest("GET", "http://attacker.example/", nil)
		hs.Handler.ServeHTTP(rec, req)
		if guarded := rec.Code == http.StatusForbidden; guarded != tc.guarded {
			t.Errorf("%s: Host attacker.example answered %d, want guarded %v", tc.addr, rec.Code, tc.guarded)
		}
	}
}

type fakeListener struct{ a net.Addr }

func (fakeListener) Accept() (net.Conn, error) { return nil, net.ErrClosed }
func (fakeListener) Close() error              { return nil }
func (l fakeListener) Addr() net.Addr          { return l.a }

// TestHTTPIdleConnectionsClosed: a keep-alive connection left idle is
// closed after httpIdleTimeout (issue 36 finding 9: only the header
// timeout was set, and 500 idle connections stayed open 20 s+).
func TestHTTPIdleConnectionsClosed(t *testing.T) {
	old := httpIdleTimeout
	httpIdleTimeout = 200 * time.Millisecond
	defer func() { httpIdleTimeout = old }()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := newHTTPServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "ok") }), ln, nil)
	go func() { _ = hs.Serve(ln) }()
	defer hs.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	// the server closes the idle connection: the read ends with EOF well
	// before this bound (without the idle timeout it waits the bound out)
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	start := time.Now()
	if _, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("idle keep-alive connection: read %v after %v, want EOF (closed by the server)", err, time.Since(start).Round(time.Millisecond))
	}
}
