package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/mdag/mdag/allocator"
	"github.com/mdag/mdag/allocator/milp"
	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/placement"
	"github.com/mdag/mdag/placement/spec"
	"github.com/mdag/mdag/profile"
)

type placeReport struct {
	Allocation *allocator.Allocation  `json:"allocation"`
	Plan       placement.Plan         `json:"plan"`
	Excluded   []profile.WorkerTypeID `json:"excluded_for_shortage,omitempty"`
	// CarriesRate, when the rate is infeasible within the cluster's limits,
	// is the largest rate that is feasible within them.
	CarriesRate float64 `json:"carries_rate,omitempty"`
}

const placeSynopsis = "-f app.yaml --profiles profiles.yaml [--rate R | --streams N] [--cluster cluster.yaml] [--exclude-worker TYPE ...] [-o table|json]"

func runPlace(args []string, stdout, stderr io.Writer) int {
	return execute("place", placeSynopsis, new(placeCmd), args, stdout, stderr)
}

// placeCmd is mdag place's options.
type placeCmd struct {
	app          appFlags
	cluster, out string
	exclude      listFlag
}

func (c *placeCmd) flags(fs *flag.FlagSet) {
	c.app.bind(fs, "profiles and worker types YAML `file` (required)")
	fs.StringVar(&c.cluster, "cluster", "", "cluster snapshot YAML `file`: instances, limits per type, turn-off delay (default: an empty cluster)")
	fs.Var(&c.exclude, "exclude-worker", "worker `TYPE` not to use (repeatable)")
	fs.StringVar(&c.out, "o", "table", "output `format`: table or json")
}

func (c *placeCmd) validate(*flag.FlagSet) []error {
	errs := append(c.app.require(), outputFlag(c.out, "table", "json")...)
	return append(errs, c.app.check()...)
}

func (c *placeCmd) run(env *cmdEnv) error {
	g, cat, err := readInputs(c.app.file, c.app.profiles)
	if err != nil {
		return err
	}
	snap, err := c.snapshot(cat)
	if err != nil {
		return err
	}
	r, _ := SessionRate(g.App(), c.app.rate, c.app.streams)
	req := allocator.Request{Graph: g, Catalog: cat, Rate: r, MILPSolver: milp.Solver{}, Exclude: workerTypes(c.exclude),
		Limits: clusterLimits(snap, g.App().Name)}
	rep, err := allocateAndPlace(g, snap, &req)
	if err != nil {
		return invalid(err)
	}
	if !rep.Allocation.Feasible && len(req.Limits) > 0 {
		// What the pool can carry: the runtime plans for this share and
		// sheds the rest.
		if f, _, err := allocator.LargestShare(context.Background(), req, 10); err == nil && f > 0 {
			rep.CarriesRate = r * f
		}
	}
	if c.out == "json" {
		writeJSON(env.stdout, rep, false)
	} else {
		writePlaceTable(env.stdout, rep, r)
	}
	return infeasibleAs(c.out, env.stderr, rep.Allocation.Feasible, rep.Allocation.Reason)
}

// snapshot is the cluster to place onto (--cluster; default: empty), with
// the catalog's prices.
func (c *placeCmd) snapshot(cat *profile.Catalog) (placement.Snapshot, error) {
	snap := placement.Snapshot{Now: time.Now(), TurnOffDelay: placement.DefaultTurnOff}
	if c.cluster != "" {
		var err error
		if snap, err = spec.LoadCluster(c.cluster, time.Now(), cat.Workers()); err != nil {
			return snap, invalid(err)
		}
	}
	snap.Prices = map[profile.WorkerTypeID]float64{}
	for _, w := range cat.Workers() {
		snap.Prices[w.Type] = w.Price
	}
	return snap, nil
}

// clusterLimits are the cluster's limits on the allocation itself (the
// cheapest allocation that fits the pool, not the cheapest that then runs
// out), after other apps' loads take their share of a limit; nil: none.
func clusterLimits(snap placement.Snapshot, app dag.AppID) map[profile.WorkerTypeID]float64 {
	var limits map[profile.WorkerTypeID]float64
	for t, n := range snap.Limits {
		if limits == nil {
			limits = map[profile.WorkerTypeID]float64{}
		}
		used := 0.0
		for _, in := range snap.Instances {
			for _, l := range in.Loads {
				if in.Type == t && l.App != app {
					used += l.Fraction
				}
			}
		}
		limits[t] = max(0, float64(n)-used)
	}
	return limits
}

// allocateAndPlace allocates, then places onto the cluster; Scrooge
// Section 3.4: when a type cannot be had, it allocates again without it
// (or, when partials did not pack within its limit, with less of it).
func allocateAndPlace(g *dag.Graph, snap placement.Snapshot, req *allocator.Request) (placeReport, error) {
	rep := placeReport{}
	for try := 0; ; try++ {
		a, err := allocator.Allocate(context.Background(), *req)
		if err != nil {
			return rep, err
		}
		rep.Allocation = a
		if !a.Feasible {
			return rep, nil
		}
		rep.Plan = placement.Place(snap, placement.Demands(g.App(), a))
		if len(rep.Plan.Shortages) == 0 {
			return rep, nil
		}
		for _, s := range rep.Plan.Shortages {
			if l, ok := req.Limits[s.Type]; ok && l > 0 && try < 4 {
				req.Limits[s.Type] = max(0, min(l, float64(s.Limit))-float64(max(1, s.Needed)))
				continue
			}
			req.Exclude = append(req.Exclude, s.Type)
			rep.Excluded = append(rep.Excluded, s.Type)
		}
	}
}

func writePlaceTable(w io.Writer, rep placeReport, rate float64) {
	a := rep.Allocation
	for _, t := range rep.Excluded {
		fmt.Fprintf(w, "worker type %s ran out (its limit): allocated again without it\n", t)
	}
	if !a.Feasible {
		fmt.Fprintf(w, "allocation at %s frames/s: infeasible: %s\n", fmtFloat(rate), a.Reason)
		if rep.CarriesRate > 0 {
			fmt.Fprintf(w, "within the cluster's limits at most %s frames/s (%.0f%%) is feasible; mdag serve would plan for that and shed the rest\n",
				fmtFloat(rep.CarriesRate), 100*rep.CarriesRate/rate)
		}
		return
	}
	p := rep.Plan
	active := 0
	for _, in := range p.Instances {
		if in.State != placement.Warm {
			active++
		}
	}
	fmt.Fprintf(w, "placement at %s frames/s: %d instances, $%.4f/h in whole instances vs $%.4f/h allocated (x%.3f)\n\n",
		fmtFloat(rate), active, p.CostWhole, p.CostFractional, p.CostWhole/p.CostFractional)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "INSTANCE\tTYPE\tSTATE\tUSED\tMODULES (fraction of the instance)")
	for _, in := range p.Instances {
		var mods []string
		for _, l := range in.Loads {
			kind := ""
			if !l.Full {
				kind = " partial"
			}
			mods = append(mods, fmt.Sprintf("%s/%s <%d,%d> %.4g/s %.4f%s", l.App, l.Module, l.Batch, l.Concurrency, l.Rate, l.Fraction, kind))
		}
		state := string(in.State)
		if in.State == placement.Warm {
			state += fmt.Sprintf(" (release in %v)", in.ReleaseAt.Sub(time.Now()).Round(time.Second))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.4f\t%s\n", in.ID, in.Type, state, in.Used(), strings.Join(mods, "; "))
	}
	tw.Flush()
	fmt.Fprintf(w, "\nmoves (%d):\n", len(p.Moves))
	moves := slices.Clone(p.Moves)
	for _, m := range moves {
		what := string(m.Instance)
		if m.Module != "" {
			what += " " + string(m.App) + "/" + string(m.Module)
		}
		if m.From != "" {
			what += " from " + string(m.From)
		}
		fmt.Fprintf(w, "  %-10s %s: %s\n", m.Kind, what, m.Reason)
	}
}
