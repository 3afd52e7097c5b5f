package allocator_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/mdag/mdag/allocator"
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
//	go test ./allocator -run '^$' -bench BenchmarkSolve -benchtime 200x
func BenchmarkSolve(b *testing.B) {
	for _, name := range examples.Names() {
		for _, k := range []int{2, 10, 30} {
			b.Run(fmt.Sprintf("%s/types=%d", name, k), func(b *testing.B) {
				g, cat := loadExample(b, name)
				wide := widen(b, g, cat, k)
				req := allocator.Request{Graph: g, Catalog: wide, Rate: planningRate(name, g.App().FPS)}
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
//	go test ./allocator -run TestGapReport -gaps -v
func TestGapReport(t *testing.T) {
	if !*gaps {
		t.Skip("run with -gaps to print the report")
	}
	t.Log("| example | types | milp $/h | bruteforce | greedy | nexus-dp | even |")
	t.Log("|---|---|---|---|---|---|---|")
	for _, name := range examples.Names() {
		for _, k := range []int{2, 10, 30} {
			g, cat := loadExample(t, name)
			wide := widen(t, g, cat, k)
			row := fmt.Sprintf("| %s | %d |", name, k)
			var opt float64
			for _, m := range allocator.Methods {
				a, err := allocator.Allocate(context.Background(), allocator.Request{Graph: g, Catalog: wide,
					Rate: planningRate(name, g.App().FPS), Method: m})
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
					row += fmt.Sprintf(" %+.2f%% |", 100*(a.Cost/opt-1))
				}
			}
			t.Log(row)
		}
	}
}
