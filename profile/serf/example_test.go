package serf_test

import (
	"fmt"
	"time"

	"github.com/mdag/mdag/profile/serf"
)

// From profiled rates to the reference table and the points of a CPU
// worker type's profile.
func Example() {
	// mu_i (requests/s each, with i running at once) at 1, 2 and 4
	// intra-op threads on a 4-core worker.
	cfgs, err := serf.Configs([]serf.Rates{
		{Threads: 1, Mu: []float64{10, 9.8, 9.6, 9.4}},
		{Threads: 2, Mu: []float64{18, 17}},
		{Threads: 4, Mu: []float64{24}},
	}, 4)
	if err != nil {
		panic(err)
	}
	p, _ := cfgs[0].Predict(5)
	fmt.Printf("%s at 5/s: wait %.1f ms + service %.1f ms = %.1f ms (rho %.2f)\n",
		cfgs[0], 1e3*p.Wait, 1e3*p.Service, 1e3*p.Latency, p.Rho)

	loads, _ := serf.EvenLoads(4, 36)
	tab, err := serf.NewTable(cfgs, loads)
	if err != nil {
		panic(err)
	}
	for _, row := range tab.Rows {
		fmt.Printf("load %4.1f/s: best %s, %.1f ms\n", row.Lambda, tab.Configs[row.Best], 1e3*row.Latency)
	}

	ops, err := serf.OperatingPoints(cfgs, 150*time.Millisecond, 0.85)
	if err != nil {
		panic(err)
	}
	for _, op := range ops {
		fmt.Printf("c=%d: t=%d at %.2f/s -> {batch: %d, concurrency: %d, latency: %v, throughput: %.2f}\n",
			op.Config.C, op.Config.T, op.Lambda, op.Point.Batch, op.Point.Concurrency,
			op.Point.Latency.Round(time.Microsecond), op.Point.Throughput)
	}
	// Output:
	// c=1,t=1 at 5/s: wait 50.0 ms + service 100.0 ms = 150.0 ms (rho 0.50)
	// load  9.0/s: best c=1,t=4, 54.2 ms
	// load 18.0/s: best c=2,t=2, 69.6 ms
	// load 27.0/s: best c=2,t=2, 109.0 ms
	// load 36.0/s: best c=4,t=1, 390.8 ms
	// c=1: t=4 at 20.13/s -> {batch: 1, concurrency: 1, latency: 150ms, throughput: 20.13}
	// c=2: t=2 at 28.90/s -> {batch: 1, concurrency: 2, latency: 135.489ms, throughput: 28.90}
	// c=3: t=1 at 22.20/s -> {batch: 1, concurrency: 3, latency: 150ms, throughput: 22.20}
	// c=4: t=1 at 30.52/s -> {batch: 1, concurrency: 4, latency: 150ms, throughput: 30.52}
}
