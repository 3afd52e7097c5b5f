package remote

import (
	"context"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/mdag/mdag/api"
	"github.com/mdag/mdag/ingest/synth"
	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/remote/client"
	"github.com/mdag/mdag/remote/wire"
)

// rawWorker is a worker's Connect stream driven message by message.
type rawWorker struct {
	t      *testing.T
	st     api.Coordinator_ConnectClient
	cancel context.CancelFunc
	msgs   chan *api.CoordinatorMessage
}

// connectRaw registers reg on c and reads what the coordinator sends.
func connectRaw(t *testing.T, c *loopback, reg *api.Register) *rawWorker {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	st, err := api.NewCoordinatorClient(c.cc).Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&api.WorkerMessage{Msg: &api.WorkerMessage_Register{Register: reg}}); err != nil {
		t.Fatal(err)
	}
	if m, err := st.Recv(); err != nil || m.GetRegistered() == nil {
		t.Fatalf("register %s: %v %v", reg.Id, m, err)
	}
	w := &rawWorker{t: t, st: st, cancel: cancel, msgs: make(chan *api.CoordinatorMessage, 256)}
	go func() {
		defer close(w.msgs)
		for {
			m, err := st.Recv()
			if err != nil {
				return
			}
			if b := m.GetBatch(); b != nil {
				for _, in := range b.Msgs {
					w.msgs <- in
				}
				continue
			}
			w.msgs <- m
		}
	}()
	return w
}

func (w *rawWorker) send(m *api.WorkerMessage) {
	w.t.Helper()
	if err := w.st.Send(m); err != nil {
		w.t.Fatal(err)
	}
}

// next is the next message pick takes, within 20 s.
func (w *rawWorker) next(what string, pick func(*api.CoordinatorMessage) bool) *api.CoordinatorMessage {
	w.t.Helper()
	tm := time.After(20 * time.Second)
	for {
		select {
		case m, ok := <-w.msgs:
			if !ok {
				w.t.Fatalf("the stream ended waiting for %s", what)
			}
			if pick(m) {
				return m
			}
		case <-tm:
			w.t.Fatalf("no %s within 20 s", what)
		}
	}
}

// none says no message pick takes is queued now.
func (w *rawWorker) none(pick func(*api.CoordinatorMessage) bool) bool {
	for {
		select {
		case m, ok := <-w.msgs:
			if !ok {
				return true
			}
			if pick(m) {
				return false
			}
		default:
			return true
		}
	}
}

func isAssign(m *api.CoordinatorMessage) bool { return m.GetCameraAssign() != nil }

// fakeReaders are the coordinator's own camera readers in a test.
type fakeReaders struct {
	mu             sync.Mutex
	started, alive int
}

type fakeReader struct {
	f    *fakeReaders
	once sync.Once
}

func (f *fakeReaders) start(Camera) (CameraReader, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.started++
	f.alive++
	return &fakeReader{f: f}, nil
}

func (f *fakeReaders) counts() (started, alive int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.started, f.alive
}

func (r *fakeReader) Report() wire.CameraReport {
	return wire.CameraReport{State: "streaming", Frames: 7}
}
func (r *fakeReader) Stop() {
	r.once.Do(func() {
		r.f.mu.Lock()
		r.f.alive--
		r.f.mu.Unlock()
	})
}

func placeOf(s *Server, name string) CameraPlace {
	for _, p := range s.CameraPlaces() {
		if p.Name == name {
			return p
		}
	}
	return CameraPlace{}
}

// TestCameraPlacement: the coordinator's camera is read by the coordinator
// while no worker reads cameras (a worker that ingests but reads none is
// not asked), moves to the first that does (its reader here stopped), is
// joined there without a ticket (another stream without one is refused),
// takes that worker's states (a state of a camera not assigned to it is
// refused, counted "camera"), moves to another worker when that one is
// lost, and back to the coordinator when the last refuses it.
func TestCameraPlacement(t *testing.T) {
	app, prof := loadExample(t, "traffic")
	// the raw workers send no heartbeats: an hour keeps them
	c := startServer(t, app, prof, &Server{Heartbeat: time.Hour})
	readers := &fakeReaders{}
	stop := c.srv.StartCameras([]Camera{{Name: "gate", App: "traffic", URL: "rtsp://u:pw@cam.local/x", FPS: 5}}, readers.start, 0)
	rounds := func(n uint64) {
		t.Helper()
		from := c.srv.cams.Load().rounds.Load()
		waitFor(t, "placement rounds", 20*time.Second, func() bool { return c.srv.cams.Load().rounds.Load() >= from+n })
	}
	defer stop()
	waitFor(t, "the coordinator reading the camera", 20*time.Second, func() bool { return placeOf(c.srv, "gate").On == OnCoordinator })
	if p := placeOf(c.srv, "gate"); p.State != "streaming" || p.Frames != 7 || p.Moves != 0 {
		t.Fatalf("read here: %+v", p)
	}

	lean := connectRaw(t, c, &api.Register{Id: "w0", Type: "CPU", Executor: "emulated", PeerAddr: "127.0.0.1:1", IngestAddr: "127.0.0.1:2"})
	w1 := connectRaw(t, c, &api.Register{Id: "w1", Type: "CPU", Executor: "emulated", PeerAddr: "127.0.0.1:1", IngestAddr: "127.0.0.1:3", Cameras: true})
	a := w1.next("the camera's assignment", isAssign).GetCameraAssign()
	if a.Stream != "gate" || a.App != "traffic" || a.Url != "rtsp://u:pw@cam.local/x" || a.Fps != 5 || a.MaxFrameW <= 0 || a.MaxFrameH <= 0 {
		t.Fatalf("assignment: %+v", a)
	}
	rounds(2)
	if !lean.none(isAssign) {
		t.Error("a worker that reads no cameras was assigned one")
	}
	waitFor(t, "the reader here stopped", 20*time.Second, func() bool { _, alive := readers.counts(); return alive == 0 })
	if p := placeOf(c.srv, "gate"); p.On != "w1" || p.Moves != 1 {
		t.Fatalf("on w1: %+v", p)
	}

	w1.send(&api.WorkerMessage{Msg: &api.WorkerMessage_StreamJoin{StreamJoin: &api.StreamJoin{Id: 1, App: "traffic", Stream: "gate"}}})
	if j := w1.next("the camera's join answer", func(m *api.CoordinatorMessage) bool { return m.GetStreamJoined() != nil }).GetStreamJoined(); j.Code != 0 {
		t.Fatalf("the assigned camera's join without a ticket: %+v", j)
	}
	w1.send(&api.WorkerMessage{Msg: &api.WorkerMessage_StreamJoin{StreamJoin: &api.StreamJoin{Id: 2, App: "traffic", Stream: "door"}}})
	if j := w1.next("the other join's answer", func(m *api.CoordinatorMessage) bool { return m.GetStreamJoined() != nil }).GetStreamJoined(); j.Code != int32(codes.Unavailable) {
		t.Fatalf("a stream not assigned joined without a ticket: %+v", j)
	}
	w1.send(&api.WorkerMessage{Msg: &api.WorkerMessage_CameraState{CameraState: &api.CameraState{Stream: "gate", State: "streaming", Codec: "h264", Frames: 42}}})
	w1.send(&api.WorkerMessage{Msg: &api.WorkerMessage_CameraState{CameraState: &api.CameraState{Stream: "door", State: "streaming"}}})
	waitFor(t, "the worker's camera state, and the other refused", 20*time.Second, func() bool {
		p := placeOf(c.srv, "gate")
		return p.State == "streaming" && p.Codec == "h264" && p.Frames == 42 && c.srv.Refused()[RefusedCamera] == 1
	})

	w2 := connectRaw(t, c, &api.Register{Id: "w2", Type: "CPU", Executor: "emulated", PeerAddr: "127.0.0.1:1", IngestAddr: "127.0.0.1:4", Cameras: true})
	rounds(2)
	if !w2.none(isAssign) {
		t.Fatal("a camera read by a live worker moved")
	}
	w1.cancel() // lost
	if a := w2.next("the camera's assignment after its worker was lost", isAssign).GetCameraAssign(); a.Stream != "gate" {
		t.Fatalf("assignment: %+v", a)
	}
	waitFor(t, "the camera on w2", 20*time.Second, func() bool { p := placeOf(c.srv, "gate"); return p.On == "w2" && p.Moves == 2 })

	w2.send(&api.WorkerMessage{Msg: &api.WorkerMessage_CameraState{CameraState: &api.CameraState{Stream: "gate", State: wire.CameraRefused, LastError: "reads 1024 cameras"}}})
	waitFor(t, "the refused camera read here again", 20*time.Second, func() bool {
		p := placeOf(c.srv, "gate")
		started, alive := readers.counts()
		return p.On == OnCoordinator && p.Moves == 3 && started == 2 && alive == 1
	})
	stop()
	if _, alive := readers.counts(); alive != 0 {
		t.Error("the reader here outlived the stop")
	}
}

// TestCameraGrace: with a grace, the coordinator reads a camera itself
// only once no worker that reads cameras has been connected for that long
// (on the server's clock).
func TestCameraGrace(t *testing.T) {
	app, prof := loadExample(t, "traffic")
	clk := clock.NewFake(time.Unix(1_800_000_000, 0))
	c := startServer(t, app, prof, &Server{Heartbeat: time.Hour, Clock: clk})
	readers := &fakeReaders{}
	stop := c.srv.StartCameras([]Camera{{Name: "gate", App: "traffic", URL: "rtsp://cam.local/x"}}, readers.start, 10*time.Second)
	defer stop()
	step := func() {
		t.Helper()
		waitFor(t, "the placer waiting on the clock", 20*time.Second, func() bool { return clk.Pending() > 0 })
		clk.Advance(time.Second)
	}
	for range 9 {
		step()
	}
	waitFor(t, "the placer waiting on the clock", 20*time.Second, func() bool { return clk.Pending() > 0 })
	if p := placeOf(c.srv, "gate"); p.On != "" || p.State != "waiting" {
		t.Fatalf("within the grace: %+v", p)
	}
	if started, _ := readers.counts(); started != 0 {
		t.Fatal("read here within the grace")
	}
	step()
	waitFor(t, "the coordinator reading it after the grace", 20*time.Second, func() bool { return placeOf(c.srv, "gate").On == OnCoordinator })
}

// synthCamera is a camera a worker reads in tests: the synthetic pattern
// at 10 fps, joined through the worker's session (IngestServer.OpenLocal)
// and joined again after a refusal, as a reconnecting reader would.
type synthCamera struct {
	stop, done chan struct{}
	mu         sync.Mutex
	rep        wire.CameraReport
}

func synthCameras(t *testing.T) client.CameraReader {
	return func(a client.CameraAssignment, g *client.IngestServer) (client.CameraReading, error) {
		pat, err := synth.NewPattern(320, 240, 3)
		if err != nil {
			return nil, err
		}
		r := &synthCamera{stop: make(chan struct{}), done: make(chan struct{}), rep: wire.CameraReport{State: "connecting"}}
		go r.run(a, g, pat)
		return r, nil
	}
}

func (r *synthCamera) run(a client.CameraAssignment, g *client.IngestServer, pat *synth.Pattern) {
	defer close(r.done)
	var ls *client.LocalStream
	defer func() {
		if ls != nil {
			ls.Close()
		}
	}()
	for seq := uint64(1); ; seq++ {
		select {
		case <-r.stop:
			return
		case <-time.After(100 * time.Millisecond):
		}
		if ls == nil {
			var err error
			if ls, err = g.OpenLocal(a.App, a.Stream); err != nil {
				r.set(wire.CameraReport{State: "reconnecting", LastError: err.Error()})
				continue
			}
		}
		f, truth, err := pat.Frame(0, seq)
		if err == nil {
			err = ls.Frame(seq, time.Now(), f, truth)
		}
		if err != nil {
			ls.Close()
			ls = nil
			r.set(wire.CameraReport{State: "reconnecting", LastError: err.Error()})
			continue
		}
		r.mu.Lock()
		r.rep.State = "streaming"
		r.rep.Frames++
		r.mu.Unlock()
	}
}

func (r *synthCamera) set(rep wire.CameraReport) {
	r.mu.Lock()
	defer r.mu.Unlock()
	rep.Frames = r.rep.Frames
	r.rep = rep
}

func (r *synthCamera) Report() wire.CameraReport {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.rep
}

func (r *synthCamera) Stop() {
	select {
	case <-r.stop:
	default:
		close(r.stop)
	}
	<-r.done
}

// TestCamerasOnWorkers: the coordinator's camera (a synthetic one) read by
// an ingest worker that reads cameras: its frames are held there and only
// their references come to the coordinator (no pixels: nothing from
// sources, nothing relayed), the worker's state of it reaches the
// coordinator; the worker dies and the camera goes on from the other, as
// one stream; every frame the coordinator saw ends finished, late or
// dropped with a reason.
func TestCamerasOnWorkers(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a few seconds of a live stream")
	}
	app, prof := loadExample(t, "traffic")
	c := startServer(t, app, prof, &Server{Heartbeat: 100 * time.Millisecond})
	workers := map[string]*directWorker{}
	for _, id := range []string{"gpu-a", "gpu-b"} {
		workers[id] = c.directWorkerWith(t, id, "V100", false)
	}
	for _, id := range []string{"cpu-a", "cpu-b"} {
		workers[id] = c.directWorkerCams(t, id, "CPU", true, synthCameras(t))
	}
	stop := c.srv.StartCameras([]Camera{{Name: "gate", App: "traffic", URL: "rtsp://cam.local/x", FPS: 10}}, nil, 0)
	defer stop()
	ended := func() uint64 {
		st := c.e.Status()
		if len(st.Sessions) == 0 {
			return 0
		}
		tot := st.Sessions[0].Total
		return tot.Finished + tot.Late + tot.Dropped
	}
	waitFor(t, "the camera read on a worker, frames ended, its state reported", 30*time.Second, func() bool {
		p := placeOf(c.srv, "gate")
		return p.On != "" && workers[p.On].ingest.Stats().Frames > 0 && ended() > 10 && p.State == "streaming"
	})
	victim := placeOf(c.srv, "gate").On
	if rcv, pl := c.srv.Received(), c.srv.Plane(); rcv.Sources != 0 || pl.RelayedBytes != 0 {
		t.Errorf("pixels reached the coordinator: received %+v, plane %+v", rcv, pl)
	}
	workers[victim].kill()
	other := map[string]string{"cpu-a": "cpu-b", "cpu-b": "cpu-a"}[victim]
	before := workers[other].ingest.Stats().Frames
	waitFor(t, "the camera going on from the other worker", 30*time.Second, func() bool {
		p := placeOf(c.srv, "gate")
		return p.On == other && p.Moves == 1 && workers[other].ingest.Stats().Frames >= before+10
	})
	if st := c.e.Status().Sessions[0]; st.Streams != 1 {
		t.Errorf("%d streams, want the camera's one", st.Streams)
	}
	stop()
	waitFor(t, "every frame to end", 20*time.Second, func() bool {
		ss := c.e.Status().Sessions[0]
		return ss.Open == 0 && ss.Streams == 0
	})
	ss := c.e.Status().Sessions[0]
	var reasons uint64
	for _, n := range ss.Drops {
		reasons += n
	}
	if tot := ss.Total; tot.Sent == 0 || tot.Finished+tot.Late+tot.Dropped != tot.Sent || reasons != tot.Dropped {
		t.Errorf("accounting: %+v, drops %v", tot, ss.Drops)
	}
}

// slowReader is a camera read here whose Stop waits for the test.
type slowReader struct {
	release chan struct{}
	stopped chan struct{}
	once    sync.Once
}

func (r *slowReader) Report() wire.CameraReport { return wire.CameraReport{State: "streaming"} }
func (r *slowReader) Stop() {
	r.once.Do(func() {
		<-r.release
		close(r.stopped)
	})
}

// TestCameraPlacerSlowStop: a reader here that takes long to stop (its
// stream's leave waits on the engine) holds up neither the status nor a
// worker's camera states; the camera goes to the worker once it stopped.
func TestCameraPlacerSlowStop(t *testing.T) {
	app, prof := loadExample(t, "traffic")
	c := startServer(t, app, prof, &Server{Heartbeat: time.Hour})
	r := &slowReader{release: make(chan struct{}), stopped: make(chan struct{})}
	stop := c.srv.StartCameras([]Camera{{Name: "gate", App: "traffic", URL: "rtsp://cam.local/x"}},
		func(Camera) (CameraReader, error) { return r, nil }, 0)
	defer stop()
	waitFor(t, "the coordinator reading the camera", 20*time.Second, func() bool { return placeOf(c.srv, "gate").On == OnCoordinator })
	w1 := connectRaw(t, c, &api.Register{Id: "w1", Type: "CPU", Executor: "emulated", PeerAddr: "127.0.0.1:1", IngestAddr: "127.0.0.1:3", Cameras: true})
	waitFor(t, "the camera moving", 20*time.Second, func() bool { return placeOf(c.srv, "gate").State == "moving" })
	w1.send(&api.WorkerMessage{Msg: &api.WorkerMessage_CameraState{CameraState: &api.CameraState{Stream: "other", State: "streaming"}}})
	waitFor(t, "the worker's message handled while the reader stops", 20*time.Second, func() bool { return c.srv.Refused()[RefusedCamera] == 1 })
	select {
	case <-r.stopped:
		t.Fatal("stopped before released")
	default:
	}
	close(r.release)
	if a := w1.next("the camera's assignment once its reader here stopped", isAssign).GetCameraAssign(); a.Stream != "gate" {
		t.Fatalf("assignment: %+v", a)
	}
	if p := placeOf(c.srv, "gate"); p.On != "w1" || p.Moves != 1 {
		t.Fatalf("on w1: %+v", p)
	}
}
