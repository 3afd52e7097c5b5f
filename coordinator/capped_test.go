package coordinator

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/mdag/mdag/ingest/synth"
	"github.com/mdag/mdag/media"
	"github.com/mdag/mdag/observe/metrics"
	"github.com/mdag/mdag/profile"
)

// TestCappedPoolDegradesLoudly: 8 traffic streams on one worker of each
// type (issue 18 item 2: sent 800, finished 0, every drop no-instance, every
// re-plan problems=[]). The session is planned for the share of its rate
// the pool carries, every stream sheds the rest at ingest (counted), frames
// finish, and the degraded state is in the status, the metrics, the
// re-plan's problems and the answer to a new stream.
func TestCappedPoolDegradesLoudly(t *testing.T) {
	synctest.Test(t, cappedPool)
}

func cappedPool(t *testing.T) {
	app, prof := loadExample(t, "traffic")
	mx := metrics.New(false)
	f := startFake(t, Config{Observer: Observe(mx)}, map[profile.WorkerTypeID]int{"P100": 1, "V100": 1, "CPU": 1})
	e := f.e
	if err := e.Deploy(app, prof); err != nil {
		t.Fatal(err)
	}
	pat, err := synth.NewPattern(160, 120, 3)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 8 {
		f.stream(app.Name, fmt.Sprintf("traffic-%c", 'a'+i), i, pat, 10, 20)
	}
	f.until("end of every frame", 10*time.Second, func() bool {
		st := e.Status().Sessions[0]
		return st.Total.Sent == 160 && st.Open == 0
	})
	st := e.Status().Sessions[0]
	tot := st.Total
	t.Logf("totals %+v drops %v admitted %.2f: %s", tot, st.Drops, st.Admitted, st.Degraded)
	if tot.Finished+tot.Late+tot.Dropped != tot.Sent {
		t.Fatalf("accounting: %+v", tot)
	}
	if st.Admitted >= 1 || st.Admitted <= 0 || !strings.Contains(st.Degraded, "degraded") {
		t.Fatalf("status admitted %v, degraded %q: the capped pool must be reported", st.Admitted, st.Degraded)
	}
	if tot.Finished == 0 {
		t.Fatalf("nothing finished: %+v %v", tot, st.Drops)
	}
	if st.Drops["-: shed"] == 0 {
		t.Errorf("no frame was shed at ingest: %v", st.Drops)
	}
	for k, n := range st.Drops {
		if strings.Contains(k, "no-instance") {
			t.Errorf("%d frames dropped %q: the plan must fit the pool", n, k)
		}
	}
	found := false
	for _, r := range e.Replans() {
		for _, p := range r.Problems {
			found = found || strings.Contains(p, "degraded")
		}
	}
	if !found {
		t.Error("no re-plan reported the degraded plan in its problems")
	}
	if err := e.Admit(app.Name); !errors.Is(err, ErrOverloaded) {
		t.Errorf("Admit on a degraded session: %v, want ErrOverloaded", err)
	}
	m := gathered(t, mx)
	if got := m.sum("mdag_session_admitted_ratio", map[string]string{"app": "traffic"}); got != st.Admitted {
		t.Errorf("mdag_session_admitted_ratio %v, status %v", got, st.Admitted)
	}
	if got := m.sum("mdag_session_streams_refused_total", map[string]string{"app": "traffic"}); got != 1 {
		t.Errorf("mdag_session_streams_refused_total %v, want 1", got)
	}
}

// TestIngestSaturatedRefuses: frames that reach the session later than
// half the SLO (decoding cannot keep up) are said in the status and the
// log, and new streams are refused until it recovers (issue 18 item 5: 0%
// finished for 44 s with no warning and no admission control).
func TestIngestSaturatedRefuses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, app := startTraffic(t, Config{})
		e := f.e
		if err := e.Join(app.Name, "a"); err != nil {
			t.Fatal(err)
		}
		fr := media.NewFrame(32, 24)
		var seq uint64
		ingest := func(n int, late time.Duration) {
			for range n {
				seq++
				if err := e.Ingest("a", seq, f.clk.Now().Add(-late), fr, nil); err != nil {
					t.Fatal(err)
				}
			}
			f.advance(e.cfg.Adapt.Window)
		}
		ingest(30, 10*time.Millisecond)
		if err := e.Admit(app.Name); err != nil {
			t.Fatalf("healthy ingest: Admit %v", err)
		}
		ingest(600, app.SLO*3/4)
		if err := e.Admit(app.Name); !errors.Is(err, ErrOverloaded) || !strings.Contains(err.Error(), "ingest saturated") {
			t.Fatalf("saturated ingest: Admit %v, want ErrOverloaded naming the ingest", err)
		}
		if d := e.Status().Sessions[0].Degraded; !strings.Contains(d, "ingest saturated") {
			t.Errorf("status degraded %q does not say the ingest is saturated", d)
		}
		if !e.Saturated(app.Name) {
			t.Error("Saturated = false while frames arrive after half the SLO")
		}
		ingest(600, 10*time.Millisecond)
		if err := e.Admit(app.Name); err != nil {
			t.Errorf("recovered ingest: Admit %v", err)
		}
		if e.Saturated(app.Name) {
			t.Error("Saturated = true after the ingest recovered")
		}
	})
}
