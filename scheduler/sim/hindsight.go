package sim

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/mdag/mdag/scheduler"
)

// Hindsight is not a scheduler: it is a reference that knows every arrival
// of the run in advance and searches for the schedule that serves the most
// requests within their SLO. No online policy can know the future, so what
// it reaches is a practical ceiling for the online policies on the same
// arrivals (`mdag sim --policy hindsight`).
//
// It handles single-model workloads without execution jitter (the schedule
// is planned on exact execution times). The search is a beam search, not an
// exact optimum: with one SLO per model the requests of a batch can be taken
// consecutive in arrival order and each batch started as early as its last
// request and a GPU allow, so a schedule is a partition of the arrival
// sequence into batches and skipped requests; the beam keeps, after each
// request, the HindsightWidth partial schedules with the lowest cost
// (requests skipped, weighted by 1.4 times the GPU time a request takes at
// the staggered batch, plus GPU time already committed beyond that request's
// arrival). Widths 64 / 256 / 1024 find goodputs of 1022 / 1029 / 1032 r/s
// for InceptionResNetV2 on 8 GPUs (the report in docs/benchmarks.md), so the
// true optimum is a little higher than what it reports.
const Hindsight scheduler.Policy = "hindsight"

// HindsightWidth is the beam width of the Hindsight reference.
var HindsightWidth = 256

// hsBatch is one batch of a hindsight schedule, linked to the one before.
type hsBatch struct {
	prev        *hsBatch
	first, size int
	start       scheduler.Time
}

// hsLayer holds the partial schedules that have decided requests [0, i).
// A schedule's newest batch is kept unlinked (pend, size 0 for none) until
// the schedule survives a pruning: most never do.
type hsLayer struct {
	drops []int
	last  []*hsBatch
	pend  []hsBatch
	free  []scheduler.Time // len(drops) x gpus, each row sorted
	score []float64        // kept states only: their rank
}

func (l *hsLayer) add(drops int, last *hsBatch, pend hsBatch, free []scheduler.Time) {
	l.drops = append(l.drops, drops)
	l.last = append(l.last, last)
	l.pend = append(l.pend, pend)
	l.free = append(l.free, free...)
}

func (l *hsLayer) reset() {
	l.drops, l.last, l.pend, l.free, l.score = l.drops[:0], l.last[:0], l.pend[:0], l.free[:0], l.score[:0]
}

// link is state k's newest batch, allocated now if it was pending.
func (l *hsLayer) link(k int) *hsBatch {
	if l.pend[k].size == 0 {
		return l.last[k]
	}
	b := l.pend[k]
	b.prev = l.last[k]
	return &b
}

type hsRank struct {
	score float64
	k     int
}

func hsCmp(x, y hsRank) int {
	switch {
	case x.score < y.score:
		return -1
	case x.score > y.score:
		return 1
	}
	return x.k - y.k // deterministic
}

// selectLeast moves the n least elements of xs (by hsCmp) to xs[:n], in
// no particular order (quickselect, median-of-three pivots).
func selectLeast(xs []hsRank, n int) {
	lo, hi := 0, len(xs)-1
	for lo < hi {
		mid := lo + (hi-lo)/2
		if hsCmp(xs[mid], xs[lo]) < 0 {
			xs[mid], xs[lo] = xs[lo], xs[mid]
		}
		if hsCmp(xs[hi], xs[lo]) < 0 {
			xs[hi], xs[lo] = xs[lo], xs[hi]
		}
		if hsCmp(xs[hi], xs[mid]) < 0 {
			xs[hi], xs[mid] = xs[mid], xs[hi]
		}
		pivot := xs[mid]
		i, j := lo, hi
		for i <= j {
			for hsCmp(xs[i], pivot) < 0 {
				i++
			}
			for hsCmp(xs[j], pivot) > 0 {
				j--
			}
			if i <= j {
				xs[i], xs[j] = xs[j], xs[i]
				i, j = i+1, j-1
			}
		}
		switch {
		case n-1 <= j:
			hi = j
		case n-1 >= i:
			lo = i
		default:
			return
		}
	}
}

// hsProblem is one hindsight search: arrivals in order, the model's batch
// latencies, its SLO, the network delay of a batch and the GPUs.
type hsProblem struct {
	arr      []scheduler.Time
	lat      []time.Duration // lat[b-1]: execution time of a batch of b
	slo      time.Duration
	net      scheduler.Network
	gpus     int
	width    int
	dropCost float64 // ns of GPU time a skipped request counts as
}

// solve returns the last batch of the best schedule found.
func (p *hsProblem) solve() *hsBatch {
	n, g, maxB := len(p.arr), p.gpus, len(p.lat)
	ring := make([]hsLayer, maxB+1) // layer i lives at ring[i % (maxB+1)]
	ring[0].add(0, nil, hsBatch{}, make([]scheduler.Time, g))
	var order []hsRank
	kept := hsLayer{}
	next := make([]scheduler.Time, g)
	for i := 0; i < n; i++ {
		cur := &ring[i%(maxB+1)]
		m := len(cur.drops)
		if m == 0 {
			continue
		}
		// Rank: skipped requests at their cost, plus GPU time committed
		// beyond this request's arrival.
		ai := p.arr[i]
		order = order[:0]
		for k := 0; k < m; k++ {
			s := float64(cur.drops[k]) * p.dropCost
			for _, f := range cur.free[k*g : (k+1)*g] {
				if f > ai {
					s += float64(f - ai)
				}
			}
			order = append(order, hsRank{s, k})
		}
		// Only the best few matter: select twice the width (duplicates
		// are skipped below), then sort those.
		if len(order) > 2*p.width {
			selectLeast(order, 2*p.width)
			order = order[:2*p.width]
		}
		slices.SortFunc(order, hsCmp)
		kept.reset()
		for _, o := range order {
			k := o.k
			if len(kept.drops) >= p.width {
				break
			}
			if p.duplicate(&kept, cur, o, ai) {
				continue
			}
			kept.add(cur.drops[k], cur.link(k), hsBatch{}, cur.free[k*g:(k+1)*g])
			kept.score = append(kept.score, o.score)
		}
		cur.reset()
		for k := range kept.drops {
			free := kept.free[k*g : (k+1)*g]
			// Skip request i.
			nx := &ring[(i+1)%(maxB+1)]
			nx.add(kept.drops[k]+1, kept.last[k], hsBatch{}, free)
			// Or start a batch of requests [i, i+b) as early as possible.
			for b := 1; b <= maxB && i+b <= n; b++ {
				ready := p.arr[i+b-1]
				run := p.net.Delay(b) + p.lat[b-1]
				if ready+run > ai+p.slo {
					break // larger batches are later still
				}
				start := max(ready, free[0])
				if start+run > ai+p.slo {
					continue
				}
				copy(next, free[1:])
				next[g-1] = start + run
				for j := g - 1; j > 0 && next[j] < next[j-1]; j-- {
					next[j], next[j-1] = next[j-1], next[j]
				}
				ring[(i+b)%(maxB+1)].add(kept.drops[k], kept.last[k], hsBatch{first: i, size: b, start: start}, next)
			}
		}
	}
	last := &ring[n%(maxB+1)]
	best, bestDrops, bestBusy := -1, math.MaxInt, scheduler.Time(math.MaxInt64)
	for k := range last.drops {
		var busy scheduler.Time
		for _, f := range last.free[k*g : (k+1)*g] {
			busy += f
		}
		if last.drops[k] < bestDrops || last.drops[k] == bestDrops && busy < bestBusy {
			best, bestDrops, bestBusy = k, last.drops[k], busy
		}
	}
	return last.link(best)
}

// duplicate reports whether state o.k of cur equals one already kept (same
// skips and, from arrival ai on, the same GPU free times): equal states
// have equal scores, so only the kept states with that score are compared.
func (p *hsProblem) duplicate(kept, cur *hsLayer, o hsRank, ai scheduler.Time) bool {
	g, k := p.gpus, o.k
	for j := len(kept.drops) - 1; j >= 0; j-- {
		if kept.score[j] != o.score {
			return false
		}
		if kept.drops[j] != cur.drops[k] {
			continue
		}
		same := true
		a, b := kept.free[j*g:(j+1)*g], cur.free[k*g:(k+1)*g]
		for x := range a {
			if max(a[x], ai) != max(b[x], ai) {
				same = false
				break
			}
		}
		if same {
			return true
		}
	}
	return false
}

// verify checks a schedule independently of the search: batches in order,
// disjoint, each started after its last request arrived on a GPU that is
// free, and finished by its first request's deadline. It returns the
// batches in order.
func (p *hsProblem) verify(last *hsBatch) ([]*hsBatch, error) {
	var bs []*hsBatch
	for b := last; b != nil; b = b.prev {
		bs = append(bs, b)
	}
	slices.Reverse(bs)
	free := make([]scheduler.Time, p.gpus)
	next := 0
	for _, b := range bs {
		if b.first < next || b.size < 1 || b.size > len(p.lat) || b.first+b.size > len(p.arr) {
			return nil, fmt.Errorf("hindsight: batch at request %d of %d overlaps or is out of range", b.first, b.size)
		}
		next = b.first + b.size
		if b.start < p.arr[b.first+b.size-1] {
			return nil, fmt.Errorf("hindsight: batch at request %d starts before its last request arrives", b.first)
		}
		gi := slices.Index(free, slices.Min(free))
		if free[gi] > b.start {
			return nil, fmt.Errorf("hindsight: batch at request %d starts while every GPU is busy", b.first)
		}
		end := b.start + p.net.Delay(b.size) + p.lat[b.size-1]
		if end > p.arr[b.first]+p.slo {
			return nil, fmt.Errorf("hindsight: batch at request %d misses its deadline", b.first)
		}
		free[gi] = end
	}
	return bs, nil
}

// runHindsight plans the Hindsight schedule for the workload's arrivals at
// the given total rate and reports it like a simulation.
func runHindsight(w *Workload, total float64) (*Result, []outcome, error) {
	if len(w.Models) != 1 {
		return nil, nil, fmt.Errorf("policy hindsight: single-model workloads only (this one has %d models)", len(w.Models))
	}
	if w.Jitter != 0 {
		return nil, nil, fmt.Errorf("policy hindsight: needs exact execution times (jitter %g; use 0)", w.Jitter)
	}
	rates := w.rates(total)
	m := w.Models[0]
	// The same arrivals as Run: one model, no jitter, so the generator is
	// the only user of the random stream.
	rng := rand.New(rand.NewPCG(w.Seed, 0x6d646167))
	gen := newArrivals(w, rates, 0, rng)
	end := scheduler.Time(w.Duration)
	p := &hsProblem{lat: m.latency, slo: m.SLO, gpus: w.GPUs, width: max(1, HindsightWidth),
		net: scheduler.Network{Control: w.Network.Control, PerRequest: w.Network.PerRequest}}
	for t := gen.next(0); t < end; t = gen.next(t) {
		p.arr = append(p.arr, t)
	}
	// A skipped request costs 1.4 times the GPU time a request takes at the
	// staggered batch (largest b with (1 + 1/N) l(b) <= SLO): found best
	// among 1-3x on ResNet50 and InceptionResNetV2.
	target := scheduler.StaggeredBatch(p.lat, p.slo, p.gpus)
	p.dropCost = 1.4 * float64(p.lat[target-1]) / float64(target)
	r := &Result{Policy: Hindsight, OfferedRPS: rates[0], Dropped: map[string]int{}, BatchHistogram: map[int]int{}}
	outs := make([]outcome, len(p.arr))
	var busy time.Duration
	if len(p.arr) > 0 {
		bs, err := p.verify(p.solve())
		if err != nil {
			return nil, nil, err
		}
		for _, b := range bs {
			run := p.net.Delay(b.size) + p.lat[b.size-1]
			busy += p.lat[b.size-1]
			r.BatchHistogram[b.size]++
			for i := b.first; i < b.first+b.size; i++ {
				outs[i] = outcome{arrival: p.arr[i], done: true, good: true, batch: b.size,
					latency: b.start + run - p.arr[i], queue: b.start + p.net.Delay(b.size) - p.arr[i]}
			}
		}
	}
	for i := range outs {
		if !outs[i].done {
			outs[i].arrival = p.arr[i]
			r.Dropped["skipped"]++
		}
	}
	r.Events = len(p.arr) // it plans from the arrivals alone
	r.VirtualSeconds = float64(end) / float64(time.Second)
	summarize(r, w, outs, rates, busy, end)
	return r, outs, nil
}
