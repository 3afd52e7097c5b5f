//go:build !lean

package main

import (
	"github.com/mdag/mdag/gpu"
	"github.com/mdag/mdag/gpu/opencv"
	"github.com/mdag/mdag/media"
	"github.com/mdag/mdag/modules"
	"github.com/mdag/mdag/modules/cv"
	"github.com/mdag/mdag/observe/dashboard"
)

// The full binary's edges: the OpenCV ops, scaler and thumbnail encoder,
// the OpenCV DNN executor, and (in whip.go, client.go, demo.go) WebRTC
// ingest with VP8. `make lean` builds without them (edges_lean.go).

// buildName names this binary's edges (mdag version lists them: version_full.go).
const buildName = "full"

// edgeCommands are the commands that need WebRTC and VP8 (demo, client)
// or OpenCV's video reading (trace).
func edgeCommands() []command {
	return []command{
		{"demo", "the whole system on this machine: the traffic app, WHIP clients joining and leaving, the dashboard", runDemo},
		{"client", "stream a test pattern, a video file or a camera into an app over WebRTC (WHIP); print its results", runClient},
		{"trace", "measure objects per frame: a real detector (hog, haar, motion, blazeface) over a video file, as a CSV trace", runTrace},
	}
}

// executorHelp is `mdag worker --executor`'s help.
const executorHelp = "GPU executor: emulated (profiled times, no GPU needed), onnx (registry models on ONNX Runtime, true batches; --models), " +
	"kserve (registry models on Open Inference Protocol servers over gRPC: mdag infer-server, Triton, KServe; --models) or opencv (real ONNX models, OpenCV DNN on the CPU, item by item; --model)"

// ops is the registry of the CPU ops this binary runs.
func ops() *modules.Registry {
	r := modules.Builtin()
	modules.Must(cv.Register(r))
	return r
}

// scaler downscales frames (ingest, oversize frames).
var scaler media.Scaler = cv.ResizeArea

// thumbEncoder makes the dashboard's thumbnails.
var thumbEncoder dashboard.Encoder = cv.Thumbnail

// executors lists the real GPU executors (`mdag worker --executor`).
var executors = []string{"opencv"}

// decoders lists the model output decoders of the real executors.
func decoders() []string { return opencv.Decoders() }

// newExecutor builds a real executor by name with its models.
func newExecutor(name string, models []gpu.ModelFile, instances int) (gpu.Executor, func(), error) {
	x, err := opencv.NewOpenCV(models, instances)
	if err != nil {
		return nil, nil, err
	}
	return x, x.Close, nil
}
