package client

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/mdag/mdag/api"
	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/media"
	"github.com/mdag/mdag/remote/wire"
	"github.com/mdag/mdag/worker"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var t0 = time.Date(2026, 11, 24, 10, 0, 0, 0, time.UTC)

func frameOf(w, h int, fill byte) *media.Frame {
	f := media.NewFrame(w, h)
	for i := range f.Pix {
		f.Pix[i] = fill
	}
	return f
}

// TestStoreExpiresAndEvicts: a frame is held until its deadline plus
// HoldAfter, and past MaxBytes the one due to expire first goes; every
// miss is counted.
func TestStoreExpiresAndEvicts(t *testing.T) {
	clk := clock.NewFake(t0)
	s := &Store{Clock: clk, MaxBytes: 3 * 12, HoldAfter: time.Second} // three 2x2 frames
	a, _ := s.Put(frameOf(2, 2, 1), t0.Add(100*time.Millisecond))
	b, _ := s.Put(frameOf(2, 2, 2), t0.Add(50*time.Millisecond))
	c, _ := s.Put(frameOf(2, 2, 3), t0.Add(300*time.Millisecond))
	if st := s.Stats(); st.Held != 3 || st.Bytes != 36 || st.Evicted != 0 {
		t.Fatalf("after three puts: %+v", st)
	}
	d, _ := s.Put(frameOf(2, 2, 4), t0.Add(200*time.Millisecond)) // over MaxBytes: b (due first) goes
	if _, ok := s.Get(b, false); ok {
		t.Error("b should have been evicted: it was due to expire first")
	}
	if _, ok := s.Put(frameOf(2, 2, 5), t0.Add(10*time.Millisecond)); ok {
		t.Error("a frame due before everything held was stored by evicting frames due after it")
	}
	if _, ok := s.Put(frameOf(4, 4, 6), t0.Add(time.Hour)); ok {
		t.Error("a frame larger than MaxBytes was stored")
	}
	for _, id := range []uint64{a, c, d} {
		if _, ok := s.Get(id, false); !ok {
			t.Errorf("frame %d evicted; only b should be", id)
		}
	}
	clk.Advance(1100 * time.Millisecond) // a expires (deadline +100ms, +1s hold)
	if _, ok := s.Get(a, true); ok {
		t.Error("a is past its deadline plus HoldAfter and still held")
	}
	if f, ok := s.Get(d, true); !ok || f.Pix[0] != 4 {
		t.Errorf("d: %v %v", f, ok)
	}
	st := s.Stats()
	if st.Held != 2 || st.Evicted != 1 || st.Expired != 1 || st.Missing != 2 || st.Served != 3 || st.Local != 1 || st.Put != 4 {
		t.Errorf("stats %+v", st)
	}
	clk.Advance(time.Second)
	if st := s.Stats(); st.Held != 0 || st.Bytes != 0 || st.Expired != 3 {
		t.Errorf("after every deadline: %+v", st)
	}
}

// TestHoldOutputs: a Done result's frames are held and replaced by
// references (a frame shared by outputs once), but for one under
// InlineBelow; the worker's own items are not changed; other results pass
// as they are.
func TestHoldOutputs(t *testing.T) {
	dp := &DataPlane{Addr: "10.0.0.7:7071", Store: &Store{Clock: clock.NewFake(t0)}, InlineBelow: 2 * 3}
	shared := frameOf(4, 2, 9)
	in := []*media.Item{{Stream: "s", Seq: 1, Deadline: t0.Add(time.Second), Frame: shared}, {Stream: "s", Seq: 1, Deadline: t0.Add(time.Second), Frame: shared, Boxes: []media.Box{{W: 1}}}}
	crop := &media.Item{Stream: "s", Seq: 1, Deadline: t0.Add(time.Second), Frame: frameOf(2, 1, 5)}
	tiny := &media.Item{Stream: "s", Seq: 1, Deadline: t0.Add(time.Second), Frame: frameOf(1, 1, 6)} // under InlineBelow
	noFrame := &media.Item{Stream: "s", Seq: 1, Counts: map[string]int{"car": 2}}
	r := worker.Result{Task: 3, Outputs: [][]*media.Item{in, {crop, noFrame, tiny}}}
	got := holdOutputs(r, "gpu-a", dp, dp.inlineBelow())
	if in[0].Frame != shared || crop.Frame.Ref != nil {
		t.Fatal("holdOutputs changed the worker's own items")
	}
	r0, r1 := got.Outputs[0][0].Frame.Ref, got.Outputs[0][1].Frame.Ref
	if r0 == nil || r1 == nil || r0.ID != r1.ID || r0.Holder != "gpu-a" || r0.Addr != dp.Addr {
		t.Fatalf("shared frame refs %+v %+v: want one reference to gpu-a at %s", r0, r1, dp.Addr)
	}
	if f := got.Outputs[0][0].Frame; f.Pix != nil || f.W != 4 || f.H != 2 {
		t.Errorf("reference frame %+v: want 4x2 and no pixels", f)
	}
	if got.Outputs[1][1] != noFrame || got.Outputs[1][0].Frame.Ref == nil || got.Outputs[1][2] != tiny {
		t.Errorf("second list %+v", got.Outputs[1])
	}
	if st := dp.Store.Stats(); st.Put != 2 {
		t.Errorf("%d frames held, want 2 (the shared one once)", st.Put)
	}
	failed := worker.Result{Task: 4, Outcome: worker.Rejected}
	if g := holdOutputs(failed, "gpu-a", dp, dp.inlineBelow()); g.Outcome != worker.Rejected || g.Outputs != nil {
		t.Errorf("a failed result changed: %+v", g)
	}
}

// peerAt serves srv on a loopback port; the returned stop ends it.
func peerAt(t *testing.T, srv api.PeerServer) (addr string, stop func()) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	api.RegisterPeerServer(g, srv)
	done := make(chan struct{})
	go func() { defer close(done); _ = g.Serve(ln) }()
	stopped := false
	stop = func() {
		if !stopped {
			stopped = true
			g.Stop()
			<-done
		}
	}
	t.Cleanup(stop)
	return ln.Addr().String(), stop
}

func refItem(seq uint64, f *media.Frame, holder, addr string, id uint64) *media.Item {
	return &media.Item{Stream: "cam", Seq: seq, Deadline: t0.Add(time.Hour), Frame: &media.Frame{W: f.W, H: f.H, Ref: &media.FrameRef{Holder: holder, Addr: addr, ID: id}}}
}

// TestResolve: references are fetched from their holders (one holder
// here, the worker's own store there), sizes are checked, and a frame a
// holder no longer has, a wrong holder or a dead address is a peer-lost
// error that names the holder and changes no item.
func TestResolve(t *testing.T) {
	clk := clock.NewFake(t0)
	remote := &Store{Clock: clk}
	a := frameOf(2, 2, 1)
	idA, _ := remote.Put(a, t0.Add(time.Hour))
	idB, _ := remote.Put(frameOf(3, 1, 2), t0.Add(time.Hour))
	addr, _ := peerAt(t, &PeerServer{ID: "gpu-a", Store: remote})
	mine := &Store{Clock: clk}
	own, _ := mine.Put(frameOf(1, 1, 7), t0.Add(time.Hour))
	dead, stopDead := peerAt(t, &PeerServer{ID: "gpu-z", Store: &Store{Clock: clk}})
	stopDead()

	fx := newFetcher("cpu-a", &DataPlane{Addr: "127.0.0.1:1", Store: mine}, clk)
	defer fx.close()
	cases := []struct {
		name  string
		items []*media.Item
		err   string // "" = resolves
	}{
		{"peer and own", []*media.Item{refItem(1, a, "gpu-a", addr, idA), refItem(1, a, "gpu-a", addr, idA), refItem(2, frameOf(3, 1, 0), "gpu-a", addr, idB), refItem(3, frameOf(1, 1, 0), "cpu-a", "127.0.0.1:1", own)}, ""},
		{"not held", []*media.Item{refItem(1, a, "gpu-a", addr, 999)}, "NotFound"},
		{"another holder at the address", []*media.Item{refItem(1, a, "gpu-b", addr, idA)}, "FailedPrecondition"},
		{"size differs from the reference", []*media.Item{refItem(1, frameOf(2, 3, 0), "gpu-a", addr, idA)}, "the 2x3 the reference said"},
		{"own store misses", []*media.Item{refItem(1, a, "cpu-a", "127.0.0.1:1", 12345)}, "no longer held here"},
		{"holder gone", []*media.Item{refItem(1, a, "gpu-z", dead, 1)}, "gpu-z"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := make([]*media.Frame, len(c.items))
			for i, it := range c.items {
				before[i] = it.Frame
			}
			err := fx.resolve(context.Background(), c.items)
			if c.err == "" {
				if err != nil {
					t.Fatal(err)
				}
				for _, it := range c.items {
					if it.Frame.Ref != nil || it.Frame.Valid() != nil {
						t.Errorf("item %d: %+v not resolved", it.Seq, it.Frame)
					}
				}
				if c.items[0].Frame.Pix[0] != 1 || c.items[2].Frame.Pix[0] != 2 || c.items[3].Frame.Pix[0] != 7 {
					t.Error("wrong pixels")
				}
				return
			}
			if err == nil || !errors.Is(err, errPeerLost) || !strings.Contains(err.Error(), c.err) {
				t.Fatalf("err %v: want peer lost mentioning %q", err, c.err)
			}
			for i, it := range c.items {
				if it.Frame != before[i] {
					t.Errorf("item %d changed by a failed resolve", i)
				}
			}
		})
	}
	if st := remote.Stats(); st.Served != 3 {
		t.Errorf("holder served %d frames, want 3 (two distinct ones asked by one fetch, deduplicated, and one for the size check)", st.Served)
	}
}

// stalling sends all but the last frame asked for, says so, and then
// holds the stream open until it is cut: a holder that dies
// mid-transfer.
type stalling struct {
	*PeerServer
	stalled chan struct{}
}

func (p *stalling) Fetch(req *api.FetchRequest, stream grpc.ServerStreamingServer[api.FetchedFrame]) error {
	for _, id := range req.Ids[:len(req.Ids)-1] {
		f, _ := p.Store.Get(id, false)
		if err := stream.Send(&api.FetchedFrame{Id: id, Frame: wire.FrameToPB(f)}); err != nil {
			return err
		}
	}
	close(p.stalled)
	<-stream.Context().Done()
	return status.Error(codes.Unavailable, "cut")
}

// TestHolderDiesMidTransfer: the holder sends one of two frames and its
// process ends: the fetch fails at once (not at its timeout) as peer lost,
// naming the holder.
func TestHolderDiesMidTransfer(t *testing.T) {
	clk := clock.NewFake(t0)
	st := &Store{Clock: clk}
	f1, f2 := frameOf(2, 2, 1), frameOf(2, 2, 2)
	id1, _ := st.Put(f1, t0.Add(time.Hour))
	id2, _ := st.Put(f2, t0.Add(time.Hour))
	p := &stalling{PeerServer: &PeerServer{ID: "gpu-a", Store: st}, stalled: make(chan struct{})}
	addr, kill := peerAt(t, p)
	fx := newFetcher("cpu-a", &DataPlane{FetchTimeout: time.Hour}, clk)
	defer fx.close()
	items := []*media.Item{refItem(1, f1, "gpu-a", addr, id1), refItem(2, f2, "gpu-a", addr, id2)}
	errc := make(chan error, 1)
	go func() { errc <- fx.resolve(context.Background(), items) }()
	<-p.stalled
	kill()
	err := <-errc
	if !errors.Is(err, errPeerLost) || !strings.Contains(err.Error(), "gpu-a") {
		t.Fatalf("err %v: want peer lost naming gpu-a", err)
	}
	if items[0].Frame.Ref == nil {
		t.Error("a failed fetch left a half-resolved task")
	}
}

// TestPending: a task whose frames are here is not held up by tasks
// waiting for theirs; tasks waiting go oldest first to the fetchers; a
// module load waits for the fetches of a module it removes, not of one it
// keeps (barrier); a lost fetch is answered PeerLost; past maxQueue tasks
// waiting, the next is answered QueueFull at once.
func TestPending(t *testing.T) {
	clk := clock.NewFake(t0)
	st := &Store{Clock: clk}
	id, _ := st.Put(frameOf(2, 2, 1), t0.Add(time.Hour))
	p := &stalling{PeerServer: &PeerServer{ID: "gpu-a", Store: st}, stalled: make(chan struct{})}
	addr, kill := peerAt(t, p)

	results := make(chan worker.Result, 10)
	w := worker.NewWorker("cpu-a", "CPU", clk, nil, nil, func(r worker.Result) { results <- r })
	defer w.Close()
	fx := newFetcher("cpu-a", &DataPlane{FetchTimeout: time.Hour}, clk)
	defer fx.close()
	o := newPending(context.Background(), w, fx, func(tk worker.Task, out worker.Outcome, detail string) {
		results <- worker.Result{Task: tk.ID, Outcome: out, Detail: detail}
	})
	o.maxRun, o.maxQueue = 1, 1
	// Module crop is not loaded: tasks reaching the worker come back
	// NotLoaded at once, which is all this test needs to see when.
	o.submit(worker.Task{ID: 1, App: "a", Module: "crop", Items: []*media.Item{refItem(1, frameOf(2, 2, 0), "gpu-a", addr, id)}})
	<-p.stalled // task 1 is fetching: the queue is empty again
	o.submit(worker.Task{ID: 2, App: "a", Module: "crop", Items: []*media.Item{{Stream: "cam", Seq: 2}}})
	if r := <-results; r.Task != 2 || r.Outcome != worker.NotLoaded {
		t.Fatalf("got %+v, want task 2 at once (its frames are here)", r)
	}
	o.submit(worker.Task{ID: 3, App: "a", Module: "count", Items: []*media.Item{refItem(3, frameOf(2, 2, 0), "gpu-a", addr, id)}})
	o.submit(worker.Task{ID: 4, App: "a", Module: "crop", Items: []*media.Item{refItem(4, frameOf(2, 2, 0), "gpu-a", addr, id)}})
	if r := <-results; r.Task != 4 || r.Outcome != worker.QueueFull {
		t.Fatalf("got %+v, want task 4 queue-full (task 3 waits, one may)", r)
	}
	o.barrier(map[string]bool{"a/crop": true, "a/count": true}) // a load that keeps both does not wait
	barrier := make(chan struct{})
	go func() { o.barrier(map[string]bool{"a/crop": true}); close(barrier) }() // removes count: waits for task 3
	select {
	case <-barrier:
		t.Fatal("the barrier passed while task 3 still waits for its frames")
	case r := <-results:
		t.Fatalf("task %d answered while task 1 still fetches", r.Task)
	default:
	}
	kill()
	if r := <-results; r.Task != 1 || r.Outcome != worker.PeerLost {
		t.Fatalf("got %+v, want task 1 peer-lost (oldest first)", r)
	}
	if r := <-results; r.Task != 3 || r.Outcome != worker.PeerLost {
		t.Fatalf("got %+v, want task 3 peer-lost", r)
	}
	<-barrier
	o.wait()
}

// TestFailFast: once a holder's fetch failed, the next fetches from it
// fail at once (not each after its timeout) until failFast passes.
func TestFailFast(t *testing.T) {
	clk := clock.NewFake(t0)
	dead, stop := peerAt(t, &PeerServer{ID: "gpu-z", Store: &Store{Clock: clk}})
	stop()
	calls := 0
	fx := newFetcher("cpu-a", &DataPlane{FetchTimeout: time.Hour, Dial: func(a string) (*grpc.ClientConn, error) { calls++; return Dial(a) }}, clk)
	defer fx.close()
	try := func() error {
		return fx.resolve(context.Background(), []*media.Item{refItem(1, frameOf(2, 2, 0), "gpu-z", dead, 1)})
	}
	if err := try(); !errors.Is(err, errPeerLost) {
		t.Fatalf("first fetch: %v", err)
	}
	if err := try(); err == nil || !strings.Contains(err.Error(), "failed") || calls != 1 {
		t.Fatalf("second fetch: %v after %d dials; want the first failure again, no new dial", err, calls)
	}
	clk.Advance(failFast)
	fx.close() // a new connection
	_ = try()
	if calls != 2 {
		t.Errorf("%d dials after failFast passed, want 2", calls)
	}
}

// TestStoreKeysAreNotReused: a holder restarted under the same ID and
// address (a new Store) answers an old key NOT_FOUND, not with its own
// frame of the same size that happens to have the same key.
func TestStoreKeysAreNotReused(t *testing.T) {
	clk := clock.NewFake(t0)
	before, after := &Store{Clock: clk}, &Store{Clock: clk}
	for range 100 {
		old, _ := before.Put(frameOf(2, 2, 1), t0.Add(time.Hour))
		if _, ok := after.Put(frameOf(2, 2, 2), t0.Add(time.Hour)); !ok {
			t.Fatal("not held")
		}
		if f, ok := after.Get(old, false); ok {
			t.Fatalf("the restarted store answered the old key %d with its frame %v", old, f.Pix[:1])
		}
	}
}

// TestUnchanged: a load keeps the modules it carries exactly as before;
// a module it drops, changes or adds is not kept.
func TestUnchanged(t *testing.T) {
	m := func(mod string, conc int32) *api.ModuleSpec {
		return &api.ModuleSpec{App: "a", Module: mod, Kind: "cpu", Op: "crop", Concurrency: conc}
	}
	prev := &api.Load{Modules: []*api.ModuleSpec{m("crop", 1), m("count", 1), m("gone", 1)}}
	next := &api.Load{Modules: []*api.ModuleSpec{m("crop", 1), m("count", 2), m("new", 1)}}
	got := unchanged(prev, next)
	if len(got) != 1 || !got["a/crop"] {
		t.Errorf("kept %v, want only a/crop", got)
	}
	if got := unchanged(nil, next); len(got) != 0 {
		t.Errorf("first load kept %v", got)
	}
}

// TestFetchRefusesRepeatedIDs (issue 36, Low): one fetch naming a frame
// twice is refused before anything is sent (it cost a copy of the frame
// per repeat: one key x4096 in one request); the fetcher de-duplicates
// its own requests, so a worker never sends one.
func TestFetchRefusesRepeatedIDs(t *testing.T) {
	clk := clock.NewFake(t0)
	st := &Store{Clock: clk}
	id, _ := st.Put(frameOf(2, 2, 1), t0.Add(time.Hour))
	addr, _ := peerAt(t, &PeerServer{ID: "gpu-a", Store: st})
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	stream, err := api.NewPeerClient(cc).Fetch(context.Background(), &api.FetchRequest{Holder: "gpu-a", Ids: []uint64{id, id, id}})
	if err != nil {
		t.Fatal(err)
	}
	got, err := stream.Recv()
	if status.Code(err) != codes.InvalidArgument || got != nil || !strings.Contains(err.Error(), "twice") {
		t.Fatalf("a fetch naming frame %d three times: %v, %v; want InvalidArgument before any frame", id, got, err)
	}
}
