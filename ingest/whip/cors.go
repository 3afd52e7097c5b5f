package whip

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
)

// cors admits a request by its Origin: none (not a browser, or a
// same-origin GET), the server's own, or an allowed one get through, the
// last two with the CORS headers naming that origin; any other gets 403
// with the reason (a preflight too, so the browser sends nothing more).
func (s *Server) cors(w http.ResponseWriter, r *http.Request) bool {
	origin := r.Header.Get("Origin")
	h := w.Header()
	h.Add("Vary", "Origin")
	if origin == "" {
		return true
	}
	n, err := NormalizeOrigin(origin)
	switch {
	case err == nil && (s.origins[n] || sameOrigin(n, r)):
		h.Set("Access-Control-Allow-Origin", origin)
	case s.origins["*"]:
		h.Set("Access-Control-Allow-Origin", "*")
	default:
		s.log.Warn("whip: request from a foreign web origin refused", "origin", origin, "method", r.Method, "path", r.URL.Path)
		httpError(w, http.StatusForbidden, fmt.Sprintf("origin %q is not allowed: only pages of this server (%s) may call it from a browser; "+
			"the operator can allow others with --allow-origin", origin, r.Host))
		return false
	}
	h.Set("Access-Control-Allow-Methods", "POST, DELETE, PATCH, OPTIONS, GET")
	h.Set("Access-Control-Allow-Headers", "Authorization, Content-Type, If-Match")
	h.Set("Access-Control-Expose-Headers", "Location, Link, Mdag-Stream, Mdag-Results, Retry-After")
	return true
}

// sameOrigin reports whether normalized origin o is the server's own as
// the request reached it. The host decides, not the scheme: behind a
// proxy that terminates TLS the page's https origin reaches the server as
// plain HTTP.
func sameOrigin(o string, r *http.Request) bool {
	_, host, _ := strings.Cut(o, "://")
	return host == stripDefaultPort(strings.ToLower(r.Host))
}

// NormalizeOrigin checks a web origin (scheme://host[:port], or "*") and
// returns it lowercased without a default port: what browsers send in
// Origin.
func NormalizeOrigin(o string) (string, error) {
	if o == "*" {
		return o, nil
	}
	u, err := url.Parse(strings.TrimSuffix(strings.TrimSpace(o), "/"))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Path != "" || u.RawQuery != "" || u.User != nil || u.Fragment != "" {
		return "", fmt.Errorf("origin %q: want scheme://host[:port] (http or https, no path), or *", o)
	}
	return strings.ToLower(u.Scheme) + "://" + stripDefaultPort(strings.ToLower(u.Host)), nil
}

func stripDefaultPort(host string) string {
	if h, ok := strings.CutSuffix(host, ":80"); ok {
		return h
	}
	if h, ok := strings.CutSuffix(host, ":443"); ok {
		return h
	}
	return host
}
