// Package gpu holds the executors that run GPU module batches and the GPU
// telemetry. An Executor runs one batch of items through one model and
// returns each item's outputs; when and where a batch runs is decided by the
// central scheduler and enforced by the worker's device loop, not here.
//
// Executors:
//   - Emulated completes a batch after its profiled latency l(b) (times a
//     slowdown factor that tests raise to inject ballooning, and times the
//     draws of a Variance model: jitter, stalls, cold starts, contention;
//     none by default), on an injected clock, and echoes the ground truth a
//     synthetic source drew: items that are whole frames get the frame's
//     objects as detections, crops get their object's class as a label. It
//     is deterministic given its seed, runs without a GPU and lets one
//     machine emulate many GPUs (the papers evaluate at scale so).
//   - gpu/opencv runs real ONNX models through OpenCV's DNN module (gocv);
//     it is an edge package the full binary links.
//
// This package is pure Go (media and clock only), so the planners, the
// worker and the lean binary use it without OpenCV or NVML. GPU telemetry
// (NVML) is in gpu/nvml.
package gpu

import (
	"context"
	"fmt"
	"maps"
	"math"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/media"
	"google.golang.org/protobuf/encoding/protowire"
)

// Executor runs batches of one or more models.
type Executor interface {
	// Run executes items as one batch of model and returns one output list
	// per input item. It returns early with ctx's error when ctx ends.
	Run(ctx context.Context, model string, items []*media.Item) ([][]*media.Item, error)
	// Kind names the executor ("emulated", "opencv").
	Kind() string
}

// Phased is implemented by executors that time the parts of a batch
// (packing the input, the call, reading the outputs): where a batch's
// time goes, which `mdag profile` reports per point.
type Phased interface {
	// Phases is model's cumulative time per part since it was loaded, in
	// the order the parts run; nil for a model not loaded.
	Phases(model string) []Phase
}

// Phase is one part of a batch: its total time over Batches batches.
type Phase struct {
	Name    string
	Total   time.Duration
	Batches int64
}

// LatencyFunc is l(b) for a model, from its profile.
type LatencyFunc func(model string, batch int) (time.Duration, bool)

// Emulated is the emulated executor.
type Emulated struct {
	Clock   clock.Clock
	Latency LatencyFunc
	slow    atomic.Uint64 // math.Float64bits of the slowdown factor; 0 = 1
	vary    *variance     // nil: exact
}

// EmulatedOption is an optional setting of NewEmulated.
type EmulatedOption func(*emulatedOptions)

type emulatedOptions struct {
	v    Variance
	host *Host
}

// WithVariance makes every batch's time vary by v (default: exact).
func WithVariance(v Variance) EmulatedOption { return func(o *emulatedOptions) { o.v = v } }

// WithHost counts the executor's batches on h for Variance.Contention, so
// the executors that share h slow each other (default: a host of its own).
func WithHost(h *Host) EmulatedOption { return func(o *emulatedOptions) { o.host = h } }

// NewEmulated returns an emulated executor on clk with profile latencies.
func NewEmulated(clk clock.Clock, l LatencyFunc, opts ...EmulatedOption) *Emulated {
	var o emulatedOptions
	for _, f := range opts {
		f(&o)
	}
	e := &Emulated{Clock: clk, Latency: l}
	if !o.v.IsExact() {
		e.vary = newVariance(o.v, o.host)
	}
	return e
}

// Variance is the executor's variance model (exact: the zero Variance).
func (e *Emulated) Variance() Variance {
	if e.vary == nil {
		return Variance{}
	}
	return e.vary.v
}

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
func (e *Emulated) Run(ctx context.Context, model string, items []*media.Item) ([][]*media.Item, error) {
	l, ok := e.Latency(model, len(items))
	if !ok {
		return nil, fmt.Errorf("emulated: no profile for model %q at batch %d", model, len(items))
	}
	f := e.Slowdown()
	if e.vary != nil {
		f *= e.vary.start(model, len(items), e.Clock.Now())
		defer func() { e.vary.end(e.Clock.Now()) }()
	}
	d := time.Duration(float64(l) * f)
	done := make(chan struct{})
	t := e.Clock.AfterFunc(d, func() { close(done) })
	select {
	case <-done:
	case <-ctx.Done():
		t.Stop()
		return nil, ctx.Err()
	}
	return EmulatedOutputs(items), nil
}

// EmulatedOutputs is what an emulated model answers for a batch: a crop
// (an item with a Region) is labelled with its region's class, a frame
// gets its ground-truth boxes (Item.Truth) as detections. One output per
// item.
func EmulatedOutputs(items []*media.Item) [][]*media.Item {
	out := make([][]*media.Item, len(items))
	for i, it := range items {
		o := *it
		if it.Region != nil {
			o.Labels = []string{it.Region.Class}
		} else {
			o.Boxes = append([]media.Box(nil), it.Truth...)
		}
		out[i] = []*media.Item{&o}
	}
	return out
}

// ModelFile names a real model an OpenCV executor loads: the model name
// GPU modules use (`model:` in the app YAML), the decoder that turns its
// output tensors into detections, and the ONNX file.
type ModelFile struct {
	Name    string
	Decoder string // "blazeface" (MediaPipe BlazeFace, front camera, 128x128)
	Path    string
}

// ParseModelFile reads NAME=DECODER:PATH (the `mdag worker --model` flag).
func ParseModelFile(s string) (ModelFile, error) {
	name, rest, ok1 := strings.Cut(s, "=")
	dec, path, ok2 := strings.Cut(rest, ":")
	if !ok1 || !ok2 || name == "" || dec == "" || path == "" {
		return ModelFile{}, fmt.Errorf("%q: want NAME=DECODER:PATH, e.g. face-detector=blazeface:models/blazeface-front-128.onnx", s)
	}
	return ModelFile{Name: name, Decoder: dec, Path: path}, nil
}

// CheckONNX reads the file's top level as an ONNX ModelProto (a protobuf
// whose field 7 is the graph) before a runtime sees it: OpenCV's importer
// throws on anything else, which aborts the process.
func CheckONNX(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	graph := false
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return fmt.Errorf("%s is not an ONNX model OpenCV can read: %w", path, protowire.ParseError(n))
		}
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		if m < 0 {
			return fmt.Errorf("%s is not an ONNX model OpenCV can read: field %d: %w", path, num, protowire.ParseError(m))
		}
		graph = graph || (num == 7 && typ == protowire.BytesType)
		b = b[n+m:]
	}
	if !graph {
		return fmt.Errorf("%s is not an ONNX model OpenCV can read: no graph", path)
	}
	return nil
}

// Router sends each model to the executor named for it, and every other
// model to Default: a worker that runs its real models on ONNX Runtime or
// a KServe endpoint and emulates the rest (`mdag worker --emulate MODEL`:
// the GPU check's detector, whose synthetic ground truth gives the
// classifier behind it real crops to batch).
type Router struct {
	By      map[string]Executor
	Default Executor
}

// Run implements Executor.
func (r *Router) Run(ctx context.Context, model string, items []*media.Item) ([][]*media.Item, error) {
	if x, ok := r.By[model]; ok {
		return x.Run(ctx, model, items)
	}
	if r.Default == nil {
		return nil, fmt.Errorf("no executor runs model %q here", model)
	}
	return r.Default.Run(ctx, model, items)
}

// Kind implements Executor: the default's kind, with the routed ones'
// ("kserve+emulated").
func (r *Router) Kind() string {
	kinds := []string{}
	if r.Default != nil {
		kinds = append(kinds, r.Default.Kind())
	}
	for _, m := range slices.Sorted(maps.Keys(r.By)) {
		if k := r.By[m].Kind(); !slices.Contains(kinds, k) {
			kinds = append(kinds, k)
		}
	}
	return strings.Join(kinds, "+")
}
