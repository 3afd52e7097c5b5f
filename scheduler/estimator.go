package scheduler

import (
	"slices"
	"time"
)

// Estimator keeps, per (model, batch size), the last 10 measured execution
// times (Clockwork Section 4.4: the controller's profile follows recent
// measurements) and predicts with their 99th percentile. The ratio of
// measured to profiled time is the ballooning signal the coordinator uses.
// Estimates are kept in per-model arrays so the scheduler's hot path does
// no map lookups.
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

func p99(vs []float64) float64 {
	slices.Sort(vs)
	return vs[min(len(vs)-1, (len(vs)*99+99)/100-1)]
}

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
