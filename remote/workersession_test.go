package remote

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/mdag/mdag/api"
	"github.com/mdag/mdag/coordinator"
	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/internal/clocktest"
	"github.com/mdag/mdag/internal/pki"
	"github.com/mdag/mdag/profile"
	"github.com/mdag/mdag/remote/wire"
	"github.com/mdag/mdag/worker"
)

// The coordinator's end of a worker's Connect stream (workerSession)
// driven step by step: the worker is the test, over an in-memory stream,
// the engine a roster, and time moves only on a fake clock. The waits
// below are for the session's goroutines to take a step (a message
// handled, a timer armed); waitLimit bounds them only for a failure's
// sake.
const waitLimit = 30 * time.Second

var t0 = time.Unix(1000, 0)

// await waits until the server has armed its timer n of d: the clock may
// then move.
func await(t testing.TB, c *clocktest.Counting, d time.Duration, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if err := c.Await(ctx, d, n); err != nil {
		t.Fatal(err)
	}
}

// roster stands in for the engine: the instances added, those lost and
// why, and the results.
type roster struct {
	mu      sync.Mutex
	added   map[string]coordinator.Instance
	lost    map[string]string
	results []fromWorker
}

func newRoster() *roster {
	return &roster{added: map[string]coordinator.Instance{}, lost: map[string]string{}}
}

func (r *roster) WorkerTypes() map[profile.WorkerTypeID]bool {
	return map[profile.WorkerTypeID]bool{"CPU": true, "V100": true}
}

func (r *roster) AddInstance(id string, _ profile.WorkerTypeID, inst coordinator.Instance) {
	r.mu.Lock()
	r.added[id] = inst
	r.mu.Unlock()
}

func (r *roster) LostInstance(id, why string) {
	r.mu.Lock()
	r.lost[id] = why
	r.mu.Unlock()
}

func (r *roster) Result(inst string, res worker.Result) {
	r.mu.Lock()
	r.results = append(r.results, fromWorker{inst, res})
	r.mu.Unlock()
}

func (r *roster) instance(id string) coordinator.Instance {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.added[id]
}

func (r *roster) lostWhy(id string) (string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	why, ok := r.lost[id]
	return why, ok
}

func (r *roster) taken() []fromWorker {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]fromWorker(nil), r.results...)
}

// fakeWorker is an in-memory Connect stream, the coordinator's end: the
// session reads in and writes out; the test plays the worker. Each Recv
// after the first tells handled that the message before it has been
// handled. Its context ends when the session returns, as gRPC's does.
type fakeWorker struct {
	ctx     context.Context
	in      chan *api.WorkerMessage
	handled chan struct{}
	got     bool // Recv has returned a message (one goroutine at a time calls it)
	end     chan error
	out     chan *api.CoordinatorMessage
	sendErr atomic.Pointer[error]
	cancel  context.CancelFunc // the call's, where a test keeps it
	done    chan struct{}
	err     error // what the session returned, once done is closed
}

func (f *fakeWorker) Context() context.Context { return f.ctx }

func (f *fakeWorker) Send(m *api.CoordinatorMessage) error {
	if p := f.sendErr.Load(); p != nil {
		return *p
	}
	select {
	case f.out <- m:
		return nil
	case <-f.ctx.Done():
		return status.FromContextError(f.ctx.Err()).Err()
	}
}

func (f *fakeWorker) Recv() (*api.WorkerMessage, error) {
	if f.got {
		select {
		case f.handled <- struct{}{}:
		case <-f.ctx.Done():
			return nil, status.FromContextError(f.ctx.Err()).Err()
		}
	}
	select {
	case m := <-f.in:
		f.got = true
		return m, nil
	case err := <-f.end:
		return nil, err
	case <-f.ctx.Done():
		return nil, status.FromContextError(f.ctx.Err()).Err()
	}
}

// serve runs srv's session on a new fakeWorker whose call has context
// ctx; the test's end cancels the call and waits for the session.
func serve(t testing.TB, srv *Server, ctx context.Context) *fakeWorker {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	f := &fakeWorker{ctx: ctx, in: make(chan *api.WorkerMessage), handled: make(chan struct{}), end: make(chan error, 1),
		out: make(chan *api.CoordinatorMessage, 1024), done: make(chan struct{})}
	go func() {
		defer close(f.done)
		f.err = srv.serveWorker(f)
		cancel()
	}()
	t.Cleanup(func() {
		cancel()
		<-f.done
	})
	return f
}

// deliver hands m to the session's Recv; false if the session ended
// instead.
func (f *fakeWorker) deliver(t testing.TB, m *api.WorkerMessage) bool {
	t.Helper()
	select {
	case f.in <- m:
		return true
	case <-f.done:
		return false
	case <-time.After(waitLimit):
		t.Fatalf("the session did not read a message in %v", waitLimit)
		return false
	}
}

// send delivers m and waits until it has been handled (the receiver is
// back for the next one).
func (f *fakeWorker) send(t testing.TB, m *api.WorkerMessage) {
	t.Helper()
	if !f.deliver(t, m) {
		t.Fatalf("the session ended (%v) before it read %v", f.err, m)
	}
	select {
	case <-f.handled:
	case <-f.done:
		t.Fatalf("the session ended (%v) handling %v", f.err, m)
	case <-time.After(waitLimit):
		t.Fatalf("%v not handled in %v", m, waitLimit)
	}
}

// next is the next message the session sent.
func (f *fakeWorker) next(t testing.TB) *api.CoordinatorMessage {
	t.Helper()
	return clocktest.Recv(t, f.out, waitLimit, "a message from the coordinator")
}

// ended waits for the session to end and returns what it returned.
func (f *fakeWorker) ended(t testing.TB) error {
	t.Helper()
	clocktest.Recv(t, f.done, waitLimit, "the session's end")
	return f.err
}

func (f *fakeWorker) isDone() bool {
	select {
	case <-f.done:
		return true
	default:
		return false
	}
}

// register registers reg and returns the coordinator's acknowledgement;
// once it returns the session is registered, its heartbeat watch armed
// and its receiver waiting.
func (f *fakeWorker) register(t testing.TB, reg *api.Register) *api.Registered {
	t.Helper()
	f.send(t, registerMsg(reg))
	m := f.next(t)
	if m.GetRegistered() == nil {
		t.Fatalf("the coordinator answered the registration with %v", m)
	}
	return m.GetRegistered()
}

func registerMsg(reg *api.Register) *api.WorkerMessage {
	return &api.WorkerMessage{Msg: &api.WorkerMessage_Register{Register: reg}}
}

var heartbeatMsg = &api.WorkerMessage{Msg: &api.WorkerMessage_Heartbeat{Heartbeat: &api.Heartbeat{}}}

// newSessionServer is a Server on clk with a roster for its engine.
func newSessionServer(clk clock.Clock, hb time.Duration, logs *logBuf) (*Server, *roster) {
	r := newRoster()
	srv := &Server{Heartbeat: hb, Clock: clk, insts: r}
	if logs != nil {
		srv.Log = slog.New(slog.NewTextHandler(logs, nil))
	}
	return srv, r
}

// TestSessionMissedHeartbeats: any message from the worker is a sign of
// life; the coordinator checks at registration and every interval after,
// and a worker silent for more than 4 intervals is lost at the next
// check, on the clock: not a nanosecond before. The engine is told why
// and the stream ends Unavailable with the reason.
func TestSessionMissedHeartbeats(t *testing.T) {
	const hb = time.Second
	clk := clocktest.NewCounting(t0)
	srv, eng := newSessionServer(clk, hb, nil)
	f := serve(t, srv, context.Background())
	if ack := f.register(t, &api.Register{Id: "w1", Type: "CPU"}); ack.HeartbeatIntervalNs != int64(hb) || ack.Id != "w1" {
		t.Fatalf("ack %v", ack)
	}
	if eng.instance("w1") == nil {
		t.Fatal("the engine was not given the worker")
	}
	clk.Advance(3 * hb)
	f.send(t, heartbeatMsg)
	// silent since +3 s: the checks at +4..+7 s see at most 4 intervals
	clk.Advance(5*hb - time.Nanosecond)
	if next, ok := clk.Next(); !ok || !next.Equal(t0.Add(8*hb)) {
		t.Fatalf("after 4 silent intervals the next check is at %v (%v), want +8s: the watch stopped", next.Sub(t0), ok)
	}
	if _, lost := eng.lostWhy("w1"); lost || f.isDone() {
		t.Fatal("lost before the check past 4 silent intervals")
	}
	clk.Advance(time.Nanosecond)
	err := f.ended(t)
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "missed heartbeats: silent for 5s") {
		t.Errorf("the stream ended with %v, want Unavailable: missed heartbeats: silent for 5s", err)
	}
	if why, _ := eng.lostWhy("w1"); why != "missed heartbeats: silent for 5s" {
		t.Errorf("the engine was told %q", why)
	}
	if w := srv.Workers(); len(w) != 0 {
		t.Errorf("still connected: %v", w)
	}
}

// TestSessionRegistrationRefused: each registration the coordinator
// refuses, with its code and reason; a refused worker never reaches the
// engine nor the connected workers.
func TestSessionRegistrationRefused(t *testing.T) {
	reg := func(id, typ string) *api.WorkerMessage { return registerMsg(&api.Register{Id: id, Type: typ}) }
	for _, tc := range []struct {
		name   string
		limits Limits
		ctx    context.Context    // the call's; nil: plaintext, no peer
		first  *api.WorkerMessage // nil: none (the stream is refused before it is read)
		code   codes.Code
		want   string
		count  string // the refusal counted, if any
	}{
		{name: "misconfigured", limits: Limits{MaxBoxes: -1}, code: codes.FailedPrecondition, want: "coordinator misconfigured: remote.Limits.MaxBoxes = -1"},
		{name: "not a registration", first: heartbeatMsg, code: codes.InvalidArgument, want: "the first message on Connect must be register"},
		{name: "no id", first: reg("", "CPU"), code: codes.InvalidArgument, want: "register: field id is required", count: RefusedRegister},
		{name: "no type", first: reg("w9", ""), code: codes.InvalidArgument, want: "register: field type is required", count: RefusedRegister},
		{name: "long id", first: reg(strings.Repeat("x", 129), "CPU"), code: codes.InvalidArgument, want: "register: field id has 129 bytes; at most 128", count: RefusedRegister},
		{name: "id with a newline", first: reg("w9\nlevel=ERROR msg=forged", "CPU"), code: codes.InvalidArgument, want: "field id must be printable ASCII without spaces", count: RefusedRegister},
		{name: "id with a space", first: reg("w 9", "CPU"), code: codes.InvalidArgument, want: "field id must be printable ASCII without spaces", count: RefusedRegister},
		{name: "long type", first: reg("w9", strings.Repeat("T", 1<<20)), code: codes.InvalidArgument, want: "register: field type has 1048576 bytes; at most 128", count: RefusedRegister},
		{name: "long executor", first: registerMsg(&api.Register{Id: "w9", Type: "CPU", Executor: strings.Repeat("e", 129)}), code: codes.InvalidArgument,
			want: "register: field executor has 129 bytes; at most 128", count: RefusedRegister},
		{name: "gpu with an escape", first: registerMsg(&api.Register{Id: "w9", Type: "CPU", Gpu: "driver 1; \x1b[2J"}), code: codes.InvalidArgument,
			want: "register: field gpu must be printable ASCII", count: RefusedRegister},
		{name: "long gpu", first: registerMsg(&api.Register{Id: "w9", Type: "CPU", Gpu: strings.Repeat("g", 1025)}), code: codes.InvalidArgument,
			want: "register: field gpu has 1025 bytes; at most 1024", count: RefusedRegister},
		{name: "unknown type", first: reg("w9", "TPU"), code: codes.InvalidArgument, want: `register w9: worker type "TPU" is in no deployed app's profiles (known: CPU, V100)`},
		{name: "long peer address", first: registerMsg(&api.Register{Id: "w9", Type: "CPU", PeerAddr: strings.Repeat("1", wire.MaxRefField+1)}), code: codes.InvalidArgument,
			want: "register w9: peer address of"},
		{name: "another certificate's id", ctx: withCert(context.Background(), pki.Worker, "gpu-1", 40000), first: reg("w9", "CPU"), code: codes.PermissionDenied,
			want: `register: worker ID "w9" is not the certificate's: mdag://worker/gpu-1`, count: RefusedIdentity},
		{name: "rate limited", limits: Limits{PeerRate: 1, PeerBurst: 0.5}, code: codes.ResourceExhausted, want: "register: unknown connects more often than 1 a second (burst 0.5)", count: RefusedRatePeer},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, eng := newSessionServer(clocktest.NewCounting(t0), time.Second, nil)
			srv.Limits = tc.limits
			if tc.ctx == nil {
				tc.ctx = context.Background()
			}
			f := serve(t, srv, tc.ctx)
			if tc.first != nil && !f.deliver(t, tc.first) {
				t.Fatalf("the stream was refused before its first message: %v", f.err)
			}
			err := f.ended(t)
			if status.Code(err) != tc.code || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want %v containing %q", err, tc.code, tc.want)
			}
			if tc.count != "" && srv.Refused()[tc.count] != 1 {
				t.Errorf("refusals %v, want one %s", srv.Refused(), tc.count)
			}
			if len(srv.Workers()) != 0 || eng.instance("w9") != nil {
				t.Error("a refused worker was registered")
			}
		})
	}
}

// TestSessionRegistrationSteps: a worker ID already connected is refused;
// a stream that sends nothing is refused after Limits.FirstMessage on the
// clock, not before; an acknowledgement that cannot be sent ends the
// session before the engine hears of the worker.
func TestSessionRegistrationSteps(t *testing.T) {
	t.Run("duplicate id", func(t *testing.T) {
		srv, eng := newSessionServer(clocktest.NewCounting(t0), time.Hour, nil)
		serve(t, srv, context.Background()).register(t, &api.Register{Id: "w1", Type: "CPU"})
		f := serve(t, srv, context.Background())
		f.deliver(t, registerMsg(&api.Register{Id: "w1", Type: "V100"}))
		if err := f.ended(t); status.Code(err) != codes.AlreadyExists || !strings.Contains(err.Error(), `a worker with id "w1" is already connected`) {
			t.Errorf("a second w1: %v", err)
		}
		if _, lost := eng.lostWhy("w1"); lost || len(srv.Workers()) != 1 {
			t.Errorf("the refused second w1 disturbed the first: lost %v, connected %v", lost, srv.Workers())
		}
	})
	t.Run("first message", func(t *testing.T) {
		clk := clocktest.NewCounting(t0)
		srv, _ := newSessionServer(clk, time.Hour, nil)
		srv.Limits.FirstMessage = 10 * time.Second
		f := serve(t, srv, context.Background())
		await(t, clk, 10*time.Second, 1)
		clk.Advance(10*time.Second - time.Nanosecond)
		if f.isDone() {
			t.Fatalf("refused before FirstMessage: %v", f.err)
		}
		clk.Advance(time.Nanosecond)
		if err := f.ended(t); status.Code(err) != codes.DeadlineExceeded || !strings.Contains(err.Error(), "connect: no register message within 10s") {
			t.Errorf("a stream that never registered: %v", err)
		}
		if n := srv.Refused()[RefusedFirstMessage]; n != 1 {
			t.Errorf("%d %s refusals, want 1", n, RefusedFirstMessage)
		}
	})
	t.Run("acknowledgement fails", func(t *testing.T) {
		srv, eng := newSessionServer(clocktest.NewCounting(t0), time.Hour, nil)
		f := serve(t, srv, context.Background())
		gone := status.Error(codes.Unavailable, "transport is closing")
		f.sendErr.Store(&gone)
		f.deliver(t, registerMsg(&api.Register{Id: "w1", Type: "CPU"}))
		if err := f.ended(t); !errors.Is(err, gone) {
			t.Errorf("session ended with %v, want the send's error", err)
		}
		if eng.instance("w1") != nil || len(srv.Workers()) != 0 {
			t.Error("a worker that was never acknowledged is connected")
		}
	})
}

// TestSessionDataPlane: the acknowledgement tells a worker to hold its
// outputs' frames only when its peer address is the address it connects
// from and the coordinator does not relay.
func TestSessionDataPlane(t *testing.T) {
	from := peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.IPv4(10, 0, 0, 7), Port: 40000}})
	for _, tc := range []struct {
		name   string
		ctx    context.Context
		addr   string
		relay  bool
		direct bool
	}{
		{"its own address", from, "10.0.0.7:7071", false, true},
		{"no peer address", from, "", false, false},
		{"another host", from, "10.0.0.8:7071", false, false},
		{"a name", from, "worker-7:7071", false, false},
		{"unknown caller", context.Background(), "10.0.0.7:7071", false, false},
		{"relay", from, "10.0.0.7:7071", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, _ := newSessionServer(clocktest.NewCounting(t0), time.Hour, nil)
			srv.Relay = tc.relay
			ack := serve(t, srv, tc.ctx).register(t, &api.Register{Id: "w1", Type: "CPU", PeerAddr: tc.addr})
			if ack.Direct != tc.direct {
				t.Errorf("direct %v, want %v", ack.Direct, tc.direct)
			}
		})
	}
}

// TestSessionResults: a result reaches the engine only for a task given
// to that worker and not answered yet; any other is refused (counted,
// logged with the worker's ID once an interval). A result over the caps
// is BadResult: its task was given. The given task's load and the task
// itself go down the stream in order.
func TestSessionResults(t *testing.T) {
	var logs logBuf
	srv, eng := newSessionServer(clocktest.NewCounting(t0), time.Hour, &logs)
	srv.Limits.MaxResultItems = 2
	f := serve(t, srv, context.Background())
	f.register(t, &api.Register{Id: "hand", Type: "V100"})
	inst := eng.instance("hand")
	if err := inst.Load([]worker.ModuleSpec{{App: "a", Module: "c", Kind: dag.CPU, Op: "sink", Concurrency: 1}}); err != nil {
		t.Fatal(err)
	}
	inst.Submit(worker.Task{ID: 1, App: "a", Module: "c"})
	inst.Submit(worker.Task{ID: 2, App: "a", Module: "c"})
	if l := f.next(t).GetLoad(); l == nil || l.Generation != 1 || len(l.Modules) != 1 {
		t.Fatalf("first down the stream: %v, want load 1", l)
	}
	for _, id := range []uint64{1, 2} {
		if tk := f.next(t).GetTask(); tk == nil || tk.Id != id {
			t.Fatalf("then %v, want task %d", tk, id)
		}
	}
	answer := func(task uint64, items ...*api.Item) {
		t.Helper()
		o, outs := api.Outcome_OUTCOME_MODULE_ERROR, []*api.ItemList(nil)
		if items != nil {
			o, outs = api.Outcome_OUTCOME_OK, []*api.ItemList{{Items: items}}
		}
		f.send(t, &api.WorkerMessage{Msg: &api.WorkerMessage_Result{Result: &api.Result{Task: task, Outcome: o, Detail: "hand-written", Outputs: outs}}})
	}
	answer(1_000_000) // never given
	answer(1)         // given: taken
	answer(1)         // answered already
	// three items, over MaxResultItems: BadResult, counted
	answer(2, &api.Item{Stream: "cam"}, &api.Item{Stream: "cam"}, &api.Item{Stream: "cam"})
	answer(2) // answered already
	got := eng.taken()
	if len(got) != 2 || got[0].inst != "hand" || got[0].r.Task != 1 || got[0].r.Outcome != worker.ModuleError ||
		got[1].r.Task != 2 || got[1].r.Outcome != worker.BadResult || !strings.Contains(got[1].r.Detail, "refused by the coordinator") {
		t.Fatalf("the engine got %+v; want task 1's module error and task 2 as BadResult", got)
	}
	if r := srv.Refused(); r[RefusedUnknownTask] != 3 || r[RefusedResultItems] != 1 {
		t.Errorf("refusals %v: want 3 unknown-task (a task never given, two answered twice) and 1 result-items", r)
	}
	log := logs.String()
	for _, want := range []string{"instance=hand", "reason=unknown-task", "which was not given to it or was already answered", "reason=result-items", "has 3 output items, the limit is 2"} {
		if !strings.Contains(log, want) {
			t.Errorf("log lacks %q:\n%s", want, log)
		}
	}
	if n := strings.Count(log, "reason=unknown-task"); n != 1 {
		t.Errorf("logged %d unknown-task lines in one interval, want 1", n)
	}
}

// TestSessionLeave: how a session ends, what the engine is told and what
// the stream returns: the coordinator releases the worker, the worker
// closes its stream, the call is cancelled, a write fails, a message over
// the size limit (counted).
func TestSessionLeave(t *testing.T) {
	for _, tc := range []struct {
		name string
		end  func(*fakeWorker, coordinator.Instance)
		why  string
		code codes.Code // codes.OK: the session returns nil
	}{
		{"released", func(_ *fakeWorker, in coordinator.Instance) { in.Close() }, "released by the coordinator", codes.Unavailable},
		{"worker closes", func(f *fakeWorker, _ coordinator.Instance) { f.end <- io.EOF }, "receive: EOF", codes.OK},
		{"stream breaks", func(f *fakeWorker, _ coordinator.Instance) {
			f.end <- status.Error(codes.Unavailable, "connection reset")
		}, "receive: rpc error: code = Unavailable desc = connection reset", codes.Unavailable},
		{"too large", func(f *fakeWorker, _ coordinator.Instance) {
			f.end <- status.Error(codes.ResourceExhausted, "grpc: received message larger than max")
		}, "receive: rpc error: code = ResourceExhausted desc = grpc: received message larger than max", codes.Unavailable},
		{"write fails", func(f *fakeWorker, in coordinator.Instance) {
			gone := errors.New("transport is closing")
			f.sendErr.Store(&gone)
			_ = in.Load(nil) // queued: the sender's write fails
		}, "send: transport is closing", codes.Unavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, eng := newSessionServer(clocktest.NewCounting(t0), time.Hour, nil)
			f := serve(t, srv, context.Background())
			f.register(t, &api.Register{Id: "w1", Type: "CPU"})
			tc.end(f, eng.instance("w1"))
			err := f.ended(t)
			if status.Code(err) != tc.code || tc.code != codes.OK && !strings.Contains(err.Error(), tc.why) {
				t.Errorf("the session returned %v, want %v %q", err, tc.code, tc.why)
			}
			if why, _ := eng.lostWhy("w1"); why != tc.why {
				t.Errorf("the engine was told %q, want %q", why, tc.why)
			}
			want := uint64(0)
			if tc.name == "too large" {
				want = 1 // refused by gRPC unread: counted
			}
			if n := srv.Refused()[RefusedMessage]; n != want {
				t.Errorf("%d %s refusals, want %d", n, RefusedMessage, want)
			}
			if err := eng.instance("w1").Load(nil); err == nil {
				t.Error("a lost worker's instance took a load")
			}
		})
	}
	t.Run("call cancelled", func(t *testing.T) {
		srv, eng := newSessionServer(clocktest.NewCounting(t0), time.Hour, nil)
		ctx, cancel := context.WithCancel(context.Background())
		f := serve(t, srv, ctx)
		f.register(t, &api.Register{Id: "w1", Type: "CPU"})
		cancel()
		if err := f.ended(t); status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "stream ended") {
			t.Errorf("the session returned %v", err)
		}
		if why, _ := eng.lostWhy("w1"); why != "stream ended" {
			t.Errorf("the engine was told %q", why)
		}
	})
}

// withCert is ctx as a call from 10.0.0.7:port whose mutual TLS handshake
// verified a certificate of role and name.
func withCert(ctx context.Context, role pki.Role, name string, port int) context.Context {
	leaf := &x509.Certificate{URIs: []*url.URL{pki.IdentityURI(role, name)}}
	return peer.NewContext(ctx, &peer.Peer{Addr: &net.TCPAddr{IP: net.IPv4(10, 0, 0, 7), Port: port},
		AuthInfo: credentials.TLSInfo{State: tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{leaf}}}}})
}

// TestSessionStreamsPerPeer (issue 36, the --max-message finding): one
// worker certificate has at most Limits.MaxWorkerStreams Connect streams
// open, and a stream over it is refused before its first message is read;
// a shared certificate counts per connection (its holders are workers of
// their own, several to a host); another certificate is not affected; a
// closed stream frees its place. A stream is counted before it waits for
// its first message, on the clock: the test counts those waits.
func TestSessionStreamsPerPeer(t *testing.T) {
	clk := clocktest.NewCounting(t0)
	srv, _ := newSessionServer(clk, time.Hour, nil)
	srv.Shared = []SharedCert{{Role: pki.Worker, Name: "fleet", Prefixes: []string{"*"}}}
	first := DefaultLimits.FirstMessage
	waiting := 0
	open := func(name string, port int) *fakeWorker {
		t.Helper()
		ctx, cancel := context.WithCancel(withCert(context.Background(), pki.Worker, name, port))
		t.Cleanup(cancel)
		f := serve(t, srv, ctx)
		f.cancel = cancel
		return f
	}
	admitted := func(name string, port int) *fakeWorker {
		t.Helper()
		f := open(name, port)
		waiting++
		await(t, clk, first, waiting)
		return f
	}
	streams := func() map[string]int {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		return maps.Clone(srv.workerStreams)
	}
	gpu1 := admitted("gpu-1", 1)
	admitted("gpu-1", 2)
	third := open("gpu-1", 3)
	if third.deliver(t, registerMsg(&api.Register{Id: "gpu-1", Type: strings.Repeat("x", 8<<20)})) {
		t.Fatal("gpu-1's third stream was read")
	}
	if err := third.err; status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "connect: mdag://worker/gpu-1 already has 2 Connect streams open") {
		t.Fatalf("gpu-1's third Connect stream: %v; want ResourceExhausted, already has 2 Connect streams open", err)
	}
	if r := srv.Refused(); r[RefusedWorkerStream] != 1 || r[RefusedRegister] != 0 {
		t.Errorf("refusals %v: want 1 %s and its register unread", r, RefusedWorkerStream)
	}
	admitted("gpu-2", 4) // another certificate has its own count
	for port := 5; port <= 7; port++ {
		admitted("fleet", port) // a shared certificate counts per connection
	}
	want := map[string]int{"mdag://worker/gpu-1": 2, "mdag://worker/gpu-2": 1,
		"mdag://worker/fleet at 10.0.0.7:5": 1, "mdag://worker/fleet at 10.0.0.7:6": 1, "mdag://worker/fleet at 10.0.0.7:7": 1}
	if got := streams(); !maps.Equal(got, want) {
		t.Errorf("open streams %v, want %v", got, want)
	}
	gpu1.cancel() // closing one of gpu-1's streams frees its place
	gpu1.ended(t)
	if n := streams()["mdag://worker/gpu-1"]; n != 1 {
		t.Errorf("gpu-1 has %d streams counted after one closed, want 1", n)
	}
	admitted("gpu-1", 8)
	if n := srv.Refused()[RefusedWorkerStream]; n != 1 {
		t.Errorf("%s refusals %d after a stream closed, want still 1", RefusedWorkerStream, n)
	}
}
