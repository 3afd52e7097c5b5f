package coordinator

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/ingest/synth"
	"github.com/mdag/mdag/profile"
	"github.com/mdag/mdag/worker"
)

// These tests came from a review of the stateful runtime: each failed on
// a defect it found (the state of a stream that left lost when its module
// moved, a rejoining stream's state forgotten, exported state thrown away
// on one back-pressure answer, moved streams piled on one instance, a
// drained instance never released) and holds since the fix.

// TestStatefulLeftStreamMoves: a stream that left with frames still in
// flight when a plan moves its stateful module: its state moves too, so
// its last frames see it.
func TestStatefulLeftStreamMoves(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := &ledger{}
		f, _ := trackerRun(t, l, everyType)
		f.advance(2 * time.Second)
		from := holderOf(f.e, "cam-a")
		f.stop("cam-a")
		if err := f.e.Leave("cam-a"); err != nil {
			t.Fatal(err)
		}
		var open int
		f.e.call(func() { open = len(f.e.sessions["tracker"].open["cam-a"]) })
		if err := f.e.Drain(from); err != nil {
			t.Fatal(err)
		}
		f.advance(2 * time.Second)
		f.stop("cam-b")
		ss := checkAccounting(t, f)
		st := stateOf(ss, "track")
		t.Logf("cam-a open at leave: %d; drained %s; state %+v", open, from, st)
		var procA []int
		for _, c := range l.snapshot() {
			if c.stream == "cam-a" {
				procA = append(procA, c.proc)
			}
		}
		t.Logf("cam-a procs: %v", procA)
		checkLedger(t, l.snapshot(), false)
		if st.Events["reset"] != 0 || st.Events["failed"] != 0 {
			t.Errorf("state events %v", st.Events)
		}
	})
}

// actdetLedgers runs actdet (detect -> crop -> track and reid -> activity)
// with ledgers as its track and activity, two streams of three people.
func actdetLedgers(t *testing.T) (f *fakeRun, lt, la *ledger) {
	lt, la = &ledger{}, &ledger{}
	ops := ledgerOps(t, lt)
	if err := ops.Replace("activity", la.factory); err != nil {
		t.Fatal(err)
	}
	app, prof := loadExample(t, "actdet")
	f = startFake(t, Config{Log: testLog(t), Ops: ops, Checkpoint: 500 * time.Millisecond}, everyType)
	if err := f.e.Deploy(app, prof); err != nil {
		t.Fatal(err)
	}
	pat, _ := synth.NewPattern(320, 240, 3)
	pat.Classes = []string{"person"}
	f.stream(app.Name, "cam-a", 0, pat, 10, 0)
	f.stream(app.Name, "cam-b", 1, pat, 10, 0)
	return f, lt, la
}

// TestStatefulActdet: a stateful module with two inputs (activity: track's
// output and reid's three items) gets each frame's items of both branches
// together, after a stateful module upstream; draining their instance
// moves both, each stream's state with it.
func TestStatefulActdet(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, lt, la := actdetLedgers(t)
		f.advance(2 * time.Second)
		var from string
		f.e.call(func() { from = f.e.sessions["actdet"].mods["activity"].affs["cam-a"].inst })
		if err := f.e.Drain(from); err != nil {
			t.Fatal(err)
		}
		f.advance(2 * time.Second)
		f.stop("cam-a")
		f.stop("cam-b")
		ss := checkAccounting(t, f)
		if ss.Total.Dropped > 0 {
			t.Errorf("drops %v", ss.Drops)
		}
		for _, c := range la.snapshot() {
			if c.items != 4 {
				t.Errorf("activity got %s frame %d with %d items, want track's 1 and reid's 3", c.stream, c.seq, c.items)
			}
		}
		for name, l := range map[string]*ledger{"track": lt, "activity": la} {
			count := map[string]int{}
			for i, c := range l.snapshot() {
				if c.outOfSq || c.frames != count[c.stream] {
					t.Errorf("%s call %d: %+v, want frames %d", name, i, c, count[c.stream])
				}
				count[c.stream]++
			}
			if st := stateOf(ss, dag.ModuleID(name)); st == nil || st.Events["migrate"] != 2 {
				t.Errorf("%s: state %+v, want 2 migrations", name, st)
			}
		}
	})
}

// TestStatefulDrainedInstanceReleased: a drained in-process instance is
// given back once its state moved out.
func TestStatefulDrainedInstanceReleased(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := &ledger{}
		app, prof := loadExample(t, "tracker")
		f := startFake(t, Config{Log: testLog(t), Ops: ledgerOps(t, l), TurnOff: 10 * time.Second}, everyType)
		if err := f.e.Deploy(app, prof); err != nil {
			t.Fatal(err)
		}
		pat, _ := synth.NewPattern(320, 240, 3)
		pat.Classes = []string{"person"}
		f.stream(app.Name, "cam-a", 0, pat, 5, 0)
		f.advance(2 * time.Second)
		from := holderOf(f.e, "cam-a")
		if err := f.e.Drain(from); err != nil {
			t.Fatal(err)
		}
		f.advance(90 * time.Second)
		var st string
		var present bool
		f.e.call(func() {
			if in := f.e.insts[from]; in != nil {
				present, st = true, string(in.state)
			}
		})
		t.Logf("drained %s after 90 s (turn-off 10 s): present=%v state=%s", from, present, st)
		if present {
			t.Errorf("a drained provisioned instance is never released")
		}
	})
}

// TestStatefulImportBackPressure: an import answered queue-full keeps the
// exported bytes and is tried again: the state still arrives.
func TestStatefulImportBackPressure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := &ledger{}
		f, _ := trackerRun(t, l, everyType)
		var armed, hit bool
		var mu sync.Mutex
		f.local.deliver = func(inst string, r worker.Result) {
			mu.Lock()
			a := armed
			mu.Unlock()
			if a {
				var imp bool
				f.e.call(func() {
					if ts := f.e.tasks[r.Task]; ts != nil && ts.state != nil && ts.state.kind == worker.Import && ts.state.a.move != nil {
						imp = true
					}
				})
				if imp {
					mu.Lock()
					armed, hit = false, true
					mu.Unlock()
					r = worker.Result{Task: r.Task, Outcome: worker.QueueFull}
				}
			}
			f.mu.Lock()
			f.held = append(f.held, heldResult{inst, r})
			f.mu.Unlock()
		}
		f.advance(2 * time.Second)
		from := holderOf(f.e, "cam-a")
		mu.Lock()
		armed = true
		mu.Unlock()
		if err := f.e.Drain(from); err != nil {
			t.Fatal(err)
		}
		f.advance(2 * time.Second)
		f.stop("cam-a")
		f.stop("cam-b")
		ss := checkAccounting(t, f)
		st := stateOf(ss, "track")
		if !hit {
			t.Fatal("no import was answered queue-full: the test tested nothing")
		}
		if st.Events["migrate"] != 2 || st.Events["failed"]+st.Events["restore"]+st.Events["reset"] != 0 {
			t.Errorf("state events %v: want the refused import tried again, 2 migrations", st.Events)
		}
		checkLedger(t, l.snapshot(), false)
	})
}

const spreadApp = `app: spread
slo: 2s
fps: 5
modules:
  - {name: track, kind: cpu, op: track, inputs: [source]}
`

const spreadProfiles = `workers:
  - {type: CPU, price: 1, cpus: 8}
profiles:
  - target: track
    worker: CPU
    points:
      - {batch: 1, concurrency: 1, latency: 100ms}
      - {batch: 1, concurrency: 4, latency: 100ms}
`

// TestStatefulMovesSpread: streams moved together spread over the new
// routes (the ones on their way count), not all onto one.
func TestStatefulMovesSpread(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		app, _ := dag.Parse("spread.yaml", []byte(spreadApp))
		prof, _ := profile.Parse("p.yaml", []byte(spreadProfiles))
		l := &ledger{}
		f := startFake(t, Config{Log: testLog(t), Ops: ledgerOps(t, l)}, map[profile.WorkerTypeID]int{"CPU": 16})
		if err := f.e.Deploy(app, prof); err != nil {
			t.Fatal(err)
		}
		pat, _ := synth.NewPattern(160, 120, 1)
		for i := 0; i < 24; i++ {
			f.stream(app.Name, fmt.Sprintf("cam-%02d", i), i, pat, 5, 0)
		}
		f.advance(3 * time.Second)
		dist := func() map[string]int {
			out := map[string]int{}
			f.e.call(func() {
				for _, a := range f.e.sessions["spread"].mods["track"].affs {
					out[a.inst]++
				}
			})
			return out
		}
		var routes []route
		f.e.call(func() { routes = slices.Clone(f.e.sessions["spread"].mods["track"].routes) })
		t.Logf("before: %v routes %v", dist(), routes)
		from := "(leave)"
		var left []string
		f.e.call(func() {
			kept := map[string]int{}
			for _, st := range slices.Sorted(mapKeys(f.e.sessions["spread"].mods["track"].affs)) {
				a := f.e.sessions["spread"].mods["track"].affs[st]
				if kept[a.inst] < 3 {
					kept[a.inst]++
					continue
				}
				left = append(left, st)
			}
		})
		for _, st := range left {
			f.stop(st)
			f.e.Leave(st)
		}
		f.advance(2 * time.Second)
		f.e.call(func() { routes = slices.Clone(f.e.sessions["spread"].mods["track"].routes) })
		t.Logf("after draining %s: %v routes %v", from, dist(), routes)
		d := dist()
		lo, hi := -1, 0
		for _, n := range d {
			hi = max(hi, n)
			if lo < 0 || n < lo {
				lo = n
			}
		}
		if len(d) < 2 || hi-lo > 2 {
			t.Errorf("streams per instance after the moves: %v, want them spread", d)
		}
	})
}

// TestStatefulRejoin: a stream that leaves and rejoins under its id before
// its last frames ended keeps its state.
func TestStatefulRejoin(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := &ledger{}
		f, app := trackerRun(t, l, everyType)
		f.advance(2 * time.Second)
		var next uint64
		for _, s := range f.streams {
			if s.id == "cam-a" {
				next = s.seq
			}
		}
		f.stop("cam-a")
		if err := f.e.Leave("cam-a"); err != nil {
			t.Fatal(err)
		}
		if err := f.e.Join(app.Name, "cam-a"); err != nil {
			t.Fatal(err)
		}
		pat, _ := synth.NewPattern(320, 240, 3)
		pat.Classes = []string{"person"}
		f.streams = append(f.streams, &fakeStream{id: "cam-a", pat: pat, period: 200 * time.Millisecond, next: f.now(), seq: next})
		f.advance(3 * time.Second)
		f.stop("cam-a")
		f.stop("cam-b")
		ss := checkAccounting(t, f)
		checkLedger(t, l.snapshot(), false)
		if st := stateOf(ss, "track"); st.Events["reset"] != 0 {
			t.Errorf("state events %v", st.Events)
		}
	})
}
