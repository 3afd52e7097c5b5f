package auth

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"github.com/mdag/mdag/internal/clock"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/mdag/mdag/internal/yamlx"
)

// Role is what a token may do.
type Role string

const (
	// Ingest may stream into its apps (WHIP POST /whip/{app}), end its
	// streams and read their results.
	Ingest Role = "ingest"
	// API may read the HTTP API: /v1/status, /v1/streams, /v1/ingest,
	// the dashboard and its event stream, thumbnails and /metrics, and end
	// or read any stream.
	API Role = "api"
)

// HashPrefix starts a stored hash: "sha256:" and 64 hex digits.
const HashPrefix = "sha256:"

// MinTokenLen is the shortest token Hash accepts: a hash of a short token
// can be reversed by trying them all.
const MinTokenLen = 16

// Token is one entry of a tokens file. The secret itself is never kept:
// only its SHA-256.
type Token struct {
	// Name labels the token in logs, refusals and /v1/streams (never
	// the secret).
	Name  string
	Roles []Role
	// Apps are the apps an ingest token may stream into; "*": every app.
	Apps []string
	// MaxStreams is the most streams the token may have at once, pending
	// ones included (0: no limit but the server's).
	MaxStreams int
	// MaxWidth and MaxHeight bound its streams' frames (0: the server's
	// limit); MaxFPS the rate its frames are sampled to (0: the app's).
	MaxWidth, MaxHeight int
	MaxFPS              float64

	hash [sha256.Size]byte
}

// Has reports whether t has role r.
func (t *Token) Has(r Role) bool { return slices.Contains(t.Roles, r) }

// MayStream reports whether t may stream into app.
func (t *Token) MayStream(app string) bool {
	return t.Has(Ingest) && (slices.Contains(t.Apps, "*") || slices.Contains(t.Apps, app))
}

// Store is the accepted tokens. A nil *Store accepts nothing.
type Store struct {
	tokens []*Token
	// gatesAPI: the tokens came from a tokens file, so the API needs an
	// api token; false for the simple form (FromPlain), which guards WHIP
	// and results only, as --token-file always did.
	gatesAPI bool
	onRefuse atomic.Pointer[func(*http.Request)]
	fails    *Limiter // failed authentications per client address
}

// FailRates bound failed authentications per client address (an IPv6
// one by its /64) on every token-guarded route: a burst of 20, then one a
// second. Beyond, a request whose token fails is answered 429 (not
// counted or logged one by one) until the address's bucket refills. A
// valid token is always let through: behind a reverse proxy every client
// shares one address, and one client failing must not lock out the rest.
// Guessing gains nothing either way: tokens carry 256 random bits (16
// characters at least for --token-file); the throttle bounds what failing
// clients cost and tells them to back off.
var FailRates = Rates{PerClient: 1, PerClientBurst: 20}

// UseClock makes the failure throttle run on clk (tests: a fake clock).
func (s *Store) UseClock(clk clock.Clock) {
	if s != nil {
		s.fails = NewLimiter(FailRates, clk)
	}
}

// Throttled says whether r's address failed authentication too often
// (FailRates), and when it may try again. Ask it only for a request
// whose token failed.
func (s *Store) Throttled(r *http.Request) (retry time.Duration, throttled bool) {
	if s == nil {
		return 0, false
	}
	ok, retry := s.fails.Peek(ClientKey(r))
	return retry, !ok
}

// Failed counts a failed authentication of r's address.
func (s *Store) Failed(r *http.Request) {
	if s != nil {
		s.fails.AllowClient(ClientKey(r))
	}
}

// ClientKey is the rate limits' key for r's peer: its IP, an IPv6 one by
// its /64 (one host usually holds a whole /64). Proxies' headers are not
// trusted: any client can send them.
func ClientKey(r *http.Request) string {
	ip := r.RemoteAddr
	if h, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		ip = h
	}
	return AddrKey(ip)
}

// AddrKey is ClientKey for an IP address: itself, an IPv6 one's /64.
func AddrKey(ip string) string {
	a := net.ParseIP(ip)
	if a == nil || a.To4() != nil {
		return ip
	}
	return a.Mask(net.CIDRMask(64, 128)).String() + "/64"
}

// TooMany answers 429 to an address Throttled.
func TooMany(w http.ResponseWriter, retry time.Duration) {
	w.Header().Set("Retry-After", strconv.Itoa(int(retry.Seconds())))
	http.Error(w, fmt.Sprintf("too many failed authentications from this address; retry in %d s", int(retry.Seconds())), http.StatusTooManyRequests)
}

// OnRefuse sets what Require does with each request it refuses, before
// answering it (count it, log it rate-limited).
func (s *Store) OnRefuse(f func(r *http.Request)) {
	if s != nil {
		s.onRefuse.Store(&f)
	}
}

// GatesAPI reports whether the API endpoints need an api token.
func (s *Store) GatesAPI() bool { return s != nil && s.gatesAPI }

// Len is the number of tokens.
func (s *Store) Len() int {
	if s == nil {
		return 0
	}
	return len(s.tokens)
}

// Count is the number of tokens with role r.
func (s *Store) Count(r Role) int {
	n := 0
	for _, t := range s.tokens {
		if t.Has(r) {
			n++
		}
	}
	return n
}

// Lookup is the token whose secret is tok, or nil. It hashes tok and
// compares the hash with every stored one in constant time, without
// stopping at a match: the time taken says nothing of which token, or how
// much of one, matched.
func (s *Store) Lookup(tok string) *Token {
	if s == nil || tok == "" {
		return nil
	}
	h := sha256.Sum256([]byte(tok))
	var found *Token
	for _, t := range s.tokens {
		eq := subtle.ConstantTimeCompare(h[:], t.hash[:])
		if eq == 1 && found == nil {
			found = t
		}
	}
	return found
}

// FromPlain is the simple form (--token-file): plaintext tokens, each
// with both roles, every app and no caps, hashed on load. The API stays
// as open as it was (GatesAPI false).
func FromPlain(tokens []string) *Store {
	s := &Store{fails: NewLimiter(FailRates, nil)}
	for i, tok := range tokens {
		s.tokens = append(s.tokens, &Token{Name: "token-file:" + strconv.Itoa(i+1), Roles: []Role{Ingest, API}, Apps: []string{"*"},
			hash: sha256.Sum256([]byte(tok))})
	}
	return s
}

// Hash is the line's hash for a token: "sha256:" and its hex digest.
// Tokens shorter than MinTokenLen, or with spaces, are refused.
func Hash(tok string) (string, error) {
	switch {
	case len(tok) < MinTokenLen:
		return "", fmt.Errorf("a token of %d characters is too short to store hashed (want at least %d; mdag token new makes one)", len(tok), MinTokenLen)
	case strings.ContainsAny(tok, " \t\r\n"):
		return "", errors.New("a token cannot contain spaces")
	}
	h := sha256.Sum256([]byte(tok))
	return HashPrefix + hex.EncodeToString(h[:]), nil
}

// NewToken is a random token: 32 bytes from crypto/rand, base64url. With
// 256 bits of entropy an unsalted SHA-256 cannot be reversed by guessing,
// so the file needs no salt or slow hash.
func NewToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return "mdag_" + base64.RawURLEncoding.EncodeToString(b)
}

// fileDoc is a tokens file:
//
//	tokens:
//	  - name: lobby-camera
//	    hash: sha256:9f86d0...
//	    role: ingest              # or api, or roles: [ingest, api]
//	    apps: [lobby]             # "*": every app
//	    max_streams: 2
//	    max_resolution: 1280x720
//	    max_fps: 10
type fileDoc struct {
	Tokens []tokenDoc `yaml:"tokens"`
}

type tokenDoc struct {
	Name          string   `yaml:"name"`
	Hash          string   `yaml:"hash"`
	Role          string   `yaml:"role"`
	Roles         []string `yaml:"roles"`
	Apps          []string `yaml:"apps"`
	MaxStreams    int      `yaml:"max_streams"`
	MaxResolution string   `yaml:"max_resolution"`
	MaxFPS        float64  `yaml:"max_fps"`
}

// Load reads a tokens file (Parse).
func Load(path string) (*Store, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(path, data)
}

// maxFileSize bounds a tokens file.
const maxFileSize = 1 << 20

// Parse decodes a tokens file strictly: unknown keys, wrong types, a
// missing or malformed hash, an unknown role, an ingest token without
// apps, duplicate names or hashes and caps out of range are all reported,
// each with file:line. A file with no tokens is an error (it would
// silently lock everyone out, or, worse, be read as open).
func Parse(file string, data []byte) (*Store, error) {
	if len(data) > maxFileSize {
		return nil, fmt.Errorf("%s: %d bytes: a tokens file is at most %d", file, len(data), maxFileSize)
	}
	var doc fileDoc
	pos, decodeErrs := yamlx.Decode(file, data, &doc)
	if len(doc.Tokens) == 0 {
		if len(decodeErrs) > 0 {
			return nil, decodeErrs.Err()
		}
		return nil, yamlx.ErrorList{pos.Errorf("tokens", "no tokens in the file (want tokens: [{name, hash, role, apps}...]; mdag token new --app APP prints one)")}.Err()
	}
	var errs yamlx.ErrorList // the semantic problems, reported with the decoding ones
	s := &Store{gatesAPI: true, fails: NewLimiter(FailRates, nil)}
	names := map[string]int{}
	hashes := map[[sha256.Size]byte]int{}
	for i, d := range doc.Tokens {
		p := fmt.Sprintf("tokens[%d]", i)
		bad := func(field, format string, args ...any) {
			path := p
			if field != "" {
				path += "." + field
			}
			errs = append(errs, pos.Errorf(path, format, args...))
		}
		t := &Token{Name: d.Name, Apps: d.Apps, MaxStreams: d.MaxStreams, MaxFPS: d.MaxFPS}
		switch {
		case d.Name == "":
			bad("", "name is required (it labels the token in logs and refusals)")
		case strings.ContainsAny(d.Name, " \t\r\n\"") || len(d.Name) > 64:
			bad("name", "name %q: want at most 64 characters, no spaces or quotes", d.Name)
		default:
			if j, dup := names[d.Name]; dup {
				bad("name", "name %q is also tokens[%d]'s", d.Name, j)
			}
			names[d.Name] = i
		}
		if h, ok := parseHash(d.Hash); !ok {
			bad("hash", "hash %q: want %s and 64 hex digits (mdag token hash TOKEN, or mdag token new)", clip(d.Hash), HashPrefix)
		} else {
			if j, dup := hashes[h]; dup {
				bad("hash", "the same token as tokens[%d]", j)
			}
			hashes[h] = i
			t.hash = h
		}
		roles := d.Roles
		if d.Role != "" {
			if len(roles) > 0 {
				bad("role", "give role or roles, not both")
			}
			roles = []string{d.Role}
		}
		if len(roles) == 0 {
			bad("", "role is required: ingest (stream into apps) or api (read status, dashboard, metrics)")
		}
		for _, r := range roles {
			switch Role(r) {
			case Ingest, API:
				if !t.Has(Role(r)) {
					t.Roles = append(t.Roles, Role(r))
				}
			default:
				bad("role", "role %q: want ingest or api", r)
			}
		}
		if t.Has(Ingest) && len(d.Apps) == 0 {
			bad("", "an ingest token needs apps: the apps it may stream into (\"*\": every app)")
		}
		if !t.Has(Ingest) && (len(d.Apps) > 0 || d.MaxStreams != 0 || d.MaxResolution != "" || d.MaxFPS != 0) {
			bad("", "apps, max_streams, max_resolution and max_fps apply to ingest tokens only")
		}
		for _, a := range d.Apps {
			if a == "" {
				bad("apps", "an empty app name")
			}
		}
		if d.MaxStreams < 0 {
			bad("max_streams", "max_streams %d: want >= 0 (0: no limit but the server's)", d.MaxStreams)
		}
		if d.MaxFPS < 0 || d.MaxFPS != d.MaxFPS || d.MaxFPS > 1000 {
			bad("max_fps", "max_fps %g: want 0 (the app's rate) to 1000", d.MaxFPS)
		}
		if d.MaxResolution != "" {
			w, h, ok := ParseSize(d.MaxResolution)
			if !ok {
				bad("max_resolution", "max_resolution %q: want WxH, e.g. 1280x720", clip(d.MaxResolution))
			}
			t.MaxWidth, t.MaxHeight = w, h
		}
		s.tokens = append(s.tokens, t)
	}
	if err := decodeErrs.Merge(errs).Err(); err != nil {
		return nil, err
	}
	return s, nil
}

// ParseSize parses WxH with both sides in 1..16384.
func ParseSize(v string) (w, h int, ok bool) {
	a, b, found := strings.Cut(strings.ToLower(strings.TrimSpace(v)), "x")
	if !found {
		return 0, 0, false
	}
	w, err1 := strconv.Atoi(a)
	h, err2 := strconv.Atoi(b)
	if err1 != nil || err2 != nil || w <= 0 || h <= 0 || w > 16384 || h > 16384 {
		return 0, 0, false
	}
	return w, h, true
}

func parseHash(v string) ([sha256.Size]byte, bool) {
	var out [sha256.Size]byte
	hexed, ok := strings.CutPrefix(strings.TrimSpace(v), HashPrefix)
	if !ok || len(hexed) != 2*sha256.Size {
		return out, false
	}
	if _, err := hex.Decode(out[:], []byte(strings.ToLower(hexed))); err != nil {
		return out, false
	}
	return out, true
}

// clip shortens a value quoted in an error.
func clip(v string) string {
	if len(v) > 80 {
		return v[:80] + "..."
	}
	return v
}

// Bearer is the request's token: Authorization: Bearer (the scheme is
// case-insensitive, RFC 9110 11.1), else, where query
// is set, the access_token query parameter (RFC 6750 2.3: browsers' img and
// EventSource cannot set headers). ok is false when neither was given.
func Bearer(r *http.Request, query bool) (tok string, ok bool) {
	scheme, t, found := strings.Cut(strings.TrimSpace(r.Header.Get("Authorization")), " ")
	if found && strings.EqualFold(scheme, "Bearer") {
		return strings.TrimSpace(t), true
	}
	if query && r.URL.Query().Has("access_token") {
		return r.URL.Query().Get("access_token"), true
	}
	return "", false
}

// Unauthorized is the one answer to a missing, unknown or insufficient
// token: 401, WWW-Authenticate: Bearer and the same body whatever was
// wrong, so a caller learns nothing of which tokens or apps exist.
func Unauthorized(w http.ResponseWriter) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="mdag"`)
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(http.StatusUnauthorized)
	fmt.Fprintln(w, UnauthorizedBody)
}

// UnauthorizedBody is Unauthorized's body.
const UnauthorizedBody = "unauthorized: a valid bearer token for this endpoint is required (Authorization: Bearer TOKEN)"

// Require wraps h so that a request needs a token with role (header, or
// the access_token query parameter where query is set); a nil store or one
// that does not gate the API lets every request through.
func (s *Store) Require(role Role, query bool, h http.Handler) http.Handler {
	return s.require(role, query, nil, h)
}

// Page is what a browser is shown when a page it opened is refused: a
// whole HTML document, the same bytes for every refusal (it says how to
// get a token, never why this one failed), and the headers to send with
// it (its Content-Security-Policy).
type Page struct {
	HTML   []byte
	Header http.Header
}

// RequirePage is Require (header or access_token query parameter) for a
// page a person opens in a browser: a refused request that accepts
// text/html (AcceptsHTML: a browser's navigation) is answered
// UnauthorizedPage, the same 401 and WWW-Authenticate with page as its
// body; any other client gets Unauthorized's plain body as from Require.
// Throttling (429), counting and OnRefuse are Require's.
func (s *Store) RequirePage(role Role, page Page, h http.Handler) http.Handler {
	return s.require(role, true, &page, h)
}

func (s *Store) require(role Role, query bool, page *Page, h http.Handler) http.Handler {
	if !s.GatesAPI() {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tok, _ := Bearer(r, query)
		if t := s.Lookup(tok); t == nil || !t.Has(role) {
			if retry, throttled := s.Throttled(r); throttled {
				TooMany(w, retry) // neither counted nor logged: the throttle is what bounds them
				return
			}
			s.Failed(r)
			if f := s.onRefuse.Load(); f != nil {
				(*f)(r)
			}
			if page != nil && AcceptsHTML(r) {
				UnauthorizedPage(w, *page)
				return
			}
			Unauthorized(w)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// UnauthorizedPage is Unauthorized for a browser: the same 401 and
// WWW-Authenticate, page's headers and its HTML as the body, never
// cached.
func UnauthorizedPage(w http.ResponseWriter, page Page) {
	for k, v := range page.Header {
		w.Header()[k] = v
	}
	w.Header().Set("WWW-Authenticate", `Bearer realm="mdag"`)
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Content-Length", strconv.Itoa(len(page.HTML)))
	w.WriteHeader(http.StatusUnauthorized)
	_, _ = w.Write(page.HTML)
}

// AcceptsHTML reports whether r's Accept header names text/html (not at
// q=0): what a browser sends when it opens a page, and programs (curl,
// mdag status: no Accept or */*) do not. A wildcard does not count.
func AcceptsHTML(r *http.Request) bool {
	for _, v := range r.Header.Values("Accept") {
		for _, part := range strings.Split(v, ",") {
			typ, params, _ := strings.Cut(part, ";")
			if !strings.EqualFold(strings.TrimSpace(typ), "text/html") {
				continue
			}
			refused := false
			for _, p := range strings.Split(params, ";") {
				k, q, _ := strings.Cut(p, "=")
				if strings.EqualFold(strings.TrimSpace(k), "q") {
					if f, err := strconv.ParseFloat(strings.TrimSpace(q), 64); err == nil && f <= 0 {
						refused = true
					}
				}
			}
			if !refused {
				return true
			}
		}
	}
	return false
}
