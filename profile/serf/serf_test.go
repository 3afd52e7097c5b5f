package serf

import (
	"errors"
	"math"
	"strings"
	"testing"
)

func relErr(got, want float64) float64 { return math.Abs(got-want) / math.Abs(want) }

func TestPredictErrors(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mu     []float64
		lambda float64
		want   string
		unstab bool
	}{
		{"no rates", nil, 1, "mu: no service rates", false},
		{"zero rate", []float64{10, 0}, 1, "mu[1] (service rate with 2 in service): must be finite and > 0", false},
		{"negative rate", []float64{-1}, 1, "mu[0]", false},
		{"NaN rate", []float64{math.NaN()}, 1, "mu[0]", false},
		{"infinite rate", []float64{10, math.Inf(1)}, 1, "mu[1]", false},
		{"negative lambda", []float64{10}, -1, "lambda: must be a finite arrival rate >= 0", false},
		{"NaN lambda", []float64{10}, math.NaN(), "lambda", false},
		{"infinite lambda", []float64{10}, math.Inf(1), "lambda", false},
		{"at capacity", []float64{10, 8}, 16, "c*mu_c = 16", true},
		{"above capacity", []float64{10}, 11, "rho = 1.1", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := Predict(tc.mu, tc.lambda)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Predict(%v, %g) error %v, want one containing %q", tc.mu, tc.lambda, err, tc.want)
			}
			if got := errors.Is(err, ErrUnstable); got != tc.unstab {
				t.Errorf("errors.Is(err, ErrUnstable) = %v, want %v", got, tc.unstab)
			}
			if tc.unstab && (p.Rho < 1 || !math.IsInf(p.Latency, 1)) {
				t.Errorf("unstable prediction %+v: want rho >= 1 and infinite latency", p)
			}
		})
	}
}

func TestPredictIdle(t *testing.T) {
	p, err := Predict([]float64{20, 10, 5}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if p.Latency != 1.0/20 || p.Wait != 0 || p.P0 != 1 {
		t.Errorf("idle prediction %+v: want latency 1/mu_1 = 0.05, no wait, p0 = 1", p)
	}
	// The limit is continuous: a tiny load is close to idle.
	q, err := Predict([]float64{20, 10, 5}, 1e-9)
	if err != nil {
		t.Fatal(err)
	}
	if relErr(q.Latency, p.Latency) > 1e-6 {
		t.Errorf("latency at lambda=1e-9 %g, at 0 %g", q.Latency, p.Latency)
	}
}

// TestMD1 checks c = 1 against M/D/1's exact Pollaczek-Khinchine mean:
// W = rho/(2 mu (1-rho)) + 1/mu. Eq. 9 gives f(s) = 0 at c = 1, so Eq. 11 is
// half of M/M/1's rho/(mu(1-rho)), and Eq. 12 is 1/mu.
func TestMD1(t *testing.T) {
	for _, mu := range []float64{0.5, 3, 10, 250} {
		for _, rho := range []float64{0.01, 0.1, 0.5, 0.85, 0.99} {
			lambda := rho * mu
			p, err := Predict([]float64{mu}, lambda)
			if err != nil {
				t.Fatal(err)
			}
			wantWait := rho / (2 * mu * (1 - rho))
			for _, c := range []struct {
				what      string
				got, want float64
			}{
				{"rho", p.Rho, rho},
				{"p0", p.P0, 1 - rho},
				{"wait M/M/1", p.WaitMM, rho / (mu * (1 - rho))},
				{"wait", p.Wait, wantWait},
				{"service", p.Service, 1 / mu},
				{"latency", p.Latency, wantWait + 1/mu},
			} {
				if relErr(c.got, c.want) > 1e-12 {
					t.Errorf("mu %g rho %g: %s = %.15g, want %.15g", mu, rho, c.what, c.got, c.want)
				}
			}
		}
	}
}

// erlangC is the textbook M/M/c probability of waiting, by the Erlang B
// recursion B(k) = a B(k-1)/(k + a B(k-1)), C = B/(1 - rho (1 - B)):
// computed independently of Eq. 2-4.
func erlangC(c int, a float64) float64 {
	b := 1.0
	for k := 1; k <= c; k++ {
		b = a * b / (float64(k) + a*b)
	}
	rho := a / float64(c)
	return b / (1 - rho*(1-b))
}

// TestEqualRates: with mu_1 = ... = mu_c (no interference) the model is
// Cosmetatos' M/D/c approximation over M/M/c: Eq. 7 is Erlang C's
// C/(c mu - lambda), Eq. 12 is 1/mu, and Eq. 11 is Cosmetatos' formula
// (1/2)(1 + (1-rho)(c-1)(sqrt(4+5c)-2)/(16 rho c)) W_q^{M/M/c}.
func TestEqualRates(t *testing.T) {
	for _, c := range []int{1, 2, 3, 4, 8, 16, 64} {
		for _, rho := range []float64{0.05, 0.3, 0.7, 0.85, 0.98} {
			const mu = 7.0
			rates := make([]float64, c)
			for i := range rates {
				rates[i] = mu
			}
			lambda := rho * float64(c) * mu
			p, err := Predict(rates, lambda)
			if err != nil {
				t.Fatal(err)
			}
			pw := erlangC(c, lambda/mu)
			wantMM := pw / (float64(c)*mu - lambda)
			fc := float64(c)
			wantWait := 0.5 * (1 + (1-rho)*(fc-1)*(math.Sqrt(4+5*fc)-2)/(16*rho*fc)) * wantMM
			for _, x := range []struct {
				what      string
				got, want float64
			}{
				{"P(wait)", p.Busy, pw},
				{"wait M/M/c", p.WaitMM, wantMM},
				{"wait", p.Wait, wantWait},
				{"service", p.Service, 1 / mu},
				{"latency", p.Latency, wantWait + 1/mu},
			} {
				if relErr(x.got, x.want) > 1e-9 {
					t.Errorf("c %d rho %g: %s = %.12g, want %.12g", c, rho, x.what, x.got, x.want)
				}
			}
		}
	}
}

// TestClosedFormsAgainstSums checks Eq. 3-7 and Eq. 12 against their
// definitions: the chain's stationary probabilities from the balance
// equations lambda p_n = min(n+1, c) mu_{min(n+1, c)} p_{n+1} (Fig. 10),
// normalised and summed term by term far into the tail.
func TestClosedFormsAgainstSums(t *testing.T) {
	for _, tc := range []struct {
		mu  []float64
		rho float64
	}{
		{[]float64{10}, 0.6},
		{[]float64{10, 9}, 0.5},
		{[]float64{10, 9.5, 8.5, 7}, 0.8},
		{[]float64{10, 8, 6, 4}, 0.3},
		{[]float64{4, 4.5, 5}, 0.7}, // rates that rise with concurrency are allowed
		{[]float64{10, 9.8, 9.5, 9, 8.5, 8, 7.5, 7}, 0.85},
	} {
		c := len(tc.mu)
		lambda := tc.rho * Capacity(tc.mu)
		p, err := Predict(tc.mu, lambda)
		if err != nil {
			t.Fatal(err)
		}
		const n = 5000
		pn := make([]float64, n)
		pn[0] = 1
		for k := 1; k < n; k++ {
			i := min(k, c)
			pn[k] = pn[k-1] * lambda / (float64(i) * tc.mu[i-1])
		}
		var sum float64
		for _, v := range pn {
			sum += v
		}
		var lq, busy, service float64
		for k := range pn {
			pn[k] /= sum
			if k >= c {
				lq += float64(k-c) * pn[k] // Eq. 5
				busy += pn[k]
			}
			service += pn[k] / tc.mu[min(k+1, c)-1] // Eq. 12, first line
		}
		for _, x := range []struct {
			what      string
			got, want float64
		}{
			{"p0 (Eq. 4)", p.P0, pn[0]},
			{"P(N >= c)", p.Busy, busy},
			{"W_q M/M_interf/c (Eq. 7)", p.WaitMM, lq / lambda},
			{"service (Eq. 12)", p.Service, service},
		} {
			if relErr(x.got, x.want) > 1e-9 {
				t.Errorf("mu %v rho %g: %s = %.12g, direct sum %.12g", tc.mu, tc.rho, x.what, x.got, x.want)
			}
		}
	}
}

// TestPaperClosedFormTypo documents why Predict uses Eq. 12's first line:
// the paper's second line (tail term without p0) disagrees with it, and at
// c = 1 it would not give M/D/1's service time 1/mu.
func TestPaperClosedFormTypo(t *testing.T) {
	mu, rho := 10.0, 0.5
	printed := (1-rho)/mu + rho/(mu*(1-rho)) // sum p_{i-1}/mu_i + prod rho_i/(mu_c c! (1-rho)) at c = 1
	p, err := Predict([]float64{mu}, rho*mu)
	if err != nil {
		t.Fatal(err)
	}
	if p.Service != 1/mu || math.Abs(printed-1/mu) < 1e-3 {
		t.Errorf("service %g, printed closed form %g, want 1/mu = %g from the first line only", p.Service, printed, 1/mu)
	}
}

func TestCapacity(t *testing.T) {
	for _, tc := range []struct {
		mu   []float64
		want float64
	}{
		{[]float64{10}, 10},
		{[]float64{10, 9, 8}, 24},
		{nil, 0},
		{[]float64{1, -1}, 0},
	} {
		if got := Capacity(tc.mu); got != tc.want {
			t.Errorf("Capacity(%v) = %g, want %g", tc.mu, got, tc.want)
		}
	}
}

// FuzzPredict: any rates and load give an error or a finite, ordered
// prediction; no panic.
func FuzzPredict(f *testing.F) {
	f.Add(10.0, 9.0, 8.0, 3, 20.0)
	f.Add(1e-300, 1e300, 1.0, 2, 1e-10)
	f.Add(5.0, 5.0, 5.0, 1, 4.999999)
	f.Fuzz(func(t *testing.T, a, b, c float64, n int, lambda float64) {
		mu := []float64{a, b, c}[:max(1, min(3, n&3))]
		p, err := Predict(mu, lambda)
		if err != nil {
			return
		}
		if math.IsNaN(p.Latency) || math.IsInf(p.Latency, 0) || p.Service <= 0 || p.Wait < 0 || p.Latency < p.Service ||
			math.IsNaN(p.P0) || math.IsNaN(p.Busy) {
			t.Fatalf("Predict(%v, %g) = %+v: want finite times, wait >= 0, latency >= service > 0", mu, lambda, p)
		}
		if p.Rho >= 1 {
			t.Fatalf("Predict(%v, %g) stable with rho %g", mu, lambda, p.Rho)
		}
	})
}

func TestPredictTinyLoad(t *testing.T) {
	for _, lambda := range []float64{5e-324, 1e-310, 1e-200} {
		p, err := Predict([]float64{10, 9, 8}, lambda)
		if err != nil || p.Latency != 0.1 {
			t.Errorf("Predict at lambda %g = %+v, %v: want latency 1/mu_1 = 0.1", lambda, p, err)
		}
	}
}
