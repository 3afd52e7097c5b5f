package dag_test

import (
	"strings"
	"testing"
	"time"

	"github.com/mdag/mdag/dag"
)

// TestOutputsDefaults: an output with only its destination gets the
// documented defaults.
func TestOutputsDefaults(t *testing.T) {
	app, err := dag.Parse("app.yaml", []byte(validApp+`outputs:
  - name: home
    mqtt: {url: "mqtt://127.0.0.1:1883"}
  - name: bus
    nats: {url: "nats://127.0.0.1:4222"}
    send: [state]
  - name: hook
    webhook: {url: "https://example.com/h"}
`))
	if err != nil {
		t.Fatal(err)
	}
	m := app.Outputs[0]
	if m.MQTT.Version != 5 || *m.MQTT.QoS != 1 || m.MQTT.Topic != "mdag/{app}/{stream}/{kind}" || len(m.Send) != 1 || m.Send[0] != "event" ||
		m.Spool.MaxBytes != 64<<20 || m.Spool.MaxAge != 24*time.Hour || m.Spool.WhenFull != "drop-oldest" || m.Every != 0 {
		t.Errorf("mqtt defaults: %+v %+v", m, *m.MQTT)
	}
	if n := app.Outputs[1]; n.NATS.Subject != "mdag.{app}.{stream}.{kind}" || n.Every != 10*time.Second {
		t.Errorf("nats defaults: %+v", n)
	}
	if w := app.Outputs[2]; w.Webhook.Timeout != 10*time.Second {
		t.Errorf("webhook defaults: %+v", w)
	}
}

// TestOutputsErrors: each problem of an outputs section is reported with
// its line and field path.
func TestOutputsErrors(t *testing.T) {
	for _, c := range []struct {
		yaml string
		want string
	}{
		{`[{name: a}]`, "app.yaml:13: outputs[0]: want exactly one of mqtt, nats or webhook, got 0"},
		{`[{name: a, mqtt: {url: "mqtt://h"}, webhook: {url: "http://h"}}]`, "want exactly one of mqtt, nats or webhook, got 2"},
		{`[{mqtt: {url: "mqtt://h"}}]`, "outputs[0].name: required"},
		{`[{name: A_b, mqtt: {url: "mqtt://h"}}]`, `outputs[0].name: "A_b" must match`},
		{`[{name: a, mqtt: {url: "mqtt://h"}}, {name: a, mqtt: {url: "mqtt://h"}}]`, `outputs[1].name: duplicate output name "a" (first at outputs[0])`},
		{`[{name: a, mqtt: {url: "http://h"}}]`, `outputs[0].mqtt.url: scheme "http": want mqtt or mqtts`},
		{`[{name: a, mqtt: {url: "mqtt://u:p@h"}}]`, "credentials in the URL"},
		{`[{name: a, mqtt: {}}]`, "outputs[0].mqtt.url: required, e.g. mqtt://HOST"},
		{`[{name: a, mqtt: {url: "mqtt://h", version: 4}}]`, "mqtt.version: 4: want 5 or 3"},
		{`[{name: a, mqtt: {url: "mqtt://h", qos: 2}}]`, "mqtt.qos: 2: want 0"},
		{`[{name: a, mqtt: {url: "mqtt://h", topic: "x/{stream}"}}]`, "needs {stream} and {kind}"},
		{`[{name: a, mqtt: {url: "mqtt://h", topic: "{app}/{stream}/{kind}/{camera}"}}]`, "{camera}: the placeholders are"},
		{`[{name: a, mqtt: {url: "mqtt://h", password_file: p}}]`, "mqtt.password_file: needs username"},
		{`[{name: a, mqtt: {url: "mqtt://h", tls: {ca_file: ca.pem}}}]`, "TLS settings on a plaintext URL"},
		{`[{name: a, mqtt: {url: "mqtts://h", tls: {cert_file: c.pem}}}]`, "cert_file and key_file go together"},
		{`[{name: a, mqtt: {url: "mqtt://h"}, send: [events]}]`, `outputs[0].send[0]: "events": want one of event, counts, frame, state (did you mean "event"?)`},
		{`[{name: a, mqtt: {url: "mqtt://h"}, send: [frame, frame]}]`, `send[1]: "frame" given twice`},
		{`[{name: a, mqtt: {url: "mqtt://h"}, every: 5s}]`, "outputs[0].every: only for send: [state]"},
		{`[{name: a, mqtt: {url: "mqtt://h"}, send: [state], every: 10ms}]`, "every: 10ms: want at least 100ms"},
		{`[{name: a, mqtt: {url: "mqtt://h"}, spool: {max_bytes: 1KiB}}]`, "spool.max_bytes: 1KiB: want 64KiB to 1TiB"},
		{`[{name: a, mqtt: {url: "mqtt://h"}, spool: {max_bytes: lots}}]`, `spool.max_bytes: "lots": want bytes`},
		{`[{name: a, mqtt: {url: "mqtt://h"}, spool: {max_age: 10ms}}]`, "spool.max_age: 10ms: want at least 1s"},
		{`[{name: a, mqtt: {url: "mqtt://h"}, spool: {when_full: block}}]`, `spool.when_full: "block": want drop-oldest or drop-newest`},
		{`[{name: a, mqtt: {url: "mqtt://h"}, spool: {size: 1}}]`, "spool.size"},
		{`[{name: a, nats: {url: "nats://h", token_file: t, username: u}}]`, "give a token or a username, not both"},
		{`[{name: a, webhook: {url: "ftp://h"}}]`, `webhook.url: scheme "ftp": want http or https`},
		{`[{name: a, webhook: {url: "https://h", headers: {Idempotency-Key: x}}}]`, "webhook.headers.Idempotency-Key: set by mdag"},
		{`[{name: a, webhook: {url: "https://h", timeout: 1h}}]`, "webhook.timeout: 1h0m0s: want up to 5m"},
	} {
		_, err := dag.Parse("app.yaml", []byte(validApp+"outputs: "+c.yaml+"\n"))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("outputs: %s\n got %v\nwant %q", c.yaml, err, c.want)
		}
	}
}

func TestBytes(t *testing.T) {
	for in, want := range map[string]int64{"64MiB": 64 << 20, "512KiB": 512 << 10, "1GiB": 1 << 30, "100MB": 100e6, "65536": 65536, "2 GiB": 2 << 30} {
		var b dag.Bytes
		if err := b.UnmarshalScalar(in); err != nil || int64(b) != want {
			t.Errorf("%q: %d, %v; want %d", in, b, err, want)
		}
	}
	for _, in := range []string{"", "1.5MiB", "-1", "12 parsecs", "99999999999TiB"} {
		var b dag.Bytes
		if err := b.UnmarshalScalar(in); err == nil {
			t.Errorf("%q: no error (%d)", in, b)
		}
	}
	if s := dag.Bytes(64 << 20).String(); s != "64MiB" {
		t.Errorf("String %q", s)
	}
}
