// Command coordload drives one `mdag coordinator` the way a fleet of ingest
// workers would, with metadata only (issue 41), so that what one
// coordinator core carries can be measured on a machine too small to run
// the fleet: it registers emulated workers over gRPC (Connect, with
// batches), routes and joins camera streams on them (Route, StreamJoin with
// the ticket) and announces each stream's frames (Ingested: a reference,
// its size and ground truth: 4 vehicles and 1 person by default). It
// answers the coordinator's tasks as the traffic example's modules would,
// without pixels: a detector returns the ground truth as its boxes after
// the module's profiled latency for the batch, one batch at a time in each
// of the module's slots (its concurrency), as the emulated executor runs; crop returns one reference per box of its classes; count
// counts; a classifier labels. Every frame reference it hands out names
// the worker that sends it, as the coordinator requires.
//
//	coordload --coordinator 127.0.0.1:7070 --streams 200 --fps 10 --duration 20s
//
// tools/coordinator-capacity.sh runs it (the `fleet` plane) with the
// coordinator pinned to one core. It is a measuring tool: it checks
// nothing of the results.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	"github.com/mdag/mdag/api"
	"github.com/mdag/mdag/remote/client"
	"github.com/mdag/mdag/remote/wire"
)

func main() {
	coord := flag.String("coordinator", "127.0.0.1:7070", "the coordinator's gRPC address (plaintext: loopback)")
	app := flag.String("app", "traffic", "the deployed app")
	streams := flag.Int("streams", 100, "camera streams")
	fps := flag.Float64("fps", 10, "frames per second per stream")
	duration := flag.Duration("duration", 20*time.Second, "how long the streams send")
	fleet := flag.String("workers", "V100=3,P100=2,CPU=3", "emulated workers: TYPE=COUNT,...")
	vehicles := flag.Int("vehicles", 4, "vehicles (class car) in each frame's ground truth")
	people := flag.Int("people", 1, "people (class person) in each frame's ground truth")
	size := flag.String("size", "640x480", "the frames' declared size")
	ready := flag.String("ready", "", "a file to create once every stream has joined (a measurement may start then)")
	settle := flag.Duration("settle", 0, "wait this long after the joins before sending (the re-plans of the joins end)")
	flag.Parse()
	var w, h int
	if _, err := fmt.Sscanf(*size, "%dx%d", &w, &h); err != nil || w <= 0 || h <= 0 {
		fail(fmt.Errorf("--size %q: want WxH", *size))
	}
	if *streams < 1 || *fps <= 0 {
		fail(errors.New("--streams and --fps must be positive"))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	cc, err := client.Dial(*coord)
	if err != nil {
		fail(err)
	}
	defer cc.Close()
	l := &load{cc: cc, app: *app, w: w, h: h, truth: truth(*vehicles, *people, w, h)}
	if err := l.connect(ctx, *fleet); err != nil {
		fail(err)
	}
	if err := l.join(ctx, *streams); err != nil {
		fail(err)
	}
	time.Sleep(*settle)
	if *ready != "" {
		if err := os.WriteFile(*ready, nil, 0o644); err != nil {
			fail(err)
		}
	}
	start := time.Now()
	l.send(ctx, *fps, *duration)
	l.leave()
	time.Sleep(2 * time.Second) // the last frames' results
	fmt.Printf("coordload: %d streams, %d frames announced in %v, %d tasks answered, %d batches received\n",
		*streams, l.frames.Load(), time.Since(start).Round(time.Millisecond), l.tasks.Load(), l.batches.Load())
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "coordload:", err)
	os.Exit(2)
}

// truth is a frame's ground truth: vehicles cars and people persons.
func truth(vehicles, people, w, h int) []*api.Box {
	var out []*api.Box
	for i := range vehicles + people {
		class := "car"
		if i >= vehicles {
			class = "person"
		}
		out = append(out, &api.Box{X: int32((i * 37) % max(1, w-40)), Y: int32((i * 23) % max(1, h-40)), W: 32, H: 32, Class: class, Score: 0.9})
	}
	return out
}

// load is the emulated fleet and its streams.
type load struct {
	cc      *grpc.ClientConn
	app     string
	w, h    int
	truth   []*api.Box
	workers []*fakeWorker
	streams []*stream

	frames, tasks, batches atomic.Uint64
}

type stream struct {
	id  string
	on  *fakeWorker
	seq uint64
}

// fakeWorker is one emulated worker's Connect stream.
type fakeWorker struct {
	l       *load
	id      string
	peer    string
	st      grpc.BidiStreamingClient[api.WorkerMessage, api.CoordinatorMessage]
	out     chan *api.WorkerMessage
	batches bool

	mu      sync.Mutex
	mods    map[string]*api.ModuleSpec
	classes map[string][]string    // crop modules' classes
	busy    map[string][]time.Time // GPU modules: when each of their slots (ModuleSpec.concurrency) is free
	joins   map[uint64]chan *api.StreamJoined
	next    uint64
	refs    atomic.Uint64
}

func (l *load) connect(ctx context.Context, fleet string) error {
	port := 20000
	for _, part := range strings.Split(fleet, ",") {
		typ, n, ok := strings.Cut(part, "=")
		count, err := strconv.Atoi(n)
		if !ok || err != nil || count < 1 {
			return fmt.Errorf("--workers %q: want TYPE=COUNT,...", fleet)
		}
		for i := range count {
			port++
			fw := &fakeWorker{l: l, id: fmt.Sprintf("load-%s-%d", typ, i), peer: fmt.Sprintf("127.0.0.1:%d", port), out: make(chan *api.WorkerMessage, wire.DefaultSendQueue),
				mods: map[string]*api.ModuleSpec{}, classes: map[string][]string{}, busy: map[string][]time.Time{}, joins: map[uint64]chan *api.StreamJoined{}}
			if err := fw.register(ctx, typ); err != nil {
				return err
			}
			l.workers = append(l.workers, fw)
		}
	}
	return nil
}

func (fw *fakeWorker) register(ctx context.Context, typ string) error {
	st, err := api.NewCoordinatorClient(fw.l.cc).Connect(ctx)
	if err != nil {
		return err
	}
	reg := &api.Register{Id: fw.id, Type: typ, Executor: "emulated", Cpus: 1, Gpu: "coordload", PeerAddr: fw.peer, IngestAddr: "127.0.0.1:1", Batches: true}
	if err := st.Send(&api.WorkerMessage{Msg: &api.WorkerMessage_Register{Register: reg}}); err != nil {
		return err
	}
	m, err := st.Recv()
	if err != nil {
		return fmt.Errorf("register %s: %w", fw.id, err)
	}
	if r := m.GetRegistered(); r == nil || !r.Direct {
		return fmt.Errorf("register %s: %v (the coordinator must run --data-plane metadata or direct)", fw.id, m)
	}
	fw.st, fw.batches = st, m.GetRegistered().Batches
	go fw.sendLoop(ctx)
	go fw.recvLoop()
	return nil
}

func (fw *fakeWorker) sendLoop(ctx context.Context) {
	var next *api.WorkerMessage
	for {
		m := next
		next = nil
		if m == nil {
			select {
			case m = <-fw.out:
			case <-time.After(500 * time.Millisecond):
				m = &api.WorkerMessage{Msg: &api.WorkerMessage_Heartbeat{Heartbeat: &api.Heartbeat{}}}
			case <-ctx.Done():
				_ = fw.st.CloseSend()
				return
			}
		}
		if fw.batches {
			m, next = wire.PackUp(m, fw.out)
		}
		if err := fw.st.Send(m); err != nil {
			fmt.Fprintln(os.Stderr, "coordload: send:", fw.id, err)
			return
		}
	}
}

func (fw *fakeWorker) recvLoop() {
	for {
		m, err := fw.st.Recv()
		if err != nil {
			if !errors.Is(err, io.EOF) {
				fmt.Fprintln(os.Stderr, "coordload: receive:", fw.id, err)
			}
			return
		}
		if b := m.GetBatch(); b != nil {
			fw.l.batches.Add(1)
			for _, in := range b.Msgs {
				fw.handle(in)
			}
			continue
		}
		fw.handle(m)
	}
}

func (fw *fakeWorker) handle(m *api.CoordinatorMessage) {
	switch m := m.Msg.(type) {
	case *api.CoordinatorMessage_Load:
		fw.mu.Lock()
		clear(fw.mods)
		for _, s := range m.Load.Modules {
			fw.mods[s.Module] = s
			if len(fw.busy[s.Module]) != int(max(1, s.Concurrency)) {
				fw.busy[s.Module] = make([]time.Time, max(1, s.Concurrency))
			}
			if s.Op == "crop" {
				var p struct{ Classes []string }
				_ = json.Unmarshal(s.ParamsJson, &p)
				fw.classes[s.Module] = p.Classes
			}
		}
		fw.mu.Unlock()
		fw.out <- &api.WorkerMessage{Msg: &api.WorkerMessage_LoadReply{LoadReply: &api.LoadReply{Generation: m.Load.Generation}}}
	case *api.CoordinatorMessage_Task:
		fw.task(m.Task)
	case *api.CoordinatorMessage_StreamJoined:
		fw.mu.Lock()
		ch := fw.joins[m.StreamJoined.Id]
		fw.mu.Unlock()
		if ch != nil {
			ch <- m.StreamJoined
		}
	}
}

// task answers t as its module would, after its profiled latency (GPU
// modules: one batch at a time per slot, not before the task's earliest
// start).
func (fw *fakeWorker) task(t *api.Task) {
	fw.l.tasks.Add(1)
	fw.mu.Lock()
	spec := fw.mods[t.Module]
	classes := fw.classes[t.Module]
	if spec == nil || t.Kind != api.TaskKind_TASK_RUN {
		fw.mu.Unlock()
		fw.out <- &api.WorkerMessage{Msg: &api.WorkerMessage_Result{Result: &api.Result{Task: t.Id, Outcome: api.Outcome_OUTCOME_MODULE_NOT_LOADED}}}
		return
	}
	var lat time.Duration
	if n := len(spec.LatencyNs); n > 0 {
		lat = time.Duration(spec.LatencyNs[min(len(t.Items), n)-1])
	}
	now := time.Now()
	startAt := now
	if spec.Kind == "gpu" {
		slots := fw.busy[t.Module]
		i := slices.IndexFunc(slots, func(t time.Time) bool { return !slices.ContainsFunc(slots, t.After) }) // the slot free first
		startAt = slices.MaxFunc([]time.Time{now, slots[i], time.Unix(0, t.EarliestUnixNs)}, func(a, b time.Time) int { return a.Compare(b) })
		slots[i] = startAt.Add(lat)
	}
	fw.mu.Unlock()
	outs := make([]*api.ItemList, len(t.Items))
	for i, it := range t.Items {
		outs[i] = &api.ItemList{Items: fw.outputs(spec, classes, it)}
	}
	r := &api.Result{Task: t.Id, Outputs: outs, MeasuredNs: int64(lat), Outcome: api.Outcome_OUTCOME_OK}
	time.AfterFunc(startAt.Add(lat).Sub(now), func() { fw.out <- &api.WorkerMessage{Msg: &api.WorkerMessage_Result{Result: r}} })
}

// outputs is what module spec makes of one item.
func (fw *fakeWorker) outputs(spec *api.ModuleSpec, classes []string, it *api.Item) []*api.Item {
	out := &api.Item{Stream: it.Stream, Seq: it.Seq, CaptureUnixNs: it.CaptureUnixNs, DeadlineUnixNs: it.DeadlineUnixNs, Truth: it.Truth, Region: it.Region}
	switch {
	case spec.Op == "crop":
		var crops []*api.Item
		for _, b := range it.Boxes {
			if len(classes) > 0 && !slices.Contains(classes, b.Class) {
				continue
			}
			c := &api.Item{Stream: it.Stream, Seq: it.Seq, CaptureUnixNs: it.CaptureUnixNs, DeadlineUnixNs: it.DeadlineUnixNs, Region: b, Boxes: []*api.Box{b}, Frame: fw.ref(b.W, b.H)}
			crops = append(crops, c)
		}
		return crops
	case spec.Op == "count":
		out.Counts = map[string]int64{"car": int64(len(it.Labels) + 1)}
	case spec.Kind == "gpu" && it.Region == nil:
		out.Boxes, out.Frame = it.Truth, fw.ref(it.GetFrame().GetWidth(), it.GetFrame().GetHeight()) // a detector: the truth echoed, its frame held here
	default:
		out.Boxes, out.Labels = it.Boxes, []string{"sedan"}
	}
	return []*api.Item{out}
}

// ref is a reference to a frame of w x h this worker would hold.
func (fw *fakeWorker) ref(w, h int32) *api.Frame {
	return &api.Frame{Width: max(w, 1), Height: max(h, 1), Ref: &api.FrameRef{Holder: fw.id, Addr: fw.peer, Id: fw.refs.Add(1)}}
}

// join routes and joins n streams, each on the worker Route names.
func (l *load) join(ctx context.Context, n int) error {
	byID := map[string]*fakeWorker{}
	for _, fw := range l.workers {
		byID[fw.id] = fw
	}
	for i := range n {
		id := fmt.Sprintf("load-%d", i)
		rt, err := api.NewCoordinatorClient(l.cc).Route(ctx, &api.RouteRequest{App: l.app, Stream: id})
		if err != nil {
			return fmt.Errorf("route %s: %w", id, err)
		}
		fw := byID[rt.Worker]
		if fw == nil {
			return fmt.Errorf("route %s: %q is not one of this fleet (%s)", id, rt.Worker, rt.Why)
		}
		if err := fw.joinStream(ctx, l.app, id, rt.Ticket); err != nil {
			return err
		}
		l.streams = append(l.streams, &stream{id: id, on: fw})
	}
	return nil
}

func (fw *fakeWorker) joinStream(ctx context.Context, app, id string, ticket []byte) error {
	fw.mu.Lock()
	fw.next++
	jid, ch := fw.next, make(chan *api.StreamJoined, 1)
	fw.joins[jid] = ch
	fw.mu.Unlock()
	fw.out <- &api.WorkerMessage{Msg: &api.WorkerMessage_StreamJoin{StreamJoin: &api.StreamJoin{Id: jid, App: app, Stream: id, Ticket: ticket}}}
	select {
	case r := <-ch:
		if r.Code != 0 {
			return fmt.Errorf("join %s: %s", id, r.Error)
		}
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("join %s: no answer", id)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// send announces every stream's frames at fps until duration passes: the
// streams in 10 groups, a group's frames every tenth of a frame interval.
func (l *load) send(ctx context.Context, fps float64, duration time.Duration) {
	const groups = 10
	tick := time.NewTicker(time.Duration(float64(time.Second) / fps / groups))
	defer tick.Stop()
	end := time.After(duration)
	for g := 0; ; g = (g + 1) % groups {
		select {
		case <-tick.C:
		case <-end:
			return
		case <-ctx.Done():
			return
		}
		now := time.Now().UnixNano()
		for i := g; i < len(l.streams); i += groups {
			s := l.streams[i]
			f := &api.Frame{Width: int32(l.w), Height: int32(l.h), Ref: &api.FrameRef{Holder: s.on.id, Addr: s.on.peer, Id: s.on.refs.Add(1)}}
			s.on.out <- &api.WorkerMessage{Msg: &api.WorkerMessage_Ingested{Ingested: &api.Ingested{Stream: s.id, Seq: s.seq, CaptureUnixNs: now, Frame: f, Truth: l.truth}}}
			s.seq++
			l.frames.Add(1)
		}
	}
}

func (l *load) leave() {
	for _, s := range l.streams {
		s.on.out <- &api.WorkerMessage{Msg: &api.WorkerMessage_StreamLeave{StreamLeave: &api.StreamLeave{Stream: s.id}}}
	}
}
