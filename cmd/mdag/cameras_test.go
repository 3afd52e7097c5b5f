//go:build !lean

package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCameraFlags: validate --cameras checks the file against the app of
// -f (every problem with file:line, no password); serve refuses a bad
// --camera or cameras file before it serves, naming what is wrong and
// never the password.
func TestCameraFlags(t *testing.T) {
	t.Chdir("../..")
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("good.yaml", "cameras:\n  - name: door\n    url: rtsp://admin:Hunter22@10.0.0.5/s1\n  - name: yard\n    url: rtsp://10.0.0.6/s1\n    fps: 5\n    transport: udp\n")
	bad := write("bad.yaml", "cameras:\n  - name: door\n    url: http://admin:Hunter22@10.0.0.5/s1\n    app: face\n")
	app := "examples/traffic/app.yaml"
	cases := []struct {
		args string
		code int
		want []string
	}{
		{"validate -f " + app + " --cameras " + good, exitOK, []string{good + ": 2 cameras valid (door, yard)", "app traffic: valid"}},
		{"validate -f " + app + " --cameras " + bad, exitInvalid, []string{
			bad + `:3: cameras[0].url: http://10.0.0.5/s1: scheme "http": want rtsp:// or rtsps://`,
			bad + `:4: cameras[0].app: "face" is not deployed (deployed: traffic)`, "2 problems found"}},
		{"validate --cameras " + good, exitInvalid, []string{"--cameras needs -f app.yaml"}},
		{"serve --example traffic --listen 127.0.0.1:0 --duration 1ms --cameras " + bad, exitInvalid, []string{bad + ":3: cameras[0].url"}},
		{"serve --example traffic --listen 127.0.0.1:0 --duration 1ms --camera ftp://admin:Hunter22@cam/x", exitInvalid,
			[]string{`--camera: ftp://cam/x: scheme "ftp": want rtsp:// or rtsps://`}},
		{"serve --example traffic --listen 127.0.0.1:0 --duration 1ms --camera a=rtsp://cam/x --camera a=rtsp://admin:Hunter22@cam/y", exitInvalid,
			[]string{"camera a: two cameras have this name"}},
	}
	for _, tc := range cases {
		t.Run(tc.args, func(t *testing.T) {
			var out bytes.Buffer
			code := run(strings.Fields(tc.args), &out, &out)
			if code != tc.code {
				t.Fatalf("exit %d, want %d:\n%s", code, tc.code, out.String())
			}
			for _, w := range tc.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("no %q in:\n%s", w, out.String())
				}
			}
			if strings.Contains(out.String(), "Hunter22") {
				t.Errorf("the password is in the output:\n%s", out.String())
			}
		})
	}
}
