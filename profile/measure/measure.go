// Package measure is the measuring loop of `mdag profile`: it drives any
// gpu.Executor (onnx on cpu or cuda, opencv, emulated) with batches of one
// model over a grid of batch sizes and concurrencies, after a warm-up, and
// reports per point the p50/p99 batch latency and the throughput, the
// least-squares fit l(b) = alpha*b + beta per concurrency with its R^2, and
// the profiles document (profile.File) the planners read. For CPU-executed
// models it also measures SERF's service rates mu_i per intra-op thread
// count (Rates) and checks SERF's prediction under Poisson load (Poisson).
//
// The package is pure: it takes the executor (or a factory of executors)
// and measures time with the standard library's clock, so a test run in a
// synctest bubble with the emulated executor is exact and deterministic.
package measure

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/mdag/mdag/gpu"
	"github.com/mdag/mdag/media"
	"github.com/mdag/mdag/profile"
)

// Options is one sweep.
type Options struct {
	Model       string
	Batches     []int // batch sizes (default 1, 2, 4, 8)
	Concurrency []int // batches in flight at once (default 1, 2)
	// Iterations is the number of measured batches per goroutine at each
	// point (default 20); Duration, when > 0, ends a point's measurement
	// earlier once it has run that long (each goroutine completes at least
	// one batch).
	Iterations int
	Duration   time.Duration
	// Warmup is the number of batches each goroutine runs at a point before
	// the measurement starts (default 2; negative: none).
	Warmup int
	// Gap, when > 0, is an idle pause each slot takes after every batch
	// (not counted in its latency): requests then start on cores and
	// caches that were left idle, as they do under open-loop load.
	Gap time.Duration
	// Items makes a batch of n input items (default: Frames(n, 640, 480)).
	Items func(n int) []*media.Item
	// Progress, when set, is called after each point.
	Progress func(done, total int, pt Point)
}

// Point is one measured (batch, concurrency).
type Point struct {
	Batch       int           `json:"batch"`
	Concurrency int           `json:"concurrency"`
	Batches     int           `json:"batches"` // measured batches, all goroutines
	Mean        time.Duration `json:"mean_ns"`
	P50         time.Duration `json:"p50_ns"`
	P99         time.Duration `json:"p99_ns"`
	Max         time.Duration `json:"max_ns"`
	Throughput  float64       `json:"throughput"` // items per second over the measured phase
}

// Fit is l(b) = Alpha*b + Beta through one concurrency's p50 latencies.
type Fit struct {
	Concurrency int           `json:"concurrency"`
	Alpha       time.Duration `json:"alpha_ns"`
	Beta        time.Duration `json:"beta_ns"`
	R2          float64       `json:"r2"`
	Points      int           `json:"points"`
}

// Result is a sweep's outcome.
type Result struct {
	Model    string        `json:"model"`
	Executor string        `json:"executor"`
	Points   []Point       `json:"points"`
	Fits     []Fit         `json:"fits"`
	Elapsed  time.Duration `json:"elapsed_ns"`
}

// Frames returns n deterministic test frames of w x h (a gradient that
// differs per item), wrapped as items.
func Frames(n, w, h int) []*media.Item {
	out := make([]*media.Item, n)
	for k := range out {
		f := media.NewFrame(w, h)
		for i := range f.Pix {
			f.Pix[i] = byte((i/3*7 + k*31 + i%3*85) % 251)
		}
		out[k] = &media.Item{Stream: "profile", Seq: uint64(k), Frame: f}
	}
	return out
}

func (o *Options) defaults() error {
	if o.Model == "" {
		return errors.New("measure: no model named")
	}
	if len(o.Batches) == 0 {
		o.Batches = []int{1, 2, 4, 8}
	}
	if len(o.Concurrency) == 0 {
		o.Concurrency = []int{1, 2}
	}
	for _, b := range o.Batches {
		if b < 1 {
			return fmt.Errorf("measure: batch size %d: must be >= 1", b)
		}
	}
	for _, c := range o.Concurrency {
		if c < 1 {
			return fmt.Errorf("measure: concurrency %d: must be >= 1", c)
		}
	}
	if o.Iterations == 0 {
		o.Iterations = 20
	}
	if o.Iterations < 1 {
		return fmt.Errorf("measure: iterations %d: must be >= 1", o.Iterations)
	}
	if o.Warmup == 0 {
		o.Warmup = 2
	}
	o.Warmup = max(0, o.Warmup)
	if o.Items == nil {
		o.Items = func(n int) []*media.Item { return Frames(n, 640, 480) }
	}
	return nil
}

// Sweep measures x on every (batch, concurrency) of o, in increasing
// concurrency then batch. The first executor error ends it, naming the
// point.
func Sweep(ctx context.Context, x gpu.Executor, o Options) (*Result, error) {
	if err := o.defaults(); err != nil {
		return nil, err
	}
	start := time.Now()
	res := &Result{Model: o.Model, Executor: x.Kind()}
	total := len(o.Batches) * len(o.Concurrency)
	for _, c := range o.Concurrency {
		for _, b := range o.Batches {
			pt, err := measurePoint(ctx, x, o, b, c)
			if err != nil {
				return nil, fmt.Errorf("measure: %s on %s, batch %d, concurrency %d: %w", o.Model, x.Kind(), b, c, err)
			}
			res.Points = append(res.Points, pt)
			if o.Progress != nil {
				o.Progress(len(res.Points), total, pt)
			}
		}
	}
	res.Fits = fits(res.Points)
	res.Elapsed = time.Since(start)
	return res, nil
}

// measurePoint runs c goroutines, each Warmup then up to Iterations
// batches of b items; the measured phase starts when every goroutine has
// warmed up.
func measurePoint(ctx context.Context, x gpu.Executor, o Options, b, c int) (Point, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	batches := make([][]*media.Item, c)
	for g := range batches {
		batches[g] = o.Items(b)
	}
	var warm, done sync.WaitGroup
	warm.Add(c)
	begin := make(chan time.Time)
	lats := make([][]time.Duration, c)
	errs := make([]error, c)
	for g := range c {
		done.Go(func() {
			for range o.Warmup {
				if _, err := x.Run(ctx, o.Model, batches[g]); err != nil {
					errs[g] = err
					cancel()
					break
				}
			}
			warm.Done()
			t0, ok := <-begin
			if !ok || errs[g] != nil {
				return
			}
			for i := 0; i < o.Iterations; i++ {
				s := time.Now()
				if o.Duration > 0 && i > 0 && s.Sub(t0) >= o.Duration {
					return
				}
				if _, err := x.Run(ctx, o.Model, batches[g]); err != nil {
					errs[g] = err
					cancel()
					return
				}
				lats[g] = append(lats[g], time.Since(s))
				if o.Gap > 0 {
					time.Sleep(o.Gap) // the idle pause itself, not a wait for logic
				}
			}
		})
	}
	warm.Wait()
	t0 := time.Now()
	for range c {
		begin <- t0
	}
	close(begin)
	done.Wait()
	elapsed := time.Since(t0)
	if err := errors.Join(errs...); err != nil {
		return Point{}, err
	}
	all := slices.Concat(lats...)
	pt := Point{Batch: b, Concurrency: c, Batches: len(all)}
	slices.Sort(all)
	var sum time.Duration
	for _, l := range all {
		sum += l
	}
	pt.Mean = sum / time.Duration(len(all))
	pt.P50, pt.P99, pt.Max = quantile(all, 0.5), quantile(all, 0.99), all[len(all)-1]
	if elapsed > 0 {
		pt.Throughput = float64(len(all)*b) / elapsed.Seconds()
	}
	return pt, nil
}

// quantile is the nearest-rank q-quantile of sorted xs.
func quantile(xs []time.Duration, q float64) time.Duration {
	k := int(q*float64(len(xs))+0.999999999) - 1
	return xs[min(max(k, 0), len(xs)-1)]
}

// fits fits l(b) per concurrency through the p50s (profile.FitLinear).
func fits(pts []Point) []Fit {
	var cs []int
	groups := map[int][]profile.Config{}
	for _, p := range pts {
		if _, ok := groups[p.Concurrency]; !ok {
			cs = append(cs, p.Concurrency)
		}
		groups[p.Concurrency] = append(groups[p.Concurrency], profile.Config{Batch: p.Batch, Concurrency: p.Concurrency, Latency: p.P50})
	}
	var out []Fit
	for _, c := range cs {
		if f, ok := profile.FitLinear(groups[c]); ok {
			out = append(out, Fit{Concurrency: c, Alpha: f.Alpha, Beta: f.Beta, R2: f.R2, Points: f.Points})
		}
	}
	return out
}

// ProfilePoints are the profile's points: latency is the p50 batch time,
// throughput the measured rate (items/s), which with concurrency > 1 on
// shared cores is below b*c/latency.
func (r *Result) ProfilePoints() []profile.Point {
	out := make([]profile.Point, len(r.Points))
	for i, p := range r.Points {
		out[i] = profile.Point{Batch: p.Batch, Concurrency: p.Concurrency, Latency: max(p.P50, 1), Throughput: p.Throughput}
	}
	return out
}
