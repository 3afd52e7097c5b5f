package eval

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/profile"
)

// SuiteConfig says which experiments to run.
type SuiteConfig struct {
	Duration time.Duration // of each run (Scrooge: 1000 s)
	Clients  int           // per app (Scrooge: 12)
	Seed     uint64
	Apps     []string // default: traffic, face, tracker
	// NexusGPUs are the GPU types the Nexus-style system is tried on, one
	// at a time (default P100 and V100: it assumes a homogeneous cluster,
	// so it is given the best of them).
	NexusGPUs []profile.WorkerTypeID
	// Ablations adds Scrooge 4.4's: spatial multiplexing off, turn-off
	// delays 0/30/120 s, SLO 1000 ms, and the adaptation experiment.
	Ablations bool
	// Parallel is how many runs go at once (default GOMAXPROCS); runs are
	// independent, so the results do not depend on it.
	Parallel int
	// Progress, when set, is called after each run (from the goroutine
	// that ran it, one call at a time).
	Progress func(done, total int, r *Result) `json:"-"`
}

// Suite is the results of a SuiteConfig's runs.
type Suite struct {
	Config      SuiteConfig
	Comparisons []Comparison
	Ablations   []Ablation
	Adaptation  *Adaptation
	Wall        time.Duration
}

// Comparison is one app served by mdag and by the Nexus-style system in
// each of its variants (front-ends x GPU type).
type Comparison struct {
	App   dag.AppID
	Mdag  *Result
	Nexus []*Result
}

// Ablation is one of mdag's design choices turned off or varied on an
// app, beside mdag as it ships on the same workload.
type Ablation struct {
	Name    string // e.g. "spatial multiplexing off"
	App     dag.AppID
	Base    *Result
	Variant *Result
}

// Adaptation is the objects-per-frame jump experiment: a steady workload
// whose objects per frame jump 4x at Jump.
type Adaptation struct {
	App     dag.AppID
	Clients int     // at FPS each, random phases
	FPS     float64 //
	Base    int     // objects per frame before the jump
	Jump    time.Duration
	Factor  float64
	Result  *Result
	// Recovered is how long after the jump the finish rate was back at
	// >= 95% in every second to the end of the run (-1: never).
	Recovered time.Duration
	Worst     float64 // the lowest per-second finish rate after the jump
}

// HeadroomOne names the ablation that plans mdag for the rate it sees
// (headroom 1 instead of 1.25), leaving bursts to the finish-rate rule.
const HeadroomOne = "headroom 1 (no planned slack; the finish-rate rule alone)"

// NexusHeadrooms are the over-provisioned Nexus-style variants (planned
// for 1.5x and 2x the rate, with the fewest front-ends): what it takes the
// Nexus-style system to finish as many frames as mdag, and what that
// costs. (Nexus over-provisions for bursts: its models are statically
// partitioned for an epoch.)
var NexusHeadrooms = []float64{1.5, 2}

// job is one run of the suite.
type job struct {
	x   Experiment
	out **Result
}

// RunSuite runs the experiments of cfg.
func RunSuite(cfg SuiteConfig) (*Suite, error) {
	wall := time.Now()
	if cfg.Duration <= 0 {
		cfg.Duration = 1000 * time.Second
	}
	if cfg.Clients <= 0 {
		cfg.Clients = 12
	}
	if len(cfg.Apps) == 0 {
		for _, s := range Setups() {
			cfg.Apps = append(cfg.Apps, s.App)
		}
	}
	if len(cfg.NexusGPUs) == 0 {
		cfg.NexusGPUs = []profile.WorkerTypeID{"P100", "V100"}
	}
	if cfg.Parallel <= 0 {
		cfg.Parallel = runtime.GOMAXPROCS(0)
	}
	s := &Suite{Config: cfg}
	var jobs []job
	type abl struct {
		name string
		sys  System
		slo  time.Duration
	}
	ablations := []abl{
		{"spatial multiplexing off", System{Name: "mdag-batching-only", NoSpatial: true}, 0},
		{"turn-off delay 0 s", System{Name: "mdag-turnoff-0s", TurnOff: -1}, 0},
		{"turn-off delay 120 s", System{Name: "mdag-turnoff-120s", TurnOff: 120 * time.Second}, 0},
		{"SLO 1000 ms", System{Name: "mdag-slo-1000ms"}, time.Second},
		{HeadroomOne, System{Name: "mdag-headroom-1", Headroom: 1}, 0},
	}
	s.Comparisons = make([]Comparison, len(cfg.Apps))
	if cfg.Ablations {
		s.Ablations = make([]Ablation, len(cfg.Apps)*len(ablations))
	}
	for i, name := range cfg.Apps {
		setup, err := Setup(name)
		if err != nil {
			return nil, err
		}
		app, pf, w, err := setup.Load(cfg.Duration, cfg.Clients, cfg.Seed)
		if err != nil {
			return nil, err
		}
		c := &s.Comparisons[i]
		c.App = app.Name
		base := Experiment{App: app, Profiles: pf, Workload: w, Cluster: Cluster(), Seed: cfg.Seed}
		x := base
		x.System = System{Name: "mdag"}
		jobs = append(jobs, job{x, &c.Mdag})
		var variants []System
		for _, g := range cfg.NexusGPUs {
			for _, fe := range setup.FrontEnds {
				variants = append(variants, System{Name: fmt.Sprintf("nexus-%s-%df", g, fe), Nexus: true, FrontEnds: fe, NexusGPU: g})
			}
			for _, h := range NexusHeadrooms {
				variants = append(variants, System{Name: fmt.Sprintf("nexus-%s-%df-x%g", g, setup.FrontEnds[0], h), Nexus: true,
					FrontEnds: setup.FrontEnds[0], NexusGPU: g, Headroom: h})
			}
		}
		c.Nexus = make([]*Result, len(variants)) // sized first: jobs point into it
		for i, v := range variants {
			x := base
			x.System = v
			jobs = append(jobs, job{x, &c.Nexus[i]})
		}
		if cfg.Ablations {
			for j, a := range ablations {
				ab := &s.Ablations[i*len(ablations)+j]
				ab.Name, ab.App = a.name, app.Name
				x := base
				x.System, x.SLO = a.sys, a.slo
				jobs = append(jobs, job{x, &ab.Variant})
			}
		}
	}
	if cfg.Ablations {
		s.Adaptation = &Adaptation{App: "tracker", Clients: 12, FPS: 25, Base: 2, Jump: min(60*time.Second, cfg.Duration/2), Factor: 4}
		x, err := adaptationExperiment(s.Adaptation, cfg)
		if err != nil {
			return nil, err
		}
		jobs = append(jobs, job{x, &s.Adaptation.Result})
	}
	if err := runJobs(jobs, cfg.Parallel, cfg.Progress); err != nil {
		return nil, err
	}
	for i := range s.Ablations {
		for _, c := range s.Comparisons {
			if c.App == s.Ablations[i].App {
				s.Ablations[i].Base = c.Mdag
			}
		}
	}
	if a := s.Adaptation; a != nil {
		a.Recovered, a.Worst = recovery(a.Result, a.Jump, 0.95)
	}
	s.Wall = time.Since(wall)
	return s, nil
}

// runJobs runs the jobs, n at a time; the first error wins.
func runJobs(jobs []job, n int, progress func(done, total int, r *Result)) error {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	done := 0
	sem := make(chan struct{}, max(1, n))
	for _, j := range jobs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			r, err := Run(j.x)
			mu.Lock()
			defer mu.Unlock()
			if err != nil && first == nil {
				first = fmt.Errorf("%s on %s: %w", j.x.System.Name, j.x.App.Name, err)
			}
			*j.out = r
			done++
			if err == nil && progress != nil {
				progress(done, len(jobs), r)
			}
		}()
	}
	wg.Wait()
	return first
}

// adaptationExperiment is a.Clients clients of a.App at a.FPS, each seeing
// a.Base objects per frame until the jump and a.Factor times as many
// after. The suite's: 12 tracker clients at 25 fps, 2 people then 8: the
// re-identification module's input goes from 600 to 2400 crops/s, more
// than the instances planned for 2 carry.
func adaptationExperiment(a *Adaptation, cfg SuiteConfig) (Experiment, error) {
	setup, err := Setup(string(a.App))
	if err != nil {
		return Experiment{}, err
	}
	app, pf, _, err := setup.Load(cfg.Duration, 1, cfg.Seed)
	if err != nil {
		return Experiment{}, err
	}
	d := min(cfg.Duration, a.Jump*2)
	flat := &Trace{Name: "flat", Period: time.Second, Counts: []int{a.Base, a.Base}}
	w := Workload{Duration: d, Objects: []Objects{{Class: setup.Objects[0].Class, Trace: flat}}, Jump: a.Jump, JumpFactor: a.Factor}
	r := rand.New(rand.NewPCG(cfg.Seed, 0x6a756d70)) // "jump"
	for i := range a.Clients {
		// Cameras are not in phase: each joins at a random point of the
		// first second.
		join := time.Duration(r.Int64N(int64(time.Second))).Truncate(time.Millisecond)
		w.Clients = append(w.Clients, Client{ID: fmt.Sprintf("c%02d", i), FPS: a.FPS, Join: join, Leave: d})
	}
	return Experiment{App: app, Profiles: pf, Workload: w, Cluster: Cluster(), Seed: cfg.Seed, System: System{Name: "mdag"}}, nil
}

// recovery is how long after jump r's finish rate was >= target in every
// second to the end (-1: never), and the lowest per-second rate after it.
func recovery(r *Result, jump time.Duration, target float64) (time.Duration, float64) {
	j := int(jump / time.Second)
	worst := 1.0
	back := -1
	for k := j; k < len(r.Seconds); k++ {
		f := r.Seconds[k].FinishRate()
		worst = min(worst, f)
		if f < target {
			back = -1
		} else if back < 0 {
			back = k
		}
	}
	// The last seconds of a run end with the drain: count only full ones.
	if back < 0 {
		return -1, worst
	}
	return time.Duration(back-j) * time.Second, worst
}

// Best is the Nexus-style variant a comparison holds up against mdag: the
// cheapest of those whose finish rate is within slack of mdag's, else the
// one with the highest finish rate.
func (c *Comparison) Best(slack float64) *Result {
	var best *Result
	for _, n := range c.Nexus {
		if n.FinishRate >= c.Mdag.FinishRate-slack && (best == nil || n.Cost < best.Cost) {
			best = n
		}
	}
	if best != nil {
		return best
	}
	for _, n := range c.Nexus {
		if best == nil || n.FinishRate > best.FinishRate {
			best = n
		}
	}
	return best
}

// Comparable is how close finish rates must be to compare costs: 2
// points.
const Comparable = 0.02

// Check says where the results contradict the direction Scrooge reports:
// mdag must finish at least as many frames as every Nexus-style variant,
// and cost no more than any variant that finishes comparably (within
// Comparable). Each violation is a sentence; none: nil.
func (s *Suite) Check() []string {
	var out []string
	for _, c := range s.Comparisons {
		m := c.Mdag
		for _, n := range c.Nexus {
			if n.FinishRate > m.FinishRate {
				out = append(out, fmt.Sprintf("%s: %s finished %.2f%% of frames, mdag %.2f%%", c.App, n.System, 100*n.FinishRate, 100*m.FinishRate))
			}
			if n.FinishRate >= m.FinishRate-Comparable && n.Cost < m.Cost {
				out = append(out, fmt.Sprintf("%s: %s cost $%.3f at a comparable finish rate (%.2f%%), mdag $%.3f (%.2f%%)",
					c.App, n.System, n.Cost, 100*n.FinishRate, m.Cost, 100*m.FinishRate))
			}
		}
		for _, r := range append([]*Result{m}, c.Nexus...) {
			for _, p := range r.Problems {
				out = append(out, fmt.Sprintf("%s: %s: %s", c.App, r.System, p))
			}
		}
	}
	slices.Sort(out)
	return out
}

// Runs counts the suite's runs.
func (s *Suite) Runs() int {
	n := len(s.Ablations)
	for _, c := range s.Comparisons {
		n += 1 + len(c.Nexus)
	}
	if s.Adaptation != nil {
		n++
	}
	return n
}
