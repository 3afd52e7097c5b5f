package allocator

import (
	"context"
	"fmt"
	"time"

	"github.com/mdag/mdag/dag"
)

// greedy starts from every module's fastest option and repeatedly applies
// the single-module change with the best ratio of cost saved to latency
// added (Scrooge Section 4.4's heuristic, descending from the fastest
// allocation) while every path stays within the SLO.
type greedy struct{}

func (greedy) Solve(ctx context.Context, p *Problem) ([]int, Stats, error) {
	choice := make([]int, len(p.Modules))
	if !p.Fits(choice) {
		return nil, Stats{Reason: "even the fastest options miss the SLO"}, nil
	}
	var stats Stats
	for {
		if err := ctx.Err(); err != nil {
			return nil, stats, err
		}
		bi, bo, bestScore := -1, -1, -1.0
		for i, front := range p.Fronts {
			cur := front[choice[i]]
			for o := choice[i] + 1; o < len(front); o++ {
				stats.Candidates++
				saved := cur.Cost - front[o].Cost
				added := Millis(front[o].Latency-cur.Latency) + 1e-6 // no division by zero
				old := choice[i]
				choice[i] = o
				ok := p.Fits(choice)
				choice[i] = old
				if ok && saved/added > bestScore {
					bi, bo, bestScore = i, o, saved/added
				}
			}
		}
		if bi < 0 {
			stats.Status = "LOCAL_OPTIMUM"
			return choice, stats, nil
		}
		choice[bi] = bo
	}
}

// even gives every module the SLO divided by the number of modules on the
// longest path through it, then the cheapest option within that budget.
type even struct{}

func (even) Solve(_ context.Context, p *Problem) ([]int, Stats, error) {
	n := len(p.Modules)
	up := make([]int, n) // modules on the longest path from the source to i, i included
	for i := range p.Modules {
		up[i] = 1
		for _, u := range p.preds[i] {
			up[i] = max(up[i], up[u]+1)
		}
	}
	down := make([]int, n) // modules on the longest path from i to a sink, i included
	for i := n - 1; i >= 0; i-- {
		down[i] = max(down[i], 1)
		for _, u := range p.preds[i] {
			down[u] = max(down[u], down[i]+1)
		}
	}
	choice := make([]int, n)
	for i := range p.Modules {
		stages := up[i] + down[i] - 1
		budget := p.SLO / time.Duration(stages)
		o := p.cheapestWithin(i, budget)
		if o < 0 {
			return nil, Stats{Reason: fmt.Sprintf("even split: %s gets %s ms (1/%d of the SLO) and no option is that fast",
				p.Modules[i], fmtMS(budget), stages)}, nil
		}
		choice[i] = o
	}
	return choice, Stats{Status: "EVEN_SPLIT"}, nil
}

// nexusDP is Nexus's dynamic program (Section 6.2): f(node, t) is the least
// cost of a sub-graph within budget t, budgets in whole segments; a series
// composition splits t between its parts (min-plus convolution), a parallel
// one gives each part all of t. Leaves are modules: the cheapest option within
// the budget. It works on series-parallel graphs (trees and fork-join).
type nexusDP struct{}

func (nexusDP) Solve(ctx context.Context, p *Problem) ([]int, Stats, error) {
	sp, ok := p.Graph.Decompose()
	if !ok {
		return nil, Stats{Reason: "nexus-dp handles tree and fork-join graphs; this graph is not series-parallel"}, nil
	}
	segs := int(p.SLO / p.Segment)
	index := map[dag.ModuleID]int{}
	for i, m := range p.Modules {
		index[m] = i
	}
	dp := &dpState{p: p, segs: segs, index: index, split: map[*dag.SP][][]int{}}
	f := dp.table(sp)
	if err := ctx.Err(); err != nil {
		return nil, Stats{}, err
	}
	if isInf(f[segs]) {
		return nil, Stats{Reason: fmt.Sprintf("nexus-dp found no budget split within %s ms in %s ms segments",
			fmtMS(p.SLO), fmtMS(p.Segment))}, nil
	}
	choice := make([]int, len(p.Modules))
	dp.assign(sp, segs, choice)
	return choice, Stats{Status: "DP", Candidates: int64(segs+1) * int64(segs+1)}, nil
}

type dpState struct {
	p     *Problem
	segs  int
	index map[dag.ModuleID]int
	split map[*dag.SP][][]int // series node -> per fold step, the budget kept by the prefix
}

const inf = 1e300

func isInf(x float64) bool { return x >= inf }

func (d *dpState) table(sp *dag.SP) []float64 {
	f := make([]float64, d.segs+1)
	switch sp.Kind {
	case dag.SPModule:
		i := d.index[sp.Module]
		for t := range f {
			if o := d.p.cheapestWithin(i, time.Duration(t)*d.p.Segment); o >= 0 {
				f[t] = d.p.Fronts[i][o].Cost
			} else {
				f[t] = inf
			}
		}
	case dag.SPParallel:
		for _, part := range sp.Parts {
			g := d.table(part)
			for t := range f {
				f[t] = min(inf, f[t]+g[t])
			}
		}
	case dag.SPSeries:
		f = d.table(sp.Parts[0])
		var splits [][]int
		for _, part := range sp.Parts[1:] {
			g := d.table(part)
			h := make([]float64, d.segs+1)
			arg := make([]int, d.segs+1)
			for t := range h {
				h[t] = inf
				for k := 0; k <= t; k++ {
					if v := f[k] + g[t-k]; v < h[t] {
						h[t], arg[t] = v, k
					}
				}
			}
			f = h
			splits = append(splits, arg)
		}
		d.split[sp] = splits
	}
	return f
}

func (d *dpState) assign(sp *dag.SP, t int, choice []int) {
	switch sp.Kind {
	case dag.SPModule:
		i := d.index[sp.Module]
		choice[i] = d.p.cheapestWithin(i, time.Duration(t)*d.p.Segment)
	case dag.SPParallel:
		for _, part := range sp.Parts {
			d.assign(part, t, choice)
		}
	case dag.SPSeries:
		splits := d.split[sp]
		for j := len(sp.Parts) - 1; j >= 1; j-- {
			k := splits[j-1][t]
			d.assign(sp.Parts[j], t-k, choice)
			t = k
		}
		d.assign(sp.Parts[0], t, choice)
	}
}
