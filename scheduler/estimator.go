package scheduler

import (
	"slices"
	"time"
)

// Estimator keeps, per (model, batch size), the last 10 measured execution
// times (Clockwork Section 4.4: the controller's profile follows recent
// measurements) and predicts with their 99th percentile. The ratio of
// measured to profiled time is the ballooning signal the coordinator uses.
type Estimator struct {
	profile map[ModelID][]time.Duration
	recent  map[estKey]*window
	ratio   map[ModelID]*window // measured / profiled, recent batches
}

type estKey struct {
	model ModelID
	batch int
}

const estWindow = 10

type window struct {
	vals [estWindow]float64
	n    int // total recorded
}

func (w *window) add(v float64) { w.vals[w.n%estWindow] = v; w.n++ }

func (w *window) values() []float64 {
	return slices.Clone(w.vals[:min(w.n, estWindow)])
}

func newEstimator(models []Model) *Estimator {
	e := &Estimator{profile: map[ModelID][]time.Duration{}, recent: map[estKey]*window{}, ratio: map[ModelID]*window{}}
	for _, m := range models {
		e.profile[m.ID] = m.Latency
	}
	return e
}

// Profiled is the profile's l(b).
func (e *Estimator) Profiled(m ModelID, b int) time.Duration {
	p := e.profile[m]
	if b < 1 {
		b = 1
	}
	if b > len(p) {
		return p[len(p)-1] * time.Duration(b) / time.Duration(len(p))
	}
	return p[b-1]
}

// Record adds a measurement.
func (e *Estimator) Record(m ModelID, b int, measured time.Duration) {
	k := estKey{m, b}
	w := e.recent[k]
	if w == nil {
		w = &window{}
		e.recent[k] = w
	}
	w.add(float64(measured))
	r := e.ratio[m]
	if r == nil {
		r = &window{}
		e.ratio[m] = r
	}
	r.add(float64(measured) / float64(e.Profiled(m, b)))
}

// Estimate predicts l(b): the p99 of the last 10 measurements at that batch
// size, scaled from the profile by the model's recent ratio when that batch
// size has not been measured, or the profile.
func (e *Estimator) Estimate(m ModelID, b int) time.Duration {
	if w := e.recent[estKey{m, b}]; w != nil {
		return time.Duration(p99(w.values()))
	}
	return time.Duration(float64(e.Profiled(m, b)) * e.Ratio(m))
}

// Ratio is the model's recent measured/profiled execution time (1 when
// nothing was measured): the ballooning factor.
func (e *Estimator) Ratio(m ModelID) float64 {
	w := e.ratio[m]
	if w == nil {
		return 1
	}
	vs := w.values()
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
