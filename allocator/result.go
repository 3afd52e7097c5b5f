package allocator

import (
	"fmt"
	"math"
	"time"

	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/profile"
)

// Allocation is the answer to a Request; it explains itself.
type Allocation struct {
	Method            Method             `json:"method"`
	Feasible          bool               `json:"feasible"`
	Reason            string             `json:"reason,omitempty"`
	CostPerHour       float64            `json:"cost_per_hour"`
	CriticalLatencyMS float64            `json:"critical_latency_ms"`
	CriticalPath      string             `json:"critical_path,omitempty"`
	SLOMS             float64            `json:"slo_ms"`
	SolveMS           float64            `json:"solve_ms"`
	Modules           []ModuleAllocation `json:"modules"`
	Paths             []PathReport       `json:"paths,omitempty"`
	Solver            Stats              `json:"solver"`

	// Cost and Critical are the unrounded figures.
	Cost     float64       `json:"-"`
	Critical time.Duration `json:"-"`
}

// ModuleAllocation is what one module gets.
type ModuleAllocation struct {
	Module      dag.ModuleID         `json:"module"`
	Rate        float64              `json:"rate"`
	LatencyMS   float64              `json:"latency_ms"`
	CostPerHour float64              `json:"cost_per_hour"`
	Allocations []InstanceAllocation `json:"allocations"`
	Options     int                  `json:"options"` // size of the module's option front
	Why         string               `json:"why,omitempty"`

	// Choice is the chosen option, unrounded, for placement.
	Choice profile.Choice `json:"-"`
}

// InstanceAllocation is one configuration's share of a module: its full
// instances, or its partial instance.
type InstanceAllocation struct {
	Worker      profile.WorkerTypeID `json:"worker"`
	Batch       int                  `json:"batch"`
	Concurrency int                  `json:"concurrency"`
	Rate        float64              `json:"rate"`
	Instances   float64              `json:"instances"`
	Partial     bool                 `json:"partial"`
	LatencyMS   float64              `json:"latency_ms"`
}

// PathReport is one source-to-sink path's latency against the SLO.
type PathReport struct {
	Path      string  `json:"path"`
	LatencyMS float64 `json:"latency_ms"`
	SlackMS   float64 `json:"slack_ms"`
	Binding   bool    `json:"binding"` // within 1 ms of the SLO: it limits cheaper choices
}

// result assembles the Allocation for a choice (nil when infeasible).
func (p *Problem) result(method Method, choice []int, stats Stats, took time.Duration) *Allocation {
	a := &Allocation{Method: method, SLOMS: ms(p.SLO), SolveMS: ms(took), Solver: stats}
	if choice == nil {
		a.Reason = stats.Reason
		if a.Reason == "" {
			a.Reason = string(method) + " found no allocation within the SLO"
		}
		for i, m := range p.Modules {
			a.Modules = append(a.Modules, ModuleAllocation{Module: m, Rate: round(p.Rates[i], 4), Options: len(p.Fronts[i]),
				Allocations: []InstanceAllocation{}})
		}
		return a
	}
	a.Feasible = true
	lat := p.latencies(choice)
	crit, cpath := p.critical(lat)
	a.Critical, a.CriticalPath = crit, cpath.String()
	a.CriticalLatencyMS = ms(crit)
	a.Cost = p.Cost(choice)
	a.CostPerHour = round(a.Cost, 4)
	for i, m := range p.Modules {
		ch := p.Fronts[i][choice[i]]
		ma := ModuleAllocation{Module: m, Rate: round(p.Rates[i], 4), LatencyMS: ms(ch.Latency),
			CostPerHour: round(ch.Cost, 4), Options: len(p.Fronts[i]), Choice: ch, Allocations: []InstanceAllocation{}}
		if ch.N > 0 {
			ma.Allocations = append(ma.Allocations, InstanceAllocation{Worker: ch.Full.Worker, Batch: ch.Full.Batch,
				Concurrency: ch.Full.Concurrency, Rate: round(float64(ch.N)*ch.Full.Cap, 4), Instances: float64(ch.N),
				LatencyMS: ms(ch.Full.Worst())})
		}
		if ch.T > 0 {
			ma.Allocations = append(ma.Allocations, InstanceAllocation{Worker: ch.Partial.Worker, Batch: ch.Partial.Batch,
				Concurrency: ch.Partial.Concurrency, Rate: round(ch.T, 4), Instances: round(ch.T/ch.Partial.Cap, 4),
				Partial: true, LatencyMS: ms(ch.Partial.WorstAt(ch.T))})
		}
		ma.Why = p.why(method, choice, i)
		a.Modules = append(a.Modules, ma)
	}
	if paths, err := p.Graph.Paths(); err == nil {
		index := map[dag.ModuleID]int{}
		for i, m := range p.Modules {
			index[m] = i
		}
		for _, path := range paths {
			var sum time.Duration
			for _, m := range path {
				sum += lat[index[m]]
			}
			a.Paths = append(a.Paths, PathReport{Path: path.String(), LatencyMS: ms(sum),
				SlackMS: ms(p.SLO - sum), Binding: p.SLO-sum < time.Millisecond})
		}
	}
	return a
}

// why explains module i's choice: it is the cheapest option on its front,
// or the next cheaper one would break the SLO on a named path.
func (p *Problem) why(method Method, choice []int, i int) string {
	front := p.Fronts[i]
	o := choice[i]
	if len(front) == 1 {
		return "its only option within the SLO"
	}
	// The next cheaper option: the next one on a Pareto front (sorted by
	// latency, cost falling); under worker limits the options are several
	// fronts merged, so it is the dearest of those cheaper than the choice.
	nx := -1
	for j, ch := range front {
		if ch.Cost < front[o].Cost && (nx < 0 || ch.Cost > front[nx].Cost) {
			nx = j
		}
	}
	if nx < 0 {
		return fmt.Sprintf("the cheapest of its %d options within the SLO", len(front))
	}
	next := front[nx]
	alt := append([]int(nil), choice...)
	alt[i] = nx
	saving := front[o].Cost - next.Cost
	if !p.Fits(alt) {
		crit, path := p.critical(p.latencies(alt))
		return fmt.Sprintf("the next cheaper option (%s, $%.4f/h less) would make %s take %s ms, over the %s ms SLO",
			next, saving, path, fmtMS(crit), fmtMS(p.SLO))
	}
	if over := p.OverLimits(alt); over != "" {
		return fmt.Sprintf("the next cheaper option (%s, $%.4f/h less) would need more instances than the worker limits allow (%s)", next, saving, over)
	}
	return fmt.Sprintf("%s did not take the cheaper %s ($%.4f/h less), which fits the SLO", method, next, saving)
}

func ms(d time.Duration) float64 { return round(Millis(d), 2) }

// Millis is d in milliseconds, unrounded: the unit of the MILP's latency
// terms and of greedy's ratios.
func Millis(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func fmtMS(d time.Duration) string { return fmt.Sprint(ms(d)) }

func round(x float64, digits int) float64 {
	p := math.Pow(10, float64(digits))
	return math.Round(x*p) / p
}
