package allocator

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/mdag/mdag/profile"
)

// MaxBruteForce bounds the combinations bruteforce will search.
const MaxBruteForce = 5_000_000

// bruteForce enumerates every (full config, n, partial config) of every
// module with plain loops — independently of profile.Options' pruning, so
// that it can check it — keeps each module's Pareto front, and searches
// every combination of them for the cheapest within the SLO (ties: the
// lower critical latency).
type bruteForce struct{}

func (bruteForce) Solve(ctx context.Context, p *Problem) ([]int, Stats, error) {
	fronts := make([][]profile.Choice, len(p.Modules))
	combos := 1.0
	for i := range p.Modules {
		fronts[i] = naiveOptions(p.Configs[i], p.Rates[i], p.SLO)
		combos *= float64(len(fronts[i]))
	}
	if combos > MaxBruteForce {
		return nil, Stats{}, fmt.Errorf("%w: %.3g combinations of per-module options (limit %d); use milp",
			ErrTooLarge, combos, MaxBruteForce)
	}
	stats := Stats{Status: "EXHAUSTIVE"}
	n := len(p.Modules)
	cur := make([]int, n)
	lat := make([]time.Duration, n)
	fin := make([]time.Duration, n)
	var best []int
	bestCost, bestCrit := math.Inf(1), time.Duration(math.MaxInt64)
	var walk func(i int, cost float64) error
	walk = func(i int, cost float64) error {
		if i == n {
			stats.Candidates++
			var crit time.Duration
			for _, s := range p.sinks {
				crit = max(crit, fin[s])
			}
			if cost < bestCost*(1-1e-12) || cost <= bestCost*(1+1e-12) && crit < bestCrit {
				best, bestCost, bestCrit = append([]int(nil), cur...), cost, crit
			}
			return nil
		}
		if stats.Candidates%65536 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		var start time.Duration
		for _, u := range p.preds[i] {
			start = max(start, fin[u])
		}
		for o, ch := range fronts[i] {
			if start+ch.Latency > p.SLO+Slack {
				break // the front is sorted by latency: the rest are slower
			}
			if cost+ch.Cost > bestCost*(1+1e-12) {
				continue
			}
			cur[i], lat[i], fin[i] = o, ch.Latency, start+ch.Latency
			if err := walk(i+1, cost+ch.Cost); err != nil {
				return err
			}
		}
		return nil
	}
	if err := walk(0, 0); err != nil {
		return nil, stats, err
	}
	if best == nil {
		stats.Reason = "no combination of options meets the SLO on every path"
		return nil, stats, nil
	}
	// Express the answer as indices into the problem's own fronts: the
	// option there with the same latency and cost (the fronts agree when
	// both are right; a mismatch is a bug worth failing loudly on).
	out := make([]int, n)
	for i, o := range best {
		want := fronts[i][o]
		out[i] = -1
		for k, ch := range p.Fronts[i] {
			if ch.Latency == want.Latency && math.Abs(ch.Cost-want.Cost) <= 1e-9*math.Max(1, want.Cost) {
				out[i] = k
				break
			}
		}
		if out[i] < 0 {
			return nil, stats, fmt.Errorf("allocator: bruteforce option %v of %s (%v, $%g) is missing from the option front",
				want, p.Modules[i], want.Latency, want.Cost)
		}
	}
	return out, stats, nil
}

// naiveOptions is the plain enumeration of every (m, n, p), then its front.
func naiveOptions(cfgs []profile.Config, rate float64, maxLatency time.Duration) []profile.Choice {
	if rate <= 0 {
		return []profile.Choice{{}}
	}
	var all []profile.Choice
	for mi := -1; mi < len(cfgs); mi++ { // -1: no full instances
		nmax := 0
		if mi >= 0 {
			nmax = int(math.Floor(rate/cfgs[mi].Cap*(1+1e-9) + 1e-9))
		}
		for n := 0; n <= nmax; n++ {
			if mi >= 0 && n == 0 {
				continue // n = 0 is covered once, by mi = -1
			}
			base := profile.Choice{}
			t := rate
			if n > 0 {
				m := cfgs[mi]
				base = profile.Choice{Full: m, N: n, Latency: m.Worst(), Cost: float64(n) * m.Price}
				t = rate - float64(n)*m.Cap
			}
			if t <= 1e-9*rate {
				if n > 0 {
					all = append(all, base)
				}
				continue
			}
			for _, pc := range cfgs {
				if t > pc.Cap*(1+1e-9) {
					continue
				}
				ch := base
				ch.Partial, ch.T = pc, t
				ch.Latency = max(base.Latency, pc.WorstAt(t))
				ch.Cost = base.Cost + pc.Price*t/pc.Cap
				all = append(all, ch)
			}
		}
	}
	var within []profile.Choice
	for _, ch := range all {
		if ch.Latency <= maxLatency {
			within = append(within, ch)
		}
	}
	return profile.ParetoFront(within)
}
