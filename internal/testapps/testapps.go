// Package testapps builds the synthetic apps that tests and benchmarks
// run (not user examples: those are in examples/). It imports only dag
// and profile, so the coordinator's own tests can use it as well as its
// users' (remote, cmd/mdag).
package testapps

import (
	"fmt"
	"strings"

	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/profile"
)

// NoopChain is the app "chain": source -> m0 -> ... -> m(n-1), every module
// a no-op (the sink op) on worker type CPU, SLO 1 s. Benchmarks use it to
// measure what moving an item costs, in-process and over gRPC.
func NoopChain(n int) (*dag.App, *profile.File, error) {
	var a, p strings.Builder
	fmt.Fprintf(&a, "app: chain\nslo: 1s\nfps: 1000\nmodules:\n")
	fmt.Fprintf(&p, "workers:\n  - {type: CPU, price: 1, cpus: 2}\nprofiles:\n")
	prev := "source"
	for i := range n {
		fmt.Fprintf(&a, "  - {name: m%d, kind: cpu, op: sink, inputs: [%s]}\n", i, prev)
		fmt.Fprintf(&p, "  - {target: m%d, worker: CPU, points: [{batch: 1, concurrency: 2, latency: 50us}]}\n", i)
		prev = fmt.Sprintf("m%d", i)
	}
	app, err := dag.Parse("chain.yaml", []byte(a.String()))
	if err != nil {
		return nil, nil, err
	}
	f, err := profile.Parse("chain-profiles.yaml", []byte(p.String()))
	return app, f, err
}
