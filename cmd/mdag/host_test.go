package main

import (
	"maps"
	"strings"
	"testing"

	"github.com/mdag/mdag/profile"
)

// TestHostLimits: in-process instances of a worker type whose executor
// runs on the host's CPU are bounded by the host's cores; a limit the user
// set above that is kept and said to be over-committed.
func TestHostLimits(t *testing.T) {
	pf := &profile.File{Workers: []profile.WorkerType{
		{Type: "ORT-CPU", GPUs: 1, CPUs: 2},
		{Type: "BIG", GPUs: 1, CPUs: 8},
		{Type: "CPU", CPUs: 2},
	}}
	for _, c := range []struct {
		name     string
		limits   map[profile.WorkerTypeID]int
		cores    int
		explicit bool
		want     map[profile.WorkerTypeID]int
		notes    []string
	}{
		{"default on 2 cores", map[profile.WorkerTypeID]int{"ORT-CPU": 8, "BIG": 8, "CPU": 8}, 2, false,
			map[profile.WorkerTypeID]int{"ORT-CPU": 1, "BIG": 1, "CPU": 8}, []string{"BIG: at most 1", "ORT-CPU: at most 1"}},
		{"default on 16 cores", map[profile.WorkerTypeID]int{"ORT-CPU": 8, "CPU": 8}, 16, false,
			map[profile.WorkerTypeID]int{"ORT-CPU": 8, "CPU": 8}, nil},
		{"explicit over the host", map[profile.WorkerTypeID]int{"ORT-CPU": 4}, 2, true,
			map[profile.WorkerTypeID]int{"ORT-CPU": 4}, []string{"over-committed: --workers allows 4 ORT-CPU instances"}},
		{"explicit within the host", map[profile.WorkerTypeID]int{"ORT-CPU": 2}, 4, true,
			map[profile.WorkerTypeID]int{"ORT-CPU": 2}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, notes := hostLimits(c.limits, pf, c.cores, c.explicit)
			if !maps.Equal(got, c.want) {
				t.Errorf("limits %v, want %v", got, c.want)
			}
			if len(notes) != len(c.notes) {
				t.Fatalf("notes %q, want %d like %q", notes, len(c.notes), c.notes)
			}
			for i, n := range c.notes {
				if !strings.Contains(notes[i], n) {
					t.Errorf("note %d %q, want it to contain %q", i, notes[i], n)
				}
			}
		})
	}
}
