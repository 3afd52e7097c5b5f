package scheduler

import (
	"slices"
	"time"
)

// Estimator keeps, per (model, batch size), the last 10 measured execution
// times (Clockwork Section 4.4: the controller's profile follows recent
// measurements) and predicts with their 99th percentile, less one stall
// (p99). The ratio of measured to profiled time is the ballooning signal
// the coordinator uses. Estimates are kept in per-model arrays so the
// scheduler's hot path does no map lookups.
type Estimator struct {
	models map[ModelID]*modelEst
}

type modelEst struct {
	profile []time.Duration
	recent  []*window       // by batch-1; nil until measured
	ratio   window          // measured / profiled, recent batches
	est     []time.Duration // current estimate per batch size, kept up to date by Record
}

const estWindow = 10

type window struct {
	vals [estWindow]float64
	n    int // total recorded
}

func (w *window) add(v float64) { w.vals[w.n%estWindow] = v; w.n++ }

func (w *window) values() []float64 { return slices.Clone(w.vals[:min(w.n, estWindow)]) }

func newEstimator(models []Model) *Estimator {
	e := &Estimator{models: map[ModelID]*modelEst{}}
	for _, m := range models {
		me := &modelEst{profile: m.Latency, recent: make([]*window, len(m.Latency)), est: slices.Clone(m.Latency)}
		e.models[m.ID] = me
	}
	return e
}

func (me *modelEst) profiled(b int) time.Duration {
	if b < 1 {
		b = 1
	}
	if b > len(me.profile) {
		return me.profile[len(me.profile)-1] * time.Duration(b) / time.Duration(len(me.profile))
	}
	return me.profile[b-1]
}

// Profiled is the profile's l(b).
func (e *Estimator) Profiled(m ModelID, b int) time.Duration { return e.models[m].profiled(b) }

// Record adds a measurement; a measurement <= 0 (none: a cold run the
// caller left out) changes nothing.
func (e *Estimator) Record(m ModelID, b int, measured time.Duration) {
	me := e.models[m]
	if me == nil || b < 1 || measured <= 0 {
		return
	}
	if b <= len(me.recent) {
		if me.recent[b-1] == nil {
			me.recent[b-1] = &window{}
		}
		me.recent[b-1].add(float64(measured))
		me.est[b-1] = time.Duration(p99(me.recent[b-1].values()))
	}
	me.ratio.add(float64(measured) / float64(me.profiled(b)))
	r := me.ratioValue()
	for i := range me.est { // unmeasured sizes follow the model's ratio
		if me.recent[i] == nil {
			me.est[i] = time.Duration(float64(me.profile[i]) * r)
		}
	}
}

// Estimate predicts l(b): the p99 of the last 10 measurements at that batch
// size, scaled from the profile by the model's recent ratio when that batch
// size has not been measured, or the profile.
func (e *Estimator) Estimate(m ModelID, b int) time.Duration { return e.models[m].estimate(b) }

func (me *modelEst) estimate(b int) time.Duration {
	if b < 1 {
		b = 1
	}
	if b > len(me.est) {
		return me.est[len(me.est)-1] * time.Duration(b) / time.Duration(len(me.est))
	}
	return me.est[b-1]
}

// Ratio is the model's recent measured/profiled execution time (1 when
// nothing was measured): the ballooning factor.
func (e *Estimator) Ratio(m ModelID) float64 { return e.models[m].ratioValue() }

func (me *modelEst) ratioValue() float64 {
	vs := me.ratio.values()
	if len(vs) == 0 {
		return 1
	}
	var sum float64
	for _, v := range vs {
		sum += v
	}
	return sum / float64(len(vs))
}

// p99 is the 99th percentile of vs (sorted in place), less one stall. Of
// 10 measurements the p99 is the largest, so a single stalled batch (a
// garbage collection, a page fault, another tenant: 3x) set the estimate
// of the next 10 batches; for a model whose run takes most of the SLO
// (caption's 1.5 s S2VT in 2.5 s) every request then looked hopeless,
// was dropped, nothing ran, and nothing replaced the stall. So the largest
// is left out when it is more than stall x the median and another
// measurement is there: the spread of the rest (lognormal sigma 0.1: p99
// about 1.26x the median) stays in, and two stalls in the window count.
// With 5% jitter nothing changes (examples/sim/mixed: the same goodput).
func p99(vs []float64) float64 {
	slices.Sort(vs)
	i := min(len(vs)-1, (len(vs)*99+99)/100-1)
	if i == len(vs)-1 && i > 0 && vs[i] > stall*vs[(len(vs)-1)/2] {
		i--
	}
	return vs[i]
}

// stall is how many times the window's median its largest measurement
// must be to count as one stall rather than the model's spread.
const stall = 1.5

// Reset forgets what was measured of model m: its estimates go back to the
// profile. The caller re-measures with it an estimate that no request can
// meet any more (nothing would run, so nothing would correct it).
func (e *Estimator) Reset(m ModelID) {
	me := e.models[m]
	if me == nil {
		return
	}
	me.recent = make([]*window, len(me.profile))
	me.ratio = window{}
	me.est = slices.Clone(me.profile)
}
