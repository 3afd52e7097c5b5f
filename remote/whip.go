package remote

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/mdag/mdag/api"
	"github.com/mdag/mdag/remote/wire"
)

// WHIP on the ingest workers (issue 41). The coordinator's WHIP endpoint
// authenticates and checks a client's offer, then hands it here:
// OfferWhip gives it to the connected ingest worker that takes WHIP
// streams (Register.whip) with the fewest streams, as a WhipOffer; the
// worker answers it with its own ICE candidates (WhipAnswer), so the
// client's media goes to the worker and never here. The stream is
// assigned to that worker: it joins without a ticket at its first frame
// and its frames are held there, like a routed camera's. The worker says
// when the stream ended (WhipEnded, joined or not); a client's DELETE
// here ends it there (EndWhip); a lost worker ends its WHIP streams here
// (OnWhipEnded): their clients post again and land on another.

// ErrNoWhipWorker says no connected ingest worker takes WHIP streams.
var ErrNoWhipWorker = errors.New("no connected ingest worker takes WHIP streams")

// whipAnswerTimeout bounds a worker's answer to a WhipOffer (it gathers
// its ICE candidates: up to 5 s); whipTries how many workers an offer is
// tried on (the next after a refusal for capacity or no answer).
const (
	whipAnswerTimeout = 10 * time.Second
	whipTries         = 3
	maxWhipOffer      = 64 << 10
	maxWhipInFlight   = 256
)

// whipWaits are the WhipOffers waiting for their worker's answer.
type whipWaits struct {
	mu   sync.Mutex
	next uint64
	m    map[uint64]whipWait
	on   map[string]*conn // the delegated streams' workers, for their results
}

type whipWait struct {
	c  *conn
	ch chan *api.WhipAnswer
}

// WhipOffer is an offer for OfferWhip.
type WhipOffer struct {
	App, Stream string
	SDP         []byte
	FPS         float64
	MaxW, MaxH  int
	Motion      bool // the worker estimates objects by motion
}

// StatusError is an OfferWhip error with the HTTP status to answer it with.
type StatusError struct {
	Code int
	Msg  string
}

func (e *StatusError) Error() string { return e.Msg }

// OfferWhip hands o to the ingest worker that takes WHIP streams with the
// fewest streams (the next, up to three, when one has no capacity or does
// not answer in time) and returns its SDP answer and ID; ErrNoWhipWorker
// when none is connected; a *StatusError when every one tried refused.
func (s *Server) OfferWhip(ctx context.Context, o WhipOffer) (answer []byte, worker string, err error) {
	if len(o.SDP) > maxWhipOffer {
		return nil, "", &StatusError{http.StatusRequestEntityTooLarge, fmt.Sprintf("offer of %d bytes, over %d", len(o.SDP), maxWhipOffer)}
	}
	tried := map[*conn]bool{}
	var last error
	for range whipTries {
		c := s.whipWorker(tried)
		if c == nil {
			break
		}
		tried[c] = true
		a, err := s.offerTo(ctx, c, o)
		if err == nil {
			return a, c.id, nil
		}
		last = err
		var se *StatusError
		if errors.As(err, &se) && se.Code != http.StatusServiceUnavailable && se.Code != http.StatusGatewayTimeout {
			return nil, "", err // the offer itself: another worker answers the same
		}
		s.Log.Warn("whip: an ingest worker did not take the stream; trying another", "stream", o.Stream, "instance", c.id, "err", err)
	}
	if last == nil {
		return nil, "", ErrNoWhipWorker
	}
	return nil, "", last
}

// whipWorker is the connected worker taking WHIP streams with the fewest
// streams and room, not in tried (ties: the lowest ID), or nil.
func (s *Server) whipWorker(tried map[*conn]bool) *conn {
	s.mu.Lock()
	var cs []*conn
	for _, c := range s.workers {
		if c.whip && !c.closed.Load() && !tried[c] {
			cs = append(cs, c)
		}
	}
	s.mu.Unlock()
	load := map[*conn]int{}
	for _, c := range cs {
		load[c], _ = c.ingestCount()
	}
	return pickWorker(load, nil)
}

// offerTo sends o to c and waits for its answer.
func (s *Server) offerTo(ctx context.Context, c *conn, o WhipOffer) ([]byte, error) {
	id, ch, err := s.whip.open(c)
	if err != nil {
		return nil, err
	}
	defer s.whip.close(id)
	c.mu.Lock()
	c.assigned[o.Stream] = assignment{app: o.App, whip: true}
	c.mu.Unlock()
	m := &api.WhipOffer{Id: id, App: o.App, Stream: o.Stream, Sdp: string(o.SDP), Fps: o.FPS, MaxFrameW: int32(o.MaxW), MaxFrameH: int32(o.MaxH), MotionObjects: o.Motion}
	if !c.send(&api.CoordinatorMessage{Msg: &api.CoordinatorMessage_WhipOffer{WhipOffer: m}}) {
		c.unassign(o.Stream)
		return nil, &StatusError{http.StatusServiceUnavailable, fmt.Sprintf("ingest worker %s: its queue is full", c.id)}
	}
	tm := s.Clock.After(whipAnswerTimeout)
	select {
	case a := <-ch:
		if a.Code != 0 {
			c.unassign(o.Stream)
			code := int(a.Code)
			if code < 400 || code > 599 {
				code = http.StatusBadGateway
			}
			return nil, &StatusError{code, fmt.Sprintf("ingest worker %s: %s", c.id, wire.Cut(a.Error, 512))}
		}
		if len(a.Sdp) > maxWhipOffer || !strings.HasPrefix(a.Sdp, "v=0") {
			s.endOn(c, o.Stream)
			return nil, &StatusError{http.StatusBadGateway, fmt.Sprintf("ingest worker %s: its answer (%d bytes) is not an SDP answer of at most %d bytes", c.id, len(a.Sdp), maxWhipOffer)}
		}
		c.mu.Lock()
		as, ok := c.assigned[o.Stream]
		if ok && !as.ending {
			as.answered = true
			c.assigned[o.Stream] = as
		}
		c.mu.Unlock()
		if !ok || as.ending || c.closed.Load() {
			return nil, &StatusError{http.StatusServiceUnavailable, fmt.Sprintf("ingest worker %s was lost while it answered", c.id)}
		}
		s.whip.placed(o.Stream, c)
		return []byte(a.Sdp), nil
	case <-tm:
	case <-ctx.Done():
	}
	// the worker may yet answer and start it: it ends it at once
	s.endOn(c, o.Stream)
	if ctx.Err() != nil {
		return nil, &StatusError{http.StatusServiceUnavailable, "the client went away"}
	}
	return nil, &StatusError{http.StatusGatewayTimeout, fmt.Sprintf("ingest worker %s did not answer the offer within %v", c.id, whipAnswerTimeout)}
}

func (w *whipWaits) open(c *conn) (uint64, chan *api.WhipAnswer, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.m == nil {
		w.m = map[uint64]whipWait{}
	}
	if len(w.m) >= maxWhipInFlight {
		return 0, nil, &StatusError{http.StatusServiceUnavailable, fmt.Sprintf("%d WHIP offers wait for their workers' answers: retry", len(w.m))}
	}
	w.next++
	ch := make(chan *api.WhipAnswer, 1)
	w.m[w.next] = whipWait{c: c, ch: ch}
	return w.next, ch, nil
}

func (w *whipWaits) close(id uint64) {
	w.mu.Lock()
	delete(w.m, id)
	w.mu.Unlock()
}

// fail answers every offer to c still waiting: 503 (the worker is lost).
func (w *whipWaits) fail(c *conn) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for id, wt := range w.m {
		if wt.c == c {
			wt.ch <- &api.WhipAnswer{Id: id, Code: http.StatusServiceUnavailable, Error: "the worker was lost"}
			delete(w.m, id)
		}
	}
}

// answer hands c's answer to its offer; false: no offer to c waits for it.
func (w *whipWaits) answer(c *conn, a *api.WhipAnswer) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	wt, ok := w.m[a.Id]
	if !ok || wt.c != c {
		return false
	}
	wt.ch <- a
	delete(w.m, a.Id)
	return true
}

// placed records that stream's media goes to c; gone forgets it.
func (w *whipWaits) placed(stream string, c *conn) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.on == nil {
		w.on = map[string]*conn{}
	}
	w.on[stream] = c
}

func (w *whipWaits) gone(stream string) {
	w.mu.Lock()
	delete(w.on, stream)
	w.mu.Unlock()
}

// maxWhipResult bounds a result forwarded to a worker.
const maxWhipResult = 64 << 10

// WhipResult forwards a delegated stream's result (its JSON) to the
// worker its media goes to, for the client's DataChannel there; it never
// blocks, and a worker's queue a quarter full takes none (its tasks come
// first): dropped, as a slow DataChannel's are (the results' event stream
// here has them all).
func (s *Server) WhipResult(stream string, json []byte) {
	s.whip.mu.Lock()
	c := s.whip.on[stream]
	s.whip.mu.Unlock()
	if c == nil || len(json) > maxWhipResult || len(c.out) > cap(c.out)/4 {
		return
	}
	c.send(&api.CoordinatorMessage{Msg: &api.CoordinatorMessage_WhipResult{WhipResult: &api.WhipResult{Stream: stream, Json: json}}})
}

// EndWhip ends a delegated WHIP stream on its worker (the client's
// DELETE, the coordinator closing); nothing when no worker has it.
func (s *Server) EndWhip(stream string) {
	s.whip.gone(stream)
	for _, c := range s.connsWith(stream, true) {
		s.endOn(c, stream)
	}
}

// endOn ends a WHIP stream on c: its assignment is kept, ending, until the
// worker says it ended (or is lost), and takes no join meanwhile.
func (s *Server) endOn(c *conn, stream string) {
	c.mu.Lock()
	if a, ok := c.assigned[stream]; ok {
		a.ending = true
		c.assigned[stream] = a
	}
	c.mu.Unlock()
	if !c.send(&api.CoordinatorMessage{Msg: &api.CoordinatorMessage_WhipEnd{WhipEnd: &api.WhipEnd{Stream: stream}}}) && !c.closed.Load() {
		s.Log.Warn("whip: the end of a stream could not be queued for its ingest worker: it ends there by its idle timeout", "stream", stream, "instance", c.id)
	}
}

// connsWith are the connected workers stream is assigned to (whip: as a
// WHIP stream).
func (s *Server) connsWith(stream string, whip bool) []*conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*conn
	for _, c := range s.workers {
		c.mu.Lock()
		a, ok := c.assigned[stream]
		c.mu.Unlock()
		if ok && a.whip == whip {
			out = append(out, c)
		}
	}
	return out
}

// whipAnswer takes a worker's WhipAnswer: refused (counted) unless an
// offer to that worker waits for it.
func (w *workerSession) whipAnswer(a *api.WhipAnswer) {
	if !w.s.whip.answer(w.c, a) {
		_ = w.s.refuse(RefusedWhip, fmt.Errorf("worker %s: an answer to WHIP offer %d, which no offer to it waits for", w.c.id, a.Id), "instance", w.c.id)
	}
}

// whipEnded takes a worker's word that a WHIP stream assigned to it
// ended: the coordinator's endpoint ends it too (OnWhipEnded).
func (w *workerSession) whipEnded(m *api.WhipEnded) {
	c := w.c
	c.mu.Lock()
	a, ok := c.assigned[m.Stream]
	if ok && a.whip {
		delete(c.assigned, m.Stream)
	}
	c.mu.Unlock()
	if ok && a.whip {
		w.s.whip.gone(m.Stream)
	}
	switch {
	case !ok || !a.whip:
		_ = w.s.refuse(RefusedWhip, fmt.Errorf("worker %s: WHIP stream %q ended, but it is not one assigned to it", c.id, wire.Cut(m.Stream, 64)), "instance", c.id)
		return
	case a.ending || !a.answered:
		return // the coordinator ended it, or the worker's answer says why
	}
	if f := w.s.OnWhipEnded; f != nil {
		f(m.Stream, wire.Cut(m.Kind, 32), fmt.Sprintf("on ingest worker %s: %s", c.id, wire.Cut(m.Why, 512)))
	}
}

// endWhips ends the WHIP streams of a worker that is gone (their clients
// post again and land on another).
func (w *workerSession) endWhips() {
	c := w.c
	w.s.whip.fail(c) // offers it did not answer: the next worker
	c.mu.Lock()
	var ids []string
	for id, a := range c.assigned {
		if a.whip {
			if a.answered && !a.ending {
				ids = append(ids, id)
			}
			delete(c.assigned, id)
			w.s.whip.gone(id)
		}
	}
	c.mu.Unlock()
	sort.Strings(ids)
	for _, id := range ids {
		if f := w.s.OnWhipEnded; f != nil {
			f(id, "", fmt.Sprintf("its ingest worker %s was lost: post the offer again", c.id))
		}
	}
	if len(ids) > 0 {
		w.s.Log.Warn("the ingest worker's WHIP streams ended with it: their clients post again", "instance", c.id, "streams", len(ids))
	}
}
