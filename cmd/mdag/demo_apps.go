//go:build !lean

package main

import (
	"fmt"
	"sort"
	"strings"

	"github.com/mdag/mdag/coordinator"
	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/examples"
	"github.com/mdag/mdag/gpu"
	"github.com/mdag/mdag/gpu/onnx"
	"github.com/mdag/mdag/gpu/registry"
	"github.com/mdag/mdag/profile"
)

// The apps mdag demo runs (--app): on emulated GPUs or on their real
// models, with the video their clients stream, the clients' schedule and
// what the demo says about them.

// vtest is the sample video Debian's opencv-doc installs (people walking).
const vtest = "/usr/share/doc/opencv-doc/examples/data/vtest.avi"

// megamindVideo is the other sample video of opencv-doc (a face looking
// at the camera most of the time): face-live's source.
const megamindVideo = "/usr/share/doc/opencv-doc/examples/data/Megamind.avi"

// demoSchedule is how many WHIP clients stream at each step: they join and
// leave, and every change re-plans.
var demoSchedule = []int{3, 5, 4, 6, 3}

// faceLiveSchedule is face-live's: every client's frames go through one
// ONNX Runtime worker on this machine's CPU.
var faceLiveSchedule = []int{1, 2, 3, 2}

// realDemo is an example the demo runs on its real models (ONNX Runtime
// on this machine's CPU): its registry, its video, the clients' schedule
// and what to say.
type realDemo struct {
	models   string // the default --models
	video    string
	schedule []int
	intro    string // gets the SLO, the fps and the executor
	look     string
}

// realDemos are face-live (BlazeFace) and text-reader (PP-OCRv4).
var realDemos = map[string]realDemo{
	"face-live": {models: "examples/models.yaml", video: megamindVideo, schedule: faceLiveSchedule,
		intro: `the face-live app (detect -> faces / boxes, SLO %v at %g fps per camera): BlazeFace with its
  real weights on %s,
  batched across the streams, then CPU ops counting the faces and returning the boxes, in this one process.
  The boxes come back to each client on its DataChannel; the stream page draws them over the video and
  the dashboard draws the latest ones on each stream's thumbnail.`,
		look: `detect's batch size grows with the streams
    (one model call for the frames of every stream that are waiting); its latency is ONNX Runtime's, measured`},
	"text-reader": {models: "examples/text-reader/models.yaml", video: "build/textclip/text-clip.avi", schedule: []int{1, 2, 1},
		intro: `the text-reader app (detect text -> lines -> read -> texts, SLO %v at %g fps per camera): PaddleOCR's
  PP-OCRv4 detector and recogniser with their real weights on %s;
  each line read is a box classed by its string, back to each client on its DataChannel: the stream page
  draws the strings over the video (the clip make models renders: signs of known text over vtest.avi).`,
		look: `read's batches gather the text lines of every stream
    (one recogniser call for the lines waiting); its latency is ONNX Runtime's, measured`},
}

// demoApp is what the demo runs: the app, its worker limits, the executor
// (nil: emulated), the default video, the client schedule and the intro.
type demoApp struct {
	app      *dag.App
	prof     *profile.File
	limits   map[profile.WorkerTypeID]int
	exec     coordinator.ExecutorFactory
	close    func()
	video    string
	schedule []int
	intro    string
	look     string // the dashboard's module rates, in words
}

// emulatedDemo is how the demo runs an example app on emulated GPUs: the
// worker limits (a few of each GPU type, so the allocator's mix changes
// with the load), the video the clients stream, their schedule, and what
// to say: the pipeline (intro, which gets the SLO and fps) and what to
// look at on the dashboard.
type emulatedDemo struct {
	limits   map[profile.WorkerTypeID]int
	video    string
	schedule []int
	pipeline string
	look     string
}

// motionLook is what the emulated detector does with the demo's video.
const motionLook = `the emulated detector reports the moving
    regions of the video (background subtraction; tall ones are people)`

// emulatedDemos are the example apps the demo runs on emulated GPUs, by
// --app. The people apps stream vtest.avi (people walking); caption, whose
// S2VT takes about a second per frame at batch 1 on a GPU of its own, the
// pattern, at most two streams. The audio app is not here: its clients
// send audio, the demo's send video.
var emulatedDemos = map[string]emulatedDemo{
	"traffic": {map[profile.WorkerTypeID]int{"P100": 2, "V100": 4, "CPU": 2}, vtest, demoSchedule,
		`detect -> crop -> classify / face -> count`,
		motionLook + `; as people walk in and out the
    crop and face rates change, and 'scaling' re-plans resize the downstream modules`},
	"face": {map[profile.WorkerTypeID]int{"P100": 2, "V100": 2, "CPU": 2}, vtest, []int{2, 4, 3, 4, 2},
		`detect -> crop -> PRNet keypoints per face`,
		motionLook + `; each region is cropped and
    its keypoints extracted, so the keypoints rate follows the people in view`},
	"tracker": {map[profile.WorkerTypeID]int{"P100": 2, "V100": 2, "CPU": 2}, vtest, []int{2, 4, 3, 4, 2},
		`detect -> crop people -> re-identification -> track (stateful: each stream's tracks live on one instance)`,
		motionLook + `; track keeps each stream's
    tracks (its state on the dashboard: streams held, moves); each result carries the tracked boxes`},
	"pose": {map[profile.WorkerTypeID]int{"P100": 2, "V100": 2, "CPU": 2}, vtest, demoSchedule,
		`OpenPose keypoints -> window of each stream's last 8 poses (stateful) -> action recogniser`,
		`window turns each frame into one item
    carrying the stream's last 8 poses; its state line says how many streams it holds`},
	"caption": {map[profile.WorkerTypeID]int{"P100": 12, "V100": 4, "CPU": 2}, "pattern", []int{1, 2, 1},
		`AlexNet features -> sequence (stateful: frame order and context per stream) -> S2VT captions`,
		`S2VT takes about a second per frame at batch 1,
    so each stream needs several GPUs: watch the instances chart grow with the second stream`},
	"actdet": {map[profile.WorkerTypeID]int{"P100": 2, "V100": 2, "CPU": 2}, vtest, demoSchedule,
		`detect -> crop people -> track (stateful) and re-identification -> activity rules (stateful; a fork-join)`,
		motionLook + `; activity fires the rules of
    examples/actdet/app.yaml (people crossing x = 160, staying 2 s at the left edge): each result's labels
    name the events of its frame`},
}

// demoWarm are the demos kept warm for more than their schedule's fewest
// clients. caption: S2VT's first batch on a new instance takes ~3.4 s
// (cold), more than the whole 2.5 s SLO, so the second client's join cost
// the first ~3 frames while five more P100s warmed up (98.6%); with two
// clients' worth warm it joins onto warm GPUs (99.6%, at 1.4x the mean
// cost).
var demoWarm = map[string]int{"caption": 2}

// demoAppNames are the apps --app takes: the emulated ones, sorted, then
// the real ones.
func demoAppNames() []string {
	names := make([]string, 0, len(emulatedDemos)+len(realDemos))
	for n := range emulatedDemos {
		names = append(names, n)
	}
	sort.Strings(names)
	return append(names, "face-live", "text-reader")
}

// loadDemoApp prepares --app: an example on emulated GPUs (emulatedDemos),
// or face-live with BlazeFace on the onnx executor (the registry models, 1
// intra-op thread, 2 sessions).
func loadDemoApp(name, models string) (*demoApp, error) {
	ed, emulated := emulatedDemos[name]
	rd, real := realDemos[name]
	if !emulated && !real {
		return nil, fmt.Errorf("--app %q: want one of %s", name, strings.Join(demoAppNames(), ", "))
	}
	app, prof, err := examples.Parse(name)
	if err != nil {
		return nil, err
	}
	d := &demoApp{app: app, prof: prof, close: func() {}}
	if emulated {
		d.limits, d.video, d.schedule, d.look = ed.limits, ed.video, ed.schedule, ed.look
		var gpus []string
		for _, w := range prof.Workers {
			if n := ed.limits[w.Type]; n > 0 && w.Type != "CPU" {
				gpus = append(gpus, fmt.Sprintf("%d %ss", n, w.Type))
			}
		}
		sort.Strings(gpus)
		d.intro = fmt.Sprintf(`the %s app (%s; SLO %v at %g fps per camera)
  on emulated GPU workers (at most %s: the allocator picks the cheapest mix for the streams of the moment) and
  the real CPU ops, in this one process.`, name, ed.pipeline, app.SLO, app.FPS, strings.Join(gpus, " and "))
		return d, nil
	}
	if models == "" {
		models = rd.models
	}
	reg, err := registry.Load(models)
	if err != nil {
		return nil, fmt.Errorf("%w (make models builds the model files)", err)
	}
	if err := checkAppModels(app, reg); err != nil {
		return nil, err
	}
	// load only the app's models (the registry has larger ones)
	keep := map[string]*registry.Model{}
	for _, m := range app.Modules {
		if m.Kind == dag.GPU {
			keep[m.Model] = reg.Models[m.Model]
		}
	}
	reg.Models = keep
	x, err := onnx.New(reg, onnx.Config{IntraThreads: 1, Sessions: 2})
	if err != nil {
		return nil, fmt.Errorf("%w (make models builds the model files)", err)
	}
	d.exec = func(string, profile.WorkerTypeID) (gpu.Executor, error) { return x, nil }
	d.close = x.Close
	d.limits = map[profile.WorkerTypeID]int{"ORT-CPU": 1}
	d.video, d.schedule = rd.video, rd.schedule
	d.intro = fmt.Sprintf(rd.intro, app.SLO, app.FPS, x.Describe())
	d.look = rd.look
	return d, nil
}
