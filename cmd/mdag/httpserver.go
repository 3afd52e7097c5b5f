package main

import (
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"
)

// The HTTP ports' connection bounds (variables so tests can shorten
// them): a client has httpHeaderTimeout to send its request headers, at
// most httpMaxHeader bytes of them, and a keep-alive connection idle for
// httpIdleTimeout is closed. Request bodies are bounded by their handlers
// (WHIP offers, the API's JSON); long responses (the event streams) bound
// each write instead (whip and dashboard: a reader that stops is cut off).
var (
	httpHeaderTimeout = 5 * time.Second
	httpIdleTimeout   = 30 * time.Second
	httpMaxHeader     = 64 << 10
)

// newHTTPServer is every HTTP port's server (serve, coordinator, demo,
// --metrics-listen) on ln: the bounds above, and on a loopback listener
// the Host guard (hostGuard).
func newHTTPServer(h http.Handler, ln net.Listener, allowed []string) *http.Server {
	if loopback(ln.Addr().String()) {
		h = hostGuard(h, ln.Addr().String(), allowed)
	}
	return &http.Server{Handler: h, ReadHeaderTimeout: httpHeaderTimeout, IdleTimeout: httpIdleTimeout, MaxHeaderBytes: httpMaxHeader}
}

// hostGuard answers 403 to a request whose Host is not a name of this
// machine (localhost, *.localhost, a loopback address) or one of allowed:
// a server on loopback is reached by local clients under those names
// only, while a web page whose own name an attacker re-points at
// 127.0.0.1 (DNS rebinding) sends its own name. Without the guard such a
// page reads the status, thumbnails and results and drives the API from
// the operator's browser. A request without Host (HTTP/1.0) passes:
// browsers always send one.
func hostGuard(h http.Handler, listen string, allowed []string) http.Handler {
	ok := map[string]bool{}
	for _, a := range allowed {
		// as a Host header is compared: no port, brackets or final dot
		if a = strings.ToLower(strings.TrimSuffix(hostOnly(strings.TrimSpace(a)), ".")); a != "" {
			ok[a] = true
		}
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Host == "" || localHost(r.Host) || ok[strings.ToLower(strings.TrimSuffix(hostOnly(r.Host), "."))] {
			h.ServeHTTP(w, r)
			return
		}
		http.Error(w, fmt.Sprintf("Host %q is not a name of this machine: this server listens on loopback (%s) and answers only localhost, "+
			"127.0.0.1 or ::1 (a guard against DNS rebinding); a reverse proxy's name is added with --allowed-hosts", r.Host, listen), http.StatusForbidden)
	})
}

// hostOnly is a Host header without its port (and an IPv6 address
// without its brackets).
func hostOnly(host string) string {
	if h, _, err := net.SplitHostPort(host); err == nil {
		return h
	}
	return strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
}

// localHost: the Host names this machine (RFC 6761 keeps localhost and
// its subdomains on loopback).
func localHost(host string) bool {
	h := strings.ToLower(strings.TrimSuffix(hostOnly(host), "."))
	if h == "localhost" || strings.HasSuffix(h, ".localhost") {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}
