// Package webhook delivers outputs to an HTTP(S) receiver: one POST per
// message, in order, one request at a time.
//
// # Request
//
// Every message is one request:
//
//	POST <Config.URL>
//	Content-Type: application/json
//	Idempotency-Key: <Message.ID>
//	X-Mdag-Event: <Message.Kind>
//	X-Mdag-Timestamp: <unix seconds when this attempt was sent>
//	X-Mdag-Signature: t=<the same unix seconds>,v1=<hex HMAC-SHA256>   (only when Config.Secret is set)
//	<Config.Headers>
//
//	<Message.Body: the mdag.output/v1 JSON>
//
// Delivery is at least once: a message the receiver already took may come
// again (after a timeout, a 5xx, a restart), always with the same
// Idempotency-Key; a receiver drops a second copy by it. Messages of one
// output arrive in order, never more than one in flight.
//
// # Signature
//
// With Config.Secret set, X-Mdag-Signature is
//
//	t=<ts>,v1=<hex(HMAC-SHA256(secret, "<ts>." + body))>
//
// where <ts> is the decimal unix time of the attempt (as in
// X-Mdag-Timestamp) and body the exact bytes of the request body (verify
// before parsing it). The timestamp is inside the signed text, so a
// receiver that refuses a signature older than a few minutes refuses a
// replayed request too; each attempt is signed afresh. A receiver checks
// it with [Verify], or by hand: split the header on ",", take t and every
// v1 (ignore other keys), compute the HMAC over t + "." + body, compare it
// in constant time with each v1, and refuse if none matches or |now - t|
// is over its tolerance.
//
// # Answers
//
// A 2xx acknowledges the message. 408, 429 and 5xx, a timeout (no full
// answer within Config.Timeout) and a connection or TLS failure are
// transient: Send returns a plain error and the caller sends the message
// again later; for a 429 or 503 with a Retry-After header (seconds or an
// HTTP date) the error is a *[RetryAfterError], whose RetryAfter method
// says how long the receiver asked to be left alone (find it with
// errors.As against interface{ RetryAfter() time.Duration }). Every
// other status is permanent (outputs.Permanent, wrapping a *[StatusError]
// with the status and the first 200 bytes of the answer): other 4xx, and
// 3xx, since redirects are not followed (a webhook that moved is a
// configuration to fix, and a redirect would turn the POST into a GET).
// A message whose body is over Config.MaxBodyBytes is refused as
// permanent without a request.
package webhook

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/textproto"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/mdag/mdag/outputs"
)

const (
	// DefaultTimeout bounds one request when Config.Timeout is 0.
	DefaultTimeout = 10 * time.Second
	// DefaultMaxBodyBytes is the largest message body sent when
	// Config.MaxBodyBytes is 0.
	DefaultMaxBodyBytes = 1 << 20
	// MaxRetryAfter caps a receiver's Retry-After.
	MaxRetryAfter = 24 * time.Hour

	// maxResponseBytes is how much of an answer is read (the rest is
	// dropped with the connection); snippetBytes how much of it goes into
	// an error.
	maxResponseBytes = 64 << 10
	snippetBytes     = 200
)

// The headers a request always carries, set by the transport.
const (
	HeaderIdempotencyKey = "Idempotency-Key"
	HeaderEvent          = "X-Mdag-Event"
	HeaderTimestamp      = "X-Mdag-Timestamp"
	HeaderSignature      = "X-Mdag-Signature"
)

// Config configures a webhook Transport.
type Config struct {
	// URL is where messages are POSTed: http:// or https://. Userinfo in
	// it is sent as basic auth. An http URL to a host other than loopback
	// is allowed, marked "(plaintext)" by Describe.
	URL string
	// Secret is the HMAC-SHA256 key of X-Mdag-Signature; empty: no
	// signature header is sent.
	Secret []byte
	// Timeout bounds one request, from dialing to the end of the answer;
	// 0: DefaultTimeout.
	Timeout time.Duration
	// Headers are extra request headers (e.g. Authorization). Host,
	// Content-Length, Content-Type, hop-by-hop headers, Idempotency-Key
	// and X-Mdag-* are refused: the transport sets them.
	Headers map[string]string
	// TLS configures https (e.g. a private CA, a client certificate); nil:
	// the system roots. Refused with an http URL.
	TLS *tls.Config
	// MaxBodyBytes is the largest message body sent; a larger message is
	// refused as permanent. 0: DefaultMaxBodyBytes.
	MaxBodyBytes int
}

// reserved are the headers Config.Headers may not set (canonical form);
// X-Mdag-* are refused too.
var reserved = map[string]bool{
	"Host":               true,
	"Content-Length":     true,
	"Content-Type":       true,
	"Transfer-Encoding":  true,
	"Connection":         true,
	"Keep-Alive":         true,
	"Proxy-Connection":   true,
	"Te":                 true,
	"Trailer":            true,
	"Upgrade":            true,
	HeaderIdempotencyKey: true,
	"X-Idempotency-Key":  true,
	HeaderEvent:          true,
	HeaderTimestamp:      true,
	HeaderSignature:      true,
	"Content-Encoding":   true,
	"Expect":             true,
}

// Transport is an outputs.Transport to one webhook receiver.
type Transport struct {
	url      string // as configured (userinfo becomes basic auth)
	dest     string // "webhook https://host/path": no userinfo, no query
	describe string // dest, "(plaintext)" marked
	secret   []byte
	timeout  time.Duration
	maxBody  int
	headers  http.Header
	client   *http.Client
	ht       *http.Transport
	closed   atomic.Bool
	now      func() time.Time // tests
}

var _ outputs.Transport = (*Transport)(nil)

// New checks c and returns its Transport; it does no I/O (the first Send
// connects).
func New(c Config) (*Transport, error) {
	u, err := url.Parse(c.URL)
	if err != nil {
		// url.Error quotes the URL, which may hold a secret.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, fmt.Errorf("webhook: bad URL: %w", err)
	}
	switch u.Scheme {
	case "http", "https":
	case "":
		return nil, errors.New("webhook: URL needs http:// or https://")
	default:
		return nil, fmt.Errorf("webhook: URL scheme %q: want http or https", u.Scheme)
	}
	if u.Opaque != "" || u.Hostname() == "" {
		return nil, errors.New("webhook: URL has no host")
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("webhook: URL port %q", p)
		}
	}
	if c.TLS != nil && u.Scheme != "https" {
		return nil, errors.New("webhook: TLS set for an http:// URL")
	}
	if c.Timeout < 0 {
		return nil, fmt.Errorf("webhook: negative Timeout %v", c.Timeout)
	}
	if c.MaxBodyBytes < 0 {
		return nil, fmt.Errorf("webhook: negative MaxBodyBytes %d", c.MaxBodyBytes)
	}
	h := http.Header{}
	for k, v := range c.Headers {
		if !validToken(k) {
			return nil, fmt.Errorf("webhook: header name %q", k)
		}
		ck := textproto.CanonicalMIMEHeaderKey(k)
		if reserved[ck] || strings.HasPrefix(ck, "X-Mdag-") {
			return nil, fmt.Errorf("webhook: header %s is set by the transport", ck)
		}
		if !validValue(v) {
			return nil, fmt.Errorf("webhook: header %s: value has a control character", ck)
		}
		h.Set(ck, v)
	}
	if h.Get("User-Agent") == "" {
		h.Set("User-Agent", "mdag-webhook")
	}

	t := &Transport{
		url:     u.String(),
		secret:  bytes.Clone(c.Secret),
		timeout: c.Timeout,
		maxBody: c.MaxBodyBytes,
		headers: h,
		now:     time.Now,
	}
	if t.timeout == 0 {
		t.timeout = DefaultTimeout
	}
	if t.maxBody == 0 {
		t.maxBody = DefaultMaxBodyBytes
	}
	d := url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path, RawPath: u.RawPath}
	t.dest = "webhook " + d.String()
	t.describe = t.dest
	if u.Scheme == "http" && !loopback(u.Hostname()) {
		t.describe += " (plaintext)"
	}

	ht := http.DefaultTransport.(*http.Transport).Clone()
	if c.TLS != nil {
		ht.TLSClientConfig = c.TLS.Clone()
	}
	ht.ResponseHeaderTimeout = 0 // the per-request context bounds it all
	t.ht = ht
	t.client = &http.Client{
		Transport: ht,
		// No Timeout: each request has its own context deadline.
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
	return t, nil
}

// Describe names the receiver: "webhook https://host/path", without
// userinfo or query (either may hold a secret), with " (plaintext)" after
// an http URL to a host other than loopback.
func (t *Transport) Describe() string { return t.describe }

// Close drops the idle connections; Send after Close fails.
func (t *Transport) Close() error {
	t.closed.Store(true)
	t.ht.CloseIdleConnections()
	return nil
}

var errClosed = errors.New("transport closed")

// Send POSTs batch in order, one request at a time, and stops at the
// first message not acknowledged: acked is how many got a 2xx. See the
// package comment for how errors are classified.
func (t *Transport) Send(ctx context.Context, batch []outputs.Message) (acked int, err error) {
	if t.closed.Load() {
		return 0, fmt.Errorf("%s: %w", t.dest, errClosed)
	}
	for i := range batch {
		if err := ctx.Err(); err != nil {
			return i, fmt.Errorf("%s: %w", t.dest, err)
		}
		if err := t.post(ctx, &batch[i]); err != nil {
			return i, err
		}
	}
	return len(batch), nil
}

func (t *Transport) post(ctx context.Context, m *outputs.Message) error {
	if len(m.Body) > t.maxBody {
		return outputs.Permanent("%s: message %q: body of %d bytes is over MaxBodyBytes %d",
			t.dest, sanitize(m.ID), len(m.Body), t.maxBody)
	}
	if !validValue(m.ID) || !validValue(m.Kind) {
		return outputs.Permanent("%s: message %q: ID or Kind has a control character",
			t.dest, sanitize(m.ID))
	}

	rctx, cancel := context.WithTimeout(ctx, t.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, t.url, bytes.NewReader(m.Body))
	if err != nil {
		return fmt.Errorf("%s: %w", t.dest, stripURL(err))
	}
	req.Header = t.headers.Clone()
	ts := t.now().Unix()
	req.Header.Set("Content-Type", "application/json")
	// An Idempotency-Key also lets net/http resend the POST by itself
	// when a kept-alive connection turns out dead before any answer.
	if m.ID != "" {
		req.Header.Set(HeaderIdempotencyKey, m.ID)
	}
	if m.Kind != "" {
		req.Header.Set(HeaderEvent, m.Kind)
	}
	req.Header.Set(HeaderTimestamp, strconv.FormatInt(ts, 10))
	if len(t.secret) > 0 {
		req.Header.Set(HeaderSignature, Sign(t.secret, ts, m.Body))
	}

	resp, err := t.client.Do(req)
	if err != nil {
		err = stripURL(err)
		switch {
		case ctx.Err() != nil:
			return fmt.Errorf("%s: %w", t.dest, err)
		case rctx.Err() != nil:
			return fmt.Errorf("%s: no answer within %v: %w", t.dest, t.timeout, context.DeadlineExceeded)
		}
		return fmt.Errorf("%s: %w", t.dest, err)
	}
	// Read what is left of the answer (up to maxResponseBytes) so the
	// connection goes back to the pool; past that it is closed.
	body, _ := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes))
	resp.Body.Close()

	code := resp.StatusCode
	if code >= 200 && code <= 299 {
		return nil
	}
	se := &StatusError{Code: code, Body: sanitize(string(body[:min(len(body), snippetBytes)]))}
	switch {
	case code == http.StatusRequestTimeout, code == http.StatusTooManyRequests, code >= 500 && code <= 599:
		err := fmt.Errorf("%s: %w", t.dest, se)
		if code == http.StatusTooManyRequests || code == http.StatusServiceUnavailable {
			if d, ok := parseRetryAfter(resp.Header.Get("Retry-After"), t.now()); ok {
				return &RetryAfterError{Err: err, After: d}
			}
		}
		return err
	}
	return outputs.Permanent("%s: %w", t.dest, se)
}

// StatusError is a receiver's answer other than 2xx.
type StatusError struct {
	Code int
	// Body is the first 200 bytes of the answer, non-printable characters
	// replaced.
	Body string
}

func (e *StatusError) Error() string {
	s := fmt.Sprintf("HTTP %d", e.Code)
	if txt := http.StatusText(e.Code); txt != "" {
		s += " " + txt
	}
	if e.Code >= 300 && e.Code <= 399 {
		s += " (redirects are not followed: fix the URL)"
	}
	if e.Body != "" {
		s += fmt.Sprintf(": %q", e.Body)
	}
	return s
}

// RetryAfterError is a transient failure (a 429 or 503) whose receiver
// asked, with Retry-After, not to be sent anything for After. The runner
// finds it with errors.As against interface{ RetryAfter() time.Duration }
// and waits at least that long (it may cap it) before the next Send.
type RetryAfterError struct {
	Err   error
	After time.Duration
}

func (e *RetryAfterError) Error() string {
	return fmt.Sprintf("%v (Retry-After %v)", e.Err, e.After)
}
func (e *RetryAfterError) Unwrap() error             { return e.Err }
func (e *RetryAfterError) RetryAfter() time.Duration { return e.After }

// parseRetryAfter reads a Retry-After value: delay-seconds or an
// HTTP-date (a date in the past is 0). It is capped at MaxRetryAfter.
func parseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	var d time.Duration
	if n, err := strconv.ParseUint(v, 10, 64); err == nil || errors.Is(err, strconv.ErrRange) {
		if err != nil || n > uint64(MaxRetryAfter/time.Second) {
			return MaxRetryAfter, true
		}
		d = time.Duration(n) * time.Second
	} else if at, err := http.ParseTime(v); err == nil {
		d = at.Sub(now)
	} else {
		return 0, false
	}
	return max(0, min(d, MaxRetryAfter)), true
}

// Sign returns the X-Mdag-Signature value for body sent at unix time ts:
// "t=<ts>,v1=<hex HMAC-SHA256(secret, "<ts>." + body)>".
func Sign(secret []byte, ts int64, body []byte) string {
	return "t=" + strconv.FormatInt(ts, 10) + ",v1=" + hex.EncodeToString(mac(secret, ts, body))
}

func mac(secret []byte, ts int64, body []byte) []byte {
	h := hmac.New(sha256.New, secret)
	h.Write(strconv.AppendInt(nil, ts, 10))
	h.Write([]byte{'.'})
	h.Write(body)
	return h.Sum(nil)
}

// Errors of Verify.
var (
	ErrBadSignatureHeader = errors.New("webhook: malformed signature header")
	ErrSignatureMismatch  = errors.New("webhook: signature does not match")
	ErrSignatureExpired   = errors.New("webhook: signature timestamp outside tolerance")
)

// Verify checks an X-Mdag-Signature header against the request body as
// received, for a receiver: nil if one of its v1 signatures is the
// HMAC-SHA256 of "<t>." + body under secret and t is within tolerance of
// now (either way: a clock ahead is refused too). tolerance <= 0 skips
// the time check (replays are then not refused; not recommended: 5
// minutes is usual). Keys other than t and v1 are ignored, so a newer
// sender may add schemes.
func Verify(secret []byte, header string, body []byte, now time.Time, tolerance time.Duration) error {
	if len(secret) == 0 {
		return errors.New("webhook: no secret to verify with")
	}
	var (
		ts    int64
		haveT bool
		sigs  [][]byte
	)
	for part := range strings.SplitSeq(header, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			return ErrBadSignatureHeader
		}
		switch k {
		case "t":
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || haveT {
				return ErrBadSignatureHeader
			}
			ts, haveT = n, true
		case "v1":
			b, err := hex.DecodeString(v)
			if err != nil {
				return ErrBadSignatureHeader
			}
			sigs = append(sigs, b)
		}
	}
	if !haveT || len(sigs) == 0 {
		return ErrBadSignatureHeader
	}
	want := mac(secret, ts, body)
	ok := false
	for _, s := range sigs {
		if hmac.Equal(s, want) {
			ok = true
		}
	}
	if !ok {
		return ErrSignatureMismatch
	}
	if tolerance > 0 {
		age := now.Sub(time.Unix(ts, 0))
		if age > tolerance || age < -tolerance {
			return fmt.Errorf("%w: signed %v ago, tolerance %v", ErrSignatureExpired, age.Round(time.Second), tolerance)
		}
	}
	return nil
}

// stripURL drops the *url.Error around a client error: it quotes the URL,
// whose query may hold a secret.
func stripURL(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

func loopback(host string) bool {
	h := strings.ToLower(strings.TrimSuffix(host, "."))
	if h == "localhost" || strings.HasSuffix(h, ".localhost") {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// sanitize makes s printable for a log: control and other non-printable
// characters (and invalid UTF-8) become '?', whitespace a space.
func sanitize(s string) string {
	return strings.TrimSpace(strings.Map(func(r rune) rune {
		switch {
		case r == '\n' || r == '\r' || r == '\t':
			return ' '
		case r == utf8.RuneError, !unicode.IsPrint(r):
			return '?'
		}
		return r
	}, s))
}

// validToken reports whether s is an RFC 9110 token (a header name).
func validToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// validValue reports whether s can be a header value: no control
// characters but tab.
func validValue(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}
