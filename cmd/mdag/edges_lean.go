//go:build lean

package main

import (
	"fmt"
	"io"

	"github.com/mdag/mdag/gpu"
	"github.com/mdag/mdag/media"
	"github.com/mdag/mdag/modules"
	"github.com/mdag/mdag/observe/dashboard"
)

// The lean binary's edges (`make lean`, bin/mdag-lean): pure-Go ops, the
// area-average scaler and JPEG thumbnails of the standard library, the
// emulated, onnx and kserve executors (onnx.go: ONNX Runtime is opened with
// dlopen at run time, like NVML; kserve.go: pure Go gRPC), no WebRTC (whip_lean.go). It links no OpenCV,
// libvpx or C++ runtime, and `make lean` links lp_solve's colamd
// statically (lp_solve is static already), so it runs on a machine with
// only the C runtime (tools/lean-check.sh checks with ldd). NVML stays:
// go-nvml opens libnvidia-ml at run time, where there is one, so the lean
// binary on a GPU machine still reports GPU telemetry.

// buildName names this binary's edges (mdag version lists them: version_lean.go).
const buildName = "lean"

// fullBuild is where what the lean build lacks is.
const fullBuild = "the full build has it: bin/mdag (make build)"

// ops is the registry of the CPU ops this binary runs: the pure-Go ones.
func ops() *modules.Registry { return modules.Builtin() }

// scaler downscales frames (ingest, oversize frames).
var scaler media.Scaler = media.ScaleArea

// thumbEncoder makes the dashboard's thumbnails.
var thumbEncoder dashboard.Encoder = dashboard.JPEG

// executors lists the build-specific GPU executors (`mdag worker
// --executor`): none (emulated, onnx and kserve are in both builds).
var executors []string

// decoders lists the model output decoders of the real executors: none.
func decoders() []string { return nil }

// newExecutor fails: the lean build has no OpenCV executor (onnx is
// wired in onnx.go, in both builds).
func newExecutor(name string, _ []gpu.ModelFile, _ int) (gpu.Executor, func(), error) {
	return nil, nil, fmt.Errorf("executor %q: the lean build has emulated, onnx and kserve, not opencv; %s", name, fullBuild)
}

// executorHelp is `mdag worker --executor`'s help.
const executorHelp = "GPU executor: emulated (profiled times, no GPU needed), onnx (registry models on ONNX Runtime, loaded at run time; --models) " +
	"or kserve (registry models on Open Inference Protocol servers over gRPC: mdag infer-server, Triton, KServe; --models); the full build adds opencv: bin/mdag, make build"

// edgeCommands are the full build's commands that need WebRTC and VP8 or
// OpenCV (trace, trace_lean.go): here they say so.
func edgeCommands() []command {
	return []command{
		{"demo", "the live demo (WHIP clients): not in the lean build, " + fullBuild, notInLean("demo", "the live demo (WebRTC clients)")},
		{"client", "the WebRTC (WHIP) client: not in the lean build, " + fullBuild, notInLean("client", "the WebRTC (WHIP) client")},
		{"trace", "objects per frame from a detector over a video: not in the lean build, " + fullBuild, runTrace},
	}
}

// notInLean is a command of the full build that refuses to run here.
func notInLean(name, what string) func([]string, io.Writer, io.Writer) int {
	return func(_ []string, _, stderr io.Writer) int {
		fmt.Fprintf(stderr, "mdag %s: %s is not in the lean build; %s\n", name, what, fullBuild)
		return exitInvalid
	}
}
