package dag

import (
	"fmt"
	"maps"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/mdag/mdag/internal/yamlx"
)

// Output is one destination of an app's results, declared under the app's
// `outputs:`: an MQTT broker, a NATS server or a webhook (exactly one),
// what to send there (Send), and the on-disk spool where messages wait
// while the destination is down. Package outputs runs them.
type Output struct {
	Name    string         `yaml:"name" json:"name"`
	MQTT    *MQTTOutput    `yaml:"mqtt" json:"mqtt,omitempty"`
	NATS    *NATSOutput    `yaml:"nats" json:"nats,omitempty"`
	Webhook *WebhookOutput `yaml:"webhook" json:"webhook,omitempty"`
	// Send names the kinds of message sent (OutputKinds): event (each event
	// of an activity or sequence rule: the default), counts (a stream's
	// counts when they change), frame (every frame's result: boxes,
	// labels, counts, tracks, events, outcome), state (each stream's
	// latest counts every Every; retained by an MQTT broker).
	Send  []string      `yaml:"send" json:"send"`
	Every time.Duration `yaml:"every" json:"every,omitempty"` // state: how often (default 10 s)
	Spool Spool         `yaml:"spool" json:"spool"`
}

// MQTTOutput is an MQTT broker (3.1.1 or 5).
type MQTTOutput struct {
	URL     string `yaml:"url" json:"url"`         // mqtt://host:1883, mqtts://host:8883
	Version int    `yaml:"version" json:"version"` // 5 (default) or 3 (3.1.1)
	QoS     *int   `yaml:"qos" json:"qos"`         // 0 or 1 (default 1)
	// Topic is the topic template: {app}, {stream} and {kind} are replaced
	// (default mdag/{app}/{stream}/{kind}).
	Topic        string `yaml:"topic" json:"topic"`
	ClientID     string `yaml:"client_id" json:"client_id,omitempty"`
	Username     string `yaml:"username" json:"username,omitempty"`
	PasswordFile string `yaml:"password_file" json:"password_file,omitempty"` // the password, the file's first line
	TLS          TLS    `yaml:"tls" json:"tls"`
}

// NATSOutput is a NATS server, core or JetStream.
type NATSOutput struct {
	URL string `yaml:"url" json:"url"` // nats://host:4222, tls://host:4222
	// Subject is the subject template: {app}, {stream}, {kind} (default
	// mdag.{app}.{stream}.{kind}).
	Subject string `yaml:"subject" json:"subject"`
	// JetStream publishes to a stream (one must capture the subjects) and
	// waits for its acknowledgement; core NATS is acknowledged when the
	// server has read the message, whoever subscribes.
	JetStream    bool   `yaml:"jetstream" json:"jetstream"`
	Username     string `yaml:"username" json:"username,omitempty"`
	PasswordFile string `yaml:"password_file" json:"password_file,omitempty"`
	TokenFile    string `yaml:"token_file" json:"token_file,omitempty"`
	TLS          TLS    `yaml:"tls" json:"tls"`
}

// WebhookOutput is an HTTP endpoint each message is POSTed to.
type WebhookOutput struct {
	URL string `yaml:"url" json:"url"`
	// SecretFile holds the HMAC-SHA256 key the X-Mdag-Signature header is
	// made with (the file's first line; none: no signature).
	SecretFile string            `yaml:"secret_file" json:"secret_file,omitempty"`
	Timeout    time.Duration     `yaml:"timeout" json:"timeout,omitempty"` // per request (default 10 s)
	Headers    map[string]string `yaml:"headers" json:"headers,omitempty"`
	TLS        TLS               `yaml:"tls" json:"tls"`
}

// TLS is a client's TLS settings: the CA to trust instead of the
// system's, and a client certificate. Paths are relative to the app file.
type TLS struct {
	CAFile   string `yaml:"ca_file" json:"ca_file,omitempty"`
	CertFile string `yaml:"cert_file" json:"cert_file,omitempty"`
	KeyFile  string `yaml:"key_file" json:"key_file,omitempty"`
}

// Spool bounds the messages waiting for a destination, on disk.
type Spool struct {
	// Dir holds the spool (default: the service's --state, else the
	// user's cache directory, then outputs/APP/NAME).
	Dir      string        `yaml:"dir" json:"dir,omitempty"`
	MaxBytes Bytes         `yaml:"max_bytes" json:"max_bytes"` // default 64MiB
	MaxAge   time.Duration `yaml:"max_age" json:"max_age"`     // default 24h; older messages are dropped, counted
	// WhenFull: drop-oldest (default: the oldest waiting messages make
	// room) or drop-newest (the new message is dropped); either is counted.
	WhenFull string `yaml:"when_full" json:"when_full"`
}

// OutputKinds are the kinds of message an output can send.
var OutputKinds = []string{"event", "counts", "frame", "state"}

// Output limits and defaults.
const (
	MaxOutputs          = 16
	DefaultSpoolBytes   = 64 << 20
	MinSpoolBytes       = 64 << 10
	MaxSpoolBytes       = 1 << 40
	DefaultSpoolAge     = 24 * time.Hour
	DefaultStateEvery   = 10 * time.Second
	DefaultWebhookLimit = 10 * time.Second
)

// Bytes is a size in bytes, written in YAML as a number or with a unit:
// 64MiB, 512KiB, 1GiB, 100MB.
type Bytes int64

var bytesRE = regexp.MustCompile(`^([0-9]+)\s*([KMGT]i?B|B)?$`)

// UnmarshalScalar implements yamlx.Scalar.
func (b *Bytes) UnmarshalScalar(s string) error {
	m := bytesRE.FindStringSubmatch(strings.TrimSpace(s))
	if m == nil {
		return fmt.Errorf("%q: want bytes, e.g. 64MiB, 512KiB, 1GiB or a number", s)
	}
	n, err := strconv.ParseInt(m[1], 10, 64)
	if err != nil {
		return fmt.Errorf("%q: %v", s, err)
	}
	mult := map[string]int64{"": 1, "B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}[m[2]]
	if n > (1<<62)/mult {
		return fmt.Errorf("%q: too large", s)
	}
	*b = Bytes(n * mult)
	return nil
}

func (b Bytes) String() string {
	for _, u := range []struct {
		n    int64
		unit string
	}{{1 << 40, "TiB"}, {1 << 30, "GiB"}, {1 << 20, "MiB"}, {1 << 10, "KiB"}} {
		if int64(b) >= u.n && int64(b)%u.n == 0 {
			return fmt.Sprintf("%d%s", int64(b)/u.n, u.unit)
		}
	}
	return fmt.Sprintf("%dB", int64(b))
}

var (
	outputNameRE = regexp.MustCompile(`^[a-z0-9-]{1,63}$`)
	placeholder  = regexp.MustCompile(`\{[^}]*\}`)
)

// setDefaults fills an output's defaults (validate does, before checking).
func (o *Output) setDefaults() {
	if len(o.Send) == 0 {
		o.Send = []string{"event"}
	}
	if o.Every == 0 && slices.Contains(o.Send, "state") {
		o.Every = DefaultStateEvery
	}
	if o.Spool.MaxBytes == 0 {
		o.Spool.MaxBytes = DefaultSpoolBytes
	}
	if o.Spool.MaxAge == 0 {
		o.Spool.MaxAge = DefaultSpoolAge
	}
	if o.Spool.WhenFull == "" {
		o.Spool.WhenFull = "drop-oldest"
	}
	if m := o.MQTT; m != nil {
		if m.Version == 0 {
			m.Version = 5
		}
		if m.QoS == nil {
			one := 1
			m.QoS = &one
		}
		if m.Topic == "" {
			m.Topic = "mdag/{app}/{stream}/{kind}"
		}
	}
	if n := o.NATS; n != nil && n.Subject == "" {
		n.Subject = "mdag.{app}.{stream}.{kind}"
	}
	if w := o.Webhook; w != nil && w.Timeout == 0 {
		w.Timeout = DefaultWebhookLimit
	}
}

// validateOutputs checks the outputs section (defaults filled first).
func (a *App) validateOutputs(add func(path, format string, args ...any)) {
	if len(a.Outputs) > MaxOutputs {
		add("outputs", "%d outputs: at most %d", len(a.Outputs), MaxOutputs)
	}
	names := map[string]int{}
	for i := range a.Outputs {
		o := &a.Outputs[i]
		o.setDefaults()
		at := fmt.Sprintf("outputs[%d]", i)
		switch {
		case o.Name == "":
			add(at+".name", "required: names the output in logs, metrics and the spool's directory")
		case !outputNameRE.MatchString(o.Name):
			add(at+".name", "%q must match [a-z0-9-]{1,63}", o.Name)
		default:
			if j, dup := names[o.Name]; dup {
				add(at+".name", "duplicate output name %q (first at outputs[%d])", o.Name, j)
			}
			names[o.Name] = i
		}
		n := 0
		for _, set := range []bool{o.MQTT != nil, o.NATS != nil, o.Webhook != nil} {
			if set {
				n++
			}
		}
		if n != 1 {
			add(at, "want exactly one of mqtt, nats or webhook, got %d", n)
		}
		for j, k := range o.Send {
			if !slices.Contains(OutputKinds, k) {
				add(fmt.Sprintf("%s.send[%d]", at, j), "%q: want one of %s%s", k, strings.Join(OutputKinds, ", "), yamlx.Suggest(k, OutputKinds))
			} else if slices.Index(o.Send, k) != j {
				add(fmt.Sprintf("%s.send[%d]", at, j), "%q given twice", k)
			}
		}
		switch {
		case o.Every < 0 || (o.Every > 0 && o.Every < 100*time.Millisecond):
			add(at+".every", "%v: want at least 100ms", o.Every)
		case o.Every > 0 && !slices.Contains(o.Send, "state"):
			add(at+".every", "only for send: [state]")
		}
		sp := at + ".spool"
		if o.Spool.MaxBytes < MinSpoolBytes || o.Spool.MaxBytes > MaxSpoolBytes {
			add(sp+".max_bytes", "%v: want %v to %v", o.Spool.MaxBytes, Bytes(MinSpoolBytes), Bytes(MaxSpoolBytes))
		}
		if o.Spool.MaxAge < time.Second {
			add(sp+".max_age", "%v: want at least 1s", o.Spool.MaxAge)
		}
		if o.Spool.WhenFull != "drop-oldest" && o.Spool.WhenFull != "drop-newest" {
			add(sp+".when_full", "%q: want drop-oldest or drop-newest", o.Spool.WhenFull)
		}
		if m := o.MQTT; m != nil {
			p := at + ".mqtt"
			checkURL(add, p+".url", m.URL, "mqtt", "mqtts")
			if m.Version != 3 && m.Version != 5 {
				add(p+".version", "%d: want 5 or 3 (MQTT 3.1.1)", m.Version)
			}
			if *m.QoS != 0 && *m.QoS != 1 {
				add(p+".qos", "%d: want 0 (at most once) or 1 (at least once)", *m.QoS)
			}
			checkTemplate(add, p+".topic", m.Topic)
			if m.PasswordFile != "" && m.Username == "" {
				add(p+".password_file", "needs username")
			}
			checkTLS(add, p+".tls", m.TLS, strings.HasPrefix(m.URL, "mqtts:"))
		}
		if n := o.NATS; n != nil {
			p := at + ".nats"
			checkURL(add, p+".url", n.URL, "nats", "tls")
			checkTemplate(add, p+".subject", n.Subject)
			if n.PasswordFile != "" && n.Username == "" {
				add(p+".password_file", "needs username")
			}
			if n.TokenFile != "" && n.Username != "" {
				add(p+".token_file", "give a token or a username, not both")
			}
			checkTLS(add, p+".tls", n.TLS, strings.HasPrefix(n.URL, "tls:"))
		}
		if w := o.Webhook; w != nil {
			p := at + ".webhook"
			checkURL(add, p+".url", w.URL, "http", "https")
			if w.Timeout < 0 || w.Timeout > 5*time.Minute {
				add(p+".timeout", "%v: want up to 5m", w.Timeout)
			}
			for _, h := range slices.Sorted(maps.Keys(w.Headers)) {
				switch strings.ToLower(h) {
				case "host", "content-length", "content-type", "idempotency-key", "x-mdag-signature", "x-mdag-event", "x-mdag-timestamp":
					add(p+".headers."+h, "set by mdag: not a header to give")
				}
			}
			checkTLS(add, p+".tls", w.TLS, strings.HasPrefix(w.URL, "https:"))
		}
	}
}

func checkURL(add func(path, format string, args ...any), path, s string, schemes ...string) {
	if s == "" {
		add(path, "required, e.g. %s://HOST", schemes[0])
		return
	}
	u, err := url.Parse(s)
	switch {
	case err != nil: // not quoted: a URL may carry a secret
		add(path, "not a URL (want %s://HOST[:PORT])", schemes[0])
	case !slices.Contains(schemes, u.Scheme):
		add(path, "scheme %q: want %s", u.Scheme, strings.Join(schemes, " or "))
	case u.Host == "":
		add(path, "no host (want %s://HOST[:PORT])", u.Scheme)
	case u.User != nil:
		add(path, "credentials in the URL: give them in the output's username/password_file (or headers) so they stay out of logs")
	}
}

func checkTemplate(add func(path, format string, args ...any), path, t string) {
	for _, ph := range placeholder.FindAllString(t, -1) {
		if ph != "{app}" && ph != "{stream}" && ph != "{kind}" {
			add(path, "%s: the placeholders are {app}, {stream} and {kind}", ph)
		}
	}
	if !strings.Contains(t, "{stream}") || !strings.Contains(t, "{kind}") {
		add(path, "%q: needs {stream} and {kind} (one topic per stream and kind keeps a stream's messages in order)", t)
	}
}

func checkTLS(add func(path, format string, args ...any), path string, t TLS, secure bool) {
	if (t.CertFile == "") != (t.KeyFile == "") {
		add(path, "cert_file and key_file go together")
	}
	if !secure && (t.CAFile != "" || t.CertFile != "") {
		add(path, "TLS settings on a plaintext URL (use mqtts://, tls:// or https://)")
	}
}
