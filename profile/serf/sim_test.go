package serf

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
)

func TestSimulateErrors(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mu     []float64
		lambda float64
		mode   Interference
		n      int
		want   string
	}{
		{"no rates", nil, 1, Shared, 100, "no service rates"},
		{"zero lambda", []float64{10}, 0, Shared, 100, "lambda must be a finite rate > 0"},
		{"unstable", []float64{10, 4}, 8, Shared, 100, "at or above capacity"},
		{"too few", []float64{10}, 1, Shared, 5, "want n >= 20"},
		{"bad mode", []float64{10}, 1, Interference(7), 100, "unknown interference mode 7"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Simulate(tc.mu, tc.lambda, tc.mode, tc.n, 0, 1)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
	if _, err := Simulate([]float64{10, 4}, 8, Shared, 100, 0, 1); !errors.Is(err, ErrUnstable) {
		t.Errorf("unstable simulate error %v does not wrap ErrUnstable", err)
	}
}

// TestSimulateModesAgree: where the rate does not depend on concurrency
// (c = 1, or equal rates) the two interference modes are the same process
// and, with one seed, give the same numbers.
func TestSimulateModesAgree(t *testing.T) {
	for _, mu := range [][]float64{{10}, {10, 10, 10}} {
		lambda := 0.7 * Capacity(mu)
		a, err := Simulate(mu, lambda, AtStart, 20000, 1000, 3)
		if err != nil {
			t.Fatal(err)
		}
		s, err := Simulate(mu, lambda, Shared, 20000, 1000, 3)
		if err != nil {
			t.Fatal(err)
		}
		if relErr(a.Latency, s.Latency) > 1e-9 || relErr(a.Wait+1, s.Wait+1) > 1e-9 {
			t.Errorf("mu %v: at-start %+v, shared %+v: want equal", mu, a, s)
		}
		if relErr(s.Service, 1/mu[0]) > 1e-9 {
			t.Errorf("mu %v: simulated service %g, want the deterministic 1/mu = %g", mu, s.Service, 1/mu[0])
		}
	}
}

// simPoints are the (rates, rho) points the model is checked on against the
// simulation. The rate profiles are shaped like SERF's Fig. 6: none (CIFAR:
// no interference), a gradual decline, a cache cliff past two concurrent
// requests (ImageNet-22K) and a steep decline.
var simProfiles = []struct {
	name string
	mu   []float64
}{
	{"c=1", []float64{10}},
	{"c=2 none", []float64{10, 10}},
	{"c=4 none", []float64{10, 10, 10, 10}},
	{"c=2 mild", []float64{10, 9}},
	{"c=4 gradual", []float64{10, 9.5, 8.5, 7}},
	{"c=4 cliff", []float64{10, 9.8, 6, 5}},
	{"c=8 gradual", []float64{10, 9.8, 9.5, 9, 8.5, 8, 7.5, 7}},
	{"c=4 steep", []float64{10, 8, 6, 4}},
}

var simRhos = []float64{0.3, 0.5, 0.7, 0.85}

// TestPredictionVsSimulation: Eq. 13 against a discrete-event simulation
// of M/D_interf/c in which every request's speed follows the number in
// service (Shared): |error| <= 3% at every point, rho <= 0.85. The
// at-start simulation (Eq. 12's assumption taken literally) is logged for
// comparison. Run with -v for the table.
func TestPredictionVsSimulation(t *testing.T) {
	// A million requests per point keeps the 95% half-width under 1% at
	// rho = 0.85; fewer (200k) let sampling noise alone cross 3% there.
	n, warm := 1_000_000, 50_000
	var b strings.Builder
	b.WriteString("| rates mu_i (1/s) | rho | lambda (1/s) | predicted W (ms) | DES shared (ms) | error | DES at-start (ms) | error |\n|---|---|---|---|---|---|---|---|\n")
	worst := 0.0
	for i, pf := range simProfiles {
		for j, rho := range simRhos {
			lambda := rho * Capacity(pf.mu)
			p, err := Predict(pf.mu, lambda)
			if err != nil {
				t.Fatal(err)
			}
			seed := uint64(100*i + j + 1)
			s, err := Simulate(pf.mu, lambda, Shared, n, warm, seed)
			if err != nil {
				t.Fatal(err)
			}
			a, err := Simulate(pf.mu, lambda, AtStart, n, warm, seed)
			if err != nil {
				t.Fatal(err)
			}
			es := (p.Latency - s.Latency) / s.Latency
			ea := (p.Latency - a.Latency) / a.Latency
			worst = max(worst, math.Abs(es))
			if math.Abs(es) > 0.03 {
				t.Errorf("%s rho %.2f: predicted %.3f ms, simulated %.3f ms (+-%.3f): error %+.2f%% beyond 3%%",
					pf.name, rho, 1e3*p.Latency, 1e3*s.Latency, 1e3*s.HalfWidth, 100*es)
			}
			fmt.Fprintf(&b, "| %s %v | %.2f | %.2f | %.2f | %.2f +- %.2f | %+.2f%% | %.2f +- %.2f | %+.2f%% |\n",
				pf.name, pf.mu, rho, lambda, 1e3*p.Latency, 1e3*s.Latency, 1e3*s.HalfWidth, 100*es,
				1e3*a.Latency, 1e3*a.HalfWidth, 100*ea)
		}
	}
	t.Logf("SERF prediction vs DES (%d requests per point after %d warm-up):\n%sworst |error| vs shared DES: %.2f%%", n, warm, b.String(), 100*worst)
}

// TestSimulateMD1: the simulator itself against M/D/1's exact mean.
func TestSimulateMD1(t *testing.T) {
	for _, rho := range []float64{0.3, 0.8} {
		mu := 4.0
		s, err := Simulate([]float64{mu}, rho*mu, Shared, 400_000, 20_000, 9)
		if err != nil {
			t.Fatal(err)
		}
		want := rho/(2*mu*(1-rho)) + 1/mu
		if math.Abs(s.Latency-want) > max(3*s.HalfWidth, 0.005*want) {
			t.Errorf("rho %g: simulated %g +- %g, P-K %g", rho, s.Latency, s.HalfWidth, want)
		}
	}
}
