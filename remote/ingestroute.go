package remote

import (
	"context"
	"crypto/hmac"
	crand "crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
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
	info, err := s.Engine.App(dag.AppID(req.App))
	if err != nil {
		return nil, status.Error(engineCode(err), "route: "+err.Error())
	}
	if info.Media != dag.Video {
		return &api.RouteReply{Why: fmt.Sprintf("app %s takes %s: its chunks come to the coordinator", req.App, info.Media)}, nil
	}
	s.routeMu.Lock() // one choice at a time: each sees the routes before it
	defer s.routeMu.Unlock()
	c := s.ingestWorker()
	if c == nil {
		return &api.RouteReply{Why: "no worker ingests (mdag worker --ingest-listen, with --peer-listen): frames come to the coordinator"}, nil
	}
	n := c.ingestCount()
	c.mu.Lock()
	c.routed[req.Stream] = s.Clock.Now().Add(TicketTTL)
	c.mu.Unlock()
	return &api.RouteReply{Worker: c.id, Addr: c.ingest, Ticket: s.ticket(req.App, req.Stream, c.id),
		Why: fmt.Sprintf("the ingest worker with the fewest streams (%d)", n)}, nil
}

// ingestCount is how many streams are joined on the worker, or routed to
// it and not joined yet (their tickets alive): cameras routed at once
// spread over the workers.
func (c *conn) ingestCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.clk.Now()
	for id, exp := range c.routed {
		if now.After(exp) {
			delete(c.routed, id)
		}
	}
	return len(c.streams) + len(c.routed)
}

// ingestWorker is the connected worker with an ingest address and the
// fewest streams ingested (ties: the lowest ID), or nil.
func (s *Server) ingestWorker() *conn {
	s.mu.Lock()
	cs := make([]*conn, 0, len(s.workers))
	for _, c := range s.workers {
		if c.ingest != "" && !c.closed.Load() {
			cs = append(cs, c)
		}
	}
	s.mu.Unlock()
	if len(cs) == 0 {
		return nil
	}
	sort.Slice(cs, func(i, j int) bool {
		a, b := cs[i].ingestCount(), cs[j].ingestCount()
		if a != b {
			return a < b
		}
		return cs[i].id < cs[j].id
	})
	return cs[0]
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
		n += c.ingestCount()
	}
	s.mu.Unlock()
	return IngestStats{Streams: n, Frames: s.ingestFrames.Load(), Rejected: s.ingestRejected.Load()}
}

// joinStream answers a worker's StreamJoin: the ticket must be Route's
// for this app, stream and worker; then the engine joins the stream, which
// leaves when the worker says so or is lost.
func (w *workerSession) joinStream(j *api.StreamJoin) {
	s, c := w.s, w.c
	reply := func(code codes.Code, err error) {
		m := &api.StreamJoined{Id: j.Id, Code: int32(code)}
		if err != nil {
			m.Error = err.Error()
		} else {
			info, _ := s.Engine.App(dag.AppID(j.App))
			m.SloNs, m.MaxFrameW, m.MaxFrameH, m.MaxBoxes = int64(info.SLO), int32(s.limits.MaxFrameW), int32(s.limits.MaxFrameH), int32(s.limits.MaxBoxes)
		}
		if !c.send(&api.CoordinatorMessage{Msg: &api.CoordinatorMessage_StreamJoined{StreamJoined: m}}) {
			s.Log.Warn("stream join: the answer could not be queued for the worker", "instance", c.id, "stream", j.Stream)
		}
	}
	if c.ingest == "" {
		reply(codes.Unavailable, s.refuse(RefusedTicket, fmt.Errorf("worker %s: stream join, but it registered no ingest address (or relays its frames)", c.id), "instance", c.id))
		return
	}
	if j.App == "" || j.Stream == "" || len(j.App) > maxStreamID || len(j.Stream) > maxStreamID {
		reply(codes.InvalidArgument, fmt.Errorf("stream join: want an app and a stream of 1 to %d bytes each", maxStreamID))
		return
	}
	if err := s.checkTicket(j.Ticket, j.App, j.Stream, c.id); err != nil {
		reply(codes.PermissionDenied, s.refuse(RefusedTicket, fmt.Errorf("worker %s: stream %s: %w", c.id, j.Stream, err), "instance", c.id, "stream", j.Stream))
		return
	}
	if err := s.Engine.Join(dag.AppID(j.App), j.Stream); err != nil {
		reply(engineCode(err), err)
		return
	}
	c.mu.Lock()
	c.streams[j.Stream] = true
	delete(c.routed, j.Stream)
	c.mu.Unlock()
	s.Log.Info("camera joined", "app", j.App, "stream", j.Stream, "ingest_worker", c.id)
	reply(codes.OK, nil)
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
	joined := c.streams[m.Stream]
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

// leaveStream ends a stream joined on the worker, at its word.
func (w *workerSession) leaveStream(l *api.StreamLeave) {
	c := w.c
	c.mu.Lock()
	joined := c.streams[l.Stream]
	delete(c.streams, l.Stream)
	c.mu.Unlock()
	if !joined {
		w.s.Log.Warn("stream leave for a stream not joined on the worker; ignored", "instance", c.id, "stream", l.Stream)
		return
	}
	if err := w.s.Engine.Leave(l.Stream); err != nil {
		w.s.Log.Warn("leave", "stream", l.Stream, "err", err)
	}
}

// leaveStreams ends every stream joined on a worker that is gone: their
// sources route again and rejoin elsewhere.
func (w *workerSession) leaveStreams() {
	c := w.c
	c.mu.Lock()
	ids := make([]string, 0, len(c.streams))
	for id := range c.streams {
		ids = append(ids, id)
	}
	clear(c.streams)
	c.mu.Unlock()
	sort.Strings(ids)
	for _, id := range ids {
		if err := w.s.Engine.Leave(id); err != nil {
			w.s.Log.Warn("leave", "stream", id, "err", err)
		}
	}
	if len(ids) > 0 {
		w.s.Log.Warn("the ingest worker's streams left with it: their sources route again", "instance", c.id, "streams", len(ids))
	}
}
