package serf

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/mdag/mdag/profile"
)

// Point turns configuration cfg at arrival rate lambda (requests/s reaching
// one worker) into the profile point the allocator consumes:
//
//	batch:       1       SERF runs one request per service slot; no batching
//	concurrency: c       the service parallelism (requests in flight)
//	latency:     W(lambda), Eq. 13: mean queueing + interference-aware service
//	throughput:  lambda  the rate at which that latency holds
//
// The intra-op thread count t is not part of the point: the worker must run
// the model with t threads per session (the caller records t beside the
// profile, e.g. in the worker type's name or a comment).
//
// What the allocator then sees: capacity cap = lambda, so it never loads
// the instance beyond the rate the latency was predicted at (at c*mu_c the
// predicted latency is unbounded); its worst-case latency is latency + b/cap
// = W(lambda) + 1/lambda, Scrooge's batch-fill term added to SERF's mean as
// for every other profile point, which errs on the slow side. A partial
// instance carrying less than lambda is faster than W(lambda), since W grows
// with lambda for rates that do not rise with concurrency (mu_1 >= mu_2 >=
// ...), so the point is safe for partials too.
//
// Errors: the configuration or lambda is invalid, lambda <= 0 (a point needs
// a throughput), or lambda is at or above capacity (wraps ErrUnstable).
func (cfg Config) Point(lambda float64) (profile.Point, error) {
	if !(lambda > 0) {
		return profile.Point{}, fmt.Errorf("serf: point for %s: lambda must be > 0 requests/s, got %g", cfg, lambda)
	}
	p, err := cfg.Predict(lambda)
	if err != nil {
		return profile.Point{}, fmt.Errorf("serf: point: %w", err)
	}
	lat := time.Duration(math.Ceil(p.Latency * float64(time.Second)))
	return profile.Point{Batch: 1, Concurrency: cfg.C, Latency: max(lat, 1), Throughput: lambda}, nil
}

// Operating is a configuration at the load it is offered to the allocator.
type Operating struct {
	Config     Config        `json:"config"`
	Lambda     float64       `json:"lambda"`
	Prediction Prediction    `json:"prediction"`
	Point      profile.Point `json:"point"`
}

// MaxRate is the highest arrival rate at which cfg's predicted mean latency
// is within budget and its utilisation rho is at most maxRho (0 < maxRho <
// 1; budget <= 0 means no latency bound). ok is false when even an idle
// worker is slower than the budget (1/mu_1 > budget).
//
// The rate is found by scanning 64 steps up to maxRho*c*mu_c and bisecting
// the last step that fits, so it is exact (to 1e-9 relative) whenever the
// latency grows with the rate, which it does for mu_1 >= mu_2 >= ...
func MaxRate(cfg Config, budget time.Duration, maxRho float64) (lambda float64, ok bool, err error) {
	if !(maxRho > 0 && maxRho < 1) {
		return 0, false, fmt.Errorf("serf: maxRho must be in (0, 1), got %g", maxRho)
	}
	idle, err := cfg.Predict(0)
	if err != nil {
		return 0, false, err
	}
	b := budget.Seconds()
	fits := func(l float64) bool {
		p, err := cfg.Predict(l)
		return err == nil && (budget <= 0 || p.Latency <= b)
	}
	if budget > 0 && idle.Latency > b {
		return 0, false, nil
	}
	top := maxRho * cfg.Capacity()
	if fits(top) {
		return top, true, nil
	}
	const steps = 64
	lo, hi := 0.0, top
	for k := 1; k <= steps; k++ {
		l := top * float64(k) / steps
		if !fits(l) {
			hi = l
			break
		}
		lo = l
	}
	for hi-lo > 1e-9*top {
		mid := (lo + hi) / 2
		if fits(mid) {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo, lo > 0, nil
}

// OperatingPoints chooses, for each service parallelism c, the thread count
// t and the rate lambda that carry the most load within the latency budget
// and utilisation bound (MaxRate; ties go to the lower latency, then fewer
// threads), and returns one Operating per c in increasing c: the points of
// one CPU worker type's profile (a profile holds one point per (batch,
// concurrency)). A c at which no t meets the budget is left out; an error
// is returned when none is left.
func OperatingPoints(cfgs []Config, budget time.Duration, maxRho float64) ([]Operating, error) {
	if len(cfgs) == 0 {
		return nil, errors.New("serf: operating points: no configurations")
	}
	byC := map[int]Operating{}
	var cs []int
	for i, cfg := range cfgs {
		l, ok, err := MaxRate(cfg, budget, maxRho)
		if err != nil {
			return nil, fmt.Errorf("serf: operating points: configs[%d]: %w", i, err)
		}
		if !ok {
			continue
		}
		pr, err := cfg.Predict(l)
		if err != nil {
			return nil, err
		}
		pt, err := cfg.Point(l)
		if err != nil {
			return nil, err
		}
		op := Operating{Config: cfg, Lambda: l, Prediction: pr, Point: pt}
		cur, have := byC[cfg.C]
		if !have {
			cs = append(cs, cfg.C)
		}
		if !have || op.Lambda > cur.Lambda || op.Lambda == cur.Lambda &&
			(pr.Latency < cur.Prediction.Latency || pr.Latency == cur.Prediction.Latency && cfg.T < cur.Config.T) {
			byC[cfg.C] = op
		}
	}
	if len(cs) == 0 {
		return nil, fmt.Errorf("serf: operating points: no configuration meets the %v budget even when idle", budget)
	}
	out := make([]Operating, 0, len(cs))
	for c := 1; len(out) < len(cs); c++ {
		if op, ok := byC[c]; ok {
			out = append(out, op)
		}
	}
	return out, nil
}
