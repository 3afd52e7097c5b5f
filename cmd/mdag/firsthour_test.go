package main

import (
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestTokenNameNoSecret: `mdag token new`'s default name (the app and a
// suffix) shares no run of 4 characters or more with the token, in either
// case, beyond the app's own name; names differ from token to token.
// TestTokenNameEnds: a token that holds the app name's end and the dash
// ("fic-" for traffic: base64url has dashes) still gets a name; the
// first version redrew forever on it.
func TestTokenNameEnds(t *testing.T) {
	tok := "mdag_AbCfic-" + strings.Repeat("Z", 30)
	name := tokenName("traffic", tok)
	if !strings.HasPrefix(name, "traffic-") || len(name) != len("traffic-")+6 {
		t.Fatalf("name %q", name)
	}
}

func TestTokenNameNoSecret(t *testing.T) {
	seen := map[string]bool{}
	for range 200 {
		var out, errb bytes.Buffer
		if code := tokenCmd([]string{"new", "--app", "traffic"}, nil, &out, &errb); code != exitOK {
			t.Fatalf("exit %d: %s", code, errb.String())
		}
		var tok, name string
		for _, l := range strings.Split(out.String(), "\n") {
			if v, ok := strings.CutPrefix(l, "token: "); ok {
				tok = v
			}
			if v, ok := strings.CutPrefix(strings.TrimSpace(l), "- name: "); ok {
				name = v
			}
		}
		if tok == "" || !strings.HasPrefix(name, "traffic-") {
			t.Fatalf("no token or name %q in %q", name, out.String())
		}
		lt, ln := strings.ToLower(tok), strings.ToLower(name)
		for i := 0; i+4 <= len(ln); i++ {
			if i+4 <= len("traffic-") {
				continue // the app's name and the dash, the user's choice
			}
			if run := ln[i : i+4]; strings.Contains(lt, run) {
				t.Fatalf("name %q shares %q with its token %q", name, run, tok)
			}
		}
		if seen[name] {
			t.Fatalf("name %q twice", name)
		}
		seen[name] = true
	}
}

// TestCertsInitRefusal: a second `mdag certs init` into the same
// directory refuses without --force and says what a new CA costs and how
// to replace one certificate instead.
func TestCertsInitRefusal(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	if code := runCerts([]string{"init", "--dir", dir}, io.Discard, io.Discard); code != exitOK {
		t.Fatalf("init: exit %d", code)
	}
	var errb bytes.Buffer
	code := runCerts([]string{"init", "--dir", dir}, io.Discard, &errb)
	for _, says := range []string{"refusing to overwrite", "ca-key.pem", "--force makes a new CA", "every certificate the old one issued", "stops being trusted",
		"mdag certs issue --dir " + dir} {
		if !strings.Contains(errb.String(), says) {
			t.Errorf("second init: stderr lacks %q:\n%s", says, errb.String())
		}
	}
	if code != exitInvalid {
		t.Errorf("second init: exit %d, want %d", code, exitInvalid)
	}
	if code := runCerts([]string{"init", "--dir", dir, "--force"}, io.Discard, io.Discard); code != exitOK {
		t.Errorf("init --force: exit %d", code)
	}
}

// TestCertsInitGitWarning: certs init into a directory of a git work
// tree warns that the CA key may be committed, unless git ignores it;
// outside a work tree it says nothing.
func TestCertsInitGitWarning(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("no git")
	}
	repo := t.TempDir()
	if out, err := exec.Command("git", "init", "-q", repo).CombinedOutput(); err != nil {
		t.Fatalf("git init: %v %s", err, out)
	}
	certsInit := func(dir string) string {
		var errb bytes.Buffer
		if code := runCerts([]string{"init", "--dir", dir}, io.Discard, &errb); code != exitOK {
			t.Fatalf("init %s: exit %d %s", dir, code, errb.String())
		}
		return errb.String()
	}
	if got := certsInit(filepath.Join(repo, "certs")); !strings.Contains(got, "inside the git work tree "+repo) || !strings.Contains(got, "ca-key.pem") {
		t.Errorf("in a work tree: stderr %q, want the warning", got)
	}
	if err := os.WriteFile(filepath.Join(repo, ".gitignore"), []byte("certs/\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := certsInit(filepath.Join(repo, "sub", "certs")); got != "" {
		t.Errorf("ignored certs/: stderr %q, want nothing", got)
	}
	if got := certsInit(filepath.Join(t.TempDir(), "certs")); got != "" && gitWorkTree(os.TempDir()) == "" {
		t.Errorf("outside a work tree: stderr %q, want nothing", got)
	}
}

// TestVersionFeatures: mdag version names the build and what is compiled
// in, from the packages themselves: the executors, every CPU op, and the
// full build's codecs (WHIP video and audio, RTSP) or the lean build's
// lack of them; the toolchain's tags and commit.
func TestVersionFeatures(t *testing.T) {
	var out bytes.Buffer
	writeVersion(&out, versionInfo{goVersion: "go1.99", platform: "linux/amd64", tags: "lean", revision: "0123456789abcdef0123", modified: true})
	got := out.String()
	want := []string{"mdag " + version + " (" + buildName + " build: go1.99 linux/amd64, tags lean, commit 0123456789ab (modified))\n",
		"emulated", "onnx (ONNX Runtime", "kserve"}
	want = append(want, executors...)
	want = append(want, ops().Implemented()...)
	if buildName == "full" {
		want = append(want, "vp8, h264", "(opus)", "h264, h265", "OpenCV ")
	} else {
		want = append(want, "none: no WebRTC (WHIP) ingest", "none: no RTSP")
	}
	for _, w := range want {
		if !strings.Contains(got, w) {
			t.Errorf("mdag version lacks %q:\n%s", w, got)
		}
	}
	if strings.Contains(got, "with VP8\n") {
		t.Errorf("mdag version names VP8 only:\n%s", got)
	}
	out.Reset()
	writeVersion(&out, versionInfo{goVersion: "go1.99", platform: "linux/amd64", source: "src-0123abcd+dirty"})
	if want := "mdag " + version + " (" + buildName + " build: go1.99 linux/amd64, source src-0123abcd+dirty)\n"; !strings.HasPrefix(out.String(), want) {
		t.Errorf("mdag version with a source stamp: got %q, want the first line %q", out.String(), want)
	}
	out.Reset()
	if code := run([]string{"version"}, &out, io.Discard); code != exitOK || !strings.HasPrefix(out.String(), "mdag "+version+" ("+buildName+" build: go") {
		t.Errorf("mdag version: exit %d\n%s", code, out.String())
	}
}
