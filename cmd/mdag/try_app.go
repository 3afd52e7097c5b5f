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

// startApp plans and starts the app on the executor, with one stream
// joined and its instances warm.
func (c *tryCmd) startApp(reg *registry.Registry, stderr io.Writer) (*tryRun, error) {
	app, prof, used, err := c.loadApp(reg, stderr)
	if err != nil {
		return nil, err
	}
	x, err := tryExecutor(used, c.executor, c.device, c.lib)
	if err != nil {
		return nil, err
	}
	obs, results, err := c.startEngine(app, prof, x, stderr)
	if err != nil {
		x.Close()
		return nil, err
	}
	var labels []string // each class's colour: by its index in its model's labels
	for _, n := range slices.Sorted(maps.Keys(used.Models)) {
		labels = append(labels, used.Models[n].Labels...)
	}
	return &tryRun{
		res:  tryResult{App: string(app.Name), SLOMillis: float64(app.SLO) / float64(time.Millisecond)},
		step: tryAppStep(app, obs, results, labels),
		close: func() {
			_ = obs.e.Leave(tryStream)
			obs.Close()
			x.Close()
		},
	}, nil
}

// loadApp reads the app and its profiles (-f/-p or --example), and used,
// the registry of its GPU modules' models alone, each of the format the
// executor runs.
func (c *tryCmd) loadApp(reg *registry.Registry, stderr io.Writer) (app *dag.App, prof *profile.File, used *registry.Registry, err error) {
	app, prof, err = c.app().load()
	if err == nil {
		err = checkAppModels(app, reg)
	}
	if err != nil {
		return nil, nil, nil, invalid(err)
	}
	if len(app.Outputs) > 0 {
		fmt.Fprintf(stderr, "mdag try: app %s's outputs (%d) are not started: try reports on stdout only\n", app.Name, len(app.Outputs))
	}
	used = &registry.Registry{File: reg.File, Models: map[string]*registry.Model{}}
	for _, m := range app.Modules {
		if m.Kind != dag.GPU {
			continue
		}
		e := reg.Models[m.Model]
		if e.Format != c.executor {
			return nil, nil, nil, invalidf("module %s's model %s is format %s: --executor %s runs format: %s entries", m.Name, e.Name, e.Format, c.executor, c.executor)
		}
		used.Models[m.Model] = e
	}
	if app.Media == dag.Audio {
		return nil, nil, nil, invalidf("app %s takes audio; try runs an app on an image's or a video's frames", app.Name)
	}
	return app, prof, used, nil
}

// startEngine starts the embedded engine on x with the app's one stream
// joined; results has that stream's frames' results.
func (c *tryCmd) startEngine(app *dag.App, prof *profile.File, x gpu.Executor, stderr io.Writer) (*observed, chan coordinator.FrameResult, error) {
	limits, err := parseLimits("", prof)
	if err != nil {
		return nil, nil, invalid(err)
	}
	if c.executor == "onnx" && c.device == "cpu" {
		limits, _ = hostLimits(limits, prof, runtime.NumCPU(), false)
	}
	// the engine's own lines only when something is wrong: stdout is the JSON
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	cfg := coordinator.Config{Policy: coordinator.DefaultPolicy, Headroom: 1.25, Warmup: true, Log: log,
		Executor: func(string, profile.WorkerTypeID) (gpu.Executor, error) { return x, nil }}
	obs, err := startObservedWith(cfg, limits, app, prof, gpu.Realistic())
	if err != nil {
		return nil, nil, invalid(err)
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
	if err := obs.e.Join(app.Name, tryStream); err != nil {
		obs.Close()
		return nil, nil, err
	}
	if err := obs.e.WaitReady(app.Name, 60*time.Second); err != nil {
		log.Warn("the app's instances are not all warm: the first frames may be late", "err", err)
	}
	return obs, results, nil
}

// tryAppStep sends frame i once the one before it has ended, no faster
// than the app's fps (a real camera's pace), and waits for its result.
func tryAppStep(app *dag.App, obs *observed, results <-chan coordinator.FrameResult, labels []string) func(i int, f *media.Frame) (tryFrame, error) {
	gap := time.Duration(float64(time.Second) / max(app.FPS, 1e-3))
	var last time.Time
	return func(i int, f *media.Frame) (tryFrame, error) {
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
				return tryAppFrame(r, labels), nil
			case <-limit:
				return tryFrame{}, fmt.Errorf("no result %v after it was sent (the SLO is %v)", app.SLO+10*time.Second, app.SLO)
			}
		}
	}
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
