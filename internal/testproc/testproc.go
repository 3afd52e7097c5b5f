// Package testproc runs a test binary again as another user, for tests of
// what a peer of another uid may do (the helper-process pattern: the
// child runs one test function, which sees an environment variable the
// parent set and plays its part).
package testproc

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
)

// Nobody is the uid and gid AsNobody runs as.
const Nobody = 65534

// AsNobody returns a command running this test binary's test (by name:
// the child runs only it) as uid and gid Nobody, from a directory
// (returned) that uid may read, with a copy of the binary there; the
// caller adds its variables to cmd.Env. It skips the test unless it runs
// as root.
func AsNobody(t *testing.T, test string) (*exec.Cmd, string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skipf("needs root: the peer runs as uid %d", Nobody)
	}
	pub, err := os.MkdirTemp("", "mdag-peer-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(pub) })
	if err := os.Chmod(pub, 0o755); err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	child := filepath.Join(pub, "peer.test")
	if err := os.Link(exe, child); err != nil { // another file system: copy
		b, err := os.ReadFile(exe)
		if err != nil || os.WriteFile(child, b, 0o755) != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(child, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(child, "-test.run=^"+test+"$", "-test.count=1")
	cmd.Dir = pub
	// GORACE: a race-enabled child would wait a second on exit
	cmd.Env = append(os.Environ(), "GORACE=atexit_sleep_ms=0")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: Nobody, Gid: Nobody}}
	return cmd, pub
}
