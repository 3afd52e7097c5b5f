package profile_test

import (
	"math"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/profile"
)

// Quantiles and frame sizes in profiles: what the planner plans on, the
// profile of a target at a frame size, and the errors with their lines.

func TestParseQuantileFrameErrors(t *testing.T) {
	tests := []struct {
		name string
		doc  string
		want []string
	}{
		{"plan", `plan: {quantile: p90, frame: 640}
workers: [{type: X, price: 1}]
profiles: [{target: A, worker: X, points: [{batch: 1, latency: 1ms}]}]
`, []string{
			`p.yaml:1: plan.quantile: want p50 (each point's latency) or p99 (each point's p99, its latency where it has none), got "p90"`,
			`p.yaml:1: plan.frame: want a frame size WxH such as 640x480 (each side 1..65536), got "640"`,
		}},
		{"plan keys are strict", `plan: {quantiles: p99}
workers: [{type: X, price: 1}]
profiles: [{target: A, worker: X, points: [{batch: 1, latency: 1ms}]}]
`, []string{
			`p.yaml:1: plan.quantiles: unknown field "quantiles" (did you mean "quantile"?)`,
		}},
		{"p99", `workers: [{type: X, price: 1}]
profiles:
  - target: A
    worker: X
    points:
      - {batch: 1, latency: 2ms, p99: 1ms}
      - {batch: 2, latency: 2ms, p99: -1ms}
      - {batch: 4, latency: 2ms, p99: 2ms}
      - {batch: 8, latency: 2ms, p99: 3}
`, []string{
			"p.yaml:6: profiles[0].points[0].p99: 1ms is below latency 2ms: latency is the median (p50) batch time, p99 its 99th percentile",
			"p.yaml:7: profiles[0].points[1].p99: must be > 0 (or omitted), got -1ms",
			"p.yaml:9: profiles[0].points[3].p99: want a duration with a unit such as 3ms, got 3",
		}},
		{"frames", `workers: [{type: X, price: 1}, {type: Y, price: 1}]
profiles:
  - {target: A, worker: X, frame: 640x480, points: [{batch: 1, latency: 2ms}]}
  - {target: A, worker: X, frame: 640x480, points: [{batch: 1, latency: 3ms}]}
  - {target: A, worker: X, frame: 320x240, points: [{batch: 1, latency: 1ms}]}
  - {target: A, worker: X, points: [{batch: 1, latency: 1ms}]}
  - {target: A, worker: Y, points: [{batch: 1, latency: 1ms}]}
  - {target: B, worker: X, frame: 0x10, points: [{batch: 1, latency: 1ms}]}
`, []string{
			`p.yaml:4: profiles[1].frame: second profile for target "A" on worker "X" at frame 640x480 (first at profiles[0]); merge their points`,
			`p.yaml:6: profiles[3]: target "A" on worker "X" is profiled at several frame sizes (profiles[0] at 640x480): this profile needs frame: WxH too`,
			`p.yaml:8: profiles[5].frame: want a frame size WxH such as 640x480 (each side 1..65536), got "0x10"`,
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := profile.Parse("p.yaml", []byte(tt.doc))
			checkLines(t, err, tt.want)
		})
	}
}

const twoModules = `app: a
slo: 1s
modules:
  - {name: detect, kind: gpu, model: m, inputs: [source]}
  - {name: count, kind: cpu, op: count, inputs: [detect]}
`

func bind(t *testing.T, doc string) *profile.Catalog {
	t.Helper()
	app, err := dag.Parse("a.yaml", []byte(twoModules))
	if err != nil {
		t.Fatal(err)
	}
	pf, err := profile.Parse("p.yaml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	cat, err := profile.Bind(app, pf)
	if err != nil {
		t.Fatal(err)
	}
	return cat
}

// TestBindQuantile: the configurations' latency is the plan's quantile of
// each point (p99 by default, the latency where a point has no p99); a
// derived capacity stays b*e over the latency.
func TestBindQuantile(t *testing.T) {
	const points = `workers: [{type: X, price: 1}]
profiles:
  - target: m
    worker: X
    points:
      - {batch: 1, latency: 2ms, p99: 5ms}
      - {batch: 2, latency: 3ms}
      - {batch: 4, latency: 4ms, p99: 9ms, throughput: 500}
  - {target: count, worker: X, points: [{batch: 1, latency: 100us, p99: 300us}]}
`
	type cfg struct {
		Batch   int
		Latency time.Duration
		Cap     float64
	}
	tests := []struct {
		name   string
		plan   string
		detect []cfg
		count  time.Duration
	}{
		{"default p99", "", []cfg{{1, 5 * time.Millisecond, 500}, {2, 3 * time.Millisecond, 2 / 0.003}, {4, 9 * time.Millisecond, 500}}, 300 * time.Microsecond},
		{"p99 stated", "plan: {quantile: p99}\n", []cfg{{1, 5 * time.Millisecond, 500}, {2, 3 * time.Millisecond, 2 / 0.003}, {4, 9 * time.Millisecond, 500}}, 300 * time.Microsecond},
		{"p50", "plan: {quantile: p50}\n", []cfg{{1, 2 * time.Millisecond, 500}, {2, 3 * time.Millisecond, 2 / 0.003}, {4, 4 * time.Millisecond, 500}}, 100 * time.Microsecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cat := bind(t, tt.plan+points)
			var got []cfg
			for _, c := range cat.Configs("detect") {
				got = append(got, cfg{c.Batch, c.Latency, c.Cap})
			}
			if d := cmp.Diff(tt.detect, got, cmp.Comparer(func(a, b float64) bool { return math.Abs(a-b) < 1e-9 })); d != "" {
				t.Errorf("detect configs (-want +got):\n%s", d)
			}
			if c := cat.Configs("count"); len(c) != 1 || c[0].Latency != tt.count {
				t.Errorf("count configs %+v, want latency %v", c, tt.count)
			}
		})
	}
}

const sized = `workers: [{type: X, price: 1}]
profiles:
  - target: m
    worker: X
    frame: 640x480
    points:
      - {batch: 1, latency: 4ms, p99: 8ms, throughput: 200}
      - {batch: 2, latency: 6ms, p99: 10ms}
  - target: m
    worker: X
    frame: 320x240
    points:
      - {batch: 1, latency: 1ms, p99: 2ms, throughput: 800}
      - {batch: 2, latency: 2ms}
      - {batch: 4, latency: 3ms}
  - {target: count, worker: X, points: [{batch: 1, latency: 100us}]}
`

// TestProfileAt: the profile at a frame size is the measured one, the
// interpolation (linear in pixels) between the two around it, or the
// nearest measured beyond them; the zero size is the planning size.
func TestProfileAt(t *testing.T) {
	mid := profile.FrameSize{W: 480, H: 400} // 192000 px: 1/2 of the way from 76800 to 307200
	tests := []struct {
		name string
		plan string
		size profile.FrameSize
		want profile.Profile
	}{
		{"largest by default", "", profile.FrameSize{}, profile.Profile{Target: "m", Worker: "X", Frame: profile.FrameSize{W: 640, H: 480},
			Points: []profile.Point{{Batch: 1, Concurrency: 1, Latency: 4 * time.Millisecond, P99: 8 * time.Millisecond, Throughput: 200}, {Batch: 2, Concurrency: 1, Latency: 6 * time.Millisecond, P99: 10 * time.Millisecond}}}},
		{"measured", "", profile.FrameSize{W: 320, H: 240}, profile.Profile{Target: "m", Worker: "X", Frame: profile.FrameSize{W: 320, H: 240},
			Points: []profile.Point{{Batch: 1, Concurrency: 1, Latency: time.Millisecond, P99: 2 * time.Millisecond, Throughput: 800}, {Batch: 2, Concurrency: 1, Latency: 2 * time.Millisecond}, {Batch: 4, Concurrency: 1, Latency: 3 * time.Millisecond}}}},
		{"same pixels, other shape", "", profile.FrameSize{W: 240, H: 320}, profile.Profile{Target: "m", Worker: "X", Frame: profile.FrameSize{W: 240, H: 320},
			Points: []profile.Point{{Batch: 1, Concurrency: 1, Latency: time.Millisecond, P99: 2 * time.Millisecond, Throughput: 800}, {Batch: 2, Concurrency: 1, Latency: 2 * time.Millisecond}, {Batch: 4, Concurrency: 1, Latency: 3 * time.Millisecond}}}},
		{"between: the points both have", "", mid, profile.Profile{Target: "m", Worker: "X", Frame: mid,
			// throughput: 1/(1/800 + 0.5*(1/200-1/800)) items/s
			Points: []profile.Point{{Batch: 1, Concurrency: 1, Latency: 2500 * time.Microsecond, P99: 5 * time.Millisecond, Throughput: 320}, {Batch: 2, Concurrency: 1, Latency: 4 * time.Millisecond}}}},
		{"below the smallest", "", profile.FrameSize{W: 160, H: 120}, profile.Profile{Target: "m", Worker: "X", Frame: profile.FrameSize{W: 320, H: 240},
			Points: []profile.Point{{Batch: 1, Concurrency: 1, Latency: time.Millisecond, P99: 2 * time.Millisecond, Throughput: 800}, {Batch: 2, Concurrency: 1, Latency: 2 * time.Millisecond}, {Batch: 4, Concurrency: 1, Latency: 3 * time.Millisecond}}}},
		{"above the largest", "", profile.FrameSize{W: 1920, H: 1080}, profile.Profile{Target: "m", Worker: "X", Frame: profile.FrameSize{W: 640, H: 480},
			Points: []profile.Point{{Batch: 1, Concurrency: 1, Latency: 4 * time.Millisecond, P99: 8 * time.Millisecond, Throughput: 200}, {Batch: 2, Concurrency: 1, Latency: 6 * time.Millisecond, P99: 10 * time.Millisecond}}}},
		{"plan frame", "plan: {frame: 480x400}\n", profile.FrameSize{}, profile.Profile{Target: "m", Worker: "X", Frame: mid,
			Points: []profile.Point{{Batch: 1, Concurrency: 1, Latency: 2500 * time.Microsecond, P99: 5 * time.Millisecond, Throughput: 320}, {Batch: 2, Concurrency: 1, Latency: 4 * time.Millisecond}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pf, err := profile.Parse("p.yaml", []byte(tt.plan+sized))
			if err != nil {
				t.Fatal(err)
			}
			got, ok := pf.ProfileAt("m", "X", tt.size)
			if !ok {
				t.Fatal("no profile")
			}
			if d := cmp.Diff(tt.want, got, cmp.Comparer(func(a, b float64) bool { return math.Abs(a-b) < 1e-9 })); d != "" {
				t.Errorf("ProfileAt(%v) (-want +got):\n%s", tt.size, d)
			}
		})
	}
	pf, err := profile.Parse("p.yaml", []byte(sized))
	if err != nil {
		t.Fatal(err)
	}
	if got, ok := pf.ProfileAt("count", "X", profile.FrameSize{W: 1, H: 1}); !ok || !got.Frame.IsZero() || len(got.Points) != 1 {
		t.Errorf("an unsized profile is itself at any size: %+v %v", got, ok)
	}
	if _, ok := pf.ProfileAt("m", "Y", profile.FrameSize{}); ok {
		t.Error("a profile on a worker type without one")
	}
}

// TestCatalogFrames: an app whose profiles carry several frame sizes plans
// at the largest (or plan.frame); AtFrame re-plans at another size and
// ConfigAt scales one configuration (keeping a balloon factor).
func TestCatalogFrames(t *testing.T) {
	cat := bind(t, sized)
	big, small := profile.FrameSize{W: 640, H: 480}, profile.FrameSize{W: 320, H: 240}
	det := cat.Configs("detect")
	if len(det) != 2 || det[0].Frame != big || det[0].Latency != 8*time.Millisecond || det[1].Latency != 10*time.Millisecond {
		t.Fatalf("detect planned at %+v, want the 640x480 points at p99", det)
	}
	if c := cat.Configs("count"); len(c) != 1 || !c[0].Frame.IsZero() {
		t.Errorf("count %+v: one size, no frame", c)
	}
	at := cat.Dispatching().AtFrame(small)
	sd := at.Configs("detect")
	if len(sd) != 3 || sd[0].Frame != small || sd[0].Latency != 2*time.Millisecond || sd[2].Latency != 3*time.Millisecond || !sd[0].Dispatch {
		t.Errorf("detect at 320x240 %+v, want its 3 points, dispatching", sd)
	}
	if at.AtFrame(profile.FrameSize{}) != at {
		t.Error("AtFrame(zero) is not the catalog itself")
	}
	tests := []struct {
		name   string
		cfg    profile.Config
		size   profile.FrameSize
		factor float64
	}{
		{"same size", det[0], big, 1},
		{"smaller", det[0], small, 0.25},                                // p99 2ms / 8ms
		{"between", det[0], profile.FrameSize{W: 480, H: 400}, 5.0 / 8}, // p99 5ms / 8ms
		{"larger than measured", det[0], profile.FrameSize{W: 1920, H: 1080}, 1},
		{"unknown size", det[0], profile.FrameSize{}, 1},
		{"point missing at the size", sd[2], big, 1},
		{"from the small plan up", sd[0], big, 4},
		{"an unsized target", cat.Configs("count")[0], small, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if f := cat.FrameFactor(tt.cfg, tt.size); math.Abs(f-tt.factor) > 1e-9 {
				t.Errorf("FrameFactor = %g, want %g", f, tt.factor)
			}
		})
	}
	// ConfigAt keeps a balloon factor and scales the capacity inversely
	b := det[0].Balloon(2)
	got := cat.ConfigAt(b, small)
	if got.Latency != 4*time.Millisecond || math.Abs(got.Cap-b.Cap*4) > 1e-9 || got.Frame != small {
		t.Errorf("ConfigAt(ballooned x2, 320x240) = %+v, want latency 4ms (16ms x 0.25), cap x4", got)
	}
	// plan.frame between the sizes: interpolated points
	cat = bind(t, "plan: {frame: 480x400}\n"+sized)
	if d := cat.Configs("detect"); len(d) != 2 || d[0].Latency != 5*time.Millisecond || math.Abs(d[0].Cap-320) > 1e-9 {
		t.Errorf("planned at 480x400: %+v, want b1 p99 5ms at 320 items/s", d)
	}
}

// TestWidenKeepsQuantileFrames: widened catalogs carry the plan, the frame
// sizes and the p99s (scaled with the latency).
func TestWidenKeepsQuantileFrames(t *testing.T) {
	app, err := dag.Parse("a.yaml", []byte(twoModules))
	if err != nil {
		t.Fatal(err)
	}
	cat := bind(t, "plan: {quantile: p50}\n"+sized)
	w, err := profile.Widen(app, cat, 3)
	if err != nil {
		t.Fatal(err)
	}
	if w.File.Plan.Quantile != profile.P50 {
		t.Errorf("plan %+v", w.File.Plan)
	}
	for _, c := range w.Configs("detect") {
		if c.Frame != (profile.FrameSize{W: 640, H: 480}) || c.Batch == 4 {
			t.Errorf("widened config %+v: want the 640x480 points", c)
		}
	}
	for _, pr := range w.File.Profiles {
		for _, p := range pr.Points {
			if p.P99 != 0 && p.P99 < p.Latency {
				t.Errorf("%s on %s: p99 %v below latency %v", pr.Target, pr.Worker, p.P99, p.Latency)
			}
		}
	}
}

func TestParseFrameSize(t *testing.T) {
	tests := []struct {
		in   string
		want profile.FrameSize
		ok   bool
	}{
		{"640x480", profile.FrameSize{W: 640, H: 480}, true},
		{" 1x1 ", profile.FrameSize{W: 1, H: 1}, true},
		{"65536x2", profile.FrameSize{W: 65536, H: 2}, true},
		{"65537x2", profile.FrameSize{}, false},
		{"640", profile.FrameSize{}, false},
		{"0x480", profile.FrameSize{}, false},
		{"640X480", profile.FrameSize{}, false},
		{"-1x2", profile.FrameSize{}, false},
		{"", profile.FrameSize{}, false},
	}
	for _, tt := range tests {
		got, err := profile.ParseFrameSize(tt.in)
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("ParseFrameSize(%q) = %v, %v; want %v ok=%v", tt.in, got, err, tt.want, tt.ok)
		}
		if tt.ok && got.String() != fmtSize(tt.want) {
			t.Errorf("%v.String() = %q", got, got.String())
		}
	}
}

func fmtSize(f profile.FrameSize) string {
	b, _ := f.MarshalText()
	return string(b)
}
