package eval

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/examples"
	"github.com/mdag/mdag/profile"
)

// shortRun runs app for d with clients clients under sys.
func shortRun(t *testing.T, app string, d time.Duration, clients int, seed uint64, sys System) *Result {
	t.Helper()
	setup, err := Setup(app)
	if err != nil {
		t.Fatal(err)
	}
	a, pf, w, err := setup.Load(d, clients, seed)
	if err != nil {
		t.Fatal(err)
	}
	r, err := Run(Experiment{App: a, Profiles: pf, System: sys, Workload: w, Cluster: Cluster(), Seed: seed})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// Every frame sent ends exactly once, per second and in total, and a run
// of a seed is the same every time (but another seed's is not).
func TestRunAccountsEveryFrameAndRepeats(t *testing.T) {
	for _, tc := range []struct {
		app string
		sys System
	}{
		{"traffic", System{Name: "mdag"}},
		{"tracker", System{Name: "mdag"}}, // a stateful module (track)
		{"face", System{Name: "nexus", Nexus: true, FrontEnds: 1, NexusGPU: "P100"}},
	} {
		t.Run(tc.app+"/"+tc.sys.Name, func(t *testing.T) {
			r := shortRun(t, tc.app, 40*time.Second, 6, 7, tc.sys)
			if r.Sent == 0 || r.Finished == 0 {
				t.Fatalf("sent %d, finished %d: the run did nothing", r.Sent, r.Finished)
			}
			if r.Open != 0 || r.Finished+r.Late+r.Dropped != r.Sent {
				t.Fatalf("sent %d != finished %d + late %d + dropped %d (open %d)", r.Sent, r.Finished, r.Late, r.Dropped, r.Open)
			}
			var dropped uint64
			for _, n := range r.Drops {
				dropped += n
			}
			if dropped != r.Dropped {
				t.Fatalf("drops by reason %v sum to %d, dropped %d", r.Drops, dropped, r.Dropped)
			}
			sent, fin := 0, 0
			for _, s := range r.Seconds {
				sent += s.Sent
				fin += s.Finished
				if s.Streams > 0 && (s.Sent == 0 || s.CostRate <= 0) {
					t.Fatalf("second %d: %d streams sent %d frames at $%v/h", s.T, s.Streams, s.Sent, s.CostRate)
				}
			}
			if uint64(sent) != r.Sent || uint64(fin) != r.Finished {
				t.Fatalf("seconds sum to %d sent, %d finished; totals %d, %d", sent, fin, r.Sent, r.Finished)
			}
			if r.Cost <= 0 || r.Starts == 0 || r.Replans == 0 {
				t.Fatalf("cost $%v, %d starts, %d re-plans", r.Cost, r.Starts, r.Replans)
			}
			again := shortRun(t, tc.app, 40*time.Second, 6, 7, tc.sys)
			if again.Digest != r.Digest {
				t.Fatalf("the same seed gave digests %s and %s (sent %d/%d, finished %d/%d, cost %v/%v)",
					r.Digest, again.Digest, r.Sent, again.Sent, r.Finished, again.Finished, r.Cost, again.Cost)
			}
			if other := shortRun(t, tc.app, 40*time.Second, 6, 8, tc.sys); other.Digest == r.Digest {
				t.Fatalf("seeds 7 and 8 gave the same digest %s", r.Digest)
			}
		})
	}
}

// A turn-off delay of (almost) nothing releases idle instances as soon as
// their last work is done, without re-planning in a loop meanwhile (the
// engine used to re-arm its turn-off timer at "now" while a released
// instance still had tasks running: a busy loop in real time, an endless
// one in virtual time).
func TestNoTurnOffDelayDoesNotSpin(t *testing.T) {
	r := shortRun(t, "face", 60*time.Second, 12, 1, System{Name: "mdag-turnoff-0s", TurnOff: -1})
	if r.Replans > 400 {
		t.Fatalf("%d re-plans in 60 s", r.Replans)
	}
	if r.FinishRate < 0.9 {
		t.Fatalf("finish rate %.3f", r.FinishRate)
	}
}

// The Nexus-style system re-plans no sooner than 10 s after its last plan
// began, but for a session that has no plan yet.
func TestNexusReplansAtMostEvery10s(t *testing.T) {
	r := shortRun(t, "traffic", 120*time.Second, 12, 3, System{Name: "nexus", Nexus: true, FrontEnds: 1, NexusGPU: "P100"})
	if len(r.Plans) < 3 {
		t.Fatalf("%d plans", len(r.Plans))
	}
	for i := 1; i < len(r.Plans); i++ {
		// A session's first stream is planned at once (its frames would
		// have nowhere to go): "(1 streams)" in its join.
		first := strings.Contains(r.Plans[i].Trigger, "(1 streams)")
		if gap := r.Plans[i].T - r.Plans[i-1].T; gap < 10-1e-9 && !first {
			t.Fatalf("plans %d and %d are %.3f s apart: %q then %q", i-1, i, gap, r.Plans[i-1].Trigger, r.Plans[i].Trigger)
		}
	}
	m := shortRun(t, "traffic", 120*time.Second, 12, 3, System{Name: "mdag"})
	if len(m.Plans) <= len(r.Plans) {
		t.Fatalf("mdag re-planned %d times, the Nexus-style system %d: mdag reacts to every event", len(m.Plans), len(r.Plans))
	}
}

// What each system is allowed to plan with.
func TestSystemShape(t *testing.T) {
	app, pf, err := examples.Parse("tracker")
	if err != nil {
		t.Fatal(err)
	}
	gpuTargets := map[string]bool{}
	for _, m := range app.Modules {
		if m.Kind == dag.GPU {
			gpuTargets[m.Model], gpuTargets[string(m.Name)] = true, true
		}
	}
	for _, tc := range []struct {
		sys        System
		types      []profile.WorkerTypeID
		limits     map[profile.WorkerTypeID]int
		fixed      float64
		gpuConcMax int
		err        string
	}{
		{sys: System{Name: "mdag"}, types: []profile.WorkerTypeID{"P100", "V100", "CPU"}, limits: Cluster(), gpuConcMax: 2},
		{sys: System{Name: "mdag-batching-only", NoSpatial: true}, types: []profile.WorkerTypeID{"P100", "V100", "CPU"}, limits: Cluster(), gpuConcMax: 1},
		{sys: System{Name: "nexus", Nexus: true, FrontEnds: 4, NexusGPU: "V100"}, types: []profile.WorkerTypeID{"V100", "CPU"},
			limits: map[profile.WorkerTypeID]int{"V100": 16, "CPU": 4}, fixed: 4 * 0.83, gpuConcMax: 1},
		{sys: System{Name: "nexus-bad", Nexus: true, FrontEnds: 1, NexusGPU: "CPU"}, err: "not a GPU worker type"},
		{sys: System{Name: "nexus-none", Nexus: true, NexusGPU: "P100"}, err: "at least one front-end"},
	} {
		t.Run(tc.sys.Name, func(t *testing.T) {
			out, limits, fixed, err := tc.sys.shape(app, pf, Cluster())
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var types []profile.WorkerTypeID
			for _, w := range out.Workers {
				types = append(types, w.Type)
			}
			if !slices.Equal(types, tc.types) {
				t.Fatalf("types %v, want %v", types, tc.types)
			}
			for k, v := range tc.limits {
				if limits[k] != v {
					t.Fatalf("limits %v, want %v", limits, tc.limits)
				}
			}
			if d := fixed.rate - tc.fixed; d > 1e-9 || d < -1e-9 {
				t.Fatalf("fixed $%v/h, want %v", fixed.rate, tc.fixed)
			}
			conc := 0
			for _, p := range out.Profiles {
				if !slices.Contains(types, p.Worker) {
					t.Fatalf("profile %s on %s: not a type it may use", p.Target, p.Worker)
				}
				if tc.sys.Nexus && !gpuTargets[p.Target] && p.Worker != "CPU" {
					t.Fatalf("CPU module %s on %s: the Nexus-style system runs CPU modules on its front-ends only", p.Target, p.Worker)
				}
				for _, pt := range p.Points {
					if gpuTargets[p.Target] {
						conc = max(conc, pt.Concurrency)
					}
				}
			}
			if conc != tc.gpuConcMax {
				t.Fatalf("GPU modules up to concurrency %d, want %d", conc, tc.gpuConcMax)
			}
			if _, err := profile.Bind(app, out); err != nil {
				t.Fatalf("the shaped profiles do not bind: %v", err)
			}
		})
	}
}

// The goal of issue 24: after a 4x jump in objects per frame the finish
// rate is back at >= 95% within 2 s (the run is deterministic: this is a
// figure of the code, not of the machine).
func TestAdaptationRecoversWithin2s(t *testing.T) {
	a := &Adaptation{App: "tracker", Clients: 12, FPS: 25, Base: 2, Jump: 20 * time.Second, Factor: 4}
	x, err := adaptationExperiment(a, SuiteConfig{Duration: 40 * time.Second, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	r, err := Run(x)
	if err != nil {
		t.Fatal(err)
	}
	rec, worst := recovery(r, a.Jump, 0.95)
	before, after := r.Seconds[15], r.Seconds[35]
	if rec < 0 || rec > 2*time.Second || after.Objects != 8 || before.Objects != 2 {
		t.Fatalf("recovered after %v (lowest %.3f); objects %v -> %v", rec, worst, before.Objects, after.Objects)
	}
	// The plans' own cost (whole instances; warm ones in their turn-off
	// delay are billed but not planned): more after the jump.
	var pre, post float64
	for _, p := range r.Plans {
		if p.T < a.Jump.Seconds() {
			pre = p.Cost
		} else if p.T < a.Jump.Seconds()+2 {
			post = p.Cost
		}
	}
	if post <= pre {
		t.Fatalf("plans cost $%v/h before the jump, $%v/h after: the jump was absorbed without a re-plan, so it tests nothing (%+v)", pre, post, r.Plans)
	}
}

func TestRecovery(t *testing.T) {
	sec := func(rates ...float64) *Result {
		r := &Result{}
		for i, f := range rates {
			r.Seconds = append(r.Seconds, Second{T: i, Sent: 100, Finished: int(f * 100)})
		}
		return r
	}
	for _, tc := range []struct {
		r     *Result
		want  time.Duration
		worst float64
	}{
		{sec(1, 1, 1, 1), 0, 1},
		{sec(1, 0.5, 0.9, 1, 1), 2 * time.Second, 0.5},
		{sec(1, 0.5, 1, 0.9, 1), 3 * time.Second, 0.5}, // back for good only from the last dip
		{sec(1, 0.5, 0.5), -1, 0.5},
	} {
		got, worst := recovery(tc.r, time.Second, 0.95)
		if got != tc.want || worst != tc.worst {
			t.Errorf("%v: %v, %v; want %v, %v", tc.r.Seconds, got, worst, tc.want, tc.worst)
		}
	}
}

func TestCheck(t *testing.T) {
	r := func(name string, fin, cost float64) *Result {
		return &Result{System: name, FinishRate: fin, Cost: cost}
	}
	for _, tc := range []struct {
		name string
		c    Comparison
		want []string
		best string
	}{
		{"mdag better on both", Comparison{App: "a", Mdag: r("mdag", 0.99, 1), Nexus: []*Result{r("n1", 0.9, 0.8), r("n2", 0.985, 1.3)}}, nil, "n2"},
		{"a variant finishes more", Comparison{App: "a", Mdag: r("mdag", 0.95, 1), Nexus: []*Result{r("n1", 0.97, 2)}},
			[]string{"a: n1 finished 97.00% of frames, mdag 95.00%"}, "n1"},
		{"a comparable variant is cheaper", Comparison{App: "a", Mdag: r("mdag", 0.99, 1), Nexus: []*Result{r("n1", 0.975, 0.9)}},
			[]string{"a: n1 cost $0.900 at a comparable finish rate (97.50%), mdag $1.000 (99.00%)"}, "n1"},
		{"cheaper but not comparable", Comparison{App: "a", Mdag: r("mdag", 0.99, 1), Nexus: []*Result{r("n1", 0.95, 0.5)}}, nil, "n1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &Suite{Comparisons: []Comparison{tc.c}}
			got := s.Check()
			if !slices.Equal(got, tc.want) {
				t.Fatalf("Check: %q, want %q", got, tc.want)
			}
			if b := tc.c.Best(Comparable); b.System != tc.best {
				t.Fatalf("Best: %s, want %s", b.System, tc.best)
			}
		})
	}
}
