package coordinator

import (
	"strings"
	"testing"
	"time"

	"github.com/mdag/mdag/allocator/milp"
	"github.com/mdag/mdag/examples"
	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/profile"
	"github.com/mdag/mdag/worker"
)

// idleProvisioner starts instances that accept work and never answer (the
// planning side alone).
type idleProvisioner struct {
	started []string
	specs   map[string]worker.ModuleSpec // the last loaded, by module key
}

type idleInstance struct{ p *idleProvisioner }

func (in idleInstance) Load(specs []worker.ModuleSpec) error {
	if in.p.specs == nil {
		in.p.specs = map[string]worker.ModuleSpec{}
	}
	for _, s := range specs {
		in.p.specs[s.Key()] = s
	}
	return nil
}
func (idleInstance) Submit(worker.Task) {}
func (idleInstance) Close()             {}

func (p *idleProvisioner) Limits() map[profile.WorkerTypeID]int {
	return map[profile.WorkerTypeID]int{"P100": 8, "V100": 8, "CPU": 8}
}
func (p *idleProvisioner) Start(id string, _ profile.WorkerTypeID) (Instance, error) {
	p.started = append(p.started, id)
	return idleInstance{p}, nil
}
func (p *idleProvisioner) Release(string) {}

// A Stepped engine runs nothing until RunPending (no goroutine of its own)
// and plans inline; JoinAt plans for the streams' own rates;
// MinReplanGap holds a trigger until the gap has passed since the last
// plan began.
func TestSteppedJoinAtAndReplanGap(t *testing.T) {
	clk := clock.NewFake(fakeStart)
	p := &idleProvisioner{}
	e, err := New(Config{Clock: clk, Stepped: true, Provisioner: p, MILPSolver: milp.Solver{}, MinReplanGap: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	e.Start()
	defer e.Close()
	app, pf, err := examples.Parse("traffic")
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Deploy(app, pf); err != nil {
		t.Fatal(err)
	}
	if err := e.JoinAt("traffic", "a", -1); err == nil || !strings.Contains(err.Error(), "fps -1") {
		t.Fatalf("JoinAt fps -1: %v", err)
	}
	if err := e.JoinAt("traffic", "a", 3); err != nil { // the first plan: at once
		t.Fatal(err)
	}
	rps := e.Replans()
	if len(rps) != 1 || len(rps[0].Sessions) != 1 || rps[0].Sessions[0].Rate != 3 || len(p.started) == 0 {
		t.Fatalf("after the first join: %d plans %+v, started %v", len(rps), rps, p.started)
	}
	// Every module's spec carries its profiled time: l(b) for a GPU one,
	// the time per item for a CPU one (what virtual workers take).
	for _, k := range []string{"traffic/detect", "traffic/crop-vehicles", "traffic/count"} {
		if sp, ok := p.specs[k]; !ok || len(sp.Latency) == 0 || sp.Latency[0] <= 0 {
			t.Fatalf("spec %s: %+v (loaded: %v)", k, sp, p.specs)
		}
	}
	clk.Advance(2 * time.Second)
	e.RunPending()
	if err := e.JoinAt("traffic", "b", 30); err != nil {
		t.Fatal(err)
	}
	if err := e.Join("traffic", "c"); err != nil { // the app's 10 fps
		t.Fatal(err)
	}
	if n := len(e.Replans()); n != 1 {
		t.Fatalf("%d plans 2 s after the first: the gap is 10 s", n)
	}
	for clk.Step(fakeStart.Add(10 * time.Second)) {
		e.RunPending()
	}
	rps = e.Replans()
	if len(rps) != 2 || rps[1].At != fakeStart.Add(10*time.Second) || rps[1].Sessions[0].Rate != 43 ||
		!strings.Contains(rps[1].Trigger, "stream b joined") || !strings.Contains(rps[1].Trigger, "stream c joined") {
		t.Fatalf("plans %+v: want a second at +10 s for 3+30+10 frames/s, for both joins", rps)
	}
}

// RunPending is for Stepped engines only.
func TestRunPendingNeedsStepped(t *testing.T) {
	e, err := New(Config{MILPSolver: milp.Solver{}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if recover() == nil {
			t.Fatal("RunPending on an engine that is not Stepped did not panic")
		}
	}()
	e.RunPending()
}

// A Stepped engine's clock moves only when its caller moves it: WaitReady
// refuses rather than waiting for ever, Ready answers, and an app kept
// warm is planned at deploy with no stream (its idle instances never
// answer a warm-up batch, so it is planned but never ready).
func TestSteppedWarm(t *testing.T) {
	clk := clock.NewFake(fakeStart)
	p := &idleProvisioner{}
	e, err := New(Config{Clock: clk, Stepped: true, Provisioner: p, MILPSolver: milp.Solver{}, Warmup: true})
	if err != nil {
		t.Fatal(err)
	}
	e.Start()
	defer e.Close()
	app, pf, err := examples.Parse("traffic")
	if err != nil {
		t.Fatal(err)
	}
	app.Warm = 2
	if err := e.Deploy(app, pf); err != nil {
		t.Fatal(err)
	}
	e.RunPending()
	rps := e.Replans()
	if len(rps) != 1 || len(rps[0].Sessions) != 1 || rps[0].Sessions[0].Rate != 2*app.FPS || len(p.started) == 0 {
		t.Fatalf("warm: 2 at deploy: %d plans %+v, started %v", len(rps), rps, p.started)
	}
	if e.Ready("traffic") {
		t.Error("ready while every warm-up batch is unanswered")
	}
	if err := e.WaitReady("traffic", time.Second); err == nil || !strings.Contains(err.Error(), "Stepped") {
		t.Errorf("WaitReady on a Stepped engine: %v, want a refusal", err)
	}
}
