// Package gpu holds the executors that run GPU module batches and the GPU
// telemetry. An Executor runs one batch of items through one model and
// returns each item's outputs; when and where a batch runs is decided by the
// central scheduler and enforced by the worker's device loop, not here.
//
// Executors:
//   - Emulated completes a batch after its profiled latency l(b) (times a
//     slowdown factor that tests raise to inject ballooning), on an injected
//     clock, and echoes the ground truth a synthetic source drew: items that
//     are whole frames get the frame's objects as detections, crops get their
//     object's class as a label. It is deterministic, runs without a GPU and
//     lets one machine emulate many GPUs (the papers evaluate at scale so).
//   - OpenCV runs real ONNX models through OpenCV's DNN module (gocv) on the
//     CPU target, batch by item (OpenCV 4.6), with decoders that turn output
//     tensors into detections (BlazeFace so far); see opencv.go.
//
// Telemetry reads NVIDIA GPUs through NVML (go-nvml) and reports a clean
// no-driver state where there is none.
package gpu

import (
	"context"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/modules"
)

// Executor runs batches of one or more models.
type Executor interface {
	// Run executes items as one batch of model and returns one output list
	// per input item. It returns early with ctx's error when ctx ends.
	Run(ctx context.Context, model string, items []*modules.Item) ([][]*modules.Item, error)
	// Kind names the executor ("emulated", "opencv").
	Kind() string
}

// LatencyFunc is l(b) for a model, from its profile.
type LatencyFunc func(model string, batch int) (time.Duration, bool)

// Emulated is the emulated executor.
type Emulated struct {
	Clock   clock.Clock
	Latency LatencyFunc
	slow    atomic.Uint64 // math.Float64bits of the slowdown factor; 0 = 1
}

// NewEmulated returns an emulated executor on clk with profile latencies.
func NewEmulated(clk clock.Clock, l LatencyFunc) *Emulated { return &Emulated{Clock: clk, Latency: l} }

// Kind implements Executor.
func (e *Emulated) Kind() string { return "emulated" }

// SetSlowdown multiplies every later batch's time by f (>= 0.01): the
// ballooning knob of the tests and of `mdag worker --slowdown`.
func (e *Emulated) SetSlowdown(f float64) { e.slow.Store(math.Float64bits(max(0.01, f))) }

// Slowdown is the current factor.
func (e *Emulated) Slowdown() float64 {
	if b := e.slow.Load(); b != 0 {
		return math.Float64frombits(b)
	}
	return 1
}

// Run implements Executor.
func (e *Emulated) Run(ctx context.Context, model string, items []*modules.Item) ([][]*modules.Item, error) {
	l, ok := e.Latency(model, len(items))
	if !ok {
		return nil, fmt.Errorf("emulated: no profile for model %q at batch %d", model, len(items))
	}
	d := time.Duration(float64(l) * e.Slowdown())
	done := make(chan struct{})
	t := e.Clock.AfterFunc(d, func() { close(done) })
	select {
	case <-done:
	case <-ctx.Done():
		t.Stop()
		return nil, ctx.Err()
	}
	out := make([][]*modules.Item, len(items))
	for i, it := range items {
		o := *it
		if it.Region != nil {
			o.Labels = []string{it.Region.Class}
		} else {
			o.Boxes = append([]modules.Box(nil), it.Truth...)
		}
		out[i] = []*modules.Item{&o}
	}
	return out, nil
}
