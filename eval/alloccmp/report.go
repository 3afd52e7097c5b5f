package alloccmp

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/mdag/mdag/eval/plot"
)

// Markdown returns the summary as a Markdown table, one row per
// worker-type count: cases, median and p99 solve time per method, the cost
// ratios' median and max, the share of cases greedy costs more, and the
// cases brute force skipped; then any finding (MILP costlier than another
// method, methods disagreeing on feasibility) and the skip rule.
func (r *Result) Markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "Seed %d, %d rates per app over %s.\n\n", r.Config.Seed, r.Config.Cases, strings.Join(Apps, ", "))
	b.WriteString("| worker types | cases (infeasible) | milp median / p99 ms | greedy median / p99 ms | bruteforce median / p99 ms | greedy/MILP median / max | greedy costlier | MILP/brute median / max | brute force skipped |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|\n")
	for _, s := range r.Summaries {
		fmt.Fprintf(&b, "| %d | %d (%d) | %s | %s | %s | %s | %.1f%% of %d | %s | %d of %d |\n",
			s.Types, s.Cases, s.Infeasible, fmtTimes(s.MILPTime), fmtTimes(s.GreedyTime), fmtTimes(s.BruteTime),
			fmtRatios(s.GreedyRatio), 100*s.GreedyCostlier, len(s.GreedyRatio.All), fmtRatios(s.BruteRatio),
			s.BruteSkipped, s.Cases)
	}
	for _, s := range r.Summaries {
		if s.MILPCostlier > 0 {
			fmt.Fprintf(&b, "\n**Finding:** at %d worker types MILP costs more than greedy or brute force in %d cases.\n", s.Types, s.MILPCostlier)
		}
		if s.Disagree > 0 {
			fmt.Fprintf(&b, "\n**Finding:** at %d worker types the methods disagree on feasibility in %d cases.\n", s.Types, s.Disagree)
		}
	}
	fmt.Fprintf(&b, "\nBrute force is skipped above %.3g enumerated (m, n, p) options or %v of search.\n",
		r.Config.MaxSearch, r.Config.BruteForceLimit)
	return b.String()
}

func fmtTimes(t Times) string {
	if len(t.All) == 0 {
		return "-"
	}
	return fmt.Sprintf("%.3g / %.3g", ms(t.Median), ms(t.P99))
}

func fmtRatios(r Ratios) string {
	if len(r.All) == 0 {
		return "-"
	}
	return fmt.Sprintf("%.4f / %.4f", r.Median, r.Max)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// Plots writes alloc-cost-cdf.svg (the CDFs of greedy/MILP and MILP/brute
// force cost ratios per worker-type count, Scrooge Figure 10) and
// alloc-time-cdf.svg (the CDFs of each method's solve time in ms on a log
// axis, Figure 11) into dir, which must exist. Ratios or times with no case
// (brute force skipped everywhere, say) are left out of the figure.
func (r *Result) Plots(dir string) error {
	var costs, solves []plot.Sample
	for _, s := range r.Summaries {
		if len(s.GreedyRatio.All) > 0 {
			costs = append(costs, plot.Sample{Name: fmt.Sprintf("greedy/MILP, %d types", s.Types), Values: s.GreedyRatio.All})
		}
		if len(s.BruteRatio.All) > 0 {
			costs = append(costs, plot.Sample{Name: fmt.Sprintf("MILP/brute force, %d types", s.Types), Values: s.BruteRatio.All})
		}
	}
	for _, s := range r.Summaries {
		for _, m := range []struct {
			name string
			t    Times
		}{{"MILP", s.MILPTime}, {"greedy", s.GreedyTime}, {"brute force", s.BruteTime}} {
			if len(m.t.All) == 0 {
				continue
			}
			v := make([]float64, len(m.t.All))
			for i, d := range m.t.All {
				v[i] = max(ms(d), 1e-3) // a log axis: clamp a clock's zero to 1 µs
			}
			solves = append(solves, plot.Sample{Name: fmt.Sprintf("%s, %d types", m.name, s.Types), Values: v})
		}
	}
	if len(costs) == 0 {
		return fmt.Errorf("alloccmp: no feasible case to plot cost ratios of")
	}
	var cb, tb bytes.Buffer
	if err := plot.CDF(&cb, "Allocation cost ratio", "cost ratio", costs, false, 16, 10); err != nil {
		return err
	}
	if err := plot.CDF(&tb, "Solve time", "solve time (ms, wall)", solves, true, 16, 10); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "alloc-cost-cdf.svg"), cb.Bytes(), 0o644); err != nil {
		return fmt.Errorf("alloccmp: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "alloc-time-cdf.svg"), tb.Bytes(), 0o644); err != nil {
		return fmt.Errorf("alloccmp: %w", err)
	}
	return nil
}
