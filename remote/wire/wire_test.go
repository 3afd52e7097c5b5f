package wire

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/mdag/mdag/api"
	"github.com/mdag/mdag/media"
	"github.com/mdag/mdag/worker"
)

// TestResultRoundTrip: every outcome crosses the wire (through its bytes)
// as itself, with its detail and measured time; outputs travel with Done
// only.
func TestResultRoundTrip(t *testing.T) {
	out := &media.Item{Stream: "s", Seq: 7, Frame: media.NewFrame(2, 2), Labels: []string{"face"}}
	cases := []struct {
		name string
		in   worker.Result
		wire api.Outcome
	}{
		{"done", worker.Result{Task: 1, Outcome: worker.Done, Outputs: [][]*media.Item{{out}, {}}, Measured: 3 * time.Millisecond}, api.Outcome_OUTCOME_OK},
		{"rejected", worker.Result{Task: 2, Outcome: worker.Rejected}, api.Outcome_OUTCOME_REJECTED},
		{"queue full", worker.Result{Task: 3, Outcome: worker.QueueFull, Detail: "the stream to worker w0 is backed up or closed"}, api.Outcome_OUTCOME_QUEUE_FULL},
		{"not loaded", worker.Result{Task: 4, Outcome: worker.NotLoaded}, api.Outcome_OUTCOME_MODULE_NOT_LOADED},
		{"unloaded", worker.Result{Task: 5, Outcome: worker.Unloaded}, api.Outcome_OUTCOME_UNLOADED},
		{"module error", worker.Result{Task: 6, Outcome: worker.ModuleError, Detail: "params.pad: negative", Measured: time.Millisecond}, api.Outcome_OUTCOME_MODULE_ERROR},
		{"executor", worker.Result{Task: 7, Outcome: worker.ExecutorError, Detail: "model m: out of memory", Measured: 2 * time.Millisecond}, api.Outcome_OUTCOME_EXECUTOR},
		{"bad result", worker.Result{Task: 8, Outcome: worker.BadResult, Detail: "2 outputs for 1 items"}, api.Outcome_OUTCOME_BAD_RESULT},
		{"bad task", worker.Result{Task: 9, Outcome: worker.BadTask, Detail: "stream s frame 1: no frame"}, api.Outcome_OUTCOME_BAD_TASK},
	}
	covered := map[worker.Outcome]bool{}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			covered[tc.in.Outcome] = true
			p := ResultToPB(tc.in)
			if p.Outcome != tc.wire {
				t.Errorf("on the wire as %s, want %s", p.Outcome, tc.wire)
			}
			b, err := proto.Marshal(p)
			if err != nil {
				t.Fatal(err)
			}
			var back api.Result
			if err := proto.Unmarshal(b, &back); err != nil {
				t.Fatal(err)
			}
			got := ResultFromPB(&back)
			if got.Task != tc.in.Task || got.Outcome != tc.in.Outcome || got.Detail != tc.in.Detail || got.Measured != tc.in.Measured {
				t.Errorf("came back as {task %d, %s, %q, %v}, want {task %d, %s, %q, %v}",
					got.Task, got.Outcome, got.Detail, got.Measured, tc.in.Task, tc.in.Outcome, tc.in.Detail, tc.in.Measured)
			}
			if len(got.Outputs) != len(tc.in.Outputs) {
				t.Fatalf("%d output lists, want %d", len(got.Outputs), len(tc.in.Outputs))
			}
			for i, l := range tc.in.Outputs {
				if len(got.Outputs[i]) != len(l) {
					t.Fatalf("output %d: %d items, want %d", i, len(got.Outputs[i]), len(l))
				}
				for j, it := range l {
					g := got.Outputs[i][j]
					if g.Stream != it.Stream || g.Seq != it.Seq || g.Frame.W != it.Frame.W || len(g.Labels) != len(it.Labels) {
						t.Errorf("output %d item %d: %+v, want %+v", i, j, g, it)
					}
				}
			}
		})
	}
	for o := worker.Outcome(0); o.Valid(); o++ {
		if !covered[o] {
			t.Errorf("outcome %s has no round-trip case: add it (and its wire value)", o)
		}
	}
}

// TestResultUnknownOutcome: an outcome one side does not know (a newer
// peer's, none at all, or a Go value outside the constants) arrives as
// BadResult with a detail naming it, and its outputs are not trusted.
func TestResultUnknownOutcome(t *testing.T) {
	items := []*api.ItemList{{Items: []*api.Item{ItemToPB(&media.Item{Stream: "s", Frame: media.NewFrame(2, 2)})}}}
	for _, tc := range []struct {
		name string
		in   *api.Result
		want string // in the detail
	}{
		{"newer peer", &api.Result{Task: 1, Outcome: api.Outcome(42), Detail: "quota", Outputs: items}, "task 1: unknown outcome 42 on the wire (detail: quota)"},
		{"negative", &api.Result{Task: 2, Outcome: api.Outcome(-3)}, "task 2: unknown outcome -3 on the wire"},
		{"unset", &api.Result{Task: 3, Outputs: items}, "task 3: no outcome on the wire (OUTCOME_UNSPECIFIED)"},
		{"bad Go value", ResultToPB(worker.Result{Task: 4, Outcome: worker.Outcome(200), Detail: "x", Outputs: [][]*media.Item{{}}}),
			"task 4: the worker produced unknown outcome 200 (detail: x)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := proto.Marshal(tc.in)
			if err != nil {
				t.Fatal(err)
			}
			var back api.Result
			if err := proto.Unmarshal(b, &back); err != nil {
				t.Fatal(err)
			}
			got := ResultFromPB(&back)
			if got.Outcome != worker.BadResult || got.Detail != tc.want || got.Outputs != nil {
				t.Errorf("got %s %q with %d output lists, want bad-result %q and none", got.Outcome, got.Detail, len(got.Outputs), tc.want)
			}
		})
	}
}

// TestResultUndecodableOutput: a Done result whose output cannot be decoded
// becomes BadResult naming the output, so its frames are still accounted.
func TestResultUndecodableOutput(t *testing.T) {
	p := &api.Result{Task: 1, Outcome: api.Outcome_OUTCOME_OK, MeasuredNs: 5,
		Outputs: []*api.ItemList{{Items: []*api.Item{{Stream: "s", Seq: 3, Frame: &api.Frame{Width: 4, Height: 4}}}}}}
	got := ResultFromPB(p)
	if got.Outcome != worker.BadResult || !strings.HasPrefix(got.Detail, "output 0: stream s frame 3: ") || got.Outputs != nil || got.Measured != 5 {
		t.Errorf("got %s %q, %d output lists, measured %v; want bad-result naming output 0, none, 5ns", got.Outcome, got.Detail, len(got.Outputs), got.Measured)
	}
}
