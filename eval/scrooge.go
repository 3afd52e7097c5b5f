package eval

import (
	"fmt"
	"time"

	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/examples"
	"github.com/mdag/mdag/profile"
)

// Scrooge section 4.2's setup: the cluster, the apps compared against
// Nexus and their workloads.

// Cluster is the testbed of Scrooge section 4.1: 8 P100 and 8 V100
// instances (the examples' GPU worker types and prices), plus up to 8
// CPU-only workers (footnote 11: CPU modules are charged at the CPU-only
// worker's $0.83/h).
func Cluster() map[profile.WorkerTypeID]int {
	return map[profile.WorkerTypeID]int{"P100": 8, "V100": 8, "CPU": 8}
}

// AppSetup is one app of the comparison: its frame-rate range (Scrooge
// 4.2) and what its cameras see, from the committed traces.
type AppSetup struct {
	App            string
	MinFPS, MaxFPS int
	Objects        []ObjectTrace
	// FrontEnds are the Nexus-style system's front-end counts tried
	// (Scrooge tried 1, 3 and 6 for face, 1, 3 and 4 for tracker).
	FrontEnds []int
}

// ObjectTrace names the trace a class of object follows.
type ObjectTrace struct {
	Class, Trace string
}

// Setups are traffic, face and tracker as Scrooge 4.2 runs them: SLO
// 400 ms (the apps' own), 12 clients, traffic at 2-5 fps, face at 12-30,
// tracker at 15-40. Objects: traffic's vehicles follow the moving blobs of
// vtest.avi (MOG2) and its people the HOG people detector on the same
// video; face follows the Haar face detector on Megamind.avi; tracker's
// pedestrians the HOG detector on vtest.avi.
func Setups() []AppSetup {
	return []AppSetup{
		{App: "traffic", MinFPS: 2, MaxFPS: 5, FrontEnds: []int{1, 3, 6},
			Objects: []ObjectTrace{{"car", "vtest-motion"}, {"person", "vtest-hog"}}},
		{App: "face", MinFPS: 12, MaxFPS: 30, FrontEnds: []int{1, 3, 6},
			Objects: []ObjectTrace{{"face", "megamind-haar"}}},
		{App: "tracker", MinFPS: 15, MaxFPS: 40, FrontEnds: []int{1, 3, 4, 6},
			Objects: []ObjectTrace{{"person", "vtest-hog"}}},
	}
}

// Setup returns the setup of app.
func Setup(app string) (AppSetup, error) {
	for _, s := range Setups() {
		if s.App == app {
			return s, nil
		}
	}
	return AppSetup{}, fmt.Errorf("eval: no setup for app %q (have traffic, face, tracker)", app)
}

// Load parses the setup's example app and profiles and draws its
// workload: clients over d, with seed.
func (a AppSetup) Load(d time.Duration, clients int, seed uint64) (*dag.App, *profile.File, Workload, error) {
	app, pf, err := examples.Parse(a.App)
	if err != nil {
		return nil, nil, Workload{}, err
	}
	spec := Spec{Duration: d, Clients: clients, MinFPS: a.MinFPS, MaxFPS: a.MaxFPS}
	for _, o := range a.Objects {
		t, err := LoadTrace(o.Trace)
		if err != nil {
			return nil, nil, Workload{}, err
		}
		spec.Objects = append(spec.Objects, Objects{Class: o.Class, Trace: t})
	}
	return app, pf, Draw(spec, seed), nil
}
