package eval

import (
	"testing"
	"time"
)

// BenchmarkRun1000s is one 1000 s experiment of the comparison (issue 24's
// bound: <= 60 s on 2 cores), the heaviest of the three apps' mdag runs
// (tracker: 12 clients at 15-40 fps, re-identification per person) and
// its Nexus-style run.
func BenchmarkRun1000s(b *testing.B) {
	setup, err := Setup("tracker")
	if err != nil {
		b.Fatal(err)
	}
	app, pf, w, err := setup.Load(1000*time.Second, 12, 1)
	if err != nil {
		b.Fatal(err)
	}
	for _, sys := range []System{{Name: "mdag"}, {Name: "nexus-P100-1f", Nexus: true, FrontEnds: 1, NexusGPU: "P100"}} {
		b.Run(sys.Name, func(b *testing.B) {
			var frames uint64
			for b.Loop() {
				r, err := Run(Experiment{App: app, Profiles: pf, System: sys, Workload: w, Cluster: Cluster(), Seed: 1})
				if err != nil {
					b.Fatal(err)
				}
				frames = r.Sent
			}
			b.ReportMetric(float64(frames), "frames/run")
		})
	}
}
