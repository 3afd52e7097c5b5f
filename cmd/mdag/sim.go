package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"slices"
	"text/tabwriter"

	"github.com/mdag/mdag/scheduler"
	"github.com/mdag/mdag/scheduler/sim"
)

func runSim(args []string, stdout, stderr io.Writer) int {
	return execute("sim", "-f workload.yaml [--policy symphony|clockwork|nexus|lazy|hindsight] [--rate TOTAL] [--find-goodput] [-o table|json]",
		new(simCmd), args, stdout, stderr)
}

// simCmd is mdag sim's options.
type simCmd struct {
	file, policy, out string
	rate              float64
	find              bool
}

func (c *simCmd) flags(fs *flag.FlagSet) {
	fs.StringVar(&c.file, "f", "", "workload YAML `file` (required)")
	fs.StringVar(&c.policy, "policy", string(scheduler.Symphony), "scheduling `policy`: symphony, clockwork, nexus or lazy; hindsight: the reference that knows every arrival in advance (single model, no jitter)")
	fs.Float64Var(&c.rate, "rate", 0, "total offered `rate` in requests/s (scales the models' rates; default: the workload's)")
	fs.BoolVar(&c.find, "find-goodput", false, "search the highest offered rate with >= 99% of requests within their SLO")
	fs.StringVar(&c.out, "o", "table", "output `format`: table or json")
}

func (c *simCmd) validate(*flag.FlagSet) []error {
	var errs []error
	if c.file == "" {
		errs = append(errs, errors.New("-f workload.yaml is required"))
	}
	if p := scheduler.Policy(c.policy); !slices.Contains(scheduler.Policies, p) && p != sim.Hindsight {
		errs = append(errs, fmt.Errorf("--policy must be symphony, clockwork, nexus, lazy or hindsight, got %q", c.policy))
	}
	if c.rate < 0 || math.IsNaN(c.rate) || math.IsInf(c.rate, 0) {
		errs = append(errs, fmt.Errorf("--rate must be >= 0, got %v", c.rate))
	}
	return append(errs, outputFlag(c.out, "table", "json")...)
}

func (c *simCmd) run(env *cmdEnv) error {
	w, err := sim.LoadWorkload(c.file)
	if err != nil {
		return invalid(err)
	}
	var r *sim.Result
	if c.find {
		if c.rate > 0 {
			w.Rate = c.rate // the search starts there
		}
		r, err = sim.FindGoodput(w, scheduler.Policy(c.policy))
	} else {
		r, err = sim.Run(w, scheduler.Policy(c.policy), c.rate)
	}
	if err != nil {
		return invalid(err)
	}
	if c.out == "json" {
		writeJSON(env.stdout, r, false)
	} else {
		writeSimTable(env.stdout, w, r, c.find)
	}
	return nil
}

func writeSimTable(w io.Writer, wl *sim.Workload, r *sim.Result, find bool) {
	what := "goodput"
	if find {
		what = "goodput (highest rate with >= 99% within SLO)"
	}
	fmt.Fprintf(w, "policy %s, %d GPUs, %v virtual: offered %s r/s, %s %s r/s, bad rate %.4f\n",
		r.Policy, wl.GPUs, wl.Duration, fmtFloat(r.OfferedRPS), what, fmtFloat(r.GoodputRPS), r.BadRate)
	fmt.Fprintf(w, "latency p50 %s ms, p99 %s ms, max %s ms; queueing p50 %s ms, p99 %s ms; mean batch %s; GPU busy %.1f%%\n",
		fmtFloat(r.P50MS), fmtFloat(r.P99MS), fmtFloat(r.MaxMS), fmtFloat(r.QueueP50MS), fmtFloat(r.QueueP99MS),
		fmtFloat(r.MeanBatch), 100*r.GPUBusyFraction)
	fmt.Fprintf(w, "requests %d: good %d, late %d, dropped %v\n", r.Requests, r.Good, r.Late, r.Dropped)
	fmt.Fprintf(w, "autoscaling: worst 1 s bad rate %.4f -> add %d GPUs; idle %.1f%% -> release %d GPUs\n\n",
		r.Autoscale.WorstWindowBadRate, r.Autoscale.AddGPUs, 100*r.Autoscale.IdleFraction, r.Autoscale.ReleaseGPUs)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "MODEL\tOFFERED R/S\tGOODPUT R/S\tBAD RATE\tP99 MS\tMEAN BATCH")
	for _, m := range r.PerModel {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.4f\t%s\t%s\n", m.Model, fmtFloat(m.OfferedRPS), fmtFloat(m.GoodputRPS), m.BadRate,
			fmtFloat(m.P99MS), fmtFloat(m.MeanBatch))
	}
	tw.Flush()
}
