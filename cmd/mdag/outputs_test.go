package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestValidateOutputs: validate checks an app's outputs as serve will
// build them (the transports' own checks, each output's own spool), with
// file:line, without reading secret files.
func TestValidateOutputs(t *testing.T) {
	app, err := os.ReadFile("../../examples/actdet/mqtt.yaml")
	if err != nil {
		t.Fatal(err)
	}
	base := string(app)[:strings.Index(string(app), "outputs:")]
	dir := t.TempDir()
	for _, c := range []struct {
		outputs string
		want    string // "" valid
	}{
		{"outputs:\n  - name: a\n    mqtt: {url: \"mqtt://127.0.0.1:1883\", username: u, password_file: missing.txt}\n", ""},
		{"outputs:\n  - name: a\n    webhook: {url: \"https://h/x\", headers: {Connection: close}}\n", "outputs[0]: webhook: header Connection is set by the transport"},
		{"outputs:\n  - name: a\n    mqtt: {url: \"mqtt://h:1883\", topic: \"a/{stream}/{kind}/#\"}\n", "has no wildcards"},
		{"outputs:\n  - name: a\n    nats: {url: \"nats://h:4222\", subject: \"a..{stream}.{kind}\"}\n", "empty token"},
		{"outputs:\n  - name: a\n    mqtt: {url: \"mqtt://h\"}\n    spool: {dir: s}\n  - name: b\n    mqtt: {url: \"mqtt://h\"}\n    spool: {dir: ./s}\n", "outputs[1].spool.dir: " + filepath.Join(dir, "s") + " is outputs[0]'s spool too"},
	} {
		f := filepath.Join(dir, "app.yaml")
		if err := os.WriteFile(f, []byte(base+c.outputs), 0o644); err != nil {
			t.Fatal(err)
		}
		var out, errb bytes.Buffer
		code := run([]string{"validate", "-f", f}, &out, &errb)
		switch {
		case c.want == "" && code != exitOK:
			t.Errorf("%s: exit %d: %s", c.outputs, code, errb.String())
		case c.want != "" && (code != exitInvalid || !strings.Contains(errb.String(), c.want) || !strings.Contains(errb.String(), f+":")):
			t.Errorf("%s: exit %d, stderr %q; want %q with the file and line", c.outputs, code, errb.String(), c.want)
		}
	}
}
