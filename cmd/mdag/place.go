package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/mdag/mdag/allocator"
	"github.com/mdag/mdag/allocator/milp"
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

func runPlace(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("place", "-f app.yaml --profiles profiles.yaml [--rate R | --streams N] [--cluster cluster.yaml] [--exclude-worker TYPE ...] [-o table|json]", stderr)
	file := fs.String("f", "", "application YAML `file` (required)")
	profiles := fs.String("profiles", "", "profiles and worker types YAML `file` (required)")
	rate := fs.Float64("rate", 0, "ingress `rate` in frames per second for the whole session (default: --streams x the app's fps)")
	streams := fs.Int("streams", 1, "`number` of streams in the session, each at the app's fps; ignored with --rate")
	cluster := fs.String("cluster", "", "cluster snapshot YAML `file`: instances, limits per type, turn-off delay (default: an empty cluster)")
	var exclude listFlag
	fs.Var(&exclude, "exclude-worker", "worker `TYPE` not to use (repeatable)")
	out := fs.String("o", "table", "output `format`: table or json")
	if code, ok := parseFlags(fs, args); !ok {
		return code
	}
	if *file == "" || *profiles == "" {
		fmt.Fprintln(stderr, "mdag place: -f app.yaml and --profiles profiles.yaml are required")
		fs.Usage()
		return exitInvalid
	}
	if *out != "table" && *out != "json" || *rate < 0 || *streams < 1 {
		fmt.Fprintln(stderr, "mdag place: -o must be table or json, --rate >= 0, --streams >= 1")
		return exitInvalid
	}
	g, cat, code := loadInputs(*file, *profiles, stderr)
	if code != exitOK {
		return code
	}
	snap := placement.Snapshot{Now: time.Now(), TurnOffDelay: placement.DefaultTurnOff}
	if *cluster != "" {
		var err error
		if snap, err = spec.LoadCluster(*cluster, time.Now(), cat.Workers()); err != nil {
			printErrors(stderr, err)
			return exitInvalid
		}
	}
	snap.Prices = map[profile.WorkerTypeID]float64{}
	for _, w := range cat.Workers() {
		snap.Prices[w.Type] = w.Price
	}
	r, _ := SessionRate(g.App(), *rate, *streams)
	req := allocator.Request{Graph: g, Catalog: cat, Rate: r, MILPSolver: milp.Solver{}}
	for _, w := range exclude {
		req.Exclude = append(req.Exclude, profile.WorkerTypeID(w))
	}
	// The cluster's limits bound the allocation itself (the cheapest
	// allocation that fits the pool, not the cheapest that then runs out).
	// Other apps' loads in the cluster take their share of a limit first.
	for t, n := range snap.Limits {
		if req.Limits == nil {
			req.Limits = map[profile.WorkerTypeID]float64{}
		}
		used := 0.0
		for _, in := range snap.Instances {
			for _, l := range in.Loads {
				if in.Type == t && l.App != g.App().Name {
					used += l.Fraction
				}
			}
		}
		req.Limits[t] = max(0, float64(n)-used)
	}
	rep := placeReport{}
	// Scrooge Section 3.4: when a type cannot be had, allocate again without
	// it (or, when partials did not pack within its limit, with less of it).
	for try := 0; ; try++ {
		a, err := allocator.Allocate(context.Background(), req)
		if err != nil {
			fmt.Fprintln(stderr, "mdag place:", err)
			return exitInvalid
		}
		rep.Allocation = a
		if !a.Feasible {
			break
		}
		rep.Plan = placement.Place(snap, placement.Demands(g.App(), a))
		if len(rep.Plan.Shortages) == 0 {
			break
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
	if !rep.Allocation.Feasible && len(req.Limits) > 0 {
		// What the pool can carry: the runtime plans for this share and
		// sheds the rest.
		if f, _, err := allocator.LargestShare(context.Background(), req, 10); err == nil && f > 0 {
			rep.CarriesRate = r * f
		}
	}
	if *out == "json" {
		writeJSON(stdout, rep, false)
	} else {
		writePlaceTable(stdout, rep, r)
	}
	if !rep.Allocation.Feasible {
		if *out == "json" {
			fmt.Fprintln(stderr, "infeasible: "+rep.Allocation.Reason)
		}
		return exitInfeasible
	}
	return exitOK
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
