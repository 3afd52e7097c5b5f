package serf

import (
	"errors"
	"fmt"
	"math"
	"sort"
)

// Rates are the service rates profiled at one intra-op thread count:
// Mu[i-1] = mu_i, the rate of each request while i requests run at once,
// each with Threads intra-op threads (SERF Sec. IV-B: one short profiling
// run per parallelism degree tuple).
type Rates struct {
	Threads int       `json:"threads" yaml:"threads"`
	Mu      []float64 `json:"mu" yaml:"mu"`
}

// Config is one parallelism configuration: at most C requests in service
// (SERF's C_service), each with T intra-op threads (C_intra), and the
// profiled rates mu_1..mu_C at T threads.
type Config struct {
	C  int       `json:"c"`
	T  int       `json:"t"`
	Mu []float64 `json:"mu"`
}

// String renders the configuration as c=2,t=4.
func (cfg Config) String() string { return fmt.Sprintf("c=%d,t=%d", cfg.C, cfg.T) }

// Cores is the number of cores the configuration occupies, c*t.
func (cfg Config) Cores() int { return cfg.C * cfg.T }

// Capacity is c*mu_c, the arrival rate at which the queue stops being
// stable.
func (cfg Config) Capacity() float64 { return Capacity(cfg.Mu) }

// Predict is Predict(cfg.Mu, lambda) for a configuration whose Mu has
// exactly C rates.
func (cfg Config) Predict(lambda float64) (Prediction, error) {
	if cfg.C < 1 || cfg.T < 1 {
		return Prediction{}, fmt.Errorf("serf: config %s: c and t must be >= 1", cfg)
	}
	if len(cfg.Mu) != cfg.C {
		return Prediction{}, fmt.Errorf("serf: config %s: %d service rates, want mu_1..mu_%d", cfg, len(cfg.Mu), cfg.C)
	}
	p, err := Predict(cfg.Mu, lambda)
	if err != nil {
		return p, fmt.Errorf("config %s: %w", cfg, err)
	}
	return p, nil
}

// Configs expands profiled rates into every configuration (c, t) that fits
// the cores: c = 1..len(Mu) with c*t <= cores. Rates profiled beyond
// cores/t requests are not used. Errors name the field: rates[k].threads,
// rates[k].mu[i].
func Configs(rates []Rates, cores int) ([]Config, error) {
	if cores < 1 {
		return nil, fmt.Errorf("serf: cores: must be >= 1, got %d", cores)
	}
	if len(rates) == 0 {
		return nil, errors.New("serf: rates: none profiled (want at least one thread count with mu_1)")
	}
	var errs []error
	seen := map[int]int{}
	var out []Config
	for k, r := range rates {
		at := fmt.Sprintf("rates[%d]", k)
		switch j, dup := seen[r.Threads]; {
		case r.Threads < 1:
			errs = append(errs, fmt.Errorf("serf: %s.threads: must be >= 1, got %d", at, r.Threads))
			continue
		case r.Threads > cores:
			errs = append(errs, fmt.Errorf("serf: %s.threads: %d threads exceed the %d cores", at, r.Threads, cores))
			continue
		case dup:
			errs = append(errs, fmt.Errorf("serf: %s.threads: duplicate thread count %d (first at rates[%d])", at, r.Threads, j))
			continue
		}
		seen[r.Threads] = k
		if err := checkMu(r.Mu); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", at, err))
			continue
		}
		for c := 1; c <= len(r.Mu) && c*r.Threads <= cores; c++ {
			out = append(out, Config{C: c, T: r.Threads, Mu: append([]float64(nil), r.Mu[:c]...)})
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	sortConfigs(out)
	return out, nil
}

func sortConfigs(cfgs []Config) {
	sort.SliceStable(cfgs, func(a, b int) bool {
		if cfgs[a].C != cfgs[b].C {
			return cfgs[a].C < cfgs[b].C
		}
		return cfgs[a].T < cfgs[b].T
	})
}

// Row is one load level of the reference table.
type Row struct {
	Lambda float64 `json:"lambda"`
	// Best indexes Table.Configs: the configuration with the lowest
	// predicted latency at Lambda (ties: fewer cores, then smaller c, then
	// smaller t); -1 when no configuration is stable at Lambda.
	Best int `json:"best"`
	// Latency is the best configuration's predicted mean latency (s), 0
	// when there is none.
	Latency float64 `json:"latency"`
	// Predictions holds every configuration's prediction, in Configs order;
	// unstable ones have infinite Latency.
	Predictions []Prediction `json:"predictions"`
}

// Table is SERF's configuration reference table (Sec. IV-A, Fig. 8): load
// levels mapped to the best parallelism configuration, built once from the
// profiled rates and looked up by the scheduler with the current load.
type Table struct {
	Configs []Config `json:"configs"`
	Rows    []Row    `json:"rows"` // by increasing Lambda
}

// NewTable predicts every configuration at every load level (Eq. 13) and
// keeps the best per level. Loads must be finite, > 0 and strictly
// increasing; configurations must be valid and distinct.
func NewTable(cfgs []Config, loads []float64) (*Table, error) {
	if len(cfgs) == 0 {
		return nil, errors.New("serf: table: no configurations")
	}
	if len(loads) == 0 {
		return nil, errors.New("serf: table: no load levels")
	}
	seen := map[[2]int]int{}
	for i, cfg := range cfgs {
		if _, err := cfg.Predict(0); err != nil {
			return nil, fmt.Errorf("serf: table: configs[%d]: %w", i, err)
		}
		k := [2]int{cfg.C, cfg.T}
		if j, dup := seen[k]; dup {
			return nil, fmt.Errorf("serf: table: configs[%d]: duplicate configuration %s (first at configs[%d])", i, cfg, j)
		}
		seen[k] = i
	}
	for i, l := range loads {
		if math.IsNaN(l) || math.IsInf(l, 0) || l <= 0 {
			return nil, fmt.Errorf("serf: table: loads[%d]: must be a finite rate > 0, got %g", i, l)
		}
		if i > 0 && l <= loads[i-1] {
			return nil, fmt.Errorf("serf: table: loads[%d]: %g is not above loads[%d] = %g (want increasing levels)", i, l, i-1, loads[i-1])
		}
	}
	t := &Table{Configs: append([]Config(nil), cfgs...)}
	for _, l := range loads {
		row := Row{Lambda: l, Best: -1, Latency: math.Inf(1)}
		for i, cfg := range t.Configs {
			p, err := cfg.Predict(l)
			if err != nil && !errors.Is(err, ErrUnstable) {
				return nil, err
			}
			row.Predictions = append(row.Predictions, p)
			if err != nil {
				continue
			}
			if row.Best < 0 || better(p.Latency, cfg, row.Latency, t.Configs[row.Best]) {
				row.Best, row.Latency = i, p.Latency
			}
		}
		if row.Best < 0 {
			row.Latency = 0
		}
		t.Rows = append(t.Rows, row)
	}
	return t, nil
}

// better orders candidates: lower latency, then fewer cores, smaller c,
// smaller t.
func better(la float64, a Config, lb float64, b Config) bool {
	switch {
	case la != lb:
		return la < lb
	case a.Cores() != b.Cores():
		return a.Cores() < b.Cores()
	case a.C != b.C:
		return a.C < b.C
	}
	return a.T < b.T
}

// Lookup returns the row the scheduler uses at the current load lambda:
// the lowest level at or above lambda (so the configuration chosen was
// judged at a load no lighter than the real one). ok is false above the
// highest level or for a lambda that is not a finite rate >= 0.
func (t *Table) Lookup(lambda float64) (Row, bool) {
	if math.IsNaN(lambda) || math.IsInf(lambda, 0) || lambda < 0 {
		return Row{}, false
	}
	i := sort.Search(len(t.Rows), func(i int) bool { return t.Rows[i].Lambda >= lambda })
	if i == len(t.Rows) {
		return Row{}, false
	}
	return t.Rows[i], true
}

// EvenLoads returns n load levels evenly spread over (0, max]: max*k/n for
// k = 1..n, as the paper's 10 levels from low to high load.
func EvenLoads(n int, max float64) ([]float64, error) {
	if n < 1 {
		return nil, fmt.Errorf("serf: load levels: n must be >= 1, got %d", n)
	}
	if math.IsNaN(max) || math.IsInf(max, 0) || max <= 0 {
		return nil, fmt.Errorf("serf: load levels: max must be a finite rate > 0, got %g", max)
	}
	out := make([]float64, n)
	for k := range out {
		out[k] = max * float64(k+1) / float64(n)
	}
	return out, nil
}

// MaxCapacity is the largest capacity c*mu_c among the configurations: the
// load beyond which no configuration is stable.
func MaxCapacity(cfgs []Config) float64 {
	m := 0.0
	for _, cfg := range cfgs {
		m = max(m, cfg.Capacity())
	}
	return m
}
