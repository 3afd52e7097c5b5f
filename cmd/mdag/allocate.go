package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/mdag/mdag/allocator"
	"github.com/mdag/mdag/allocator/milp"
	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/profile"
)

// factorFlag collects repeated MODULE=F flags.
type factorFlag map[dag.ModuleID]float64

func (f factorFlag) String() string { return "" }

func (f factorFlag) Set(v string) error {
	name, num, ok := strings.Cut(v, "=")
	if !ok || name == "" {
		return fmt.Errorf("want MODULE=FACTOR, got %q", v)
	}
	x, err := strconv.ParseFloat(num, 64)
	if err != nil || math.IsNaN(x) || math.IsInf(x, 0) {
		return fmt.Errorf("want a number after %s=, got %q", name, num)
	}
	f[dag.ModuleID(name)] = x
	return nil
}

type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

func runAllocate(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("allocate", "-f app.yaml --profiles profiles.yaml [--rate R | --streams N] [--scale MODULE=F ...] "+
		"[--balloon MODULE=F ...] [--exclude-worker TYPE ...] [--method milp|bruteforce|greedy|nexus-dp|even] [-o table|json]", stderr)
	file := fs.String("f", "", "application YAML `file` (required)")
	profiles := fs.String("profiles", "", "profiles and worker types YAML `file` (required)")
	rate := fs.Float64("rate", 0, "ingress `rate` in frames per second for the whole session (default: --streams x the app's fps)")
	streams := fs.Int("streams", 1, "`number` of streams in the session, each at the app's fps; ignored with --rate")
	scale, balloon := factorFlag{}, factorFlag{}
	fs.Var(scale, "scale", "observed scaling factor `MODULE=F` overriding the app's (repeatable)")
	fs.Var(balloon, "balloon", "ballooning factor `MODULE=F` multiplying the module's execution times (repeatable)")
	var exclude listFlag
	fs.Var(&exclude, "exclude-worker", "worker `TYPE` not to use (repeatable)")
	method := fs.String("method", string(allocator.MILP), "allocation `method`: milp, bruteforce, greedy, nexus-dp or even")
	segment := fs.Duration("segment", 0, "nexus-dp latency budget `segment` (default 1ms)")
	out := fs.String("o", "table", "output `format`: table or json")
	if code, ok := parseFlags(fs, args); !ok {
		return code
	}
	switch {
	case *file == "" || *profiles == "":
		fmt.Fprintln(stderr, "mdag allocate: -f app.yaml and --profiles profiles.yaml are required")
		fs.Usage()
		return exitInvalid
	case *out != "table" && *out != "json":
		fmt.Fprintf(stderr, "mdag allocate: -o must be table or json, got %q\n", *out)
		return exitInvalid
	case *rate < 0 || math.IsNaN(*rate) || math.IsInf(*rate, 0):
		fmt.Fprintf(stderr, "mdag allocate: --rate must be a positive number, got %v\n", *rate)
		return exitInvalid
	case *streams < 1:
		fmt.Fprintf(stderr, "mdag allocate: --streams must be >= 1, got %d\n", *streams)
		return exitInvalid
	}
	g, cat, code := loadInputs(*file, *profiles, stderr)
	if code != exitOK {
		return code
	}
	r, _ := SessionRate(g.App(), *rate, *streams)
	req := allocator.Request{Graph: g, Catalog: cat, Rate: r, Scale: scale, Balloon: balloon,
		Method: allocator.Method(*method), Segment: *segment, MILPSolver: milp.Solver{}}
	for _, w := range exclude {
		req.Exclude = append(req.Exclude, profile.WorkerTypeID(w))
	}
	a, err := allocator.Allocate(context.Background(), req)
	if err != nil {
		fmt.Fprintln(stderr, "mdag allocate:", err)
		return exitInvalid
	}
	if *out == "json" {
		writeJSON(stdout, a, false)
	} else {
		writeAllocationTable(stdout, a, r)
	}
	if !a.Feasible {
		if *out == "json" {
			fmt.Fprintln(stderr, "infeasible: "+a.Reason)
		}
		return exitInfeasible
	}
	return exitOK
}

func writeAllocationTable(w io.Writer, a *allocator.Allocation, rate float64) {
	if !a.Feasible {
		fmt.Fprintf(w, "allocation %s at %s frames/s: infeasible: %s\n", a.Method, fmtFloat(rate), a.Reason)
		return
	}
	fmt.Fprintf(w, "allocation %s at %s frames/s: $%.4f/h, critical path %s %s ms of the %s ms SLO (slack %s ms)\n",
		a.Method, fmtFloat(rate), a.CostPerHour, a.CriticalPath, fmtFloat(a.CriticalLatencyMS), fmtFloat(a.SLOMS),
		fmtFloat(a.SLOMS-a.CriticalLatencyMS))
	solver := a.Solver.Status
	if a.Solver.Variables > 0 {
		solver += fmt.Sprintf(", %d variables, %d rows", a.Solver.Variables, a.Solver.Rows)
	}
	fmt.Fprintf(w, "solver: %s\n\n", solver)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "MODULE\tRATE/S\tLATENCY MS\t$/H\tWORKER\t<B,E>\tRATE/S\tINSTANCES\tLATENCY MS")
	for _, m := range a.Modules {
		head := fmt.Sprintf("%s\t%s\t%s\t%.4f", m.Module, fmtFloat(m.Rate), fmtFloat(m.LatencyMS), m.CostPerHour)
		if len(m.Allocations) == 0 {
			fmt.Fprintf(tw, "%s\t-\t-\t-\t-\t-\n", head)
		}
		for i, in := range m.Allocations {
			if i > 0 {
				head = "\t\t\t"
			}
			inst := fmtFloat(in.Instances)
			if in.Partial {
				inst = strconv.FormatFloat(in.Instances, 'f', 4, 64) + " (partial)"
			}
			fmt.Fprintf(tw, "%s\t%s\t<%d,%d>\t%s\t%s\t%s\n", head, in.Worker, in.Batch, in.Concurrency,
				fmtFloat(in.Rate), inst, fmtFloat(in.LatencyMS))
		}
	}
	tw.Flush()
	fmt.Fprintln(w, "\nwhy:")
	for _, m := range a.Modules {
		fmt.Fprintf(w, "  %s: %s\n", m.Module, m.Why)
	}
	fmt.Fprintln(w, "\npaths:")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, p := range a.Paths {
		bind := ""
		if p.Binding {
			bind = "binding: it limits cheaper choices"
		}
		fmt.Fprintf(tw, "  %s\t%s ms\tslack %s ms\t%s\n", p.Path, fmtFloat(p.LatencyMS), fmtFloat(p.SlackMS), bind)
	}
	tw.Flush()
}
