package serf

import (
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/mdag/mdag/profile"
	"pgregory.net/rapid"
)

func TestConfigsErrors(t *testing.T) {
	for _, tc := range []struct {
		name  string
		rates []Rates
		cores int
		want  string
	}{
		{"no cores", []Rates{{1, []float64{1}}}, 0, "cores: must be >= 1"},
		{"no rates", nil, 4, "rates: none profiled"},
		{"zero threads", []Rates{{0, []float64{1}}}, 4, "rates[0].threads: must be >= 1"},
		{"too many threads", []Rates{{8, []float64{1}}}, 4, "rates[0].threads: 8 threads exceed the 4 cores"},
		{"duplicate", []Rates{{2, []float64{1}}, {2, []float64{1}}}, 4, "rates[1].threads: duplicate thread count 2 (first at rates[0])"},
		{"bad mu", []Rates{{1, []float64{1, 0}}}, 4, "rates[0]: serf: mu[1]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Configs(tc.rates, tc.cores)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestConfigs(t *testing.T) {
	cfgs, err := Configs([]Rates{
		{Threads: 2, Mu: []float64{20, 18, 15}}, // c=3 would need 6 cores
		{Threads: 1, Mu: []float64{11, 10.5, 10, 9}},
		{Threads: 4, Mu: []float64{35}},
	}, 4)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, c := range cfgs {
		got = append(got, c.String())
	}
	if want := "c=1,t=1 c=1,t=2 c=1,t=4 c=2,t=1 c=2,t=2 c=3,t=1 c=4,t=1"; strings.Join(got, " ") != want {
		t.Errorf("configs %v, want %s", got, want)
	}
	if cfgs[4].C != 2 || len(cfgs[4].Mu) != 2 || cfgs[4].Mu[1] != 18 {
		t.Errorf("c=2,t=2 rates %v, want [20 18]", cfgs[4].Mu)
	}
}

func TestNewTableErrors(t *testing.T) {
	ok := []Config{{C: 1, T: 1, Mu: []float64{10}}}
	for _, tc := range []struct {
		name  string
		cfgs  []Config
		loads []float64
		want  string
	}{
		{"no configs", nil, []float64{1}, "no configurations"},
		{"no loads", ok, nil, "no load levels"},
		{"rates mismatch", []Config{{C: 2, T: 1, Mu: []float64{10}}}, []float64{1}, "configs[0]: serf: config c=2,t=1: 1 service rates, want mu_1..mu_2"},
		{"duplicate", append(ok, ok...), []float64{1}, "configs[1]: duplicate configuration c=1,t=1 (first at configs[0])"},
		{"zero load", ok, []float64{0}, "loads[0]: must be a finite rate > 0"},
		{"not increasing", ok, []float64{2, 2}, "loads[1]: 2 is not above loads[0] = 2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewTable(tc.cfgs, tc.loads)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

// TestTableShape reproduces the two shapes of SERF's Fig. 12 (the paper
// publishes no profiled rates with predicted latencies, so there are no
// worked numbers to check): with little interference (CIFAR-10, top) the
// best configuration moves from intra-op threads at low load to service
// parallelism at high load; with a cache cliff past two concurrent
// requests (ImageNet-22K, bottom) service parallelism stays at 2 even at
// high load. Above every capacity there is no best.
func TestTableShape(t *testing.T) {
	for _, tc := range []struct {
		name  string
		rates []Rates
		cores int
		loads []float64
		want  []string
	}{
		{"little interference", []Rates{
			{Threads: 1, Mu: []float64{10, 9.8, 9.6, 9.4}},
			{Threads: 2, Mu: []float64{18, 17}},
			{Threads: 4, Mu: []float64{24}},
		}, 4, []float64{1, 20, 36, 40}, []string{"c=1,t=4", "c=2,t=2", "c=4,t=1", "none"}},
		{"cache cliff", []Rates{
			{Threads: 1, Mu: []float64{1, 0.98, 0.5, 0.45, 0.4, 0.35, 0.3, 0.25}},
			{Threads: 2, Mu: []float64{1.9, 1.85, 0.9, 0.8}},
			{Threads: 4, Mu: []float64{3.2, 3.0}},
			{Threads: 8, Mu: []float64{4}},
		}, 8, []float64{0.5, 3, 5, 5.8, 7}, []string{"c=1,t=8", "c=2,t=4", "c=2,t=4", "c=2,t=4", "none"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfgs, err := Configs(tc.rates, tc.cores)
			if err != nil {
				t.Fatal(err)
			}
			tab, err := NewTable(cfgs, tc.loads)
			if err != nil {
				t.Fatal(err)
			}
			for i, want := range tc.want {
				got := "none"
				if b := tab.Rows[i].Best; b >= 0 {
					got = tab.Configs[b].String()
				}
				if got != want {
					t.Errorf("load %g: best %s, want %s", tab.Rows[i].Lambda, got, want)
				}
			}
			if _, err := json.Marshal(tab); err != nil {
				t.Errorf("table with unstable configurations does not marshal: %v", err)
			}
			top := tc.loads[len(tc.loads)-1]
			if r, ok := tab.Lookup(tc.loads[1] - 0.01); !ok || r.Lambda != tc.loads[1] {
				t.Errorf("Lookup just below level 1 = %v, %v: want the row at %g", r.Lambda, ok, tc.loads[1])
			}
			if _, ok := tab.Lookup(top + 1); ok {
				t.Error("Lookup above the top level found a row")
			}
		})
	}
}

// decreasingRates draws mu_1 >= mu_2 >= ... >= mu_c > 0: interference only
// slows requests down.
func decreasingRates(t *rapid.T, label string, c int) []float64 {
	mu := make([]float64, c)
	mu[0] = rapid.Float64Range(0.1, 1000).Draw(t, label+".mu1")
	for i := 1; i < c; i++ {
		mu[i] = mu[i-1] * rapid.Float64Range(0.3, 1).Draw(t, label+".ratio")
	}
	return mu
}

// TestPropLatencyGrowsWithLoad: with rates that do not rise with
// concurrency, the predicted latency, queueing time and service time all
// grow with the arrival rate.
func TestPropLatencyGrowsWithLoad(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		c := rapid.IntRange(1, 16).Draw(t, "c")
		mu := decreasingRates(t, "rates", c)
		r1 := rapid.Float64Range(0, 0.99).Draw(t, "rho1")
		r2 := rapid.Float64Range(r1, 0.99).Draw(t, "rho2")
		l1, l2 := r1*Capacity(mu), r2*Capacity(mu)
		p1, err := Predict(mu, l1)
		if err != nil {
			t.Fatal(err)
		}
		p2, err := Predict(mu, l2)
		if err != nil {
			t.Fatal(err)
		}
		const tol = 1e-12
		if p2.Latency < p1.Latency*(1-tol) || p2.Wait < p1.Wait*(1-tol)-1e-300 || p2.Service < p1.Service*(1-tol) {
			t.Fatalf("mu %v: lambda %g -> %+v, lambda %g -> %+v: latency fell with load", mu, l1, p1, l2, p2)
		}
		if p1.Latency < 1/mu[0]*(1-tol) || p1.Service > 1/mu[c-1]*(1+tol) {
			t.Fatalf("mu %v lambda %g: %+v outside [1/mu_1, ...], service above 1/mu_c", mu, l1, p1)
		}
	})
}

// TestPropTable: every row's best is stable, no slower than any other
// stable configuration, absent only when none is stable; the best latency
// grows with the load; Lookup finds the first level at or above a load.
func TestPropTable(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		cores := rapid.IntRange(1, 16).Draw(t, "cores")
		var rates []Rates
		for th := 1; th <= cores; th *= 2 {
			if rapid.Bool().Draw(t, "profiled") || th == 1 {
				rates = append(rates, Rates{Threads: th, Mu: decreasingRates(t, "rates", cores/th)})
			}
		}
		cfgs, err := Configs(rates, cores)
		if err != nil {
			t.Fatal(err)
		}
		for _, cfg := range cfgs {
			if cfg.Cores() > cores || len(cfg.Mu) != cfg.C {
				t.Fatalf("config %s with %d rates on %d cores", cfg, len(cfg.Mu), cores)
			}
		}
		levels := rapid.IntRange(1, 12).Draw(t, "levels")
		loads, err := EvenLoads(levels, 1.1*MaxCapacity(cfgs))
		if err != nil {
			t.Fatal(err)
		}
		tab, err := NewTable(cfgs, loads)
		if err != nil {
			t.Fatal(err)
		}
		prev := 0.0
		for _, row := range tab.Rows {
			anyStable := false
			for i, p := range row.Predictions {
				want, err := tab.Configs[i].Predict(row.Lambda)
				if err != nil && !errors.Is(err, ErrUnstable) {
					t.Fatal(err)
				}
				if p.Latency != want.Latency && !(math.IsInf(p.Latency, 1) && math.IsInf(want.Latency, 1)) {
					t.Fatalf("row %g config %s: stored %g, predicted %g", row.Lambda, tab.Configs[i], p.Latency, want.Latency)
				}
				if p.Rho < 1 {
					anyStable = true
					if row.Best >= 0 && p.Latency < row.Latency {
						t.Fatalf("row %g: best %s at %g but %s at %g", row.Lambda, tab.Configs[row.Best], row.Latency, tab.Configs[i], p.Latency)
					}
				}
			}
			if anyStable != (row.Best >= 0) {
				t.Fatalf("row %g: best %d with stable configurations %v", row.Lambda, row.Best, anyStable)
			}
			if row.Best >= 0 {
				if row.Predictions[row.Best].Rho >= 1 || row.Predictions[row.Best].Latency != row.Latency {
					t.Fatalf("row %g: best %s %+v, row latency %g", row.Lambda, tab.Configs[row.Best], row.Predictions[row.Best], row.Latency)
				}
				if row.Latency < prev*(1-1e-12) {
					t.Fatalf("best latency fell from %g to %g at load %g", prev, row.Latency, row.Lambda)
				}
				prev = row.Latency
			}
		}
		q := rapid.Float64Range(0, 1.2*loads[len(loads)-1]).Draw(t, "lookup")
		row, ok := tab.Lookup(q)
		if ok != (q <= loads[len(loads)-1]) {
			t.Fatalf("Lookup(%g) ok %v with top level %g", q, ok, loads[len(loads)-1])
		}
		if ok {
			i := int(math.Round(row.Lambda / loads[0]))
			if row.Lambda < q || i >= 2 && loads[i-2] >= q {
				t.Fatalf("Lookup(%g) = level %g, levels %v", q, row.Lambda, loads)
			}
		}
	})
}

func TestPointErrors(t *testing.T) {
	cfg := Config{C: 2, T: 1, Mu: []float64{10, 9}}
	for _, tc := range []struct {
		lambda float64
		want   string
	}{
		{0, "lambda must be > 0"},
		{math.NaN(), "lambda must be > 0"},
		{18, "at or above capacity"},
	} {
		if _, err := cfg.Point(tc.lambda); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Point(%g) error %v, want %q", tc.lambda, err, tc.want)
		}
	}
}

// TestPoint: the mapping documented on Config.Point, and the allocator's
// reading of it.
func TestPoint(t *testing.T) {
	cfg := Config{C: 2, T: 3, Mu: []float64{10, 9}}
	pt, err := cfg.Point(9)
	if err != nil {
		t.Fatal(err)
	}
	p, _ := cfg.Predict(9)
	if pt.Batch != 1 || pt.Concurrency != 2 || pt.Throughput != 9 {
		t.Errorf("point %+v: want batch 1, concurrency 2, throughput 9", pt)
	}
	if d := pt.Latency.Seconds() - p.Latency; d < 0 || d > 1e-9 {
		t.Errorf("point latency %v, predicted %g s", pt.Latency, p.Latency)
	}
	f := &profile.File{
		Workers:  []profile.WorkerType{{Type: "cpu4", Price: 0.2, CPUs: 6}},
		Profiles: []profile.Profile{{Target: "resnet50", Worker: "cpu4", Points: []profile.Point{pt}}},
	}
	if err := f.Validate(); err != nil {
		t.Fatalf("the point does not validate as a profile: %v", err)
	}
}

// TestPropOperatingPoints: one point per c, each within the budget and the
// utilisation bound, at the highest such rate, and together a valid
// profile.
func TestPropOperatingPoints(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		cores := rapid.IntRange(1, 8).Draw(t, "cores")
		var rates []Rates
		for th := 1; th <= cores; th++ {
			if rapid.Bool().Draw(t, "profiled") || th == 1 {
				rates = append(rates, Rates{Threads: th, Mu: decreasingRates(t, "rates", cores/th)})
			}
		}
		cfgs, err := Configs(rates, cores)
		if err != nil {
			t.Fatal(err)
		}
		budget := time.Duration(rapid.Float64Range(1e-4, 20).Draw(t, "budget") * float64(time.Second))
		maxRho := rapid.Float64Range(0.05, 0.95).Draw(t, "maxRho")
		ops, err := OperatingPoints(cfgs, budget, maxRho)
		fastest := 0.0
		for _, cfg := range cfgs {
			fastest = max(fastest, cfg.Mu[0])
		}
		switch idle := 1 / fastest; {
		case idle >= budget.Seconds():
			// at the budget or above it: any rate > 0 queues past it
			if err == nil {
				t.Fatalf("budget %v at or below every idle latency, got %v", budget, ops)
			}
			return
		case idle > budget.Seconds()*(1-1e-6):
			return // a hair under: a vanishing rate, or none the search resolves; either holds
		}
		if err != nil {
			t.Fatal(err)
		}
		var pts []profile.Point
		for i, op := range ops {
			if i > 0 && op.Config.C <= ops[i-1].Config.C {
				t.Fatalf("points not one per c in increasing c: %v", ops)
			}
			pr := op.Prediction
			if pr.Latency > budget.Seconds()*(1+1e-12) || pr.Rho > maxRho*(1+1e-12) {
				t.Fatalf("%s at %g: latency %g (budget %v), rho %g (max %g)", op.Config, op.Lambda, pr.Latency, budget, pr.Rho, maxRho)
			}
			// Maximal: a little more load breaks the budget or the bound.
			if more := op.Lambda * (1 + 1e-6); more/op.Config.Capacity() <= maxRho {
				if p, err := op.Config.Predict(more); err == nil && p.Latency <= budget.Seconds() {
					t.Fatalf("%s: rate %g is not the highest within %v (%g at %g)", op.Config, op.Lambda, budget, p.Latency, more)
				}
			}
			// No other t at this c carries more.
			for _, cfg := range cfgs {
				if cfg.C != op.Config.C {
					continue
				}
				if l, ok, _ := MaxRate(cfg, budget, maxRho); ok && l > op.Lambda*(1+1e-9) {
					t.Fatalf("c=%d: chose %s at %g but %s carries %g", cfg.C, op.Config, op.Lambda, cfg, l)
				}
			}
			pts = append(pts, op.Point)
		}
		f := &profile.File{
			Workers:  []profile.WorkerType{{Type: "cpu", Price: 1, CPUs: cores}},
			Profiles: []profile.Profile{{Target: "m", Worker: "cpu", Points: pts}},
		}
		if err := f.Validate(); err != nil {
			t.Fatalf("operating points are not a valid profile: %v", err)
		}
	})
}

func TestMaxRateErrors(t *testing.T) {
	cfg := Config{C: 1, T: 1, Mu: []float64{10}}
	for _, r := range []float64{0, 1, -0.5, math.NaN()} {
		if _, _, err := MaxRate(cfg, time.Second, r); err == nil {
			t.Errorf("MaxRate with maxRho %g: no error", r)
		}
	}
	if _, _, err := MaxRate(Config{C: 2, T: 1, Mu: []float64{1}}, time.Second, 0.5); err == nil {
		t.Error("MaxRate with a malformed config: no error")
	}
	if l, ok, err := MaxRate(cfg, 50*time.Millisecond, 0.9); err != nil || ok || l != 0 {
		t.Errorf("budget below 1/mu_1: got %g %v %v, want not ok", l, ok, err)
	}
	// No budget: the utilisation bound decides.
	if l, ok, err := MaxRate(cfg, 0, 0.8); err != nil || !ok || l != 8 {
		t.Errorf("no budget: got %g %v %v, want 8", l, ok, err)
	}
	// M/D/1: W(lambda) = rho/(2 mu (1-rho)) + 1/mu = 150 ms at rho = 0.5.
	if l, ok, err := MaxRate(cfg, 150*time.Millisecond, 0.95); err != nil || !ok || math.Abs(l-5) > 1e-6 {
		t.Errorf("budget 150 ms: got %g %v %v, want 5", l, ok, err)
	}
}

func TestEvenLoads(t *testing.T) {
	l, err := EvenLoads(4, 8)
	if err != nil || len(l) != 4 || l[0] != 2 || l[3] != 8 {
		t.Errorf("EvenLoads(4, 8) = %v, %v", l, err)
	}
	for _, tc := range []struct {
		n   int
		max float64
	}{{0, 1}, {3, 0}, {3, math.Inf(1)}} {
		if _, err := EvenLoads(tc.n, tc.max); err == nil {
			t.Errorf("EvenLoads(%d, %g): no error", tc.n, tc.max)
		}
	}
}

// BenchmarkNewTable: a 16-core worker profiled at t = 1, 2, 4, 8, 16 (31
// configurations) over SERF's 10 load levels.
func BenchmarkNewTable(b *testing.B) {
	var rates []Rates
	for th := 1; th <= 16; th *= 2 {
		mu := make([]float64, 16/th)
		for i := range mu {
			mu[i] = 10 * float64(th) / (1 + 0.05*float64(i*th))
		}
		rates = append(rates, Rates{Threads: th, Mu: mu})
	}
	cfgs, err := Configs(rates, 16)
	if err != nil {
		b.Fatal(err)
	}
	loads, _ := EvenLoads(10, MaxCapacity(cfgs))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := NewTable(cfgs, loads); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkPredict(b *testing.B) {
	mu := []float64{10, 9.8, 9.5, 9, 8.5, 8, 7.5, 7}
	for b.Loop() {
		if _, err := Predict(mu, 40); err != nil {
			b.Fatal(err)
		}
	}
}
