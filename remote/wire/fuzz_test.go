package wire

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/mdag/mdag/api"
	"github.com/mdag/mdag/worker"
)

// fuzzCaps are small caps so that the fuzzer reaches both sides of each.
var fuzzCaps = Caps{FrameW: 8, FrameH: 6, Boxes: 3, ResultItems: 4, Tracks: 3, Steps: 2, Events: 3, Labels: 3, AudioBytes: 8, StateBytes: 16}

func seedItem() *api.Item {
	tr := []*api.Track{{Id: 4, Box: &api.Box{W: 1, H: 1, Class: "car"}, Age: 3, Hits: 2, Missed: 1}}
	return &api.Item{Stream: "cam", Seq: 3, CaptureUnixNs: 1, Frame: &api.Frame{Width: 2, Height: 2, Bgr: make([]byte, 12)},
		Boxes: []*api.Box{{X: 1, Y: 1, W: 1, H: 1, Class: "car", Score: 0.5}}, Truth: []*api.Box{{W: 2, H: 2, Class: "car"}},
		Labels: []string{"x"}, Counts: map[string]int64{"car": 1}, Region: &api.Box{W: 1, H: 1},
		Tracks: tr, Steps: []*api.Step{{Seq: 2, Boxes: []*api.Box{{W: 1, H: 1}}, Labels: []string{"y"}, Tracks: tr}},
		Events: []*api.Event{{Kind: "dwell", Rule: "door", Track: 4, Detail: "12 s"}}}
}

// seedAudio is an item of an audio app: a stereo chunk, no frame.
func seedAudio() *api.Item {
	return &api.Item{Stream: "mic", Seq: 1, Audio: &api.Audio{Rate: 16000, Channels: 2, Pcm: []byte{1, 0, 0xff, 0xff, 2, 0, 3, 0}}}
}

// checkItemAgrees: an item's caps and its decoding agree: what decodes
// keeps every count of the wire's, an item inside the caps holds no more
// than they allow, and audio inside the caps fails to decode only for its
// shape (rate, channels), never for its bytes.
func checkItemAgrees(t *testing.T, p *api.Item) {
	t.Helper()
	checkFrameAgrees(t, p.Frame)
	capErr := fuzzCaps.CheckItem(p)
	if capErr != nil && capErr.Error() == "" {
		t.Fatal("empty error")
	}
	audioErr := fuzzCaps.CheckAudio(p.Audio)
	a, err := AudioFromPB(p.Audio)
	switch {
	case p.Audio == nil:
		if audioErr != nil || err != nil || a != nil {
			t.Fatalf("no audio: cap %v, decode %v %v", audioErr, err, a)
		}
	case audioErr == nil && err != nil && !strings.Contains(err.Error(), "audio sample rate") && !strings.Contains(err.Error(), "channels"):
		t.Fatalf("audio of %d bytes passes the caps but does not decode: %v", len(p.Audio.Pcm), err)
	case err == nil && (a.Valid() != nil || len(a.PCM)*2 != len(p.Audio.Pcm)):
		t.Fatalf("audio of %d bytes decoded as %d samples (valid: %v)", len(p.Audio.Pcm), len(a.PCM), a.Valid())
	case errors.Is(audioErr, ErrAudioSize) && len(p.Audio.Pcm) <= fuzzCaps.AudioBytes:
		t.Fatalf("audio of %d bytes refused as too large: %v", len(p.Audio.Pcm), audioErr)
	}
	it, err := ItemFromPB(p)
	if err != nil {
		if err.Error() == "" {
			t.Fatal("empty error")
		}
		return
	}
	if it.Stream != p.Stream || it.Seq != p.Seq || len(it.Boxes) != len(p.Boxes) || len(it.Truth) != len(p.Truth) || (p.Region != nil) != (it.Region != nil) ||
		len(it.Labels) != len(p.Labels) || len(it.Tracks) != len(p.Tracks) || len(it.Steps) != len(p.Steps) || len(it.Events) != len(p.Events) || (p.Audio != nil) != (it.Audio != nil) {
		t.Fatalf("item %v decoded as %+v", p, it)
	}
	for i, st := range it.Steps {
		if ps := p.Steps[i]; st.Seq != ps.Seq || len(st.Boxes) != len(ps.Boxes) || len(st.Labels) != len(ps.Labels) || len(st.Tracks) != len(ps.Tracks) {
			t.Fatalf("step %d %v decoded as %+v", i, ps, st)
		}
	}
	for i, tr := range it.Tracks {
		if tr.ID != p.Tracks[i].GetId() || tr.Age != int(p.Tracks[i].GetAge()) {
			t.Fatalf("track %d %v decoded as %+v", i, p.Tracks[i], tr)
		}
	}
	if capErr != nil {
		return
	}
	if len(it.Tracks) > fuzzCaps.Tracks || len(it.Labels) > fuzzCaps.Labels || len(it.Events) > fuzzCaps.Events || len(it.Steps) > fuzzCaps.Steps {
		t.Fatalf("item with %d tracks, %d labels, %d events, %d steps passed the caps", len(it.Tracks), len(it.Labels), len(it.Events), len(it.Steps))
	}
	for i, st := range it.Steps {
		if len(st.Boxes) > fuzzCaps.Boxes || len(st.Labels) > fuzzCaps.Labels || len(st.Tracks) > fuzzCaps.Tracks {
			t.Fatalf("step %d with %d boxes, %d labels, %d tracks passed the caps", i, len(st.Boxes), len(st.Labels), len(st.Tracks))
		}
	}
	if it.Audio != nil && 2*len(it.Audio.PCM) > fuzzCaps.AudioBytes {
		t.Fatalf("audio of %d samples passed the cap of %d bytes", len(it.Audio.PCM), fuzzCaps.AudioBytes)
	}
}

func addSeeds(f *testing.F, msgs ...proto.Message) {
	for _, m := range msgs {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{})
	f.Add([]byte{0xff, 0xff, 0xff})
}

// checkFrameAgrees: the cap check and the decoder agree on a frame: one
// inside the caps with a matching payload decodes, and a decoded frame
// inside the caps passes the check.
func checkFrameAgrees(t *testing.T, p *api.Frame) {
	t.Helper()
	capErr := fuzzCaps.CheckFrame(p)
	f, err := FrameFromPB(p)
	switch {
	case p == nil:
		if capErr != nil || err != nil || f != nil {
			t.Fatalf("no frame: cap %v, decode %v %v", capErr, err, f)
		}
	case capErr == nil && err != nil:
		t.Fatalf("frame %dx%d (%d bytes) passes the caps but does not decode: %v", p.Width, p.Height, len(p.Bgr), err)
	case capErr == nil && p.Ref != nil && (f.Ref == nil || f.Pix != nil || f.W != int(p.Width) || f.H != int(p.Height)):
		t.Fatalf("reference %v decoded as %+v", p, f)
	case capErr == nil && p.Ref == nil && f.Valid() != nil:
		t.Fatalf("decoded frame invalid: %v", f.Valid())
	case errors.Is(capErr, ErrFrameSize) && p.Width <= int32(fuzzCaps.FrameW) && p.Height <= int32(fuzzCaps.FrameH):
		t.Fatalf("frame %dx%d refused as too large: %v", p.Width, p.Height, capErr)
	case capErr != nil && capErr.Error() == "":
		t.Fatal("empty error")
	}
}

// FuzzDecodeIngestMessage: whatever bytes a source sends, decoding and the
// coordinator's checks never panic, say what is wrong, and agree.
func FuzzDecodeIngestMessage(f *testing.F) {
	addSeeds(f,
		&api.IngestMessage{Join: &api.Join{App: "traffic", Stream: "cam"}},
		&api.IngestMessage{Seq: 1, CaptureUnixNs: 5, Frame: &api.Frame{Width: 2, Height: 2, Bgr: make([]byte, 12)}, Truth: []*api.Box{{W: 1, H: 1, Class: "car"}}},
		&api.IngestMessage{Seq: 2, Frame: &api.Frame{Width: 1 << 30, Height: 1 << 30}},
		&api.IngestMessage{Seq: 3, Frame: &api.Frame{Width: -1, Height: 4, Bgr: make([]byte, 3)}})
	f.Fuzz(func(t *testing.T, b []byte) {
		var m api.IngestMessage
		if err := proto.Unmarshal(b, &m); err != nil {
			if err.Error() == "" {
				t.Fatal("empty error")
			}
			return
		}
		checkFrameAgrees(t, m.Frame)
		err := fuzzCaps.CheckBoxes("ground-truth boxes", len(m.Truth))
		if (err != nil) != (len(m.Truth) > fuzzCaps.Boxes) {
			t.Fatalf("%d boxes: %v", len(m.Truth), err)
		}
		if got := BoxesFromPB(m.Truth); len(got) != len(m.Truth) {
			t.Fatalf("%d boxes decoded from %d", len(got), len(m.Truth))
		}
		_ = FromNS(m.CaptureUnixNs)
	})
}

// FuzzDecodeWorkerMessage: whatever bytes a worker sends, a result decodes
// to a result for the same task, with one output list per wire list when
// Done; one that passes the caps holds only frames inside them; nothing
// panics.
func FuzzDecodeWorkerMessage(f *testing.F) {
	addSeeds(f,
		&api.WorkerMessage{Msg: &api.WorkerMessage_Register{Register: &api.Register{Id: "w", Type: "CPU"}}},
		&api.WorkerMessage{Msg: &api.WorkerMessage_Heartbeat{Heartbeat: &api.Heartbeat{}}},
		&api.WorkerMessage{Msg: &api.WorkerMessage_LoadReply{LoadReply: &api.LoadReply{Generation: 2, Error: "x"}}},
		&api.WorkerMessage{Msg: &api.WorkerMessage_Result{Result: &api.Result{Task: 9, Outcome: api.Outcome_OUTCOME_OK, Outputs: []*api.ItemList{{Items: []*api.Item{seedItem()}}, {}}}}},
		&api.WorkerMessage{Msg: &api.WorkerMessage_Result{Result: &api.Result{Task: 9, Outcome: api.Outcome(77), Detail: "d"}}},
		&api.WorkerMessage{Msg: &api.WorkerMessage_Result{Result: &api.Result{Task: 10, Outcome: api.Outcome_OUTCOME_OK, State: []byte("MDST\x01state")}}},
		&api.WorkerMessage{Msg: &api.WorkerMessage_Result{Result: &api.Result{Task: 11, Outcome: api.Outcome_OUTCOME_OK, State: make([]byte, 17), Outputs: []*api.ItemList{{Items: []*api.Item{seedAudio()}}}}}},
		&api.WorkerMessage{Msg: &api.WorkerMessage_Result{Result: &api.Result{Task: 12, Outcome: api.Outcome_OUTCOME_MODULE_ERROR, State: []byte{1}}}})
	f.Fuzz(func(t *testing.T, b []byte) {
		var m api.WorkerMessage
		if err := proto.Unmarshal(b, &m); err != nil {
			if err.Error() == "" {
				t.Fatal("empty error")
			}
			return
		}
		p := m.GetResult()
		if p == nil {
			return
		}
		capErr := fuzzCaps.CheckResult(p)
		r := ResultFromPB(p)
		if r.Task != p.Task {
			t.Fatalf("task %d decoded as %d", p.Task, r.Task)
		}
		if r.Outcome == worker.BadResult && r.Detail == "" {
			t.Fatal("BadResult without a detail")
		}
		if r.Outcome != worker.Done {
			if r.State != nil {
				t.Fatalf("a %s result carries %d bytes of state", r.Outcome, len(r.State))
			}
			return
		}
		if !bytes.Equal(r.State, p.State) || (len(p.State) == 0) != (r.State == nil) {
			t.Fatalf("%d bytes of state decoded as %d", len(p.State), len(r.State))
		}
		if capErr == nil && len(r.State) > fuzzCaps.StateBytes {
			t.Fatalf("%d bytes of state passed the cap of %d", len(r.State), fuzzCaps.StateBytes)
		}
		if len(r.Outputs) != len(p.Outputs) {
			t.Fatalf("%d output lists decoded from %d", len(r.Outputs), len(p.Outputs))
		}
		n := 0
		for _, l := range r.Outputs {
			for _, it := range l {
				n++
				if it.Frame != nil && it.Frame.Valid() != nil {
					t.Fatalf("invalid frame decoded: %v", it.Frame.Valid())
				}
				if capErr == nil && it.Frame != nil && (it.Frame.W > fuzzCaps.FrameW || it.Frame.H > fuzzCaps.FrameH) {
					t.Fatalf("frame %dx%d passed the caps", it.Frame.W, it.Frame.H)
				}
				if capErr == nil && (len(it.Tracks) > fuzzCaps.Tracks || len(it.Steps) > fuzzCaps.Steps || len(it.Events) > fuzzCaps.Events || len(it.Labels) > fuzzCaps.Labels) {
					t.Fatalf("an item with %d tracks, %d steps, %d events, %d labels passed the caps", len(it.Tracks), len(it.Steps), len(it.Events), len(it.Labels))
				}
				if it.Audio != nil && it.Audio.Valid() != nil {
					t.Fatalf("invalid audio decoded: %v", it.Audio.Valid())
				}
			}
		}
		if capErr == nil && n > fuzzCaps.ResultItems {
			t.Fatalf("%d items passed the cap of %d", n, fuzzCaps.ResultItems)
		}
	})
}

// FuzzDecodeItem: one item, as results and tasks carry them: the caps and
// the decoder agree and never panic.
func FuzzDecodeItem(f *testing.F) {
	addSeeds(f, seedItem(), seedAudio(), &api.Item{Frame: &api.Frame{Width: 3, Height: 3, Bgr: make([]byte, 5)}},
		&api.Item{Audio: &api.Audio{Rate: 8000, Channels: 1, Pcm: []byte{1, 2, 3}}},
		&api.Item{Audio: &api.Audio{Rate: 8000, Channels: 2, Pcm: []byte{1, 2}}},
		&api.Item{Steps: []*api.Step{{}, {}, {Tracks: []*api.Track{{}, {}, {}, {}}}}},
		&api.Item{Frame: &api.Frame{Width: 3, Height: 3, Ref: &api.FrameRef{Holder: "gpu-a", Addr: "10.0.0.7:7071", Id: 9}}},
		&api.Item{Frame: &api.Frame{Width: 3, Height: 3, Bgr: make([]byte, 27), Ref: &api.FrameRef{Holder: "gpu-a"}}})
	f.Fuzz(func(t *testing.T, b []byte) {
		var p api.Item
		if err := proto.Unmarshal(b, &p); err != nil {
			return
		}
		checkItemAgrees(t, &p)
	})
}

// FuzzDecodeCoordinatorMessage: what a worker decodes from the
// coordinator (tasks, module loads with JSON params) never panics.
func FuzzDecodeCoordinatorMessage(f *testing.F) {
	addSeeds(f,
		&api.CoordinatorMessage{Msg: &api.CoordinatorMessage_Task{Task: &api.Task{Id: 1, App: "a", Module: "m", Items: []*api.Item{seedItem()}}}},
		&api.CoordinatorMessage{Msg: &api.CoordinatorMessage_Load{Load: &api.Load{Generation: 1, Modules: []*api.ModuleSpec{{App: "a", Module: "m", Kind: "op", ParamsJson: []byte(`{"k":1}`), LatencyNs: []int64{5}}}}}},
		&api.CoordinatorMessage{Msg: &api.CoordinatorMessage_Task{Task: &api.Task{Id: 2, App: "a", Module: "t", Kind: api.TaskKind_TASK_EXPORT, Stream: "cam"}}},
		&api.CoordinatorMessage{Msg: &api.CoordinatorMessage_Task{Task: &api.Task{Id: 3, App: "a", Module: "t", Kind: api.TaskKind_TASK_IMPORT, Stream: "cam", State: []byte("MDST\x01")}}},
		&api.CoordinatorMessage{Msg: &api.CoordinatorMessage_Task{Task: &api.Task{Id: 4, App: "a", Module: "t", Kind: api.TaskKind(7), Stream: "cam"}}},
		&api.CoordinatorMessage{Msg: &api.CoordinatorMessage_Task{Task: &api.Task{Id: 5, App: "a", Module: "t", Kind: api.TaskKind_TASK_CHECKPOINT, State: []byte{1}}}},
		&api.CoordinatorMessage{Msg: &api.CoordinatorMessage_Task{Task: &api.Task{Id: 6, App: "a", Module: "t", Items: []*api.Item{seedAudio(), seedItem()}}}})
	f.Fuzz(func(t *testing.T, b []byte) {
		var m api.CoordinatorMessage
		if err := proto.Unmarshal(b, &m); err != nil {
			return
		}
		if p := m.GetTask(); p != nil {
			tk, err := TaskFromPB(p)
			if err != nil {
				if err.Error() == "" {
					t.Fatal("empty error")
				}
			} else {
				if len(tk.Items) != len(p.Items) || tk.ID != p.Id || tk.Stream != p.Stream {
					t.Fatalf("task %v decoded as %+v", p, tk)
				}
				switch {
				case !tk.Kind.Valid() || int32(tk.Kind) != int32(p.Kind):
					t.Fatalf("kind %d decoded as %s", p.Kind, tk.Kind)
				case tk.Kind != worker.Run && tk.Stream == "":
					t.Fatalf("a %s task without a stream decoded", tk.Kind)
				case !bytes.Equal(tk.State, p.State) || len(tk.State) > MaxStateBytes || (len(tk.State) > 0 && tk.Kind != worker.Import):
					t.Fatalf("%d bytes of state on a %s task decoded as %d", len(p.State), tk.Kind, len(tk.State))
				}
			}
			for _, it := range tk.Items {
				if err == nil && it.Frame != nil && it.Frame.Valid() != nil {
					t.Fatal("invalid frame decoded")
				}
				if err == nil && it.Audio != nil && it.Audio.Valid() != nil {
					t.Fatal("invalid audio decoded")
				}
			}
		}
		for _, sp := range m.GetLoad().GetModules() {
			if _, err := SpecFromPB(sp); err != nil && err.Error() == "" {
				t.Fatal("empty error")
			}
		}
	})
}
