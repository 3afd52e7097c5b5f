package wire

import (
	"errors"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/mdag/mdag/api"
	"github.com/mdag/mdag/worker"
)

// fuzzCaps are small caps so that the fuzzer reaches both sides of each.
var fuzzCaps = Caps{FrameW: 8, FrameH: 6, Boxes: 3, ResultItems: 4}

func seedItem() *api.Item {
	return &api.Item{Stream: "cam", Seq: 3, CaptureUnixNs: 1, Frame: &api.Frame{Width: 2, Height: 2, Bgr: make([]byte, 12)},
		Boxes: []*api.Box{{X: 1, Y: 1, W: 1, H: 1, Class: "car", Score: 0.5}}, Truth: []*api.Box{{W: 2, H: 2, Class: "car"}},
		Labels: []string{"x"}, Counts: map[string]int64{"car": 1}, Region: &api.Box{W: 1, H: 1}}
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
	case capErr == nil && f.Valid() != nil:
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
		&api.WorkerMessage{Msg: &api.WorkerMessage_Result{Result: &api.Result{Task: 9, Outcome: api.Outcome(77), Detail: "d"}}})
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
			return
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
	addSeeds(f, seedItem(), &api.Item{Frame: &api.Frame{Width: 3, Height: 3, Bgr: make([]byte, 5)}})
	f.Fuzz(func(t *testing.T, b []byte) {
		var p api.Item
		if err := proto.Unmarshal(b, &p); err != nil {
			return
		}
		checkFrameAgrees(t, p.Frame)
		_ = fuzzCaps.CheckItem(&p)
		it, err := ItemFromPB(&p)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("empty error")
			}
			return
		}
		if it.Stream != p.Stream || it.Seq != p.Seq || len(it.Boxes) != len(p.Boxes) || len(it.Truth) != len(p.Truth) || (p.Region != nil) != (it.Region != nil) {
			t.Fatalf("item %+v decoded as %+v", &p, it)
		}
	})
}

// FuzzDecodeCoordinatorMessage: what a worker decodes from the
// coordinator (tasks, module loads with JSON params) never panics.
func FuzzDecodeCoordinatorMessage(f *testing.F) {
	addSeeds(f,
		&api.CoordinatorMessage{Msg: &api.CoordinatorMessage_Task{Task: &api.Task{Id: 1, App: "a", Module: "m", Items: []*api.Item{seedItem()}}}},
		&api.CoordinatorMessage{Msg: &api.CoordinatorMessage_Load{Load: &api.Load{Generation: 1, Modules: []*api.ModuleSpec{{App: "a", Module: "m", Kind: "op", ParamsJson: []byte(`{"k":1}`), LatencyNs: []int64{5}}}}}})
	f.Fuzz(func(t *testing.T, b []byte) {
		var m api.CoordinatorMessage
		if err := proto.Unmarshal(b, &m); err != nil {
			return
		}
		if p := m.GetTask(); p != nil {
			tk, err := TaskFromPB(p)
			if err == nil && len(tk.Items) != len(p.Items) {
				t.Fatalf("%d items decoded from %d", len(tk.Items), len(p.Items))
			}
			for _, it := range tk.Items {
				if err == nil && it.Frame != nil && it.Frame.Valid() != nil {
					t.Fatal("invalid frame decoded")
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
