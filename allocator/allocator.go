// Package allocator chooses, for every module of an mDAG, the worker types,
// configurations (batch, concurrency) and capacity that carry the session's
// rate within the end-to-end SLO at the minimum cost per hour (Scrooge
// Section 3.3; Nexus Section 6.2).
//
// # The model
//
// A module with input rate r runs n >= 0 full instances of one configuration
// m (rate cap_m each, worst latency W_m = d_m + b_m/cap_m) plus at most one
// partial instance of any configuration p carrying t = r - n*cap_m,
// 0 < t <= cap_p, with worst latency d_p + b_p/t (Scrooge Eq. 3). Full
// instances cost their worker's price, a partial price_p*t/cap_p. Every
// source-to-sink path's sum of module latencies must be within the SLO.
// Ballooning factors multiply d; scaling factors set the rates.
//
// # How it is solved exactly
//
// For one module the choices are finite: each (m, n, p) has an exact latency
// and cost. profile.Options enumerates them and keeps the Pareto front
// (faster or cheaper than every other), which loses nothing. The MILP then
// picks one option per module (a binary per option) with start-time
// variables per module and one constraint per edge and per sink; it is exact
// in one MILP, so Scrooge's second, non-convex refinement of partial
// allocations (and its up-to-3% gap) is not needed. Ties in cost go to the
// lower critical-path latency, found by a second solve.
//
// # Alternatives behind the same interface
//
//   - bruteforce: enumerates every (m, n, p) per module independently of
//     the front code and searches all combinations; exact; small inputs only.
//   - greedy: from the fastest allocation, repeatedly applies the one-module
//     change with the best cost saving per millisecond of latency added
//     (Scrooge Section 4.4's ratio heuristic) while the SLO holds.
//   - nexus-dp: Nexus's dynamic program over latency budgets discretised in
//     segments (default 1 ms) on the graph's series-parallel decomposition
//     (trees and fork-join graphs), then the cheapest option per module
//     within its budget.
//   - even: the SLO split evenly across the stages of the longest path
//     through each module, then the cheapest option per module (Nexus's
//     baseline).
//
// # Imports
//
// The package is pure Go: it imports dag, profile and the standard library,
// never lp_solve. The MILP solver lives in allocator/milp, which imports
// this package and golp; the caller hands it in (Request.MILPSolver, usually
// milp.Solver{}), and a milp request without one fails with
// ErrNoMILPSolver. Other solvers can implement Solver with Problem's
// exported fields and methods.
package allocator

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/profile"
)

// Method names an allocation algorithm.
type Method string

const (
	MILP       Method = "milp"
	BruteForce Method = "bruteforce"
	Greedy     Method = "greedy"
	NexusDP    Method = "nexus-dp"
	Even       Method = "even"
)

// Methods lists every method, the default first.
var Methods = []Method{MILP, BruteForce, Greedy, NexusDP, Even}

// Solver picks one option per module of a Problem. The baselines are built
// in; the MILP (allocator/milp) is handed in through Request.MILPSolver.
type Solver interface {
	// Solve returns the chosen option index per module (in Problem order),
	// or ok false with a reason when it finds no allocation within the SLO.
	Solve(ctx context.Context, p *Problem) (choice []int, stats Stats, err error)
}

// Stats describes how a solver ran.
type Stats struct {
	Status     string `json:"status,omitempty"`     // solver status, e.g. OPTIMAL
	Variables  int    `json:"variables,omitempty"`  // MILP columns
	Rows       int    `json:"rows,omitempty"`       // MILP constraints
	Candidates int64  `json:"candidates,omitempty"` // combinations or moves examined
	Reason     string `json:"reason,omitempty"`     // why no allocation was found
}

// Request is one allocation question.
type Request struct {
	Graph   *dag.Graph
	Catalog *profile.Catalog
	Rate    float64                  // ingress rate at the source, items/s
	Scale   map[dag.ModuleID]float64 // observed scaling factors overriding the app's
	Balloon map[dag.ModuleID]float64 // execution-time inflation per module (>= 0; 1 = none)
	Exclude []profile.WorkerTypeID   // worker types not to use
	Method  Method                   // default MILP
	Segment time.Duration            // nexus-dp budget segment; default 1 ms
	Timeout time.Duration            // MILP solver time limit; default 10 s
	Now     func() time.Time         // clock for solve_ms; default time.Now
	// Budget is the latency the graph may use, source to sinks (default
	// and at most the app's SLO). The runtime plans with the SLO less the
	// delay it observes before frames reach the session (capture, encode,
	// network, decode), which the graph cannot spend.
	Budget time.Duration
	// Limits caps the instances of a worker type the allocation may use
	// (whole instances count 1 each, a partial its share t/cap), so a
	// capped pool gets the cheapest allocation that fits it rather than one
	// placement cannot carry out. The MILP honours them exactly; the other
	// methods' answers are checked and reported infeasible when over.
	Limits map[profile.WorkerTypeID]float64
	// MILPSolver solves method milp (the default). This package links no
	// MILP solver: callers hand one in, normally milp.Solver{} from
	// allocator/milp. A milp request without one fails with ErrNoMILPSolver.
	MILPSolver Solver
}

// Problem is a Request prepared for the solvers: the modules in topological
// order with their rates, configurations and option fronts.
type Problem struct {
	Graph   *dag.Graph
	SLO     time.Duration
	Modules []dag.ModuleID
	Rates   []float64
	Configs [][]profile.Config
	Fronts  [][]profile.Choice // per module, sorted by latency, cost falling
	Segment time.Duration
	Timeout time.Duration
	Limits  map[profile.WorkerTypeID]float64

	preds [][]int
	sinks []int
	empty bool // some module has no option within the SLO
}

// NewProblem prepares a request: rates from the ingress rate and scaling
// factors, configurations without excluded worker types and with ballooning
// applied, and each module's option front within the SLO.
func NewProblem(req Request) (*Problem, error) {
	g, cat := req.Graph, req.Catalog
	if g == nil || cat == nil {
		return nil, fmt.Errorf("allocator: request needs a graph and a catalog")
	}
	if req.Rate <= 0 || math.IsNaN(req.Rate) || math.IsInf(req.Rate, 0) {
		return nil, fmt.Errorf("%w: ingress rate must be a positive number, got %v", ErrBadRequest, req.Rate)
	}
	for m, f := range req.Scale {
		if _, ok := g.App().Module(m); !ok {
			return nil, fmt.Errorf("%w: --scale names unknown module %q", ErrBadRequest, m)
		}
		if f < 0 || math.IsNaN(f) || math.IsInf(f, 0) {
			return nil, fmt.Errorf("%w: scale of %s must be >= 0, got %v", ErrBadRequest, m, f)
		}
	}
	for m, f := range req.Balloon {
		if _, ok := g.App().Module(m); !ok {
			return nil, fmt.Errorf("%w: --balloon names unknown module %q", ErrBadRequest, m)
		}
		if f <= 0 || math.IsNaN(f) || math.IsInf(f, 0) {
			return nil, fmt.Errorf("%w: balloon factor of %s must be > 0, got %v", ErrBadRequest, m, f)
		}
	}
	for _, w := range req.Exclude {
		found := false
		for _, wt := range cat.Workers() {
			found = found || wt.Type == w
		}
		if !found {
			return nil, fmt.Errorf("%w: --exclude-worker names unknown worker type %q", ErrBadRequest, w)
		}
	}
	if req.Budget < 0 {
		return nil, fmt.Errorf("%w: latency budget must be >= 0, got %v", ErrBadRequest, req.Budget)
	}
	for w, n := range req.Limits {
		if n < 0 || math.IsNaN(n) || math.IsInf(n, 0) {
			return nil, fmt.Errorf("%w: limit of worker type %s must be >= 0, got %v", ErrBadRequest, w, n)
		}
	}
	p := &Problem{Graph: g, SLO: g.App().SLO, Modules: g.Order(), Segment: req.Segment, Timeout: req.Timeout, Limits: req.Limits}
	if req.Budget > 0 && req.Budget < p.SLO {
		p.SLO = req.Budget
	}
	if p.Segment <= 0 {
		p.Segment = time.Millisecond
	}
	if p.Timeout <= 0 {
		p.Timeout = 10 * time.Second
	}
	rates := g.Rates(req.Rate, req.Scale)
	idx := map[dag.ModuleID]int{}
	for i, m := range p.Modules {
		idx[m] = i
	}
	p.preds = make([][]int, len(p.Modules))
	for i, m := range p.Modules {
		for _, in := range g.Inputs(m) {
			if in != dag.Source {
				p.preds[i] = append(p.preds[i], idx[in])
			}
		}
		if len(g.Outputs(m)) == 0 {
			p.sinks = append(p.sinks, i)
		}
		var cfgs []profile.Config
		for _, c := range cat.Configs(m) {
			if slices.Contains(req.Exclude, c.Worker) {
				continue
			}
			if f, ok := req.Balloon[m]; ok {
				c = c.Balloon(f)
			}
			cfgs = append(cfgs, c)
		}
		cfgs = slices.DeleteFunc(cfgs, func(c profile.Config) bool { l, ok := req.Limits[c.Worker]; return ok && l == 0 })
		p.Rates = append(p.Rates, rates[m])
		p.Configs = append(p.Configs, cfgs)
		if len(req.Limits) > 0 && (req.Method == MILP || req.Method == "") {
			p.Fronts = append(p.Fronts, limitedFront(cfgs, rates[m], p.SLO, req.Limits))
		} else {
			p.Fronts = append(p.Fronts, profile.Options(cfgs, rates[m], p.SLO))
		}
		p.empty = p.empty || len(p.Fronts[i]) == 0
	}
	return p, nil
}

// Preds returns the indices (in Problem order) of the modules feeding module
// i; the source is not one. Do not modify the slice.
func (p *Problem) Preds(i int) []int { return p.preds[i] }

// Sinks returns the indices of the modules with no outputs, where every
// source-to-sink path ends. Do not modify the slice.
func (p *Problem) Sinks() []int { return p.sinks }

// Infeasible returns why no allocation can meet the SLO, or "" when the
// fastest configurations of every module fit it. It is computed on demand:
// the planners never need it when an allocation exists.
func (p *Problem) Infeasible() string {
	var unusable []string
	lat := make([]time.Duration, len(p.Modules))
	for i, m := range p.Modules {
		fast, ok := profile.Fastest(p.Configs[i], p.Rates[i])
		if !ok {
			unusable = append(unusable, string(m))
		}
		lat[i] = fast.Latency
	}
	if len(unusable) > 0 {
		return fmt.Sprintf("no configuration left can carry the rate of %s (after exclusions and zero worker limits)", strings.Join(unusable, ", "))
	}
	if crit, path := p.critical(lat); crit > p.SLO+Slack {
		return fmt.Sprintf("the fastest configurations give %s ms on %s, above the %s ms SLO (by %s ms)",
			fmtMS(crit), path, fmtMS(p.SLO), fmtMS(crit-p.SLO))
	}
	return ""
}

// limitedFront is module options for a MILP under worker limits. The plain
// front keeps, for each latency, only the cheapest way, which may use a
// capped type where a dearer way does not; so it is the union of the fronts
// with each subset of the capped types left out (all subsets up to 4 capped
// types, else none, each one alone and all), sorted by latency then cost.
// It is not every trade-off between capped types, but it always holds a way
// that avoids any subset of them entirely.
func limitedFront(cfgs []profile.Config, rate float64, maxLatency time.Duration, limits map[profile.WorkerTypeID]float64) []profile.Choice {
	var capped []profile.WorkerTypeID
	for _, w := range sortedTypes(limits) {
		if slices.ContainsFunc(cfgs, func(c profile.Config) bool { return c.Worker == w }) {
			capped = append(capped, w)
		}
	}
	var masks []int
	if len(capped) <= 4 {
		for m := range 1 << len(capped) {
			masks = append(masks, m)
		}
	} else {
		masks = append(masks, 0, 1<<len(capped)-1)
		for i := range capped {
			masks = append(masks, 1<<i)
		}
	}
	type key struct {
		lat  time.Duration
		cost float64
		s    string
	}
	seen := map[key]bool{}
	var out []profile.Choice
	for _, mask := range masks {
		sub := slices.DeleteFunc(slices.Clone(cfgs), func(c profile.Config) bool {
			i := slices.Index(capped, c.Worker)
			return i >= 0 && mask&(1<<i) != 0
		})
		for _, ch := range profile.Options(sub, rate, maxLatency) {
			k := key{ch.Latency, ch.Cost, ch.String()}
			if !seen[k] {
				seen[k] = true
				out = append(out, ch)
			}
		}
	}
	slices.SortStableFunc(out, func(a, b profile.Choice) int {
		if a.Latency != b.Latency {
			return cmp.Compare(a.Latency, b.Latency)
		}
		return cmp.Compare(a.Cost, b.Cost)
	})
	return out
}

// Uses is how much of worker type w's instances an option takes: its whole
// instances and its partial's share (what Request.Limits caps).
func Uses(ch profile.Choice, w profile.WorkerTypeID) float64 {
	var n float64
	if ch.N > 0 && ch.Full.Worker == w {
		n += float64(ch.N)
	}
	if ch.T > 0 && ch.Partial.Worker == w {
		n += ch.T / ch.Partial.Cap
	}
	return n
}

// OverLimits names the worker types a choice (one option index per module)
// uses beyond the request's limits, or "" when it fits them.
func (p *Problem) OverLimits(choice []int) string {
	var over []string
	for _, w := range p.CappedTypes() {
		var n float64
		for i, o := range choice {
			n += Uses(p.Fronts[i][o], w)
		}
		if n > p.Limits[w]+1e-6 {
			over = append(over, fmt.Sprintf("%s: %.3g of %.3g", w, n, p.Limits[w]))
		}
	}
	return strings.Join(over, ", ")
}

// CappedTypes returns the worker types the request limits, sorted.
func (p *Problem) CappedTypes() []profile.WorkerTypeID { return sortedTypes(p.Limits) }

func sortedTypes(m map[profile.WorkerTypeID]float64) []profile.WorkerTypeID {
	return slices.Sorted(maps.Keys(m))
}

// finish returns each module's finish time (longest path of latencies from
// the source, its own included).
func (p *Problem) finish(lat []time.Duration) []time.Duration {
	fin := make([]time.Duration, len(p.Modules))
	for i := range p.Modules { // Modules are in topological order
		var start time.Duration
		for _, u := range p.preds[i] {
			start = max(start, fin[u])
		}
		fin[i] = start + lat[i]
	}
	return fin
}

// critical returns the critical-path latency and the path.
func (p *Problem) critical(lat []time.Duration) (time.Duration, dag.Path) {
	path, crit := p.Graph.CriticalPath(func(m dag.ModuleID) time.Duration {
		return lat[slices.Index(p.Modules, m)]
	})
	return crit, path
}

// latencies returns each module's latency under a choice of options.
func (p *Problem) latencies(choice []int) []time.Duration {
	lat := make([]time.Duration, len(choice))
	for i, o := range choice {
		lat[i] = p.Fronts[i][o].Latency
	}
	return lat
}

// Cost returns the cost per hour of a choice of options.
func (p *Problem) Cost(choice []int) float64 {
	var c float64
	for i, o := range choice {
		c += p.Fronts[i][o].Cost
	}
	return c
}

// Slack is how far a computed latency may exceed the SLO and still count as
// within it: float rounding in the solver, never a real violation.
const Slack = time.Microsecond

// Fits reports whether a choice meets the SLO on every path.
func (p *Problem) Fits(choice []int) bool {
	fin := p.finish(p.latencies(choice))
	for _, s := range p.sinks {
		if fin[s] > p.SLO+Slack {
			return false
		}
	}
	return true
}

// cheapestWithin returns the cheapest option of module i whose latency is at
// most budget (the front is sorted by latency with falling cost, so it is the
// last one within budget), or -1.
func (p *Problem) cheapestWithin(i int, budget time.Duration) int {
	best := -1
	for o, ch := range p.Fronts[i] {
		if ch.Latency > budget {
			break
		}
		best = o
	}
	return best
}

func solverFor(req Request) (Solver, error) {
	switch req.Method {
	case MILP, "":
		if req.MILPSolver == nil {
			return nil, ErrNoMILPSolver
		}
		return req.MILPSolver, nil
	case BruteForce:
		return bruteForce{}, nil
	case Greedy:
		return greedy{}, nil
	case NexusDP:
		return nexusDP{}, nil
	case Even:
		return even{}, nil
	}
	names := make([]string, len(Methods))
	for i, m := range Methods {
		names[i] = string(m)
	}
	return nil, fmt.Errorf("%w: unknown method %q (known: %s)", ErrBadRequest, req.Method, strings.Join(names, ", "))
}

// Allocate answers a request with the requested method. An allocation that
// cannot meet the SLO is a result (Feasible false, with the reason), not an
// error; errors are bad requests, refusals (bruteforce on a large input),
// solver failures and a milp request with no MILP solver handed in.
func Allocate(ctx context.Context, req Request) (*Allocation, error) {
	solver, err := solverFor(req)
	if err != nil {
		return nil, err
	}
	method := req.Method
	if method == "" {
		method = MILP
	}
	now := req.Now
	if now == nil {
		now = time.Now
	}
	start := now()
	p, err := NewProblem(req)
	if err != nil {
		return nil, err
	}
	var choice []int
	var stats Stats
	if !p.empty {
		if choice, stats, err = solver.Solve(ctx, p); err != nil {
			return nil, err
		}
	}
	if choice != nil {
		if over := p.OverLimits(choice); over != "" {
			choice, stats.Reason = nil, fmt.Sprintf("%s's allocation needs more instances than the limits allow (%s)", method, over)
		}
	}
	if choice == nil && len(p.Limits) > 0 && stats.Reason == "" {
		stats.Reason = "no allocation within the SLO fits the worker limits"
	}
	if choice == nil {
		// The fastest configurations missing the SLO is the clearest reason;
		// otherwise the method's own (an even split that cannot fit, say).
		if why := p.Infeasible(); why != "" {
			stats.Reason = why
		}
	}
	return p.result(method, choice, stats, now().Sub(start)), nil
}

// LargestShare finds, by bisection (steps halvings), the largest share f
// in (0, 1] of req.Rate that has a feasible allocation, and that
// allocation: what a capped pool can carry when the full rate does not fit.
// It returns 0 and nil when not even the smallest share tried fits. Call it
// after the full rate was found infeasible.
func LargestShare(ctx context.Context, req Request, steps int) (float64, *Allocation, error) {
	var best *Allocation
	lo, hi := 0.0, 1.0
	rate := req.Rate
	for range steps {
		mid := (lo + hi) / 2
		req.Rate = rate * mid
		a, err := Allocate(ctx, req)
		if err != nil {
			return 0, nil, err
		}
		if a.Feasible {
			lo, best = mid, a
		} else {
			hi = mid
		}
	}
	return lo, best, nil
}
