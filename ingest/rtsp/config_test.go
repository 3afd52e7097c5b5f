package rtsp

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"gopkg.in/yaml.v3"
)

var testEnv = func(name string) (string, bool) {
	v, ok := map[string]string{"DOOR_PASS": "p%40ss:w0rd", "HOST": "10.0.0.9"}[name]
	return v, ok
}

func TestDecodeCameras(t *testing.T) {
	const doc = `cameras:
  - name: door
    url: rtsp://admin:${DOOR_PASS}@10.0.0.5:554/stream1
    app: face-live
    fps: 10
    transport: tcp
  - name: yard_2
    url: rtsps://${HOST}/live
    transport: AUTO
  - name: gate
    url: rtsp://gate.local/h265
    app: traffic
    transport: udp
`
	got, err := DecodeCameras("cameras.yaml", []byte(doc), []string{"face-live", "traffic"}, testEnv)
	if err == nil {
		t.Fatal("a camera without an app with two apps deployed was accepted")
	}
	if want := "cameras.yaml:7: cameras[1].app: missing"; !strings.Contains(err.Error(), want) {
		t.Fatalf("error %q, want %q", err, want)
	}
	// With one app deployed, a camera without one takes it.
	one := strings.Replace(strings.Replace(doc, "    app: traffic\n", "", 1), "app: face-live", "app: traffic", 1)
	got, err = DecodeCameras("cameras.yaml", []byte(one), []string{"traffic"}, testEnv)
	if err != nil {
		t.Fatal(err)
	}
	want := []Camera{
		{Name: "door", URL: "rtsp://admin:p%40ss:w0rd@10.0.0.5:554/stream1", App: "traffic", FPS: 10, Transport: "tcp"},
		{Name: "yard_2", URL: "rtsps://10.0.0.9/live", App: "traffic"},
		{Name: "gate", URL: "rtsp://gate.local/h265", App: "traffic", Transport: "udp"},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Fatalf("cameras (-want +got):\n%s", d)
	}
}

// TestDecodeCamerasErrors: every problem with file:line and field path,
// all at once; no password in any message.
func TestDecodeCamerasErrors(t *testing.T) {
	cases := []struct {
		name string
		doc  string
		want []string
	}{
		{"empty", "cameras: []\n", []string{"x.yaml:1: cameras: no cameras"}},
		{"unknown field", "cameras:\n  - name: a\n    url: rtsp://c/x\n    ap: traffic\n", []string{`x.yaml:4: cameras[0].ap: unknown field`}},
		{"duplicate key", "cameras:\n  - name: a\n    name: b\n    url: rtsp://c/x\n", []string{"x.yaml:3: cameras[0].name"}},
		{"bad type", "cameras:\n  - name: a\n    url: rtsp://c/x\n    fps: fast\n", []string{"x.yaml:4: cameras[0].fps"}},
		{"duplicate name", "cameras:\n  - name: a\n    url: rtsp://c/x\n  - name: a\n    url: rtsp://c/y\n",
			[]string{`x.yaml:4: cameras[1].name: "a" is already the name of cameras[0] (line 2)`}},
		{"bad name", "cameras:\n  - name: Door\n    url: rtsp://c/x\n", []string{`x.yaml:2: cameras[0].name: "Door": want lower-case`}},
		{"no name", "cameras:\n  - url: rtsp://c/x\n", []string{"x.yaml:2: cameras[0].name: missing"}},
		{"bad scheme", "cameras:\n  - name: a\n    url: http://admin:Hunter22@c/x\n", []string{`x.yaml:3: cameras[0].url: http://c/x: scheme "http": want rtsp:// or rtsps://`}},
		{"bad url", "cameras:\n  - name: a\n    url: rtsp://admin:Hunter22@c:port/x\n", []string{"x.yaml:3: cameras[0].url: rtsp:// URL (URL hidden: it may hold the password): what follows the host's ':' is not a port number"}},
		{"slash in password", "cameras:\n  - name: a\n    url: rtsp://admin:Hunt/er22@c/x\n", []string{"x.yaml:3: cameras[0].url: rtsp:// URL (URL hidden", "percent-encoded"}},
		{"bad variable", "cameras:\n  - name: a\n    url: rtsp://u:${Hunt/er22}@c/x\n", []string{"x.yaml:3: cameras[0].url: a ${...} that is not a variable name"}},
		{"no url", "cameras:\n  - name: a\n", []string{"x.yaml:2: cameras[0].url: missing"}},
		{"unset variable", "cameras:\n  - name: a\n    url: rtsp://u:${NOPE}@c/x\n", []string{"x.yaml:3: cameras[0].url: ${NOPE} is not set in the environment"}},
		{"unknown app", "cameras:\n  - name: a\n    url: rtsp://c/x\n    app: trafic\n", []string{`x.yaml:4: cameras[0].app: "trafic" is not deployed (deployed: traffic, face) (did you mean "traffic"?)`}},
		{"fps", "cameras:\n  - name: a\n    url: rtsp://c/x\n    fps: -2\n", []string{"x.yaml:4: cameras[0].fps: -2: want 0"}},
		{"transport", "cameras:\n  - name: a\n    url: rtsp://c/x\n    transport: http\n", []string{`x.yaml:4: cameras[0].transport: "http": want tcp, udp or auto`}},
		{"all at once", "cameras:\n  - name: a\n    url: ftp://c/x\n    fps: -1\n  - name: a\n    url: rtsp://c/y\n    transport: x\n",
			[]string{"x.yaml:3: cameras[0].url", "x.yaml:4: cameras[0].fps", "x.yaml:5: cameras[1].name", "x.yaml:7: cameras[1].transport"}},
		{"not yaml", "cameras: [\n", []string{"x.yaml:"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			doc := c.doc
			_, err := DecodeCameras("x.yaml", []byte(doc), []string{"traffic", "face"}, testEnv)
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error:\n%v\nwant a line with %q", err, w)
				}
			}
			if strings.Contains(err.Error(), "Hunter22") || strings.Contains(err.Error(), "Hunt") {
				t.Errorf("the error shows the password:\n%v", err)
			}
		})
	}
}

func TestParseCamerasFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "cameras.yaml")
	if err := os.WriteFile(p, []byte("cameras:\n  - name: a\n    url: rtsp://c/x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cams, err := ParseCameras(p, []string{"traffic"})
	if err != nil || len(cams) != 1 || cams[0].App != "traffic" {
		t.Fatalf("ParseCameras: %v, %v", cams, err)
	}
	if _, err := ParseCameras(filepath.Join(dir, "nope.yaml"), []string{"traffic"}); err == nil || !strings.Contains(err.Error(), "nope.yaml") {
		t.Fatalf("a missing file: %v", err)
	}
}

// FuzzParseCameras: any document is decoded or refused without a panic,
// and what is accepted passes Check.
func FuzzParseCameras(f *testing.F) {
	f.Add("cameras:\n  - name: door\n    url: rtsp://u:Secret1@10.0.0.5:554/s\n    app: traffic\n    fps: 10\n    transport: tcp\n")
	f.Add("cameras:\n  - name: a\n    url: http://u:Secret1@c/x\n  - {name: a, url: 'rtsp://c:0/'}\n")
	f.Add("cameras: [{name: x, url: 'rtsp://u:${DOOR_PASS}@c/x', app: nope, fps: -1, transport: q}]\n")
	f.Add("cameras: &a [*a]\n")
	f.Fuzz(func(t *testing.T, doc string) {
		cams, err := DecodeCameras("f.yaml", []byte(doc), []string{"traffic", "face"}, testEnv)
		if err != nil {
			return
		}
		if err := Check(cams, []string{"traffic", "face"}); err != nil {
			t.Fatalf("accepted cameras that Check refuses: %v\n%s", err, doc)
		}
	})
}

// FuzzCamerasURLPassword: whatever the user, password and host part of
// the URL in a cameras file, an error about it never shows the password.
// The oracle is the password as the fuzzer built the URL from it, not
// Redact or secrets: it is shown only if it is part of the user or host
// part, or of what the error says anyway (the error for the same URL with
// another password of its length).
func FuzzCamerasURLPassword(f *testing.F) {
	for _, s := range [][3]string{
		{"admin", "Secret1", "cam/x"}, {"admin", "pa/ss123", "cam/x"}, {"admin", "pa?ss123", "cam/x"},
		{"admin", "pa#ss123", "cam/x"}, {"admin", "p@ss/w0rd", "cam/x?q=a@b"}, {"admin", "1234/ss", "10.0.0.5/s"},
		{"admin", "12#secret", "cam:554/x"}, {"admin", "Secret1", "cam:99/x#f"}, {"admin", "Secret1", "c am/x"},
		{"admin", "Secret1", "%zz/"}, {"a:b", "Secret1", "cam:x/"}, {"admin", "pa%2Fss1", "cam/x"},
	} {
		f.Add(s[0], s[1], s[2])
	}
	decode := func(raw string) error {
		doc, err := yaml.Marshal(map[string]any{"cameras": []map[string]any{{"name": "a", "url": raw, "app": "traffic"}}})
		if err != nil {
			return nil
		}
		_, err = DecodeCameras("f.yaml", doc, []string{"traffic"}, nil)
		return err
	}
	f.Fuzz(func(t *testing.T, user, pw, hostpart string) {
		if len(pw) < 6 || strings.Contains(pw, "${") || strings.Contains(user+"\x00"+hostpart, pw) {
			return
		}
		raw := "rtsp://" + user + ":" + pw + "@" + hostpart
		err := decode(raw)
		if err == nil || !strings.Contains(err.Error(), pw) {
			return
		}
		other := decode("rtsp://" + user + ":" + strings.Repeat("Q", len(pw)) + "@" + hostpart)
		if other != nil && strings.Contains(other.Error(), pw) {
			return // the message says it anyway
		}
		t.Fatalf("url %q: the error shows the password %q:\n%v", raw, pw, err)
	})
}
