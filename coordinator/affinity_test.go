package coordinator

import (
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/ingest/synth"
	"github.com/mdag/mdag/media"
	"github.com/mdag/mdag/modules"
	"github.com/mdag/mdag/profile"
)

// ledger is a stateful test op standing in for `track`: per stream it
// counts the frames it processed and remembers the last seq; every call is
// written down, so a test can check what the engine promises stateful
// modules: frames of a stream in seq order, all of a frame's items in one
// call, the state following the stream across instances.
type ledger struct {
	mu    sync.Mutex
	calls []ledgerCall
	procs int
	pad   int // bytes of padding in each snapshot (a tracker's state is a few KiB)
}

// ledgerCall is one ProcessFrame call.
type ledgerCall struct {
	proc    int // which processor (one per worker instance)
	stream  string
	seq     uint64
	items   int
	frames  int  // frames of the stream the state had counted before this one
	outOfSq bool // seq was not above the state's last seq
}

type ledgerProc struct {
	l  *ledger
	id int
	mu sync.Mutex
	st map[string]*ledgerState
}

type ledgerState struct {
	frames int
	last   uint64
	seen   bool
}

func (l *ledger) factory(modules.Params) (modules.Processor, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.procs++
	return &ledgerProc{l: l, id: l.procs, st: map[string]*ledgerState{}}, nil
}

func (p *ledgerProc) Process(it *media.Item) ([]*media.Item, error) {
	return p.ProcessFrame(it.Stream, it.Seq, []*media.Item{it})
}

func (p *ledgerProc) ProcessFrame(stream string, seq uint64, items []*media.Item) ([]*media.Item, error) {
	p.mu.Lock()
	st := p.st[stream]
	if st == nil {
		st = &ledgerState{}
		p.st[stream] = st
	}
	c := ledgerCall{proc: p.id, stream: stream, seq: seq, items: len(items), frames: st.frames, outOfSq: st.seen && seq <= st.last}
	st.frames++
	st.last, st.seen = seq, true
	p.mu.Unlock()
	p.l.mu.Lock()
	p.l.calls = append(p.l.calls, c)
	p.l.mu.Unlock()
	o := items[0].Derive()
	o.Labels = []string{fmt.Sprintf("frames=%d", c.frames+1)}
	return []*media.Item{o}, nil
}

func (p *ledgerProc) Snapshot(stream string) ([]byte, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var b []byte
	if st := p.st[stream]; st != nil && st.seen {
		b = binary.BigEndian.AppendUint64(b, uint64(st.frames))
		b = binary.BigEndian.AppendUint64(b, st.last)
		b = append(b, make([]byte, p.l.pad)...)
	}
	return modules.EncodeState("track", 1, b), nil
}

func (p *ledgerProc) Restore(stream string, b []byte) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.st, stream)
	if len(b) == 0 {
		return nil
	}
	_, pl, err := modules.DecodeState("track", b)
	if err != nil {
		return err
	}
	if len(pl) == 0 {
		return nil
	}
	if len(pl) < 16 {
		return fmt.Errorf("ledger state of %d bytes", len(pl))
	}
	p.st[stream] = &ledgerState{frames: int(binary.BigEndian.Uint64(pl)), last: binary.BigEndian.Uint64(pl[8:]), seen: true}
	return nil
}

func (p *ledgerProc) Close() {}

func (l *ledger) snapshot() []ledgerCall {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.calls)
}

// ledgerOps is the builtin ops with `track` played by l.
func ledgerOps(t testing.TB, l *ledger) *modules.Registry {
	t.Helper()
	r := modules.Builtin()
	if err := r.Replace("track", l.factory); err != nil {
		t.Fatal(err)
	}
	return r
}

// trackerRun starts the tracker example (detect -> crop -> reid -> track)
// on the fake clock with the ledger as its tracker, two streams of three
// people a frame.
func trackerRun(t *testing.T, l *ledger, limits map[profile.WorkerTypeID]int) (*fakeRun, *dag.App) {
	app, prof := loadExample(t, "tracker")
	f := startFake(t, Config{Log: testLog(t), Ops: ledgerOps(t, l), Checkpoint: 500 * time.Millisecond}, limits)
	if err := f.e.Deploy(app, prof); err != nil {
		t.Fatal(err)
	}
	pat, err := synth.NewPattern(320, 240, 3)
	if err != nil {
		t.Fatal(err)
	}
	pat.Classes = []string{"person"}
	f.stream(app.Name, "cam-a", 0, pat, 5, 0)
	f.stream(app.Name, "cam-b", 1, pat, 5, 0)
	return f, app
}

// holderOf is the instance holding stream's state at the tracker's track.
func holderOf(e *Engine, stream string) string {
	var out string
	e.call(func() {
		if a := e.sessions["tracker"].mods["track"].affs[stream]; a != nil {
			out = a.inst
		}
	})
	return out
}

// checkLedger checks the engine's promises to a stateful module in the
// calls it made: per stream, frames in increasing seq order, three items
// (people) each, and a state that counted every frame before (continuity:
// no reset) unless the stream's state was reset (resetOK).
func checkLedger(t *testing.T, calls []ledgerCall, resetOK bool) {
	t.Helper()
	count := map[string]int{}
	last := map[string]uint64{}
	for i, c := range calls {
		if c.outOfSq {
			t.Errorf("call %d: %s frame %d came at or below the state's last frame (reordered)", i, c.stream, c.seq)
		}
		if n, ok := last[c.stream]; ok && c.seq <= n {
			t.Errorf("call %d: %s frame %d after frame %d", i, c.stream, c.seq, n)
		}
		last[c.stream] = c.seq
		if c.items != 3 {
			t.Errorf("call %d: %s frame %d came with %d items, want the frame's 3 (gathered)", i, c.stream, c.seq, c.items)
		}
		if c.frames != count[c.stream] && !resetOK {
			t.Errorf("call %d: %s frame %d on processor %d: the state had counted %d frames, want %d (state lost)", i, c.stream, c.seq, c.proc, c.frames, count[c.stream])
		}
		count[c.stream]++
	}
}

// checkAccounting checks every frame sent ended and says how.
func checkAccounting(t *testing.T, f *fakeRun) SessionStatus {
	t.Helper()
	f.until("every frame to end", 20*time.Second, func() bool { return f.e.Status().Sessions[0].Open == 0 })
	ss := f.e.Status().Sessions[0]
	tot := ss.Total
	if tot.Sent == 0 || tot.Finished+tot.Late+tot.Dropped != tot.Sent {
		t.Fatalf("accounting: %+v", tot)
	}
	return ss
}

func stateOf(ss SessionStatus, m dag.ModuleID) *StateStatus {
	for _, ms := range ss.Modules {
		if ms.Module == m {
			return ms.State
		}
	}
	return nil
}

// TestStatefulOrderAndGather: the tracker's track sees each frame of each
// stream once, in order, with all of the frame's items, and its state
// counts every frame.
func TestStatefulOrderAndGather(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := &ledger{}
		f, _ := trackerRun(t, l, everyType)
		f.advance(4 * time.Second)
		f.stop("cam-a")
		f.stop("cam-b")
		ss := checkAccounting(t, f)
		calls := l.snapshot()
		if len(calls) < 30 {
			t.Fatalf("the tracker ran %d frames in 4 s of two 5 fps streams", len(calls))
		}
		checkLedger(t, calls, false)
		if ss.Total.Dropped > 0 {
			t.Errorf("drops: %v", ss.Drops)
		}
		if st := stateOf(ss, "track"); st == nil || st.Streams != 2 {
			t.Errorf("state status: %+v, want 2 streams", st)
		}
	})
}

// TestStatefulMigrationOnDrain: draining the instance holding the streams'
// state moves the tracker, and the state moves with it: no frame lost or
// reordered, the state's count continues on the new instance, one migrate
// event per stream.
func TestStatefulMigrationOnDrain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := &ledger{}
		m := runMigration(t, onFakeClock(t), l, 2)
		checkLedger(t, l.snapshot(), false)
		st := m.state
		if st == nil || st.Events["migrate"] != m.on || m.on == 0 || st.Events["reset"] != 0 || st.Events["restore"] != 0 {
			t.Fatalf("state status %+v: want 2 migrations and nothing else", st)
		}
		if m.ss.Total.Dropped > 0 {
			t.Errorf("drops: %v", m.ss.Drops)
		}
		procs := map[int]bool{}
		for _, c := range l.snapshot() {
			procs[c.proc] = true
		}
		if len(procs) < 2 {
			t.Errorf("frames ran on %d processors, want the old and the new instance's", len(procs))
		}
		t.Logf("moved %s -> %s, pause p50 %.2f ms max %.2f ms, %d frames", m.from, m.to, st.PauseP50MS, st.PauseMaxMS, m.ss.Total.Sent)
	})
}

// migrationRun is what runMigration saw.
type migrationRun struct {
	from, to string
	on       int // streams whose state was on from
	ss       SessionStatus
	state    *StateStatus
	pauses   []time.Duration
}

// runMigration runs the tracker example (the ledger as its tracker) with
// n streams of three people a frame at 5 fps, drains the instance holding
// their state after 2 s, runs 2 s more and lets every frame end.
func runMigration(tb testing.TB, start starter, l *ledger, n int) migrationRun {
	app, prof := loadExample(tb, "tracker")
	w := start(Config{Ops: ledgerOps(tb, l), Checkpoint: 500 * time.Millisecond}, everyType)
	defer w.close()
	e := w.engine()
	if err := e.Deploy(app, prof); err != nil {
		tb.Fatal(err)
	}
	pat, err := synth.NewPattern(320, 240, 3)
	if err != nil {
		tb.Fatal(err)
	}
	pat.Classes = []string{"person"}
	ids := make([]string, n)
	for i := range n {
		ids[i] = fmt.Sprintf("cam-%02d", i)
		w.stream(app.Name, ids[i], i, pat, 5, 0)
	}
	var m migrationRun
	w.until("every stream's state placed", 5*time.Second, func() bool {
		m.from = holderOf(e, ids[0])
		return m.from != "" && holderOf(e, ids[n-1]) != ""
	})
	end := w.now().Add(2 * time.Second)
	w.until("2 s of frames", 3*time.Second, func() bool { return !w.now().Before(end) })
	if err := e.Drain(m.from); err != nil {
		tb.Fatal(err)
	}
	on := 0 // streams whose state is on the drained instance
	for _, id := range ids {
		if holderOf(e, id) == m.from {
			on++
		}
	}
	w.until("the state to move", 10*time.Second, func() bool {
		st := stateOf(e.Status().Sessions[0], "track")
		if st == nil || st.Events["migrate"] < on {
			return false
		}
		for _, id := range ids {
			if h := holderOf(e, id); h == m.from || h == "" {
				return false
			}
		}
		return true
	})
	m.to, m.on = holderOf(e, ids[0]), on
	end = w.now().Add(2 * time.Second)
	w.until("2 s more", 3*time.Second, func() bool { return !w.now().Before(end) })
	for _, id := range ids {
		w.stop(id)
	}
	w.until("every frame to end", 20*time.Second, func() bool { return e.Status().Sessions[0].Open == 0 })
	m.ss = e.Status().Sessions[0]
	tot := m.ss.Total
	if tot.Sent == 0 || tot.Finished+tot.Late+tot.Dropped != tot.Sent {
		tb.Fatalf("accounting: %+v", tot)
	}
	m.state = stateOf(m.ss, "track")
	e.call(func() { m.pauses = slices.Clone(e.sessions["tracker"].mods["track"].pauses) })
	return m
}

// TestStatefulWorkerLost: losing the instance that holds the state
// restores each stream from its checkpoint (or resets it), counted, and
// every frame is still accounted for.
func TestStatefulWorkerLost(t *testing.T) {
	for _, tc := range []struct {
		name       string
		checkpoint time.Duration
		want       string
	}{
		{"checkpoint", 300 * time.Millisecond, "restore"},
		{"no-checkpoint", -1, "reset"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				l := &ledger{}
				app, prof := loadExample(t, "tracker")
				f := startFake(t, Config{Log: testLog(t), Ops: ledgerOps(t, l), Checkpoint: tc.checkpoint}, everyType)
				if err := f.e.Deploy(app, prof); err != nil {
					t.Fatal(err)
				}
				pat, _ := synth.NewPattern(320, 240, 3)
				pat.Classes = []string{"person"}
				f.stream(app.Name, "cam-a", 0, pat, 5, 0)
				f.advance(2 * time.Second)
				from := holderOf(f.e, "cam-a")
				f.e.LostInstance(from, "test: killed")
				f.advance(2 * time.Second)
				// (The new instance may take the lost one's name.)
				if to := holderOf(f.e, "cam-a"); to == "" {
					t.Fatalf("after losing %s the state is nowhere", from)
				}
				f.stop("cam-a")
				ss := checkAccounting(t, f)
				checkLedger(t, l.snapshot(), true)
				st := stateOf(ss, "track")
				if st == nil || st.Events[tc.want] != 1 || st.Events["migrate"] != 0 {
					t.Fatalf("state status %+v: want one %s", st, tc.want)
				}
				if st.LastEvent == "" {
					t.Error("no last event said")
				}
				calls := l.snapshot()
				if first, last := calls[0], calls[len(calls)-1]; first.proc == last.proc {
					t.Errorf("the first and last frames ran on the same processor %d", first.proc)
				}
				// The first frame on the new processor finds the
				// checkpoint's count (restore) or nothing (reset).
				i := slices.IndexFunc(calls, func(c ledgerCall) bool { return c.proc != calls[0].proc })
				if got := calls[i].frames; (tc.want == "restore") != (got > 0) || got > i {
					t.Errorf("%s: the first frame on the new instance found a state of %d frames (%d before)", tc.want, got, i)
				}
				t.Logf("%s: %s", tc.want, st.LastEvent)
			})
		})
	}
}

// jitter is a CPU op that takes long on even frames and little on odd ones
// (fake-clock time), so with a pool of several a frame overtakes the one
// before it: the input of the stateful module after it arrives reordered.
type jitter struct {
	clk interface {
		After(time.Duration) <-chan time.Time
	}
	mu   *sync.Mutex
	done *[]uint64 // the order frames finished here
}

func (j jitter) Process(it *media.Item) ([]*media.Item, error) {
	d := 10 * time.Millisecond
	if it.Seq%2 == 0 {
		d = 140 * time.Millisecond
	}
	<-j.clk.After(d)
	j.mu.Lock()
	*j.done = append(*j.done, it.Seq)
	j.mu.Unlock()
	return []*media.Item{it}, nil
}

func (jitter) Close() {}

const reorderApp = `app: reorder
slo: 1s
fps: 10
modules:
  - {name: count, kind: cpu, op: count, inputs: [source]}
  - {name: track, kind: cpu, op: track, inputs: [count]}
`

const reorderProfiles = `workers:
  - {type: CPU, price: 1, cpus: 8}
profiles:
  - target: count
    worker: CPU
    points:
      - {batch: 1, concurrency: 1, latency: 150ms}
      - {batch: 1, concurrency: 4, latency: 150ms}
  - target: track
    worker: CPU
    points:
      - {batch: 1, concurrency: 1, latency: 1ms}
`

// TestStatefulReorderedInput: frames that reach a stateful module out of
// order (a slow frame overtaken by the next) are handed to it in order.
func TestStatefulReorderedInput(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		app, err := dag.Parse("reorder.yaml", []byte(reorderApp))
		if err != nil {
			t.Fatal(err)
		}
		prof, err := profile.Parse("profiles.yaml", []byte(reorderProfiles))
		if err != nil {
			t.Fatal(err)
		}
		l := &ledger{}
		ops := ledgerOps(t, l)
		f := startFake(t, Config{Log: testLog(t), Ops: ops}, map[profile.WorkerTypeID]int{"CPU": 4})
		var mu sync.Mutex
		var done []uint64
		clk := f.clk
		if err := ops.Replace("count", func(modules.Params) (modules.Processor, error) { return jitter{clk, &mu, &done}, nil }); err != nil {
			t.Fatal(err)
		}
		if err := f.e.Deploy(app, prof); err != nil {
			t.Fatal(err)
		}
		pat, _ := synth.NewPattern(160, 120, 1)
		f.stream(app.Name, "cam", 0, pat, 10, 0)
		var arrivals []uint64 // the order frames left count (reached track)
		f.advance(3 * time.Second)
		f.stop("cam")
		ss := checkAccounting(t, f)
		calls := l.snapshot()
		for _, c := range calls {
			arrivals = append(arrivals, c.seq)
			if c.items != 1 {
				t.Errorf("frame %d: %d items", c.seq, c.items)
			}
		}
		if !slices.IsSorted(arrivals) || len(arrivals) < 25 {
			t.Fatalf("track saw frames %v", arrivals)
		}
		if ss.Total.Dropped > 0 {
			t.Errorf("drops: %v", ss.Drops)
		}
		mu.Lock()
		defer mu.Unlock()
		if slices.IsSorted(done) {
			t.Fatalf("frames left count in order (%v): the test did not reorder anything", done)
		}
		t.Logf("%d frames in order; latency p50 %.0f ms p99 %.0f ms", len(arrivals), ss.P50MS, ss.P99MS)
	})
}

// TestStatefulAfterRestart: a stream resumed after a coordinator restart
// has no known state at its stateful module: its first holder is told to
// forget any copy, the reset is counted and said, and its frames go on.
func TestStatefulAfterRestart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		app, prof := loadExample(t, "tracker")
		pat, _ := synth.NewPattern(320, 240, 3)
		pat.Classes = []string{"person"}
		disk := &memStore{}
		l1 := &ledger{}
		f1 := startFake(t, Config{Store: disk, Epoch: time.Hour, Ops: ledgerOps(t, l1)}, everyType)
		if err := f1.e.Deploy(app, prof); err != nil {
			t.Fatal(err)
		}
		f1.stream(app.Name, "cam-a", 0, pat, 5, 0)
		f1.advance(2 * time.Second)
		next := f1.streams[0].seq
		f1.stop("cam-a")
		f1.until("every frame to end", 5*time.Second, func() bool { return f1.e.Status().Sessions[0].Open == 0 })
		if err := f1.e.SaveState(); err != nil {
			t.Fatal(err)
		}
		crashed, _ := disk.crashCopy(t)
		f1.close()

		l2 := &ledger{}
		f2 := startFake(t, Config{Store: crashed, Epoch: time.Hour, Ops: ledgerOps(t, l2)}, everyType)
		if err := f2.e.Deploy(app, prof); err != nil {
			t.Fatal(err)
		}
		if err := f2.e.Join(app.Name, "cam-a"); err != nil {
			t.Fatal(err)
		}
		f2.settle()
		f2.streams = append(f2.streams, &fakeStream{id: "cam-a", pat: pat, period: 200 * time.Millisecond, next: f2.now(), seq: next})
		f2.advance(2 * time.Second)
		f2.stop("cam-a")
		ss := checkAccounting(t, f2)
		st := stateOf(ss, "track")
		if st == nil || st.Events["reset"] != 1 || !strings.Contains(st.LastEvent, "coordinator restart") {
			t.Fatalf("state status %+v: want one reset for the restart", st)
		}
		calls := l2.snapshot()
		if len(calls) == 0 || calls[0].frames != 0 || calls[0].seq < next {
			t.Fatalf("after the restart the tracker saw %+v", calls)
		}
		checkLedger(t, calls, false)
	})
}
