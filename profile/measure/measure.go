// Package measure is the measuring loop of `mdag profile`: it drives any
// gpu.Executor (onnx on cpu or cuda, opencv, emulated) with batches of one
// model, or a CPU op (SweepOp: one item at a time per slot, as a worker
// runs it), over a grid of batch sizes and concurrencies, after a warm-up,
// and reports per point the p50/p99 batch latency and the throughput, the
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

	phases func() []gpu.Phase // the executor's gpu.Phased, when it is one (Sweep)
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
	// Phases is where a batch's time went, for executors that say
	// (gpu.Phased: the kserve executor's pack, shm-write, call, split):
	// each part's mean per measured batch.
	Phases []PhaseMean `json:"phases,omitempty"`
}

// PhaseMean is one part of a batch and its mean time.
type PhaseMean struct {
	Name string        `json:"name"`
	Mean time.Duration `json:"mean_ns"`
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
	Model    string        `json:"model"`           // the model, or the op of SweepOp
	Executor string        `json:"executor"`        // the executor's kind; "op" for SweepOp
	Frame    string        `json:"frame,omitempty"` // the input frame size, WxH, when the caller said
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

// Detections returns n deterministic boxes of class "object" on a w x h
// frame, laid out on a grid (each a quarter of its cell, score 0.9): the
// detections a CPU op downstream of a detector reads (crop, count, track).
func Detections(w, h, n int) []media.Box {
	if n <= 0 {
		return nil
	}
	cols := 1
	for cols*cols < n {
		cols++
	}
	rows := (n + cols - 1) / cols
	cw, ch := max(w/cols, 1), max(h/rows, 1)
	out := make([]media.Box, n)
	for i := range out {
		c, r := i%cols, i/cols
		out[i] = media.Box{X: c*cw + cw/4, Y: r*ch + ch/4, W: max(cw/2, 1), H: max(ch/2, 1), Class: "object", Score: 0.9}
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
	if p, ok := x.(gpu.Phased); ok {
		model := o.Model
		o.phases = func() []gpu.Phase { return p.Phases(model) }
	}
	return sweep(ctx, x.Kind(), executorRun(x, o.Model), o)
}

// phaseMeans is each part's mean per batch between two snapshots of
// gpu.Phased (nil when no batch was timed between them).
func phaseMeans(before, after []gpu.Phase) []PhaseMean {
	if len(after) == 0 || len(before) != len(after) {
		return nil
	}
	var out []PhaseMean
	for i, a := range after {
		n := a.Batches - before[i].Batches
		if n <= 0 {
			return nil
		}
		out = append(out, PhaseMean{Name: a.Name, Mean: (a.Total - before[i].Total) / time.Duration(n)})
	}
	return out
}

// executorRun runs each batch as one call of x on model.
func executorRun(x gpu.Executor, model string) runFunc {
	return func(ctx context.Context, _ int, items []*media.Item) error {
		_, err := x.Run(ctx, model, items)
		return err
	}
}

// Processor is a CPU op as the runtime's workers run it
// (modules.Processor): one input item to zero or more outputs, called from
// several goroutines at once.
type Processor interface {
	Process(it *media.Item) ([]*media.Item, error)
}

// SweepOp measures a CPU op as a worker runs it: each in-flight slot (a
// worker goroutine) processes a batch's items one after another, as a
// worker runs a task's items, so batch 1 is one item at a time. Each slot
// is its own stream (profile-SLOT) with increasing sequence numbers, so a
// stateful op sees ordered frames; every call gets a shallow copy of the
// item, so an op that writes to its input starts from the same item each
// time. o.Model names the op in errors and the result.
func SweepOp(ctx context.Context, p Processor, o Options) (*Result, error) {
	seqs := map[int]*uint64{}
	var mu sync.Mutex
	return sweep(ctx, "op", func(_ context.Context, slot int, items []*media.Item) error {
		mu.Lock()
		seq := seqs[slot]
		if seq == nil {
			seq = new(uint64)
			seqs[slot] = seq
		}
		mu.Unlock()
		stream := fmt.Sprintf("profile-%d", slot)
		for _, it := range items {
			in := *it
			*seq++ // only slot's goroutine touches its counter
			in.Stream, in.Seq = stream, *seq
			if _, err := p.Process(&in); err != nil {
				return err
			}
		}
		return nil
	}, o)
}

// runFunc runs one batch of items on in-flight slot slot.
type runFunc func(ctx context.Context, slot int, items []*media.Item) error

func sweep(ctx context.Context, kind string, run runFunc, o Options) (*Result, error) {
	if err := o.defaults(); err != nil {
		return nil, err
	}
	start := time.Now()
	res := &Result{Model: o.Model, Executor: kind}
	total := len(o.Batches) * len(o.Concurrency)
	for _, c := range o.Concurrency {
		for _, b := range o.Batches {
			pt, err := measurePoint(ctx, run, o, b, c)
			if err != nil {
				return nil, fmt.Errorf("measure: %s on %s, batch %d, concurrency %d: %w", o.Model, kind, b, c, err)
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
func measurePoint(ctx context.Context, run runFunc, o Options, b, c int) (Point, error) {
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
				if err := run(ctx, g, batches[g]); err != nil {
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
				if err := run(ctx, g, batches[g]); err != nil {
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
	var ph0 []gpu.Phase
	if o.phases != nil {
		ph0 = o.phases()
	}
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
	if o.phases != nil {
		pt.Phases = phaseMeans(ph0, o.phases())
	}
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
// p99 its 99th percentile, throughput the measured rate (items/s), which
// with concurrency > 1 on shared cores is below b*c/latency.
func (r *Result) ProfilePoints() []profile.Point {
	out := make([]profile.Point, len(r.Points))
	for i, p := range r.Points {
		lat := max(p.P50, 1)
		out[i] = profile.Point{Batch: p.Batch, Concurrency: p.Concurrency, Latency: lat, P99: max(p.P99, lat), Throughput: p.Throughput}
	}
	return out
}
