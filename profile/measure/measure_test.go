package measure

import (
	"context"
	"flag"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
	"unicode/utf8"

	"github.com/mdag/mdag/gpu"
	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/media"
	"github.com/mdag/mdag/profile"
	"github.com/mdag/mdag/profile/serf"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// linear is the emulated executor's l(b) = alpha*b + beta.
func linear(alpha, beta time.Duration) gpu.LatencyFunc {
	return func(model string, b int) (time.Duration, bool) {
		if model != "m" {
			return 0, false
		}
		return alpha*time.Duration(b) + beta, true
	}
}

func tinyItems(n int) []*media.Item { return Frames(n, 8, 8) }

// TestSweepEmulated: in a synctest bubble the emulated executor's latency is
// exact, so every point's p50/p99 is l(b), the throughput b*c/l(b), and the
// fit recovers alpha and beta with R^2 = 1.
func TestSweepEmulated(t *testing.T) {
	cases := []struct {
		name        string
		alpha, beta time.Duration
		batches     []int
		conc        []int
	}{
		{"default grid", 2 * time.Millisecond, 5 * time.Millisecond, nil, nil},
		{"steep", 7300 * time.Microsecond, 900 * time.Microsecond, []int{1, 3, 16}, []int{1}},
		{"flat", 0, 12 * time.Millisecond, []int{1, 32}, []int{1, 4}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				x := gpu.NewEmulated(clock.Real{}, linear(tc.alpha, tc.beta))
				var progress int
				res, err := Sweep(context.Background(), x, Options{Model: "m", Batches: tc.batches, Concurrency: tc.conc,
					Iterations: 5, Items: tinyItems, Progress: func(done, total int, _ Point) { progress = done }})
				if err != nil {
					t.Fatal(err)
				}
				if progress != len(res.Points) {
					t.Errorf("progress ended at %d of %d points", progress, len(res.Points))
				}
				for _, p := range res.Points {
					want := tc.alpha*time.Duration(p.Batch) + tc.beta
					if p.P50 != want || p.P99 != want || p.Mean != want || p.Max != want {
						t.Errorf("b=%d c=%d: p50 %v p99 %v mean %v, want %v", p.Batch, p.Concurrency, p.P50, p.P99, p.Mean, want)
					}
					if p.Batches != 5*p.Concurrency {
						t.Errorf("b=%d c=%d: %d batches, want %d", p.Batch, p.Concurrency, p.Batches, 5*p.Concurrency)
					}
					tp := float64(p.Batch*p.Concurrency) / want.Seconds()
					if math.Abs(p.Throughput-tp) > 1e-9*tp {
						t.Errorf("b=%d c=%d: throughput %g, want %g", p.Batch, p.Concurrency, p.Throughput, tp)
					}
				}
				if len(res.Fits) != len(res.Points)/len(res.Fits) && len(res.Fits) == 0 {
					t.Fatalf("no fits")
				}
				for _, f := range res.Fits {
					if f.Alpha != tc.alpha || f.Beta != tc.beta || math.Abs(f.R2-1) > 1e-12 {
						t.Errorf("c=%d: fit %v*b + %v (R^2 %g), want %v*b + %v (R^2 1)", f.Concurrency, f.Alpha, f.Beta, f.R2, tc.alpha, tc.beta)
					}
				}
			})
		})
	}
}

func TestSweepErrors(t *testing.T) {
	x := gpu.NewEmulated(clock.Real{}, linear(time.Microsecond, time.Microsecond))
	cases := []struct {
		name string
		o    Options
		want string
	}{
		{"no model", Options{}, "no model named"},
		{"unknown model", Options{Model: "nope", Batches: []int{1}, Concurrency: []int{1}, Items: tinyItems}, `batch 1, concurrency 1: emulated: no profile for model "nope"`},
		{"batch 0", Options{Model: "m", Batches: []int{0}}, "batch size 0"},
		{"concurrency 0", Options{Model: "m", Concurrency: []int{-1}}, "concurrency -1"},
		{"iterations", Options{Model: "m", Iterations: -2}, "iterations -2"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Sweep(context.Background(), x, tc.o)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

// TestYAMLGolden: the emulated sweep's profiles document, byte for byte,
// and profile.Parse accepts it.
func TestYAMLGolden(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		x := gpu.NewEmulated(clock.Real{}, linear(2*time.Millisecond, 5*time.Millisecond))
		res, err := Sweep(context.Background(), x, Options{Model: "m", Iterations: 3, Items: tinyItems})
		if err != nil {
			t.Fatal(err)
		}
		w := profile.WorkerType{Type: "cpu-2", Price: 0.1, CPUs: 2}
		got := Document{Header: []string{"mdag profile: model m on emulated"}, Plan: &profile.Plan{Quantile: profile.P99}, Worker: w, Entries: []Entry{{
			Profile: profile.Profile{Target: "m", Worker: w.Type, Frame: profile.FrameSize{W: 8, H: 8}, Points: res.ProfilePoints()},
			Header:  []string{"l(b) = 2ms*b + 5ms"},
		}}}.YAML()
		golden := filepath.Join("testdata", "emulated.golden.yaml")
		if *update {
			if err := os.WriteFile(golden, got, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		want, err := os.ReadFile(golden)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(want) {
			t.Errorf("YAML differs from %s (go test -update to rewrite):\n%s", golden, got)
		}
		f, err := profile.Parse(golden, got)
		if err != nil {
			t.Fatal(err)
		}
		if len(f.Profiles) != 1 || len(f.Profiles[0].Points) != 8 || f.Profiles[0].Points[7].Latency != 21*time.Millisecond ||
			f.Profiles[0].Points[7].P99 != 21*time.Millisecond || f.Profiles[0].Frame.String() != "8x8" || f.Plan.Quantile != profile.P99 {
			t.Errorf("parsed %+v %+v", f.Plan, f.Profiles)
		}
	})
}

func TestQuote(t *testing.T) {
	for in, want := range map[string]string{"cpu-2": "cpu-2", "a b": `"a b"`, "yes": `"yes"`, "12": `"12"`, "": `""`, "m:1": `"m:1"`, "-": `"-"`, "1x": `"1x"`, ".inf": `".inf"`, "a.b-1": "a.b-1"} {
		if got := quote(in); got != want {
			t.Errorf("quote(%q) = %s, want %s", in, got, want)
		}
	}
}

// interfering is an executor whose request time at batch 1 depends on the
// intra-op threads t and the requests in service at its start i:
// base/speedup(t) * (1 + slope*(i-1)).
type interfering struct {
	base    time.Duration
	speedup float64
	slope   float64
	busy    atomic.Int32
}

func (x *interfering) Kind() string { return "fake" }

func (x *interfering) Run(ctx context.Context, _ string, items []*media.Item) ([][]*media.Item, error) {
	x.busy.Add(1)
	defer x.busy.Add(-1)
	// the requests started at this instant are all in after 1ns
	time.Sleep(time.Nanosecond)
	i := x.busy.Load()
	d := time.Duration(float64(x.base) / x.speedup * (1 + x.slope*float64(i-1)))
	time.Sleep(d - time.Nanosecond) // the fake's service time, on the bubble's clock
	return make([][]*media.Item, len(items)), nil
}

// TestSerfRates: the measured mu_i are the fake's exactly, and the
// operating points built from them are a profile that parses.
func TestSerfRates(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := func(threads, sessions int) (gpu.Executor, func(), error) {
			return &interfering{base: 20 * time.Millisecond, speedup: []float64{0, 1, 1.6, 0, 2.2}[threads], slope: 0.25}, func() {}, nil
		}
		var calls int
		rates, err := Rates(context.Background(), f, SerfOptions{Model: "m", Cores: 4, Iterations: 4, Items: tinyItems,
			Progress: func(int, int, float64) { calls++ }})
		if err != nil {
			t.Fatal(err)
		}
		if len(rates) != 3 || calls != 4+2+1 {
			t.Fatalf("rates %+v (%d progress calls)", rates, calls)
		}
		for _, r := range rates {
			sp := []float64{0, 1, 1.6, 0, 2.2}[r.Threads]
			if len(r.Mu) != 4/r.Threads {
				t.Errorf("t=%d: %d rates, want %d", r.Threads, len(r.Mu), 4/r.Threads)
			}
			for k, mu := range r.Mu {
				want := sp / (0.020 * (1 + 0.25*float64(k)))
				if math.Abs(mu-want) > 1e-6*want {
					t.Errorf("t=%d mu_%d = %g, want %g", r.Threads, k+1, mu, want)
				}
			}
		}
		cfgs, err := serf.Configs(rates, 4)
		if err != nil {
			t.Fatal(err)
		}
		ops, err := serf.OperatingPoints(cfgs, 100*time.Millisecond, 0.85)
		if err != nil {
			t.Fatal(err)
		}
		w := profile.WorkerType{Type: "cpu-4", Price: 0.2, CPUs: 4}
		e := Entry{Profile: profile.Profile{Target: "m", Worker: w.Type}}
		for _, op := range ops {
			e.Profile.Points = append(e.Profile.Points, op.Point)
			e.Comments = append(e.Comments, "t="+string(rune('0'+op.Config.T)))
		}
		doc := YAML(nil, w, []Entry{e})
		if _, err := profile.Parse("serf.yaml", doc); err != nil {
			t.Fatalf("%v\n%s", err, doc)
		}
		if !strings.Contains(string(doc), "# t=") {
			t.Errorf("thread counts not recorded:\n%s", doc)
		}
	})
}

// TestPoissonMD1: one slot with a deterministic 10 ms service at rho 0.5
// is M/D/1: mean 10 + 0.5*10/(2*0.5) = 15 ms (Pollaczek-Khinchine).
func TestPoissonMD1(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		x := gpu.NewEmulated(clock.Real{}, linear(0, 10*time.Millisecond))
		ob, err := Poisson(context.Background(), x, "m", 1, 50, 20000, 1000, 7, tinyItems)
		if err != nil {
			t.Fatal(err)
		}
		pred, err := serf.Predict([]float64{100}, 50)
		if err != nil {
			t.Fatal(err)
		}
		if e := math.Abs(ob.Mean.Seconds()-pred.Latency) / pred.Latency; e > 0.03 || math.Abs(pred.Latency-0.015) > 1e-12 {
			t.Errorf("measured %v ± %v, predicted %gs: error %.2f%%", ob.Mean, ob.HalfWidth, pred.Latency, 100*e)
		}
		if ob.Service != 10*time.Millisecond {
			t.Errorf("service %v, want 10ms", ob.Service)
		}
		if ob.Requests != 19000 {
			t.Errorf("%d requests measured, want 19000", ob.Requests)
		}
	})
}

func TestErrorSummary(t *testing.T) {
	rows := []CheckRow{{Error: 0.05}, {Error: -0.2}, {Error: 0.01}, {Error: -0.08}}
	med, worst := ErrorSummary(rows)
	if math.Abs(med-0.065) > 1e-12 || worst != 0.2 {
		t.Errorf("median %g worst %g, want 0.065 0.2", med, worst)
	}
}

// FuzzYAML: names and comments come from flags; whatever they are, the
// document parses and keeps the target and worker names (valid UTF-8).
func FuzzYAML(f *testing.F) {
	for _, s := range []string{"m", "cpu-2", "a b", "yes", "12", "x: y", "#c", "\"q\"", "line\nbreak", "cr\rx", "\u2028"} {
		f.Add(s, s)
	}
	f.Fuzz(func(t *testing.T, name, note string) {
		if name == "" || !utf8.ValidString(name) {
			return
		}
		w := profile.WorkerType{Type: profile.WorkerTypeID(name), Price: 1}
		doc := YAML([]string{note}, w, []Entry{{
			Profile:  profile.Profile{Target: name, Worker: w.Type, Points: []profile.Point{{Batch: 1, Concurrency: 1, Latency: time.Millisecond}}},
			Header:   []string{note},
			Comments: []string{note},
		}})
		pf, err := profile.Parse("fuzz.yaml", doc)
		if err != nil {
			t.Fatalf("%v\n%s", err, doc)
		}
		if string(pf.Workers[0].Type) != name || pf.Profiles[0].Target != name {
			t.Fatalf("names %q/%q, want %q\n%s", pf.Workers[0].Type, pf.Profiles[0].Target, name, doc)
		}
	})
}

func TestAtLoad(t *testing.T) {
	cases := []struct {
		name    string
		mu      []float64
		lambda  float64
		service float64
		want    []float64 // the rates whose prediction it must equal
		ok      bool
	}{
		{"c=1 unchanged", []float64{100}, 50, 0.01, []float64{100}, true},
		{"c=1 twice as slow", []float64{100}, 20, 0.02, []float64{50}, true},
		{"c=2 scaled", []float64{100, 80}, 60, 0, nil, false},
		{"unstable at load", []float64{100}, 90, 0.02, nil, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := atLoad(serf.Config{C: len(tc.mu), T: 1, Mu: tc.mu}, tc.lambda, tc.service)
			if ok != tc.ok {
				t.Fatalf("ok %v, want %v", ok, tc.ok)
			}
			if !ok {
				return
			}
			p, err := serf.Predict(tc.want, tc.lambda)
			if err != nil {
				t.Fatal(err)
			}
			if math.Abs(got-p.Latency) > 1e-9*p.Latency {
				t.Errorf("%g, want %g", got, p.Latency)
			}
		})
	}
	// c=2: the scaled rates' predicted service is the one given
	cfg := serf.Config{C: 2, T: 1, Mu: []float64{100, 80}}
	if _, ok := atLoad(cfg, 60, 0.015); !ok {
		t.Fatal("c=2: not ok")
	}
}

// TestSweepGap: the idle pause is not in the latency, only in the
// throughput.
func TestSweepGap(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		x := gpu.NewEmulated(clock.Real{}, linear(0, 10*time.Millisecond))
		res, err := Sweep(context.Background(), x, Options{Model: "m", Batches: []int{1}, Concurrency: []int{1}, Iterations: 4, Gap: 30 * time.Millisecond, Items: tinyItems})
		if err != nil {
			t.Fatal(err)
		}
		p := res.Points[0]
		if p.P50 != 10*time.Millisecond || math.Abs(p.Throughput-25) > 1e-9 {
			t.Errorf("p50 %v throughput %g, want 10ms and 25/s (4 in 160 ms)", p.P50, p.Throughput)
		}
	})
}

// phasedExec is the emulated executor that also times two parts of each
// batch (gpu.Phased): "prep" b ms and "call" the rest of l(b).
type phasedExec struct {
	*gpu.Emulated
	mu    sync.Mutex
	prep  time.Duration
	call  time.Duration
	timed int64
	lat   func(string, int) (time.Duration, bool)
}

func (p *phasedExec) Run(ctx context.Context, model string, items []*media.Item) ([][]*media.Item, error) {
	out, err := p.Emulated.Run(ctx, model, items)
	if err == nil {
		l, _ := p.lat(model, len(items))
		prep := time.Duration(len(items)) * time.Millisecond
		p.mu.Lock()
		p.prep += prep
		p.call += l - prep
		p.timed++
		p.mu.Unlock()
	}
	return out, err
}

func (p *phasedExec) Phases(string) []gpu.Phase {
	p.mu.Lock()
	defer p.mu.Unlock()
	return []gpu.Phase{{Name: "prep", Total: p.prep, Batches: p.timed}, {Name: "call", Total: p.call, Batches: p.timed}}
}

// A gpu.Phased executor's parts are reported per point as the mean over
// that point's measured batches only (warm-up and other points excluded);
// an executor that is not one reports none.
func TestSweepPhases(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lat := linear(2*time.Millisecond, 5*time.Millisecond)
		x := &phasedExec{Emulated: gpu.NewEmulated(clock.Real{}, lat), lat: lat}
		res, err := Sweep(context.Background(), x, Options{Model: "m", Batches: []int{1, 4}, Concurrency: []int{1, 2}, Iterations: 3, Items: tinyItems})
		if err != nil {
			t.Fatal(err)
		}
		for _, pt := range res.Points {
			want := []PhaseMean{{"prep", time.Duration(pt.Batch) * time.Millisecond}, {"call", time.Duration(pt.Batch)*time.Millisecond + 5*time.Millisecond}}
			if !slices.Equal(pt.Phases, want) {
				t.Errorf("b%d c%d: phases %v, want %v", pt.Batch, pt.Concurrency, pt.Phases, want)
			}
		}
		plain, err := Sweep(context.Background(), gpu.NewEmulated(clock.Real{}, lat), Options{Model: "m", Batches: []int{1}, Concurrency: []int{1}, Iterations: 2, Items: tinyItems})
		if err != nil {
			t.Fatal(err)
		}
		if plain.Points[0].Phases != nil {
			t.Errorf("the emulated executor reported phases %v", plain.Points[0].Phases)
		}
	})
}
