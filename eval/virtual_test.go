package eval

import (
	"strings"
	"testing"
	"time"

	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/media"
	"github.com/mdag/mdag/modules"
	"github.com/mdag/mdag/profile"
	"github.com/mdag/mdag/worker"
)

// vharness is a virtual instance whose results are collected (no engine).
type vharness struct {
	clk  *clock.Fake
	in   *vinst
	got  []worker.Result
	when []time.Duration
}

func newVHarness(t *testing.T, specs ...worker.ModuleSpec) *vharness {
	t.Helper()
	h := &vharness{clk: clock.NewFake(start)}
	p := &provisioner{clk: h.clk, limits: map[profile.WorkerTypeID]int{"X": 1}, prices: map[profile.WorkerTypeID]float64{"X": 1},
		ops: modules.Builtin(), insts: map[string]*vinst{}, bill: newBill(start.Add(time.Hour), nil)}
	inst, err := p.Start("X-0", "X")
	if err != nil {
		t.Fatal(err)
	}
	h.in = inst.(*vinst)
	h.in.result = func(r worker.Result) {
		h.got = append(h.got, r)
		h.when = append(h.when, h.clk.Now().Sub(start))
	}
	if err := h.in.Load(specs); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Start("X-1", "X"); err == nil || !strings.Contains(err.Error(), "limit 1") {
		t.Fatalf("a second instance over the limit: %v", err)
	}
	return h
}

func (h *vharness) run() { h.clk.Set(start.Add(time.Hour)) }

func items(n int) []*media.Item {
	var out []*media.Item
	for i := range n {
		b := []media.Box{{X: 1, Y: 1, W: 8, H: 8, Class: "person", Score: 1}}
		out = append(out, &media.Item{Stream: "s", Seq: uint64(i), Frame: media.NewFrame(frameW, frameH), Truth: b, Boxes: b})
	}
	return out
}

// GPU batches take l(b) on the first free device slot, not before their
// window opens, and are rejected when they cannot start by its end.
func TestVirtualGPU(t *testing.T) {
	ms := time.Millisecond
	h := newVHarness(t, worker.ModuleSpec{App: "a", Module: "m", Kind: dag.GPU, Model: "net", Concurrency: 1,
		Latency: []time.Duration{10 * ms, 15 * ms}})
	at := func(d time.Duration) time.Time { return start.Add(d) }
	h.in.Submit(worker.Task{ID: 1, App: "a", Module: "m", Items: items(2)})                                   // 0-15
	h.in.Submit(worker.Task{ID: 2, App: "a", Module: "m", Items: items(1), Earliest: at(20 * ms)})            // 20-30
	h.in.Submit(worker.Task{ID: 3, App: "a", Module: "m", Items: items(1), Latest: at(25 * ms)})              // would start at 30: rejected at 30
	h.in.Submit(worker.Task{ID: 4, App: "a", Module: "m", Items: items(3)})                                   // no l(3)
	h.in.Submit(worker.Task{ID: 5, App: "b", Module: "m", Items: items(1)})                                   // not loaded
	h.in.Submit(worker.Task{ID: 6, App: "a", Module: "m", Items: items(1), Kind: worker.Export, Stream: "s"}) // not for GPU modules
	h.run()
	want := map[uint64]struct {
		o  worker.Outcome
		at time.Duration
	}{1: {worker.Done, 15 * ms}, 2: {worker.Done, 30 * ms}, 3: {worker.Rejected, 30 * ms}, 4: {worker.ExecutorError, 30 * ms},
		5: {worker.NotLoaded, 0}, 6: {worker.BadTask, 0}}
	if len(h.got) != len(want) {
		t.Fatalf("%d results, want %d", len(h.got), len(want))
	}
	for i, r := range h.got {
		w := want[r.Task]
		if r.Outcome != w.o || h.when[i] != w.at {
			t.Errorf("task %d: %v at %v, want %v at %v (%s)", r.Task, r.Outcome, h.when[i], w.o, w.at, r.Detail)
		}
		if r.Task == 1 && (len(r.Outputs) != 2 || len(r.Outputs[0][0].Boxes) != 1 || r.Measured != 15*ms) {
			t.Errorf("task 1: outputs %v, measured %v: want each frame's truth as detections, 15ms", r.Outputs, r.Measured)
		}
	}
}

// CPU tasks run the real op (crop: one item per box), take the profiled
// time per item on the first free pool slot, and a module holding 8 tasks
// per slot that have not started answers queue-full.
func TestVirtualCPU(t *testing.T) {
	ms := time.Millisecond
	h := newVHarness(t, worker.ModuleSpec{App: "a", Module: "crop", Kind: dag.CPU, Op: "crop", Concurrency: 2,
		Latency: []time.Duration{4 * ms}})
	for id := uint64(1); id <= 20; id++ {
		h.in.Submit(worker.Task{ID: id, App: "a", Module: "crop", Items: items(1)})
	}
	h.run()
	full, done := 0, 0
	last := time.Duration(0)
	for i, r := range h.got {
		switch r.Outcome {
		case worker.QueueFull:
			full++
		case worker.Done:
			done++
			last = max(last, h.when[i])
			if len(r.Outputs) != 1 || len(r.Outputs[0]) != 1 || r.Outputs[0][0].Region == nil {
				t.Fatalf("task %d: outputs %v: want the crop of its one box", r.Task, r.Outputs)
			}
		default:
			t.Fatalf("task %d: %v %s", r.Task, r.Outcome, r.Detail)
		}
	}
	// 2 start at once, 16 queue, 2 are refused; 18 tasks on 2 slots of 4 ms.
	if done != 18 || full != 2 || last != 36*ms {
		t.Fatalf("done %d, queue-full %d, last at %v; want 18, 2, 36ms", done, full, last)
	}
}

// A stateful op's tasks go through worker.RunStateTask: frames, then its
// state leaves (Export) and comes back (Import) on another instance.
func TestVirtualStateful(t *testing.T) {
	spec := worker.ModuleSpec{App: "a", Module: "track", Kind: dag.CPU, Op: "track", Concurrency: 1, Latency: []time.Duration{time.Millisecond}}
	h := newVHarness(t, spec)
	it := items(1)[0]
	it.Region = &media.Box{X: 1, Y: 1, W: 8, H: 8, Class: "person"}
	h.in.Submit(worker.Task{ID: 1, App: "a", Module: "track", Items: []*media.Item{it}})
	h.in.Submit(worker.Task{ID: 2, App: "a", Module: "track", Kind: worker.Export, Stream: "s"})
	h.run()
	if len(h.got) != 2 || h.got[0].Outcome != worker.Done || h.got[1].Outcome != worker.Done || len(h.got[1].State) == 0 {
		t.Fatalf("results %+v", h.got)
	}
	g := newVHarness(t, spec)
	g.in.Submit(worker.Task{ID: 3, App: "a", Module: "track", Kind: worker.Import, Stream: "s", State: h.got[1].State})
	g.run()
	if len(g.got) != 1 || g.got[0].Outcome != worker.Done {
		t.Fatalf("import: %+v", g.got)
	}
	// Closed: later tasks answer unloaded.
	g.in.Close()
	g.in.Submit(worker.Task{ID: 4, App: "a", Module: "track", Items: []*media.Item{it}})
	g.run()
	if r := g.got[len(g.got)-1]; r.Task != 4 || r.Outcome != worker.Unloaded {
		t.Fatalf("after Close: %+v", r)
	}
}
