// Package mqtt is the MQTT output transport: it publishes an app's
// messages (outputs.Message) to an MQTT broker, MQTT 5 (through
// github.com/eclipse/paho.golang) or MQTT 3.1.1 (through
// github.com/eclipse/paho.mqtt.golang), at QoS 1 (acknowledged by
// PUBACK) or QoS 0 (acknowledged once written to the connection).
//
// A message goes to the topic made from Config.Topic, a template whose
// placeholders {app}, {stream} and {kind} take the message's fields with
// the characters that would change the topic's shape ('/', '+', '#' and
// NUL) replaced by '_': app "a/b" stream "c#" kind "event" on the default
// template is "mdag/a_b/c_/event". Message.Retain sets the retain flag.
// Under MQTT 5 a message carries its ID as the user property "id",
// content type "application/json" and payload format indicator 1 (UTF-8).
//
// The Transport connects on first Send and again on the Send after a
// failure. A broker refusing the connection (CONNACK: bad credentials,
// not authorised) is an error naming its reason code, which the runner
// retries; a broker refusing a message for its size (MQTT 5 reason 0x95,
// or larger than the maximum packet size its CONNACK announced) is
// outputs.Permanent.
package mqtt

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/mdag/mdag/outputs"
)

// Defaults.
const (
	DefaultTopic          = "mdag/{app}/{stream}/{kind}"
	DefaultKeepAlive      = 30 * time.Second
	DefaultConnectTimeout = 10 * time.Second
	// maxInFlight is how many QoS 1 publishes Send keeps unacknowledged at
	// most (the broker's Receive Maximum may lower it under MQTT 5).
	maxInFlight = 64
	// sessionExpiry is the MQTT 5 session expiry asked for when
	// CleanSession is false (a day).
	sessionExpiry = 24 * 60 * 60
)

// Config configures a Transport.
type Config struct {
	// URL is the broker: mqtt://host:1883 or mqtts://host:8883 (the port
	// defaults to these). User info in the URL is used as Username and
	// Password when those are empty.
	URL string
	// Version is the protocol: 5 (MQTT 5, the default) or 3 (MQTT 3.1.1).
	Version int
	// QoS is 1 (the default; a zero Config means 1) or 0. To ask for QoS 0
	// set QoS0.
	QoS byte
	// QoS0 selects QoS 0 (a zero QoS field means the default, 1).
	QoS0 bool
	// Topic is the topic template (DefaultTopic): placeholders {app},
	// {stream} and {kind}.
	Topic string
	// ClientID defaults to "mdag-" and random hex.
	ClientID string
	// Username and Password authenticate to the broker.
	Username, Password string
	// TLS is the client TLS configuration for mqtts (nil: the system
	// roots, the URL's host as server name).
	TLS *tls.Config
	// KeepAlive is the MQTT keep-alive (DefaultKeepAlive).
	KeepAlive time.Duration
	// ConnectTimeout bounds connecting (dial, TLS, CONNECT/CONNACK):
	// DefaultConnectTimeout.
	ConnectTimeout time.Duration
	// CleanSession asks the broker to drop our session at connect (and,
	// under MQTT 5, at disconnect). By default it keeps it.
	CleanSession bool
}

// Transport publishes to one MQTT broker. It implements outputs.Transport.
type Transport struct {
	c      Config
	qos    byte
	addr   string // host:port
	tls    bool
	topic  outputs.Template
	closed chan struct{}

	closeOnce sync.Once
	linger    sync.WaitGroup // connection attempts abandoned at ctx's end
	mu        sync.Mutex     // held by Send and Close
	conn      conn           // nil: not connected
}

// conn is one connection (MQTT 5 or 3.1.1).
type conn interface {
	// publish publishes batch in order and waits for the acks.
	publish(ctx context.Context, batch []outputs.Message, topics []string) (int, error)
	// alive reports whether the connection is still up.
	alive() bool
	// close disconnects and stops the connection's goroutines.
	close()
}

var _ outputs.Transport = (*Transport)(nil)

// New checks c and returns a Transport; it does no network I/O (Send
// connects).
func New(c Config) (*Transport, error) {
	u, err := url.Parse(c.URL)
	if err != nil {
		return nil, fmt.Errorf("mqtt: url %q: %w", c.URL, err)
	}
	t := &Transport{c: c, closed: make(chan struct{})}
	port := ""
	switch u.Scheme {
	case "mqtt":
		port = "1883"
	case "mqtts":
		port = "8883"
		t.tls = true
	default:
		return nil, fmt.Errorf("mqtt: url %q: scheme must be mqtt or mqtts", c.URL)
	}
	if u.Hostname() == "" {
		return nil, fmt.Errorf("mqtt: url %q: no host", c.URL)
	}
	if (u.Path != "" && u.Path != "/") || u.RawQuery != "" {
		return nil, fmt.Errorf("mqtt: url %q: a broker URL has no path or query (the topic is Config.Topic)", c.URL)
	}
	if u.Port() != "" {
		port = u.Port()
	}
	t.addr = net.JoinHostPort(u.Hostname(), port)
	if u.User != nil && t.c.Username == "" {
		t.c.Username = u.User.Username()
		t.c.Password, _ = u.User.Password()
	}
	switch t.c.Version {
	case 0:
		t.c.Version = 5
	case 3, 5:
	case 4:
		t.c.Version = 3 // MQTT 3.1.1's protocol level is 4
	default:
		return nil, fmt.Errorf("mqtt: version %d: must be 5 (MQTT 5) or 3 (MQTT 3.1.1)", c.Version)
	}
	switch {
	case c.QoS0 && c.QoS != 0:
		return nil, fmt.Errorf("mqtt: QoS %d with QoS0 set", c.QoS)
	case c.QoS0:
		t.qos = 0
	case c.QoS == 0 || c.QoS == 1:
		t.qos = 1
	default:
		return nil, fmt.Errorf("mqtt: QoS %d: must be 0 or 1", c.QoS)
	}
	if t.c.Topic == "" {
		t.c.Topic = DefaultTopic
	}
	if t.topic, err = parseTemplate(t.c.Topic); err != nil {
		return nil, err
	}
	if t.c.ClientID == "" {
		var b [6]byte
		_, _ = rand.Read(b[:])
		t.c.ClientID = "mdag-" + hex.EncodeToString(b[:])
	}
	if t.c.KeepAlive == 0 {
		t.c.KeepAlive = DefaultKeepAlive
	}
	if t.c.KeepAlive < 0 || t.c.KeepAlive > 65535*time.Second {
		return nil, fmt.Errorf("mqtt: keep-alive %v: must be between 1 s and 65535 s", t.c.KeepAlive)
	}
	if t.c.ConnectTimeout == 0 {
		t.c.ConnectTimeout = DefaultConnectTimeout
	}
	if t.c.ConnectTimeout < 0 {
		return nil, fmt.Errorf("mqtt: connect timeout %v is negative", t.c.ConnectTimeout)
	}
	return t, nil
}

// Describe names the broker, protocol, QoS and topic template (no
// credentials): "mqtt://host:1883 (MQTT 5, QoS 1, topic mdag/{app}/{stream}/{kind})".
func (t *Transport) Describe() string {
	scheme, version := "mqtt", "MQTT 5"
	if t.tls {
		scheme = "mqtts"
	}
	if t.c.Version == 3 {
		version = "MQTT 3.1.1"
	}
	return fmt.Sprintf("%s://%s (%s, QoS %d, topic %s)", scheme, t.addr, version, t.qos, t.c.Topic)
}

// Topic is the topic m goes to.
func (t *Transport) Topic(m outputs.Message) string { return t.topic.Render(m, Sanitize) }

// Send publishes batch in order and returns how many, from the first, the
// broker acknowledged (QoS 1: PUBACK; QoS 0: written). It connects first
// if not connected; on an error the connection is dropped and the next
// Send connects again.
func (t *Transport) Send(ctx context.Context, batch []outputs.Message) (int, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(outputs.Closing(t.closed), cancel)
	defer stop()
	t.mu.Lock()
	defer t.mu.Unlock()
	select {
	case <-t.closed:
		return 0, errors.New("mqtt: transport closed")
	default:
	}
	if len(batch) == 0 {
		return 0, nil
	}
	if t.conn != nil && !t.conn.alive() {
		t.conn.close()
		t.conn = nil
	}
	if t.conn == nil {
		cctx, ccancel := context.WithTimeout(ctx, t.c.ConnectTimeout)
		var c conn
		var err error
		if t.c.Version == 3 {
			c, err = t.connect3(cctx)
		} else {
			c, err = t.connect5(cctx)
		}
		ccancel()
		if err != nil {
			if ctxErr := ctx.Err(); ctxErr != nil && !errors.Is(err, ctxErr) {
				err = fmt.Errorf("%w (%v)", err, ctxErr)
			}
			return 0, err
		}
		t.conn = c
	}
	topics := make([]string, len(batch))
	for i, m := range batch {
		topics[i] = t.topic.Render(m, Sanitize)
	}
	n, err := t.conn.publish(ctx, batch, topics)
	if err != nil && !outputs.IsPermanent(err) {
		t.conn.close()
		t.conn = nil
	}
	return n, err
}

// Close disconnects and stops the Transport's goroutines; a Send in
// progress returns.
func (t *Transport) Close() error {
	t.closeOnce.Do(func() { close(t.closed) })
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.conn != nil {
		t.conn.close()
		t.conn = nil
	}
	t.linger.Wait()
	return nil
}

// dial opens the TCP (or TLS) connection to the broker.
func (t *Transport) dial(ctx context.Context) (net.Conn, error) {
	d := &net.Dialer{KeepAlive: t.c.KeepAlive}
	if !t.tls {
		c, err := d.DialContext(ctx, "tcp", t.addr)
		if err != nil {
			return nil, fmt.Errorf("mqtt: connect to %s: %w", t.addr, err)
		}
		return c, nil
	}
	cfg := t.c.TLS
	if cfg == nil {
		cfg = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	td := &tls.Dialer{NetDialer: d, Config: cfg}
	c, err := td.DialContext(ctx, "tcp", t.addr)
	if err != nil {
		return nil, fmt.Errorf("mqtt: connect to %s (TLS): %w", t.addr, err)
	}
	return c, nil
}

// parseTemplate parses a topic template: placeholders {app}, {stream},
// {kind}; no other braces, no wildcards ('+', '#'), no NUL.
func parseTemplate(s string) (outputs.Template, error) {
	if strings.ContainsAny(s, "+#\x00") {
		return nil, fmt.Errorf("mqtt: topic %q: a topic to publish to has no wildcards (+, #) or NUL", s)
	}
	return outputs.ParseTemplate("mqtt: topic", s)
}

// Sanitize makes s one topic level: '/', '+', '#' and NUL become '_'.
func Sanitize(s string) string {
	if !strings.ContainsAny(s, "/+#\x00") {
		return s
	}
	return strings.Map(func(r rune) rune {
		switch r {
		case '/', '+', '#', 0:
			return '_'
		}
		return r
	}, s)
}
