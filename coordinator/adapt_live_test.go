package coordinator

import (
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/mdag/mdag/coordinator/why"
	"github.com/mdag/mdag/gpu"
	"github.com/mdag/mdag/ingest/synth"
	"github.com/mdag/mdag/worker"
)

// lastReplan is the number of the last re-plan recorded (0: none).
func lastReplan(e *Engine) int {
	rs := e.Replans()
	if len(rs) == 0 {
		return 0
	}
	return rs[len(rs)-1].N
}

// replanAfter returns the first re-plan recorded after re-plan n whose
// trigger contains what. (By number, not time: on the fake clock a
// re-plan and what the test did before it can share an instant.)
func replanAfter(e *Engine, n int, what string) (Replan, bool) {
	for _, r := range e.Replans() {
		if r.N > n && strings.Contains(r.Trigger, what) {
			return r, true
		}
	}
	return Replan{}, false
}

// adaptCase is one of TestAdaptation's jumps: what it injects, the word
// its re-plan's trigger carries and the factor the re-plan must plan with.
type adaptCase struct {
	name   string
	inject func(*synth.Pattern, *Local)
	expect string
	// factor says whether the re-plan's session carries the jump's factor.
	factor func(PlannedSession) bool
}

var adaptCases = []adaptCase{
	{"scaling: objects per frame 0 -> 8", func(p *synth.Pattern, _ *Local) { p.SetObjects(8) }, "scale",
		// 0 objects plans crop-vehicles at the app's 0.25; 8 objects a frame is ~6.
		func(ps PlannedSession) bool { return ps.Scale["crop-vehicles"] >= 2 }},
	{"ballooning: executors 1.5x slower", func(_ *synth.Pattern, l *Local) {
		l.Each(func(_ string, _ *worker.Worker, em *gpu.Emulated) { em.SetSlowdown(1.5) })
	}, "balloon", func(ps PlannedSession) bool {
		// Every emulated GPU is slower: some GPU module plans with it.
		return max(ps.Balloon["detect"], ps.Balloon["classify"], ps.Balloon["face"]) >= 1.2
	}},
}

// adaptation is what runAdaptation saw.
type adaptation struct {
	replan Replan
	delay  time.Duration  // from the jump to its re-plan
	after  []WindowStatus // the first three complete windows starting 1 s after the re-plan
}

// finishRate is finished / sent over the windows after the re-plan.
func (a adaptation) finishRate() float64 {
	var c Counts
	for _, w := range a.after {
		c.Sent += w.Sent
		c.Finished += w.Finished
	}
	return c.FinishRate()
}

// runAdaptation streams four cameras at 10 fps into the traffic app on
// emulated GPUs, injects tc's jump once two windows are complete, waits for
// the re-plan it causes and then for three complete windows starting a
// second after it.
func runAdaptation(tb testing.TB, start starter, tc adaptCase, log *slog.Logger) adaptation {
	app, prof := loadExample(tb, "traffic")
	w := start(Config{Log: log}, everyType)
	defer w.close()
	e := w.engine()
	if err := e.Deploy(app, prof); err != nil {
		tb.Fatal(err)
	}
	objects := 3
	if tc.expect == "scale" {
		objects = 0
	}
	pat, _ := synth.NewPattern(320, 240, objects)
	for i := range 4 {
		w.stream(app.Name, "cam-"+string(rune('a'+i)), i, pat, 10, 0)
	}
	w.until("two complete windows", 20*time.Second, func() bool { return len(e.Status().Sessions[0].Windows) >= 2 })
	jump, before := w.now(), lastReplan(e)
	tc.inject(pat, w.provisioner())
	// The first re-plan of the kind after the jump may be another
	// module's (a factor decaying, say) with the jump seen in one window
	// only: wait for the one that plans with the jump's factor.
	var r Replan
	w.until("a re-plan for "+tc.expect+" with the jump's factor", 10*time.Second, func() bool {
		for _, x := range e.Replans() {
			if x.N > before && strings.Contains(x.Trigger, tc.expect) && len(x.Sessions) > 0 && tc.factor(x.Sessions[0]) {
				r = x
				return true
			}
		}
		return false
	})
	a := adaptation{replan: r, delay: r.At.Sub(jump)}
	settled := func(w WindowStatus) bool { return w.Start.After(r.At.Add(time.Second)) }
	w.until("three complete windows a second after the re-plan", 20*time.Second, func() bool {
		n := 0
		for _, w := range e.Status().Sessions[0].Windows {
			if settled(w) {
				n++
			}
		}
		return n >= 3
	})
	st := e.Status()
	// A benchmark prints its log always: keep the windows for the test.
	logf := tb.Logf
	if _, ok := tb.(*testing.B); ok {
		logf = func(string, ...any) {}
	}
	for _, w := range st.Sessions[0].Windows {
		logf("window %s sent %d fin %d late %d drop %d %v", w.Start.Format("05"), w.Sent, w.Finished, w.Late, w.Dropped, w.Drops)
		if settled(w) && len(a.after) < 3 {
			a.after = append(a.after, w)
		}
	}
	logf("jump %s replan %s", jump.Format("05.000"), r.At.Format("05.000"))
	for _, in := range st.Instances {
		logf("instance %s %s %s %v", in.ID, in.Type, in.State, in.Modules)
	}
	for _, m := range st.Sessions[0].Modules {
		logf("module %s in/s %.1f exec %.1f ms balloon %.2f batch %.2f budget %.1f ms instances %d", m.Module, m.RateIn, m.ExecMS, m.Balloon, m.MeanBatch, m.BudgetMS, m.Instances)
	}
	return a
}

// TestAdaptation: four streams on the fake clock; objects per frame jump
// 0 -> 8 (scaling) or the emulated GPUs turn 1.5x slower (ballooning). It
// checks behaviour, not speed: the jump causes a re-plan of its kind that
// plans with the new factor, and from a second after it every window
// finishes frames, none lacks a route (deadline drops only) and most
// complete. How soon the re-plan comes on the real clock (~0.5 s, <= 2 s
// on an idle machine) and the finish rate after it (>= 95% idle) are
// BenchmarkAdaptation's figures.
func TestAdaptation(t *testing.T) {
	for _, tc := range adaptCases {
		t.Run(tc.name, func(t *testing.T) { synctest.Test(t, func(t *testing.T) { adaptationCase(t, tc) }) })
	}
}

func adaptationCase(t *testing.T, tc adaptCase) {
	a := runAdaptation(t, onFakeClock(t), tc, testLog(t))
	r := a.replan
	t.Logf("re-plan %v after the jump: %s; moves %s; cost %.2f/h", a.delay.Round(time.Millisecond), r.Trigger, summarizeMoves(r.Moves), r.CostWhole)
	if len(r.Sessions) == 0 || !tc.factor(r.Sessions[0]) {
		t.Errorf("re-plan %q does not plan with the jump's factor: %+v", r.Trigger, r.Sessions)
	}
	// On the fake clock the delay is the detector's alone: two windows
	// that see the jump (three when it lands mid-window).
	if win := (AdaptConfig{}).withDefaults().Window; a.delay > 3*win {
		t.Errorf("re-plan %v after the jump, want at most three %v windows", a.delay, win)
	}
	var c Counts
	for _, w := range a.after {
		if w.Finished == 0 {
			t.Errorf("window %s after the re-plan finished nothing: %+v %v", w.Start.Format("05"), w.Counts, w.Drops)
		}
		checkRouted(t, "window "+w.Start.Format("05")+" after the re-plan", w.Drops)
		c.Sent += w.Sent
		c.Finished += w.Finished
		c.Late += w.Late
		c.Dropped += w.Dropped
	}
	checkMostComplete(t, "windows after the re-plan", c)
	t.Logf("finish rate after the re-plan %.3f over %d frames", a.finishRate(), c.Sent)
}

// testLog logs the engine's debug events to the test log when
// MDAG_TEST_LOG is set (every drop with its reason and detail).
func testLog(t *testing.T) *slog.Logger {
	if os.Getenv("MDAG_TEST_LOG") == "" {
		return nil
	}
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// TestFactorsLeaveWithStreams is issue 18's stale fan-out: factors a
// stream taught (a 50x fan-out, a 5x slowdown, extra headroom) must not
// outlive it. When the session's last stream leaves they are forgotten;
// the next stream is planned with the app's factors and its frames are
// routed and complete: all 30 end, none dropped for want of a route
// (deadline drops only), most complete. It checks behaviour, not speed:
// the next stream's finish rate (>= 27 of 30 on an idle machine) is
// BenchmarkFactorsLeaveWithStreams's figure on the real clock; this test
// runs on the fake clock.
func TestFactorsLeaveWithStreams(t *testing.T) {
	synctest.Test(t, factorsLeaveWithStreams)
}

func factorsLeaveWithStreams(t *testing.T) {
	f := runFactorsLeave(t, onFakeClock(t), testLog(t))
	for _, r := range f.after {
		for _, ps := range r.Sessions {
			if ps.Scale["crop-vehicles"] > 10 || ps.Balloon["classify"] > 2 || ps.Headroom > 1 {
				t.Errorf("re-plan %d after cam-b joined still plans the old stream's factors: scale %v balloon %v headroom %v (%s)",
					r.N, ps.Scale, ps.Balloon, ps.Headroom, r.Trigger)
			}
		}
	}
	t.Logf("cam-b: %+v, drops %v", f.next, f.drops)
	if f.next.Sent != 30 {
		t.Errorf("cam-b: %d of 30 frames ended", f.next.Sent)
	}
	checkMostComplete(t, "cam-b", f.next)
	checkRouted(t, "cam-b", f.drops)
}

// factorsLeave is what runFactorsLeave saw.
type factorsLeave struct {
	after []Replan          // the re-plans from cam-b's join on
	next  Counts            // cam-b's frames (Sent: those that ended)
	drops map[string]uint64 // cam-b's drops by "module: reason"
}

// runFactorsLeave streams cam-a, teaches the session a 50x fan-out, a 5x
// slowdown and headroom 2, lets cam-a leave (checking the factors are
// forgotten), then streams 30 frames of cam-b at 10 fps and waits for all
// of them to end.
func runFactorsLeave(tb testing.TB, start starter, log *slog.Logger) factorsLeave {
	app, prof := loadExample(tb, "traffic")
	var mu sync.Mutex
	next := factorsLeave{drops: map[string]uint64{}}
	w := start(Config{Log: log, OnFrame: func(r FrameResult) {
		if r.Stream != "cam-b" {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		next.next.Sent++
		switch r.Outcome {
		case Finished:
			next.next.Finished++
		case Late:
			next.next.Late++
		default:
			next.next.Dropped++
			next.drops[string(r.Module)+": "+string(r.Reason)]++
		}
	}}, everyType)
	defer w.close()
	e := w.engine()
	if err := e.Deploy(app, prof); err != nil {
		tb.Fatal(err)
	}
	pat, _ := synth.NewPattern(320, 240, 3)
	w.stream(app.Name, "cam-a", 0, pat, 10, 0)
	// What a 50x fan-out stream would have taught (observed, the plan
	// would be far off what a normal stream needs).
	taught := lastReplan(e)
	e.call(func() {
		s := e.sessions["traffic"]
		s.scale["crop-vehicles"], s.balloon["classify"], s.headroom = 50, 5, 2
		e.trigger(why.OnScaling, "test: a stream with 50 vehicles a frame")
	})
	w.until("the taught plan", 10*time.Second, func() bool { _, ok := replanAfter(e, taught, "50 vehicles"); return ok })
	w.stop("cam-a")
	left := lastReplan(e)
	if err := e.Leave("cam-a"); err != nil {
		tb.Fatal(err)
	}
	e.call(func() {
		s := e.sessions["traffic"]
		if len(s.scale) != 0 || len(s.balloon) != 0 || s.headroom != 1 {
			tb.Errorf("after the last stream left: scale %v balloon %v headroom %v, want the app's", s.scale, s.balloon, s.headroom)
		}
	})
	w.until("the leave re-plan", 10*time.Second, func() bool { _, ok := replanAfter(e, left, "cam-a left"); return ok })
	joined := lastReplan(e)
	pat2, _ := synth.NewPattern(320, 240, 3)
	w.stream(app.Name, "cam-b", 1, pat2, 10, 30)
	w.until("cam-b's frames to end", 20*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return next.next.Sent == 30
	})
	for _, r := range e.Replans() {
		if r.N > joined {
			next.after = append(next.after, r)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	return next
}

// TestFinishRateAddsCapacity drives the engine on the fake clock with
// frame outcomes written into its accounting: three complete seconds of
// the current plan at 80%, dropped for cannot-finish, give exactly one
// finish-rate re-plan with more headroom, saying why; more ticks over the
// same windows give none; bad windows of the new plan give the next step.
func TestFinishRateAddsCapacity(t *testing.T) {
	synctest.Test(t, finishRateAddsCapacity)
}

func finishRateAddsCapacity(t *testing.T) {
	app, prof := loadExample(t, "traffic")
	f := startFake(t, Config{Log: testLog(t)}, everyType)
	e := f.e
	if err := e.Deploy(app, prof); err != nil {
		t.Fatal(err)
	}
	if err := e.Join("traffic", "cam"); err != nil {
		t.Fatal(err)
	}
	bad := func(from time.Time) {
		e.call(func() {
			s := e.sessions["traffic"]
			for i := range 3 {
				c := from.Add(time.Duration(i)*time.Second + 50*time.Millisecond)
				for k := range 10 {
					s.acct.sent(c)
					r := FrameResult{Outcome: Finished}
					if k >= 8 {
						r = FrameResult{Outcome: Dropped, Module: "face", Reason: "cannot-finish"}
					}
					s.acct.outcome(c, r)
				}
			}
		})
	}
	finishRate := func() []Replan {
		var out []Replan
		for _, r := range e.Replans() {
			if slices.Contains(r.Kinds, why.OnFinishRate) {
				out = append(out, r)
			}
		}
		return out
	}
	// Four seconds of adaptation ticks, each re-plan planned and applied.
	ticks := func(n int) { f.advance(time.Duration(n) * time.Second) }
	bad(f.clk.Now())
	ticks(4)
	if len(finishRate()) != 1 {
		t.Fatalf("%d finish-rate re-plans after three bad seconds, want 1", len(finishRate()))
	}
	r := finishRate()[0]
	if h := r.Sessions[0].Headroom; h != 1.25 || !strings.Contains(r.Trigger, "finish rate 80.0%") || !strings.Contains(r.Trigger, "face: cannot-finish 6") {
		t.Errorf("re-plan %q headroom %v: want x1.25, saying why", r.Trigger, h)
	}
	if rs := e.Replans(); rs[0].Sessions[0].Cost >= r.Sessions[0].Cost {
		t.Errorf("finish-rate plan costs $%.3f/h, the join's $%.3f/h: want more capacity", r.Sessions[0].Cost, rs[0].Sessions[0].Cost)
	}
	ticks(6)
	if n := len(finishRate()); n != 1 {
		t.Fatalf("%d finish-rate re-plans over the same windows, want 1", n)
	}
	bad(r.At.Truncate(time.Second).Add(time.Second))
	ticks(4)
	if n := len(finishRate()); n != 2 {
		t.Fatalf("%d finish-rate re-plans after three bad seconds of the new plan, want 2", n)
	}
	if h := finishRate()[1].Sessions[0].Headroom; h != 1.5625 {
		t.Errorf("second step headroom %v, want x1.5625", h)
	}
}
