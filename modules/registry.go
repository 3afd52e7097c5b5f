// Package modules holds the registry of CPU module operations that mDAG
// applications name with `op:`, and (in later work) their implementations in
// Go with gocv and the adapters around GPU modules.
//
// At this stage the registry is a catalogue: it names each op, says what it
// does, whether it keeps per-stream state and which params it accepts, so that
// `mdag validate` can reject unknown ops and params. The ops' implementations
// arrive with the runtime (issue 6); until then nothing here executes frames.
package modules

import (
	"slices"
	"sort"
)

// OpID names a CPU operation in the registry.
type OpID string

// Op describes one CPU operation.
type Op struct {
	Name     OpID
	Summary  string
	Stateful bool     // keeps per-stream state across frames (a tracker, a window)
	Params   []string // accepted keys under `params:`
}

var registry = []Op{
	{Name: "resize", Summary: "scale a frame to width x height", Params: []string{"width", "height"}},
	{Name: "crop", Summary: "cut one item per detection box out of the frame (fan-out)", Params: []string{"pad", "classes", "min_score"}},
	{Name: "haar-face", Summary: "detect faces with an OpenCV Haar cascade", Params: []string{"cascade", "scale_factor", "min_neighbors"}},
	{Name: "count", Summary: "count items per frame by class", Params: []string{"classes"}},
	{Name: "track", Summary: "associate detections across frames into tracks", Stateful: true, Params: []string{"max_age", "iou"}},
	{Name: "window", Summary: "keep the last N items of a stream and emit them together", Stateful: true, Params: []string{"size"}},
	{Name: "sequence", Summary: "restore frame order and keep per-stream context", Stateful: true, Params: []string{"max_gap"}},
	{Name: "activity", Summary: "match tracks and identities against activity rules", Stateful: true, Params: []string{"rules"}},
	{Name: "segment", Summary: "cut an audio stream into fixed-length chunks", Params: []string{"chunk"}},
	{Name: "sink", Summary: "deliver results to the client"},
}

// Lookup returns the op with the given name.
func Lookup(name OpID) (Op, bool) {
	i := slices.IndexFunc(registry, func(o Op) bool { return o.Name == name })
	if i < 0 {
		return Op{}, false
	}
	return registry[i], true
}

// Names lists every registered op, sorted.
func Names() []string {
	out := make([]string, len(registry))
	for i, o := range registry {
		out[i] = string(o.Name)
	}
	sort.Strings(out)
	return out
}

// Ops returns a copy of the registry, sorted by name.
func Ops() []Op {
	out := slices.Clone(registry)
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}
