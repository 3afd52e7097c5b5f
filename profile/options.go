package profile

import (
	"cmp"
	"math"
	"slices"
	"sort"
	"time"
)

// Options returns the Pareto front of the ways to carry rate with cfgs under
// Scrooge's allocation model: n >= 0 full instances of one configuration m
// plus at most one partial instance of any configuration p carrying the
// residual t = rate - n*cap_m, 0 < t <= cap_p. Each choice's latency is the
// worst of its instances (W_m = d_m + b_m/cap_m for full ones, d_p + b_p/t for
// the partial) and its cost n*price_m + price_p*t/cap_p.
//
// The front is sorted by increasing latency and strictly decreasing cost:
// every choice left out is matched or beaten on both by one kept, so a
// planner that picks from the front loses nothing. Choices slower than
// maxLatency (when > 0) are left out. A rate <= 0 yields the single idle
// choice.
//
// The enumeration is exact: for each full configuration m and each n, the
// residual t is fixed, and partial candidates dominated in all of (d, b, cap,
// price per unit of capacity) by another are skipped, since the other gives
// a partial at least as fast and as cheap for every t it can carry.
func Options(cfgs []Config, rate float64, maxLatency time.Duration) []Choice {
	if rate <= 0 {
		return []Choice{{}}
	}
	partials := partialCandidates(cfgs)
	// Candidates are kept compact (indices, not Configs) until the front is
	// known: there can be hundreds of thousands at 30 worker types.
	type cand struct {
		lat   time.Duration
		cost  float64
		m, p  int32 // indices into cfgs and partials; -1 for none
		n     int32
		order int32 // enumeration order, for deterministic ties
	}
	var all []cand
	within := func(l time.Duration) bool { return maxLatency <= 0 || l <= maxLatency }
	addPartials := func(m, n int, baseLat time.Duration, baseCost, t float64) {
		// Partials no slower than the full instances all give latency
		// baseLat: only the cheapest of them can be on the front.
		cheapest := -1
		var cheapestCost float64
		for pi, p := range partials {
			if t > p.Cap*(1+rateEps) {
				continue
			}
			lat := p.WorstAt(t)
			cost := baseCost + p.Price*t/p.Cap
			if lat <= baseLat {
				if cheapest < 0 || cost < cheapestCost {
					cheapest, cheapestCost = pi, cost
				}
				continue
			}
			if within(lat) {
				all = append(all, cand{lat, cost, int32(m), int32(pi), int32(n), int32(len(all))})
			}
		}
		if cheapest >= 0 && within(baseLat) {
			all = append(all, cand{baseLat, cheapestCost, int32(m), int32(cheapest), int32(n), int32(len(all))})
		}
	}
	addPartials(-1, 0, 0, 0, rate)
	for mi, m := range cfgs {
		if !within(m.Worst()) {
			continue
		}
		nmax := int(math.Floor(rate/m.Cap*(1+rateEps) + rateEps))
		for n := 1; n <= nmax; n++ {
			cost := float64(n) * m.Price
			t := rate - float64(n)*m.Cap
			if t <= rateEps*rate {
				all = append(all, cand{m.Worst(), cost, int32(mi), -1, int32(n), int32(len(all))})
				continue
			}
			addPartials(mi, n, m.Worst(), cost, t)
		}
	}
	slices.SortFunc(all, func(a, b cand) int {
		switch {
		case a.lat != b.lat:
			return cmp.Compare(a.lat, b.lat)
		case a.cost != b.cost:
			return cmp.Compare(a.cost, b.cost)
		}
		return cmp.Compare(a.order, b.order)
	})
	var front []Choice
	for _, c := range all {
		if len(front) > 0 && c.cost >= front[len(front)-1].Cost*(1-1e-12) {
			continue
		}
		ch := Choice{Latency: c.lat, Cost: c.cost, N: int(c.n)}
		if c.m >= 0 {
			ch.Full = cfgs[c.m]
		}
		if c.p >= 0 {
			ch.Partial = partials[c.p]
			ch.T = rate - float64(c.n)*ch.Full.Cap
			if c.m < 0 {
				ch.T = rate
			}
		}
		front = append(front, ch)
	}
	return front
}

// ParetoFront sorts choices by latency and keeps those strictly cheaper than
// every faster one (ties in latency keep the cheapest; ties in both keep the
// first in enumeration order).
func ParetoFront(all []Choice) []Choice {
	sort.SliceStable(all, func(i, j int) bool {
		if all[i].Latency != all[j].Latency {
			return all[i].Latency < all[j].Latency
		}
		return all[i].Cost < all[j].Cost
	})
	var front []Choice
	for _, ch := range all {
		if len(front) == 0 || ch.Cost < front[len(front)-1].Cost*(1-1e-12) {
			front = append(front, ch)
		}
	}
	return front
}

// partialCandidates drops configurations that another beats or matches as a
// partial instance on every count: batch execution time, batch size,
// capacity and price per unit of capacity. Among identical ones the first
// is kept.
func partialCandidates(cfgs []Config) []Config {
	var out []Config
	for i, p := range cfgs {
		dominated := false
		for j, q := range cfgs {
			if i == j {
				continue
			}
			qUnit, pUnit := q.Price/q.Cap, p.Price/p.Cap
			if q.Latency <= p.Latency && q.Batch <= p.Batch && q.Cap >= p.Cap && qUnit <= pUnit {
				same := q.Latency == p.Latency && q.Batch == p.Batch && q.Cap == p.Cap && qUnit == pUnit
				if !same || j < i {
					dominated = true
					break
				}
			}
		}
		if !dominated {
			out = append(out, p)
		}
	}
	return out
}
