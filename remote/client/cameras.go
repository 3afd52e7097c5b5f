package client

import (
	"fmt"
	"sort"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/mdag/mdag/api"
	"github.com/mdag/mdag/media"
	"github.com/mdag/mdag/remote/wire"
)

// Cameras on the workers (issue 41): the coordinator's own RTSP cameras
// (mdag coordinator --camera) are read by an ingest worker it assigns
// each to (CameraAssign), not by the coordinator. The worker decodes the
// camera (IngestServer.Cameras: the full build's RTSP reader), joins its
// stream through its session without a ticket (the coordinator assigned
// it) and holds its frames like a routed source's; it reports each
// camera's state (CameraState). When its connection to the coordinator
// ends, it stops reading them all: the coordinator assigns them again,
// here or to another worker.

// CameraAssignment is a camera the coordinator assigned this worker.
type CameraAssignment struct {
	Stream, App string
	URL         string // secret: may hold the password; never logged
	Transport   string
	FPS         float64
	MaxW, MaxH  int // frames above are scaled down to fit
	// Motion: estimate each frame's objects by motion as its ground
	// truth, for emulated detectors
	Motion bool
}

// CameraReading is one camera being read.
type CameraReading interface {
	Report() wire.CameraReport
	// Stop stops reading: the camera's stream leaves. It waits for the
	// reader to end.
	Stop()
}

// CameraReader starts reading a camera whose stream joins through g
// (g.OpenLocal), or says why it cannot.
type CameraReader func(a CameraAssignment, g *IngestServer) (CameraReading, error)

// maxCameras bounds the cameras one worker reads for one session.
const maxCameras = 1024

// cameraReportEvery is how often the cameras' states are looked at; a
// change is sent at once, every state every cameraReportAll.
const (
	cameraReportEvery = time.Second
	cameraReportAll   = 10 * time.Second
)

// cameraSet is the cameras a session reads.
type cameraSet struct {
	mu   sync.Mutex
	cams map[string]CameraReading
	sent map[string]wire.CameraReport // the last report sent, by stream
	// ops are the coordinator's assigns and releases not done yet, in
	// order (the camera loop does them one at a time: a release never
	// overtakes its assign); wake says there are some
	ops  []*api.CoordinatorMessage
	wake chan struct{}
}

// cameraOp queues the coordinator's CameraAssign or CameraRelease for the
// camera loop; the receiver never waits on a camera.
func (s *workerSession) cameraOp(m *api.CoordinatorMessage) {
	s.cams.mu.Lock()
	full := len(s.cams.ops) >= 2*maxCameras
	if !full {
		s.cams.ops = append(s.cams.ops, m)
	}
	s.cams.mu.Unlock()
	if full {
		s.cfg.Log.Warn("camera assignments from the coordinator come faster than they are done; one dropped")
		return
	}
	select {
	case s.cams.wake <- struct{}{}:
	default:
	}
}

// startCameras starts the camera loop when this worker reads cameras.
func (s *workerSession) startCameras() <-chan struct{} {
	done := make(chan struct{})
	if s.dp.Ingest == nil || s.dp.Ingest.Cameras == nil {
		close(done)
		return done
	}
	s.cams.wake = make(chan struct{}, 1)
	go func() {
		defer close(done)
		s.cameraLoop()
	}()
	return done
}

// cameraLoop does the coordinator's camera assignments in order and sends
// the cameras' states until the session ends, then stops every camera.
func (s *workerSession) cameraLoop() {
	defer s.stopCameras()
	tick, n := s.cfg.Clock.After(cameraReportEvery), 0
	for {
		select {
		case <-s.cams.wake:
			s.cams.mu.Lock()
			ops := s.cams.ops
			s.cams.ops = nil
			s.cams.mu.Unlock()
			for _, m := range ops {
				if s.ctx.Err() != nil {
					return
				}
				switch m := m.Msg.(type) {
				case *api.CoordinatorMessage_CameraAssign:
					s.assignCamera(m.CameraAssign)
				case *api.CoordinatorMessage_CameraRelease:
					s.releaseCamera(m.CameraRelease.Stream)
				}
			}
		case <-tick:
			tick, n = s.cfg.Clock.After(cameraReportEvery), n+1
			all := n%int(cameraReportAll/cameraReportEvery) == 0
			for _, m := range s.cameraChanges(all) {
				s.send(&api.WorkerMessage{Msg: &api.WorkerMessage_CameraState{CameraState: m}})
			}
		case <-s.ctx.Done():
			return
		}
	}
}

// assignCamera starts reading a's camera, or reports why not.
func (s *workerSession) assignCamera(a *api.CameraAssign) {
	g := s.dp.Ingest
	fail := func(err error) {
		s.cfg.Log.Warn("camera assigned by the coordinator not read", "stream", a.Stream, "err", err)
		s.send(&api.WorkerMessage{Msg: &api.WorkerMessage_CameraState{CameraState: &api.CameraState{Stream: a.Stream, State: wire.CameraRefused, LastError: err.Error()}}})
	}
	if g == nil || g.Cameras == nil {
		fail(fmt.Errorf("this worker reads no cameras (the full build's mdag worker --ingest-listen does)"))
		return
	}
	if a.Stream == "" || a.App == "" || a.Url == "" {
		fail(fmt.Errorf("an assignment without a stream, an app or a URL"))
		return
	}
	s.cams.mu.Lock()
	if s.cams.cams == nil {
		s.cams.cams, s.cams.sent = map[string]CameraReading{}, map[string]wire.CameraReport{}
	}
	_, dup := s.cams.cams[a.Stream]
	n := len(s.cams.cams)
	s.cams.mu.Unlock()
	switch {
	case dup:
		return // the coordinator's retry of one this worker reads
	case n >= maxCameras:
		fail(fmt.Errorf("this worker reads %d cameras, its limit", n))
		return
	}
	r, err := g.Cameras(CameraAssignment{Stream: a.Stream, App: a.App, URL: a.Url, Transport: a.Transport, FPS: a.Fps, MaxW: int(a.MaxFrameW), MaxH: int(a.MaxFrameH), Motion: a.MotionObjects}, g)
	if err != nil {
		fail(err)
		return
	}
	s.cams.mu.Lock()
	s.cams.cams[a.Stream] = r
	s.cams.mu.Unlock()
	s.cfg.Log.Info("camera assigned by the coordinator: reading it", "stream", a.Stream, "app", a.App)
}

// releaseCamera stops reading a camera (it moves elsewhere).
func (s *workerSession) releaseCamera(stream string) {
	s.cams.mu.Lock()
	r := s.cams.cams[stream]
	delete(s.cams.cams, stream)
	delete(s.cams.sent, stream)
	s.cams.mu.Unlock()
	if r != nil {
		r.Stop()
		s.cfg.Log.Info("camera released by the coordinator", "stream", stream)
	}
}

// stopCameras stops every camera of the session (it ended).
func (s *workerSession) stopCameras() {
	s.cams.mu.Lock()
	rs := s.cams.cams
	s.cams.cams = nil
	s.cams.mu.Unlock()
	for _, r := range rs {
		r.Stop()
	}
	if len(rs) > 0 {
		s.cfg.Log.Warn("stopped reading the coordinator's cameras with the connection: it assigns them again", "cameras", len(rs))
	}
}

// cameraChanges are the states to send: those changed since the last
// sent (all: every one), in stream order.
func (s *workerSession) cameraChanges(all bool) []*api.CameraState {
	s.cams.mu.Lock()
	defer s.cams.mu.Unlock()
	var out []*api.CameraState
	for id, r := range s.cams.cams {
		rep := r.Report()
		last, ok := s.cams.sent[id]
		if ok && !all && last.State == rep.State && last.Codec == rep.Codec && last.Transport == rep.Transport &&
			last.Reconnects == rep.Reconnects && last.CameraLost == rep.CameraLost && last.LastError == rep.LastError {
			continue
		}
		s.cams.sent[id] = rep
		out = append(out, wire.CameraStateToPB(id, rep))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Stream < out[j].Stream })
	return out
}

// LocalStream is a stream read on this worker (a camera the coordinator
// assigned it), joined through the session; its frames are held and
// announced as a routed source's are.
type LocalStream struct {
	in      *ingesting
	release func()
	once    sync.Once
}

// OpenLocal joins a stream of app read on this worker, through the
// session now (Unavailable without one); the coordinator joins it only
// when it assigned this worker the camera. Close it when the stream ends.
func (g *IngestServer) OpenLocal(app, stream string) (*LocalStream, error) {
	release, err := g.admit()
	if err != nil {
		return nil, err
	}
	s, err := g.session()
	if err != nil {
		release()
		return nil, err
	}
	caps, err := s.joinStream(s.ctx, &api.Join{App: app, Stream: stream})
	if err != nil {
		release()
		return nil, err
	}
	g.stats.joined.Add(1)
	return &LocalStream{in: &ingesting{g: g, s: s, stream: stream, caps: caps}, release: release}, nil
}

// Frame holds one frame of the stream (owned by the store from now) and
// announces it; an error says why it was not (the session ended, the
// frame over the caps, the store full).
func (l *LocalStream) Frame(seq uint64, capture time.Time, f *media.Frame, truth []media.Box) error {
	in := l.in
	if in.s.ctx.Err() != nil {
		return status.Error(codes.Unavailable, "ingest: this worker lost the coordinator")
	}
	where := fmt.Sprintf("camera stream %s frame %d", in.stream, seq)
	switch {
	case f == nil:
		return fmt.Errorf("%s: no frame", where)
	case f.W > in.caps.maxW || f.H > in.caps.maxH:
		return fmt.Errorf("%s: %dx%d is larger than %dx%d (the coordinator's --max-frame)", where, f.W, f.H, in.caps.maxW, in.caps.maxH)
	case len(truth) > in.caps.maxBoxes:
		truth = truth[:in.caps.maxBoxes] // estimated boxes: the first ones
	}
	if err := in.holdFrame(seq, wire.UnixNS(capture), f, wire.BoxesToPB(truth)); err != nil {
		in.rejected++
		in.g.stats.rejected.Add(1)
		return fmt.Errorf("%s: %w", where, err)
	}
	in.accepted++
	in.g.stats.frames.Add(1)
	return nil
}

// Close ends the stream: the coordinator is told it left.
func (l *LocalStream) Close() {
	l.once.Do(func() {
		l.in.s.leave(l.in.stream)
		l.release()
	})
}
