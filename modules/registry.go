// Package modules holds the CPU module operations that mDAG applications
// name with `op:`: the registry (each op, what it does, whether it keeps
// per-stream state, which params it accepts, so `mdag validate` rejects
// unknown ops and params) and the implementations the runtime runs, in Go
// with gocv: resize, crop (fan-out by detection), haar-face, count and sink.
// The stateful ops (track, window, sequence, activity) and segment are
// registered but not implemented yet: New says so and `mdag serve` refuses
// apps that use them. Items (frames, crops, detections) are defined here.
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
