package remote

import (
	"cmp"
	"context"
	"crypto/hmac"
	crand "crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/mdag/mdag/api"
	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/remote/wire"
)

// Ingest on the workers (issue 41). A camera stream asks Route where to
// send its frames; the coordinator names the ingest worker with the fewest
// streams and gives a ticket for it. The source opens the stream on that
// worker's Ingest service; the worker joins it here over its Connect
// stream (StreamJoin, with the ticket), keeps each frame in its store and
// sends only the frame's identity, capture time and size (Ingested). The
// coordinator routes that reference like any module's output on the direct
// data plane: the first module's worker takes the pixels from its own
// store or fetches them from the ingest worker. Pixels never reach the
// coordinator. When the ingest worker is lost, its streams leave; their
// sources route again and rejoin on another worker (one stream, the gap
// counted by the source), as a reconnect to the coordinator does.

// TicketTTL is how long a Route's ticket lets its worker join the stream.
const TicketTTL = 30 * time.Second

// maxStreamID bounds an app name or stream ID on Route and StreamJoin.
const maxStreamID = 256

// ticketLen is a ticket's size: its expiry (unix ns) and an HMAC-SHA256.
const ticketLen = 8 + sha256.Size

// ticketKey is the server's key for tickets: random, made once, never
// leaving the process (tickets are verified where they were made).
func (s *Server) ticketKey() []byte {
	s.keyOnce.Do(func() {
		s.key = make([]byte, 32)
		_, _ = crand.Read(s.key) // never fails (Go 1.24+)
	})
	return s.key
}

// ticketMAC is the MAC of a ticket for app, stream and worker, expiring at exp.
func (s *Server) ticketMAC(app, stream, worker string, exp int64) []byte {
	m := hmac.New(sha256.New, s.ticketKey())
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(exp))
	m.Write(b[:])
	for _, f := range []string{app, stream, worker} {
		binary.BigEndian.PutUint64(b[:], uint64(len(f)))
		m.Write(b[:])
		m.Write([]byte(f))
	}
	return m.Sum(nil)
}

// ticket lets worker join stream of app until TicketTTL from now.
func (s *Server) ticket(app, stream, worker string) []byte {
	exp := s.Clock.Now().Add(TicketTTL).UnixNano()
	out := binary.BigEndian.AppendUint64(make([]byte, 0, ticketLen), uint64(exp))
	return append(out, s.ticketMAC(app, stream, worker, exp)...)
}

// checkTicket says why t does not let worker join stream of app, or nil.
func (s *Server) checkTicket(t []byte, app, stream, worker string) error {
	if len(t) != ticketLen {
		return fmt.Errorf("a ticket of %d bytes, not Route's (%d)", len(t), ticketLen)
	}
	exp := int64(binary.BigEndian.Uint64(t[:8]))
	if !hmac.Equal(t[8:], s.ticketMAC(app, stream, worker, exp)) {
		return errors.New("the ticket is not the coordinator's for this app, stream and worker")
	}
	if now := s.Clock.Now().UnixNano(); now > exp {
		return fmt.Errorf("the ticket expired %v ago (it lasts %v: route again)", time.Duration(now-exp).Round(time.Millisecond), TicketTTL)
	}
	return nil
}

// Route implements api.CoordinatorServer: where a camera stream sends its
// frames. The caller must be allowed the stream (its certificate's claim),
// as for Ingest. An audio app, or no worker with an ingest address,
// answers with no worker: ingest here.
func (s *Server) Route(ctx context.Context, req *api.RouteRequest) (*api.RouteReply, error) {
	if err := s.Check(); err != nil {
		return nil, status.Errorf(codes.FailedPrecondition, "coordinator misconfigured: %v", err)
	}
	if req.App == "" || req.Stream == "" || len(req.App) > maxStreamID || len(req.Stream) > maxStreamID {
		return nil, status.Errorf(codes.InvalidArgument, "route: want an app and a stream of 1 to %d bytes each", maxStreamID)
	}
	if _, err := s.checkClaim(ctx, "route", req.Stream); err != nil {
		return nil, err
	}
	source := peerID(ctx)
	if err := s.routesFor(source, req.Stream); err != nil {
		return nil, err
	}
	info, err := s.Engine.App(dag.AppID(req.App))
	if err != nil {
		return nil, status.Error(engineCode(err), "route: "+err.Error())
	}
	if info.Media != dag.Video {
		return &api.RouteReply{Why: fmt.Sprintf("app %s takes %s: its chunks come to the coordinator", req.App, info.Media)}, nil
	}
	s.routeMu.Lock() // one choice at a time: each sees the routes before it
	defer s.routeMu.Unlock()
	c, n, full, capped := s.ingestWorker()
	switch {
	case full:
		return nil, status.Errorf(codes.ResourceExhausted, "route: every ingest worker is full of streams routed to it and not joined yet (their tickets live %v): retry", TicketTTL)
	case c == nil && capped > 0:
		// every ingest worker takes its most streams: the camera keeps
		// running through the coordinator, said loudly (the scale-out
		// this fleet needs is more ingest workers)
		s.callLog.warn("route: every ingest worker ingests its most streams: this stream's frames come to the coordinator", "app", req.App, "stream", req.Stream, "ingest_workers", capped)
		return &api.RouteReply{Why: fmt.Sprintf("every ingest worker (%d) ingests its most streams (the limit it registered, 256 by default): frames come to the coordinator", capped)}, nil
	case c == nil:
		return &api.RouteReply{Why: "no worker ingests (mdag worker --ingest-listen, with --peer-listen): frames come to the coordinator"}, nil
	}
	c.mu.Lock()
	c.routed[req.Stream] = s.Clock.Now().Add(TicketTTL)
	c.mu.Unlock()
	return &api.RouteReply{Worker: c.id, Addr: c.ingest, Ticket: s.ticket(req.App, req.Stream, c.id),
		Why: fmt.Sprintf("the ingest worker with the fewest streams (%d)", n)}, nil
}

// routesFor counts a route of stream for source, or refuses it when the
// source has --max-source-streams streams routed and not joined yet (their
// tickets alive): the routes one source holds are bounded as its Ingest
// streams on the coordinator are. A stream routed again replaces its
// route. Expired routes are swept at most once a second.
func (s *Server) routesFor(source, stream string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.Clock.Now()
	if s.routes == nil {
		s.routes, s.routeSrc = map[string]map[string]time.Time{}, map[string]string{}
	}
	if now.Sub(s.routesSwept) >= time.Second {
		s.routesSwept = now
		for src, rs := range s.routes {
			for id, exp := range rs {
				if now.After(exp) {
					delete(rs, id)
					delete(s.routeSrc, id)
				}
			}
			if len(rs) == 0 {
				delete(s.routes, src)
			}
		}
	}
	rs := s.routes[source]
	if _, again := rs[stream]; !again && len(rs) >= s.limits.MaxSourceStreams {
		return s.refuse(RefusedStreams, status.Errorf(codes.ResourceExhausted, "route: source %s has %d streams routed and not joined yet, the limit (--max-source-streams): retry once they joined, or in %v", source, len(rs), TicketTTL), "source", source)
	}
	if rs == nil {
		rs = map[string]time.Time{}
		s.routes[source] = rs
	}
	if old, ok := s.routeSrc[stream]; ok && old != source {
		delete(s.routes[old], stream) // a shared certificate's other holder routed it before
	}
	rs[stream], s.routeSrc[stream] = now.Add(TicketTTL), source
	return nil
}

// joinedRoute forgets the route of a stream that joined.
func (s *Server) joinedRoute(stream string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if src, ok := s.routeSrc[stream]; ok {
		delete(s.routeSrc, stream)
		delete(s.routes[src], stream)
		if len(s.routes[src]) == 0 {
			delete(s.routes, src)
		}
	}
}

// ingestCount is how many streams are joined or joining on the worker,
// routed to it and not joined yet (their tickets alive), or assigned to
// it and not joined yet (cameras, WHIP streams): cameras routed at once
// spread over the workers. routed is the routed alone.
func (c *conn) ingestCount() (n, routed int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.clk.Now()
	for id, exp := range c.routed {
		if now.After(exp) {
			delete(c.routed, id)
		}
	}
	n = len(c.streams) + len(c.routed)
	for id := range c.assigned { // cameras and WHIP streams not joined yet
		if c.streams[id] == 0 {
			n++
		}
	}
	return n, len(c.routed)
}

// maxRouted bounds the streams routed to one worker and not joined yet
// (each for its ticket's life): Route refuses past it on every worker.
const maxRouted = 4096

// ingestWorker is the connected worker with an ingest address and the
// fewest streams ingested or routed (ties: the lowest ID), or nil; full
// says every such worker has maxRouted streams routed and not joined, or
// is at its limit only with such routes counted (they may never join: a
// source that could not reach the worker, a refused join; their tickets
// expire, so the source routes again rather than send a camera to the
// coordinator for its life), capped how many ingest workers were left out
// for having as many streams joined as they said they take
// (Register.ingest_streams).
func (s *Server) ingestWorker() (c *conn, n int, full bool, capped int) {
	type cand struct {
		c      *conn
		n      int
		routed int
	}
	s.mu.Lock()
	var cs []cand
	for _, c := range s.workers {
		if c.ingest != "" && !c.closed.Load() {
			cs = append(cs, cand{c: c})
		}
	}
	s.mu.Unlock()
	for i := range cs {
		cs[i].n, cs[i].routed = cs[i].c.ingestCount()
	}
	n0, byRoutes := len(cs), 0
	cs = slices.DeleteFunc(cs, func(x cand) bool {
		at := x.c.ingestMax > 0 && x.n >= x.c.ingestMax
		if at && x.n-x.routed < x.c.ingestMax {
			byRoutes++
		}
		return at
	})
	capped = n0 - len(cs) - byRoutes
	had := len(cs) > 0 || byRoutes > 0
	cs = slices.DeleteFunc(cs, func(x cand) bool { return x.routed >= maxRouted })
	if len(cs) == 0 {
		return nil, 0, had, capped
	}
	best := slices.MinFunc(cs, func(a, b cand) int { return cmp.Or(cmp.Compare(a.n, b.n), strings.Compare(a.c.id, b.c.id)) })
	return best.c, best.n, false, capped
}

// IngestStats counts what ingest workers sent: the frames the engine took
// and those refused (a stream not joined on the worker, a bad reference,
// the engine's error).
type IngestStats struct {
	Streams  int    `json:"streams"` // joined on workers now
	Frames   uint64 `json:"frames"`
	Rejected uint64 `json:"rejected"`
}

// Ingested returns the ingest workers' counters.
func (s *Server) Ingested() IngestStats {
	s.mu.Lock()
	n := 0
	for _, c := range s.workers {
		c.mu.Lock()
		for _, st := range c.streams {
			if st == streamJoined {
				n++
			}
		}
		c.mu.Unlock()
	}
	s.mu.Unlock()
	return IngestStats{Streams: n, Frames: s.ingestFrames.Load(), Rejected: s.ingestRejected.Load()}
}

// Stream states on an ingest worker's conn (conn.streams).
const (
	streamJoining = iota + 1 // the engine is joining it
	streamJoined             // its frames are taken
	streamLeaving            // left while joining: the joiner leaves it again
)

// maxJoining bounds the stream joins one worker may have in progress.
const maxJoining = 64

// joinStream answers a worker's StreamJoin, on its own goroutine (the
// engine's Join may wait for an app's first plan; the worker's results and
// heartbeats go on meanwhile). The ticket must be Route's for this app,
// stream and worker; then the engine joins the stream, which leaves when
// the worker says so (StreamLeave, also while joining) or is lost.
func (w *workerSession) joinStream(j *api.StreamJoin) {
	s, c := w.s, w.c
	reply := func(code codes.Code, err error) bool {
		m := &api.StreamJoined{Id: j.Id, Code: int32(code)}
		if err != nil {
			m.Error = err.Error()
		} else {
			info, _ := s.Engine.App(dag.AppID(j.App))
			m.SloNs, m.MaxFrameW, m.MaxFrameH, m.MaxBoxes = int64(info.SLO), int32(s.limits.MaxFrameW), int32(s.limits.MaxFrameH), int32(s.limits.MaxBoxes)
		}
		if !c.send(&api.CoordinatorMessage{Msg: &api.CoordinatorMessage_StreamJoined{StreamJoined: m}}) {
			s.Log.Warn("stream join: the answer could not be queued for the worker", "instance", c.id, "stream", j.Stream)
			return false
		}
		return true
	}
	if err := w.checkJoin(j); err != nil {
		reply(status.Code(err), errors.New(status.Convert(err).Message()))
		return
	}
	c.mu.Lock()
	switch {
	case c.left:
		c.mu.Unlock()
		reply(codes.Unavailable, errors.New("the worker is leaving: route again"))
		return
	case c.streams[j.Stream] != 0:
		c.mu.Unlock()
		reply(codes.AlreadyExists, fmt.Errorf("stream %q is joined on this worker already", j.Stream))
		return
	case c.joining >= maxJoining:
		c.mu.Unlock()
		reply(codes.ResourceExhausted, fmt.Errorf("%d stream joins in progress on this worker: retry", c.joining))
		return
	}
	c.streams[j.Stream] = streamJoining
	c.joining++
	c.mu.Unlock()
	go func() {
		err := s.Engine.Join(dag.AppID(j.App), j.Stream)
		c.mu.Lock()
		c.joining--
		gone := c.left || c.streams[j.Stream] == streamLeaving
		if err != nil || gone {
			delete(c.streams, j.Stream)
		} else {
			c.streams[j.Stream] = streamJoined
			delete(c.routed, j.Stream)
		}
		c.mu.Unlock()
		if err == nil && !gone {
			s.joinedRoute(j.Stream)
		}
		switch {
		case err != nil:
			reply(engineCode(err), err)
		case gone:
			// the worker left, or gave up on the join, meanwhile
			w.engineLeave(j.Stream)
			reply(codes.Unavailable, errors.New("the stream left while it was joining: route again"))
		case !reply(codes.OK, nil):
			// the worker would never hear of it: undo it, unless the
			// worker's loss or its leave has already
			c.mu.Lock()
			undo := c.streams[j.Stream] == streamJoined
			if undo {
				delete(c.streams, j.Stream)
			}
			c.mu.Unlock()
			if undo {
				w.engineLeave(j.Stream)
			}
		default:
			s.Log.Info("camera joined", "app", j.App, "stream", j.Stream, "ingest_worker", c.id)
		}
	}()
}

// checkJoin checks a StreamJoin before anything is joined: the worker
// ingests, the names' lengths, Route's ticket. A ticket it refuses is
// Unavailable: the source routes again (an expired ticket, a coordinator
// restarted between the route and the join, whose key changed).
func (w *workerSession) checkJoin(j *api.StreamJoin) error {
	s, c := w.s, w.c
	if c.ingest == "" {
		return status.Error(codes.Unavailable, s.refuse(RefusedTicket, fmt.Errorf("worker %s: stream join, but it registered no ingest address (or relays its frames)", c.id), "instance", c.id).Error())
	}
	if j.App == "" || j.Stream == "" || len(j.App) > maxStreamID || len(j.Stream) > maxStreamID {
		return status.Errorf(codes.InvalidArgument, "stream join: want an app and a stream of 1 to %d bytes each", maxStreamID)
	}
	if len(j.Ticket) == 0 && c.assignedApp(j.Stream) == j.App {
		return nil // a camera or WHIP stream the coordinator assigned it (cameras.go, whip.go)
	}
	if err := s.checkTicket(j.Ticket, j.App, j.Stream, c.id); err != nil {
		err = s.refuse(RefusedTicket, fmt.Errorf("worker %s: stream %s: %w: route again", c.id, j.Stream, err), "instance", c.id, "stream", j.Stream)
		return status.Error(codes.Unavailable, err.Error())
	}
	return nil
}

// engineLeave makes the engine leave a stream, logging a failure.
func (w *workerSession) engineLeave(stream string) {
	if err := w.s.Engine.Leave(stream); err != nil {
		w.s.Log.Warn("leave", "stream", stream, "err", err)
	}
}

// ingested hands a frame an ingest worker holds to the engine; one of a
// stream not joined on that worker, or that is not the worker's own
// reference, is refused (counted, logged) and never reaches the engine.
func (w *workerSession) ingested(m *api.Ingested) {
	s, c := w.s, w.c
	if err := w.checkIngested(m); err != nil {
		s.ingestRejected.Add(1)
		_ = s.refuse(RefusedIngested, status.Errorf(codes.InvalidArgument, "worker %s: stream %s frame %d: %v", c.id, m.Stream, m.Seq, err), "instance", c.id, "stream", m.Stream)
		return
	}
	f, err := wire.FrameFromPB(m.Frame) // a reference: checked, no pixels
	if err != nil {
		s.ingestRejected.Add(1)
		_ = s.refuse(RefusedIngested, status.Errorf(codes.InvalidArgument, "worker %s: stream %s frame %d: %v", c.id, m.Stream, m.Seq, err), "instance", c.id, "stream", m.Stream)
		return
	}
	if err := s.Engine.IngestHeld(m.Stream, m.Seq, wire.FromNS(m.CaptureUnixNs), f, wire.BoxesFromPB(m.Truth)); err != nil {
		s.ingestRejected.Add(1)
		s.callLog.warn("ingested frame rejected", "instance", c.id, "stream", m.Stream, "seq", m.Seq, "err", err)
		return
	}
	s.ingestFrames.Add(1)
}

// checkIngested checks an Ingested message against the caps and the
// worker's streams and reference.
func (w *workerSession) checkIngested(m *api.Ingested) error {
	s, c := w.s, w.c
	c.mu.Lock()
	joined := c.streams[m.Stream] == streamJoined
	c.mu.Unlock()
	f := m.Frame
	switch {
	case !joined:
		return errors.New("the stream is not joined on this worker")
	case f == nil || f.Ref == nil || len(f.Bgr) > 0:
		return errors.New("an ingested frame is a reference to the worker's store, without pixels")
	case f.Ref.Holder != c.id || f.Ref.Addr != c.peer:
		return fmt.Errorf("the reference names holder %q at %q; a worker may only hand out its own frames (%q at %q)", f.Ref.Holder, f.Ref.Addr, c.id, c.peer)
	}
	if err := s.caps.CheckFrame(f); err != nil {
		return err
	}
	if err := s.caps.CheckBoxes("ground-truth boxes", len(m.Truth)); err != nil {
		return err
	}
	return wire.CheckKeypoints(m.Truth)
}

// leaveStream ends a stream joined on the worker, at its word; one still
// joining is left by its joiner once joined.
func (w *workerSession) leaveStream(l *api.StreamLeave) {
	c := w.c
	c.mu.Lock()
	st := c.streams[l.Stream]
	switch st {
	case streamJoined:
		delete(c.streams, l.Stream)
	case streamJoining:
		c.streams[l.Stream] = streamLeaving
	}
	c.mu.Unlock()
	switch st {
	case streamJoined:
		w.engineLeave(l.Stream)
	case 0:
		w.s.Log.Warn("stream leave for a stream not joined on the worker; ignored", "instance", c.id, "stream", l.Stream)
	}
}

// leaveStreams ends every stream joined on a worker that is gone: their
// sources route again and rejoin elsewhere. Joins still in progress leave
// once joined (conn.left).
func (w *workerSession) leaveStreams() {
	c := w.c
	c.mu.Lock()
	c.left = true
	var ids []string
	for id, st := range c.streams {
		if st == streamJoined {
			ids = append(ids, id)
			delete(c.streams, id)
		}
	}
	c.mu.Unlock()
	sort.Strings(ids)
	for _, id := range ids {
		w.engineLeave(id)
	}
	if len(ids) > 0 {
		w.s.Log.Warn("the ingest worker's streams left with it: their sources route again", "instance", c.id, "streams", len(ids))
	}
}
