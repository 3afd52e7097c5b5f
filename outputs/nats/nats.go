// Package nats is the NATS output transport: it publishes an app's
// messages (outputs.Message) to a NATS server, core NATS or JetStream,
// through github.com/nats-io/nats.go.
//
// A message goes to the subject made from Config.Subject, a template
// whose placeholders {app}, {stream} and {kind} take the message's fields
// with the characters that would change the subject's shape ('.', '*',
// '>', whitespace and NUL) replaced by '_' (an empty field becomes "_"):
// app "a.b" stream "cam 1" kind "event" on the default template is
// "mdag.a_b.cam_1.event". A message carries its ID as the header
// Nats-Msg-Id (JetStream drops a second message with the same ID within
// the stream's duplicate window) and Content-Type: application/json.
//
// Core NATS acknowledges nothing per message: Send publishes the batch and
// then flushes (a PING the server answers after reading everything
// before it), so a batch is acknowledged whole or not at all. JetStream
// acknowledges each message (PubAck) once stored; a stream capturing the
// subjects must exist on the server (Send's error says so otherwise).
//
// nats.go reconnects on its own; while it is disconnected Send waits for
// it, bounded by its context, and nothing is buffered (a publish while
// disconnected fails), so what Send reports acknowledged was.
package nats

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"time"
	"unicode"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mdag/mdag/outputs"
)

// Defaults.
const (
	DefaultSubject        = "mdag.{app}.{stream}.{kind}"
	DefaultConnectTimeout = 10 * time.Second
	// reconnectWait is how long nats.go waits between reconnect attempts.
	reconnectWait = 500 * time.Millisecond
	// reconnectGrace is how long Send waits for a lost connection to come
	// back before it fails (a few reconnect attempts).
	reconnectGrace = 4 * reconnectWait
	// maxPending bounds JetStream publishes awaiting their PubAck.
	maxPending = 256
)

// Config configures a Transport.
type Config struct {
	// URL is the server: nats://host:4222 or tls://host:4222 (several,
	// comma-separated, for a cluster). User info in the URL authenticates
	// too.
	URL string
	// Subject is the subject template (DefaultSubject): placeholders
	// {app}, {stream} and {kind}.
	Subject string
	// JetStream publishes to JetStream and waits for each message's
	// PubAck; a stream capturing the subjects must exist.
	JetStream bool
	// Username and Password, or Token, authenticate to the server.
	Username, Password string
	Token              string
	// TLS is the client TLS configuration (nil with tls://: the system
	// roots).
	TLS *tls.Config
	// ConnectTimeout bounds a connection attempt (DefaultConnectTimeout).
	ConnectTimeout time.Duration
}

// Transport publishes to one NATS server (or cluster). It implements
// outputs.Transport.
type Transport struct {
	c        Config
	servers  string // the URLs without user info, for Describe
	tpl      outputs.Template
	closed   chan struct{}
	closeOne sync.Once

	mu sync.Mutex // held by Send and Close
	nc *natsgo.Conn
	js jetstream.JetStream

	smu     sync.Mutex
	changed chan struct{} // closed (and replaced) when the connection's state changes
}

var _ outputs.Transport = (*Transport)(nil)

// New checks c and returns a Transport; it does no network I/O (Send
// connects).
func New(c Config) (*Transport, error) {
	if c.URL == "" {
		return nil, errors.New("nats: no url")
	}
	var clean []string
	for _, s := range strings.Split(c.URL, ",") {
		s = strings.TrimSpace(s)
		u, err := url.Parse(s)
		if err != nil {
			return nil, fmt.Errorf("nats: url %q: %w", s, err)
		}
		if u.Scheme != "nats" && u.Scheme != "tls" {
			return nil, fmt.Errorf("nats: url %q: scheme must be nats or tls", s)
		}
		if u.Hostname() == "" {
			return nil, fmt.Errorf("nats: url %q: no host", s)
		}
		if (u.Path != "" && u.Path != "/") || u.RawQuery != "" {
			return nil, fmt.Errorf("nats: url %q: a server URL has no path or query (the subject is Config.Subject)", s)
		}
		u.User = nil
		clean = append(clean, u.String())
	}
	if c.Token != "" && (c.Username != "" || c.Password != "") {
		return nil, errors.New("nats: a token or a user name and password, not both")
	}
	if c.Subject == "" {
		c.Subject = DefaultSubject
	}
	tpl, err := parseTemplate(c.Subject)
	if err != nil {
		return nil, err
	}
	if c.ConnectTimeout == 0 {
		c.ConnectTimeout = DefaultConnectTimeout
	}
	if c.ConnectTimeout < 0 {
		return nil, fmt.Errorf("nats: connect timeout %v is negative", c.ConnectTimeout)
	}
	return &Transport{c: c, servers: strings.Join(clean, ","), tpl: tpl, closed: make(chan struct{}), changed: make(chan struct{})}, nil
}

// Describe names the server, mode and subject template (no credentials):
// "nats://host:4222 (JetStream, subject mdag.{app}.{stream}.{kind})".
func (t *Transport) Describe() string {
	mode := "core NATS"
	if t.c.JetStream {
		mode = "JetStream"
	}
	return fmt.Sprintf("%s (%s, subject %s)", t.servers, mode, t.c.Subject)
}

// Subject is the subject m goes to.
func (t *Transport) Subject(m outputs.Message) string { return t.tpl.Render(m, Sanitize) }

// signal wakes the Sends waiting for the connection's state to change.
func (t *Transport) signal() {
	t.smu.Lock()
	close(t.changed)
	t.changed = make(chan struct{})
	t.smu.Unlock()
}

func (t *Transport) waitChange() <-chan struct{} {
	t.smu.Lock()
	defer t.smu.Unlock()
	return t.changed
}

func (t *Transport) connect(ctx context.Context) error {
	timeout := t.c.ConnectTimeout
	if dl, ok := ctx.Deadline(); ok {
		timeout = min(timeout, time.Until(dl))
	}
	if timeout <= 0 {
		return fmt.Errorf("nats: connect to %s: %w", t.servers, context.DeadlineExceeded)
	}
	opts := []natsgo.Option{
		natsgo.Name("mdag"),
		natsgo.Timeout(timeout),
		// publish fails while disconnected, rather than being buffered
		// and lost unseen if the reconnect fails
		natsgo.ReconnectBufSize(-1),
		natsgo.MaxReconnects(-1),
		natsgo.ReconnectWait(reconnectWait),
		natsgo.DisconnectErrHandler(func(*natsgo.Conn, error) { t.signal() }),
		natsgo.ReconnectHandler(func(*natsgo.Conn) { t.signal() }),
		natsgo.ClosedHandler(func(*natsgo.Conn) { t.signal() }),
		natsgo.ErrorHandler(func(*natsgo.Conn, *natsgo.Subscription, error) {}),
	}
	if t.c.Username != "" || t.c.Password != "" {
		opts = append(opts, natsgo.UserInfo(t.c.Username, t.c.Password))
	}
	if t.c.Token != "" {
		opts = append(opts, natsgo.Token(t.c.Token))
	}
	if t.c.TLS != nil {
		opts = append(opts, natsgo.Secure(t.c.TLS))
	}
	// nats.Connect takes no context: timeout (at most ctx's deadline)
	// bounds it
	nc, err := natsgo.Connect(t.c.URL, opts...)
	if err != nil {
		return fmt.Errorf("nats: connect to %s: %w", t.servers, err)
	}
	t.nc = nc
	if t.c.JetStream {
		js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(maxPending))
		if err != nil {
			nc.Close()
			t.nc = nil
			return fmt.Errorf("nats: jetstream: %w", err)
		}
		t.js = js
	}
	return nil
}

// ready connects if needed and waits, bounded by ctx and by a few of
// nats.go's reconnect attempts (reconnectGrace), while it reconnects: a
// server that stays away is an error soon, so the output says it is down
// and its messages wait in the spool rather than in a blocked Send.
func (t *Transport) ready(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, reconnectGrace)
	defer cancel()
	for {
		if t.nc == nil || t.nc.IsClosed() {
			if t.nc != nil {
				t.nc.Close()
				t.nc, t.js = nil, nil
			}
			if err := t.connect(ctx); err != nil {
				return err
			}
		}
		ch := t.waitChange()
		if t.nc.IsConnected() {
			return nil
		}
		if t.nc.IsClosed() {
			continue
		}
		select {
		case <-ch:
		case <-ctx.Done():
			err := fmt.Errorf("nats: disconnected from %s, reconnecting (not back within %v)", t.servers, reconnectGrace)
			if last := t.nc.LastError(); last != nil {
				err = fmt.Errorf("%w (last error: %v)", err, last)
			}
			return err
		}
	}
}

// Send publishes batch in order and returns how many, from the first, the
// server acknowledged (core NATS: all after the flush, or none; JetStream:
// the PubAcks, in order).
func (t *Transport) Send(ctx context.Context, batch []outputs.Message) (int, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(outputs.Closing(t.closed), cancel)
	defer stop()
	t.mu.Lock()
	defer t.mu.Unlock()
	select {
	case <-t.closed:
		return 0, errors.New("nats: transport closed")
	default:
	}
	if len(batch) == 0 {
		return 0, nil
	}
	if err := t.ready(ctx); err != nil {
		return 0, err
	}
	msgs := make([]*natsgo.Msg, len(batch))
	for i, m := range batch {
		msgs[i] = &natsgo.Msg{
			Subject: t.tpl.Render(m, Sanitize),
			Data:    m.Body,
			Header:  natsgo.Header{"Nats-Msg-Id": {m.ID}, "Content-Type": {"application/json"}},
		}
	}
	if t.c.JetStream {
		return t.sendJS(ctx, batch, msgs)
	}
	for i, m := range msgs {
		if err := t.nc.PublishMsg(m); err != nil {
			if i == 0 && errors.Is(err, natsgo.ErrMaxPayload) {
				return 0, outputs.Permanent("nats: message %s (%d bytes): %v", batch[i].ID, len(batch[i].Body), err)
			}
			if errors.Is(err, natsgo.ErrMaxPayload) {
				// the ones before it: flush them, then the next Send
				// meets this one first
				if ferr := t.nc.FlushWithContext(ctx); ferr != nil {
					return 0, fmt.Errorf("nats: flush: %w", ferr)
				}
				return i, fmt.Errorf("nats: message %s over the server's maximum payload", batch[i].ID)
			}
			return 0, fmt.Errorf("nats: publish message %d of %d to %s: %w", i+1, len(batch), m.Subject, err)
		}
	}
	if err := t.nc.FlushWithContext(ctx); err != nil {
		return 0, fmt.Errorf("nats: flush %d messages: %w", len(batch), err)
	}
	return len(batch), nil
}

func (t *Transport) sendJS(ctx context.Context, batch []outputs.Message, msgs []*natsgo.Msg) (int, error) {
	futures := make([]jetstream.PubAckFuture, 0, len(msgs))
	var pubErr error
	for i, m := range msgs {
		f, err := t.js.PublishMsgAsync(m)
		if err != nil {
			pubErr = fmt.Errorf("nats: publish message %d of %d to %s: %w", i+1, len(batch), m.Subject, err)
			if i == 0 && errors.Is(err, natsgo.ErrMaxPayload) {
				return 0, outputs.Permanent("nats: message %s (%d bytes): %v", batch[i].ID, len(batch[i].Body), err)
			}
			break
		}
		futures = append(futures, f)
	}
	for i, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			return i, t.jsError(batch[i], msgs[i].Subject, err)
		case <-ctx.Done():
			return i, fmt.Errorf("nats: waiting for the PubAck of message %d of %d: %w", i+1, len(batch), ctx.Err())
		}
	}
	if pubErr != nil {
		return len(futures), pubErr
	}
	return len(batch), nil
}

func (t *Transport) jsError(m outputs.Message, subject string, err error) error {
	if errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, natsgo.ErrNoResponders) {
		return fmt.Errorf("nats: message %s: no JetStream stream captures subject %s (create a stream whose subjects include it, e.g. \"mdag.>\"): %w", m.ID, subject, err)
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamMessageExceedsMaximum {
		return outputs.Permanent("nats: message %s (%d bytes): %v", m.ID, len(m.Body), err)
	}
	return fmt.Errorf("nats: message %s: %w", m.ID, err)
}

// Close closes the connection; a Send in progress returns.
func (t *Transport) Close() error {
	t.closeOne.Do(func() { close(t.closed) })
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.nc != nil {
		if t.js != nil {
			t.js.CleanupPublisher()
		}
		t.nc.Close()
		t.nc, t.js = nil, nil
	}
	return nil
}

// parseTemplate parses a subject template: placeholders {app}, {stream},
// {kind}; no other braces, no wildcards, whitespace or empty tokens.
func parseTemplate(s string) (outputs.Template, error) {
	if strings.ContainsAny(s, "*>\x00") || strings.IndexFunc(s, unicode.IsSpace) >= 0 {
		return nil, fmt.Errorf("nats: subject %q: a subject to publish to has no wildcards (*, >), whitespace or NUL", s)
	}
	for _, tok := range strings.Split(s, ".") {
		if tok == "" {
			return nil, fmt.Errorf("nats: subject %q: empty token", s)
		}
	}
	return outputs.ParseTemplate("nats: subject", s)
}

// Sanitize makes s one subject token: '.', '*', '>', whitespace and NUL
// become '_', and an empty s "_".
func Sanitize(s string) string {
	if s == "" {
		return "_"
	}
	return strings.Map(func(r rune) rune {
		if r == '.' || r == '*' || r == '>' || r == 0 || unicode.IsSpace(r) {
			return '_'
		}
		return r
	}, s)
}
