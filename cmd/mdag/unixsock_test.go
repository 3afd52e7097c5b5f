package main

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestCoordinatorUnixSocket: a coordinator on --grpc unix:/PATH (issue
// 36) serves workers and a source on --coordinator unix:/PATH, in
// plaintext with no warning, the address logged as unix:/PATH; the
// workers relay (no loopback peer port beside a Unix socket); the socket
// goes with the coordinator.
func TestCoordinatorUnixSocket(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a coordinator, workers and a source for a few seconds")
	}
	sock := filepath.Join(t.TempDir(), "run", "coord.sock")
	c := startCoordinator(t, "--example", "traffic", "--duration", "16s", "--grpc", "unix:"+sock)
	if c.grpc != "unix:"+sock {
		t.Fatalf("the coordinator logged grpc=%s, want unix:%s:\n%s", c.grpc, sock, c.logs())
	}
	if fi, err := os.Lstat(sock); err != nil || fi.Mode() != os.ModeSocket|0o600 {
		t.Fatalf("the socket: %v, %v: want a socket of mode 0600", fi, err)
	}
	workerDone := make(chan int, 2)
	var workerErr [2]bytes.Buffer
	for i, typ := range []string{"V100", "CPU"} {
		go func() {
			workerDone <- run([]string{"worker", "--coordinator", c.grpc, "--type", typ, "--id", "u-" + typ, "--duration", "12s"}, io.Discard, &workerErr[i])
		}()
	}
	deadline := time.Now().Add(11 * time.Second) // a loaded 2-core machine under -race: the workers live 12 s
	for len(getStatus(t, c.url).Instances) != 2 {
		if time.Now().After(deadline) {
			<-workerDone
			<-workerDone
			t.Fatalf("timed out waiting for the workers to register; status %+v\nworker V100:\n%s\nworker CPU:\n%s\ncoordinator:\n%s",
				getStatus(t, c.url).Instances, workerErr[0].String(), workerErr[1].String(), c.logs())
		}
		<-time.After(20 * time.Millisecond)
	}
	var out, errb bytes.Buffer
	if code := run([]string{"source", "--coordinator", "unix://" + sock, "--app", "traffic", "--fps", "20", "--count", "10"}, &out, &errb); code != exitOK ||
		!strings.Contains(out.String(), "stream synthetic-0: 10 frames accepted, 0 rejected") {
		t.Fatalf("source over unix://%s: exit %d:\n%s\n%s", sock, code, out.String(), errb.String())
	}
	if !strings.Contains(errb.String(), "gRPC is plaintext on a Unix socket") || strings.Contains(errb.String(), "on loopback") {
		t.Errorf("the source's log does not say it is plaintext on a Unix socket, or warns of loopback:\n%s", errb.String())
	}
	for range 2 {
		if code := <-workerDone; code != exitOK {
			t.Errorf("worker: exit %d:\n%s\n%s", code, workerErr[0].String(), workerErr[1].String())
		}
	}
	for i := range workerErr {
		w := workerErr[i].String()
		if !strings.Contains(w, "gRPC is plaintext on a Unix socket") || !strings.Contains(w, "data plane: relay") || strings.Contains(w, "on loopback") {
			t.Errorf("worker log: want plaintext on a Unix socket, relaying, no loopback warning:\n%s", w)
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
	logs := c.logs()
	if !strings.Contains(logs, `grpc_security="plaintext (Unix socket: this uid and root only, peers checked)"`) || strings.Contains(logs, "on loopback") {
		t.Errorf("the coordinator's log does not say it serves a Unix socket, or warns of loopback:\n%s", logs)
	}
	if m := regexp.MustCompile(`frames sent (\d+)`).FindStringSubmatch(c.out.String()); m == nil || m[1] != "10" {
		t.Errorf("want the source's 10 frames sent:\n%s", c.out.String())
	}
	if _, err := os.Lstat(sock); !os.IsNotExist(err) {
		t.Errorf("the socket is left after the coordinator stopped: %v", err)
	}
}

// TestUnixSocketFlags: what the commands refuse with a unix: gRPC address,
// before they start anything.
func TestUnixSocketFlags(t *testing.T) {
	dir := t.TempDir()
	sock := "unix:" + filepath.Join(dir, "run", "coord.sock")
	long := "unix:" + filepath.Join(dir, strings.Repeat("s", 120))
	for _, c := range []struct {
		args []string
		code int
		err  string
	}{
		{[]string{"coordinator", "--example", "traffic", "--listen", "127.0.0.1:0", "--grpc", sock, "--tls-dir", dir}, exitInvalid,
			"mdag coordinator: --tls-dir/--ca/--cert/--key with --grpc " + sock + ": gRPC on a Unix socket is plaintext"},
		{[]string{"coordinator", "--example", "traffic", "--listen", "127.0.0.1:0", "--grpc", sock, "--shared-cert", "worker/worker=w-"}, exitInvalid,
			"mdag coordinator: --shared-cert with --grpc " + sock},
		{[]string{"coordinator", "--example", "traffic", "--listen", "127.0.0.1:0", "--grpc", "unix-abstract:mdag"}, exitInvalid,
			"--grpc unix-abstract:mdag: an abstract socket has no file permissions"},
		{[]string{"coordinator", "--example", "traffic", "--listen", "127.0.0.1:0", "--grpc", "unix:coord.sock", "--duration", "1ms"}, exitFailure,
			`listen unix:coord.sock: socket path "coord.sock": want an absolute path (unix:/PATH)`},
		{[]string{"coordinator", "--example", "traffic", "--listen", "127.0.0.1:0", "--grpc", long, "--duration", "1ms"}, exitFailure,
			"a Unix socket path may have at most 107"},
		{[]string{"worker", "--type", "CPU", "--coordinator", sock, "--cert", "w.pem"}, exitInvalid,
			"mdag worker: --tls-dir/--ca/--cert/--key with --coordinator " + sock},
		{[]string{"source", "--app", "traffic", "--coordinator", sock, "--tls-dir", dir}, exitInvalid,
			"mdag source: --tls-dir/--ca/--cert/--key with --coordinator " + sock},
	} {
		var out, errb bytes.Buffer
		if code := run(c.args, &out, &errb); code != c.code || !strings.Contains(errb.String(), c.err) {
			t.Errorf("%v: exit %d, want %d with %q:\n%s", c.args, code, c.code, c.err, errb.String())
		}
	}
}
