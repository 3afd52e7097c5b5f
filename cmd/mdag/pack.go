package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/mdag/mdag/placement/spec"
	"github.com/mdag/mdag/placement/squishy"
)

func runPack(args []string, stdout, stderr io.Writer) int {
	return execute("pack", "-f sessions.yaml [-o table|json]", new(packCmd), args, stdout, stderr)
}

// packCmd is mdag pack's options.
type packCmd struct{ file, out string }

func (c *packCmd) flags(fs *flag.FlagSet) {
	fs.StringVar(&c.file, "f", "", "sessions YAML `file` (required): model, slo, rate and a batch profile per session")
	fs.StringVar(&c.out, "o", "table", "output `format`: table or json")
}

func (c *packCmd) validate(*flag.FlagSet) []error {
	errs := outputFlag(c.out, "table", "json")
	if c.file == "" {
		errs = append(errs, errors.New("-f sessions.yaml is required"))
	}
	return errs
}

func (c *packCmd) run(env *cmdEnv) error {
	sessions, opt, err := spec.LoadSessions(c.file)
	if err != nil {
		return invalid(err)
	}
	res := squishy.Pack(sessions, opt)
	if c.out == "json" {
		writeJSON(env.stdout, res, false)
	} else {
		writePackTable(env.stdout, res, len(sessions))
	}
	if len(res.Unschedulable) > 0 {
		if c.out == "json" {
			fmt.Fprintf(env.stderr, "%d sessions cannot be scheduled\n", len(res.Unschedulable))
		}
		return reported(exitInfeasible)
	}
	return nil
}

func writePackTable(w io.Writer, res squishy.PackResult, sessions int) {
	fmt.Fprintf(w, "squishy bin packing: %d sessions on %d GPUs\n", sessions-len(res.Unschedulable), len(res.GPUs))
	fmt.Fprintf(w, "  rate lower bound %.2f GPUs (sum of rate / best single-GPU throughput): efficiency %.1f%%\n",
		res.LowerBound, 100*res.Efficiency)
	fmt.Fprintf(w, "  duty-cycle bound %.2f GPUs (saturated GPUs + each residual alone): packing efficiency %.1f%%\n\n",
		res.DutyBound, 100*res.PackingEfficiency)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
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
		fmt.Fprintf(w, "unschedulable: %s: %s\n", u.Session, u.Reason)
	}
}
