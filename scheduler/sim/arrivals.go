package sim

import (
	"math"
	"math/rand/v2"
	"time"

	"github.com/mdag/mdag/scheduler"
)

// arrivals generates one model's arrival times.
type arrivals struct {
	w    *Workload
	rate float64 // requests/s (trace: scales the trace's share)
	rng  *rand.Rand
	// trace: this model's share of each minute's count
	share float64
}

// newArrivals generates model i's arrivals; rates are every model's rates
// (a trace gives the total, split by each model's share of them).
func newArrivals(w *Workload, rates []float64, i int, rng *rand.Rand) *arrivals {
	a := &arrivals{w: w, rate: rates[i], rng: rng, share: 1}
	var total float64
	for _, r := range rates {
		total += r
	}
	if total > 0 {
		a.share = rates[i] / total
	}
	return a
}

// next returns the arrival after now (Never when the rate is 0).
func (a *arrivals) next(now scheduler.Time) scheduler.Time {
	if a.rate <= 0 && a.w.Arrival.Kind != "trace" {
		return scheduler.Never
	}
	switch a.w.Arrival.Kind {
	case "uniform":
		return now + sec(1/a.rate)
	case "gamma":
		k := a.w.Arrival.Shape
		return now + sec(gamma(a.rng, k)/(k*a.rate))
	case "trace":
		// Poisson within each minute at that minute's count / 60, scaled by
		// the model's share; minutes past the trace repeat it.
		t := now
		for guard := 0; guard < 100000; guard++ {
			minute := int(t / scheduler.Time(time.Minute))
			r := a.w.trace[minute%len(a.w.trace)] / 60 * a.share
			if r <= 0 {
				t = scheduler.Time(minute+1) * scheduler.Time(time.Minute)
				continue
			}
			cand := t + sec(a.rng.ExpFloat64()/r)
			if edge := scheduler.Time(minute+1) * scheduler.Time(time.Minute); cand >= edge {
				t = edge // memoryless: restart at the boundary with the next rate
				continue
			}
			return cand
		}
		return scheduler.Never
	default: // poisson
		return now + sec(a.rng.ExpFloat64()/a.rate)
	}
}

func sec(s float64) scheduler.Time { return scheduler.Time(math.Max(1, s*float64(time.Second))) }

// gamma draws from Gamma(k, 1) (Marsaglia and Tsang; boosted for k < 1).
func gamma(rng *rand.Rand, k float64) float64 {
	if k < 1 {
		return gamma(rng, k+1) * math.Pow(rng.Float64(), 1/k)
	}
	d := k - 1.0/3
	c := 1 / math.Sqrt(9*d)
	for {
		x := rng.NormFloat64()
		v := 1 + c*x
		if v <= 0 {
			continue
		}
		v = v * v * v
		u := rng.Float64()
		if u < 1-0.0331*x*x*x*x || math.Log(u) < 0.5*x*x+d*(1-v+math.Log(v)) {
			return d * v
		}
	}
}
