package milp_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/mdag/mdag/allocator"
	"github.com/mdag/mdag/allocator/milp"
	"github.com/mdag/mdag/examples"
)

// planningRate is the session rate the examples are planned for: 12 streams
// at the app's fps (scrooge-example's fps is already its session rate).
func planningRate(name string, fps float64) float64 {
	if name == "scrooge-example" {
		return fps
	}
	return 12 * fps
}

// BenchmarkSolve times milp (problem setup included) for every example at
// 2, 10 and 30 worker types and reports the median and p99 per solve.
//
//	go test ./allocator/milp -run '^$' -bench BenchmarkSolve -benchtime 200x
func BenchmarkSolve(b *testing.B) {
	for _, name := range examples.Names() {
		for _, k := range []int{2, 10, 30} {
			b.Run(fmt.Sprintf("%s/types=%d", name, k), func(b *testing.B) {
				g, cat, err := examples.Load(name)
				if err != nil {
					b.Fatal(err)
				}
				wide := widen(b, g, cat, k)
				req := allocator.Request{Graph: g, Catalog: wide, Rate: planningRate(name, g.App().FPS), MILPSolver: milp.Solver{}}
				var took []time.Duration
				for b.Loop() {
					start := time.Now()
					a, err := allocator.Allocate(context.Background(), req)
					took = append(took, time.Since(start))
					if err != nil || !a.Feasible {
						b.Fatalf("%v %v", err, a)
					}
				}
				slices.Sort(took)
				b.ReportMetric(ms(took[len(took)/2]), "p50-ms")
				b.ReportMetric(ms(took[(len(took)*99)/100]), "p99-ms")
			})
		}
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

var gaps = flag.Bool("gaps", false, "print the cost gap of every method against milp on every example (TestGapReport)")

// TestGapReport prints, for every example at 2, 10 and 30 worker types, each
// method's cost relative to milp's. Run with:
//
//	go test ./allocator/milp -run TestGapReport -gaps -v
func TestGapReport(t *testing.T) {
	if !*gaps {
		t.Skip("run with -gaps to print the report")
	}
	t.Log("| example | types | milp $/h | bruteforce | greedy | nexus-dp | even |")
	t.Log("|---|---|---|---|---|---|---|")
	for _, name := range examples.Names() {
		for _, k := range []int{2, 10, 30} {
			g, cat, err := examples.Load(name)
			if err != nil {
				t.Fatal(err)
			}
			wide := widen(t, g, cat, k)
			row := fmt.Sprintf("| %s | %d |", name, k)
			var opt float64
			for _, m := range allocator.Methods {
				a, err := allocator.Allocate(context.Background(), allocator.Request{Graph: g, Catalog: wide,
					Rate: planningRate(name, g.App().FPS), Method: m, MILPSolver: milp.Solver{}})
				switch {
				case errors.Is(err, allocator.ErrTooLarge):
					row += " refused |"
				case err != nil:
					t.Fatal(err)
				case !a.Feasible:
					row += " infeasible |"
				case m == allocator.MILP:
					opt = a.Cost
					row += fmt.Sprintf(" %.4f |", a.Cost)
				default:
					row += fmt.Sprintf(" %+.2f%% |", gapPercent(a.Cost, opt))
				}
			}
			t.Log(row)
		}
	}
}

// gapPercent is cost's excess over opt in percent; float noise reads as 0.
func gapPercent(cost, opt float64) float64 {
	g := 100 * (cost/opt - 1)
	if math.Abs(g) < 1e-9 {
		return 0
	}
	return g
}

// TestGapReportRandom prints the same gaps over the property test's random
// chains and fork-joins (2-4 modules, 2-3 worker types, 2-5 configurations):
//
//	go test ./allocator/milp -run TestGapReportRandom -gaps -v -rapid.checks 2000
func TestGapReportRandom(t *testing.T) {
	if !*gaps {
		t.Skip("run with -gaps to print the report")
	}
	type acc struct {
		feasible, worse, infeasible int
		sum, max                    float64
	}
	stats := map[allocator.Method]*acc{}
	others := []allocator.Method{allocator.Greedy, allocator.NexusDP, allocator.Even}
	for _, m := range others {
		stats[m] = &acc{}
	}
	problems := 0
	rapid.Check(t, func(rt *rapid.T) {
		g, cat, rate := genProblem(rt)
		opt, err := allocator.Allocate(context.Background(), allocator.Request{Graph: g, Catalog: cat, Rate: rate, MILPSolver: milp.Solver{}})
		if err != nil {
			rt.Fatal(err)
		}
		if !opt.Feasible {
			return
		}
		problems++
		for _, m := range others {
			a, err := allocator.Allocate(context.Background(), allocator.Request{Graph: g, Catalog: cat, Rate: rate, Method: m})
			if err != nil {
				rt.Fatal(err)
			}
			s := stats[m]
			if !a.Feasible {
				s.infeasible++
				continue
			}
			s.feasible++
			gp := gapPercent(a.Cost, opt.Cost)
			if gp > 0.005 {
				s.worse++
			}
			s.sum += gp
			s.max = math.Max(s.max, gp)
		}
	})
	t.Logf("%d random problems where milp finds an allocation", problems)
	t.Log("| method | found one | costlier than milp | mean gap | max gap |")
	t.Log("|---|---|---|---|---|")
	for _, m := range others {
		s := stats[m]
		t.Logf("| %s | %.1f%% | %.1f%% | %+.2f%% | %+.2f%% |", m, 100*float64(s.feasible)/float64(problems),
			100*float64(s.worse)/float64(max(1, s.feasible)), s.sum/float64(max(1, s.feasible)), s.max)
	}
}
