package main

import (
	"bytes"
	"errors"
	"flag"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/mdag/mdag/coordinator/why"
	"github.com/mdag/mdag/internal/pki"
)

// TestCerts: mdag certs init and issue, their files and their refusals.
func TestCerts(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	w1 := filepath.Join(t.TempDir(), "w1")
	for _, c := range []struct {
		name string
		args []string
		code int
		out  string // in stdout
		err  string // in stderr
	}{
		{"no subcommand", []string{"certs"}, exitInvalid, "", "Usage: mdag certs init"},
		{"unknown subcommand", []string{"certs", "make"}, exitInvalid, "", `unknown subcommand "make": want init or issue`},
		{"init without --dir", []string{"certs", "init"}, exitInvalid, "", "--dir is required"},
		{"init with a bad host", []string{"certs", "init", "--dir", dir, "--hosts", "coord:7070"}, exitInvalid, "", `"coord:7070": not an IP address nor a DNS name`},
		{"init with no validity", []string{"certs", "init", "--dir", dir, "--valid", "0s"}, exitInvalid, "", "--valid 0s: want > 0"},
		{"init", []string{"certs", "init", "--dir", dir, "--hosts", "localhost,127.0.0.1,coord.lan"}, exitOK, "wrote " + filepath.Join(dir, "source-key.pem"), ""},
		{"init again", []string{"certs", "init", "--dir", dir}, exitInvalid, "", "refusing to overwrite " + filepath.Join(dir, "ca.pem")},
		{"issue a worker elsewhere", []string{"certs", "issue", "--dir", dir, "--role", "worker", "--name", "w1", "--out", w1}, exitOK, "wrote " + filepath.Join(w1, "ca.pem"), ""},
		{"issue it again", []string{"certs", "issue", "--dir", dir, "--role", "worker", "--name", "w1", "--out", w1}, exitInvalid, "", "give --force"},
		{"rotate it", []string{"certs", "issue", "--dir", dir, "--role", "worker", "--name", "w1", "--out", w1, "--force"}, exitOK, "wrote " + filepath.Join(w1, "worker.pem"), ""},
		{"a worker with hosts", []string{"certs", "issue", "--dir", dir, "--role", "worker", "--hosts", "x", "--out", t.TempDir()}, exitInvalid, "", "a worker's certificate names no host"},
		{"an unknown role", []string{"certs", "issue", "--dir", dir, "--role", "admin"}, exitInvalid, "", `--role: role "admin": want coordinator, worker or source`},
		{"issue without --role", []string{"certs", "issue", "--dir", dir}, exitInvalid, "", "mdag certs issue: --role is required"},
		{"issue without anything", []string{"certs", "issue", "--valid", "0s"}, exitInvalid, "",
			"mdag certs issue: --dir is required\nmdag certs issue: --role is required\nmdag certs issue: --valid 0s: want > 0\n3 problems found\n"},
		{"issue without a CA", []string{"certs", "issue", "--dir", t.TempDir(), "--role", "source"}, exitInvalid, "", "create one with mdag certs init --dir"},
		{"a bad name", []string{"certs", "issue", "--dir", dir, "--role", "source", "--name", "a/b", "--out", t.TempDir()}, exitInvalid, "", `name "a/b": character '/'`},
	} {
		t.Run(c.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			code := run(c.args, &out, &errb)
			if code != c.code || !strings.Contains(out.String(), c.out) || !strings.Contains(errb.String(), c.err) {
				t.Errorf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s\nwant %q in stdout and %q in stderr", code, c.code, out.String(), errb.String(), c.out, c.err)
			}
		})
	}
	for _, f := range []string{filepath.Join(dir, "ca-key.pem"), filepath.Join(dir, "worker-key.pem"), filepath.Join(w1, "worker-key.pem")} {
		if fi, err := os.Stat(f); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v, want mode 0600", f, fi.Mode())
		}
	}
	m, err := pki.Load(pki.DirFiles(dir, pki.Coordinator), pki.Coordinator, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := m.Certificate().DNSNames; len(got) != 2 || got[1] != "coord.lan" {
		t.Errorf("the coordinator's certificate names %v, want localhost and coord.lan", got)
	}
	if m, err := pki.Load(pki.DirFiles(w1, pki.Worker), pki.Worker, nil, nil); err != nil || m.Name() != "mdag://worker/w1" {
		t.Errorf("the issued worker: %v %v", m, err)
	}
}

// TestGRPCSecurityFlags: the policy of --tls-dir/--ca/--cert/--key and
// --insecure against the gRPC address: plaintext by default and with
// --insecure on loopback only; TLS required elsewhere, with an error that
// says how to make certificates.
func TestGRPCSecurityFlags(t *testing.T) {
	dir := t.TempDir()
	if _, err := pki.Init(dir, pki.InitOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		args []string
		addr string
		tls  bool
		err  string
	}{
		{"loopback, no flags", nil, "127.0.0.1:7070", false, ""},
		{"localhost, no flags", nil, "localhost:7070", false, ""},
		{"::1, no flags", nil, "[::1]:7070", false, ""},
		{"a dns target on loopback", nil, "dns:///127.0.0.1:7070", false, ""},
		{"a unix socket", nil, "unix:///run/mdag.sock", false, ""},
		{"all interfaces, no flags", nil, ":7070", false, "--grpc :7070 is not a loopback address, so gRPC needs mutual TLS: create certificates with `mdag certs init"},
		{"a LAN address, no flags", nil, "10.0.0.5:7070", false, "needs mutual TLS"},
		{"a dns target off loopback", nil, "dns:///coord.lan:7070", false, "needs mutual TLS"},
		{"--insecure on loopback", []string{"--insecure"}, "127.0.0.1:7070", false, ""},
		{"--insecure off loopback", []string{"--insecure"}, "0.0.0.0:7070", false, "--insecure with --grpc 0.0.0.0:7070: plaintext gRPC is allowed only on a loopback address"},
		{"--insecure and --tls-dir", []string{"--insecure", "--tls-dir", dir}, "127.0.0.1:7070", false, "choose plaintext or TLS"},
		{"--tls-dir", []string{"--tls-dir", dir}, "10.0.0.5:7070", true, ""},
		{"--tls-dir on loopback", []string{"--tls-dir", dir}, "127.0.0.1:7070", true, ""},
		{"explicit files", []string{"--ca", filepath.Join(dir, "ca.pem"), "--cert", filepath.Join(dir, "coordinator.pem"), "--key", filepath.Join(dir, "coordinator-key.pem")}, "10.0.0.5:7070", true, ""},
		{"--cert without --ca", []string{"--cert", filepath.Join(dir, "coordinator.pem"), "--key", filepath.Join(dir, "coordinator-key.pem")}, "10.0.0.5:7070", false, "--ca is missing: give --tls-dir DIR, or all of --ca, --cert and --key"},
		{"a worker's certificate", []string{"--tls-dir", dir, "--cert", filepath.Join(dir, "worker.pem"), "--key", filepath.Join(dir, "worker-key.pem")}, "10.0.0.5:7070", false, "is a worker's certificate (mdag://worker/worker); a coordinator needs a coordinator's"},
		{"an empty directory", []string{"--tls-dir", t.TempDir()}, "10.0.0.5:7070", false, "ca.pem: no such file"},
		// issue 36: a shared certificate is a TLS notion
		{"--shared-cert with TLS", []string{"--tls-dir", dir, "--shared-cert", "worker/worker=w-"}, "10.0.0.5:7070", true, ""},
		{"--shared-cert in plaintext", []string{"--shared-cert", "worker/worker=w-"}, "127.0.0.1:7070", false, "--shared-cert names certificates, but gRPC is plaintext: give --tls-dir too"},
	} {
		t.Run(c.name, func(t *testing.T) {
			fs := flag.NewFlagSet("coordinator", flag.ContinueOnError)
			tf := addTLSFlags(fs, false)
			if err := fs.Parse(c.args); err != nil {
				t.Fatal(err)
			}
			var logs bytes.Buffer
			m, err := tf.material(pki.Coordinator, "--grpc", c.addr, slog.New(slog.NewTextHandler(&logs, nil)))
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("material = %v, want an error with %q", err, c.err)
				}
				return
			}
			if err != nil || (m != nil) != c.tls {
				t.Fatalf("material = %v, %v; want TLS %v", m, err, c.tls)
			}
			if !c.tls && len(c.args) == 0 && !strings.Contains(logs.String(), "gRPC is plaintext") {
				t.Errorf("plaintext by default was not logged:\n%s", logs.String())
			}
			if len(tf.shared) > 0 && !strings.Contains(logs.String(), `shared_cert="worker/worker=w-"`) {
				t.Errorf("the shared certificate was not logged:\n%s", logs.String())
			}
		})
	}
	for _, bad := range [][]string{{"--shared-cert", "worker/worker"}, {"--shared-cert", "worker/a=x", "--shared-cert", "worker/a=y"}} {
		fs := flag.NewFlagSet("coordinator", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		addTLSFlags(fs, false)
		if err := fs.Parse(bad); err == nil {
			t.Errorf("%v: parsed, want an error", bad)
		}
	}
}

// TestInsecureRefused: the commands refuse --insecure off loopback before
// they start anything.
func TestInsecureRefused(t *testing.T) {
	for _, c := range []struct {
		args []string
		err  string
	}{
		{[]string{"coordinator", "--example", "traffic", "--grpc", "0.0.0.0:0", "--listen", "127.0.0.1:0", "--insecure"}, "mdag coordinator: --insecure with --grpc 0.0.0.0:0"},
		{[]string{"coordinator", "--example", "traffic", "--grpc", "0.0.0.0:0", "--listen", "127.0.0.1:0"}, "mdag coordinator: --grpc 0.0.0.0:0 is not a loopback address"},
		{[]string{"worker", "--type", "CPU", "--coordinator", "10.0.0.5:7070", "--insecure"}, "mdag worker: --insecure with --coordinator 10.0.0.5:7070"},
		{[]string{"source", "--app", "traffic", "--coordinator", "coord.lan:7070"}, "mdag source: --coordinator coord.lan:7070 is not a loopback address"},
	} {
		var out, errb bytes.Buffer
		if code := run(c.args, &out, &errb); code != exitInvalid || !strings.Contains(errb.String(), c.err) {
			t.Errorf("%v: exit %d, want %d with %q:\n%s", c.args, code, exitInvalid, c.err, errb.String())
		}
	}
}

// TestDistributedTLS: coordinator, worker and source with --tls-dir from
// mdag certs init: the worker registers, the source's frames are accepted
// and finish; a worker and a source with another CA's certificates are
// refused (the coordinator logs why) and never register or join.
func TestDistributedTLS(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a coordinator, a worker and sources for a few seconds")
	}
	dir, other := t.TempDir(), t.TempDir()
	for _, d := range []string{dir, other} {
		var out, errb bytes.Buffer
		if code := run([]string{"certs", "init", "--dir", d}, &out, &errb); code != exitOK {
			t.Fatalf("certs init: exit %d: %s", code, errb.String())
		}
	}
	// Each worker has a certificate of its own and registers under its
	// name without --id; the source's streams are named after its
	// certificate without --prefix (issue 36: identities bound to
	// certificates, no --shared-cert needed).
	for _, typ := range []string{"V100", "CPU"} {
		var out, errb bytes.Buffer
		if code := run([]string{"certs", "issue", "--dir", dir, "--role", "worker", "--name", "w-" + typ, "--out", filepath.Join(dir, "w-"+typ)}, &out, &errb); code != exitOK {
			t.Fatalf("certs issue: exit %d: %s", code, errb.String())
		}
	}
	c := startCoordinator(t, "--example", "traffic", "--duration", "30s", "--tls-dir", dir)
	grpcAddr, url, coordLogs := c.grpc, c.url, c.logs
	workerDone := make(chan int, 2)
	var workerErr [2]bytes.Buffer
	for i, typ := range []string{"V100", "CPU"} {
		go func() {
			workerDone <- run([]string{"worker", "--coordinator", grpcAddr, "--type", typ, "--duration", "20s", "--tls-dir", filepath.Join(dir, "w-"+typ)}, io.Discard, &workerErr[i])
		}()
	}
	// generous bounds: TLS handshakes and registration under -race on a
	// loaded 2-core machine (the workers stop after 20 s, the coordinator
	// after 30 s); on a timeout the workers' own words say why
	deadline := time.Now().Add(15 * time.Second)
	for len(getStatus(t, url).Instances) != 2 {
		if time.Now().After(deadline) {
			<-workerDone
			<-workerDone
			t.Fatalf("timed out after 15s waiting for the workers to register; status %+v\nworker V100:\n%s\nworker CPU:\n%s\ncoordinator:\n%s",
				getStatus(t, url).Instances, workerErr[0].String(), workerErr[1].String(), coordLogs())
		}
		<-time.After(20 * time.Millisecond)
	}

	var out, errb bytes.Buffer
	if code := run([]string{"source", "--coordinator", grpcAddr, "--app", "traffic", "--fps", "20", "--count", "10", "--tls-dir", dir}, &out, &errb); code != exitOK ||
		!strings.Contains(out.String(), "stream source/synthetic-0: 10 frames accepted, 0 rejected") {
		t.Fatalf("source: exit %d:\n%s\n%s", code, out.String(), errb.String())
	}

	// Another CA's source: refused in the handshake, exit 1.
	out.Reset()
	errb.Reset()
	if code := run([]string{"source", "--coordinator", grpcAddr, "--app", "traffic", "--prefix", "foreign", "--count", "3", "--tls-dir", other}, &out, &errb); code != exitFailure || strings.Contains(out.String(), "accepted") {
		t.Errorf("another CA's source: exit %d, want %d:\n%s\n%s", code, exitFailure, out.String(), errb.String())
	}
	// A plaintext source against the TLS port: refused, with the hint.
	out.Reset()
	errb.Reset()
	if code := run([]string{"source", "--coordinator", grpcAddr, "--app", "traffic", "--prefix", "plain", "--count", "3"}, &out, &errb); code != exitFailure ||
		!strings.Contains(errb.String(), "the coordinator may require TLS: give this process --tls-dir too") {
		t.Errorf("a plaintext source: exit %d, want %d with the hint:\n%s\n%s", code, exitFailure, out.String(), errb.String())
	}
	// Another CA's worker keeps being refused until it stops.
	var foreignErr bytes.Buffer
	if code := run([]string{"worker", "--coordinator", grpcAddr, "--type", "CPU", "--id", "intruder", "--duration", "1s", "--tls-dir", other}, io.Discard, &foreignErr); code != exitOK ||
		!strings.Contains(foreignErr.String(), "disconnected; reconnecting") {
		t.Errorf("another CA's worker: exit %d:\n%s", code, foreignErr.String())
	}
	for _, in := range getStatus(t, url).Instances {
		if in.ID == "intruder" {
			t.Errorf("another CA's worker registered: %+v", in)
		}
	}
	waitFor(t, "the refusals in the coordinator's log", 10*time.Second, func() bool {
		return strings.Count(coordLogs(), "gRPC TLS handshake refused") >= 3
	})
	if strings.Contains(coordLogs(), "stream=foreign-0") || strings.Contains(coordLogs(), "stream=plain-0") {
		t.Errorf("another CA's stream joined:\n%s", coordLogs())
	}
	if !strings.Contains(coordLogs(), "grpc_security=\"mutual TLS\"") || !strings.Contains(coordLogs(), "cert=mdag://worker/w-V100") {
		t.Errorf("the coordinator's log does not say it runs mutual TLS and who connected:\n%s", coordLogs())
	}
	for range 2 {
		if code := <-workerDone; code != exitOK {
			t.Errorf("worker: exit %d:\n%s\n%s", code, workerErr[0].String(), workerErr[1].String())
		}
	}
	select {
	case code := <-c.done:
		if code != exitOK {
			t.Fatalf("coordinator: exit %d:\n%s", code, c.out.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the coordinator did not stop")
	}
	<-c.logged
	// Every frame of the source reached the session and ended; those not
	// finished were dropped only for load (a worker slowed by 2 busy cores
	// under -race), never for want of a route through the TLS workers.
	m := regexp.MustCompile(`frames sent (\d+), finished (\d+), late \d+, dropped \d+, open (\d+)`).FindStringSubmatch(c.out.String())
	if m == nil || m[1] != "10" || m[3] != "0" {
		t.Errorf("want the source's 10 frames sent, none open:\n%s", c.out.String())
	}
	if d := regexp.MustCompile(`drops: (.*)`).FindStringSubmatch(c.out.String()); d != nil {
		for _, r := range regexp.MustCompile(`\w[\w-]*: ([a-z-]+)=\d+`).FindAllStringSubmatch(d[1], -1) {
			if !why.Drop(r[1]).Load() {
				t.Errorf("a frame dropped %s: not for load, so the TLS workers did not carry it:\n%s", r[1], c.out.String())
			}
		}
	} else if m != nil && m[2] == "0" {
		t.Errorf("no frame finished and none dropped:\n%s", c.out.String())
	}
}

// TestExplain: a TLS/plaintext mismatch with the coordinator, which gRPC
// reports in transport terms, gets a hint saying which side to fix.
func TestExplain(t *testing.T) {
	for _, c := range []struct {
		plain bool
		err   error
		want  string
	}{
		{true, nil, ""},
		{true, errors.New(`connection error: desc = "error reading server preface: EOF"`), "server preface: EOF\" (the coordinator may require TLS: give this process --tls-dir too)"},
		{false, errors.New("connection error: tls: first record does not look like a TLS handshake"), "handshake (the coordinator speaks plaintext: it runs without --tls-dir)"},
		{false, errors.New(`connection error: desc = "error reading server preface: EOF"`), `preface: EOF"`},
		{true, errors.New("register: unknown type"), "register: unknown type"},
	} {
		f := &tlsFlags{plain: c.plain}
		got := f.explain(c.err)
		if c.err == nil {
			if got != nil {
				t.Errorf("explain(nil) = %v", got)
			}
			continue
		}
		if !strings.HasSuffix(got.Error(), c.want) || !errors.Is(got, c.err) {
			t.Errorf("explain(%v, plain %v) = %v, want it ending %q and wrapping the error", c.err, c.plain, got, c.want)
		}
	}
}
