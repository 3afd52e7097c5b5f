package main

import (
	"fmt"
	"io"
	"log/slog"
	"maps"
	"runtime"
	"slices"
	"time"

	"github.com/mdag/mdag/coordinator"
	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/gpu"
	"github.com/mdag/mdag/gpu/registry"
	"github.com/mdag/mdag/media"
	"github.com/mdag/mdag/profile"
)

// `mdag try -f app.yaml -p profiles.yaml --models models.yaml FILE` runs a
// whole app on the file's frames: the embedded engine serve runs (planner,
// GPU scheduler, in-process workers on the real executor), one stream,
// the frames sent one at a time, each once the one before it has ended
// (and no faster than the app's fps), so each has the whole SLO. Each
// frame's result is what the app's sinks hand a client (the DataChannel
// and SSE): boxes, labels, counts, events, and its outcome.

// tryStream is the stream try's frames come in on.
const tryStream = "try"

type tryAppArgs struct {
	file, profiles, example string
	reg                     *registry.Registry
	executor, device, lib   string
}

// startTryApp plans and starts the app on the executor, with one stream
// joined and its instances warm.
func startTryApp(a tryAppArgs, stderr io.Writer) (*tryRun, int) {
	app, prof, err := serveInputs("try", a.file, a.profiles, a.example)
	if err == nil {
		err = checkAppModels(app, a.reg)
	}
	if err != nil {
		printErrors(stderr, err)
		return nil, exitInvalid
	}
	if len(app.Outputs) > 0 {
		fmt.Fprintf(stderr, "mdag try: app %s's outputs (%d) are not started: try reports on stdout only\n", app.Name, len(app.Outputs))
	}
	// only the app's models are loaded
	used := &registry.Registry{File: a.reg.File, Models: map[string]*registry.Model{}}
	for _, m := range app.Modules {
		if m.Kind == dag.GPU {
			e := a.reg.Models[m.Model]
			if e.Format != a.executor {
				fmt.Fprintf(stderr, "mdag try: module %s's model %s is format %s: --executor %s runs format: %s entries\n", m.Name, e.Name, e.Format, a.executor, a.executor)
				return nil, exitInvalid
			}
			used.Models[m.Model] = e
		}
	}
	if app.Media == dag.Audio {
		fmt.Fprintf(stderr, "mdag try: app %s takes audio; try runs an app on an image's or a video's frames\n", app.Name)
		return nil, exitInvalid
	}
	x, err := tryExecutor(used, a.executor, a.device, a.lib)
	if err != nil {
		fmt.Fprintf(stderr, "mdag try: %v\n", err)
		return nil, exitFailure
	}
	limits, err := parseLimits("", prof)
	if err != nil {
		x.Close()
		fmt.Fprintf(stderr, "mdag try: %v\n", err)
		return nil, exitInvalid
	}
	if a.executor == "onnx" && a.device == "cpu" {
		limits, _ = hostLimits(limits, prof, runtime.NumCPU(), false)
	}
	// the engine's own lines only when something is wrong: stdout is the JSON
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	cfg := coordinator.Config{Policy: coordinator.DefaultPolicy, Headroom: 1.25, Warmup: true, Log: log,
		Executor: func(string, profile.WorkerTypeID) (gpu.Executor, error) { return x, nil }}
	obs, err := startObservedWith(cfg, limits, app, prof, gpu.Realistic())
	if err != nil {
		x.Close()
		printErrors(stderr, err)
		return nil, exitInvalid
	}
	results := make(chan coordinator.FrameResult, 16)
	publish := func(r coordinator.FrameResult) {
		if r.Stream == tryStream {
			select {
			case results <- r:
			default: // a result no frame waits for (one that timed out)
			}
		}
	}
	obs.results.publish.Store(&publish)
	closeAll := func() {
		obs.Close()
		x.Close()
	}
	if err := obs.e.Join(app.Name, tryStream); err != nil {
		closeAll()
		fmt.Fprintf(stderr, "mdag try: %v\n", err)
		return nil, exitFailure
	}
	if err := obs.e.WaitReady(app.Name, 60*time.Second); err != nil {
		log.Warn("the app's instances are not all warm: the first frames may be late", "err", err)
	}
	var all []string // each class's colour: by its index in its model's labels
	for _, n := range slices.Sorted(maps.Keys(used.Models)) {
		all = append(all, used.Models[n].Labels...)
	}
	gap := time.Duration(float64(time.Second) / max(app.FPS, 1e-3))
	var last time.Time
	step := func(i int, f *media.Frame) (tryFrame, error) {
		if wait := time.Until(last.Add(gap)); wait > 0 {
			time.Sleep(wait) // the app's frame rate: a real camera's pace, not logic waiting
		}
		last = time.Now()
		if err := obs.ingest(tryStream, uint64(i), last, f, nil); err != nil {
			return tryFrame{}, err
		}
		limit := time.After(app.SLO + 10*time.Second)
		for {
			select {
			case r := <-results:
				if r.Seq != uint64(i) {
					continue // an earlier frame's late end
				}
				return tryAppFrame(r, all), nil
			case <-limit:
				return tryFrame{}, fmt.Errorf("no result %v after it was sent (the SLO is %v)", app.SLO+10*time.Second, app.SLO)
			}
		}
	}
	return &tryRun{
		res:  tryResult{App: string(app.Name), SLOMillis: float64(app.SLO) / float64(time.Millisecond)},
		step: step,
		close: func() {
			_ = obs.e.Leave(tryStream)
			closeAll()
		},
	}, exitOK
}

// tryAppFrame is one app frame's result as try's JSON has it.
func tryAppFrame(r coordinator.FrameResult, labels []string) tryFrame {
	tf := tryFrame{Boxes: tryBoxes(r.Boxes, labels), Labels: r.Labels, Outcome: string(r.Outcome),
		LatencyMS: float64(r.Latency) / float64(time.Millisecond), Module: string(r.Module), Reason: string(r.Reason), Counts: r.Counts}
	if tf.Boxes == nil {
		tf.Boxes = []tryBox{}
	}
	if tf.Labels == nil {
		tf.Labels = []string{}
	}
	for _, e := range r.Events {
		tf.Events = append(tf.Events, tryEvent{Kind: e.Kind, Rule: e.Rule, Track: e.Track, Detail: e.Detail})
	}
	return tf
}
