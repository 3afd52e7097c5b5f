package main

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/mdag/mdag/placement/partition"
	"github.com/mdag/mdag/placement/spec"
)

func runPartition(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("partition", "-f models.yaml --subclusters K [--method milp|greedy|random] [--time-limit 10s] [-o table|json]", stderr)
	file := fs.String("f", "", "models YAML `file` (required): rate, static and dynamic memory per model, limits")
	k := fs.Int("subclusters", 0, "`number` of sub-clusters (required)")
	method := fs.String("method", "milp", "`method`: milp (Symphony Appendix A, started from greedy), greedy (the heuristic alone) or random (Symphony's baseline)")
	limit := fs.Duration("time-limit", 10*time.Second, "solver time `limit`; the best solution found by then is returned")
	seed := fs.Uint64("seed", 1, "random search `seed`")
	out := fs.String("o", "table", "output `format`: table or json")
	if code, ok := parseFlags(fs, args); !ok {
		return code
	}
	if *file == "" || *k < 1 || *method != "milp" && *method != "greedy" && *method != "random" || *out != "table" && *out != "json" {
		fmt.Fprintln(stderr, "mdag partition: -f models.yaml and --subclusters K >= 1 are required; --method is milp, greedy or random; -o table or json")
		fs.Usage()
		return exitInvalid
	}
	req, err := spec.LoadModels(*file)
	if err != nil {
		printErrors(stderr, err)
		return exitInvalid
	}
	req.SubClusters, req.TimeLimit, req.Seed = *k, *limit, *seed
	var p partition.Result
	switch *method {
	case "milp":
		p, err = partition.MILP(req)
	case "greedy":
		p, err = partition.Greedy(req)
	default:
		p, err = partition.Random(req, 1<<30)
	}
	if err != nil {
		fmt.Fprintln(stderr, "mdag partition:", err)
		return exitInvalid
	}
	if *out == "json" {
		writeJSON(stdout, p, false)
	} else if !p.Feasible {
		fmt.Fprintf(stdout, "%s: no partition meets the limits (%s)\n", p.Method, p.Status)
	} else {
		fmt.Fprintf(stdout, "%s (%s): objective %.4g; imbalance (max-min)/mean: rate %.3f, static memory %.3f; move cost %g\n\n",
			p.Method, p.Status, p.Objective, p.RateImbal, p.MemImbal, p.MoveCost)
		tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "SUB-CLUSTER\tRATE/S\tSTATIC MIB\tMODELS")
		for j := 0; j < *k; j++ {
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
	if !p.Feasible {
		return exitInfeasible
	}
	return exitOK
}
