package coordinator

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/ingest/synth"
	"github.com/mdag/mdag/profile"
)

const frameApp = `app: sized
slo: 500ms
fps: 5
modules:
  - {name: detect, kind: gpu, model: det, inputs: [source]}
  - {name: count, kind: cpu, op: count, inputs: [detect]}
`

// det measured at two frame sizes (its preprocessing grows with the
// pixels); the document plans at the small one.
const frameProfiles = `workers:
  - {type: G, price: 1, gpu: T4, gpus: 1, cpus: 2}
  - {type: CPU, price: 0.1, cpus: 2}
plan: {frame: 320x240}
profiles:
  - {target: det, worker: G, frame: 320x240, points: [{batch: 1, latency: 2ms}, {batch: 2, latency: 3ms}]}
  - {target: det, worker: G, frame: 1280x960, points: [{batch: 1, latency: 20ms}, {batch: 2, latency: 30ms}]}
  - {target: count, worker: CPU, points: [{batch: 1, latency: 100us}]}
`

// TestPlansAtTheFrameSizeSent: the profiles plan at 320x240; a camera
// sends 1280x960. The session re-plans at the size it sees (trigger
// "frame", once), and the scheduler's l(1) for detect is the 1280x960
// profile's 20 ms, not 2 ms. A stream at the planning size re-plans
// nothing.
func TestPlansAtTheFrameSizeSent(t *testing.T) { synctest.Test(t, plansAtFrameSize) }

func plansAtFrameSize(t *testing.T) {
	app, err := dag.Parse("sized.yaml", []byte(frameApp))
	if err != nil {
		t.Fatal(err)
	}
	prof, err := profile.Parse("sized-profiles.yaml", []byte(frameProfiles))
	if err != nil {
		t.Fatal(err)
	}
	f := startFake(t, Config{}, map[profile.WorkerTypeID]int{"G": 1, "CPU": 1})
	if err := f.e.Deploy(app, prof); err != nil {
		t.Fatal(err)
	}
	small, err := synth.NewPattern(320, 240, 1)
	if err != nil {
		t.Fatal(err)
	}
	f.stream("sized", "small", 0, small, 5, 10)
	f.advance(2 * time.Second)
	if n := f.rec.triggered("frame"); n != 0 {
		t.Fatalf("%d frame re-plans for frames at the planning size", n)
	}
	if got := f.e.sched.Estimator().Profiled("sized/detect", 1); got != 2*time.Millisecond {
		t.Fatalf("l(1) at 320x240 = %v, want 2ms", got)
	}
	big, err := synth.NewPattern(1280, 960, 1)
	if err != nil {
		t.Fatal(err)
	}
	f.stream("sized", "big", 1, big, 5, 10)
	f.advance(2 * time.Second)
	if n := f.rec.triggered("frame"); n != 1 {
		t.Errorf("%d frame re-plans, want 1 (the camera's size seen)", n)
	}
	if got := f.e.sched.Estimator().Profiled("sized/detect", 1); got != 20*time.Millisecond {
		t.Errorf("l(1) after 1280x960 frames = %v, want the 1280x960 profile's 20ms", got)
	}
	st := f.e.Status().Sessions[0]
	if st.Total.Sent != 20 || st.Total.Finished != 20 {
		t.Errorf("totals %+v, drops %v: want all 20 finished", st.Total, st.Drops)
	}
	// The big camera leaves: the largest size left is the planning size.
	if err := f.e.Leave("big"); err != nil {
		t.Fatal(err)
	}
	f.advance(time.Second)
	if n := f.rec.triggered("frame"); n != 2 {
		t.Errorf("%d frame re-plans after the big camera left, want 2", n)
	}
	if got := f.e.sched.Estimator().Profiled("sized/detect", 1); got != 2*time.Millisecond {
		t.Errorf("l(1) after the big camera left = %v, want 2ms", got)
	}
}
