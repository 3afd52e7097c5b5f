package serf

import (
	"fmt"
	"math"
	"math/rand/v2"
)

// Interference says how a request's service responds to the number of
// requests in service, in Simulate.
type Interference int

const (
	// AtStart fixes a request's service time when it starts: 1/mu_k, k the
	// number in service counting itself. This is the assumption behind
	// Eq. 12 (the concurrency an arrival sees decides its service time).
	AtStart Interference = iota
	// Shared gives every request one unit of work that progresses at mu_k
	// while k requests are in service, so its speed changes whenever
	// another starts or finishes: the interference a CPU worker really has
	// (caches and memory bandwidth shared with whoever runs right now).
	Shared
)

func (m Interference) String() string {
	switch m {
	case AtStart:
		return "at-start"
	case Shared:
		return "shared"
	}
	return fmt.Sprintf("Interference(%d)", int(m))
}

// SimResult is what Simulate measured over the requests after warm-up.
type SimResult struct {
	Requests int     `json:"requests"` // measured (after warm-up)
	Latency  float64 `json:"latency"`  // mean response time, s
	Wait     float64 `json:"wait"`     // mean time queued before starting, s
	Service  float64 `json:"service"`  // mean time from start to finish, s
	// HalfWidth is the half-width of a 95% confidence interval on Latency
	// by batch means (20 batches in arrival order).
	HalfWidth float64 `json:"halfWidth"`
}

const simBatches = 20

// Simulate runs a discrete-event simulation of the M/D_interf/c queue:
// Poisson arrivals at rate lambda, c = len(mu) service slots, FCFS, and a
// deterministic service whose speed depends on how many requests are in
// service (mode). It simulates warm + n requests from an empty system,
// seeded, and measures the last n by arrival order.
func Simulate(mu []float64, lambda float64, mode Interference, n, warm int, seed uint64) (SimResult, error) {
	if err := checkMu(mu); err != nil {
		return SimResult{}, err
	}
	if !(lambda > 0) || math.IsInf(lambda, 0) {
		return SimResult{}, fmt.Errorf("serf: simulate: lambda must be a finite rate > 0, got %g", lambda)
	}
	if lambda >= Capacity(mu) {
		return SimResult{}, fmt.Errorf("serf: simulate: lambda %g: %w %g", lambda, ErrUnstable, Capacity(mu))
	}
	if n < simBatches || warm < 0 {
		return SimResult{}, fmt.Errorf("serf: simulate: want n >= %d measured and warm >= 0 requests, got n=%d warm=%d", simBatches, n, warm)
	}
	if mode != AtStart && mode != Shared {
		return SimResult{}, fmt.Errorf("serf: simulate: unknown interference mode %d", int(mode))
	}
	c := len(mu)
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	total := warm + n

	type job struct {
		idx        int
		arr, start float64
		fin        float64 // AtStart: finish time; Shared: work-clock value at which it finishes
	}
	var (
		now       float64
		work      float64 // Shared: the work clock, advancing at mu_k while k serve
		next      = rng.ExpFloat64() / lambda
		arrived   int
		queue     []job // FCFS; head at queue[qh]
		qh        int
		serving   = make([]job, 0, c)
		sumL      [simBatches]float64
		sumW      float64
		sumS      float64
		perBatch  = (n + simBatches - 1) / simBatches
		completed int
	)
	start := func(j job) {
		j.start = now
		k := len(serving) + 1
		if mode == AtStart {
			j.fin = now + 1/mu[k-1]
		} else {
			j.fin = work + 1
		}
		serving = append(serving, j)
	}
	for completed < total {
		// The next departure: the in-service job finishing first.
		dep, di := math.Inf(1), -1
		for i, j := range serving {
			var t float64
			if mode == AtStart {
				t = j.fin
			} else {
				t = now + (j.fin-work)/mu[len(serving)-1]
			}
			if t < dep {
				dep, di = t, i
			}
		}
		if arrived < total && next < dep {
			if mode == Shared && len(serving) > 0 {
				work += (next - now) * mu[len(serving)-1]
			}
			now = next
			j := job{idx: arrived, arr: now}
			arrived++
			next = now + rng.ExpFloat64()/lambda
			if len(serving) < c {
				start(j)
			} else {
				queue = append(queue, j)
			}
			continue
		}
		if mode == Shared {
			work = serving[di].fin // exact: no drift from accumulated products
		}
		now = dep
		j := serving[di]
		serving = append(serving[:di], serving[di+1:]...)
		completed++
		if j.idx >= warm {
			m := j.idx - warm
			sumL[m/perBatch] += now - j.arr
			sumW += j.start - j.arr
			sumS += now - j.start
		}
		if qh < len(queue) {
			start(queue[qh])
			qh++
			if qh > 4096 && qh*2 > len(queue) {
				queue = append(queue[:0], queue[qh:]...)
				qh = 0
			}
		}
	}
	res := SimResult{Requests: n, Wait: sumW / float64(n), Service: sumS / float64(n)}
	var total2 float64
	var means []float64
	for b := 0; b < simBatches; b++ {
		size := min(perBatch, n-b*perBatch)
		if size <= 0 {
			break
		}
		total2 += sumL[b]
		means = append(means, sumL[b]/float64(size))
	}
	res.Latency = total2 / float64(n)
	var ss float64
	for _, m := range means {
		ss += (m - res.Latency) * (m - res.Latency)
	}
	if k := len(means); k > 1 {
		// t quantile 0.975 with 19 degrees of freedom: 2.093.
		res.HalfWidth = 2.093 * math.Sqrt(ss/float64(k-1)/float64(k))
	}
	return res, nil
}
