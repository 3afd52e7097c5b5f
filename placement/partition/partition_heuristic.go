package partition

import (
	"cmp"
	"math"
	"slices"
)

// partState tracks an assignment's per-sub-cluster sums so that a move or a
// swap is scored in O(sub-clusters).
type partState struct {
	r      *Request
	assign []int
	rate   []float64
	mem    []float64 // static MiB
	moves  float64
	meanR  float64
	meanS  float64
}

func newPartState(r *Request, assign []int) *partState {
	st := &partState{r: r, assign: assign, rate: make([]float64, r.SubClusters), mem: make([]float64, r.SubClusters)}
	for i, m := range r.Models {
		st.rate[assign[i]] += m.Rate
		st.mem[assign[i]] += mib(m.Static)
		st.moves += st.moveCost(i, assign[i])
		st.meanR += m.Rate
		st.meanS += mib(m.Static)
	}
	st.meanR /= float64(r.SubClusters)
	st.meanS /= float64(r.SubClusters)
	return st
}

func (st *partState) moveCost(i, j int) float64 {
	m := st.r.Models[i]
	switch {
	case m.Current < 0:
		return m.MoveCost
	case m.Current != j:
		return 2 * m.MoveCost
	}
	return 0
}

func (st *partState) objective() float64 {
	var dr, ds float64
	for j := range st.rate {
		dr = math.Max(dr, math.Abs(st.rate[j]-st.meanR))
		ds = math.Max(ds, math.Abs(st.mem[j]-st.meanS))
	}
	return dr + st.r.W*ds
}

// fits checks sub-cluster j's rate and memory limits.
func (st *partState) fits(j int) bool {
	r := st.r
	if r.MaxRate > 0 && st.rate[j] > r.MaxRate*(1+1e-9) {
		return false
	}
	if r.MaxMemory > 0 {
		dyn := 0.0
		for i, a := range st.assign {
			if a == j {
				dyn = math.Max(dyn, mib(r.Models[i].Dynamic))
			}
		}
		if st.mem[j]+dyn > mib(r.MaxMemory)*(1+1e-9) {
			return false
		}
	}
	return true
}

func (st *partState) movesOK() bool { return st.r.MaxMoveCost < 0 || st.moves <= st.r.MaxMoveCost+1e-9 }

// move puts model i on sub-cluster j (no checks).
func (st *partState) move(i, j int) {
	m, from := st.r.Models[i], st.assign[i]
	st.rate[from] -= m.Rate
	st.mem[from] -= mib(m.Static)
	st.moves += st.moveCost(i, j) - st.moveCost(i, from)
	st.assign[i] = j
	st.rate[j] += m.Rate
	st.mem[j] += mib(m.Static)
}

// heuristicPartition: models by decreasing combined load go to the feasible
// sub-cluster that keeps the objective lowest (models with a current
// sub-cluster and a tight move budget stay where they are), then single
// moves and pairwise swaps are applied while they lower the objective.
// Deterministic. ok is false when no feasible assignment was found.
func (r *Request) heuristicPartition() (Result, bool) {
	m, k := len(r.Models), r.SubClusters
	order := make([]int, m)
	for i := range order {
		order[i] = i
	}
	var sumR, sumS float64
	for _, md := range r.Models {
		sumR += md.Rate
		sumS += mib(md.Static)
	}
	load := func(i int) float64 {
		l := 0.0
		if sumR > 0 {
			l += r.Models[i].Rate / sumR
		}
		if sumS > 0 {
			l += mib(r.Models[i].Static) / sumS
		}
		return l
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(load(b), load(a)) })
	assign := make([]int, m)
	for i := range assign {
		assign[i] = -1
	}
	st := &partState{r: r, assign: assign, rate: make([]float64, k), mem: make([]float64, k)}
	st.meanR, st.meanS = sumR/float64(k), sumS/float64(k)
	// Models that may not move (no budget) keep their sub-cluster first.
	keep := r.MaxMoveCost == 0
	for _, i := range order {
		if c := r.Models[i].Current; c >= 0 && keep {
			assign[i] = c
			st.rate[c] += r.Models[i].Rate
			st.mem[c] += mib(r.Models[i].Static)
		}
	}
	for _, i := range order {
		if assign[i] >= 0 {
			continue
		}
		best, bestObj := -1, math.Inf(1)
		for j := 0; j < k; j++ {
			assign[i] = j
			st.rate[j] += r.Models[i].Rate
			st.mem[j] += mib(r.Models[i].Static)
			if st.fits(j) {
				// Prefer staying put: it costs no move.
				obj := st.objective() + 1e-9*st.moveCost(i, j)
				if obj < bestObj {
					best, bestObj = j, obj
				}
			}
			st.rate[j] -= r.Models[i].Rate
			st.mem[j] -= mib(r.Models[i].Static)
		}
		if best < 0 {
			return Result{}, false
		}
		assign[i] = best
		st.rate[best] += r.Models[i].Rate
		st.mem[best] += mib(r.Models[i].Static)
	}
	st.moves = 0
	for i := range assign {
		st.moves += st.moveCost(i, assign[i])
	}
	if !st.movesOK() {
		return Result{}, false
	}
	cur := st.objective()
	for pass := 0; pass < 50; pass++ {
		improved := false
		for i := 0; i < m; i++ {
			from := assign[i]
			for j := 0; j < k; j++ {
				if j == from {
					continue
				}
				st.move(i, j)
				if obj := st.objective(); obj < cur-1e-9 && st.fits(j) && st.movesOK() {
					cur, from, improved = obj, j, true
					continue
				}
				st.move(i, from)
			}
		}
		for a := 0; a < m; a++ {
			for b := a + 1; b < m; b++ {
				ja, jb := assign[a], assign[b]
				if ja == jb {
					continue
				}
				st.move(a, jb)
				st.move(b, ja)
				if obj := st.objective(); obj < cur-1e-9 && st.fits(ja) && st.fits(jb) && st.movesOK() {
					cur, improved = obj, true
					continue
				}
				st.move(b, jb)
				st.move(a, ja)
			}
		}
		if !improved {
			break
		}
	}
	p := r.evaluate("greedy", slices.Clone(assign))
	return p, p.Feasible
}
