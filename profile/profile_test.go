package profile_test

import (
	"errors"
	"io/fs"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/examples"
	"github.com/mdag/mdag/internal/yamlx"
	"github.com/mdag/mdag/profile"
)

func loadScrooge(t *testing.T) (*dag.App, *profile.Catalog) {
	t.Helper()
	g, cat, err := examples.Load("scrooge-example")
	if err != nil {
		t.Fatal(err)
	}
	return g.App(), cat
}

func ms(f float64) time.Duration { return time.Duration(f * float64(time.Millisecond)) }

func near(a, b time.Duration) bool { return (a - b).Abs() <= 10*time.Microsecond }

func TestScroogeConfigs(t *testing.T) {
	_, cat := loadScrooge(t)
	a := cat.Configs("A")
	if len(a) != 4 || a[1].String() != "X<4,2>" || a[2].String() != "Y<2,1>" {
		t.Fatalf("A configs = %v", a)
	}
	// Scrooge Eq. 3 and its worked example: X<4,2> full is 133 + 4/60 s.
	if got := a[1].Worst(); !near(got, ms(199.667)) {
		t.Errorf("X<4,2> worst = %v, want 199.667ms", got)
	}
	// Y<2,1> partial at 20/s: 25 + 2/20 s = 125 ms.
	if got := a[2].WorstAt(20); !near(got, ms(125)) {
		t.Errorf("Y<2,1> at 20/s = %v, want 125ms", got)
	}
	// B's partial Y<4,2> at 120/s: 40 + 4/120 s.
	if got := cat.ConfigsOn("B", "Y")[1].WorstAt(120); !near(got, ms(73.333)) {
		t.Errorf("Y<4,2> at 120/s = %v, want 73.333ms", got)
	}
	// A derived capacity: b*e/d when throughput is omitted.
	pf, err := profile.Parse("p.yaml", []byte("workers: [{type: W, price: 1}]\nprofiles:\n  - {target: A, worker: W, points: [{batch: 4, concurrency: 2, latency: 200ms}]}\n"))
	if err != nil {
		t.Fatal(err)
	}
	app, _ := dag.Parse("a.yaml", []byte("app: a\nslo: 1s\nmodules: [{name: A, kind: gpu, model: m, inputs: [source]}]\n"))
	cat2, err := profile.Bind(app, pf)
	if err != nil {
		t.Fatal(err)
	}
	if got := cat2.Configs("A")[0]; got.Cap != 40 || !near(got.Worst(), ms(300)) {
		t.Errorf("derived config %+v: want cap 40 (Scrooge: 4x2/0.2) and worst 300ms", got)
	}
	// Ballooning by 1.5 inflates d and shrinks capacity.
	b := a[0].Balloon(1.5)
	if b.Latency != 60*time.Millisecond || math.Abs(b.Cap-50/1.5) > 1e-9 {
		t.Errorf("balloon = %+v", b)
	}
}

func TestFastestScrooge(t *testing.T) {
	_, cat := loadScrooge(t)
	tests := []struct {
		module dag.ModuleID
		rate   float64
		want   string
		lat    time.Duration
	}{
		{"A", 80, "Y<2,1> at 80/s", ms(50)},
		{"B", 320, "2 x Y<2,1>", ms(25.5)},
		{"A", 0, "idle (no input)", 0},
	}
	for _, tt := range tests {
		ch, ok := profile.Fastest(cat.Configs(tt.module), tt.rate)
		if !ok || ch.String() != tt.want || !near(ch.Latency, tt.lat) {
			t.Errorf("Fastest(%s, %g) = %v %v %v, want %s %v", tt.module, tt.rate, ch, ch.Latency, ok, tt.want, tt.lat)
		}
	}
}

// TestFastestIsOptimal compares Fastest with an enumeration of every
// (full config, n, partial config) on random profiles.
func TestFastestIsOptimal(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for iter := 0; iter < 500; iter++ {
		var cfgs []profile.Config
		for k := 0; k < 1+r.IntN(5); k++ {
			b := 1 << r.IntN(4)
			d := ms(1 + r.Float64()*100)
			cfgs = append(cfgs, profile.Config{Worker: "W", Price: 1 + float64(r.IntN(3)), Batch: b, Concurrency: 1,
				Latency: d, Cap: float64(b) / d.Seconds()})
		}
		rate := 1 + r.Float64()*400
		got, ok := profile.Fastest(cfgs, rate)
		best := time.Duration(math.MaxInt64)
		for _, m := range cfgs {
			for n := 0; float64(n)*m.Cap <= rate+1e-9; n++ {
				t := rate - float64(n)*m.Cap
				lat := time.Duration(0)
				if n > 0 {
					lat = m.Worst()
				}
				if t <= 1e-9 {
					if n > 0 {
						best = min(best, lat)
					}
					continue
				}
				for _, p := range cfgs {
					if t <= p.Cap {
						best = min(best, max(lat, p.WorstAt(t)))
					}
				}
			}
		}
		if !ok {
			if best != time.Duration(math.MaxInt64) {
				t.Fatalf("iter %d: Fastest found nothing, enumeration found %v", iter, best)
			}
			continue
		}
		if got.Latency > best+time.Microsecond {
			t.Fatalf("iter %d: Fastest = %v (%v), enumeration found %v; cfgs %+v rate %g", iter, got.Latency, got, best, cfgs, rate)
		}
		if math.Abs(float64(got.N)*got.Full.Cap+got.T-rate) > 1e-6*rate {
			t.Fatalf("iter %d: choice %v does not carry rate %g", iter, got, rate)
		}
	}
}

func TestBest(t *testing.T) {
	_, cat := loadScrooge(t)
	tests := []struct {
		budget time.Duration
		want   string
		ok     bool
	}{
		{ms(300), "Y<4,2>", true},   // highest cap (84) within budget
		{ms(100), "Y<2,1>", true},   // X<4,2> (199.67) and Y<4,2> (142.6) are too slow
		{ms(60), "Y<2,1>", true},    // 25 + 2/81 s = 49.7 ms
		{ms(40), "", false},         // nothing fits
		{ms(199.7), "Y<4,2>", true}, // ties impossible here; the highest cap wins
	}
	for _, tt := range tests {
		got, ok := profile.Best(cat.Configs("A"), tt.budget)
		if ok != tt.ok || ok && got.String() != tt.want {
			t.Errorf("Best(%v) = %v %v, want %s %v", tt.budget, got, ok, tt.want, tt.ok)
		}
	}
}

func TestFitLinear(t *testing.T) {
	line := func(alpha, beta float64, batches ...int) []profile.Config {
		var out []profile.Config
		for _, b := range batches {
			out = append(out, profile.Config{Target: "m", Worker: "W", Batch: b, Concurrency: 1, Latency: ms(alpha*float64(b) + beta)})
		}
		return out
	}
	// Symphony Table 4's ResNet50: alpha 1.053 ms, beta 5.072 ms.
	f, ok := profile.FitLinear(line(1.053, 5.072, 1, 2, 4, 8, 16))
	if !ok || !near(f.Alpha, ms(1.053)) || !near(f.Beta, ms(5.072)) || f.R2 < 0.999999 {
		t.Errorf("fit = %v", f)
	}
	noisy := line(2, 10, 1, 2, 4, 8)
	noisy[2].Latency += ms(5)
	if f, _ := profile.FitLinear(noisy); f.R2 >= 0.999 || f.R2 <= 0.5 {
		t.Errorf("noisy fit R^2 = %g, want a visibly imperfect fit", f.R2)
	}
	if _, ok := profile.FitLinear(line(1, 1, 4, 4)); ok {
		t.Error("fit with one distinct batch size succeeded")
	}
	_, cat := loadScrooge(t)
	if fits := cat.Fits("A"); len(fits) != 0 {
		t.Errorf("Scrooge's A has one batch per (worker, concurrency), got fits %v", fits)
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name string
		doc  string
		want []string
	}{
		{"worker problems", `workers:
  - {type: X, price: 0}
  - {type: X, price: 1, gpus: 2}
  - {type: Z, price: 1, gpu: T4, gpus: -1, cpus: -2, gpuMemory: lots}
profiles: []
`, []string{
			"p.yaml:4: workers[2].gpuMemory: want a size such as 16GiB or 512MiB, got \"lots\"",
			"p.yaml:2: workers[0].price: must be > 0 dollars per hour, got 0",
			`p.yaml:3: workers[1].type: duplicate worker type "X" (first defined at workers[0])`,
			"p.yaml:3: workers[1].gpus: 2 gpus but no gpu model named in gpu:",
			"p.yaml:4: workers[2].gpus: must be >= 0, got -1",
			"p.yaml:4: workers[2].cpus: must be >= 0, got -2",
		}},
		{"profile problems", `workers: [{type: X, price: 2}]
profiles:
  - target: A
    worker: Y
    points: [{batch: 0, concurrency: 0, latency: 0s, throughput: -1}]
  - target: A
    worker: X
    points:
      - {batch: 2, latency: 40ms}
      - {batch: 2, concurrency: 1, latency: 41ms}
  - {target: A, worker: X, points: [{batch: 1, latency: 1ms}]}
  - {target: "", worker: X, points: []}
`, []string{
			`p.yaml:4: profiles[0].worker: unknown worker type "Y"`,
			"p.yaml:5: profiles[0].points[0].batch: must be >= 1, got 0",
			"p.yaml:5: profiles[0].points[0].concurrency: must be >= 1, got 0",
			"p.yaml:5: profiles[0].points[0].latency: must be > 0, got 0s",
			"p.yaml:5: profiles[0].points[0].throughput: must be > 0 (or omitted to derive batch*concurrency/latency), got -1",
			"p.yaml:10: profiles[1].points[1]: duplicate point batch 2 concurrency 1 (first at points[0])",
			`p.yaml:11: profiles[2]: second profile for target "A" on worker "X" (first at profiles[1]); merge their points`,
			"p.yaml:12: profiles[3].target: required: a module or model name",
			"p.yaml:12: profiles[3].points: required: at least one {batch, concurrency, latency} point",
		}},
		{"strict decoding", `workers: [{type: X, price: 2, colour: red}]
profiles:
  - {target: A, worker: X, points: [{batch: 2.5, latency: 40}]}
`, []string{
			`p.yaml:1: workers[0].colour: unknown field "colour" (known fields: type, price, gpu, gpus, cpus, gpuMemory)`,
			"p.yaml:3: profiles[0].points[0].batch: want an integer, got 2.5",
			"p.yaml:3: profiles[0].points[0].latency: want a duration with a unit such as 40ms, got 40",
		}},
		{"no workers", "profiles: []\n", []string{"p.yaml:1: workers: required: at least one worker type"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := profile.Parse("p.yaml", []byte(tt.doc))
			checkLines(t, err, tt.want)
		})
	}
}

func TestBindErrors(t *testing.T) {
	app, err := dag.Parse("app.yaml", []byte(`app: a
slo: 1s
modules:
  - {name: detect, kind: gpu, model: ssd, inputs: [source]}
  - {name: crop, kind: cpu, op: crop, inputs: [detect]}
  - {name: face, kind: gpu, model: vgg-face, inputs: [crop]}
`))
	if err != nil {
		t.Fatal(err)
	}
	pf, err := profile.Parse("p.yaml", []byte(`workers: [{type: X, price: 2}, {type: Y, price: 3}]
profiles:
  - {target: ssd, worker: X, points: [{batch: 1, latency: 10ms}]}
  - {target: detect, worker: Y, points: [{batch: 1, latency: 5ms}]}
  - {target: crops, worker: X, points: [{batch: 1, latency: 1ms}]}
`))
	if err != nil {
		t.Fatal(err)
	}
	_, err = profile.Bind(app, pf)
	checkLines(t, err, []string{
		`p.yaml:5: profiles[2].target: unknown target "crops": not a module or model of app a (did you mean "crop"?)`,
		`app.yaml:5: modules[1]: no profile for module "crop" on any worker type in p.yaml`,
		`app.yaml:6: modules[2]: no profile for module "face" (model vgg-face) on any worker type in p.yaml`,
	})
	// A module-named profile takes precedence over the model's on its worker.
	pf.Profiles = pf.Profiles[:2]
	app.Modules = app.Modules[:1]
	cat, err := profile.Bind(app, pf)
	if err != nil {
		t.Fatal(err)
	}
	got := cat.Configs("detect")
	if len(got) != 2 || got[0].Target != "ssd" || got[1].Target != "detect" || got[1].Latency != 5*time.Millisecond {
		t.Errorf("detect configs = %+v", got)
	}
}

func checkLines(t *testing.T, err error, want []string) {
	t.Helper()
	var list yamlx.ErrorList
	if !errors.As(err, &list) {
		t.Fatalf("error %v (%T) is not a yamlx.ErrorList", err, err)
	}
	got := strings.Split(err.Error(), "\n")
	for _, w := range want {
		found := false
		for _, g := range got {
			found = found || g == w
		}
		if !found {
			t.Errorf("missing error line\n  %s\ngot:\n  %s", w, strings.Join(got, "\n  "))
		}
	}
	if len(got) != len(want) {
		t.Errorf("got %d problems, want %d", len(got), len(want))
	}
}

func TestBytes(t *testing.T) {
	tests := []struct {
		in   string
		want profile.Bytes
		str  string
	}{
		{"16GiB", 16 << 30, "16GiB"}, {"512MiB", 512 << 20, "512MiB"}, {"2GB", 2e9, "1953125KiB"},
		{"1024", 1024, "1KiB"}, {"1.5KiB", 1536, "1536B"},
	}
	for _, tt := range tests {
		var b profile.Bytes
		if err := b.UnmarshalScalar(tt.in); err != nil || b != tt.want || b.String() != tt.str {
			t.Errorf("%q -> %d %q %v, want %d %q", tt.in, b, b.String(), err, tt.want, tt.str)
		}
	}
	for _, bad := range []string{"", "GiB", "-1GiB", "1PB", "1e30GiB"} {
		var b profile.Bytes
		if err := b.UnmarshalScalar(bad); err == nil {
			t.Errorf("%q accepted as %d", bad, b)
		}
	}
}

// FuzzParseProfiles feeds arbitrary documents to the profiles loader: it must
// never panic, and every accepted file yields finite capacities.
func FuzzParseProfiles(f *testing.F) {
	_ = fs.WalkDir(examples.FS(), ".", func(path string, d fs.DirEntry, err error) error {
		if err == nil && strings.HasSuffix(path, "profiles.yaml") {
			data, _ := fs.ReadFile(examples.FS(), path)
			f.Add(data)
		}
		return err
	})
	f.Add([]byte("plan: {quantile: p50, frame: 480x400}\n" + sized))
	f.Fuzz(func(t *testing.T, data []byte) {
		pf, err := profile.Parse("fuzz.yaml", data)
		if err != nil {
			return
		}
		for _, p := range pf.Profiles {
			for _, pt := range p.Points {
				if pt.Batch <= 0 || pt.Concurrency <= 0 || pt.Latency <= 0 || pt.P99 < 0 || pt.P99 > 0 && pt.P99 < pt.Latency {
					t.Fatalf("accepted point %+v", pt)
				}
			}
			// every size resolves to points with positive times
			for _, s := range []profile.FrameSize{{}, {W: 1, H: 1}, {W: 640, H: 480}, {W: 1 << 16, H: 1 << 16}} {
				at, ok := pf.ProfileAt(p.Target, p.Worker, s)
				if !ok || len(at.Points) == 0 {
					t.Fatalf("ProfileAt(%s, %s, %v) = %+v, %v", p.Target, p.Worker, s, at, ok)
				}
				for _, pt := range at.Points {
					if pt.Latency <= 0 || pt.At(pf.Plan.Quantile) < pt.Latency || math.IsNaN(pt.Throughput) || pt.Throughput < 0 {
						t.Fatalf("ProfileAt(%s, %s, %v): point %+v", p.Target, p.Worker, s, pt)
					}
				}
			}
		}
	})
}

// TestOptionsFront checks the front against a naive enumeration of every
// (full config, n, partial config) on random profiles: the fastest choice
// matches Fastest, and for every naive choice some front choice is at least
// as fast and as cheap.
func TestOptionsFront(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for iter := 0; iter < 300; iter++ {
		var cfgs []profile.Config
		for k := 0; k < 1+r.IntN(6); k++ {
			b := 1 << r.IntN(4)
			d := ms(1 + r.Float64()*100)
			cfgs = append(cfgs, profile.Config{Worker: profile.WorkerTypeID([]string{"X", "Y"}[r.IntN(2)]),
				Price: 1 + float64(r.IntN(3)), Batch: b, Concurrency: 1, Latency: d, Cap: float64(b) / d.Seconds()})
		}
		rate := 1 + r.Float64()*300
		front := profile.Options(cfgs, rate, 0)
		fast, ok := profile.Fastest(cfgs, rate)
		if len(front) == 0 != !ok {
			t.Fatalf("iter %d: front %v, fastest ok %v", iter, front, ok)
		}
		if !ok {
			continue
		}
		if front[0].Latency != fast.Latency {
			t.Fatalf("iter %d: front starts at %v, Fastest gives %v", iter, front[0].Latency, fast.Latency)
		}
		for i := 1; i < len(front); i++ {
			if front[i].Latency < front[i-1].Latency || front[i].Cost >= front[i-1].Cost {
				t.Fatalf("iter %d: front not sorted by latency with falling cost: %v", iter, front)
			}
		}
		for _, m := range cfgs {
			for n := 0; float64(n)*m.Cap <= rate+1e-9; n++ {
				rest := rate - float64(n)*m.Cap
				for _, p := range cfgs {
					var lat time.Duration
					cost := float64(n) * m.Price
					if n > 0 {
						lat = m.Worst()
					}
					if rest > 1e-9 {
						if rest > p.Cap {
							continue
						}
						lat = max(lat, p.WorstAt(rest))
						cost += p.Price * rest / p.Cap
					} else if n == 0 {
						continue
					}
					covered := false
					for _, f := range front {
						if f.Latency <= lat+time.Nanosecond && f.Cost <= cost*(1+1e-9) {
							covered = true
							break
						}
					}
					if !covered {
						t.Fatalf("iter %d: choice n=%d %v + %v at %g (lat %v cost %g) not covered by front %v", iter, n, m, p, rest, lat, cost, front)
					}
				}
			}
		}
	}
}
