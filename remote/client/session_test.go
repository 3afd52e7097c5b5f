package client

import (
	"context"
	"errors"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/mdag/mdag/api"
	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/internal/clocktest"
	"github.com/mdag/mdag/media"
	"github.com/mdag/mdag/modules"
	"github.com/mdag/mdag/remote/wire"
	"github.com/mdag/mdag/worker"
)

// The worker's end of the Connect stream (workerSession) driven step by
// step: the coordinator is the test, over an in-memory stream, and time
// moves only on a fake clock. The waits below are for another goroutine's
// step (a message, a timer armed): waitLimit bounds them only for a
// failure's sake.
const waitLimit = 30 * time.Second

// await waits until the session has armed its timer n of d (the clock may
// then move) and fails the test if it has armed more.
func await(t testing.TB, c *clocktest.Counting, d time.Duration, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if err := c.Await(ctx, d, n); err != nil {
		t.Fatal(err)
	}
	if got := c.Armed(d); got > n {
		t.Fatalf("%d timers of %v armed, want %d", got, d, n)
	}
}

// fakeCoordinator is an in-memory Connect stream: the session writes up
// and reads down; the test plays the coordinator.
type fakeCoordinator struct {
	ctx        context.Context // the session's, from open
	up         chan *api.WorkerMessage
	down       chan *api.CoordinatorMessage
	end        chan error // Recv returns it: the coordinator ended the stream
	refused    error      // the coordinator refused the call: Send gets io.EOF, Recv this
	sendErr    atomic.Pointer[error]
	opened     atomic.Int32
	closedSend chan struct{}
	closeOnce  sync.Once
}

func newFakeCoordinator() *fakeCoordinator {
	return &fakeCoordinator{up: make(chan *api.WorkerMessage, 1024), down: make(chan *api.CoordinatorMessage, 16),
		end: make(chan error, 1), closedSend: make(chan struct{})}
}

func (f *fakeCoordinator) open(ctx context.Context) (workerStream, error) {
	f.opened.Add(1)
	f.ctx = ctx
	return f, nil
}

func (f *fakeCoordinator) Send(m *api.WorkerMessage) error {
	if f.refused != nil {
		return io.EOF
	}
	if p := f.sendErr.Load(); p != nil {
		return *p
	}
	select {
	case f.up <- m:
		return nil
	case <-f.ctx.Done():
		return io.EOF
	}
}

func (f *fakeCoordinator) Recv() (*api.CoordinatorMessage, error) {
	if f.refused != nil {
		return nil, f.refused
	}
	select {
	case m := <-f.down:
		return m, nil
	case err := <-f.end:
		return nil, err
	case <-f.ctx.Done():
		return nil, status.FromContextError(f.ctx.Err()).Err()
	}
}

func (f *fakeCoordinator) CloseSend() error {
	f.closeOnce.Do(func() { close(f.closedSend) })
	return nil
}

// next is the next message the worker sent.
func (f *fakeCoordinator) next(t testing.TB) *api.WorkerMessage {
	t.Helper()
	return clocktest.Recv(t, f.up, waitLimit, "a message from the worker")
}

func (f *fakeCoordinator) give(m *api.CoordinatorMessage) { f.down <- m }

// session is a workerSession running against a fakeCoordinator.
type session struct {
	*fakeCoordinator
	clk    *clocktest.Counting
	cancel context.CancelFunc
	done   chan struct{}
	err    error // once done is closed
}

// startSession runs a session of cfg (ID w1 and type CPU unless set) on
// a counting fake clock; the test's end cancels it and waits for it.
func startSession(t testing.TB, cfg WorkerConfig) *session {
	t.Helper()
	if cfg.ID == "" {
		cfg.ID, cfg.Type = "w1", "CPU"
	}
	if cfg.Ops == nil {
		cfg.Ops = sinkOps()
	}
	clk := clocktest.NewCounting(t0)
	cfg.Clock = clk
	ws, err := newWorkerSession(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &session{fakeCoordinator: newFakeCoordinator(), clk: clk, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		s.err = ws.run(ctx, s.open)
	}()
	t.Cleanup(func() {
		cancel()
		<-s.done
	})
	return s
}

// ended waits for the session to end and returns why.
func (s *session) ended(t testing.TB) error {
	t.Helper()
	clocktest.Recv(t, s.done, waitLimit, "the session's end")
	return s.err
}

// register takes the worker's registration and acknowledges it with the
// heartbeat interval beat.
func (s *session) register(t testing.TB, beat time.Duration) *api.Register {
	t.Helper()
	reg := s.next(t).GetRegister()
	if reg == nil {
		t.Fatal("the worker's first message is not its registration")
	}
	s.give(&api.CoordinatorMessage{Msg: &api.CoordinatorMessage_Registered{Registered: &api.Registered{Id: reg.Id, HeartbeatIntervalNs: int64(beat)}}})
	return reg
}

// load sends a Load of generation gen hosting specs and returns the
// worker's next message, which must be its LoadReply: a barrier, too,
// since the receiver has handled everything sent before it.
func (s *session) load(t testing.TB, gen uint64, specs ...worker.ModuleSpec) *api.LoadReply {
	t.Helper()
	l := &api.Load{Generation: gen}
	for _, sp := range specs {
		p, err := wire.SpecToPB(sp)
		if err != nil {
			t.Fatal(err)
		}
		l.Modules = append(l.Modules, p)
	}
	s.give(&api.CoordinatorMessage{Msg: &api.CoordinatorMessage_Load{Load: l}})
	m := s.next(t)
	r := m.GetLoadReply()
	if r == nil {
		t.Fatalf("the worker answered load %d with %v, want its LoadReply", gen, m)
	}
	return r
}

func sinkOps() *modules.Registry {
	r := modules.NewRegistry()
	modules.Must(r.Register("sink", func(modules.Params) (modules.Processor, error) { return sinkOp{}, nil }))
	return r
}

type sinkOp struct{}

func (sinkOp) Process(it *media.Item) ([]*media.Item, error) { return []*media.Item{it}, nil }
func (sinkOp) Close()                                        {}

var sink = worker.ModuleSpec{App: "a", Module: "c", Kind: dag.CPU, Op: "sink", Concurrency: 1}

// TestSessionHeartbeats: the worker registers as itself, then sends a
// heartbeat each interval the coordinator asked for, on its clock, with
// its counters, and none before the interval has passed.
func TestSessionHeartbeats(t *testing.T) {
	const beat = 10 * time.Second
	s := startSession(t, WorkerConfig{ID: "w7", Type: "V100", GPU: "2x H100"})
	reg := s.register(t, beat)
	if reg.Id != "w7" || reg.Type != "V100" || reg.Executor != "emulated" || reg.Gpu != "2x H100" || reg.Cpus < 1 || reg.PeerAddr != "" {
		t.Errorf("registered as %v", reg)
	}
	await(t, s.clk, beat, 1)
	for i := 1; i <= 3; i++ {
		s.clk.Advance(beat - time.Nanosecond)
		// The load's reply is queued after the clock moved: a heartbeat
		// due by then would come first.
		if r := s.load(t, uint64(i), sink); r.Generation != uint64(i) || r.Error != "" {
			t.Fatalf("interval %d: load reply %v", i, r)
		}
		s.clk.Advance(time.Nanosecond)
		hb := s.next(t).GetHeartbeat()
		if hb == nil || hb.Modules != 1 {
			t.Fatalf("interval %d: the worker's message at the interval is not a heartbeat of its one module: %v", i, hb)
		}
		await(t, s.clk, beat, i+1) // the next one is armed: the clock may move
	}
}

// flipExec is an executor with a health probe that a test turns bad
// (gpu/kserve's, whose inference server may go away).
type flipExec struct {
	bad    atomic.Pointer[string]
	probes atomic.Int64
}

func (f *flipExec) Kind() string { return "flip" }

func (f *flipExec) Run(context.Context, string, []*media.Item) ([][]*media.Item, error) {
	return nil, errors.New("flip runs no batches")
}

func (f *flipExec) Health(context.Context) error {
	f.probes.Add(1)
	if p := f.bad.Load(); p != nil {
		return errors.New(*p)
	}
	return nil
}

func (f *flipExec) set(why string) { f.bad.Store(&why) }

// TestSessionUnhealthyDoesNotRegister: an executor whose probe fails
// does not register: the stream is not even opened, and the session says
// why.
func TestSessionUnhealthyDoesNotRegister(t *testing.T) {
	x := &flipExec{}
	x.set("kserve: endpoint 127.0.0.1:8001: cannot reach the server")
	s := startSession(t, WorkerConfig{Exec: x})
	err := s.ended(t)
	if err == nil || err.Error() != "not registering: executor flip unhealthy: kserve: endpoint 127.0.0.1:8001: cannot reach the server" {
		t.Errorf("session ended with %v", err)
	}
	if n := s.opened.Load(); n != 0 {
		t.Errorf("a worker whose executor is unhealthy opened %d streams", n)
	}
}

// TestSessionHealthProbe: once registered, the executor is probed every
// HealthInterval on the clock; a healthy probe keeps the session, a failed
// one ends it with the reason (the coordinator then counts the instance
// lost) and the worker closes its end of the stream.
func TestSessionHealthProbe(t *testing.T) {
	const every = 3 * time.Second
	x := &flipExec{}
	s := startSession(t, WorkerConfig{Exec: x, HealthInterval: every})
	s.register(t, time.Hour)
	await(t, s.clk, every, 1)
	s.clk.Advance(every - time.Nanosecond)
	if n := x.probes.Load(); n != 1 {
		t.Fatalf("%d probes before the interval passed, want 1 (before registering)", n)
	}
	s.clk.Advance(time.Nanosecond)
	await(t, s.clk, every, 2) // armed once the probe has passed
	if n := x.probes.Load(); n != 2 {
		t.Fatalf("%d probes after one interval, want 2", n)
	}
	if r := s.load(t, 1); r.Generation != 1 {
		t.Fatalf("after a healthy probe: %v", r)
	}
	x.set("kserve: model resnet50 at 127.0.0.1:8001: server model resnet50 is not ready on the server")
	s.clk.Advance(every)
	err := s.ended(t)
	if err == nil || err.Error() != "executor flip unhealthy: kserve: model resnet50 at 127.0.0.1:8001: server model resnet50 is not ready on the server" {
		t.Errorf("session ended with %v", err)
	}
	select {
	case <-s.closedSend:
	default:
		t.Error("the worker did not close its end of the stream")
	}
}

// TestSessionLoad: a Load is answered with a LoadReply of its
// generation; one that fails carries the error, and the session goes on.
func TestSessionLoad(t *testing.T) {
	s := startSession(t, WorkerConfig{})
	s.register(t, time.Hour)
	if r := s.load(t, 7, sink); r.Generation != 7 || r.Error != "" {
		t.Errorf("load 7: %v", r)
	}
	bad := sink
	bad.Module, bad.Op = "d", "no-such-op"
	if r := s.load(t, 8, sink, bad); r.Generation != 8 || !strings.Contains(r.Error, "a/d") || !strings.Contains(r.Error, "no-such-op") {
		t.Errorf("load 8 with an unknown op: %v, want its generation and the error", r)
	}
	if r := s.load(t, 9); r.Generation != 9 || r.Error != "" {
		t.Errorf("load 9 after a failed one: %v", r)
	}
}

// TestSessionTasks: a task the worker cannot decode is answered BadTask
// with the reason; a good one runs on its module and its result comes
// back.
func TestSessionTasks(t *testing.T) {
	s := startSession(t, WorkerConfig{})
	s.register(t, time.Hour)
	s.load(t, 1, sink)
	task := func(p *api.Task) *api.Result {
		t.Helper()
		s.give(&api.CoordinatorMessage{Msg: &api.CoordinatorMessage_Task{Task: p}})
		m := s.next(t)
		if m.GetResult() == nil {
			t.Fatalf("task %d answered with %v, want a result", p.Id, m)
		}
		return m.GetResult()
	}
	good := wire.TaskToPB(worker.Task{ID: 1, App: "a", Module: "c", Items: []*media.Item{{Stream: "cam", Seq: 4}}})
	kind := wire.TaskToPB(worker.Task{ID: 2, App: "a", Module: "c"})
	kind.Kind = 99
	state := wire.TaskToPB(worker.Task{ID: 3, App: "a", Module: "c"})
	state.State = []byte("state")
	for _, tc := range []struct {
		task    *api.Task
		outcome api.Outcome
		detail  string
	}{
		{kind, api.Outcome_OUTCOME_BAD_TASK, "unknown task kind 99"},
		{state, api.Outcome_OUTCOME_BAD_TASK, "a run task carries state"},
		{good, api.Outcome_OUTCOME_OK, ""},
	} {
		r := task(tc.task)
		if r.Task != tc.task.Id || r.Outcome != tc.outcome || !strings.Contains(r.Detail, tc.detail) {
			t.Errorf("task %d: %v, want %v %q", tc.task.Id, r, tc.outcome, tc.detail)
		}
	}
}

// TestSessionRegisterRefused: a registration the coordinator refuses,
// does not acknowledge or never answers ends the session with the reason.
func TestSessionRegisterRefused(t *testing.T) {
	for _, tc := range []struct {
		name   string
		refuse error                   // the call is refused before it is read
		answer *api.CoordinatorMessage // the coordinator's first message
		end    error                   // or the stream ends
		want   string
	}{
		{name: "refused call", refuse: status.Error(codes.ResourceExhausted, "127.0.0.1 connects too often"),
			want: "register: rpc error: code = ResourceExhausted desc = 127.0.0.1 connects too often"},
		{name: "no acknowledgement", answer: &api.CoordinatorMessage{Msg: &api.CoordinatorMessage_Load{Load: &api.Load{}}},
			want: "register: the coordinator did not acknowledge"},
		{name: "stream ends", end: status.Error(codes.InvalidArgument, `worker type "TPU" is in no deployed app's profiles`),
			want: `register: rpc error: code = InvalidArgument desc = worker type "TPU" is in no deployed app's profiles`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := clocktest.NewCounting(t0)
			ws, err := newWorkerSession(WorkerConfig{ID: "w1", Type: "CPU", Clock: clk})
			if err != nil {
				t.Fatal(err)
			}
			f := newFakeCoordinator()
			f.refused = tc.refuse
			if tc.answer != nil {
				f.give(tc.answer)
			}
			if tc.end != nil {
				f.end <- tc.end
			}
			err = ws.run(context.Background(), f.open)
			if err == nil || err.Error() != tc.want {
				t.Errorf("got %v, want %s", err, tc.want)
			}
			if tc.refuse == nil && f.next(t).GetRegister() == nil {
				t.Error("the worker did not send its registration")
			}
		})
	}
}

// TestSessionEnds: the session ends, and says why, when the coordinator
// ends the stream (at once: no timer has to fire first), when a write
// fails, and when the caller cancels it.
func TestSessionEnds(t *testing.T) {
	const beat = 10 * time.Second
	t.Run("coordinator", func(t *testing.T) {
		s := startSession(t, WorkerConfig{})
		s.register(t, beat)
		await(t, s.clk, beat, 1) // registered: the session reads on
		s.end <- status.Error(codes.Unavailable, "missed heartbeats: silent for 5s")
		if err := s.ended(t); err == nil || err.Error() != "receive: rpc error: code = Unavailable desc = missed heartbeats: silent for 5s" {
			t.Errorf("session ended with %v", err)
		}
	})
	t.Run("write", func(t *testing.T) {
		s := startSession(t, WorkerConfig{})
		s.register(t, beat)
		await(t, s.clk, beat, 1)
		boom := errors.New("connection reset")
		s.sendErr.Store(&boom)
		s.clk.Advance(beat) // the heartbeat's write fails
		if err := s.ended(t); err == nil || err.Error() != "send: connection reset" {
			t.Errorf("session ended with %v", err)
		}
	})
	t.Run("caller", func(t *testing.T) {
		s := startSession(t, WorkerConfig{})
		s.register(t, beat)
		await(t, s.clk, beat, 1) // registered: the session reads on
		s.cancel()
		if err := s.ended(t); !errors.Is(err, context.Canceled) {
			t.Errorf("session ended with %v, want context.Canceled", err)
		}
		select {
		case <-s.closedSend:
		default:
			t.Error("the worker did not close its end of the stream")
		}
	})
}
