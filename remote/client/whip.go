package client

import (
	"net/http"

	"github.com/mdag/mdag/api"
)

// WHIP on the ingest workers (issue 41): the coordinator's WHIP endpoint
// hands a client's offer here (WhipOffer); IngestServer.Whip (cmd/mdag's:
// WHIP servers without an HTTP listener) answers it with this worker's ICE
// candidates, so the client's media comes here; the stream joins through
// the session without a ticket at its first frame (OpenLocal) and its
// frames are held here. The worker tells the coordinator when a
// delegated stream ended (WhipEnded), joined or not; when its connection
// to the coordinator ends, it ends them all (the coordinator has ended
// them on its side: their clients post again).

// WhipDelegated is a WHIP offer the coordinator delegated to this worker.
type WhipDelegated struct {
	App, Stream string
	SDP         []byte
	FPS         float64 // the rate frames are sampled at (0: every frame)
	MaxW, MaxH  int     // frames above are scaled down to fit
	Motion      bool    // estimate objects by motion (emulated detectors)
}

// WhipIngest takes the WHIP streams the coordinator delegates here.
type WhipIngest interface {
	// Accept answers the offer (the SDP answer), or says why not with an
	// HTTP status (503: no capacity here).
	Accept(o WhipDelegated) (answer string, code int, err error)
	// End ends a delegated stream (the client's DELETE at the
	// coordinator).
	End(stream string)
	// EndAll ends every delegated stream (the session ended).
	EndAll()
	// Result hands a delegated stream's result (its JSON) to the
	// client's DataChannel here.
	Result(stream string, json []byte)
}

// maxWhipAccepting bounds the offers a session answers at once (each
// gathers ICE candidates for up to 5 s): more are refused 503.
const maxWhipAccepting = 16

// whipOffer answers the coordinator's WhipOffer, on its own goroutine.
func (s *workerSession) whipOffer(o *api.WhipOffer) {
	g := s.dp.Ingest
	answer := func(code int, err error, sdp string) {
		a := &api.WhipAnswer{Id: o.Id, Code: int32(code), Sdp: sdp}
		if err != nil {
			a.Error = err.Error()
		}
		s.send(&api.WorkerMessage{Msg: &api.WorkerMessage_WhipAnswer{WhipAnswer: a}})
	}
	if g == nil || g.Whip == nil {
		answer(http.StatusNotImplemented, errNoWhip, "")
		return
	}
	select {
	case s.whipSlots <- struct{}{}:
	default:
		answer(http.StatusServiceUnavailable, errWhipBusy, "")
		return
	}
	go func() {
		defer func() { <-s.whipSlots }()
		sdp, code, err := g.Whip.Accept(WhipDelegated{App: o.App, Stream: o.Stream, SDP: []byte(o.Sdp), FPS: o.Fps,
			MaxW: int(o.MaxFrameW), MaxH: int(o.MaxFrameH), Motion: o.MotionObjects})
		if err != nil {
			if code == 0 {
				code = http.StatusInternalServerError
			}
			s.cfg.Log.Warn("whip: a delegated offer not taken", "stream", o.Stream, "code", code, "err", err)
			answer(code, err, "")
			return
		}
		s.cfg.Log.Info("whip: a delegated stream's media comes here", "stream", o.Stream, "app", o.App)
		answer(0, nil, sdp)
	}()
}

type whipErr string

func (e whipErr) Error() string { return string(e) }

const (
	errNoWhip   = whipErr("this worker takes no WHIP streams (the full build's mdag worker --ingest-listen does)")
	errWhipBusy = whipErr("this worker is answering as many WHIP offers as it does at once: retry")
)

// WhipEnded tells the coordinator a delegated stream ended here (its end
// kind and why); nothing without a session (the coordinator ended it).
func (g *IngestServer) WhipEnded(stream, kind, why string) {
	s, err := g.session()
	if err != nil {
		return
	}
	s.send(&api.WorkerMessage{Msg: &api.WorkerMessage_WhipEnded{WhipEnded: &api.WhipEnded{Stream: stream, Kind: kind, Why: why}}})
}
