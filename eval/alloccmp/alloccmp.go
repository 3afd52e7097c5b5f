// Package alloccmp is the allocator ablation of Scrooge Section 4.3: the
// exact MILP (allocator/milp) against the greedy heuristic and brute force
// on the same allocation questions, at 2 and 30 worker types. It reports
// the cost ratios greedy/MILP and MILP/brute force (Scrooge Figure 10) and
// the solve times of each method (Figure 11), as a Markdown table and two
// SVG CDFs drawn with eval/plot.
//
// # The cases
//
// Every app of Apps (the seven Scrooge mDAGs and scrooge-example) is asked
// Config.Cases times, at rates drawn from a seeded math/rand/v2 source: s
// streams (1-12) at the app's frame rate jittered by 0.75-1.25x, as the
// sessions of Scrooge Section 4.2 vary (scrooge-example's fps is already its
// session rate, so it is scaled by s/12). The same rates are asked at every
// worker-type count of Config.WorkerTypes, over profile.Widen's catalog.
//
// # Brute force is bounded
//
// Brute force enumerates every (full configuration, n, partial
// configuration) of every module before it searches the combinations of
// their fronts; the enumeration dominates and grows with rate/capacity times
// the configurations squared. A case is skipped (Case.BruteSkipped says why)
// when that enumeration, sum over modules of (1 + sum over configurations of
// floor(rate/capacity)) x configurations, exceeds Config.MaxSearch (default
// 200,000: about 0.4 s here), when the fronts' combinations exceed
// allocator.MaxBruteForce, or, as a backstop, when it runs past
// Config.BruteForceLimit. The first two rules depend only on the case, so
// which cases are skipped is deterministic; the backstop never fires under
// the default bound on this machine (a run that hit it says so).
//
// Costs are those of feasible allocations only: a case no method can
// allocate within the SLO is recorded (Case.Infeasible) and left out of the
// ratios. Costs are deterministic for a seed; solve times are wall time
// around allocator.Allocate (problem setup included, as BenchmarkSolve in
// allocator/milp measures it).
package alloccmp

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/mdag/mdag/allocator"
	"github.com/mdag/mdag/allocator/milp"
	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/examples"
	"github.com/mdag/mdag/profile"
)

// Apps are the examples asked: Scrooge's seven mDAGs (its Figure 1) and its
// worked allocation example.
var Apps = []string{"traffic", "face", "tracker", "pose", "caption", "audio", "actdet", "scrooge-example"}

// Config sets up a run. Zero BruteForceLimit and MaxSearch take their
// defaults.
type Config struct {
	Seed        int64
	Cases       int   // rates drawn per app, each asked at every worker-type count
	WorkerTypes []int // e.g. {2, 30}
	// BruteForceLimit is the backstop wall-clock limit of one brute-force
	// search (default 5 s); a search past it is skipped, and says so.
	BruteForceLimit time.Duration
	// MaxSearch bounds brute force's enumeration of (m, n, p) options,
	// summed over modules (default DefaultMaxSearch); larger cases skip it.
	MaxSearch float64
}

// DefaultMaxSearch is Config.MaxSearch's default: the largest brute-force
// enumeration measured at about 0.4 s on the 2-core development machine.
const DefaultMaxSearch = 200_000

// DefaultConfig is the ablation docs/benchmarks.md reports: seed 1, 8 rates
// per app, 2 and 30 worker types.
func DefaultConfig() Config {
	return Config{Seed: 1, Cases: 8, WorkerTypes: []int{2, 30}, BruteForceLimit: 5 * time.Second, MaxSearch: DefaultMaxSearch}
}

// Case is one allocation question and each method's answer. A cost is 0
// where that method found no allocation (Infeasible or Disagree say why)
// or did not run (BruteSkipped).
type Case struct {
	App                             string
	Types                           int
	Rate                            float64
	MILPCost, GreedyCost, BruteCost float64
	MILPTime, GreedyTime, BruteTime time.Duration
	BruteSkipped                    string
	SearchSize                      float64 // brute force's (m, n, p) enumeration size
	Infeasible                      string  // why no allocation meets the SLO ("" when one does)
	Disagree                        string  // methods disagreeing on feasibility: a finding
}

// Result is a run: every case and, per worker-type count, a summary.
type Result struct {
	Config    Config
	Cases     []Case
	Summaries []Summary // in Config.WorkerTypes order
}

// Summary aggregates the cases of one worker-type count.
type Summary struct {
	Types        int
	Cases        int // all cases asked
	Infeasible   int // cases with no allocation within the SLO
	BruteRun     int // cases brute force searched
	BruteSkipped int
	// Solve times per method over the cases it ran.
	MILPTime, GreedyTime, BruteTime Times
	// GreedyRatio is greedy's cost over MILP's, over feasible cases.
	GreedyRatio Ratios
	// BruteRatio is MILP's cost over brute force's, over feasible cases
	// brute force searched.
	BruteRatio Ratios
	// GreedyCostlier is the share of feasible cases where greedy costs
	// more than MILP (by more than 1e-9 relative).
	GreedyCostlier float64
	// MILPCostlier counts cases where MILP costs more than greedy or brute
	// force found (beyond 1e-9 relative): MILP is exact, so any is a bug.
	MILPCostlier int
	Disagree     int // cases where the methods disagree on feasibility
}

// Times are solve times: every one (sorted, for the CDF), the median (the
// upper one of an even count) and the 99th percentile (nearest rank).
type Times struct {
	All         []time.Duration
	Median, P99 time.Duration
}

// Ratios are cost ratios: every one (sorted, for the CDF), the median (the
// upper one of an even count) and the maximum.
type Ratios struct {
	All         []float64
	Median, Max float64
}

// tol is the relative tolerance of cost comparisons: float rounding in the
// solvers, never a real difference.
const tol = 1e-9

// Run asks every case with milp, greedy and bruteforce and summarises.
func Run(cfg Config) (*Result, error) {
	if cfg.Cases < 1 {
		return nil, fmt.Errorf("alloccmp: cases must be >= 1, got %d", cfg.Cases)
	}
	if len(cfg.WorkerTypes) == 0 {
		return nil, errors.New("alloccmp: no worker-type counts to ask at")
	}
	for _, k := range cfg.WorkerTypes {
		if k < 1 {
			return nil, fmt.Errorf("alloccmp: worker-type count must be >= 1, got %d", k)
		}
	}
	if cfg.BruteForceLimit < 0 || cfg.MaxSearch < 0 || math.IsNaN(cfg.MaxSearch) {
		return nil, fmt.Errorf("alloccmp: brute-force limits must be >= 0, got %v and %v", cfg.BruteForceLimit, cfg.MaxSearch)
	}
	if cfg.BruteForceLimit == 0 {
		cfg.BruteForceLimit = 5 * time.Second
	}
	if cfg.MaxSearch == 0 {
		cfg.MaxSearch = DefaultMaxSearch
	}
	res := &Result{Config: cfg}
	rng := rand.New(rand.NewPCG(uint64(cfg.Seed), 0x5c7009e))
	for _, app := range Apps {
		g, cat, err := examples.Load(app)
		if err != nil {
			return nil, fmt.Errorf("alloccmp: example %s: %w", app, err)
		}
		rates := make([]float64, cfg.Cases)
		for i := range rates {
			streams := 1 + rng.IntN(12)
			jitter := 0.75 + 0.5*rng.Float64()
			if app == "scrooge-example" {
				rates[i] = g.App().FPS * float64(streams) / 12 * jitter
			} else {
				rates[i] = g.App().FPS * float64(streams) * jitter
			}
		}
		for _, k := range cfg.WorkerTypes {
			wide, err := profile.Widen(g.App(), cat, k)
			if err != nil {
				return nil, fmt.Errorf("alloccmp: %s at %d worker types: %w", app, k, err)
			}
			for _, rate := range rates {
				c, err := ask(g, wide, app, k, rate, cfg)
				if err != nil {
					return nil, err
				}
				res.Cases = append(res.Cases, c)
			}
		}
	}
	for _, k := range cfg.WorkerTypes {
		res.Summaries = append(res.Summaries, summarise(k, res.Cases))
	}
	return res, nil
}

// ask puts one case to the three methods.
func ask(g *dag.Graph, cat *profile.Catalog, app string, k int, rate float64, cfg Config) (Case, error) {
	c := Case{App: app, Types: k, Rate: rate}
	req := allocator.Request{Graph: g, Catalog: cat, Rate: rate, MILPSolver: milp.Solver{}}
	where := fmt.Sprintf("alloccmp: %s at %d worker types, rate %.4g", app, k, rate)
	p, err := allocator.NewProblem(req)
	if err != nil {
		return c, fmt.Errorf("%s: %w", where, err)
	}
	c.SearchSize = SearchSize(p)

	run := func(ctx context.Context, m allocator.Method) (*allocator.Allocation, time.Duration, error) {
		req.Method = m
		start := time.Now()
		a, err := allocator.Allocate(ctx, req)
		return a, time.Since(start), err
	}
	mi, took, err := run(context.Background(), allocator.MILP)
	if err != nil {
		return c, fmt.Errorf("%s: milp: %w", where, err)
	}
	c.MILPTime = took
	gr, took, err := run(context.Background(), allocator.Greedy)
	if err != nil {
		return c, fmt.Errorf("%s: greedy: %w", where, err)
	}
	c.GreedyTime = took
	var bf *allocator.Allocation
	if c.SearchSize > cfg.MaxSearch {
		c.BruteSkipped = fmt.Sprintf("search size %.3g (m, n, p) options > %.3g", c.SearchSize, cfg.MaxSearch)
	} else {
		ctx, cancel := context.WithTimeout(context.Background(), cfg.BruteForceLimit)
		bf, took, err = run(ctx, allocator.BruteForce)
		cancel()
		switch {
		case errors.Is(err, allocator.ErrTooLarge):
			c.BruteSkipped, bf = err.Error(), nil
		case errors.Is(err, context.DeadlineExceeded):
			c.BruteSkipped, bf = fmt.Sprintf("timed out after %v", cfg.BruteForceLimit), nil
		case err != nil:
			return c, fmt.Errorf("%s: bruteforce: %w", where, err)
		default:
			c.BruteTime = took
		}
	}

	if mi.Feasible {
		c.MILPCost = mi.Cost
	} else {
		c.Infeasible = mi.Reason
	}
	if gr.Feasible {
		c.GreedyCost = gr.Cost
	}
	if bf != nil && bf.Feasible {
		c.BruteCost = bf.Cost
	}
	var dis []string
	if gr.Feasible != mi.Feasible {
		dis = append(dis, fmt.Sprintf("greedy feasible %v, milp %v", gr.Feasible, mi.Feasible))
	}
	if bf != nil && bf.Feasible != mi.Feasible {
		dis = append(dis, fmt.Sprintf("bruteforce feasible %v, milp %v", bf.Feasible, mi.Feasible))
	}
	if len(dis) > 0 {
		c.Disagree = fmt.Sprint(dis)
	}
	return c, nil
}

// SearchSize is the number of (full configuration, n, partial
// configuration) options brute force enumerates for a problem: per module,
// (1 + sum over configurations of floor(rate/capacity)) times the
// configurations, summed over modules.
func SearchSize(p *allocator.Problem) float64 {
	var size float64
	for i := range p.Modules {
		n := 1.0
		for _, c := range p.Configs[i] {
			n += math.Floor(p.Rates[i] / c.Cap)
		}
		size += n * float64(len(p.Configs[i]))
	}
	return size
}

// feasible reports whether every method that ran found an allocation.
func (c Case) feasible() bool { return c.Infeasible == "" && c.Disagree == "" }

// bruteRan reports whether brute force searched the case.
func (c Case) bruteRan() bool { return c.BruteSkipped == "" }

func summarise(k int, cases []Case) Summary {
	s := Summary{Types: k}
	var mt, gt, bt []time.Duration
	var gr, br []float64
	costlier := 0
	for _, c := range cases {
		if c.Types != k {
			continue
		}
		s.Cases++
		mt, gt = append(mt, c.MILPTime), append(gt, c.GreedyTime)
		if c.bruteRan() {
			s.BruteRun++
			bt = append(bt, c.BruteTime)
		} else {
			s.BruteSkipped++
		}
		if c.Infeasible != "" {
			s.Infeasible++
		}
		if c.Disagree != "" {
			s.Disagree++
		}
		if !c.feasible() {
			continue
		}
		gr = append(gr, c.GreedyCost/c.MILPCost)
		if c.GreedyCost > c.MILPCost*(1+tol) {
			costlier++
		}
		bad := c.GreedyCost < c.MILPCost*(1-tol)
		if c.bruteRan() {
			br = append(br, c.MILPCost/c.BruteCost)
			bad = bad || c.BruteCost < c.MILPCost*(1-tol)
		}
		if bad {
			s.MILPCostlier++
		}
	}
	s.MILPTime, s.GreedyTime, s.BruteTime = times(mt), times(gt), times(bt)
	s.GreedyRatio, s.BruteRatio = ratios(gr), ratios(br)
	if len(gr) > 0 {
		s.GreedyCostlier = float64(costlier) / float64(len(gr))
	}
	return s
}

func times(d []time.Duration) Times {
	slices.Sort(d)
	t := Times{All: d}
	if len(d) > 0 {
		t.Median, t.P99 = d[len(d)/2], d[rank(len(d), 0.99)]
	}
	return t
}

func ratios(r []float64) Ratios {
	slices.Sort(r)
	out := Ratios{All: r}
	if len(r) > 0 {
		out.Median, out.Max = r[len(r)/2], r[len(r)-1]
	}
	return out
}

// rank is the nearest-rank index of quantile q in n sorted values.
func rank(n int, q float64) int {
	return min(n-1, max(0, int(math.Ceil(q*float64(n)))-1))
}
