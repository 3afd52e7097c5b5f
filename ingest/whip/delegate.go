package whip

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/mdag/mdag/dag"
)

// WHIP on the ingest workers (issue 41). The coordinator's server keeps
// the signalling: a POST is authenticated, rate-limited and checked here,
// then its offer is handed to an ingest worker (Config.Delegate), whose own
// server (Accept) answers it with the worker's ICE candidates. The client
// sends its media to the worker, never here; its Location, results (SSE)
// and DELETE stay on this server, which keeps the stream as a delegated
// one: listed in status, its results published here, ended when the
// worker says so (EndDelegated). A client that cannot follow a redirect
// needs nothing more: the coordinator proxies only the SDP.

// Delegator hands WHIP offers to ingest workers.
type Delegator interface {
	// Delegate offers stream id of app to an ingest worker with caps.
	// It returns the worker's SDP answer and its ID; ErrNotDelegated when
	// no worker takes WHIP streams (this server takes the stream itself);
	// any other error carries an HTTP status (StatusError).
	Delegate(ctx context.Context, app dag.AppID, id string, offer []byte, caps DelegateCaps) (answer []byte, worker string, err error)
	// End ends a delegated stream on its worker (the client's DELETE,
	// this server closing).
	End(id string)
	// Result hands a delegated stream's result to its worker, for the
	// client's DataChannel there; it never blocks.
	Result(id string, r Result)
}

// DelegateCaps are what a delegated stream may send: the rate frames are
// sampled at (0: every frame) and the resolution above which they are
// scaled down.
type DelegateCaps struct {
	FPS        float64
	MaxW, MaxH int
}

// ErrNotDelegated says no ingest worker takes WHIP streams now.
var ErrNotDelegated = errors.New("whip: no ingest worker takes WHIP streams")

// StatusError is an error with the HTTP status to answer it with.
type StatusError struct {
	Code int
	Msg  string
}

func (e *StatusError) Error() string { return e.Msg }

// StateOnWorker is a delegated stream's state (StreamInfo.State).
const StateOnWorker = "on-worker"

// EndWorker ends a delegated stream whose worker ended it or was lost.
const EndWorker = "worker"

// delegate hands the checked offer of a stream of app to a worker; once
// it answered, the stream is kept here as a delegated one. ErrNotDelegated:
// no worker took it. While the worker answers, the stream is pending: an
// end of it then (its worker lost, the server closing) makes the POST fail
// and ends it on the worker.
func (s *Server) delegate(ctx context.Context, app dag.AppID, caps streamCaps, offer []byte) (*stream, string, int, error) {
	id := newID()
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, "", http.StatusServiceUnavailable, errors.New("server shutting down")
	}
	s.pending[id] = false
	s.mu.Unlock()
	answer, worker, err := s.cfg.Delegate.Delegate(ctx, app, id, offer, DelegateCaps{FPS: caps.fps, MaxW: caps.maxW, MaxH: caps.maxH})
	s.mu.Lock()
	ended := s.pending[id]
	delete(s.pending, id)
	if err != nil {
		s.mu.Unlock()
		code := http.StatusServiceUnavailable
		var se *StatusError
		if errors.As(err, &se) {
			code = se.Code
		}
		return nil, "", code, err
	}
	if ended || s.closed {
		s.mu.Unlock()
		s.cfg.Delegate.End(id)
		return nil, "", http.StatusServiceUnavailable, errors.New("the stream ended while its ingest worker answered (the worker lost, or the server closing): post again")
	}
	st := newStream(s, id, app, caps.fps, nil)
	st.maxW, st.maxH, st.worker = caps.maxW, caps.maxH, worker
	st.onEnd = func() { s.cfg.Delegate.End(id) }
	st.token = caps.token // removed gives the token's slot back
	s.delegated[id] = st
	s.mu.Unlock()
	s.log.Info("whip stream on an ingest worker: its media goes there", "app", app, "stream", id, "worker", worker, "fps", caps.fps,
		"max_resolution", fmt.Sprintf("%dx%d", caps.maxW, caps.maxH), "token", caps.token)
	return st, string(answer), 0, nil
}

// EndDelegated ends a delegated stream (its worker ended it, with kind and
// why, or was lost); one whose worker is still answering fails its POST.
// False: no such stream.
func (s *Server) EndDelegated(id, kind, why string) bool {
	s.mu.Lock()
	st := s.delegated[id]
	if _, ok := s.pending[id]; ok {
		s.pending[id] = true
		s.mu.Unlock()
		return true
	}
	s.mu.Unlock()
	if st == nil {
		return false
	}
	st.endAs(kind, why)
	return true
}

// Deliver hands a result the coordinator forwarded to a stream here (a
// delegated one: its client's DataChannel ends here), as Publish does;
// false: no such stream.
func (s *Server) Deliver(r Result) bool {
	s.mu.Lock()
	st := s.streams[r.Stream]
	s.mu.Unlock()
	if st == nil {
		return false
	}
	st.publish(r)
	return true
}

// checkOfferFor checks an offer for app (its media, codecs, direction)
// and bundles it: the offer to answer, the codec picked, or an HTTP
// status and why.
func (s *Server) checkOfferFor(app dag.AppID, body []byte) ([]byte, offeredCodec, int, string) {
	var pick offeredCodec
	var code int
	var msg string
	if s.mediaOf(app) == dag.Audio {
		pick, code, msg = checkAudioOffer(body, app)
	} else {
		pick, code, msg = checkOffer(body, s.cfg.Codecs)
		if code == http.StatusBadRequest && strings.HasPrefix(msg, noVideo) {
			msg = fmt.Sprintf("app %s takes video: %s", app, msg)
		}
	}
	if code != 0 {
		if code == statusRecvonly {
			code = http.StatusBadRequest
			s.countRefused(app, RefusedRecvonly)
		}
		return nil, pick, code, msg
	}
	body, code, msg = bundleOffer(body)
	return body, pick, code, msg
}

// Accept starts stream id of app from offer, as a POST would, with caps:
// a worker's server taking a stream the coordinator's WHIP endpoint
// delegated to it (the coordinator authenticated the client). It returns
// the SDP answer, or an HTTP status and why (a bad offer, no capacity,
// an ID in use).
func (s *Server) Accept(app dag.AppID, id string, offer []byte, caps DelegateCaps) (string, int, error) {
	if _, ok := s.cfg.Apps[app]; !ok {
		return "", http.StatusNotFound, fmt.Errorf("unknown app %q", app)
	}
	if id == "" || len(id) > 64 {
		return "", http.StatusBadRequest, fmt.Errorf("stream ID %q: want 1 to 64 bytes", id)
	}
	body, pick, code, msg := s.checkOfferFor(app, offer)
	if code != 0 {
		return "", code, errors.New(msg)
	}
	if ad, ok := s.sink.(Admitter); ok {
		if err := ad.Admit(app); err != nil {
			s.countRefused(app, RefusedSession)
			return "", http.StatusServiceUnavailable, fmt.Errorf("app %s refuses new streams: %v", app, err)
		}
	}
	if reason, msg := s.reserve(); reason != "" {
		s.countRefused(app, reason)
		return "", http.StatusServiceUnavailable, errors.New(msg)
	}
	c := streamCaps{fps: caps.FPS, maxW: s.cfg.MaxWidth, maxH: s.cfg.MaxHeight}
	if caps.MaxW > 0 {
		c.maxW = min(c.maxW, caps.MaxW)
	}
	if caps.MaxH > 0 {
		c.maxH = min(c.maxH, caps.MaxH)
	}
	_, answer, code, err := s.start(app, c, string(body), pick, id)
	if err != nil {
		s.unreserve()
		return "", code, err
	}
	return answer, 0, nil
}

// End ends stream id here at the coordinator's word (the client's DELETE
// there); false: no such stream.
func (s *Server) End(id string) bool {
	s.mu.Lock()
	st := s.streams[id]
	s.mu.Unlock()
	if st == nil {
		return false
	}
	st.endAs(EndClient, "deleted by the client")
	return true
}
