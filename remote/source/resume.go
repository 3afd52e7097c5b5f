package source

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/mdag/mdag/api"
	"github.com/mdag/mdag/ingest/synth"
	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/internal/defaults"
	"github.com/mdag/mdag/media"
	"github.com/mdag/mdag/remote/wire"
)

// Reconnect configures StreamReconnecting.
type Reconnect struct {
	// Backoff is the first wait after the stream breaks (default 100 ms);
	// it doubles up to MaxBackoff (default 2 s: a restarted coordinator is
	// found within 2 s of being back) and starts again after a connection
	// that lasted 10 s.
	Backoff, MaxBackoff time.Duration
	Clock               clock.Clock // default clock.Real
	Log                 *slog.Logger
	// DialIngest, when set, routes the stream (issue 41): each connection
	// asks the coordinator where to send (Coordinator.Route) and, when it
	// names an ingest worker, opens the stream there with the route's
	// ticket, so the frames' pixels never reach the coordinator; when it
	// names none (no worker ingests, an audio app, a coordinator without
	// Route) the stream goes to the coordinator. It dials an ingest
	// worker's address (remote/client's Dial, or DialTLS with the source's
	// certificate). nil: every connection goes to the coordinator.
	DialIngest func(addr string) (*grpc.ClientConn, error)
}

// StreamResult is a reconnecting camera's account of its frames.
type StreamResult struct {
	// Generated is the frames the camera produced (sequence numbers 0 to
	// Generated-1): Accepted + Rejected + Unconfirmed + Skipped.
	Generated uint64
	// Accepted and Rejected are the coordinator's counts from the
	// connections that ended with its reply.
	Accepted, Rejected uint64
	// Unconfirmed were sent on connections that broke before a reply: the
	// coordinator counted them (a coordinator restarted from its state
	// counts the ones its last save did not see as lost) or never got
	// them.
	Unconfirmed uint64
	// Skipped were produced while no connection was up: not sent (a
	// coordinator restarted from its state counts them lost when the
	// stream resumes with a later sequence number).
	Skipped     uint64
	Connections int
	LastError   string
}

// permanent says whether an ingest error is one reconnecting cannot fix:
// the coordinator refused the join (unknown app, the stream ID in use, a
// bad frame) or this source's credentials. The ID in use is not, once
// this stream was connected: the coordinator may not have seen the old
// connection end yet.
func permanent(err error, connected bool) bool {
	switch status.Code(err) {
	case codes.InvalidArgument, codes.NotFound, codes.PermissionDenied, codes.Unauthenticated, codes.FailedPrecondition:
		return true
	case codes.AlreadyExists:
		return !connected
	}
	return false
}

// StreamReconnecting is Stream for a camera that outlives its connection:
// when the gRPC stream breaks (the coordinator restarted, the network
// dropped) it joins again under the same stream ID, with backoff, and
// keeps numbering its frames, so a coordinator restarted from its state
// (`--state`) resumes the stream's session and accounts the frames it
// missed. Frames produced while disconnected are skipped (counted), never
// queued: a live camera does not send the past. It stops when ctx ends,
// after count frames (0: no limit), or on an error retrying cannot fix;
// a camera that never connected (no coordinator, a refused handshake)
// returns the last error when it stops.
func StreamReconnecting(ctx context.Context, cc *grpc.ClientConn, app, stream string, pat *synth.Pattern, index int, fps float64, count uint64, rc Reconnect) (*StreamResult, error) {
	return streamReconnecting(ctx, cc, app, stream, rc, func(r *reconnecting) error {
		return pat.Generate(ctx, r.rc.Clock, index, stream, fps, count, r.sink)
	})
}

// StreamAudioReconnecting is StreamReconnecting for an app with media:
// audio: the synthetic tone's chunks (1/fps long, fps a second) instead of
// frames, in IngestMessage.audio.
func StreamAudioReconnecting(ctx context.Context, cc *grpc.ClientConn, app, stream string, tone *synth.Tone, index int, fps float64, count uint64, rc Reconnect) (*StreamResult, error) {
	return streamReconnecting(ctx, cc, app, stream, rc, func(r *reconnecting) error {
		return tone.Generate(ctx, r.rc.Clock, index, stream, fps, count, r.audioSink)
	})
}

// streamReconnecting runs generate (a source feeding r's sinks) over a
// connection that is opened again when it breaks.
func streamReconnecting(ctx context.Context, cc *grpc.ClientConn, app, stream string, rc Reconnect, generate func(r *reconnecting) error) (*StreamResult, error) {
	c := defaults.Fields{Prefix: "source.Reconnect"}
	c.Duration("Backoff", &rc.Backoff, 100*time.Millisecond)
	c.Duration("MaxBackoff", &rc.MaxBackoff, max(2*time.Second, rc.Backoff))
	if rc.MaxBackoff < rc.Backoff {
		c.Bad("MaxBackoff", rc.MaxBackoff, fmt.Sprintf("must be >= Backoff (%v)", rc.Backoff))
	}
	if err := c.Err(); err != nil {
		return nil, err
	}
	if rc.Clock == nil {
		rc.Clock = clock.Real{}
	}
	if rc.Log == nil {
		rc.Log = slog.New(slog.DiscardHandler)
	}
	r := &reconnecting{ctx: ctx, cc: cc, app: app, stream: stream, rc: rc, backoff: rc.Backoff, res: &StreamResult{}, cancelConn: func() {}, route: &router{cc: cc, dial: rc.DialIngest, log: rc.Log}}
	defer func() { r.cancelConn() }()
	defer r.route.close()
	genErr := generate(r)
	if r.cl != nil {
		if err := r.closeConn(); err != nil && genErr == nil {
			genErr = err
		}
	}
	if genErr != nil && !errors.Is(genErr, context.Canceled) && !errors.Is(genErr, context.DeadlineExceeded) {
		return r.res, fmt.Errorf("ingest %s: %w", stream, genErr)
	}
	if r.res.Connections == 0 && r.lastErr != nil {
		// it never got in (no coordinator there, a refused handshake)
		return r.res, fmt.Errorf("ingest %s: never connected: %w", stream, r.lastErr)
	}
	return r.res, nil
}

type reconnecting struct {
	ctx         context.Context
	cc          *grpc.ClientConn
	app, stream string
	rc          Reconnect

	cl         grpc.ClientStreamingClient[api.IngestMessage, api.IngestReply]
	cancelConn func()
	sentOnConn uint64
	connAt     time.Time
	nextTry    time.Time
	backoff    time.Duration
	res        *StreamResult
	lastErr    error
	route      *router
	via        string // where the connection now goes: "coordinator" or "worker ID at ADDR"
}

func (r *reconnecting) sink(_ string, seq uint64, capture time.Time, f *media.Frame, truth []media.Box) error {
	return r.send(seq, func() *api.IngestMessage {
		return &api.IngestMessage{Seq: seq, CaptureUnixNs: capture.UnixNano(), Frame: wire.FrameToPB(f), Truth: wire.BoxesToPB(truth)}
	})
}

// audioSink is sink for an audio chunk.
func (r *reconnecting) audioSink(_ string, seq uint64, capture time.Time, a *media.Audio) error {
	return r.send(seq, func() *api.IngestMessage {
		return &api.IngestMessage{Seq: seq, CaptureUnixNs: capture.UnixNano(), Audio: wire.AudioToPB(a)}
	})
}

// send sends message seq (made by msg only when there is a connection to
// send it on), opening a connection first if there is none and its time
// has come; a message that cannot go is skipped (counted).
func (r *reconnecting) send(seq uint64, msg func() *api.IngestMessage) error {
	r.res.Generated = seq + 1
	now := r.rc.Clock.Now()
	if r.cl == nil {
		if now.Before(r.nextTry) {
			r.res.Skipped++
			return nil
		}
		if err := r.open(); err != nil {
			r.res.Skipped++
			return r.broke(err)
		}
	}
	err := r.cl.Send(msg())
	if err == nil {
		r.sentOnConn++
		return nil
	}
	r.res.Skipped++
	err = closeErr(r.cl, err)
	r.dropConn()
	return r.broke(err)
}

// open starts a connection, where Route says (DialIngest set), and joins.
func (r *reconnecting) open() error {
	sctx, cancel := context.WithCancel(context.WithoutCancel(r.ctx))
	cl, via, err := r.route.open(sctx, r.app, r.stream)
	if err != nil {
		cancel()
		return err
	}
	r.via = via
	r.cl, r.cancelConn, r.sentOnConn, r.connAt = cl, cancel, 0, r.rc.Clock.Now()
	r.res.Connections++
	if r.res.Connections > 1 || r.rc.DialIngest != nil {
		r.rc.Log.Info("stream joined", "stream", r.stream, "app", r.app, "connection", r.res.Connections, "via", r.via)
	}
	return nil
}

// dropConn forgets a broken connection: what it carried is unconfirmed.
func (r *reconnecting) dropConn() {
	if r.rc.Clock.Now().Sub(r.connAt) > 10*time.Second {
		r.backoff = r.rc.Backoff // it served a while: a fresh start
	}
	r.res.Unconfirmed += r.sentOnConn
	r.cancelConn()
	r.cl, r.cancelConn, r.sentOnConn = nil, func() {}, 0
}

// closeConn ends the connection cleanly: the coordinator's reply counts
// what it carried.
func (r *reconnecting) closeConn() error {
	reply, err := r.cl.CloseAndRecv()
	if err != nil {
		r.dropConn()
		r.res.LastError = err.Error()
		if permanent(err, false) {
			return err
		}
		return nil
	}
	r.res.Accepted += reply.Accepted
	r.res.Rejected += reply.Rejected
	r.res.LastError = reply.LastError // a clean end: earlier breaks show in Connections
	r.cancelConn()
	r.cl, r.cancelConn, r.sentOnConn = nil, func() {}, 0
	return nil
}

// broke schedules the next attempt, or ends the stream on an error
// retrying cannot fix.
func (r *reconnecting) broke(err error) error {
	r.res.LastError, r.lastErr = err.Error(), err
	if permanent(err, r.res.Connections > 0) {
		return err
	}
	now := r.rc.Clock.Now()
	r.nextTry = now.Add(r.backoff)
	r.rc.Log.Warn("ingest stream broke; reconnecting", "stream", r.stream, "err", err, "in", r.backoff)
	r.backoff = min(2*r.backoff, r.rc.MaxBackoff)
	return nil
}
