package engine

import (
	"context"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mdag/mdag/gpu"
	"github.com/mdag/mdag/ingest"
	"github.com/mdag/mdag/internal/clock"
)

// run streams n pattern streams into the traffic app until ctx ends.
func runStreams(t *testing.T, ctx context.Context, e *Engine, n int, fps float64, pat *ingest.Pattern) *sync.WaitGroup {
	t.Helper()
	var wg sync.WaitGroup
	for i := range n {
		id := "cam-" + string(rune('a'+i))
		if err := e.Join("traffic", id); err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := pat.Generate(ctx, clock.Real{}, i, id, fps, 0, e.Ingest); err != nil {
				t.Error(err)
			}
		}()
	}
	return &wg
}

// replanAfter returns the first re-plan at or after t whose trigger
// contains what.
func replanAfter(e *Engine, t time.Time, what string) (Replan, bool) {
	for _, r := range e.Replans() {
		if !r.At.Before(t) && strings.Contains(r.Trigger, what) {
			return r, true
		}
	}
	return Replan{}, false
}

// recentFinishRate is the finish rate over the last n complete windows.
func recentFinishRate(e *Engine, n int) (float64, uint64) {
	ws := e.Status().Sessions[0].Windows
	var sent, fin uint64
	for _, w := range ws[max(0, len(ws)-n):] {
		sent += w.Sent
		fin += w.Finished
	}
	if sent == 0 {
		return 0, 0
	}
	return float64(fin) / float64(sent), sent
}

func TestAdaptation(t *testing.T) {
	if testing.Short() {
		t.Skip("runs ~10 s of live streams")
	}
	tests := []struct {
		name   string
		inject func(*ingest.Pattern, *Local)
		expect string
	}{
		{"scaling: objects per frame 0 -> 8", func(p *ingest.Pattern, _ *Local) { p.SetObjects(8) }, "scale"},
		{"ballooning: executors 1.5x slower", func(_ *ingest.Pattern, l *Local) {
			l.Each(func(_ string, _ *Worker, em *gpu.Emulated) { em.SetSlowdown(1.5) })
		}, "balloon"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			app, prof := loadExample(t, "traffic")
			e, local := NewEmbedded(Config{Log: testLog(t)}, everyType)
			e.Start()
			defer e.Close()
			if err := e.Deploy(app, prof); err != nil {
				t.Fatal(err)
			}
			objects := 3
			if tc.expect == "scale" {
				objects = 0
			}
			pat, _ := ingest.NewPattern(320, 240, objects)
			ctx, cancel := context.WithCancel(context.Background())
			wg := runStreams(t, ctx, e, 4, 10, pat)
			defer func() { cancel(); wg.Wait() }()
			waitFor(t, "two complete windows", 10*time.Second, func() bool { return len(e.Status().Sessions[0].Windows) >= 2 })
			jump := time.Now()
			tc.inject(pat, local)
			waitFor(t, "a re-plan for "+tc.expect, 5*time.Second, func() bool { _, ok := replanAfter(e, jump, tc.expect); return ok })
			r, _ := replanAfter(e, jump, tc.expect)
			if d := r.At.Sub(jump); d > 2*time.Second {
				t.Errorf("re-plan %v after the jump, want <= 2 s: %s", d, r.Trigger)
			}
			t.Logf("re-plan %v after the jump: %s; moves %s; cost %.2f/h", r.At.Sub(jump).Round(time.Millisecond), r.Trigger, summarizeMoves(r.Moves), r.CostWhole)
			// Recovery: three complete seconds after the re-plan at >= 95%.
			waitFor(t, "recovery", 10*time.Second, func() bool {
				ws := e.Status().Sessions[0].Windows
				return len(ws) > 0 && ws[len(ws)-1].Start.After(r.At.Add(time.Second))
			})
			waitFor(t, "three windows after the re-plan", 10*time.Second, func() bool {
				ws := e.Status().Sessions[0].Windows
				n := 0
				for _, w := range ws {
					if w.Start.After(r.At) {
						n++
					}
				}
				return n >= 3
			})
			for _, w := range e.Status().Sessions[0].Windows {
				t.Logf("window %s sent %d fin %d late %d drop %d %v", w.Start.Format("05"), w.Sent, w.Finished, w.Late, w.Dropped, w.Drops)
			}
			t.Logf("jump %s replan %s", jump.Format("05.000"), r.At.Format("05.000"))
			st := e.Status()
			for _, in := range st.Instances {
				t.Logf("instance %s %s %s %v", in.ID, in.Type, in.State, in.Modules)
			}
			for _, m := range st.Sessions[0].Modules {
				t.Logf("module %s in/s %.1f exec %.1f ms balloon %.2f batch %.2f budget %.1f ms instances %d", m.Module, m.RateIn, m.ExecMS, m.Balloon, m.MeanBatch, m.BudgetMS, m.Instances)
			}
			fr, sent := recentFinishRate(e, 3)
			if fr < 0.95 {
				t.Errorf("finish rate after the re-plan %.3f over %d frames, want >= 0.95; %+v", fr, sent, e.Status().Sessions[0].Drops)
			}
		})
	}
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
// the next stream is planned with the app's factors and its frames finish.
func TestFactorsLeaveWithStreams(t *testing.T) {
	if testing.Short() {
		t.Skip("runs ~5 s of live streams")
	}
	app, prof := loadExample(t, "traffic")
	var mu sync.Mutex
	got := map[string]map[Outcome]int{}
	e, _ := NewEmbedded(Config{Log: testLog(t), OnFrame: func(r FrameResult) {
		mu.Lock()
		defer mu.Unlock()
		if got[r.Stream] == nil {
			got[r.Stream] = map[Outcome]int{}
		}
		got[r.Stream][r.Outcome]++
	}}, everyType)
	e.Start()
	defer e.Close()
	if err := e.Deploy(app, prof); err != nil {
		t.Fatal(err)
	}
	pat, _ := ingest.NewPattern(320, 240, 3)
	ctx, cancel := context.WithCancel(context.Background())
	wg := runStreams(t, ctx, e, 1, 10, pat) // cam-a
	// What a 50x fan-out stream would have taught (observed, the plan
	// would be far off what a normal stream needs).
	taught := time.Now()
	e.call(func() {
		s := e.sessions["traffic"]
		s.scale["crop-vehicles"], s.balloon["classify"], s.headroom = 50, 5, 2
		e.trigger(KindScaling, "test: a stream with 50 vehicles a frame")
	})
	waitFor(t, "the taught plan", 5*time.Second, func() bool { _, ok := replanAfter(e, taught, "50 vehicles"); return ok })
	cancel()
	wg.Wait()
	left := time.Now()
	if err := e.Leave("cam-a"); err != nil {
		t.Fatal(err)
	}
	e.call(func() {
		s := e.sessions["traffic"]
		if len(s.scale) != 0 || len(s.balloon) != 0 || s.headroom != 1 {
			t.Errorf("after the last stream left: scale %v balloon %v headroom %v, want the app's", s.scale, s.balloon, s.headroom)
		}
	})
	waitFor(t, "the leave re-plan", 5*time.Second, func() bool { _, ok := replanAfter(e, left, "cam-a left"); return ok })
	joined := time.Now()
	ctx, cancel = context.WithCancel(context.Background())
	pat2, _ := ingest.NewPattern(320, 240, 3)
	var wg2 sync.WaitGroup
	if err := e.Join("traffic", "cam-b"); err != nil {
		t.Fatal(err)
	}
	wg2.Add(1)
	go func() {
		defer wg2.Done()
		if err := pat2.Generate(ctx, clock.Real{}, 1, "cam-b", 10, 30, e.Ingest); err != nil {
			t.Error(err)
		}
	}()
	wg2.Wait()
	cancel()
	waitFor(t, "cam-b's frames to end", 10*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, c := range got["cam-b"] {
			n += c
		}
		return n == 30
	})
	for _, r := range e.Replans() {
		if r.At.Before(joined) {
			continue
		}
		for _, ps := range r.Sessions {
			if ps.Scale["crop-vehicles"] > 10 || ps.Balloon["classify"] > 2 || ps.Headroom > 1 {
				t.Errorf("re-plan %d after cam-b joined still plans the old stream's factors: scale %v balloon %v headroom %v (%s)",
					r.N, ps.Scale, ps.Balloon, ps.Headroom, r.Trigger)
			}
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if fin := got["cam-b"][Finished]; fin < 27 {
		t.Errorf("cam-b: %v of 30 frames, want >= 27 finished; drops %v", got["cam-b"], e.Status().Sessions[0].Drops)
	}
}

// TestFinishRateAddsCapacity drives the engine on the fake clock with
// frame outcomes written into its accounting: three complete seconds of
// the current plan at 80%, dropped for cannot-finish, give exactly one
// finish-rate re-plan with more headroom, saying why; more ticks over the
// same windows give none; bad windows of the new plan give the next step.
func TestFinishRateAddsCapacity(t *testing.T) {
	clk := clock.NewFake(time.Unix(1e9, 0))
	app, prof := loadExample(t, "traffic")
	e, _ := NewEmbedded(Config{Clock: clk, Log: testLog(t)}, everyType)
	e.Start()
	defer e.Close()
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
			if slices.Contains(r.Kinds, KindFinishRate) {
				out = append(out, r)
			}
		}
		return out
	}
	tick := func() {
		clk.Advance(time.Second)
		e.call(e.tick)
	}
	bad(clk.Now())
	for range 4 {
		tick()
	}
	waitFor(t, "a finish-rate re-plan", 5*time.Second, func() bool { return len(finishRate()) > 0 })
	r := finishRate()[0]
	if h := r.Sessions[0].Headroom; h != 1.25 || !strings.Contains(r.Trigger, "finish rate 80.0%") || !strings.Contains(r.Trigger, "face: cannot-finish 6") {
		t.Errorf("re-plan %q headroom %v: want x1.25, saying why", r.Trigger, h)
	}
	if rs := e.Replans(); rs[0].Sessions[0].Cost >= r.Sessions[0].Cost {
		t.Errorf("finish-rate plan costs $%.3f/h, the join's $%.3f/h: want more capacity", r.Sessions[0].Cost, rs[0].Sessions[0].Cost)
	}
	for range 6 {
		tick()
	}
	if n := len(finishRate()); n != 1 {
		t.Fatalf("%d finish-rate re-plans over the same windows, want 1", n)
	}
	bad(r.At.Truncate(time.Second).Add(time.Second))
	for range 4 {
		tick()
	}
	waitFor(t, "a second finish-rate re-plan", 5*time.Second, func() bool { return len(finishRate()) > 1 })
	if h := finishRate()[1].Sessions[0].Headroom; h != 1.5625 {
		t.Errorf("second step headroom %v, want x1.5625", h)
	}
}
