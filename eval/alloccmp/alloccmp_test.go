package alloccmp

import (
	"bytes"
	"context"
	"encoding/xml"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/mdag/mdag/allocator"
	"github.com/mdag/mdag/allocator/milp"
	"github.com/mdag/mdag/examples"
	"github.com/mdag/mdag/profile"
)

// testConfig is small enough for -race on a loaded 2-core machine: 2 rates
// per app, brute force bounded at 20,000 options (tens of ms each), and a
// backstop far above any search it runs, so none is cut by time.
func testConfig(seed int64) Config {
	return Config{Seed: seed, Cases: 2, WorkerTypes: []int{2, 30}, BruteForceLimit: 2 * time.Minute, MaxSearch: 20_000}
}

var (
	once   sync.Once
	shared *Result
	runErr error
)

// run1 is one run of testConfig(1), shared by the tests that only read it.
func run1(t *testing.T) *Result {
	t.Helper()
	once.Do(func() { shared, runErr = Run(testConfig(1)) })
	if runErr != nil {
		t.Fatal(runErr)
	}
	return shared
}

// costs is a run's cases without their wall times.
func costs(r *Result) []Case {
	out := slices.Clone(r.Cases)
	for i := range out {
		out[i].MILPTime, out[i].GreedyTime, out[i].BruteTime = 0, 0, 0
	}
	return out
}

// TestRunDeterministicCosts: the same seed gives the same cases, rates,
// costs and skips (only wall times differ); another seed other rates.
func TestRunDeterministicCosts(t *testing.T) {
	a := run1(t)
	b, err := Run(testConfig(1))
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(costs(a), costs(b)); d != "" {
		t.Fatalf("same seed, different cases (-first +second):\n%s", d)
	}
	c, err := Run(Config{Seed: 2, Cases: 1, WorkerTypes: []int{2}, MaxSearch: 1})
	if err != nil {
		t.Fatal(err)
	}
	if c.Cases[0].Rate == a.Cases[0].Rate {
		t.Errorf("seeds 1 and 2 drew the same first rate %v", c.Cases[0].Rate)
	}
}

// TestMethodsAgree checks what must hold of every case: MILP is exact, so
// it never costs more than greedy finds, and brute force (exhaustive when
// it ran) costs the same as MILP; all three agree on feasibility; brute
// force is skipped exactly when the search size is over the bound; a
// feasible case has positive costs, an infeasible one says why.
func TestMethodsAgree(t *testing.T) {
	r := run1(t)
	if want := len(Apps) * 2 * 2; len(r.Cases) != want {
		t.Fatalf("%d cases, want %d", len(r.Cases), want)
	}
	ran, skipped := 0, 0
	for _, c := range r.Cases {
		name := fmt.Sprintf("%s at %d types, rate %.4g", c.App, c.Types, c.Rate)
		if c.Disagree != "" {
			t.Errorf("%s: methods disagree on feasibility: %s", name, c.Disagree)
		}
		if (c.SearchSize > r.Config.MaxSearch) != (c.BruteSkipped != "") {
			t.Errorf("%s: search size %v, bound %v, skipped %q", name, c.SearchSize, r.Config.MaxSearch, c.BruteSkipped)
		}
		if c.BruteSkipped != "" {
			skipped++
			if !strings.Contains(c.BruteSkipped, "search size") || c.BruteCost != 0 || c.BruteTime != 0 {
				t.Errorf("%s: skipped %q with cost %v, time %v", name, c.BruteSkipped, c.BruteCost, c.BruteTime)
			}
		} else {
			ran++
		}
		if c.Infeasible != "" {
			if c.MILPCost != 0 || c.GreedyCost != 0 || c.BruteCost != 0 {
				t.Errorf("%s: infeasible (%s) yet costs %v %v %v", name, c.Infeasible, c.MILPCost, c.GreedyCost, c.BruteCost)
			}
			continue
		}
		if c.MILPCost <= 0 || c.GreedyCost <= 0 {
			t.Errorf("%s: feasible with costs milp %v, greedy %v", name, c.MILPCost, c.GreedyCost)
		}
		if c.MILPCost > c.GreedyCost*(1+tol) {
			t.Errorf("%s: FINDING: milp $%v/h costs more than greedy's $%v/h", name, c.MILPCost, c.GreedyCost)
		}
		if c.BruteSkipped == "" && math.Abs(c.MILPCost-c.BruteCost) > tol*c.BruteCost {
			t.Errorf("%s: milp $%v/h, exhaustive brute force $%v/h: both are exact", name, c.MILPCost, c.BruteCost)
		}
		if c.MILPTime <= 0 || c.GreedyTime <= 0 || (c.BruteSkipped == "" && c.BruteTime <= 0) {
			t.Errorf("%s: solve times %v %v %v", name, c.MILPTime, c.GreedyTime, c.BruteTime)
		}
	}
	if ran == 0 || skipped == 0 {
		t.Errorf("brute force ran %d times and was skipped %d times: the test config should exercise both", ran, skipped)
	}
	for _, s := range r.Summaries {
		if s.MILPCostlier != 0 || s.Disagree != 0 {
			t.Errorf("%d types: milp costlier %d, disagreements %d", s.Types, s.MILPCostlier, s.Disagree)
		}
	}
}

// TestSummaries: each worker-type count's summary counts its own cases,
// times and ratios are sorted, quantiles lie within them, and the shares
// match the cases.
func TestSummaries(t *testing.T) {
	r := run1(t)
	if len(r.Summaries) != 2 || r.Summaries[0].Types != 2 || r.Summaries[1].Types != 30 {
		t.Fatalf("summaries %+v, want 2 then 30 worker types", r.Summaries)
	}
	for _, s := range r.Summaries {
		var feasible, costlier, ran int
		for _, c := range r.Cases {
			if c.Types != s.Types {
				continue
			}
			if c.BruteSkipped == "" {
				ran++
			}
			if c.feasible() {
				feasible++
				if c.GreedyCost > c.MILPCost*(1+tol) {
					costlier++
				}
			}
		}
		if s.Cases != len(Apps)*2 || s.BruteRun != ran || s.BruteRun+s.BruteSkipped != s.Cases {
			t.Errorf("%d types: cases %d, brute run %d (want %d), skipped %d", s.Types, s.Cases, s.BruteRun, ran, s.BruteSkipped)
		}
		if len(s.MILPTime.All) != s.Cases || len(s.GreedyTime.All) != s.Cases || len(s.BruteTime.All) != s.BruteRun {
			t.Errorf("%d types: time counts %d %d %d", s.Types, len(s.MILPTime.All), len(s.GreedyTime.All), len(s.BruteTime.All))
		}
		if len(s.GreedyRatio.All) != feasible || math.Abs(s.GreedyCostlier-float64(costlier)/float64(feasible)) > 1e-12 {
			t.Errorf("%d types: %d greedy ratios, costlier share %v; want %d and %d/%d", s.Types, len(s.GreedyRatio.All), s.GreedyCostlier, feasible, costlier, feasible)
		}
		for _, tm := range []Times{s.MILPTime, s.GreedyTime, s.BruteTime} {
			if !slices.IsSorted(tm.All) || len(tm.All) > 0 && (tm.Median < tm.All[0] || tm.P99 < tm.Median || tm.P99 > tm.All[len(tm.All)-1]) {
				t.Errorf("%d types: times %+v", s.Types, tm)
			}
		}
		for _, rt := range []Ratios{s.GreedyRatio, s.BruteRatio} {
			if !slices.IsSorted(rt.All) || len(rt.All) > 0 && (rt.All[0] < 1-tol || rt.Median > rt.Max || rt.Max != rt.All[len(rt.All)-1]) {
				t.Errorf("%d types: ratios %+v (each at least 1: milp is exact)", s.Types, rt)
			}
		}
	}
}

// TestSummariseSynthetic: infeasible cases and disagreements are counted
// and left out of the ratios; a MILP costlier than greedy or brute force is
// counted as a finding and printed; the quantiles are the nearest ranks.
func TestSummariseSynthetic(t *testing.T) {
	ms := time.Millisecond
	cases := []Case{
		{Types: 2, MILPCost: 10, GreedyCost: 10, BruteCost: 10, MILPTime: 1 * ms, GreedyTime: 1 * ms, BruteTime: 5 * ms},
		{Types: 2, MILPCost: 10, GreedyCost: 11, BruteCost: 10, MILPTime: 2 * ms, GreedyTime: 1 * ms, BruteTime: 6 * ms},
		{Types: 2, MILPCost: 10, GreedyCost: 10, BruteSkipped: "search size", MILPTime: 3 * ms, GreedyTime: 1 * ms},
		{Types: 2, Infeasible: "too slow", MILPTime: 4 * ms, GreedyTime: 1 * ms, BruteTime: 1 * ms},
		{Types: 2, MILPCost: 10, Disagree: "greedy feasible false", MILPTime: 5 * ms, GreedyTime: 1 * ms, BruteTime: 1 * ms},
		{Types: 30, MILPCost: 12, GreedyCost: 11, BruteCost: 12, MILPTime: 9 * ms, GreedyTime: 1 * ms, BruteTime: 1 * ms},
	}
	tests := []struct {
		types int
		want  Summary
	}{
		{2, Summary{Types: 2, Cases: 5, Infeasible: 1, Disagree: 1, BruteRun: 4, BruteSkipped: 1,
			MILPTime:       Times{Median: 3 * ms, P99: 5 * ms},
			GreedyRatio:    Ratios{All: []float64{1, 1, 1.1}, Median: 1, Max: 1.1},
			BruteRatio:     Ratios{All: []float64{1, 1}, Median: 1, Max: 1},
			GreedyCostlier: 1.0 / 3}},
		{30, Summary{Types: 30, Cases: 1, BruteRun: 1, MILPCostlier: 1,
			MILPTime:    Times{Median: 9 * ms, P99: 9 * ms},
			GreedyRatio: Ratios{All: []float64{11.0 / 12}, Median: 11.0 / 12, Max: 11.0 / 12},
			BruteRatio:  Ratios{All: []float64{1}, Median: 1, Max: 1}}},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprint(tc.types), func(t *testing.T) {
			got := summarise(tc.types, cases)
			got.MILPTime.All, got.GreedyTime, got.BruteTime = nil, Times{}, Times{}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("(-want +got):\n%s", d)
			}
		})
	}
	r := &Result{Config: Config{Seed: 1, Cases: 1, MaxSearch: 5, BruteForceLimit: time.Second}, Cases: cases,
		Summaries: []Summary{summarise(2, cases), summarise(30, cases)}}
	md := r.Markdown()
	for _, want := range []string{"at 30 worker types MILP costs more than greedy or brute force in 1 cases",
		"at 2 worker types the methods disagree on feasibility in 1 cases", "| 2 | 5 (1) |", "33.3% of 3"} {
		if !strings.Contains(md, want) {
			t.Errorf("Markdown lacks %q:\n%s", want, md)
		}
	}
}

// TestQuantiles: nearest-rank p99 and the upper median.
func TestQuantiles(t *testing.T) {
	for _, tc := range []struct {
		n, median, p99 int
	}{{1, 0, 0}, {2, 1, 1}, {3, 1, 2}, {100, 50, 98}, {101, 50, 99}, {200, 100, 197}} {
		d := make([]time.Duration, tc.n)
		for i := range d {
			d[i] = time.Duration(tc.n - i) // reversed: times sorts
		}
		got := times(d)
		if got.Median != time.Duration(tc.median+1) || got.P99 != time.Duration(tc.p99+1) {
			t.Errorf("n=%d: median %v p99 %v, want ranks %d and %d", tc.n, got.Median, got.P99, tc.median, tc.p99)
		}
	}
}

// TestSkipAll: with a search bound below every case brute force never
// runs; the report says "-" for it and the figures leave it out.
func TestSkipAll(t *testing.T) {
	r, err := Run(Config{Seed: 3, Cases: 1, WorkerTypes: []int{2}, MaxSearch: 1})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range r.Cases {
		if !strings.HasPrefix(c.BruteSkipped, "search size") {
			t.Errorf("%s: brute force not skipped: %q", c.App, c.BruteSkipped)
		}
	}
	if s := r.Summaries[0]; s.BruteRun != 0 || len(s.BruteRatio.All) != 0 {
		t.Errorf("summary %+v", s)
	}
	if md := r.Markdown(); !strings.Contains(md, "| - | ") {
		t.Errorf("Markdown shows no '-' for brute force:\n%s", md)
	}
	dir := t.TempDir()
	if err := r.Plots(dir); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(dir, "alloc-time-cdf.svg"))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(data, []byte("brute force")) || !bytes.Contains(data, []byte("MILP, 2 types")) {
		t.Error("the time figure should hold MILP and not brute force")
	}
}

// TestPlots: both figures are written, are SVG, and name every sample.
func TestPlots(t *testing.T) {
	r := run1(t)
	dir := t.TempDir()
	if err := r.Plots(dir); err != nil {
		t.Fatal(err)
	}
	for file, names := range map[string][]string{
		"alloc-cost-cdf.svg": {"greedy/MILP, 2 types", "greedy/MILP, 30 types", "MILP/brute force, 2 types", "MILP/brute force, 30 types"},
		"alloc-time-cdf.svg": {"MILP, 2 types", "greedy, 30 types", "brute force, 30 types"},
	} {
		data, err := os.ReadFile(filepath.Join(dir, file))
		if err != nil {
			t.Fatal(err)
		}
		dec := xml.NewDecoder(bytes.NewReader(data))
		for {
			if _, err := dec.Token(); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatalf("%s: %v", file, err)
			}
		}
		for _, n := range names {
			if !bytes.Contains(data, []byte(n)) {
				t.Errorf("%s lacks %q", file, n)
			}
		}
	}
	if err := r.Plots(filepath.Join(dir, "missing")); err == nil {
		t.Error("Plots into a missing directory: no error")
	}
}

// TestConfigErrors: a bad config is refused with what is wrong.
func TestConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{Cases: 0, WorkerTypes: []int{2}}, "cases must be >= 1"},
		{Config{Cases: 1}, "no worker-type counts"},
		{Config{Cases: 1, WorkerTypes: []int{2, 0}}, "worker-type count must be >= 1, got 0"},
		{Config{Cases: 1, WorkerTypes: []int{2}, BruteForceLimit: -time.Second}, "must be >= 0"},
		{Config{Cases: 1, WorkerTypes: []int{2}, MaxSearch: math.NaN()}, "must be >= 0"},
	} {
		_, err := Run(tc.cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: error %v, want %q", tc.cfg, err, tc.want)
		}
	}
}

// TestSearchSize: the bound counts what brute force enumerates: one option
// per module with no configuration beyond the empty one plus, per full
// configuration, floor(rate/capacity) instance counts; more worker types
// or a higher rate never shrink it.
func TestSearchSize(t *testing.T) {
	g, cat, err := examples.Load("scrooge-example")
	if err != nil {
		t.Fatal(err)
	}
	size := func(k int, rate float64) float64 {
		wide, err := profile.Widen(g.App(), cat, k)
		if err != nil {
			t.Fatal(err)
		}
		p, err := allocator.NewProblem(allocator.Request{Graph: g, Catalog: wide, Rate: rate})
		if err != nil {
			t.Fatal(err)
		}
		var want float64
		for i := range p.Modules {
			n := 1.0
			for _, c := range p.Configs[i] {
				n += math.Floor(p.Rates[i] / c.Cap)
			}
			want += n * float64(len(p.Configs[i]))
		}
		if got := SearchSize(p); got != want {
			t.Fatalf("k=%d rate %v: %v, want %v", k, rate, got, want)
		}
		return want
	}
	if a, b := size(2, 40), size(30, 40); a >= b {
		t.Errorf("2 types %v, 30 types %v", a, b)
	}
	if a, b := size(2, 10), size(2, 400); a > b {
		t.Errorf("rate 10: %v, rate 400: %v", a, b)
	}
}

// BenchmarkAllocators times each method on every app of Apps at its
// planning rate (12 streams at the app's fps; scrooge-example's fps is its
// session rate), at 2 and 30 worker types, cycling through the apps, and
// reports the median and p99 per solve (brute force only where its search
// is within DefaultMaxSearch):
//
//	go test ./eval/alloccmp -run '^$' -bench BenchmarkAllocators -benchtime 400x
func BenchmarkAllocators(b *testing.B) {
	for _, k := range []int{2, 30} {
		for _, m := range []allocator.Method{allocator.MILP, allocator.Greedy, allocator.BruteForce} {
			b.Run(fmt.Sprintf("%s/types=%d", m, k), func(b *testing.B) {
				var reqs []allocator.Request
				for _, app := range Apps {
					g, cat, err := examples.Load(app)
					if err != nil {
						b.Fatal(err)
					}
					wide, err := profile.Widen(g.App(), cat, k)
					if err != nil {
						b.Fatal(err)
					}
					rate := 12 * g.App().FPS
					if app == "scrooge-example" {
						rate = g.App().FPS
					}
					req := allocator.Request{Graph: g, Catalog: wide, Rate: rate, Method: m, MILPSolver: milp.Solver{}}
					p, err := allocator.NewProblem(req)
					if err != nil {
						b.Fatal(err)
					}
					if m == allocator.BruteForce && SearchSize(p) > DefaultMaxSearch {
						continue
					}
					reqs = append(reqs, req)
				}
				var took []time.Duration
				i := 0
				for b.Loop() {
					start := time.Now()
					a, err := allocator.Allocate(context.Background(), reqs[i%len(reqs)])
					took = append(took, time.Since(start))
					if err != nil || !a.Feasible {
						b.Fatalf("%v %v", err, a)
					}
					i++
				}
				tm := times(took)
				b.ReportMetric(ms(tm.Median), "p50-ms")
				b.ReportMetric(ms(tm.P99), "p99-ms")
				b.ReportMetric(float64(len(reqs)), "apps")
			})
		}
	}
}

var (
	report   = flag.Bool("ablation", false, "run DefaultConfig and print its Markdown and wall time (TestAblationReport)")
	plotsDir = flag.String("plots", "", "with -ablation: write the two figures into this directory")
)

// TestAblationReport runs the default ablation, as docs/benchmarks.md
// reports it, and prints the table:
//
//	go test ./eval/alloccmp -run TestAblationReport -ablation -v [-plots DIR]
func TestAblationReport(t *testing.T) {
	if !*report {
		t.Skip("run with -ablation to print the report")
	}
	start := time.Now()
	r, err := Run(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("Run(DefaultConfig()) took %v\n%s", time.Since(start).Round(time.Millisecond), r.Markdown())
	if *plotsDir != "" {
		if err := r.Plots(*plotsDir); err != nil {
			t.Fatal(err)
		}
	}
}
