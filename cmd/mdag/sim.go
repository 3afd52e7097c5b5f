package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"text/tabwriter"

	"github.com/mdag/mdag/scheduler"
	"github.com/mdag/mdag/scheduler/sim"
)

func runSim(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("sim", "-f workload.yaml [--policy symphony|clockwork|nexus|lazy|hindsight] [--rate TOTAL] [--find-goodput] [-o table|json]", stderr)
	file := fs.String("f", "", "workload YAML `file` (required)")
	policy := fs.String("policy", string(scheduler.Symphony), "scheduling `policy`: symphony, clockwork, nexus or lazy; hindsight: the reference that knows every arrival in advance (single model, no jitter)")
	rate := fs.Float64("rate", 0, "total offered `rate` in requests/s (scales the models' rates; default: the workload's)")
	find := fs.Bool("find-goodput", false, "search the highest offered rate with >= 99% of requests within their SLO")
	out := fs.String("o", "table", "output `format`: table or json")
	if code, ok := parseFlags(fs, args); !ok {
		return code
	}
	if *file == "" || *out != "table" && *out != "json" || *rate < 0 || math.IsNaN(*rate) ||
		!slices.Contains(scheduler.Policies, scheduler.Policy(*policy)) && scheduler.Policy(*policy) != sim.Hindsight {
		fmt.Fprintln(stderr, "mdag sim: -f workload.yaml is required; --policy is symphony, clockwork, nexus, lazy or hindsight; -o table or json; --rate >= 0")
		fs.Usage()
		return exitInvalid
	}
	w, err := sim.LoadWorkload(*file)
	if err != nil {
		printErrors(stderr, err)
		return exitInvalid
	}
	var r *sim.Result
	if *find {
		if *rate > 0 {
			w.Rate = *rate // the search starts there
		}
		r, err = sim.FindGoodput(w, scheduler.Policy(*policy))
	} else {
		r, err = sim.Run(w, scheduler.Policy(*policy), *rate)
	}
	if err != nil {
		fmt.Fprintln(stderr, "mdag sim:", err)
		return exitInvalid
	}
	if *out == "json" {
		writeJSON(stdout, r, false)
		return exitOK
	}
	what := "goodput"
	if *find {
		what = "goodput (highest rate with >= 99% within SLO)"
	}
	fmt.Fprintf(stdout, "policy %s, %d GPUs, %v virtual: offered %s r/s, %s %s r/s, bad rate %.4f\n",
		r.Policy, w.GPUs, w.Duration, fmtFloat(r.OfferedRPS), what, fmtFloat(r.GoodputRPS), r.BadRate)
	fmt.Fprintf(stdout, "latency p50 %s ms, p99 %s ms, max %s ms; queueing p50 %s ms, p99 %s ms; mean batch %s; GPU busy %.1f%%\n",
		fmtFloat(r.P50MS), fmtFloat(r.P99MS), fmtFloat(r.MaxMS), fmtFloat(r.QueueP50MS), fmtFloat(r.QueueP99MS),
		fmtFloat(r.MeanBatch), 100*r.GPUBusyFraction)
	fmt.Fprintf(stdout, "requests %d: good %d, late %d, dropped %v\n", r.Requests, r.Good, r.Late, r.Dropped)
	fmt.Fprintf(stdout, "autoscaling: worst 1 s bad rate %.4f -> add %d GPUs; idle %.1f%% -> release %d GPUs\n\n",
		r.Autoscale.WorstWindowBadRate, r.Autoscale.AddGPUs, 100*r.Autoscale.IdleFraction, r.Autoscale.ReleaseGPUs)
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "MODEL\tOFFERED R/S\tGOODPUT R/S\tBAD RATE\tP99 MS\tMEAN BATCH")
	for _, m := range r.PerModel {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.4f\t%s\t%s\n", m.Model, fmtFloat(m.OfferedRPS), fmtFloat(m.GoodputRPS), m.BadRate,
			fmtFloat(m.P99MS), fmtFloat(m.MeanBatch))
	}
	tw.Flush()
	return exitOK
}
