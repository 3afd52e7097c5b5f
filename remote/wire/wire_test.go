package wire

import (
	"bytes"
	"errors"
	"reflect"
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
		{"peer lost", worker.Result{Task: 10, Outcome: worker.PeerLost, Detail: "fetch 1 frames from worker gpu-a at 10.0.0.7:7071: connection refused"}, api.Outcome_OUTCOME_PEER_LOST},
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

// fullItem is an item with every field set, the new ones of issue 23
// (tracks, steps, events, audio) included.
func fullItem() *media.Item {
	tr := []media.Track{{ID: 7, Box: media.Box{X: 1, Y: 2, W: 3, H: 4, Class: "car", Score: 0.75}, Age: 9, Hits: 8, Missed: 1}, {ID: 8}}
	return &media.Item{Stream: "cam", Seq: 42, Capture: time.Unix(100, 5), Deadline: time.Unix(101, 0), Frame: media.NewFrame(2, 2),
		Region: &media.Box{W: 2, H: 2}, Boxes: []media.Box{{W: 1, H: 1, Class: "car", Score: 0.5}}, Truth: []media.Box{{W: 2, H: 1, Class: "car"}},
		Labels: []string{"car"}, Counts: map[string]int{"car": 1}, Tracks: tr,
		Steps:  []media.Step{{Seq: 40, Boxes: []media.Box{{W: 1, H: 1}}, Labels: []string{"a", "b"}, Tracks: tr[:1]}, {Seq: 41}},
		Events: []media.Event{{Kind: "line-cross", Rule: "gate", Track: 7, Detail: "left to right"}},
		Audio:  &media.Audio{Rate: 48000, Channels: 2, PCM: []int16{0, 1, -1, 32767, -32768, 12345}}}
}

// roundTrip sends m through its bytes into out.
func roundTrip(t *testing.T, m, out proto.Message) {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if err := proto.Unmarshal(b, out); err != nil {
		t.Fatal(err)
	}
}

// TestItemRoundTrip: an item crosses the wire (through its bytes) equal to
// itself, every field included; audio travels as little-endian int16.
func TestItemRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   *media.Item
	}{
		{"every field", fullItem()},
		{"audio only", &media.Item{Stream: "mic", Seq: 1, Audio: &media.Audio{Rate: 8000, Channels: 1, PCM: []int16{-2, 3}}}},
		{"empty audio chunk", &media.Item{Stream: "mic", Seq: 2, Audio: &media.Audio{Rate: 8000, Channels: 1, PCM: []int16{}}}},
		{"bare", &media.Item{Stream: "s"}},
		// a pose model's keypoints cross the wire (issue 37: they were
		// dropped, so a pose model on a remote worker lost its points)
		{"keypoints", &media.Item{Stream: "s", Boxes: []media.Box{{X: 1, Y: 2, W: 3, H: 4, Class: "person", Score: 0.9,
			Keypoints: &media.Keypoints{Points: []media.Keypoint{{X: 1.5, Y: 2.5, Score: 0.8}, {X: 3, Y: 4, Score: 0.1}}}}, {X: 5, W: 1, H: 1, Class: "person"}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var back api.Item
			roundTrip(t, ItemToPB(tc.in), &back)
			got, err := ItemFromPB(&back)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.in) {
				t.Errorf("came back as\n%+v\nwant\n%+v", got, tc.in)
			}
		})
	}
	if p := AudioToPB(&media.Audio{Rate: 1, Channels: 1, PCM: []int16{0x0102, -2}}); !bytes.Equal(p.Pcm, []byte{2, 1, 0xfe, 0xff}) {
		t.Errorf("PCM on the wire % x, want little-endian 02 01 fe ff", p.Pcm)
	}
}

// TestTaskRoundTrip: every task kind crosses the wire as itself with its
// stream, state and items.
func TestTaskRoundTrip(t *testing.T) {
	cases := []struct {
		name string
		in   worker.Task
		wire api.TaskKind
	}{
		{"run: a frame's items", worker.Task{ID: 1, App: "a", Module: "m", Items: []*media.Item{fullItem(), fullItem()}, Earliest: time.Unix(5, 0), Latest: time.Unix(6, 0)}, api.TaskKind_TASK_RUN},
		{"export", worker.Task{ID: 2, App: "a", Module: "m", Kind: worker.Export, Stream: "cam", Items: []*media.Item{}}, api.TaskKind_TASK_EXPORT},
		{"checkpoint", worker.Task{ID: 3, App: "a", Module: "m", Kind: worker.Checkpoint, Stream: "cam", Items: []*media.Item{}}, api.TaskKind_TASK_CHECKPOINT},
		{"import", worker.Task{ID: 4, App: "a", Module: "m", Kind: worker.Import, Stream: "cam", State: []byte("MDST\x01snapshot"), Items: []*media.Item{}}, api.TaskKind_TASK_IMPORT},
		{"import nil: forget", worker.Task{ID: 5, App: "a", Module: "m", Kind: worker.Import, Stream: "cam", Items: []*media.Item{}}, api.TaskKind_TASK_IMPORT},
	}
	covered := map[worker.TaskKind]bool{}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			covered[tc.in.Kind] = true
			p := TaskToPB(tc.in)
			if p.Kind != tc.wire {
				t.Errorf("on the wire as %s, want %s", p.Kind, tc.wire)
			}
			var back api.Task
			roundTrip(t, p, &back)
			got, err := TaskFromPB(&back)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.in) {
				t.Errorf("came back as\n%+v\nwant\n%+v", got, tc.in)
			}
		})
	}
	for k := worker.TaskKind(0); k.Valid(); k++ {
		if !covered[k] {
			t.Errorf("task kind %s has no round-trip case: add it (and its wire value)", k)
		}
	}
}

// TestTaskFromPBErrors: what a worker cannot take from the coordinator is
// an error naming the task and what is wrong (the worker answers BadTask
// with it); nothing panics.
func TestTaskFromPBErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   *api.Task
		want string
	}{
		{"unknown kind", &api.Task{Id: 1, App: "a", Module: "m", Kind: api.TaskKind(9), Stream: "cam"}, "task 1 for a/m: unknown task kind 9 on the wire"},
		{"negative kind", &api.Task{Id: 2, App: "a", Module: "m", Kind: api.TaskKind(-1)}, "task 2 for a/m: unknown task kind -1 on the wire"},
		{"export without a stream", &api.Task{Id: 3, App: "a", Module: "m", Kind: api.TaskKind_TASK_EXPORT}, "task 3 for a/m: a export task names no stream"},
		{"state on a checkpoint", &api.Task{Id: 4, App: "a", Module: "m", Kind: api.TaskKind_TASK_CHECKPOINT, Stream: "cam", State: []byte{1}}, "task 4 for a/m: a checkpoint task carries state (only import does)"},
		{"state on a run", &api.Task{Id: 5, App: "a", Module: "m", State: []byte{1}}, "task 5 for a/m: a run task carries state"},
		{"state too large", &api.Task{Id: 6, App: "a", Module: "m", Kind: api.TaskKind_TASK_IMPORT, Stream: "cam", State: make([]byte, MaxStateBytes+1)}, "task 6 for a/m: 16777217 bytes of state, more than the 16777216 allowed"},
		{"odd PCM", &api.Task{Id: 7, Items: []*api.Item{{Stream: "mic", Seq: 3, Audio: &api.Audio{Rate: 8000, Channels: 1, Pcm: []byte{1, 2, 3}}}}}, "stream mic frame 3: audio: 3 bytes of PCM, want whole 16-bit samples"},
		{"bad channels", &api.Task{Id: 8, Items: []*api.Item{{Stream: "mic", Seq: 4, Audio: &api.Audio{Rate: 8000, Channels: 3, Pcm: make([]byte, 6)}}}}, "stream mic frame 4: audio with 3 channels: want 1 or 2"},
		{"bad rate", &api.Task{Id: 9, Items: []*api.Item{{Stream: "mic", Seq: 5, Audio: &api.Audio{Rate: 0, Channels: 1}}}}, "stream mic frame 5: audio sample rate 0"},
		{"samples not dividing into channels", &api.Task{Id: 10, Items: []*api.Item{{Stream: "mic", Seq: 6, Audio: &api.Audio{Rate: 8000, Channels: 2, Pcm: make([]byte, 6)}}}}, "stream mic frame 6: audio: 3 samples do not divide into 2 channels"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := TaskFromPB(tc.in)
			if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
				t.Errorf("got %v, want %q", err, tc.want)
			}
		})
	}
	if p := TaskToPB(worker.Task{ID: 11, Kind: worker.TaskKind(200)}); p.Kind != api.TaskKind(200) {
		t.Errorf("a Go kind outside the constants went out as %d, want 200 (for the worker to refuse)", p.Kind)
	}
}

// TestResultState: a Done result's state crosses the wire; another
// outcome's does not; state over MaxStateBytes makes the result BadResult.
func TestResultState(t *testing.T) {
	state := []byte("MDST\x01snapshot")
	for _, tc := range []struct {
		name    string
		in      *api.Result
		want    worker.Outcome
		state   []byte
		detail  string
		outputs int
	}{
		{"export", ResultToPB(worker.Result{Task: 1, State: state, Outputs: [][]*media.Item{}}), worker.Done, state, "", 0},
		{"frame with state", ResultToPB(worker.Result{Task: 2, State: state, Outputs: [][]*media.Item{{fullItem()}, nil}}), worker.Done, state, "", 2},
		{"failed: no state", ResultToPB(worker.Result{Task: 3, Outcome: worker.ModuleError, Detail: "x", State: state}), worker.ModuleError, nil, "x", 0},
		{"too much state", &api.Result{Task: 4, Outcome: api.Outcome_OUTCOME_OK, State: make([]byte, MaxStateBytes+1)}, worker.BadResult, nil,
			"task 4: 16777217 bytes of state, more than the 16777216 allowed", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var back api.Result
			roundTrip(t, tc.in, &back)
			got := ResultFromPB(&back)
			if got.Outcome != tc.want || !bytes.Equal(got.State, tc.state) || (tc.state == nil) != (got.State == nil) || got.Detail != tc.detail || len(got.Outputs) != tc.outputs {
				t.Errorf("got %s %q with %d bytes of state and %d output lists; want %s %q, %d bytes, %d lists",
					got.Outcome, got.Detail, len(got.State), len(got.Outputs), tc.want, tc.detail, len(tc.state), tc.outputs)
			}
		})
	}
}

// TestCapsItem: each cap on an item's content takes a count at its limit
// and refuses one over it with its error, saying what and the limit.
func TestCapsItem(t *testing.T) {
	c := Caps{FrameW: 4, FrameH: 4, Boxes: 2, ResultItems: 2, Tracks: 2, Steps: 2, Events: 2, Labels: 2, AudioBytes: 8, StateBytes: 4}
	n := func(k int) ([]*api.Box, []*api.Track, []string, []*api.Event, []*api.Step) {
		return make([]*api.Box, k), make([]*api.Track, k), make([]string, k), make([]*api.Event, k), make([]*api.Step, k)
	}
	b2, t2, l2, e2, s2 := n(2)
	b3, t3, l3, e3, s3 := n(3)
	for _, tc := range []struct {
		name string
		in   *api.Item
		is   error  // nil: passes (want empty) or a plain error
		want string // in the error
	}{
		{"at every limit", &api.Item{Boxes: b2, Tracks: t2, Labels: l2, Events: e2, Steps: []*api.Step{{Boxes: b2, Tracks: t2, Labels: l2}, {}}, Audio: &api.Audio{Pcm: make([]byte, 8)}}, nil, ""},
		{"tracks", &api.Item{Tracks: t3}, ErrTracks, "too many tracks: 3 tracks on one item, the limit is 2"},
		{"labels", &api.Item{Labels: l3}, ErrLabels, "too many labels: 3 labels on one item, the limit is 2"},
		{"events", &api.Item{Events: e3}, ErrEvents, "too many events: 3 events on one item, the limit is 2"},
		{"steps", &api.Item{Steps: s3}, ErrSteps, "too many steps: 3 steps on one item, the limit is 2"},
		{"a step's boxes", &api.Item{Steps: []*api.Step{s2[0], {Seq: 9, Boxes: b3}}}, ErrBoxes, "too many boxes: 3 boxes on step 1 (seq 9), the limit is 2"},
		{"a step's tracks", &api.Item{Steps: []*api.Step{{Seq: 8, Tracks: t3}}}, ErrTracks, "too many tracks: 3 tracks on step 0 (seq 8), the limit is 2"},
		{"a step's labels", &api.Item{Steps: []*api.Step{{Seq: 8, Labels: l3}}}, ErrLabels, "too many labels: 3 labels on step 0 (seq 8), the limit is 2"},
		{"audio", &api.Item{Audio: &api.Audio{Pcm: make([]byte, 10)}}, ErrAudioSize, "audio chunk over the size limit: 10 bytes of PCM, the limit is 8"},
		{"keypoints at their limit", &api.Item{Boxes: []*api.Box{{Keypoints: make([]*api.Keypoint, MaxKeypoints)}}}, nil, ""},
		{"keypoints", &api.Item{Boxes: []*api.Box{{}, {Keypoints: make([]*api.Keypoint, MaxKeypoints+1)}}}, ErrKeypoints, "too many keypoints: box 1 has 257, the limit is 256"},
		{"ground truth's keypoints", &api.Item{Truth: []*api.Box{{Keypoints: make([]*api.Keypoint, MaxKeypoints+1)}}}, ErrKeypoints, "too many keypoints"},
		{"odd audio: no cap's", &api.Item{Audio: &api.Audio{Pcm: make([]byte, 7)}}, nil, "audio: 7 bytes of PCM, want whole 16-bit samples"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := c.CheckItem(tc.in)
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("got %v, want %q", err, tc.want)
			case tc.is != nil && !errors.Is(err, tc.is):
				t.Errorf("%v is not %v", err, tc.is)
			case tc.is == nil && err != nil && errors.Is(err, ErrAudioSize):
				t.Errorf("%v counts as a cap", err)
			}
		})
	}
	r := &api.Result{Task: 5, Outcome: api.Outcome_OUTCOME_OK, State: make([]byte, 5)}
	if err := c.CheckResult(r); !errors.Is(err, ErrStateSize) || !strings.Contains(err.Error(), "task 5 has 5 bytes of state, the limit is 4") {
		t.Errorf("state over the cap: %v", err)
	}
	r.State = r.State[:4]
	if err := c.CheckResult(r); err != nil {
		t.Errorf("state at the cap: %v", err)
	}
}

// TestFrameRef: a reference (the direct data plane) crosses the wire as
// itself, with its size and no pixels; a malformed one is refused with
// what is wrong, by FrameFromPB and by the caps.
func TestFrameRef(t *testing.T) {
	in := &media.Frame{W: 64, H: 48, Ref: &media.FrameRef{Holder: "gpu-a", Addr: "10.0.0.7:7071", ID: 42}}
	p := FrameToPB(in)
	if p.Bgr != nil || p.Ref == nil {
		t.Fatalf("on the wire %+v: want a reference without pixels", p)
	}
	b, err := proto.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	var back api.Frame
	if err := proto.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	got, err := FrameFromPB(&back)
	if err != nil || !reflect.DeepEqual(got, in) {
		t.Fatalf("came back as %+v, %v; want %+v", got, err, in)
	}
	caps := Caps{FrameW: 64, FrameH: 48}
	if err := caps.CheckFrame(p); err != nil {
		t.Errorf("caps refuse a valid reference: %v", err)
	}
	long := strings.Repeat("x", MaxRefField+1)
	for _, c := range []struct {
		name string
		f    *api.Frame
		want string
	}{
		{"pixels too", &api.Frame{Width: 1, Height: 1, Bgr: []byte{1, 2, 3}, Ref: &api.FrameRef{Holder: "a", Addr: "b:1"}}, "carries none"},
		{"no holder", &api.Frame{Width: 1, Height: 1, Ref: &api.FrameRef{Addr: "b:1"}}, "holder"},
		{"no address", &api.Frame{Width: 1, Height: 1, Ref: &api.FrameRef{Holder: "a"}}, "address"},
		{"long address", &api.Frame{Width: 1, Height: 1, Ref: &api.FrameRef{Holder: "a", Addr: long}}, "longer than"},
		{"no size", &api.Frame{Ref: &api.FrameRef{Holder: "a", Addr: "b:1"}}, "positive size"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if _, err := FrameFromPB(c.f); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("FrameFromPB: %v, want an error about %q", err, c.want)
			}
			if err := caps.CheckFrame(c.f); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("CheckFrame: %v, want an error about %q", err, c.want)
			}
		})
	}
	big := &api.Frame{Width: 65, Height: 48, Ref: &api.FrameRef{Holder: "a", Addr: "b:1"}}
	if err := caps.CheckFrame(big); !errors.Is(err, ErrFrameSize) {
		t.Errorf("a reference to a frame over the caps: %v, want ErrFrameSize", err)
	}
}
