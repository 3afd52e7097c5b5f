// Package torch holds mdag's PyTorch runner, a Python program (runner.py)
// that serves models over the Open Inference Protocol (KServe v2) for the
// gpu/kserve executor. It has no Go code: its Go test runs the runner's
// Python tests (test_runner.py) so that go test covers them.
package torch
