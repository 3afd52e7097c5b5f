package gpu

import (
	"context"
	"math"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/media"
)

func TestParseVariance(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Variance
	}{
		{"exact", Variance{}},
		{"realistic", Realistic()},
		{" realistic , seed=7", func() Variance { v := Realistic(); v.Seed = 7; return v }()},
		{"realistic,stall=0,contention=0", Variance{Jitter: 0.1, Cold: 1.5, ColdIdle: 5 * time.Second, Shape: 1.5}},
		{"exact,jitter=0.2", Variance{Jitter: 0.2}},
		{"jitter=0.1,stall=0.01x2,cold=2", Variance{Jitter: 0.1, StallP: 0.01, StallX: 2, Cold: 2, ColdIdle: time.Second}},
		{"cold=3@500ms,shape=1.25", Variance{Cold: 3, ColdIdle: 500 * time.Millisecond, Shape: 1.25}},
		{"contention=0.05,seed=18446744073709551615", Variance{Contention: 0.05, Seed: math.MaxUint64}},
		{"jitter=0", Variance{}},
	} {
		got, err := ParseVariance(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("ParseVariance(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
}

func TestParseVarianceErrors(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string // each must be in the error: the bad part, and why
	}{
		{"", []string{"empty", "realistic"}},
		{"fast", []string{`"fast"`, "not a preset"}},
		{"jitter=abc", []string{`"jitter=abc"`, "not a number"}},
		{"jitter=-0.1", []string{`"jitter=-0.1"`, "out of range"}},
		{"jitter=NaN", []string{`"jitter=NaN"`, "not a number"}},
		{"jitter=Inf", []string{`"jitter=Inf"`, "not a number"}},
		{"stall=0.01", []string{`"stall=0.01"`, "PxF"}},
		{"stall=2x2", []string{`"stall=2x2"`, "fraction"}},
		{"stall=0.1x0.5", []string{`"stall=0.1x0.5"`, "factor"}},
		{"cold=0.5", []string{`"cold=0.5"`, "cold"}},
		{"cold=2@-1s", []string{`"cold=2@-1s"`, "idle"}},
		{"cold=2@soon", []string{`"cold=2@soon"`, "idle"}},
		{"shape=0", []string{`"shape=0"`, "shape"}},
		{"contention=11", []string{`"contention=11"`, "contention"}},
		{"seed=-1", []string{`"seed=-1"`, "unsigned"}},
		{"speed=2", []string{`"speed=2"`, "unknown factor"}},
		{"jitter=0.1,realistic", []string{`"realistic"`, "preset comes first"}},
		// every bad part is named, not just the first
		{"jitter=x,stall=y", []string{`"jitter=x"`, `"stall=y"`}},
	} {
		_, err := ParseVariance(tc.in)
		if err == nil {
			t.Errorf("ParseVariance(%q): no error", tc.in)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("ParseVariance(%q) = %v; want it to say %s", tc.in, err, w)
			}
		}
	}
}

func TestVarianceString(t *testing.T) {
	for _, tc := range []struct {
		v    Variance
		want string
	}{
		{Variance{}, "exact"},
		{Realistic(), "realistic"},
		{Variance{Jitter: 0.15, StallP: 0.01, StallX: 2, Cold: 2, ColdIdle: 2 * time.Second, Seed: 3}, "jitter=0.15,stall=0.01x2,cold=2@2s,seed=3"},
		{Variance{Shape: 1.5, Contention: 0.1}, "shape=1.5,contention=0.1"},
	} {
		if got := tc.v.String(); got != tc.want {
			t.Errorf("%+v.String() = %q, want %q", tc.v, got, tc.want)
		}
		back, err := ParseVariance(tc.v.String())
		if err != nil || back != tc.v {
			t.Errorf("ParseVariance(%q) = %+v, %v; want %+v", tc.v.String(), back, err, tc.v)
		}
	}
	if !Exact().IsExact() || Realistic().IsExact() || !(Variance{StallP: 0.5, StallX: 1, Cold: 1, Shape: 1}).IsExact() {
		t.Error("IsExact is wrong")
	}
}

func FuzzParseVariance(f *testing.F) {
	for _, s := range []string{"exact", "realistic", "realistic,seed=7", "jitter=0.1,stall=0.01x2,cold=2",
		"cold=3@500ms", "shape=1.5,contention=0.05", "stall=0", "jitter=1e-300", "cold=2@1h0m0.000000001s", ",", "x=y=z"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := ParseVariance(s)
		if err != nil {
			if v != (Variance{}) {
				t.Fatalf("ParseVariance(%q) failed but returned %+v", s, v)
			}
			return
		}
		// what parses is in range and reads back the same
		if v.Jitter < 0 || v.Jitter > 2 || v.StallP < 0 || v.StallP > 1 || (v.StallX != 0 && v.StallX < 1) ||
			(v.Cold != 0 && (v.Cold < 1 || v.ColdIdle <= 0)) || (v.Shape != 0 && v.Shape < 1) || v.Contention < 0 || v.Contention > 10 {
			t.Fatalf("ParseVariance(%q) = %+v: out of range", s, v)
		}
		back, err := ParseVariance(v.String())
		if err != nil || back != v {
			t.Fatalf("ParseVariance(%q) = %+v; its String %q reads back as %+v, %v", s, v, v.String(), back, err)
		}
	})
}

// steady draws n factors of a warm executor: one model and batch size
// already run, batches back to back, nothing else on the host.
func steady(v Variance, n int) []float64 {
	s := newVariance(v, nil)
	now := time.Unix(0, 0)
	s.start("m", 1, now)
	s.end(now)
	out := make([]float64, n)
	for i := range out {
		out[i] = s.start("m", 1, now)
		now = now.Add(time.Millisecond)
		s.end(now)
	}
	return out
}

func TestRealisticBounds(t *testing.T) {
	const n = 200_000
	fs := steady(Realistic(), n)
	var sum float64
	for _, f := range fs {
		sum += f
	}
	slices.Sort(fs)
	mean, p50, p99, p999 := sum/n, fs[n/2], fs[n*99/100], fs[n*999/1000]
	t.Logf("realistic, warm: mean %.3f p50 %.3f p99 %.3f p99.9 %.3f max %.3f", mean, p50, p99, p999, fs[n-1])
	// The profile stays the median; the mean is a few percent above it
	// (lognormal tail, stalls); p99 is the jitter's tail, p99.9 a stall.
	for _, c := range []struct {
		name      string
		got       float64
		low, high float64
	}{
		{"mean", mean, 1.0, 1.05},
		{"p50", p50, 0.98, 1.02},
		{"p99", p99, 1.15, 1.5},
		{"p99.9", p999, 2.5, 4.5},
		{"min", fs[0], 0.5, 0.8},
	} {
		if c.got < c.low || c.got > c.high {
			t.Errorf("%s = %.3f, want %.2f..%.2f", c.name, c.got, c.low, c.high)
		}
	}
	stalled := 0
	for _, f := range fs {
		if f > 2 {
			stalled++
		}
	}
	if frac := float64(stalled) / n; frac < 0.004 || frac > 0.006 {
		t.Errorf("%.4f of batches stalled, want about 0.005", frac)
	}
}

func TestVarianceDeterministic(t *testing.T) {
	v := Realistic()
	a, b := steady(v, 100), steady(v, 100)
	if !slices.Equal(a, b) {
		t.Error("the same seed drew different factors")
	}
	if c := steady(v.Derive("V100-1"), 100); slices.Equal(a, c) {
		t.Error("a derived seed drew the same factors")
	}
	if v.Derive("V100-1") != v.Derive("V100-1") || v.Derive("V100-1") == v.Derive("V100-2") {
		t.Error("Derive is not a function of the name")
	}
}

func TestVarianceColdShapeContention(t *testing.T) {
	t0 := time.Unix(0, 0)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }

	s := newVariance(Variance{Cold: 2, ColdIdle: time.Second}, nil)
	for i, step := range []struct {
		model      string
		start, end int // ms
		want       float64
	}{
		{"a", 0, 10, 2},        // a model's first batch
		{"a", 10, 20, 1},       // warm
		{"b", 20, 30, 2},       // another model's first
		{"a", 1029, 1040, 1},   // idle 999 ms: still warm
		{"a", 2040, 2050, 2},   // idle 1 s: cold
		{"b", 2050, 2060, 1},   // the executor is warm again
		{"a", 10000, 10010, 2}, // long idle
	} {
		if got := s.start(step.model, 1, ms(step.start)); got != step.want {
			t.Errorf("cold step %d (%s at %d ms): factor %g, want %g", i, step.model, step.start, got, step.want)
		}
		s.end(ms(step.end))
	}
	// Idle counts only when nothing runs: a batch that starts while
	// another one runs (concurrency 2) is not after idle.
	s.start("a", 1, ms(20000)) // cold, running until 30000
	if got := s.start("a", 2, ms(25000)); got != 1 {
		t.Errorf("batch beside a running one: factor %g, want 1", got)
	}

	s = newVariance(Variance{Shape: 1.5}, nil)
	for i, step := range []struct {
		model string
		b     int
		want  float64
	}{{"a", 2, 1.5}, {"a", 2, 1}, {"a", 3, 1.5}, {"b", 2, 1.5}, {"a", 3, 1}} {
		if got := s.start(step.model, step.b, t0); got != step.want {
			t.Errorf("shape step %d (%s b%d): factor %g, want %g", i, step.model, step.b, got, step.want)
		}
		s.end(t0)
	}

	var h Host
	v := Variance{Contention: 0.1}
	x, y := newVariance(v, &h), newVariance(v, &h)
	if got := x.start("a", 1, t0); got != 1 {
		t.Errorf("alone on the host: factor %g, want 1", got)
	}
	if got := y.start("a", 1, t0); got != 1.1 {
		t.Errorf("one other batch on the host: factor %g, want 1.1", got)
	}
	if got := x.start("a", 1, t0); math.Abs(got-1.2) > 1e-12 {
		t.Errorf("two others on the host: factor %g, want 1.2", got)
	}
	x.end(t0)
	x.end(t0)
	y.end(t0)
	if got := newVariance(v, nil).start("a", 1, t0); got != 1 {
		t.Errorf("a host of its own: factor %g, want 1", got)
	}
}

func items(n int) []*media.Item {
	out := make([]*media.Item, n)
	for i := range out {
		out[i] = &media.Item{Seq: uint64(i)}
	}
	return out
}

// runTimed runs one batch on e and returns how long it took on clk (the
// time of the timer Run set), advancing clk to its end.
func runTimed(t *testing.T, clk *clock.Fake, e *Emulated, model string, b int) time.Duration {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		_, err := e.Run(context.Background(), model, items(b))
		done <- err
	}()
	for clk.Pending() == 0 { // Run has set its timer
		runtime.Gosched()
	}
	at, _ := clk.Next()
	d := at.Sub(clk.Now())
	clk.Set(at)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	return d
}

func TestEmulatedVariance(t *testing.T) {
	lat := func(_ string, b int) (time.Duration, bool) { return time.Duration(b) * 10 * time.Millisecond, true }
	clk := clock.NewFake(time.Unix(0, 0))

	// No option: exact, as before.
	e := NewEmulated(clk, lat)
	if !e.Variance().IsExact() {
		t.Fatalf("default variance %v, want exact", e.Variance())
	}
	if d := runTimed(t, clk, e, "det", 2); d != 20*time.Millisecond {
		t.Errorf("exact batch took %v, want 20ms", d)
	}

	e = NewEmulated(clk, lat, WithVariance(Variance{Cold: 2, ColdIdle: time.Second}))
	e.SetSlowdown(1.5)
	var got []time.Duration
	got = append(got, runTimed(t, clk, e, "det", 1), runTimed(t, clk, e, "det", 1))
	clk.Advance(time.Second)
	got = append(got, runTimed(t, clk, e, "det", 1))
	want := []time.Duration{30 * time.Millisecond, 15 * time.Millisecond, 30 * time.Millisecond}
	if !slices.Equal(got, want) {
		t.Errorf("cold, warm, after 1 s idle (slowdown 1.5): %v, want %v", got, want)
	}

	// Realistic: the same seed gives the same times.
	times := func() []time.Duration {
		c := clock.NewFake(time.Unix(0, 0))
		e := NewEmulated(c, lat, WithVariance(Realistic().Derive("V100-1")))
		var out []time.Duration
		for i := range 50 {
			out = append(out, runTimed(t, c, e, "det", 1+i%4))
		}
		return out
	}
	a, b := times(), times()
	if !slices.Equal(a, b) {
		t.Errorf("realistic with one seed: %v then %v", a, b)
	}
	// the first batch is cold (1.5x) at a new size (1.5x); the fifth, at
	// the same size, is warm (jitter and a little contention only)
	if a[0] < 18*time.Millisecond || a[4] > 13*time.Millisecond {
		t.Errorf("realistic: first batch %v (want about 22.5ms), fifth %v (about 10ms)", a[0], a[4])
	}
}

// Run is called concurrently (a device's concurrency, a Router's models):
// the draws and counters hold under -race, and a cancelled batch is
// counted out.
func TestEmulatedVarianceConcurrent(t *testing.T) {
	lat := func(_ string, b int) (time.Duration, bool) { return time.Duration(b) * time.Millisecond, true }
	clk := clock.NewFake(time.Unix(0, 0))
	var h Host
	xs := []*Emulated{
		NewEmulated(clk, lat, WithVariance(Realistic()), WithHost(&h)),
		NewEmulated(clk, lat, WithVariance(Realistic().Derive("b")), WithHost(&h)),
	}
	const n = 64
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := context.Background()
			if i%8 == 0 {
				c = ctx
			}
			_, err := xs[i%2].Run(c, []string{"det", "cls"}[i%3%2], items(1+i%5))
			errs <- err
		}()
	}
	for clk.Pending() < n {
		runtime.Gosched()
	}
	if got := h.inflight.Load(); got != n {
		t.Errorf("host counts %d batches in flight, want %d", got, n)
	}
	cancel()
	clk.Advance(time.Hour)
	wg.Wait()
	close(errs)
	cancelled := 0
	for err := range errs {
		if err != nil {
			cancelled++
		}
	}
	if got := h.inflight.Load(); got != 0 {
		t.Errorf("host counts %d batches in flight after all ended, want 0", got)
	}
	if cancelled > n/8 {
		t.Errorf("%d batches failed, at most the %d cancelled ones may", cancelled, n/8)
	}
}
