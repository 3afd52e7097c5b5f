// Package milp is the allocator's exact solver: one mixed-integer linear
// program over the modules' option fronts, solved with lp_solve through
// golp. It is the only allocator package that links lp_solve; it imports
// allocator, internal/lpsolve and golp, and callers hand it to the pure
// allocator:
//
//	a, err := allocator.Allocate(ctx, allocator.Request{..., MILPSolver: milp.Solver{}})
package milp

import (
	"context"
	"fmt"
	"math"

	"github.com/draffensperger/golp"

	"github.com/mdag/mdag/allocator"
	"github.com/mdag/mdag/internal/lpsolve"
)

// Solver picks one option per module with lp_solve; it implements
// allocator.Solver for method milp.
//
// Columns: y[i][o] in {0,1} for each option o of module i; s[i] >= 0, the
// time module i may start (all its inputs done), in ms; lmax, the critical
// latency in ms. Rows:
//
//	sum_o y[i][o] = 1                                  for every module i
//	s[v] - s[u] - sum_o L[u][o] y[u][o] >= 0           for every edge u -> v
//	lmax - s[v] - sum_o L[v][o] y[v][o] >= 0           for every sink v
//	lmax <= SLO + 1 µs                                 (a bound; float slack as in Problem.Fits)
//	sum uses_w(o) y[i][o] <= limit_w                  for every capped worker type w
//
// Pass 1 minimises sum C[i][o] y[i][o]. Pass 2 adds cost <= optimum and
// minimises lmax, so ties in cost go to the lower critical latency.
type Solver struct{}

var _ allocator.Solver = Solver{}

// Solve implements allocator.Solver.
func (Solver) Solve(ctx context.Context, p *allocator.Problem) ([]int, allocator.Stats, error) {
	var cols int
	yCol := make([][]int, len(p.Modules))
	for i, front := range p.Fronts {
		for range front {
			yCol[i] = append(yCol[i], cols)
			cols++
		}
	}
	sCol := make([]int, len(p.Modules))
	for i := range p.Modules {
		sCol[i] = cols
		cols++
	}
	lmax := cols
	cols++

	lp := golp.NewLP(0, cols)
	lp.SetVerboseLevel(golp.NEUTRAL)
	lpsolve.FloorFirst(lp) // lp_solve's default ceiling-first branching can stop short (internal/lpsolve)
	lp.SetAddRowMode(true)
	lp.SetTimeout(max(1, int(math.Ceil(p.Timeout.Seconds()))))
	for i := range p.Modules {
		row := make([]golp.Entry, len(yCol[i]))
		for o, c := range yCol[i] {
			row[o] = golp.Entry{Col: c, Val: 1}
			lp.SetBinary(c, true)
		}
		if err := lp.AddConstraintSparse(row, golp.EQ, 1); err != nil {
			return nil, allocator.Stats{}, fmt.Errorf("%w: %v", allocator.ErrSolver, err)
		}
	}
	latencyTerms := func(i int, sign float64) []golp.Entry {
		var row []golp.Entry
		for o, c := range yCol[i] {
			if l := allocator.Millis(p.Fronts[i][o].Latency); l != 0 {
				row = append(row, golp.Entry{Col: c, Val: sign * l})
			}
		}
		return row
	}
	for v := range p.Modules {
		for _, u := range p.Preds(v) {
			row := append([]golp.Entry{{Col: sCol[v], Val: 1}, {Col: sCol[u], Val: -1}}, latencyTerms(u, -1)...)
			if err := lp.AddConstraintSparse(row, golp.GE, 0); err != nil {
				return nil, allocator.Stats{}, fmt.Errorf("%w: %v", allocator.ErrSolver, err)
			}
		}
	}
	for _, v := range p.Sinks() {
		row := append([]golp.Entry{{Col: lmax, Val: 1}, {Col: sCol[v], Val: -1}}, latencyTerms(v, -1)...)
		if err := lp.AddConstraintSparse(row, golp.GE, 0); err != nil {
			return nil, allocator.Stats{}, fmt.Errorf("%w: %v", allocator.ErrSolver, err)
		}
	}
	for _, w := range p.CappedTypes() {
		// Instances of a capped worker type: whole ones and partial shares.
		var row []golp.Entry
		for i, front := range p.Fronts {
			for o, ch := range front {
				if u := allocator.Uses(ch, w); u > 0 {
					row = append(row, golp.Entry{Col: yCol[i][o], Val: u})
				}
			}
		}
		if len(row) == 0 {
			continue
		}
		if err := lp.AddConstraintSparse(row, golp.LE, p.Limits[w]); err != nil {
			return nil, allocator.Stats{}, fmt.Errorf("%w: %v", allocator.ErrSolver, err)
		}
	}
	lp.SetBounds(lmax, 0, allocator.Millis(p.SLO+allocator.Slack)) // the same float slack as Problem.Fits
	obj := make([]float64, cols)
	for i, front := range p.Fronts {
		for o, ch := range front {
			obj[yCol[i][o]] = ch.Cost
		}
	}
	lp.SetObjFn(obj)
	stats := allocator.Stats{Variables: cols, Rows: lp.NumRows()}

	if err := ctx.Err(); err != nil {
		return nil, stats, err
	}
	status := lp.Solve()
	stats.Status = status.String()
	switch status {
	case golp.OPTIMAL, golp.SUBOPTIMAL:
	case golp.INFEASIBLE:
		stats.Reason = "the MILP has no solution within the SLO"
		if len(p.Limits) > 0 {
			stats.Reason += " and the worker limits"
		}
		return nil, stats, nil
	default:
		return nil, stats, fmt.Errorf("%w: lp_solve returned %s", allocator.ErrSolver, status)
	}
	best := lp.Objective()

	// Pass 2: among the cheapest, the lowest critical latency.
	costRow := make([]golp.Entry, 0, cols)
	for i, front := range p.Fronts {
		for o, ch := range front {
			if ch.Cost != 0 {
				costRow = append(costRow, golp.Entry{Col: yCol[i][o], Val: ch.Cost})
			}
		}
	}
	choice := pick(lp.Variables(), yCol)
	if len(costRow) > 0 {
		lp.SetAddRowMode(true)
		// golp drops lp_solve's own status: a row that was not added
		// shows only in the row count. Pass 2 is a refinement: without
		// its row the first pass's choice stands, said in the status.
		rows := lp.NumRows()
		if err := lp.AddConstraintSparse(costRow, golp.LE, best+1e-9*math.Max(1, math.Abs(best))); err != nil || lp.NumRows() != rows+1 {
			stats.Status += fmt.Sprintf(" (second pass skipped: its cost row was not added: %v)", err)
			return choice, stats, nil
		}
		obj2 := make([]float64, cols)
		obj2[lmax] = 1
		lp.SetObjFn(obj2)
		if st := lp.Solve(); st == golp.OPTIMAL || st == golp.SUBOPTIMAL {
			if c2 := pick(lp.Variables(), yCol); p.Fits(c2) && p.OverLimits(c2) == "" && p.Cost(c2) <= p.Cost(choice)+1e-9*math.Max(1, best) {
				choice = c2
			}
		}
	}
	if !p.Fits(choice) {
		return nil, stats, fmt.Errorf("%w: the solution breaks the SLO when checked (numerical trouble)", allocator.ErrSolver)
	}
	return choice, stats, nil
}

// pick reads the chosen option of each module from the binaries.
func pick(vars []float64, yCol [][]int) []int {
	choice := make([]int, len(yCol))
	for i, cols := range yCol {
		best := 0
		for o, c := range cols {
			if vars[c] > vars[cols[best]] {
				best = o
			}
		}
		choice[i] = best
	}
	return choice
}
