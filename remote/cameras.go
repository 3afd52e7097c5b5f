package remote

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mdag/mdag/api"
	"github.com/mdag/mdag/remote/wire"
)

// The coordinator's own RTSP cameras on the workers (issue 41). `mdag
// coordinator --camera` names cameras the coordinator is responsible for;
// it does not read them. Each is assigned (CameraAssign) to a connected
// ingest worker that reads cameras (Register.cameras), the one with the
// fewest streams; the worker decodes it and joins its stream without a
// ticket (the coordinator knows it assigned it), and only the frames'
// references come here. When that worker is lost its stream leaves with
// the worker's others, and the camera is assigned to another: one stream,
// with a gap. While no such worker is connected the coordinator reads the
// camera itself (its pixels come here, said loudly), and hands it to a
// worker as soon as one connects.

// Camera is one of the coordinator's RTSP cameras.
type Camera struct {
	Name, App string
	URL       string // secret: may hold the password; never logged
	Transport string // tcp, udp or "" (auto)
	FPS       float64
	// Motion makes its reader estimate each frame's objects by motion as
	// the frame's ground truth, for emulated detectors.
	Motion bool
}

// CameraReader is a camera the coordinator reads itself.
type CameraReader interface {
	Report() wire.CameraReport
	// Stop stops reading: the stream leaves. It waits for the reader.
	Stop()
}

// OnCoordinator is CameraPlace.On of a camera the coordinator reads.
const OnCoordinator = "coordinator"

// CameraPlace is one of the coordinator's cameras: who reads it and how
// it is doing.
type CameraPlace struct {
	Name, App string
	// On is the worker reading it, OnCoordinator, or "" while it waits
	// for a reader.
	On string
	// Moves counts the times it went to another reader (a worker lost,
	// the coordinator handing it to a worker).
	Moves uint64
	wire.CameraReport
}

// cameraPlaceEvery is how often the cameras' places are looked at besides
// a worker's arrival or loss; cameraRefusedFor how long a worker that
// refused a camera is not asked again for it (doubling with each refusal).
const (
	cameraPlaceEvery = time.Second
	cameraRefusedFor = time.Minute
)

// placedCamera is one camera and its reader.
type placedCamera struct {
	cam     Camera
	c       *conn        // the worker reading it, or nil
	local   CameraReader // read here, or nil
	rep     wire.CameraReport
	moves   uint64
	read    bool               // it has had a reader (a new one is a move)
	refused map[string]refusal // workers that refused it, by ID
	to      *conn              // the worker it goes to once its reader here has stopped
}

// cameraPlacer places the server's cameras.
type cameraPlacer struct {
	s     *Server
	local func(Camera) (CameraReader, error)
	grace time.Duration
	kick  chan struct{}
	// none is since when no worker that reads cameras is connected (zero
	// while one is)
	none time.Time

	mu      sync.Mutex
	cams    []*placedCamera // by name
	byName  map[string]*placedCamera
	stopped bool
	rounds  atomic.Uint64 // placements done (tests)
}

// StartCameras places cams (each a distinct name): each is read by the
// ingest worker that reads cameras with the fewest streams, and moves to
// another when that worker is lost; once none has been connected for
// grace (from the start, or since the last was lost) the coordinator
// reads it with local (nil: it waits). Call it once, when the server
// serves; the func stops the cameras (those read here; workers are told
// to release theirs).
func (s *Server) StartCameras(cams []Camera, local func(Camera) (CameraReader, error), grace time.Duration) (stop func()) {
	p := &cameraPlacer{s: s, local: local, grace: grace, kick: make(chan struct{}, 1), none: s.Clock.Now()}
	for _, c := range cams {
		p.cams = append(p.cams, &placedCamera{cam: c, rep: wire.CameraReport{State: "waiting"}, refused: map[string]refusal{}})
	}
	p.byName = map[string]*placedCamera{}
	for _, pc := range p.cams {
		p.byName[pc.cam.Name] = pc
	}
	sort.Slice(p.cams, func(i, j int) bool { return p.cams[i].cam.Name < p.cams[j].cam.Name })
	if !s.cams.CompareAndSwap(nil, p) {
		panic("remote: StartCameras called twice")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.loop(ctx)
	}()
	return func() {
		cancel()
		<-done
		p.stop()
	}
}

// kickCameras makes the placer look at the cameras now (a worker came or
// went, one refused a camera).
func (s *Server) kickCameras() {
	if p := s.cams.Load(); p != nil {
		select {
		case p.kick <- struct{}{}:
		default:
		}
	}
}

// CameraPlaces is each camera's reader and state, by name (nil: no
// cameras).
func (s *Server) CameraPlaces() []CameraPlace {
	p := s.cams.Load()
	if p == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]CameraPlace, len(p.cams))
	for i, pc := range p.cams {
		out[i] = CameraPlace{Name: pc.cam.Name, App: pc.cam.App, Moves: pc.moves, CameraReport: pc.rep}
		switch {
		case pc.c != nil && (p.stopped || pc.c.isAssigned(pc.cam.Name)):
			out[i].On = pc.c.id
		case pc.local != nil:
			out[i].On, out[i].CameraReport = OnCoordinator, pc.local.Report()
		}
	}
	return out
}

func (p *cameraPlacer) loop(ctx context.Context) {
	for {
		p.place()
		select {
		case <-p.kick:
		case <-p.s.Clock.After(cameraPlaceEvery):
		case <-ctx.Done():
			return
		}
	}
}

// place gives every camera without a reader one: a worker if one reads
// cameras and has room, else, once none has been connected for the grace
// (or, without a grace, when none takes it), the coordinator; one read
// here goes to a worker as soon as there is one. The lock is never held
// while a reader stops (it may wait on the engine): a worker's camera
// states and the status go on meanwhile.
func (p *cameraPlacer) place() {
	defer p.rounds.Add(1)
	s := p.s
	now := s.Clock.Now()
	load := p.workers()
	var stopping []CameraReader
	p.mu.Lock()
	if p.stopped {
		p.mu.Unlock()
		return
	}
	switch {
	case len(load) > 0:
		p.none = time.Time{}
	case p.none.IsZero():
		p.none = now
	}
	here := (len(load) == 0 && now.Sub(p.none) >= p.grace) || (len(load) > 0 && p.grace == 0)
	for _, pc := range p.cams {
		pc.prune(now)
		if pc.c != nil && pc.c.isAssigned(pc.cam.Name) && !pc.c.released.Load() {
			continue // read there (or its worker is leaving: its stream has not left yet)
		}
		if pc.c != nil {
			s.Log.Warn("camera: its ingest worker is gone or gave it up: it moves", "camera", pc.cam.Name, "instance", pc.c.id)
			pc.c, pc.rep = nil, wire.CameraReport{State: "moving", LastError: pc.rep.LastError}
		}
		if pc.to != nil {
			continue // its reader here is stopping
		}
		c := pickWorker(load, func(c *conn) bool { return pc.refusedBy(c.id, now) })
		switch {
		case c == nil && here:
			p.readHere(pc)
		case c == nil:
			if pc.local == nil && pc.rep.State != "waiting" {
				pc.rep.State = "waiting"
				s.Log.Warn("camera: no connected ingest worker takes it; it waits (the coordinator reads cameras itself only once none has been connected for the grace)",
					"camera", pc.cam.Name, "grace", p.grace)
			}
		case pc.local != nil:
			// stopped below, then assigned: its stream leaves here first
			stopping = append(stopping, pc.local)
			pc.local, pc.to, pc.rep = nil, c, wire.CameraReport{State: "moving"}
			load[c]++
			s.Log.Info("camera: an ingest worker reads cameras now: the camera moves to it", "camera", pc.cam.Name, "instance", c.id)
		case p.assign(c, pc):
			load[c]++
		default:
			delete(load, c) // its queue is full: tried again next round
		}
	}
	p.mu.Unlock()
	if len(stopping) == 0 {
		return
	}
	for _, r := range stopping {
		r.Stop()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, pc := range p.cams {
		if c := pc.to; c != nil {
			pc.to = nil
			if !p.stopped && !c.closed.Load() {
				p.assign(c, pc) // or the next round places it
			}
		}
	}
}

// workers are the connected ingest workers that read cameras, with the
// streams each has (joined, joining, routed, assigned and not joined).
func (p *cameraPlacer) workers() map[*conn]int {
	s := p.s
	s.mu.Lock()
	var cs []*conn
	for _, c := range s.workers {
		if c.cameras && !c.closed.Load() {
			cs = append(cs, c)
		}
	}
	s.mu.Unlock()
	load := map[*conn]int{}
	for _, c := range cs {
		load[c], _ = c.ingestCount()
	}
	return load
}

// pickWorker is the open worker with the least load and room (its
// registered stream limit), not skipped; ties: the lowest ID.
func pickWorker(load map[*conn]int, skip func(*conn) bool) *conn {
	var best *conn
	for c, n := range load {
		if c.closed.Load() || (skip != nil && skip(c)) {
			continue
		}
		if c.ingestMax > 0 && n >= c.ingestMax {
			continue
		}
		if best == nil || n < load[best] || (n == load[best] && c.id < best.id) {
			best = c
		}
	}
	return best
}

// refusal is a worker's refusals of a camera: not asked again until, a
// minute after the first, doubling with each (at most 10 minutes).
type refusal struct {
	until time.Time
	n     int
}

const maxRefusedFor = 10 * time.Minute

func (pc *placedCamera) refusedBy(worker string, now time.Time) bool {
	r, ok := pc.refused[worker]
	return ok && now.Before(r.until)
}

// refuse records worker's refusal at now.
func (pc *placedCamera) refuse(worker string, now time.Time) {
	r := pc.refused[worker]
	r.n++
	r.until = now.Add(min(cameraRefusedFor<<min(r.n-1, 4), maxRefusedFor))
	pc.refused[worker] = r
}

// prune forgets refusals long over (worker IDs come and go).
func (pc *placedCamera) prune(now time.Time) {
	for id, r := range pc.refused {
		if now.Sub(r.until) > maxRefusedFor {
			delete(pc.refused, id)
		}
	}
}

// assign sends pc's camera to c; false: c's queue is full.
func (p *cameraPlacer) assign(c *conn, pc *placedCamera) bool {
	s, cam := p.s, pc.cam
	c.mu.Lock()
	c.assigned[cam.Name] = assignment{app: cam.App}
	c.mu.Unlock()
	m := &api.CameraAssign{Stream: cam.Name, App: cam.App, Url: cam.URL, Fps: cam.FPS, Transport: cam.Transport,
		MaxFrameW: int32(s.limits.MaxFrameW), MaxFrameH: int32(s.limits.MaxFrameH), MotionObjects: cam.Motion}
	if !c.send(&api.CoordinatorMessage{Msg: &api.CoordinatorMessage_CameraAssign{CameraAssign: m}}) {
		c.unassign(cam.Name)
		s.Log.Warn("camera: the assignment could not be queued for the ingest worker; tried again", "camera", cam.Name, "instance", c.id)
		return false
	}
	if pc.read {
		pc.moves++
	}
	pc.read, pc.c, pc.rep = true, c, wire.CameraReport{State: "assigned"}
	s.Log.Info("camera: read by an ingest worker", "camera", cam.Name, "app", cam.App, "instance", c.id)
	return true
}

// readHere reads pc's camera on the coordinator, unless it is already or
// the server has no local reader (it waits for a worker then).
func (p *cameraPlacer) readHere(pc *placedCamera) {
	if pc.local != nil {
		return
	}
	if p.local == nil {
		pc.rep.State = "waiting"
		return
	}
	r, err := p.local(pc.cam)
	if err != nil {
		pc.rep = wire.CameraReport{State: "failed", LastError: err.Error()}
		p.s.Log.Error("camera: the coordinator cannot read it", "camera", pc.cam.Name, "err", err)
		return
	}
	if pc.read {
		pc.moves++
	}
	pc.read, pc.local = true, r
	p.s.Log.Warn("camera: no connected ingest worker takes it (mdag worker --ingest-listen, the full build, reads cameras): the coordinator reads it, and its pixels come here",
		"camera", pc.cam.Name, "app", pc.cam.App)
}

// stop stops the cameras read here and releases those on workers; each
// keeps its reader's name and last state (the coordinator's summary).
func (p *cameraPlacer) stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		return
	}
	p.stopped = true
	for _, pc := range p.cams {
		if pc.local != nil {
			pc.local.Stop()
		}
		if pc.c != nil {
			pc.rep.State = "stopped"
			pc.c.unassign(pc.cam.Name)
			pc.c.send(&api.CoordinatorMessage{Msg: &api.CoordinatorMessage_CameraRelease{CameraRelease: &api.CameraRelease{Stream: pc.cam.Name}}})
		}
	}
}

// report takes a worker's CameraState of a camera assigned to it; one it
// refused is assigned elsewhere (that worker is not asked again for it for
// a minute).
func (p *cameraPlacer) report(c *conn, m *api.CameraState) error {
	if !c.isAssigned(m.Stream) {
		return errors.New("of a camera not assigned to this worker")
	}
	rep := wire.CameraStateFromPB(m)
	p.mu.Lock()
	defer p.mu.Unlock()
	pc := p.byName[m.Stream]
	if pc == nil || pc.c != c {
		return nil // assigned to it as a WHIP stream, or moved meanwhile
	}
	pc.rep = rep
	if rep.State == wire.CameraRefused {
		pc.refuse(c.id, p.s.Clock.Now())
		c.unassign(pc.cam.Name)
		p.s.Log.Warn("camera: the ingest worker refused it; it is assigned elsewhere", "camera", pc.cam.Name, "instance", c.id, "err", rep.LastError)
		p.s.kickCameras()
	}
	return nil
}

// cameraState handles a worker's CameraState: refused (counted, logged)
// unless of a camera the coordinator assigned it.
func (w *workerSession) cameraState(m *api.CameraState) {
	s := w.s
	p := s.cams.Load()
	err := errors.New("the coordinator has no cameras")
	if p != nil {
		err = p.report(w.c, m)
	}
	if err != nil {
		_ = s.refuse(RefusedCamera, fmt.Errorf("worker %s: camera state of %q: %w", w.c.id, wire.Cut(m.Stream, 64), err), "instance", w.c.id)
	}
}

// assignment is a stream the coordinator gave a worker to read: a camera,
// or a delegated WHIP stream.
type assignment struct {
	app  string
	whip bool
	// a WHIP stream's: answered (its worker took it; before, an end of it
	// is the answer's business), ending (the coordinator ended it: the
	// worker's word of its end is expected, and no join is taken)
	answered, ending bool
}

// isAssigned reports whether stream is assigned to the worker; unassign
// forgets it.
func (c *conn) isAssigned(stream string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.assigned[stream]
	return ok
}

func (c *conn) unassign(stream string) {
	c.mu.Lock()
	delete(c.assigned, stream)
	c.mu.Unlock()
}

// assignedApp is the app of a stream assigned to the worker, "" if none.
func (c *conn) assignedApp(stream string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if a := c.assigned[stream]; !a.ending {
		return a.app
	}
	return ""
}
