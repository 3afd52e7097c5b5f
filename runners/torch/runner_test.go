package torch

import (
	"context"
	"os"
	"os/exec"
	"regexp"
	"testing"
	"time"
)

// defaultPython is the interpreter the runner's tests run under: Debian's,
// which has python3-torch, python3-torchvision, python3-grpcio and
// python3-protobuf. MDAG_PYTHON names another (a GPU machine's venv, say).
const defaultPython = "/usr/bin/python3"

// TestPythonRunner runs test_runner.py (the runner over gRPC on CPU: every
// RPC, outputs against the eager model, errors, shared memory, load/unload).
// It skips when torch, torchvision or grpc cannot be imported, unless
// MDAG_REQUIRE_TORCH=1, when it fails instead.
func TestPythonRunner(t *testing.T) {
	require := os.Getenv("MDAG_REQUIRE_TORCH") == "1"
	python := defaultPython
	if p := os.Getenv("MDAG_PYTHON"); p != "" {
		python = p
	}
	if out, err := exec.Command(python, "-c", "import torch, torchvision, grpc, google.protobuf, numpy").CombinedOutput(); err != nil {
		if require {
			t.Fatalf("MDAG_REQUIRE_TORCH=1 but %s cannot import the runner's packages: %v\n%s", python, err, out)
		}
		t.Skipf("%s cannot import torch, torchvision, grpc, protobuf and numpy (set MDAG_REQUIRE_TORCH=1 to fail): %v", python, err)
	}
	limit := 10 * time.Minute
	if d, ok := t.Deadline(); ok && time.Until(d) < limit {
		limit = time.Until(d) - 10*time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, python, "-m", "unittest", "-v", "test_runner")
	cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1", "PYTHONUNBUFFERED=1")
	out, err := cmd.CombinedOutput()
	t.Logf("%s -m unittest -v test_runner:\n%s", python, out)
	if ctx.Err() != nil {
		t.Fatalf("python tests did not finish within %v", limit)
	}
	if err != nil {
		t.Fatalf("python tests failed: %v", err)
	}
	// Python 3.11's unittest exits 0 when it finds no test
	if m := ran.FindSubmatch(out); m == nil || string(m[1]) == "0" {
		t.Fatalf("python tests ran no test")
	}
}

var ran = regexp.MustCompile(`(?m)^Ran (\d+) tests? in`)
