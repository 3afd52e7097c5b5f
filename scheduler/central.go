package scheduler

import (
	"math"
	"slices"
	"time"
)

// rule is what distinguishes the central policies.
type rule int

const (
	symphonyRule  rule = iota // non-work-conserving: sched_at and beta*lambda
	clockworkRule             // work-conserving: earliest deadline, largest batch that meets it
	lazyRule                  // work-conserving FIFO across models; drops only at dispatch
)

type modelState struct {
	m       Model
	target  int // the staggered batch: largest b with (1 + 1/N) l(b) <= SLO (Symphony Eq. 2)
	ngpus   int // GPUs that have the model
	beta    time.Duration
	q       []Request // by deadline (one SLO per model: arrival order)
	head    int
	gap     float64 // EWMA of inter-arrival gaps, ns (about the last 20)
	slowGap float64 // the same over about the last 1000: sustained load
	slowSq  float64 // EWMA of squared gaps over about the last 1000: arrival variability
	cap     int     // batchCap, recomputed when a request arrives
	last    Time
	arrived bool
	allowed map[GPUID]bool // nil: every GPU
	est     *modelEst
	wake    Time // when this model next needs a tick
}

func (ms *modelState) queued() []Request { return ms.q[ms.head:] }

func (ms *modelState) pop(n int) []Request {
	out := slices.Clone(ms.q[ms.head : ms.head+n])
	ms.head += n
	if ms.head > 1024 && ms.head*2 > len(ms.q) {
		ms.q = append(ms.q[:0], ms.q[ms.head:]...)
		ms.head = 0
	}
	return out
}

type gpuState struct {
	id     GPUID
	freeAt Time
	busy   bool
	held   int // Hold: out of service while > 0
}

// free says whether g can take a batch at now.
func (g *gpuState) free(now Time) bool { return !g.busy && g.held == 0 && g.freeAt <= now }

type central struct {
	rule    rule
	net     Network
	models  []*modelState
	byID    map[ModelID]*modelState
	gpus    []*gpuState
	byGPU   map[GPUID]*gpuState
	est     *Estimator
	actions []*Action
	drops   []Drop
	next    Time
	nextAct uint64
	actStep uint64 // action IDs go nextAct+actStep, ...: shards of Parallel interleave
	// subClusters: some model is loaded on only some GPUs.
	subClusters bool
	noShed      bool
}

func newCentral(cfg Config, r rule) *central {
	s := &central{rule: r, net: cfg.Network, byID: map[ModelID]*modelState{}, byGPU: map[GPUID]*gpuState{},
		est: newEstimator(cfg.Models), next: Never, actStep: 1, noShed: cfg.NoLoadShed}
	for _, m := range cfg.Models {
		ms := &modelState{m: m, beta: m.Beta}
		if ms.beta == 0 {
			ms.beta = fitBeta(m.Latency)
		}
		if len(m.GPUs) > 0 {
			s.subClusters = true
			ms.allowed = map[GPUID]bool{}
			for _, g := range m.GPUs {
				ms.allowed[g] = true
			}
		}
		s.models = append(s.models, ms)
		s.byID[m.ID] = ms
	}
	for _, ms := range s.models {
		ms.est = s.est.models[ms.m.ID]
	}
	for _, g := range cfg.GPUs {
		gs := &gpuState{id: g}
		s.gpus = append(s.gpus, gs)
		s.byGPU[g] = gs
	}
	for _, ms := range s.models {
		n := len(cfg.GPUs)
		if ms.allowed != nil {
			n = len(ms.allowed)
		}
		ms.target, ms.ngpus = StaggeredBatch(ms.m.Latency, ms.m.SLO, n), n
	}
	return s
}

// StaggeredBatch is Symphony Eq. 2's batch for a model on n GPUs: the
// largest b with (1 + 1/n) l(b) <= SLO (at least 1), where latency[b-1] is
// l(b).
func StaggeredBatch(latency []time.Duration, slo time.Duration, n int) int {
	target := 1
	for b, l := range latency {
		if float64(l)*(1+1/float64(n)) <= float64(slo) {
			target = b + 1
		}
	}
	return target
}

// fitBeta is the intercept of the least-squares line through l(b).
func fitBeta(l []time.Duration) time.Duration {
	if len(l) == 1 {
		return l[0]
	}
	var n, sx, sy, sxx, sxy float64
	for i, d := range l {
		x, y := float64(i+1), float64(d)
		n, sx, sy, sxx, sxy = n+1, sx+x, sy+y, sxx+x*x, sxy+x*y
	}
	alpha := (n*sxy - sx*sy) / (n*sxx - sx*sx)
	return time.Duration(math.Max(0, (sy-alpha*sx)/n))
}

func (s *central) Estimator() *Estimator { return s.est }

func (s *central) Take() ([]*Action, []Drop) {
	a, d := s.actions, s.drops
	s.actions, s.drops = nil, nil
	return a, d
}

func (s *central) Next() Time { return s.next }

func (s *central) Arrive(now Time, r Request) {
	if !s.enqueue(now, r) {
		return
	}
	if s.rule == symphonyRule && !s.anyFree(now) {
		// No GPU to give: the candidate just grew. Only this model's
		// wake-up time can have moved.
		ms := s.byID[r.Model]
		ms.wake = s.modelWake(now, ms, false)
		s.next = Never
		for _, o := range s.models {
			s.next = min(s.next, o.wake)
		}
		return
	}
	s.schedule(now, true)
}

// enqueue adds a request to its model's queue in deadline order and updates
// the model's rate estimate; false when no GPU serves the model.
func (s *central) enqueue(now Time, r Request) bool {
	ms := s.byID[r.Model]
	if ms == nil {
		s.drops = append(s.drops, Drop{Request: r, Reason: DropNoGPU, At: now})
		return false
	}
	if ms.arrived {
		g := float64(now - ms.last)
		if ms.gap == 0 {
			ms.gap, ms.slowGap, ms.slowSq = g, g, g*g
		} else {
			ms.gap = 0.95*ms.gap + 0.05*g
			ms.slowGap = 0.999*ms.slowGap + 0.001*g
			ms.slowSq = 0.999*ms.slowSq + 0.001*g*g
		}
		ms.cap = s.computeCap(ms)
	}
	ms.last, ms.arrived = now, true
	// Requests of one model share an SLO, so arrival order is deadline
	// order; a request with an earlier deadline (a re-queued one, or a
	// caller's own deadline) is inserted in place.
	q := ms.queued()
	if len(q) == 0 || q[len(q)-1].Deadline <= r.Deadline {
		ms.q = append(ms.q, r)
	} else {
		i, _ := slices.BinarySearchFunc(q, r.Deadline, func(a Request, d Time) int {
			if a.Deadline <= d {
				return -1
			}
			return 1
		})
		ms.q = slices.Insert(ms.q, ms.head+i, r)
	}
	return true
}

func (s *central) anyFree(now Time) bool {
	for _, g := range s.gpus {
		if g.free(now) {
			return true
		}
	}
	return false
}

func (s *central) Finished(now Time, a *Action, measured time.Duration) {
	if g := s.byGPU[a.GPU]; g != nil {
		g.busy, g.freeAt = false, now
	}
	s.est.Record(a.Model, len(a.Requests), measured)
	s.schedule(now, true)
}

func (s *central) Rejected(now Time, a *Action) {
	if g := s.byGPU[a.GPU]; g != nil {
		g.busy, g.freeAt = false, now
	}
	for _, r := range a.Requests {
		// Back in line (in deadline order), without counting as arrivals
		// for the rate estimate; dropped below if it can no longer finish.
		ms := s.byID[r.Model]
		gap, slow, sq, last := ms.gap, ms.slowGap, ms.slowSq, ms.last
		s.enqueue(now, r)
		ms.gap, ms.slowGap, ms.slowSq, ms.last = gap, slow, sq, last
		ms.cap = s.computeCap(ms)
	}
	s.schedule(now, true)
}

func (s *central) Tick(now Time) { s.schedule(now, true) }

func (s *central) Hold(now Time, id GPUID, held bool) {
	g := s.byGPU[id]
	if g == nil {
		return
	}
	if held {
		g.held++
		s.schedule(now, false) // a wake-up set for it may be moot
		return
	}
	if g.held > 0 {
		g.held--
	}
	s.schedule(now, true)
}

// feasible is the largest batch of ms's queue that, dispatched now, finishes
// by the earliest deadline among its requests (the head's).
func (s *central) feasible(now Time, ms *modelState) int {
	q := ms.queued()
	if len(q) == 0 {
		return 0
	}
	maxB := min(len(q), len(ms.m.Latency))
	if s.rule == symphonyRule {
		// The cap decides when a candidate is full (schedAt); a backlog
		// that has already queued up may still go out in a batch up to
		// the staggered one, which spends less GPU time per request: on
		// 8 GPUs with Poisson arrivals this took goodput from 90.3% to
		// 91.4% of the staggered bound on InceptionResNetV2 and from
		// 93.7% to 94.7% on ResNet50 (docs/benchmarks.md).
		maxB = min(maxB, max(s.batchCap(ms), ms.target))
	}
	dl := q[0].Deadline
	// l(b) and delay(b) grow with b: the largest b that fits is found by
	// binary search.
	lo, hi := 0, maxB // fits(lo) holds (0 trivially); find the last b that fits
	for lo < hi {
		mid := (lo + hi + 1) / 2
		if now+s.net.Delay(mid)+ms.est.estimate(mid) <= dl {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return lo
}

// prune drops, from the head of ms's queue, requests that cannot finish
// even alone if dispatched now.
func (s *central) prune(now Time, ms *modelState) {
	for q := ms.queued(); len(q) > 0; q = ms.queued() {
		if now+s.net.Delay(1)+ms.est.estimate(1) <= q[0].Deadline {
			return
		}
		s.drops = append(s.drops, Drop{Request: ms.pop(1)[0], Reason: DropExpired, At: now})
	}
}

// hasFree reports whether a GPU that has the model is free; anyFree is
// s.anyFree(now), computed once by the caller for the common case of models
// loaded everywhere.
func (s *central) hasFree(now Time, ms *modelState, anyFree bool) bool {
	if ms.allowed == nil {
		return anyFree
	}
	return s.freeGPU(now, ms) != nil
}

// freeGPU returns a free GPU that has the model (lowest ID), or nil.
func (s *central) freeGPU(now Time, ms *modelState) *gpuState {
	for _, g := range s.gpus {
		if g.free(now) && (ms.allowed == nil || ms.allowed[g.id]) {
			return g
		}
	}
	return nil
}

// schedule dispatches while a free GPU and a schedulable candidate meet,
// then sets the next wake-up. With dispatch false it only updates Next.
func (s *central) schedule(now Time, dispatch bool) {
	if dispatch && !s.anyFree(now) && s.rule != lazyRule {
		// Nothing can be dispatched, but what cannot finish any more is
		// dropped now, not when a GPU frees.
		for _, ms := range s.models {
			s.prune(now, ms)
		}
	}
	for dispatch && s.anyFree(now) {
		free := true
		var best *modelState
		var bestKey Time
		var bestB int
		bestEff := -1.0
		for _, ms := range s.models {
			if s.rule != lazyRule {
				s.prune(now, ms)
			}
			if len(ms.queued()) == 0 || !s.hasFree(now, ms, free) {
				continue
			}
			if s.rule == lazyRule {
				s.prune(now, ms) // lazy: only when it is about to dispatch
				if len(ms.queued()) == 0 {
					continue
				}
			}
			k := s.feasible(now, ms)
			var key Time
			switch s.rule {
			case symphonyRule:
				schedAt, ok := s.schedulable(now, ms, k)
				if !ok {
					continue
				}
				key = schedAt // the most stringent candidate first
			case clockworkRule:
				key = ms.queued()[0].Deadline
			case lazyRule:
				key = ms.queued()[0].Arrival
			}
			if s.rule == symphonyRule {
				// Throughput per GPU-second first: under overload this keeps
				// batches large; with one schedulable candidate it is moot.
				eff := float64(k) / ms.est.estimate(max(k, 1)).Seconds()
				if best == nil || moreUseful(eff, key, bestEff, bestKey) {
					best, bestKey, bestB, bestEff = ms, key, k, eff
				}
				continue
			}
			if best == nil || key < bestKey {
				best, bestKey, bestB = ms, key, k
			}
		}
		if best == nil {
			break
		}
		s.dispatch(now, best, bestB)
	}
	s.next = s.wakeup(now)
}

// schedulable applies Symphony's rule to a candidate of k requests: it is
// schedulable when it holds at least beta*lambda requests, when it cannot
// grow (the model's largest batch, or one more request would miss the
// deadline), or once now reaches sched_at = dl - l(k+1) - delay(k+1).
func (s *central) schedulable(now Time, ms *modelState, k int) (Time, bool) {
	schedAt := s.schedAt(ms, k)
	if now >= schedAt {
		return schedAt, true
	}
	if ms.gap > 0 && float64(k) >= float64(ms.beta)/ms.gap {
		return schedAt, true
	}
	return schedAt, false
}

func (s *central) schedAt(ms *modelState, k int) Time {
	if k >= len(ms.m.Latency) || s.rule == symphonyRule && k >= s.batchCap(ms) {
		return math.MinInt64 / 2 // full: nothing to wait for
	}
	dl := ms.queued()[0].Deadline
	return dl - ms.est.estimate(k+1) - s.net.Delay(k+1)
}

func (s *central) dispatch(now Time, ms *modelState, k int) {
	if s.rule == symphonyRule {
		if !s.noShed {
			k = s.earlyDrop(now, ms, k)
		}
	}
	g := s.freeGPU(now, ms)
	reqs := ms.pop(k)
	exp := ms.est.estimate(k)
	earliest := now + s.net.Delay(k)
	s.nextAct += s.actStep
	a := &Action{ID: s.nextAct, GPU: g.id, Model: ms.m.ID, Requests: reqs, Earliest: earliest,
		Latest: reqs[0].Deadline - exp, Expected: exp}
	g.busy, g.freeAt = true, earliest+exp
	s.actions = append(s.actions, a)
}

// wakeup is the earliest time something changes without an event: a
// candidate reaching sched_at, or a queue head becoming undeliverable.
func (s *central) wakeup(now Time) Time {
	next := Never
	free := s.anyFree(now)
	for _, ms := range s.models {
		ms.wake = s.modelWake(now, ms, s.hasFree(now, ms, free))
		next = min(next, ms.wake)
	}
	return next
}

func (s *central) modelWake(now Time, ms *modelState, free bool) Time {
	q := ms.queued()
	if len(q) == 0 {
		return Never
	}
	next := Never
	if s.rule != lazyRule {
		if t := q[0].Deadline - s.net.Delay(1) - ms.est.estimate(1) + 1; t > now {
			next = t
		}
	}
	if s.rule == symphonyRule && free {
		if t := s.schedAt(ms, s.feasible(now, ms)); t > now {
			next = min(next, t)
		}
	}
	return next
}

// earlyDrop, under backlog, trades the oldest requests for a bigger batch:
// when the head only fits a batch k smaller than the one the model's
// estimated rate needs on its GPUs (the smallest b with N b / l(b) >= lambda,
// at most the staggered batch of Symphony Eq. 2), it dispatches the largest
// batch up to that size which younger requests can fill, dropping the
// requests before them. Without backlog, or when small batches keep up,
// nothing is dropped. Returns the batch size to dispatch.
func (s *central) earlyDrop(now Time, ms *modelState, k int) int {
	q := ms.queued()
	if len(q) <= k || ms.gap <= 0 {
		return k
	}
	need, overloaded := s.need(ms)
	if k >= need {
		return k
	}
	smallest := need // not overloaded: a full batch of `need` or nothing
	if overloaded {
		smallest = k + 1 // overloaded: any bigger batch beats the head's
	}
	// The largest batch b in (k, need] that younger requests can fill: skip
	// (drop) the requests before the first whose deadline allows b.
	// Deadlines only grow along the queue, so each b is a binary search.
	// Everything skipped could only go out in smaller batches; under
	// overload that is what collapses goodput (Symphony Figure 10's flat top).
	for b := need; b >= smallest; b-- {
		th := now + s.net.Delay(b) + ms.est.estimate(b)
		i, _ := slices.BinarySearchFunc(q, th, func(r Request, t Time) int {
			if r.Deadline < t {
				return -1
			}
			return 1
		})
		if i > 0 && len(q)-i >= b {
			for _, r := range ms.pop(i) {
				s.drops = append(s.drops, Drop{Request: r, Reason: DropEarly, At: now})
			}
			return b
		}
	}
	return k
}

// need is the batch the model's estimated rate needs on its share of the
// GPUs: the smallest b with N_m b / l(b) >= lambda_m, at most the staggered
// batch, where N_m is the model's GPUs times its share of the load (its
// rate times its per-request time at the staggered batch, against all
// models'): with many models, each gets only part of the cluster.
// overloaded says even the staggered batch cannot keep up with the
// model's sustained rate.
func (s *central) need(ms *modelState) (int, bool) {
	if ms.gap <= 0 {
		return s.batchCap(ms), false
	}
	lambda := float64(time.Second) / ms.gap // requests/s
	n := s.gpuShare(ms)
	target := s.batchCap(ms)
	// Overloaded: even the largest batch on the model's share cannot keep
	// up with its sustained rate (bursts do not count).
	overloaded := ms.slowGap > 0 &&
		n*float64(target)/ms.est.estimate(target).Seconds() < float64(time.Second)/ms.slowGap
	for b := 1; b <= target; b++ {
		if n*float64(b)/ms.est.estimate(b).Seconds() >= lambda {
			return b, overloaded
		}
	}
	return target, overloaded
}

// gpuShare is how many GPUs' worth of time model ms can count on: each of
// its GPUs split among the models loaded there by their load (rate times
// per-request time at the staggered batch). Models on disjoint sub-clusters
// do not share.
func (s *central) gpuShare(ms *modelState) float64 {
	load := func(o *modelState) float64 {
		if o.gap <= 0 {
			return 0
		}
		return float64(time.Second) / o.gap * o.est.estimate(o.target).Seconds() / float64(o.target)
	}
	mine := load(ms)
	if len(s.models) == 1 || mine == 0 {
		return float64(ms.ngpus)
	}
	if !s.subClusters {
		var total float64
		for _, o := range s.models {
			total += load(o)
		}
		return float64(ms.ngpus) * mine / total
	}
	var n float64
	for _, g := range s.gpus {
		if ms.allowed != nil && !ms.allowed[g.id] {
			continue
		}
		var total float64
		for _, o := range s.models {
			if o.allowed == nil || o.allowed[g.id] {
				total += load(o)
			}
		}
		n += mine / total
	}
	return n
}

// candidate is what schedule would dispatch if one of the model's GPUs were
// free now: the chosen model's efficiency and key, and whether any candidate
// is schedulable. Used by the parallel scheduler's shards.
func (s *central) candidate(now Time) (eff float64, key Time, ok bool) {
	for _, ms := range s.models {
		s.prune(now, ms)
		if len(ms.queued()) == 0 {
			continue
		}
		k := s.feasible(now, ms)
		schedAt, sched := s.schedulable(now, ms, k)
		if !sched {
			continue
		}
		e := float64(k) / ms.est.estimate(max(k, 1)).Seconds()
		if !ok || moreUseful(e, schedAt, eff, key) {
			eff, key, ok = e, schedAt, true
		}
	}
	return eff, key, ok
}

// setGPU marks a GPU free (granted to this shard) or unavailable.
func (s *central) setGPU(id GPUID, free bool, now Time) {
	if g := s.byGPU[id]; g != nil {
		g.busy, g.freeAt = !free, now
	}
}

// batchCap is the model's current batch cap (see computeCap).
func (s *central) batchCap(ms *modelState) int {
	if ms.cap == 0 {
		ms.cap = s.computeCap(ms)
	}
	return ms.cap
}

// computeCap is the batch at which the symphony policy counts a candidate as
// full (it dispatches without waiting longer; a backlog may go out in up to
// the staggered batch, see feasible): the
// staggered batch of Symphony Eq. 2, (1 + 1/N) l(b) <= SLO, with the slack
// term scaled by the variability of arrivals, (1 + c/N) l(b) <= SLO where
// c = 1 + the coefficient of variation of the inter-arrival gaps (over about
// the last 1000 arrivals), clamped to [1, 3]. Eq. 2 assumes uniform arrivals
// (c = 1): a request waits at most one GPU-free interval, l(b)/N. Random
// arrivals need more queueing slack, hence a smaller batch: on ResNet50 and
// 8 GPUs with Poisson arrivals (c about 2) this took goodput from 92.2% to
// about 94% of the staggered bound (docs/benchmarks.md).
func (s *central) computeCap(ms *modelState) int {
	c := 1.0
	if ms.slowGap > 0 {
		v := ms.slowSq - ms.slowGap*ms.slowGap
		c = min(3, 1+math.Sqrt(max(0, v))/ms.slowGap)
	}
	limit := float64(ms.m.SLO) / (1 + c/float64(ms.ngpus))
	b, _ := slices.BinarySearchFunc(ms.m.Latency, time.Duration(limit), func(l, t time.Duration) int {
		if float64(l) <= float64(t) {
			return -1
		}
		return 1
	})
	return max(1, b)
}

// moreUseful orders schedulable candidates: more requests per GPU-second
// first, then the earlier sched_at.
func moreUseful(eff float64, key Time, bestEff float64, bestKey Time) bool {
	return eff > bestEff*(1+1e-9) || eff >= bestEff*(1-1e-9) && key < bestKey
}
