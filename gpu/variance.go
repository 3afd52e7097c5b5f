package gpu

import (
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Variance is how far the emulated executor's batches stray from their
// profiled l(b): real executors are never exact, and a runtime that only
// ever meets exact ones hides the defects variance exposes. Each batch's
// time is l(b) x slowdown x the product of the factors below that apply
// to it. The zero value is exact emulation (every factor 1): the paper
// reproductions (mdag eval, mdag sim) and the coordinator's own tests use
// it.
type Variance struct {
	// Jitter is sigma of a lognormal multiplier with median 1 (the profile
	// is the median): exp(Jitter x N(0,1)). 0: none; at most 2.
	Jitter float64
	// StallP of the batches (0..1) take StallX times as long (>= 1): a
	// garbage collection, a page fault, another tenant.
	StallP, StallX float64
	// Cold (>= 1) multiplies a model's first batch on the executor (a model
	// just loaded) and the first batch after the executor was idle (no
	// batch running) for at least ColdIdle (> 0; default 1 s): clocks and
	// caches wound down. 0 or 1: none.
	Cold     float64
	ColdIdle time.Duration
	// Shape (>= 1) multiplies the first batch of each size of a model on
	// the executor (a runtime's first run at a new input shape: kernel
	// choice, allocation). 0 or 1: none.
	Shape float64
	// Contention (0..10) slows a batch by this fraction for every other
	// batch in flight on the same host when it starts (executors of one
	// process share their host's cores for pre- and post-processing).
	Contention float64
	// Seed seeds the draws (PCG): the same seed and the same batches in the
	// same order give the same times.
	Seed uint64
}

// DefaultColdIdle is Variance.ColdIdle's default.
const DefaultColdIdle = time.Second

// VarianceExact and VarianceRealistic are the named models
// ParseVariance knows.
const (
	VarianceExact     = "exact"
	VarianceRealistic = "realistic"
)

// Exact is exact emulation: every batch takes its profiled time.
func Exact() Variance { return Variance{} }

// Realistic is a moderate model of a real executor: jitter with sigma 0.1
// (p99 about 1.26x the median), 0.5% of batches stalled at 3x, a model's
// first batch and the first after 5 s idle at 1.5x (a device whose clocks
// came down; a 2x penalty after every 1 s gap made a model that runs about
// once a second per instance, caption's S2VT, twice as slow for good), each
// batch size's first run at 1.5x. No contention: the in-process emulated
// GPUs stand for separate machines (the demo's 12 P100s each ran 22%
// slower for the other 11 with 2% a batch); contention=C models a shared
// device when asked for.
func Realistic() Variance {
	return Variance{Jitter: 0.1, StallP: 0.005, StallX: 3, Cold: 1.5, ColdIdle: 5 * time.Second, Shape: 1.5}
}

// IsExact says whether v changes no batch's time.
func (v Variance) IsExact() bool {
	return v.Jitter == 0 && (v.StallP == 0 || v.StallX <= 1) && v.Cold <= 1 && v.Shape <= 1 && v.Contention == 0
}

// Derive is v with its seed mixed with name, so that the executors of
// several instances (named by their IDs) draw independent, reproducible
// sequences from one configured seed.
func (v Variance) Derive(name string) Variance {
	h := fnv.New64a()
	h.Write([]byte(name))
	v.Seed ^= h.Sum64()
	return v
}

// String is v in ParseVariance's syntax: "exact", "realistic", or the
// factors that apply (seed last when not 0).
func (v Variance) String() string {
	switch v {
	case Exact():
		return VarianceExact
	case Realistic():
		return VarianceRealistic
	}
	var parts []string
	f := func(x float64) string { return strconv.FormatFloat(x, 'g', -1, 64) }
	if v.Jitter != 0 {
		parts = append(parts, "jitter="+f(v.Jitter))
	}
	if v.StallP != 0 || v.StallX != 0 {
		parts = append(parts, "stall="+f(v.StallP)+"x"+f(v.StallX))
	}
	if v.Cold != 0 || v.ColdIdle != 0 {
		c := "cold=" + f(v.Cold)
		if v.ColdIdle != 0 {
			c += "@" + v.ColdIdle.String()
		}
		parts = append(parts, c)
	}
	if v.Shape != 0 {
		parts = append(parts, "shape="+f(v.Shape))
	}
	if v.Contention != 0 {
		parts = append(parts, "contention="+f(v.Contention))
	}
	if v.Seed != 0 {
		parts = append(parts, "seed="+strconv.FormatUint(v.Seed, 10))
	}
	if len(parts) == 0 {
		return VarianceExact
	}
	return strings.Join(parts, ",")
}

// VarianceSyntax describes ParseVariance's input, for flag help and errors.
const VarianceSyntax = `exact, realistic, or comma-separated factors after an optional preset: ` +
	`jitter=SIGMA (lognormal, median 1), stall=PxF (a fraction P of batches take F times as long), ` +
	`cold=F[@IDLE] (a model's first batch and the first after IDLE idle, default 1s), ` +
	`shape=F (each batch size's first run), contention=C (per other batch running on the host), seed=N; ` +
	`e.g. realistic,seed=7 or jitter=0.1,stall=0.01x2,cold=2`

// ParseVariance reads a variance model: a preset ("exact", "realistic")
// and/or comma-separated KEY=VALUE factors (VarianceSyntax); factors after
// a preset override it ("realistic,stall=0"). A bad part is an error that
// names it.
func ParseVariance(s string) (Variance, error) {
	if strings.TrimSpace(s) == "" {
		return Variance{}, fmt.Errorf("variance %q: empty: want %s", s, VarianceSyntax)
	}
	var v Variance
	var errs []error
	for i, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		key, val, hasVal := strings.Cut(part, "=")
		if !hasVal {
			switch {
			case part == VarianceExact && i == 0:
				v = Exact()
			case part == VarianceRealistic && i == 0:
				v = Realistic()
			case part == VarianceExact || part == VarianceRealistic:
				errs = append(errs, fmt.Errorf("%q: a preset comes first, before the factors that change it", part))
			default:
				errs = append(errs, fmt.Errorf("%q: not a preset (exact, realistic) nor KEY=VALUE", part))
			}
			continue
		}
		if err := v.set(key, val); err != nil {
			errs = append(errs, fmt.Errorf("%q: %w", part, err))
		}
	}
	if len(errs) > 0 {
		return Variance{}, fmt.Errorf("variance %q: %w", s, errors.Join(errs...))
	}
	return v, nil
}

// set parses one KEY=VALUE factor into v.
func (v *Variance) set(key, val string) error {
	switch key {
	case "jitter":
		x, err := number(val, 0, 2)
		if err != nil {
			return fmt.Errorf("jitter: want a sigma from 0 to 2: %w", err)
		}
		v.Jitter = x
	case "stall":
		if val == "0" {
			v.StallP, v.StallX = 0, 0
			return nil
		}
		ps, fs, ok := strings.Cut(val, "x")
		if !ok {
			return fmt.Errorf("stall: want PxF, a fraction of batches and how many times as long they take (e.g. 0.01x2), or 0")
		}
		p, err := number(ps, 0, 1)
		if err != nil {
			return fmt.Errorf("stall: fraction: want 0 to 1: %w", err)
		}
		f, err := number(fs, 1, 1000)
		if err != nil {
			return fmt.Errorf("stall: factor: want 1 to 1000: %w", err)
		}
		v.StallP, v.StallX = p, f
	case "cold":
		fs, idle, hasIdle := strings.Cut(val, "@")
		f, err := number(fs, 1, 1000)
		if err != nil {
			return fmt.Errorf("cold: factor: want 1 to 1000: %w", err)
		}
		v.Cold, v.ColdIdle = f, DefaultColdIdle
		if hasIdle {
			d, err := time.ParseDuration(idle)
			if err != nil || d <= 0 {
				return fmt.Errorf("cold: idle %q: want a duration > 0 (e.g. 1s, 500ms)", idle)
			}
			v.ColdIdle = d
		}
	case "shape":
		f, err := number(val, 1, 1000)
		if err != nil {
			return fmt.Errorf("shape: factor: want 1 to 1000: %w", err)
		}
		v.Shape = f
	case "contention":
		c, err := number(val, 0, 10)
		if err != nil {
			return fmt.Errorf("contention: want a fraction per batch from 0 to 10: %w", err)
		}
		v.Contention = c
	case "seed":
		n, err := strconv.ParseUint(val, 10, 64)
		if err != nil {
			return fmt.Errorf("seed: want an unsigned integer")
		}
		v.Seed = n
	default:
		return fmt.Errorf("unknown factor %q (known: jitter, stall, cold, shape, contention, seed)", key)
	}
	return nil
}

// number parses a finite float in [lo, hi].
func number(s string, lo, hi float64) (float64, error) {
	x, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(x) || math.IsInf(x, 0) {
		return 0, fmt.Errorf("%q is not a number", s)
	}
	if x < lo || x > hi {
		return 0, fmt.Errorf("%s is out of range", s)
	}
	return x, nil
}

// Host counts the emulated batches in flight on one host, for
// Variance.Contention; executors given the same Host slow each other. The
// zero value is ready to use.
type Host struct{ inflight atomic.Int64 }

// variance is an executor's draws and what it remembers for Cold and
// Shape. Run calls it concurrently: mu guards every field.
type variance struct {
	v    Variance
	host *Host

	mu       sync.Mutex
	rng      *rand.Rand
	inflight int       // batches running on this executor
	lastEnd  time.Time // when the last one ended
	models   map[string]bool
	shapes   map[shapeKey]bool
}

type shapeKey struct {
	model string
	batch int
}

func newVariance(v Variance, host *Host) *variance {
	if host == nil {
		host = &Host{}
	}
	if v.ColdIdle <= 0 {
		v.ColdIdle = DefaultColdIdle
	}
	return &variance{v: v, host: host, rng: rand.New(rand.NewPCG(v.Seed, v.Seed^0x9e3779b97f4a7c15)),
		models: map[string]bool{}, shapes: map[shapeKey]bool{}}
}

// start draws the factor of a batch of model at size b starting at now
// and counts it in flight; the caller calls end when it is over.
func (s *variance) start(model string, b int, now time.Time) float64 {
	others := s.host.inflight.Add(1) - 1
	s.mu.Lock()
	defer s.mu.Unlock()
	// Draw the same numbers for every batch, whatever applies, so one
	// factor's setting does not shift the others' sequences.
	z, u := s.rng.NormFloat64(), s.rng.Float64()
	f := math.Exp(s.v.Jitter * z)
	if u < s.v.StallP && s.v.StallX > 1 {
		f *= s.v.StallX
	}
	idle := s.inflight == 0 && !s.lastEnd.IsZero() && now.Sub(s.lastEnd) >= s.v.ColdIdle
	if s.v.Cold > 1 && (!s.models[model] || idle) {
		f *= s.v.Cold
	}
	if s.v.Shape > 1 && !s.shapes[shapeKey{model, b}] {
		f *= s.v.Shape
	}
	f *= 1 + s.v.Contention*float64(others)
	s.models[model], s.shapes[shapeKey{model, b}] = true, true
	s.inflight++
	return f
}

// end counts a batch out, at now.
func (s *variance) end(now time.Time) {
	s.host.inflight.Add(-1)
	s.mu.Lock()
	s.inflight--
	if now.After(s.lastEnd) {
		s.lastEnd = now
	}
	s.mu.Unlock()
}
