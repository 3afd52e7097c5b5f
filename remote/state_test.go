package remote

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mdag/mdag/coordinator"
	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/media"
	"github.com/mdag/mdag/modules"
	"github.com/mdag/mdag/profile"
	"github.com/mdag/mdag/remote/client"
	"github.com/mdag/mdag/worker"
)

// seqCounter is a test-only stateful op (registered as "sequence" in the
// test's own registry, so the wire is tested apart from the real ops): per
// stream, the frames and items it has seen, the last frames' seqs, and an
// opaque blob an import may carry (the benchmark's state size). A frame's
// output is one item carrying all of that in the fields issue 23 added
// (counts, steps, tracks, events) and the frame's labels, boxes and audio.
type seqCounter struct {
	mu sync.Mutex
	s  map[string]*counterState
}

type counterState struct {
	frames, items uint64
	seqs          []uint64 // the last four frames'
	blob          []byte
}

func newSeqCounter(modules.Params) (modules.Processor, error) {
	return &seqCounter{s: map[string]*counterState{}}, nil
}

func (c *seqCounter) Process(*media.Item) ([]*media.Item, error) {
	return nil, errors.New("sequence runs whole frames (ProcessFrame)")
}

func (c *seqCounter) ProcessFrame(stream string, seq uint64, items []*media.Item) ([]*media.Item, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.s[stream]
	if st == nil {
		st = &counterState{}
		c.s[stream] = st
	}
	st.frames++
	st.items += uint64(len(items))
	st.seqs = append(st.seqs, seq)
	if len(st.seqs) > 4 {
		st.seqs = st.seqs[1:]
	}
	o := items[0].Derive()
	o.Counts = map[string]int{"frames": int(st.frames), "items": int(st.items)}
	for _, s := range st.seqs {
		o.Steps = append(o.Steps, media.Step{Seq: s})
	}
	for _, it := range items {
		o.Labels = append(o.Labels, it.Labels...)
		o.Boxes = append(o.Boxes, it.Boxes...)
		if it.Audio != nil {
			o.Audio = it.Audio
		}
	}
	o.Tracks = []media.Track{{ID: st.frames, Age: int(st.frames), Hits: int(st.items)}}
	if len(o.Boxes) > 0 {
		o.Tracks[0].Box = o.Boxes[0]
	}
	o.Events = []media.Event{{Kind: "count", Rule: "test", Track: st.frames, Detail: fmt.Sprintf("%d items", len(items))}}
	return []*media.Item{o}, nil
}

func (c *seqCounter) Snapshot(stream string) ([]byte, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.s[stream]
	if st == nil {
		st = &counterState{}
	}
	p := binary.BigEndian.AppendUint64(nil, st.frames)
	p = binary.BigEndian.AppendUint64(p, st.items)
	p = append(p, byte(len(st.seqs)))
	for _, s := range st.seqs {
		p = binary.BigEndian.AppendUint64(p, s)
	}
	return modules.EncodeState("sequence", 1, append(p, st.blob...)), nil
}

func (c *seqCounter) Restore(stream string, state []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.s, stream)
	if len(state) == 0 {
		return nil
	}
	st, err := decodeCounterState(state)
	if err != nil {
		return err
	}
	c.s[stream] = st
	return nil
}

func (c *seqCounter) Close() {}

func decodeCounterState(state []byte) (*counterState, error) {
	v, p, err := modules.DecodeState("sequence", state)
	if err != nil {
		return nil, err
	}
	if v != 1 || len(p) < 17 || len(p) < 17+8*int(p[16]) {
		return nil, fmt.Errorf("sequence state version %d with %d bytes: want version 1, at least 17 bytes and the seqs it counts", v, len(p))
	}
	st := &counterState{frames: binary.BigEndian.Uint64(p), items: binary.BigEndian.Uint64(p[8:])}
	n := int(p[16])
	for i := range n {
		st.seqs = append(st.seqs, binary.BigEndian.Uint64(p[17+8*i:]))
	}
	st.blob = slices.Clone(p[17+8*n:])
	return st, nil
}

// counterSnapshot is a snapshot of the counter with a blob of n bytes.
func counterSnapshot(n int) []byte {
	p := binary.BigEndian.AppendUint64(nil, 1)
	p = binary.BigEndian.AppendUint64(p, 1)
	p = append(p, 1)
	p = binary.BigEndian.AppendUint64(p, 1)
	return modules.EncodeState("sequence", 1, append(p, make([]byte, n)...))
}

// statefulOps is the workers' registry: the counter as "sequence" and a
// stateless op as "sink".
func statefulOps() *modules.Registry {
	r := modules.NewRegistry()
	modules.Must(r.Register("sequence", newSeqCounter))
	modules.Must(r.Register("sink", func(modules.Params) (modules.Processor, error) { return sinkOp{}, nil }))
	return r
}

type sinkOp struct{}

func (sinkOp) Process(it *media.Item) ([]*media.Item, error) { return []*media.Item{it}, nil }
func (sinkOp) Close()                                        {}

// standIn takes the engine's place behind a Server (Server.insts): it
// holds the connected workers' instances and hands their results to the
// test, so tasks of every kind go to a chosen worker over the wire.
type standIn struct {
	mu      sync.Mutex
	insts   map[string]coordinator.Instance
	results chan fromWorker
}

type fromWorker struct {
	inst string
	r    worker.Result
}

func (f *standIn) WorkerTypes() map[profile.WorkerTypeID]bool {
	return map[profile.WorkerTypeID]bool{"CPU": true}
}

func (f *standIn) AddInstance(id string, _ profile.WorkerTypeID, inst coordinator.Instance) {
	f.mu.Lock()
	f.insts[id] = inst
	f.mu.Unlock()
}

func (f *standIn) LostInstance(id, _ string) {
	f.mu.Lock()
	delete(f.insts, id)
	f.mu.Unlock()
}

func (f *standIn) Result(inst string, r worker.Result) { f.results <- fromWorker{inst, r} }

func (f *standIn) instance(id string) coordinator.Instance {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.insts[id]
}

// stateRig is a Server with a standIn on loopback gRPC and the remote
// workers connected to it.
type stateRig struct {
	srv  *Server
	fake *standIn
	cc   interface{ Close() error }
	run  func(ctx context.Context, cfg client.WorkerConfig) error
	next uint64
}

// startStateRig serves srv (its Limits as the test sets them) with a
// stand-in engine, and connects workers with the given IDs, each hosting
// the stateful module a/st (op sequence, pool of 2) and the stateless a/c.
func startStateRig(t testing.TB, srv *Server, workers ...string) *stateRig {
	t.Helper()
	fake := &standIn{insts: map[string]coordinator.Instance{}, results: make(chan fromWorker, 64)}
	srv.insts = fake
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := NewGRPC(srv)
	go func() { _ = g.Serve(ln) }()
	cc, err := client.Dial(ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	r := &stateRig{srv: srv, fake: fake, cc: cc}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		cc.Close()
		g.Stop()
	})
	for _, id := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = client.RunWorker(ctx, cc, client.WorkerConfig{ID: id, Type: "CPU", Ops: statefulOps()})
		}()
		waitFor(t, "worker "+id+" to register", 10*time.Second, func() bool { return fake.instance(id) != nil })
		err := fake.instance(id).Load([]worker.ModuleSpec{
			{App: "a", Module: "st", Kind: dag.CPU, Op: "sequence", Concurrency: 2, Latency: []time.Duration{time.Millisecond}},
			{App: "a", Module: "c", Kind: dag.CPU, Op: "sink", Concurrency: 1, Latency: []time.Duration{time.Millisecond}},
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return r
}

// do sends t to worker id and waits for its result. The load before it
// went down the same stream first, so the module is there.
func (r *stateRig) do(t testing.TB, id string, tk worker.Task) worker.Result {
	t.Helper()
	r.next++
	tk.ID, tk.App = r.next, "a"
	r.fake.instance(id).Submit(tk)
	for {
		select {
		case got := <-r.fake.results:
			if got.r.Task != tk.ID {
				t.Fatalf("result for task %d from %s while waiting for %d", got.r.Task, got.inst, tk.ID)
			}
			if got.inst != id {
				t.Fatalf("task %d answered by %s, sent to %s", tk.ID, got.inst, id)
			}
			return got.r
		case <-time.After(10 * time.Second):
			t.Fatalf("no result for task %d (%s on %s)", tk.ID, tk.Kind, id)
		}
	}
}

// frameItems is one frame's items: labels l0.., a box each, the first
// with a stereo audio chunk.
func frameItems(stream string, seq uint64, n int) []*media.Item {
	out := make([]*media.Item, n)
	for i := range out {
		out[i] = &media.Item{Stream: stream, Seq: seq, Capture: time.Unix(int64(seq), 0), Labels: []string{fmt.Sprintf("l%d", i)},
			Boxes: []media.Box{{X: i, W: 2, H: 2, Class: "car", Score: 0.5}}, Tracks: []media.Track{{ID: uint64(i + 1)}}}
	}
	out[0].Audio = &media.Audio{Rate: 16000, Channels: 2, PCM: []int16{int16(seq), -1, 32767, -32768}}
	return out
}

// TestRemoteStatefulModule: a stateful module on remote workers, through
// the coordinator's side of the transport (Server, its conn as the
// engine's Instance) and the worker's (client.RunWorker): a frame task of
// several items runs as one frame, its outputs (with the new item fields:
// steps, tracks, events, audio) in Outputs[0]; Checkpoint returns the
// state and keeps it; Export returns it and forgets it; Import on ANOTHER
// worker restores it and that worker's next frame continues the count;
// what a worker cannot do (a state task for a stateless module, a frame
// mixing frames, a kind it does not know, a state task without a stream,
// a corrupt snapshot) comes back as BadTask or ModuleError with a detail.
func TestRemoteStatefulModule(t *testing.T) {
	r := startStateRig(t, &Server{Heartbeat: time.Second}, "w-a", "w-b")
	var saved []byte
	for i, st := range []struct {
		name       string
		on         string
		task       worker.Task
		importLast bool
		want       worker.Outcome
		detail     string   // in the detail
		counts     [2]int   // Run of st, Done: frames and items counted
		seqs       []uint64 // ... and the steps' seqs
		state      [2]int   // Export, Checkpoint, Done: the snapshot's counts
	}{
		{name: "frame of 3 items", on: "w-a", task: worker.Task{Module: "st", Items: frameItems("cam", 1, 3)}, counts: [2]int{1, 3}, seqs: []uint64{1}},
		{name: "next frame", on: "w-a", task: worker.Task{Module: "st", Items: frameItems("cam", 2, 2)}, counts: [2]int{2, 5}, seqs: []uint64{1, 2}},
		{name: "another stream", on: "w-a", task: worker.Task{Module: "st", Items: frameItems("door", 7, 1)}, counts: [2]int{1, 1}, seqs: []uint64{7}},
		{name: "checkpoint", on: "w-a", task: worker.Task{Module: "st", Kind: worker.Checkpoint, Stream: "cam"}, state: [2]int{2, 5}},
		{name: "export", on: "w-a", task: worker.Task{Module: "st", Kind: worker.Export, Stream: "cam"}, state: [2]int{2, 5}},
		{name: "export forgot it", on: "w-a", task: worker.Task{Module: "st", Items: frameItems("cam", 3, 1)}, counts: [2]int{1, 1}, seqs: []uint64{3}},
		{name: "other streams stay", on: "w-a", task: worker.Task{Module: "st", Items: frameItems("door", 8, 1)}, counts: [2]int{2, 2}, seqs: []uint64{7, 8}},
		{name: "import on another worker", on: "w-b", importLast: true, task: worker.Task{Module: "st", Kind: worker.Import, Stream: "cam"}},
		{name: "its next frame continues", on: "w-b", task: worker.Task{Module: "st", Items: frameItems("cam", 3, 2)}, counts: [2]int{3, 7}, seqs: []uint64{1, 2, 3}},
		{name: "checkpoint there", on: "w-b", task: worker.Task{Module: "st", Kind: worker.Checkpoint, Stream: "cam"}, state: [2]int{3, 7}},
		{name: "state task on a stateless module", on: "w-b", task: worker.Task{Module: "c", Kind: worker.Export, Stream: "cam"}, want: worker.BadTask,
			detail: "export task for module a/c, which keeps no per-stream state (op sink)"},
		{name: "frame mixing frames", on: "w-b", task: worker.Task{Module: "st", Items: append(frameItems("cam", 4, 1), frameItems("cam", 5, 1)...)}, want: worker.BadTask,
			detail: "a frame task mixes frames (cam/4 and cam/5)"},
		{name: "unknown kind", on: "w-b", task: worker.Task{Module: "st", Kind: worker.TaskKind(9), Stream: "cam"}, want: worker.BadTask,
			detail: "unknown task kind 9 on the wire"},
		{name: "state task without a stream", on: "w-b", task: worker.Task{Module: "st", Kind: worker.Export}, want: worker.BadTask,
			detail: "a export task names no stream"},
		{name: "corrupt snapshot", on: "w-b", task: worker.Task{Module: "st", Kind: worker.Import, Stream: "cam", State: []byte("MDST\x01not a snapshot")}, want: worker.ModuleError,
			detail: "bad state snapshot for op sequence"},
		{name: "stateless module runs on", on: "w-b", task: worker.Task{Module: "c", Items: frameItems("cam", 6, 2)}},
	} {
		tk := st.task
		if st.importLast {
			tk.State = saved
		}
		got := r.do(t, st.on, tk)
		if got.Outcome != st.want || !strings.Contains(got.Detail, st.detail) || (st.want == worker.Done) != (got.Detail == "") {
			t.Fatalf("step %d (%s): %s %q, want %s with %q", i, st.name, got.Outcome, got.Detail, st.want, st.detail)
		}
		if got.Outcome != worker.Done {
			continue
		}
		switch {
		case tk.Kind == worker.Run && tk.Module == "st":
			checkFrameOutput(t, fmt.Sprintf("step %d (%s)", i, st.name), tk.Items, got, st.counts, st.seqs)
		case tk.Kind == worker.Export || tk.Kind == worker.Checkpoint:
			cs, err := decodeCounterState(got.State)
			if err != nil || [2]int{int(cs.frames), int(cs.items)} != st.state {
				t.Fatalf("step %d (%s): state %+v %v, want counts %v", i, st.name, cs, err, st.state)
			}
			saved = got.State
		case tk.Kind == worker.Run:
			if len(got.Outputs) != len(tk.Items) || len(got.Outputs[1]) != 1 || got.State != nil {
				t.Errorf("step %d (%s): %d output lists, %d bytes of state; want one list per item, no state", i, st.name, len(got.Outputs), len(got.State))
			}
		case got.State != nil:
			t.Errorf("step %d (%s): an import returned %d bytes of state", i, st.name, len(got.State))
		}
	}
}

// checkFrameOutput checks a frame task's result: one output list per
// item, the frame's one output item in the first, carrying the counts,
// the steps' seqs, the frame's labels and boxes, a track, an event and the
// audio chunk, all as they crossed the wire.
func checkFrameOutput(t *testing.T, step string, in []*media.Item, got worker.Result, counts [2]int, seqs []uint64) {
	t.Helper()
	if len(got.Outputs) != len(in) || len(got.Outputs[0]) != 1 || got.State != nil {
		t.Fatalf("%s: outputs %v with %d bytes of state; want %d lists, one item in the first, no state", step, got.Outputs, len(got.State), len(in))
	}
	for j, l := range got.Outputs[1:] {
		if len(l) != 0 {
			t.Errorf("%s: output %d has %d items, want none", step, j+1, len(l))
		}
	}
	o := got.Outputs[0][0]
	var gotSeqs []uint64
	for _, s := range o.Steps {
		gotSeqs = append(gotSeqs, s.Seq)
	}
	var labels []string
	var boxes []media.Box
	for _, it := range in {
		labels = append(labels, it.Labels...)
		boxes = append(boxes, it.Boxes...)
	}
	switch {
	case o.Stream != in[0].Stream || o.Seq != in[0].Seq || !o.Capture.Equal(in[0].Capture):
		t.Errorf("%s: output of %s/%d at %v, want %s/%d at %v", step, o.Stream, o.Seq, o.Capture, in[0].Stream, in[0].Seq, in[0].Capture)
	case [2]int{o.Counts["frames"], o.Counts["items"]} != counts:
		t.Errorf("%s: counts %v, want frames and items %v", step, o.Counts, counts)
	case !slices.Equal(gotSeqs, seqs):
		t.Errorf("%s: steps %v, want seqs %v", step, gotSeqs, seqs)
	case !slices.Equal(o.Labels, labels) || !slices.Equal(o.Boxes, boxes):
		t.Errorf("%s: labels %v boxes %v, want %v %v", step, o.Labels, o.Boxes, labels, boxes)
	case len(o.Tracks) != 1 || o.Tracks[0] != (media.Track{ID: uint64(counts[0]), Box: boxes[0], Age: counts[0], Hits: counts[1]}):
		t.Errorf("%s: tracks %+v", step, o.Tracks)
	case len(o.Events) != 1 || o.Events[0] != (media.Event{Kind: "count", Rule: "test", Track: uint64(counts[0]), Detail: fmt.Sprintf("%d items", len(in))}):
		t.Errorf("%s: events %+v", step, o.Events)
	case o.Audio == nil || o.Audio.Rate != in[0].Audio.Rate || o.Audio.Channels != 2 || !slices.Equal(o.Audio.PCM, in[0].Audio.PCM):
		t.Errorf("%s: audio %+v, want %+v", step, o.Audio, in[0].Audio)
	}
}

// TestRemoteStateCaps: the coordinator's caps on what a stateful module's
// results carry: a snapshot over MaxStateBytes, or an output item over
// MaxLabels, is refused (counted under its reason) and accounted as
// BadResult saying so; one inside them passes.
func TestRemoteStateCaps(t *testing.T) {
	r := startStateRig(t, &Server{Heartbeat: time.Second, Limits: Limits{MaxStateBytes: 200, MaxLabels: 2}}, "w-a")
	for i, st := range []struct {
		name   string
		task   worker.Task
		want   worker.Outcome
		detail string
	}{
		{"small state in", worker.Task{Module: "st", Kind: worker.Import, Stream: "s", State: counterSnapshot(100)}, worker.Done, ""},
		{"small state out", worker.Task{Module: "st", Kind: worker.Checkpoint, Stream: "s"}, worker.Done, ""},
		// Imports go down: the coordinator's caps bound what comes up.
		{"large state in", worker.Task{Module: "st", Kind: worker.Import, Stream: "s", State: counterSnapshot(300)}, worker.Done, ""},
		{"large state out", worker.Task{Module: "st", Kind: worker.Export, Stream: "s"}, worker.BadResult,
			"refused by the coordinator: state snapshot over the size limit: task 4 has 349 bytes of state, the limit is 200"},
		{"labels inside the cap", worker.Task{Module: "st", Items: frameItems("s", 1, 2)}, worker.Done, ""},
		{"labels over the cap", worker.Task{Module: "st", Items: frameItems("s", 2, 3)}, worker.BadResult,
			"refused by the coordinator: task 6 output 0 item 0: too many labels: 3 labels on one item, the limit is 2"},
	} {
		got := r.do(t, "w-a", st.task)
		if got.Outcome != st.want || got.Detail != st.detail {
			t.Errorf("step %d (%s): %s %q, want %s %q", i, st.name, got.Outcome, got.Detail, st.want, st.detail)
		}
	}
	ref := r.srv.Refused()
	if ref[RefusedStateSize] != 1 || ref[RefusedItemContent] != 1 {
		t.Errorf("refusals %v: want one state-size and one item-content", ref)
	}
}

// BenchmarkStateMove: one move of a stream's state, Export on one worker
// then Import of its bytes on another, for a snapshot of about 4 KiB and
// 64 KiB: two in-process workers (worker.Worker, as the embedded engine
// runs them) against two remote workers behind loopback gRPC (each task
// and each result crossing the wire, the state both ways). ns/op is one
// move.
func BenchmarkStateMove(b *testing.B) {
	for _, size := range []int{4 << 10, 64 << 10} {
		state := counterSnapshot(size)
		b.Run(fmt.Sprintf("in-process/%dKiB", size>>10), func(b *testing.B) {
			results := make(chan worker.Result, 1)
			var ws [2]*worker.Worker
			for i := range ws {
				ws[i] = worker.NewWorker(fmt.Sprint("w", i), "CPU", clock.Real{}, nil, statefulOps(), func(r worker.Result) { results <- r })
				b.Cleanup(ws[i].Close)
				if err := ws[i].Load([]worker.ModuleSpec{{App: "a", Module: "st", Kind: dag.CPU, Op: "sequence", Concurrency: 2}}); err != nil {
					b.Fatal(err)
				}
			}
			do := func(w *worker.Worker, tk worker.Task) worker.Result {
				tk.App, tk.Module = "a", "st"
				w.Submit(tk)
				r := <-results
				if r.Outcome != worker.Done {
					b.Fatalf("%s: %s %s", tk.Kind, r.Outcome, r.Detail)
				}
				return r
			}
			benchMoves(b, state, func(from, to int) []byte {
				ex := do(ws[from], worker.Task{Kind: worker.Export, Stream: "cam"})
				do(ws[to], worker.Task{Kind: worker.Import, Stream: "cam", State: ex.State})
				return ex.State
			}, func(s []byte) { do(ws[0], worker.Task{Kind: worker.Import, Stream: "cam", State: s}) })
		})
		b.Run(fmt.Sprintf("grpc/%dKiB", size>>10), func(b *testing.B) {
			r := startStateRig(b, &Server{Heartbeat: time.Second}, "w0", "w1")
			ids := []string{"w0", "w1"}
			do := func(id string, tk worker.Task) worker.Result {
				tk.Module = "st"
				got := r.do(b, id, tk)
				if got.Outcome != worker.Done {
					b.Fatalf("%s: %s %s", tk.Kind, got.Outcome, got.Detail)
				}
				return got
			}
			benchMoves(b, state, func(from, to int) []byte {
				ex := do(ids[from], worker.Task{Kind: worker.Export, Stream: "cam"})
				do(ids[to], worker.Task{Kind: worker.Import, Stream: "cam", State: ex.State})
				return ex.State
			}, func(s []byte) { do(ids[0], worker.Task{Kind: worker.Import, Stream: "cam", State: s}) })
		})
	}
}

// benchMoves imports state on worker 0, then moves it back and forth
// b.N times, and checks it arrived unchanged.
func benchMoves(b *testing.B, state []byte, move func(from, to int) []byte, load func([]byte)) {
	load(state)
	b.SetBytes(int64(len(state)))
	b.ResetTimer()
	var last []byte
	for i := range b.N {
		last = move(i%2, (i+1)%2)
	}
	b.StopTimer()
	if !bytes.Equal(last, state) {
		b.Fatalf("the state changed on its way: %d bytes, want %d", len(last), len(state))
	}
}
