package measure

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/mdag/mdag/gpu"
	"github.com/mdag/mdag/media"
	"github.com/mdag/mdag/profile/serf"
)

// Factory builds an executor that runs the model with threads intra-op
// threads per session and sessions sessions (requests in service at once);
// the func it returns releases it.
type Factory func(threads, sessions int) (gpu.Executor, func(), error)

// SerfOptions is a SERF profiling run (SERF Sec. IV-B): for each intra-op
// thread count t, the service rate mu_i of one request while i run at once,
// i = 1..Cores/t, at batch 1.
type SerfOptions struct {
	Model string
	Cores int // the worker type's cores (c*t <= Cores)
	// Threads are the intra-op thread counts (default 1, 2, 4, ... <= Cores).
	Threads []int
	// Iterations is the number of measured requests per slot at each i
	// (default 30); Warmup the requests per slot before (default 2).
	Iterations int
	Warmup     int
	// Gap is Options.Gap: an idle pause after each request (0: back to
	// back, as SERF profiles).
	Gap   time.Duration
	Items func(n int) []*media.Item
	// Progress, when set, is called after each (t, i) with mu_i.
	Progress func(t, i int, mu float64)
}

// DefaultThreads are 1, 2, 4, ... up to cores.
func DefaultThreads(cores int) []int {
	var ts []int
	for t := 1; t <= cores; t *= 2 {
		ts = append(ts, t)
	}
	return ts
}

// Rates measures SERF's service rates: per thread count t one executor with
// Cores/t sessions of t threads, and for i = 1..Cores/t, i goroutines each
// running batch-1 requests back to back; mu_i = 1/(mean request time).
func Rates(ctx context.Context, f Factory, o SerfOptions) ([]serf.Rates, error) {
	if o.Cores < 1 {
		return nil, fmt.Errorf("measure: serf: cores %d: must be >= 1", o.Cores)
	}
	if len(o.Threads) == 0 {
		o.Threads = DefaultThreads(o.Cores)
	}
	if o.Iterations == 0 {
		o.Iterations = 30
	}
	var out []serf.Rates
	for _, t := range o.Threads {
		if t < 1 || t > o.Cores {
			return nil, fmt.Errorf("measure: serf: %d intra-op threads: want 1..%d (the cores)", t, o.Cores)
		}
		n := o.Cores / t
		x, release, err := f(t, n)
		if err != nil {
			return nil, fmt.Errorf("measure: serf: executor with %d threads x %d sessions: %w", t, n, err)
		}
		r := serf.Rates{Threads: t}
		for i := 1; i <= n; i++ {
			po := Options{Model: o.Model, Batches: []int{1}, Concurrency: []int{i}, Iterations: o.Iterations, Warmup: o.Warmup, Gap: o.Gap, Items: o.Items}
			if err := po.defaults(); err != nil {
				release()
				return nil, err
			}
			pt, err := measurePoint(ctx, executorRun(x, o.Model), po, 1, i)
			if err != nil {
				release()
				return nil, fmt.Errorf("measure: serf: %s, t=%d, i=%d: %w", o.Model, t, i, err)
			}
			mu := 1 / pt.Mean.Seconds()
			r.Mu = append(r.Mu, mu)
			if o.Progress != nil {
				o.Progress(t, i, mu)
			}
		}
		release()
		out = append(out, r)
	}
	return out, nil
}

// Observed is the outcome of one Poisson run.
type Observed struct {
	Lambda   float64       `json:"lambda"`   // the offered rate, requests/s
	Requests int           `json:"requests"` // measured (after warm-up)
	Mean     time.Duration `json:"mean_ns"`  // mean latency, arrival to completion
	// HalfWidth is the 95% half-width of Mean by 10 batch means.
	HalfWidth time.Duration `json:"half_width_ns"`
	// Service is the mean time in the executor alone (queueing excluded):
	// against the profiled 1/mu_i it shows how much the cores' speed
	// changed under this load.
	Service time.Duration `json:"service_ns"`
}

// Poisson offers x Poisson arrivals of batch-1 requests at rate lambda
// (seeded), served FCFS by c slots (at most c requests in service), and
// returns the mean latency from each request's arrival (when it is queued)
// to its completion over requests warm..n-1.
func Poisson(ctx context.Context, x gpu.Executor, model string, c int, lambda float64, n, warm int, seed uint64, items func(int) []*media.Item) (Observed, error) {
	if c < 1 || !(lambda > 0) || n <= warm || warm < 0 {
		return Observed{}, fmt.Errorf("measure: poisson: want c >= 1, lambda > 0, n > warm >= 0; got %d, %g, %d, %d", c, lambda, n, warm)
	}
	if items == nil {
		items = func(n int) []*media.Item { return Frames(n, 640, 480) }
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type req struct {
		k  int
		at time.Time
	}
	queue := make(chan req, n)
	lat, svc := make([]time.Duration, n), make([]time.Duration, n)
	errs := make([]error, c)
	var wg sync.WaitGroup
	for g := range c {
		in := items(1)
		wg.Go(func() {
			for r := range queue {
				if errs[g] != nil {
					continue
				}
				s := time.Now()
				if _, err := x.Run(ctx, model, in); err != nil {
					errs[g] = err
					cancel()
					continue
				}
				lat[r.k], svc[r.k] = time.Since(r.at), time.Since(s)
			}
		})
	}
	rng := rand.New(rand.NewPCG(seed, 0x5e7f))
	next := time.Now()
	for k := range n {
		next = next.Add(time.Duration(rng.ExpFloat64() / lambda * float64(time.Second)))
		// open-loop load: wait for the scheduled arrival time
		if d := time.Until(next); d > 0 {
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
			}
		}
		if ctx.Err() != nil {
			break
		}
		// the request arrives when it is handed over: a late timer delays
		// the arrival, it does not count as the system's latency
		queue <- req{k, time.Now()}
	}
	close(queue)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return Observed{}, fmt.Errorf("measure: poisson: %s at %g/s: %w", model, lambda, err)
	}
	if err := ctx.Err(); err != nil {
		return Observed{}, err
	}
	m := lat[warm:]
	var sum, ssum float64
	for k, l := range m {
		sum += l.Seconds()
		ssum += svc[warm+k].Seconds()
	}
	mean := sum / float64(len(m))
	// batch means for a confidence interval
	const nb = 10
	var hw float64
	if len(m) >= nb*2 {
		size := len(m) / nb
		var bm []float64
		for b := range nb {
			var s float64
			for _, l := range m[b*size : (b+1)*size] {
				s += l.Seconds()
			}
			bm = append(bm, s/float64(size))
		}
		var v float64
		for _, y := range bm {
			v += (y - mean) * (y - mean)
		}
		hw = 2.262 * math.Sqrt(v/float64(nb-1)/nb) // t(0.975, 9)
	}
	return Observed{Lambda: lambda, Requests: len(m), Mean: secs(mean), HalfWidth: secs(hw), Service: secs(ssum / float64(len(m)))}, nil
}

func secs(s float64) time.Duration { return time.Duration(math.Round(s * float64(time.Second))) }

// CheckRow compares SERF's prediction with a Poisson measurement.
type CheckRow struct {
	Config    serf.Config   `json:"config"`
	Rho       float64       `json:"rho"`
	Observed  Observed      `json:"observed"`
	Predicted time.Duration `json:"predicted_ns"`
	Error     float64       `json:"error"` // (predicted - measured) / measured
	// AtLoad is a diagnostic, not a prediction: SERF's mean latency with
	// every mu_i scaled so that its mean service time (Eq. 12) equals the
	// one measured during the run. It separates the queueing model's error
	// from the rates' drift between profiling and load (shared cores).
	AtLoad      time.Duration `json:"at_load_ns"`
	AtLoadError float64       `json:"at_load_error"`
}

// CheckOptions is a SERF check run.
type CheckOptions struct {
	Model    string
	Rhos     []float64 // utilisations rho = lambda/(c mu_c) (default 0.3, 0.5, 0.7, 0.85)
	Duration time.Duration
	// Requests per load level: max(MinRequests, lambda*Duration) (defaults
	// 200 and 8s), of which the first tenth is warm-up.
	MinRequests int
	Seed        uint64
	// Remeasure, when > 0, measures each configuration's mu_1..mu_c again
	// on the executor the check runs on (Remeasure requests per slot, as
	// Rates does) just before offering it load, and predicts with those:
	// on shared cores the rates drift between profiling and the check.
	Remeasure int
	Gap       time.Duration // Options.Gap for the re-measurement
	Items     func(n int) []*media.Item
	Progress  func(row CheckRow)
}

// Check measures every configuration at each load level under Poisson
// arrivals and compares the mean latency with cfg.Predict.
func Check(ctx context.Context, f Factory, cfgs []serf.Config, o CheckOptions) ([]CheckRow, error) {
	if len(o.Rhos) == 0 {
		o.Rhos = []float64{0.3, 0.5, 0.7, 0.85}
	}
	if o.Duration <= 0 {
		o.Duration = 8 * time.Second
	}
	if o.MinRequests <= 0 {
		o.MinRequests = 200
	}
	var rows []CheckRow
	for ci, cfg := range cfgs {
		cfg.Mu = slices.Clone(cfg.Mu)
		x, release, err := f(cfg.T, cfg.C)
		if err != nil {
			return nil, fmt.Errorf("measure: serf check: %s: %w", cfg, err)
		}
		if o.Remeasure > 0 {
			for i := 1; i <= cfg.C; i++ {
				po := Options{Model: o.Model, Batches: []int{1}, Concurrency: []int{i}, Iterations: o.Remeasure, Gap: o.Gap, Items: o.Items}
				if err := po.defaults(); err != nil {
					release()
					return nil, err
				}
				pt, err := measurePoint(ctx, executorRun(x, o.Model), po, 1, i)
				if err != nil {
					release()
					return nil, fmt.Errorf("measure: serf check: %s, i=%d: %w", cfg, i, err)
				}
				cfg.Mu[i-1] = 1 / pt.Mean.Seconds()
			}
		}
		for ri, rho := range o.Rhos {
			lambda := rho * cfg.Capacity()
			pr, err := cfg.Predict(lambda)
			if err != nil {
				release()
				return nil, err
			}
			n := max(o.MinRequests, int(lambda*o.Duration.Seconds()))
			ob, err := Poisson(ctx, x, o.Model, cfg.C, lambda, n, n/10, o.Seed+uint64(ci*100+ri), o.Items)
			if err != nil {
				release()
				return nil, err
			}
			row := CheckRow{Config: cfg, Rho: rho, Observed: ob, Predicted: secs(pr.Latency),
				Error: (pr.Latency - ob.Mean.Seconds()) / ob.Mean.Seconds()}
			if al, ok := atLoad(cfg, lambda, ob.Service.Seconds()); ok {
				row.AtLoad, row.AtLoadError = secs(al), (al-ob.Mean.Seconds())/ob.Mean.Seconds()
			}
			rows = append(rows, row)
			if o.Progress != nil {
				o.Progress(row)
			}
		}
		release()
	}
	return rows, nil
}

// ErrorSummary is the median and worst |error| of rows.
func ErrorSummary(rows []CheckRow) (median, worst float64) {
	if len(rows) == 0 {
		return 0, 0
	}
	abs := make([]float64, len(rows))
	for i, r := range rows {
		abs[i] = math.Abs(r.Error)
	}
	slices.Sort(abs)
	if n := len(abs); n%2 == 1 {
		median = abs[n/2]
	} else {
		median = (abs[n/2-1] + abs[n/2]) / 2
	}
	return median, abs[len(abs)-1]
}

// atLoad scales cfg's rates until the predicted mean service time equals
// service (a few fixed-point steps: the service's mix of concurrency
// levels depends on the rates) and returns the predicted latency; ok is
// false when the scaled configuration is unstable at lambda.
func atLoad(cfg serf.Config, lambda, service float64) (float64, bool) {
	if !(service > 0) {
		return 0, false
	}
	mu := slices.Clone(cfg.Mu)
	var p serf.Prediction
	for range 20 {
		var err error
		if p, err = serf.Predict(mu, lambda); err != nil {
			return 0, false // unstable at the rates the load showed
		}
		k := p.Service / service
		if math.Abs(k-1) < 1e-9 {
			break
		}
		for i := range mu {
			mu[i] *= k
		}
	}
	return p.Latency, true
}
