// Package serf is SERF's interference-aware queueing model (Yan, Ruwase,
// He, Smirni: "SERF: Efficient Scheduling for Fast Deep Neural Network
// Serving via Judicious Parallelism", SC'16) for models executed on CPU
// cores: a worker runs at most c requests at once (service parallelism),
// each with t intra-op threads (c*t <= cores). Profiling measures mu_i, the
// service rate of one request while i run concurrently (i = 1..c); requests
// are homogeneous (deterministic service at a given concurrency) and
// interfere through caches and memory bandwidth (mu_i falls with i).
//
// Predict gives the mean latency (queueing + service) at Poisson arrival
// rate lambda with the paper's M/D_interf/c model, Eq. 2-13: the
// M/M_interf/c birth-death chain (Eq. 2-7), Cosmetatos' M/D/c correction
// applied to its waiting time (Eq. 8-11), the service time an arrival sees
// by PASTA (Eq. 12) and their sum (Eq. 13). NewTable builds the paper's
// configuration reference table (the best (c, t) per load level), and
// Config.Point turns a configuration at a load into the profile.Point the
// allocator consumes. Simulate is a discrete-event simulation of the
// M/D_interf/c queue that the model is checked against.
//
// Units: rates are requests per second, times seconds.
package serf

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
)

// ErrUnstable is returned (wrapped) when the arrival rate reaches the
// configuration's capacity c*mu_c: the queue grows without bound.
var ErrUnstable = errors.New("arrival rate at or above capacity")

// Prediction is the model's answer for one configuration at one load.
type Prediction struct {
	Lambda float64 `json:"lambda"` // arrival rate, requests/s
	C      int     `json:"c"`      // service parallelism (servers)
	// Rho is lambda/(c*mu_c), the utilisation when all c run (Eq. 2's
	// rho); the queue is stable iff Rho < 1.
	Rho float64 `json:"rho"`
	// P0 is the probability the system is empty (Eq. 4).
	P0 float64 `json:"p0"`
	// Busy is the probability that all c slots are taken, P(N >= c): an
	// arrival waits (the Erlang-C probability when the mu_i are equal).
	Busy float64 `json:"busy"`
	// WaitMM is the mean queueing time of the M/M_interf/c chain (Eq. 7).
	WaitMM float64 `json:"waitMM"`
	// Wait is the mean queueing time of M/D_interf/c (Eq. 11).
	Wait float64 `json:"wait"`
	// Service is the mean service time an arrival gets (Eq. 12).
	Service float64 `json:"service"`
	// Latency is Wait + Service (Eq. 13), the mean response time.
	Latency float64 `json:"latency"`
}

// MarshalJSON writes an unstable prediction (rho >= 1, unbounded times)
// with its times left out, since JSON has no infinity.
func (p Prediction) MarshalJSON() ([]byte, error) {
	type plain Prediction
	if p.Rho < 1 {
		return json.Marshal(plain(p))
	}
	return json.Marshal(struct {
		Lambda   float64 `json:"lambda"`
		C        int     `json:"c"`
		Rho      float64 `json:"rho"`
		Unstable bool    `json:"unstable"`
	}{p.Lambda, p.C, p.Rho, true})
}

// Capacity is c*mu_c, the highest arrival rate the configuration sustains
// (the stability bound rho < 1 of Eq. 3). It is 0 for invalid mu.
func Capacity(mu []float64) float64 {
	if checkMu(mu) != nil {
		return 0
	}
	c := len(mu)
	return float64(c) * mu[c-1]
}

// checkMu validates profiled service rates: at least one, each finite and
// > 0. The error names the offending index as mu[i] (service parallelism
// i+1).
func checkMu(mu []float64) error {
	if len(mu) == 0 {
		return errors.New("serf: mu: no service rates (want mu_1..mu_c, c >= 1)")
	}
	for i, m := range mu {
		if math.IsNaN(m) || math.IsInf(m, 0) || m <= 0 {
			return fmt.Errorf("serf: mu[%d] (service rate with %d in service): must be finite and > 0 requests/s, got %g", i, i+1, m)
		}
	}
	return nil
}

// cosmetatosF is Eq. 9: f(s) = (c-1)(sqrt(4+5c)-2)/(16c). It is 0 at c = 1,
// where the correction leaves M/D/1's exact half of M/M/1's waiting time.
func cosmetatosF(c int) float64 {
	fc := float64(c)
	return (fc - 1) * (math.Sqrt(4+5*fc) - 2) / (16 * fc)
}

// Predict returns the M/D_interf/c prediction for the service rates mu
// (mu[i-1] = mu_i, the rate of each request while i run; c = len(mu)) at
// arrival rate lambda (requests/s).
//
// lambda = 0 gives the limit as lambda -> 0: no waiting, service 1/mu_1.
// lambda >= c*mu_c gives a Prediction with Rho >= 1 and infinite times, and
// an error wrapping ErrUnstable. Bad input (no rates, a rate <= 0 or not
// finite, lambda < 0 or not finite) gives an error naming the field.
func Predict(mu []float64, lambda float64) (Prediction, error) {
	if err := checkMu(mu); err != nil {
		return Prediction{}, err
	}
	if math.IsNaN(lambda) || math.IsInf(lambda, 0) || lambda < 0 {
		return Prediction{}, fmt.Errorf("serf: lambda: must be a finite arrival rate >= 0 requests/s, got %g", lambda)
	}
	c := len(mu)
	muC := mu[c-1]
	pr := Prediction{Lambda: lambda, C: c, Rho: lambda / (float64(c) * muC)}
	if lambda == 0 {
		pr.P0, pr.Service, pr.Latency = 1, 1/mu[0], 1/mu[0]
		return pr, nil
	}
	if pr.Rho >= 1 {
		inf := math.Inf(1)
		pr.WaitMM, pr.Wait, pr.Service, pr.Latency, pr.Busy = inf, inf, inf, inf, 1
		return pr, fmt.Errorf("serf: lambda %g requests/s with c=%d: %w c*mu_c = %g requests/s (rho = %.4g)",
			lambda, c, ErrUnstable, float64(c)*muC, pr.Rho)
	}
	rho := pr.Rho
	// q[n] = prod_{i=1..n} rho_i / n!, rho_i = lambda/mu_i (Eq. 2 without
	// p0), built term by term so that large c neither overflows n! nor the
	// product. q[0] = 1.
	q := make([]float64, c+1)
	q[0] = 1
	for n := 1; n <= c; n++ {
		q[n] = q[n-1] * (lambda / mu[n-1]) / float64(n)
	}
	// Eq. 3-4: H = 1 + sum_{k=1}^{c-1} q_k + q_c/(1-rho); p0 = 1/H.
	h := 0.0
	for k := 0; k < c; k++ {
		h += q[k]
	}
	h += q[c] / (1 - rho)
	if math.IsInf(h, 0) || math.IsNaN(h) {
		return pr, fmt.Errorf("serf: lambda %g requests/s with c=%d: the chain's terms overflow float64 (service rates %g..%g too far apart)", lambda, c, slices.Min(mu), slices.Max(mu))
	}
	p0 := 1 / h
	pr.P0 = p0
	// P(N >= c) = sum_{n>=c} p_n = p0 q_c / (1-rho) (geometric tail of Eq. 2).
	pr.Busy = p0 * q[c] / (1 - rho)
	// Eq. 6-7: L_q = p0 q_c rho/(1-rho)^2; W_q^{M/M_interf/c} = L_q/lambda.
	pr.WaitMM = p0 * q[c] * rho / ((1 - rho) * (1 - rho)) / lambda
	// Eq. 8-11: W_q^{M/D_interf/c} = 1/2 (1 + f(s) g(rho)) W_q^{M/M_interf/c},
	// f(s) from Eq. 9, g(rho) = (1-rho)/rho from Eq. 10.
	if pr.WaitMM > 0 { // else rho underflowed to 0 and g(rho) is Inf: no wait
		pr.Wait = 0.5 * (1 + cosmetatosF(c)*(1-rho)/rho) * pr.WaitMM
	}
	// Eq. 12, first line: an arrival that finds n < c requests in the system
	// (probability p_n by PASTA) starts at once as the (n+1)-th and is served
	// at mu_{n+1}; one that finds n >= c waits and starts with c in service,
	// served at mu_c. The paper's closed form on Eq. 12's second line drops
	// the p0 factor of the tail term (prod rho_i/(mu_c c! (1-rho)) instead of
	// p0 prod rho_i/(mu_c c! (1-rho))); without it the service time at c = 1
	// would be (1-rho)/mu + rho/(mu(1-rho)) instead of M/D/1's 1/mu. We use
	// the sum as defined on the first line.
	s := 0.0
	for i := 1; i <= c; i++ {
		s += p0 * q[i-1] / mu[i-1]
	}
	s += pr.Busy / muC
	pr.Service = s
	// Eq. 13: W = S + W_q.
	pr.Latency = pr.Service + pr.Wait
	if math.IsInf(pr.Latency, 0) || math.IsNaN(pr.Latency) {
		return pr, fmt.Errorf("serf: lambda %g requests/s with c=%d: latency overflows float64 (service rates %g..%g)", lambda, c, slices.Min(mu), slices.Max(mu))
	}
	return pr, nil
}
