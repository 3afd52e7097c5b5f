package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/mdag/mdag/placement/spec"
	"github.com/mdag/mdag/placement/squishy"
)

func runPack(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("pack", "-f sessions.yaml [-o table|json]", stderr)
	file := fs.String("f", "", "sessions YAML `file` (required): model, slo, rate and a batch profile per session")
	out := fs.String("o", "table", "output `format`: table or json")
	if code, ok := parseFlags(fs, args); !ok {
		return code
	}
	if *file == "" || *out != "table" && *out != "json" {
		fmt.Fprintln(stderr, "mdag pack: -f sessions.yaml is required; -o is table or json")
		fs.Usage()
		return exitInvalid
	}
	sessions, opt, err := spec.LoadSessions(*file)
	if err != nil {
		printErrors(stderr, err)
		return exitInvalid
	}
	res := squishy.Pack(sessions, opt)
	if *out == "json" {
		writeJSON(stdout, res, false)
	} else {
		fmt.Fprintf(stdout, "squishy bin packing: %d sessions on %d GPUs\n", len(sessions)-len(res.Unschedulable), len(res.GPUs))
		fmt.Fprintf(stdout, "  rate lower bound %.2f GPUs (sum of rate / best single-GPU throughput): efficiency %.1f%%\n",
			res.LowerBound, 100*res.Efficiency)
		fmt.Fprintf(stdout, "  duty-cycle bound %.2f GPUs (saturated GPUs + each residual alone): packing efficiency %.1f%%\n\n",
			res.DutyBound, 100*res.PackingEfficiency)
		tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "GPU\tKIND\tDUTY CYCLE MS\tOCCUPANCY\tSESSIONS (batch, rate, worst latency)")
		for _, g := range res.GPUs {
			kind := "shared"
			if g.Saturated {
				kind = "saturated"
			}
			var parts []string
			for _, a := range g.Sessions {
				parts = append(parts, fmt.Sprintf("%s b%d %.4g/s worst %sms", a.Session, a.Batch, a.Rate, fmtFloat(a.WorstMS)))
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\t%.3f\t%s\n", g.ID, kind, fmtFloat(g.DutyCycleMS), g.Occupancy, strings.Join(parts, "; "))
		}
		tw.Flush()
		for _, u := range res.Unschedulable {
			fmt.Fprintf(stdout, "unschedulable: %s: %s\n", u.Session, u.Reason)
		}
	}
	if len(res.Unschedulable) > 0 {
		if *out == "json" {
			fmt.Fprintf(stderr, "%d sessions cannot be scheduled\n", len(res.Unschedulable))
		}
		return exitInfeasible
	}
	return exitOK
}
