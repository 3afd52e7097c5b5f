package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mdag/mdag/gpu/onnx"
)

// The onnx executor from the CLI (both builds): serve with GPU modules on
// ONNX Runtime, and the refusals. testdata/onnx: the tiny classifier
// (gpu/onnx/testdata), an app running it then a sink, profiles.

func requireORT(t *testing.T) {
	if _, err := os.Stat(onnx.DefaultLib()); err != nil {
		if os.Getenv("MDAG_REQUIRE_ORT") != "" {
			t.Fatalf("MDAG_REQUIRE_ORT is set and %v", err)
		}
		t.Skipf("no ONNX Runtime library (%v); make deps installs it", err)
	}
}

func TestServeONNX(t *testing.T) {
	if testing.Short() {
		t.Skip("runs 3 s of live streams")
	}
	requireORT(t)
	var out, errb bytes.Buffer
	code := run(strings.Fields("serve -f testdata/onnx/app.yaml -p testdata/onnx/profiles.yaml --executor onnx --models testdata/onnx/models.yaml "+
		"--intra-threads 1 --synthetic 4 --duration 3s --listen 127.0.0.1:0"), &out, &errb)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	s := out.String()
	for _, want := range []string{"app tiny-onnx: 4 streams", "open 0;", "classify  gpu"} {
		if !strings.Contains(s, want) {
			t.Errorf("summary lacks %q:\n%s", want, s)
		}
	}
	// every batch ran: no frame dropped by the executor; on 2 shared cores
	// under -race a few may miss the SLO, so the bar here is 90%
	if strings.Contains(s, "executor=") {
		t.Errorf("frames dropped by the executor:\n%s", s)
	}
	var rate float64
	if _, err := fmt.Sscanf(s[strings.Index(s, "finish rate ")+len("finish rate "):], "%g%%", &rate); err != nil || rate < 90 {
		t.Errorf("finish rate %g%% (%v), want >= 90%%:\n%s", rate, err, s)
	}
	if !strings.Contains(errb.String(), "GPU modules run on ONNX Runtime 1.") {
		t.Errorf("the log does not say the workers run ONNX Runtime:\n%s", errb.String())
	}
}

func TestONNXRefusals(t *testing.T) {
	requireORT(t)
	dir := t.TempDir()
	other := filepath.Join(dir, "models.yaml")
	b, err := os.ReadFile("testdata/onnx/models.yaml")
	if err != nil {
		t.Fatal(err)
	}
	abs, err := filepath.Abs("../../gpu/onnx/testdata/tiny-classifier.onnx")
	if err != nil {
		t.Fatal(err)
	}
	s := strings.Replace(strings.Replace(string(b), "  tiny:", "  small:", 1), "../../../../gpu/onnx/testdata/tiny-classifier.onnx", abs, 1)
	if err := os.WriteFile(other, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte(strings.Replace(s, "width: 64", "width: 32", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	app := "-f testdata/onnx/app.yaml -p testdata/onnx/profiles.yaml"
	for _, tc := range []struct {
		name, args string
		want       string
	}{
		{"model not in registry", "serve " + app + " --executor onnx --models " + other,
			`testdata/onnx/app.yaml:9: modules[0].model: "tiny" is not in the model registry ` + other + " (it has: small)"},
		{"missing library", "serve " + app + " --executor onnx --models testdata/onnx/models.yaml --ort-lib /nonexistent/libonnxruntime.so.1",
			"ONNX Runtime library not found at /nonexistent/libonnxruntime.so.1; run make deps or set MDAG_ORT_LIB"},
		{"models without onnx", "serve " + app + " --models testdata/onnx/models.yaml", "--models need --executor onnx"},
		{"unknown executor", "serve " + app + " --executor tpu", `--executor "tpu": want emulated, onnx or kserve`},
		{"worker needs models", "worker --type ORT --executor onnx", "--executor onnx needs --models models.yaml"},
		{"worker missing library", "worker --type ORT --executor onnx --models testdata/onnx/models.yaml --ort-lib /nope.so",
			"ONNX Runtime library not found at /nope.so; run make deps or set MDAG_ORT_LIB"},
		{"worker device flag", "worker --type ORT --device cuda", "--device need --executor onnx"},
		{"worker wrong shape", "worker --type ORT --executor onnx --models " + bad,
			"model small: input 'input' is float32[batch,3,64,64] in tiny-classifier.onnx, the registry says NCHW 32x64"},
		{"validate wrong shape", "validate --models " + bad, bad + ":6: models.small.file: model small: input 'input' is float32[batch,3,64,64]"},
		{"validate app model", "validate -f testdata/onnx/app.yaml --models " + other, `modules[0].model: "tiny" is not in the model registry`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			code := run(strings.Fields(tc.args), &out, &errb)
			if code != exitInvalid || !strings.Contains(errb.String(), tc.want) {
				t.Fatalf("exit %d, stderr:\n%s\nwant exit %d and %q", code, errb.String(), exitInvalid, tc.want)
			}
		})
	}
	var out, errb bytes.Buffer
	if code := run(strings.Fields("validate -f testdata/onnx/app.yaml --models testdata/onnx/models.yaml"), &out, &errb); code != exitOK {
		t.Fatalf("validate with the registry: exit %d: %s", code, errb.String())
	}
}

// A model that fails inside ONNX Runtime on every batch (its Reshape
// cannot take the registry's 20x20): serve keeps running and counts every
// frame of the module dropped: by the executor (a loaded machine may also
// drop one whose budget is already spent before it runs: cannot-finish).
func TestServeONNXRunErrors(t *testing.T) {
	if testing.Short() {
		t.Skip("runs 2 s of live streams")
	}
	requireORT(t)
	abs, err := filepath.Abs("../../gpu/onnx/testdata/tiny-reshape.onnx")
	if err != nil {
		t.Fatal(err)
	}
	models := filepath.Join(t.TempDir(), "models.yaml")
	reg := "models:\n  tiny:\n    format: onnx\n    file: " + abs + "\n    input: {name: input, dtype: float32, layout: NCHW, width: 20, height: 20}\n" +
		"    max_batch: 8\n    decoder: {name: classify}\n"
	if err := os.WriteFile(models, []byte(reg), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	code := run(strings.Fields("serve -f testdata/onnx/app.yaml -p testdata/onnx/profiles.yaml --executor onnx --models "+models+
		" --synthetic 2 --duration 2s --listen 127.0.0.1:0"), &out, &errb)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	s := out.String()
	if !strings.Contains(s, "finished 0,") || !strings.Contains(s, "classify: executor=") || !strings.Contains(s, "open 0;") {
		t.Fatalf("want every frame dropped by the executor:\n%s", s)
	}
}
