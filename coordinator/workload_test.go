package coordinator

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/mdag/mdag/allocator/milp"
	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/ingest/synth"
	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/profile"
)

// A workload runs an embedded engine for a test or a benchmark that share
// their steps: on the fake clock (fakeRun, deterministic: the tests) or
// live (liveRun: the real clock, a goroutine per stream, polling for
// conditions: the benchmarks' figures, which are about speed).
type workload interface {
	engine() *Engine
	provisioner() *Local
	// stream joins a stream to app and feeds it n pattern frames (0:
	// until stop) at fps.
	stream(app dag.AppID, id string, index int, pat *synth.Pattern, fps float64, n uint64)
	// stop stops feeding a stream; it stays joined.
	stop(id string)
	// after calls f d from now (in its own goroutine when live).
	after(d time.Duration, f func())
	// until lets the workload run until cond holds, failing after limit.
	until(what string, limit time.Duration, cond func() bool)
	now() time.Time
	// close stops the feeds and the engine (a benchmark's next iteration
	// must not share the machine with this one's).
	close()
}

// starter starts an embedded engine with cfg and limits instances per
// worker type under a workload; t.Cleanup (b.Cleanup) closes it.
type starter func(cfg Config, limits map[profile.WorkerTypeID]int) workload

// onFakeClock starts fakeRuns (call inside synctest.Test).
func onFakeClock(t *testing.T) starter {
	return func(cfg Config, limits map[profile.WorkerTypeID]int) workload { return startFake(t, cfg, limits) }
}

// live starts liveRuns.
func live(tb testing.TB) starter {
	return func(cfg Config, limits map[profile.WorkerTypeID]int) workload { return startLive(tb, cfg, limits) }
}

// liveRun is an embedded engine on the real clock with pattern streams
// fed by goroutines.
type liveRun struct {
	tb    testing.TB
	e     *Engine
	local *Local
	mu    sync.Mutex
	feeds map[string]*liveFeed
	done  chan struct{} // closed by close: pending actions give up
	acts  sync.WaitGroup
}

type liveFeed struct {
	cancel context.CancelFunc
	done   chan struct{}
}

func startLive(tb testing.TB, cfg Config, limits map[profile.WorkerTypeID]int) *liveRun {
	r := &liveRun{tb: tb, feeds: map[string]*liveFeed{}, done: make(chan struct{})}
	if cfg.MILPSolver == nil {
		cfg.MILPSolver = milp.Solver{}
	}
	r.e, r.local = mustEmbedded(tb, cfg, limits)
	r.e.Start()
	tb.Cleanup(r.close)
	return r
}

// close stops the pending actions and every feed, then the engine.
func (r *liveRun) close() {
	r.mu.Lock()
	select {
	case <-r.done:
	default:
		close(r.done)
	}
	r.mu.Unlock()
	r.acts.Wait()
	r.mu.Lock()
	ids := make([]string, 0, len(r.feeds))
	for id := range r.feeds {
		ids = append(ids, id)
	}
	r.mu.Unlock()
	for _, id := range ids {
		r.stop(id)
	}
	r.e.Close()
}

func (r *liveRun) engine() *Engine     { return r.e }
func (r *liveRun) provisioner() *Local { return r.local }
func (r *liveRun) now() time.Time      { return time.Now() }

func (r *liveRun) stream(app dag.AppID, id string, index int, pat *synth.Pattern, fps float64, n uint64) {
	r.tb.Helper()
	if err := r.e.Join(app, id); err != nil {
		r.tb.Error(err) // not Fatal: stream may run in an action's goroutine
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	fd := &liveFeed{cancel: cancel, done: make(chan struct{})}
	r.mu.Lock()
	r.feeds[id] = fd
	r.mu.Unlock()
	go func() {
		defer close(fd.done)
		if err := pat.Generate(ctx, clock.Real{}, index, id, fps, n, r.e.Ingest); err != nil {
			r.tb.Error(err)
		}
	}()
}

// stop cancels the stream's feed and waits for its goroutine.
func (r *liveRun) stop(id string) {
	r.mu.Lock()
	fd := r.feeds[id]
	delete(r.feeds, id)
	r.mu.Unlock()
	if fd != nil {
		fd.cancel()
		<-fd.done
	}
}

func (r *liveRun) after(d time.Duration, f func()) {
	r.acts.Add(1)
	go func() {
		defer r.acts.Done()
		select {
		case <-time.After(d): // the workload's schedule, not a wait for logic
			f()
		case <-r.done:
		}
	}()
}

func (r *liveRun) until(what string, limit time.Duration, cond func() bool) {
	r.tb.Helper()
	waitFor(r.tb, what, limit, cond)
}
