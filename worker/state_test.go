package worker

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/media"
	"github.com/mdag/mdag/modules"
)

// counterOp is a test-only stateful op: per stream, the frames and items
// it has seen. Each frame's output is one item whose Counts say both.
type counterOp struct {
	mu     sync.Mutex
	n      map[string][2]int
	closed int
}

func (c *counterOp) Process(*media.Item) ([]*media.Item, error) {
	return nil, errors.New("a stateful op runs frames (ProcessFrame)")
}

func (c *counterOp) ProcessFrame(stream string, _ uint64, items []*media.Item) ([]*media.Item, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.n[stream]
	n[0]++
	n[1] += len(items)
	c.n[stream] = n
	o := items[0].Derive()
	o.Counts = map[string]int{"frames": n[0], "items": n[1]}
	return []*media.Item{o}, nil
}

func (c *counterOp) Snapshot(stream string) ([]byte, error) {
	c.mu.Lock()
	n := c.n[stream]
	c.mu.Unlock()
	p := binary.BigEndian.AppendUint64(nil, uint64(n[0]))
	return modules.EncodeState("sequence", 1, binary.BigEndian.AppendUint64(p, uint64(n[1]))), nil
}

func (c *counterOp) Restore(stream string, state []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.n, stream)
	if len(state) == 0 {
		return nil
	}
	n, err := decodeCounter(state)
	if err != nil {
		return err
	}
	c.n[stream] = n
	return nil
}

func (c *counterOp) Close() {
	c.mu.Lock()
	c.closed++
	c.mu.Unlock()
}

func decodeCounter(state []byte) ([2]int, error) {
	v, p, err := modules.DecodeState("sequence", state)
	if err != nil {
		return [2]int{}, err
	}
	if v != 1 || len(p) != 16 {
		return [2]int{}, fmt.Errorf("counter state version %d with %d bytes, want 1 with 16", v, len(p))
	}
	return [2]int{int(binary.BigEndian.Uint64(p)), int(binary.BigEndian.Uint64(p[8:]))}, nil
}

// TestStatefulTasks runs one worker through a script of frame tasks and
// state operations on a stateful module (the test's "sequence" op, a
// counter per stream): frame tasks run all of one frame's items, outputs in
// Outputs[0]; Checkpoint snapshots and keeps, Export snapshots and
// forgets, Import restores (nil forgets) and a corrupt snapshot is a
// module error; a restart with a new pool size keeps every stream's state
// and closes the processor only once, at the end; what is malformed (a
// state task on a stateless or GPU module, a frame task mixing frames or
// with no items, an unknown kind) is BadTask with a detail saying why.
func TestStatefulTasks(t *testing.T) {
	defer goleak.VerifyNone(t)
	var built []*counterOp // each build is a fresh processor: state kept over a restart is the old one's
	ops := modules.NewRegistry()
	for name, f := range map[modules.OpID]modules.Factory{
		"sequence": func(modules.Params) (modules.Processor, error) {
			op := &counterOp{n: map[string][2]int{}}
			built = append(built, op)
			return op, nil
		},
		"sink": func(modules.Params) (modules.Processor, error) { return testOp{}, nil },
	} {
		if err := ops.Register(name, f); err != nil {
			t.Fatal(err)
		}
	}
	specs := func(conc int) []ModuleSpec {
		return []ModuleSpec{
			{App: "a", Module: "st", Kind: dag.CPU, Op: "sequence", Concurrency: conc},
			{App: "a", Module: "c", Kind: dag.CPU, Op: "sink", Concurrency: 1},
			{App: "a", Module: "g", Kind: dag.GPU, Model: "m", Latency: []time.Duration{time.Millisecond}, Concurrency: 1},
		}
	}
	results := make(chan Result, 16)
	w := NewWorker("w", "T", clock.NewFake(time.Unix(1e9, 0)), testExec{}, ops, func(r Result) { results <- r })
	if err := w.Load(specs(1)); err != nil {
		t.Fatal(err)
	}
	frame := func(stream string, seqs ...uint64) []*media.Item {
		out := make([]*media.Item, len(seqs))
		for i, s := range seqs {
			out[i] = &media.Item{Stream: stream, Seq: s, Labels: []string{fmt.Sprint(i)}}
		}
		return out
	}
	var saved []byte // the last Export's state
	for i, st := range []struct {
		name       string
		reload     int  // > 0: Load again first, the stateful module with this pool size
		importLast bool // the task's State is the last export's
		task       Task
		want       Outcome
		detail     string // in the detail
		counts     [2]int // Run, Done: frames and items in the output's counts
		state      [2]int // Export, Checkpoint, Done: the snapshot's counts
	}{
		{name: "frame of 3 items", task: Task{Module: "st", Items: frame("cam", 1, 1, 1)}, counts: [2]int{1, 3}},
		{name: "next frame", task: Task{Module: "st", Items: frame("cam", 2, 2)}, counts: [2]int{2, 5}},
		{name: "another stream", task: Task{Module: "st", Items: frame("door", 1)}, counts: [2]int{1, 1}},
		{name: "checkpoint", task: Task{Module: "st", Kind: Checkpoint, Stream: "cam"}, state: [2]int{2, 5}},
		{name: "checkpoint keeps", task: Task{Module: "st", Items: frame("cam", 3)}, counts: [2]int{3, 6}},
		{name: "restart with 3 in the pool keeps state", reload: 3, task: Task{Module: "st", Items: frame("cam", 4)}, counts: [2]int{4, 7}},
		{name: "restart keeps every stream", task: Task{Module: "st", Items: frame("door", 2)}, counts: [2]int{2, 2}},
		{name: "export", task: Task{Module: "st", Kind: Export, Stream: "cam"}, state: [2]int{4, 7}},
		{name: "export forgets", task: Task{Module: "st", Items: frame("cam", 5)}, counts: [2]int{1, 1}},
		{name: "import", importLast: true, task: Task{Module: "st", Kind: Import, Stream: "cam"}},
		{name: "import continues", task: Task{Module: "st", Items: frame("cam", 6)}, counts: [2]int{5, 8}},
		{name: "import nil forgets", task: Task{Module: "st", Kind: Import, Stream: "cam"}},
		{name: "fresh after forgetting", task: Task{Module: "st", Items: frame("cam", 7)}, counts: [2]int{1, 1}},
		{name: "never seen: empty state", task: Task{Module: "st", Kind: Checkpoint, Stream: "yard"}, state: [2]int{0, 0}},
		{name: "corrupt import", task: Task{Module: "st", Kind: Import, Stream: "cam", State: []byte("MDST garbage")}, want: ModuleError, detail: "bad state snapshot for op sequence"},
		{name: "corrupt import leaves it fresh", task: Task{Module: "st", Items: frame("cam", 8)}, counts: [2]int{1, 1}},
		{name: "frame mixing frames", task: Task{Module: "st", Items: frame("cam", 9, 10)}, want: BadTask, detail: "mixes frames (cam/9 and cam/10)"},
		{name: "frame mixing streams", task: Task{Module: "st", Items: append(frame("cam", 9), frame("door", 9)...)}, want: BadTask, detail: "mixes frames (cam/9 and door/9)"},
		{name: "frame without items", task: Task{Module: "st"}, want: BadTask, detail: "a frame task with no items"},
		{name: "unknown kind", task: Task{Module: "st", Kind: TaskKind(9), Stream: "cam"}, want: BadTask, detail: "unknown task kind 9"},
		{name: "export of a stateless module", task: Task{Module: "c", Kind: Export, Stream: "cam"}, want: BadTask, detail: "export task for module a/c, which keeps no per-stream state (op sink)"},
		{name: "import on a GPU module", task: Task{Module: "g", Kind: Import, Stream: "cam"}, want: BadTask, detail: "import task for GPU module a/g"},
		{name: "stateless module runs on", task: Task{Module: "c", Items: frame("cam", 1, 1)}},
	} {
		if st.reload > 0 {
			if err := w.Load(specs(st.reload)); err != nil {
				t.Fatalf("step %d (%s): %v", i, st.name, err)
			}
		}
		tk := st.task
		tk.ID, tk.App = uint64(i+1), "a"
		if st.importLast {
			tk.State = saved
		}
		w.Submit(tk)
		var got Result
		for found := false; !found; {
			select {
			case got = <-results:
				found = got.Task == tk.ID
			case <-time.After(10 * time.Second):
				t.Fatalf("step %d (%s): no result", i, st.name)
			}
		}
		if got.Outcome != st.want || !strings.Contains(got.Detail, st.detail) || (st.want == Done) != (got.Detail == "") {
			t.Fatalf("step %d (%s): %s %q, want %s with %q", i, st.name, got.Outcome, got.Detail, st.want, st.detail)
		}
		if got.Outcome != Done {
			continue
		}
		switch {
		case tk.Kind == Run && tk.Module == "st":
			if len(got.Outputs) != len(tk.Items) || len(got.Outputs[0]) != 1 {
				t.Fatalf("step %d (%s): outputs %v, want %d lists, one item in the first", i, st.name, got.Outputs, len(tk.Items))
			}
			for j, l := range got.Outputs[1:] {
				if len(l) != 0 {
					t.Errorf("step %d (%s): output %d has %d items, want none (a frame's outputs are in the first)", i, st.name, j+1, len(l))
				}
			}
			o := got.Outputs[0][0]
			if c := [2]int{o.Counts["frames"], o.Counts["items"]}; c != st.counts || o.Stream != tk.Items[0].Stream || o.Seq != tk.Items[0].Seq {
				t.Errorf("step %d (%s): %s/%d counts %v, want %s/%d %v", i, st.name, o.Stream, o.Seq, c, tk.Items[0].Stream, tk.Items[0].Seq, st.counts)
			}
		case tk.Kind == Export || tk.Kind == Checkpoint:
			c, err := decodeCounter(got.State)
			if err != nil || c != st.state {
				t.Errorf("step %d (%s): state %v %v, want %v", i, st.name, c, err, st.state)
			}
			saved = got.State
		case tk.Kind == Import && got.State != nil:
			t.Errorf("step %d (%s): an import returned %d bytes of state", i, st.name, len(got.State))
		}
	}
	w.Close()
	if len(built) != 1 {
		t.Fatalf("%d stateful processors built, want 1 (the restart keeps it)", len(built))
	}
	op := built[0]
	op.mu.Lock()
	defer op.mu.Unlock()
	if op.closed != 1 {
		t.Errorf("the stateful processor was closed %d times, want once (at Close, not at the restart)", op.closed)
	}
}

// TestStatefulProcessorRequired: an op declared stateful whose processor
// cannot snapshot fails to load, saying so.
func TestStatefulProcessorRequired(t *testing.T) {
	defer goleak.VerifyNone(t)
	ops := modules.NewRegistry()
	if err := ops.Register("window", func(modules.Params) (modules.Processor, error) { return testOp{}, nil }); err != nil {
		t.Fatal(err)
	}
	w := NewWorker("w", "T", clock.NewFake(time.Unix(1e9, 0)), nil, ops, func(Result) {})
	defer w.Close()
	err := w.Load([]ModuleSpec{{App: "a", Module: "win", Kind: dag.CPU, Op: "window", Concurrency: 1}})
	if err == nil || !strings.Contains(err.Error(), "op window keeps per-stream state but its processor cannot snapshot it") {
		t.Fatalf("load: %v", err)
	}
}
