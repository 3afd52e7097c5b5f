package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

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

const allocateSynopsis = "-f app.yaml --profiles profiles.yaml [--rate R | --streams N] [--scale MODULE=F ...] " +
	"[--balloon MODULE=F ...] [--exclude-worker TYPE ...] [--method milp|bruteforce|greedy|nexus-dp|even] [-o table|json]"

func runAllocate(args []string, stdout, stderr io.Writer) int {
	return execute("allocate", allocateSynopsis, &allocateCmd{scale: factorFlag{}, balloon: factorFlag{}}, args, stdout, stderr)
}

// allocateCmd is mdag allocate's options.
type allocateCmd struct {
	app            appFlags
	scale, balloon factorFlag
	exclude        listFlag
	method, out    string
	segment        time.Duration
}

func (c *allocateCmd) flags(fs *flag.FlagSet) {
	c.app.bind(fs, "profiles and worker types YAML `file` (required)")
	fs.Var(c.scale, "scale", "observed scaling factor `MODULE=F` overriding the app's (repeatable)")
	fs.Var(c.balloon, "balloon", "ballooning factor `MODULE=F` multiplying the module's execution times (repeatable)")
	fs.Var(&c.exclude, "exclude-worker", "worker `TYPE` not to use (repeatable)")
	fs.StringVar(&c.method, "method", string(allocator.MILP), "allocation `method`: milp, bruteforce, greedy, nexus-dp or even")
	fs.DurationVar(&c.segment, "segment", 0, "nexus-dp latency budget `segment` (default 1ms)")
	fs.StringVar(&c.out, "o", "table", "output `format`: table or json")
}

func (c *allocateCmd) validate(*flag.FlagSet) []error {
	errs := append(c.app.require(), outputFlag(c.out, "table", "json")...)
	return append(errs, c.app.check()...)
}

func (c *allocateCmd) run(env *cmdEnv) error {
	g, cat, err := readInputs(c.app.file, c.app.profiles)
	if err != nil {
		return err
	}
	r, _ := SessionRate(g.App(), c.app.rate, c.app.streams)
	req := allocator.Request{Graph: g, Catalog: cat, Rate: r, Scale: c.scale, Balloon: c.balloon,
		Method: allocator.Method(c.method), Segment: c.segment, MILPSolver: milp.Solver{}, Exclude: workerTypes(c.exclude)}
	a, err := allocator.Allocate(context.Background(), req)
	if err != nil {
		return invalid(err)
	}
	if c.out == "json" {
		writeJSON(env.stdout, a, false)
	} else {
		writeAllocationTable(env.stdout, a, r)
	}
	return infeasibleAs(c.out, env.stderr, a.Feasible, a.Reason)
}

// workerTypes are the types a repeated flag names.
func workerTypes(names []string) []profile.WorkerTypeID {
	var out []profile.WorkerTypeID
	for _, w := range names {
		out = append(out, profile.WorkerTypeID(w))
	}
	return out
}

// infeasibleAs ends a planning command whose plan is infeasible with exit 3;
// with -o json, whose stdout is the document alone, the reason goes to stderr
// (the table says it on stdout).
func infeasibleAs(out string, stderr io.Writer, feasible bool, reason string) error {
	if feasible {
		return nil
	}
	if out == "json" {
		fmt.Fprintln(stderr, "infeasible: "+reason)
	}
	return reported(exitInfeasible)
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
