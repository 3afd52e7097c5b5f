package coordinator

import (
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"

	"github.com/mdag/mdag/allocator/milp"
	"github.com/mdag/mdag/coordinator/why"
	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/examples"
	"github.com/mdag/mdag/ingest/synth"
	"github.com/mdag/mdag/observe/metrics"
	"github.com/mdag/mdag/profile"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// loadExample parses an embedded example's app and profiles.
func loadExample(t testing.TB, name string) (*dag.App, *profile.File) {
	t.Helper()
	app, pf, err := examples.Parse(name)
	if err != nil {
		t.Fatal(err)
	}
	return app, pf
}

var everyType = map[profile.WorkerTypeID]int{"P100": 8, "V100": 8, "CPU": 8}

// waitFor polls cond on the real clock until it holds or the test's
// deadline nears. It waits for the system under test, not for time to
// pass: cond is the thing being waited on. It is for live runs only (the
// benchmarks' liveRun, whose figures are about real time); a test of the
// engine's logic runs on the fake clock (fakeRun), where settle is the
// wait and nothing polls.
func waitFor(t testing.TB, what string, limit time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", limit, what)
		}
		<-time.After(5 * time.Millisecond)
	}
}

// checkRouted fails t for every drop in drops ("module: reason") that is
// not a load drop.
func checkRouted(t *testing.T, where string, drops map[string]uint64) {
	t.Helper()
	for k, n := range drops {
		if _, reason, _ := strings.Cut(k, ": "); !why.Drop(reason).Load() {
			t.Errorf("%s: %d frames dropped %q: a routing drop, not a deadline one", where, n, k)
		}
	}
}

// checkMostComplete fails t unless at least half the frames sent completed
// (finished in time or late): the bound that holds under -race on a loaded
// 2-core machine, where the finish rate itself is a benchmark's figure.
func checkMostComplete(t *testing.T, where string, c Counts) {
	t.Helper()
	if c.Sent == 0 || 2*(c.Finished+c.Late) < c.Sent || c.Finished == 0 {
		t.Errorf("%s: sent %d, finished %d, late %d, dropped %d: want some finished and >= 50%% completed", where, c.Sent, c.Finished, c.Late, c.Dropped)
	}
}

// TestEveryFrameAccounted: three streams of 30 frames on emulated GPUs,
// on the fake clock. Every frame ends (sent = finished + late + dropped,
// none open), no frame lacks a route, most complete, and the Prometheus
// exposition says the same as the status. It checks behaviour, not speed:
// the finish rate on the real clock is BenchmarkEveryFrame's figure.
func TestEveryFrameAccounted(t *testing.T) {
	synctest.Test(t, everyFrameAccounted)
}

func everyFrameAccounted(t *testing.T) {
	mx := metrics.New(false)
	st := runEveryFrame(t, onFakeClock(t), mx)
	tot := st.Total
	if tot.Finished+tot.Late+tot.Dropped != tot.Sent {
		t.Fatalf("accounting: %+v", tot)
	}
	checkMostComplete(t, "totals", tot)
	checkRouted(t, "totals", st.Drops)
	t.Logf("totals %+v drops %v p50 %.1f ms p99 %.1f ms; modules %+v", tot, st.Drops, st.P50MS, st.P99MS, st.Modules)

	// The exposition tells the same story as the status.
	m := gathered(t, mx)
	app1 := map[string]string{"app": "traffic"}
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"mdag_session_frames_sent_total", app1, 90},
		{"mdag_session_frames_total", app1, 90},
		{"mdag_session_frames_total", map[string]string{"outcome": "finished"}, float64(tot.Finished)},
		{"mdag_session_frames_total", map[string]string{"outcome": "late"}, float64(tot.Late)},
		{"mdag_session_frames_dropped_total", app1, float64(tot.Dropped)},
		{"mdag_session_latency_seconds_count", app1, float64(tot.Finished + tot.Late)},
		{"mdag_module_items_total", map[string]string{"module": "detect"}, 90},
		{"mdag_planner_triggers_total", map[string]string{"kind": "join"}, 3},
	} {
		if got := m.sum(c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %g, want %g", c.name, c.labels, got, c.want)
		}
	}
	detect := map[string]string{"module": "detect", "model": "ssd-inception"}
	if b, n := m.sum("mdag_scheduler_batches_total", detect), m.sum("mdag_scheduler_batch_size_count", detect); b == 0 || b != n {
		t.Errorf("detect batches %g, batch-size observations %g", b, n)
	}
	// detect is the first module: one item per frame, and a drop there is
	// the frame's drop (early drop or the scheduler's).
	if items, dropped := m.sum("mdag_scheduler_batch_size_sum", detect), m.sum("mdag_session_frames_dropped_total", map[string]string{"module": "detect"}); items != 90-dropped {
		t.Errorf("detect: %g items in batches, %g frames dropped there; want 90 in all", items, dropped)
	}
	for _, name := range []string{"mdag_planner_replans_total", "mdag_planner_solve_seconds_count", "mdag_cluster_instances", "mdag_module_exec_seconds_count", "mdag_module_queue_seconds_count"} {
		if m.sum(name, nil) == 0 {
			t.Errorf("%s is 0", name)
		}
	}
}

// runEveryFrame streams three pattern streams of 30 frames at 10 fps into
// the traffic app on emulated GPUs (8 of each type) and waits for every
// frame to end; it returns the session's status. The engine stays open
// until the test ends: the caller reads mx.
func runEveryFrame(tb testing.TB, start starter, mx *metrics.Metrics) SessionStatus {
	app, prof := loadExample(tb, "traffic")
	w := start(Config{Observer: Observe(mx)}, everyType)
	e := w.engine()
	if err := e.Deploy(app, prof); err != nil {
		tb.Fatal(err)
	}
	pat, err := synth.NewPattern(320, 240, 3)
	if err != nil {
		tb.Fatal(err)
	}
	for i := range 3 {
		w.stream(app.Name, string(app.Name)+"-"+string(rune('a'+i)), i, pat, 10, 30)
	}
	w.until("every frame to end", 20*time.Second, func() bool {
		st := e.Status().Sessions[0]
		return st.Total.Sent == 90 && st.Open == 0
	})
	return e.Status().Sessions[0]
}

// exposition is a gathered registry: value per series.
type exposition []struct {
	name   string
	labels map[string]string
	value  float64
}

func gathered(t *testing.T, m *metrics.Metrics) exposition {
	t.Helper()
	fams, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out exposition
	add := func(name string, ls []*dto.LabelPair, v float64) {
		l := map[string]string{}
		for _, p := range ls {
			l[p.GetName()] = p.GetValue()
		}
		out = append(out, struct {
			name   string
			labels map[string]string
			value  float64
		}{name, l, v})
	}
	for _, f := range fams {
		for _, mt := range f.GetMetric() {
			switch {
			case mt.Counter != nil:
				add(f.GetName(), mt.Label, mt.Counter.GetValue())
			case mt.Gauge != nil:
				add(f.GetName(), mt.Label, mt.Gauge.GetValue())
			case mt.Histogram != nil:
				add(f.GetName()+"_count", mt.Label, float64(mt.Histogram.GetSampleCount()))
				add(f.GetName()+"_sum", mt.Label, mt.Histogram.GetSampleSum())
			}
		}
	}
	return out
}

// sum adds the series of name whose labels include want.
func (x exposition) sum(name string, want map[string]string) float64 {
	var s float64
next:
	for _, m := range x {
		if m.name != name {
			continue
		}
		for k, v := range want {
			if m.labels[k] != v {
				continue next
			}
		}
		s += m.value
	}
	return s
}

// TestCloseConcurrent: Close from several goroutines at once stops the
// engine once; none panics (a channel closed twice) and every call returns
// after the engine has stopped.
func TestCloseConcurrent(t *testing.T) {
	e, _, err := NewEmbedded(Config{MILPSolver: milp.Solver{}}, everyType)
	if err != nil {
		t.Fatal(err)
	}
	e.Start()
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			e.Close()
			select {
			case <-e.done:
			default:
				t.Error("Close returned before the engine stopped")
			}
		})
	}
	wg.Wait()
	e.Close() // and once more, after
}
