package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/mdag/mdag/placement/partition"
	"github.com/mdag/mdag/placement/spec"
)

func runPartition(args []string, stdout, stderr io.Writer) int {
	return execute("partition", "-f models.yaml --subclusters K [--method milp|greedy|random] [--time-limit 10s] [-o table|json]",
		new(partitionCmd), args, stdout, stderr)
}

// partitionCmd is mdag partition's options.
type partitionCmd struct {
	file, method, out string
	k                 int
	limit             time.Duration
	seed              uint64
}

func (c *partitionCmd) flags(fs *flag.FlagSet) {
	fs.StringVar(&c.file, "f", "", "models YAML `file` (required): rate, static and dynamic memory per model, limits")
	fs.IntVar(&c.k, "subclusters", 0, "`number` of sub-clusters (required)")
	fs.StringVar(&c.method, "method", "milp", "`method`: milp (Symphony Appendix A, started from greedy), greedy (the heuristic alone) or random (Symphony's baseline)")
	fs.DurationVar(&c.limit, "time-limit", 10*time.Second, "solver time `limit`; the best solution found by then is returned")
	fs.Uint64Var(&c.seed, "seed", 1, "random search `seed`")
	fs.StringVar(&c.out, "o", "table", "output `format`: table or json")
}

func (c *partitionCmd) validate(*flag.FlagSet) []error {
	var errs []error
	if c.file == "" {
		errs = append(errs, errors.New("-f models.yaml is required"))
	}
	if c.k < 1 {
		errs = append(errs, fmt.Errorf("--subclusters K >= 1 is required, got %d", c.k))
	}
	if !slices.Contains([]string{"milp", "greedy", "random"}, c.method) {
		errs = append(errs, fmt.Errorf("--method must be milp, greedy or random, got %q", c.method))
	}
	return append(errs, outputFlag(c.out, "table", "json")...)
}

func (c *partitionCmd) run(env *cmdEnv) error {
	req, err := spec.LoadModels(c.file)
	if err != nil {
		return invalid(err)
	}
	req.SubClusters, req.TimeLimit, req.Seed = c.k, c.limit, c.seed
	var p partition.Result
	switch c.method {
	case "milp":
		p, err = partition.MILP(req)
	case "greedy":
		p, err = partition.Greedy(req)
	default:
		p, err = partition.Random(req, 1<<30)
	}
	if err != nil {
		return invalid(err)
	}
	switch {
	case c.out == "json":
		writeJSON(env.stdout, p, false)
	case !p.Feasible:
		fmt.Fprintf(env.stdout, "%s: no partition meets the limits (%s)\n", p.Method, p.Status)
	default:
		writePartitionTable(env.stdout, p, req)
	}
	if !p.Feasible {
		return reported(exitInfeasible)
	}
	return nil
}

func writePartitionTable(w io.Writer, p partition.Result, req partition.Request) {
	fmt.Fprintf(w, "%s (%s): objective %.4g; imbalance (max-min)/mean: rate %.3f, static memory %.3f; move cost %g\n\n",
		p.Method, p.Status, p.Objective, p.RateImbal, p.MemImbal, p.MoveCost)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SUB-CLUSTER\tRATE/S\tSTATIC MIB\tMODELS")
	for j := 0; j < req.SubClusters; j++ {
		var names []string
		for i, a := range p.Assign {
			if a == j {
				names = append(names, req.Models[i].Name)
			}
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%v\n", j, fmtFloat(p.Rates[j]), fmtFloat(p.StaticMiB[j]), names)
	}
	tw.Flush()
}
