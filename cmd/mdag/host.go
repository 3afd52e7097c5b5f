package main

import (
	"fmt"
	"maps"
	"slices"

	"github.com/mdag/mdag/profile"
)

// hostLimits bounds the in-process instances of an embedded service whose
// "GPU" worker types run on this host's CPU (the onnx executor on the CPU
// device): each such instance is planned as its own worker type's CPUs,
// but they all share the host's cores, so the planner may buy only as
// many as the host can run (cores / the type's CPUs, at least 1). A limit
// the user set explicitly above that is kept and reported as an
// over-commit. It returns the limits to plan with and one line per type it
// bounded or found over-committed, for the log and the startup note.
func hostLimits(limits map[profile.WorkerTypeID]int, pf *profile.File, cores int, explicit bool) (map[profile.WorkerTypeID]int, []string) {
	out := make(map[profile.WorkerTypeID]int, len(limits))
	var notes []string
	for _, t := range slices.Sorted(maps.Keys(limits)) {
		n := limits[t]
		out[t] = n
		w, ok := pf.Worker(t)
		if !ok || w.GPUs == 0 {
			continue // CPU worker types: the ops' pools, bounded by their own planning
		}
		fit := max(1, cores/max(1, w.CPUs))
		switch {
		case n <= fit:
		case explicit:
			notes = append(notes, fmt.Sprintf("over-committed: --workers allows %d %s instances of %d CPUs each; this host has %d cores, so they share them and run slower than profiled", n, t, max(1, w.CPUs), cores))
		default:
			out[t] = fit
			notes = append(notes, fmt.Sprintf("%s: at most %d in-process instances (%d CPUs each on a host of %d cores; the executor runs on this host's CPU)", t, fit, max(1, w.CPUs), cores))
		}
	}
	return out, notes
}
