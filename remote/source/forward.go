package source

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/mdag/mdag/api"
	"github.com/mdag/mdag/media"
	"github.com/mdag/mdag/remote/wire"
)

// Forwarder sends streams that are ingested on this machine (RTSP cameras
// read by `mdag source --camera`, through a local ingest server) to the
// coordinator: each stream is one Ingest call. It has the shape of
// ingest/whip's Sink (Join, Ingest, Leave), with the app as a plain string.
// Safe for concurrent use; each stream's calls come in order. A stream
// whose call breaks for a reason retrying can fix (the coordinator
// restarted, the network dropped) is joined again on a new call, under its
// name, with backoff (100 ms doubling to 2 s): its frames meanwhile are
// skipped (the coordinator, restarted from its state, counts the frames it
// missed by their sequence numbers); a refusal (unknown app, a name in
// use, credentials) stays the stream's error until it leaves.
type Forwarder struct {
	cc    *grpc.ClientConn
	route *router

	mu      sync.Mutex
	streams map[string]*forwarded
	closed  bool
}

type forwarded struct {
	mu      sync.Mutex
	app     string
	cl      grpc.ClientStreamingClient[api.IngestMessage, api.IngestReply]
	cancel  context.CancelFunc
	err     error // the first send error that retrying cannot fix, with the coordinator's reason
	joining bool  // the name is reserved; the call is being opened (cl nil)
	// A broken call (cl nil, not joining, no err): the next attempt's time
	// and backoff; reopening while one is being opened.
	nextTry   time.Time
	backoff   time.Duration
	reopening bool
	left      bool
}

// Rejoin backoff of a forwarded stream whose call broke.
const (
	rejoinFirst = 100 * time.Millisecond
	rejoinMax   = 2 * time.Second
)

// NewForwarder forwards to the coordinator behind cc.
func NewForwarder(cc *grpc.ClientConn) *Forwarder { return NewRoutedForwarder(cc, nil) }

// NewRoutedForwarder is NewForwarder whose streams go where the
// coordinator's Route says (issue 41): to the ingest worker it names,
// dialled with dialIngest, so their pixels never reach the coordinator;
// or to the coordinator when it names none. Each (re)join routes again.
// dialIngest nil: always the coordinator.
func NewRoutedForwarder(cc *grpc.ClientConn, dialIngest func(addr string) (*grpc.ClientConn, error)) *Forwarder {
	return &Forwarder{cc: cc, route: &router{cc: cc, dial: dialIngest}, streams: map[string]*forwarded{}}
}

// Join opens the stream's Ingest call and joins app. The coordinator
// answers a refused join (unknown app, a name in use) by ending the call:
// the stream's next Ingest returns its reason. The name is reserved under
// the lock and the call opened without it: while the connection to the
// coordinator is still being made (up to its connect timeout) the other
// streams' calls go on. A stream whose call failed is joined again, on a
// new call, once it has left (Leave).
func (f *Forwarder) Join(app, stream string) error {
	ctx, cancel := context.WithCancel(context.Background())
	res := &forwarded{app: app, cancel: cancel, joining: true}
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		cancel()
		return fmt.Errorf("ingest %s: the forwarder is closed", stream)
	}
	if _, ok := f.streams[stream]; ok {
		f.mu.Unlock()
		cancel()
		return fmt.Errorf("ingest %s: already joined", stream)
	}
	f.streams[stream] = res
	f.mu.Unlock()

	cl, _, err := f.route.open(ctx, app, stream)
	if err != nil {
		err = fmt.Errorf("join: %w", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.streams[stream] != res {
		// Left or closed while joining: the leave cancelled ctx.
		cancel()
		return fmt.Errorf("ingest %s: left while joining (the forwarder is closed or the stream left)", stream)
	}
	if err != nil {
		delete(f.streams, stream)
		cancel()
		return fmt.Errorf("ingest %s: %w", stream, err)
	}
	res.mu.Lock()
	res.cl, res.joining = cl, false
	res.mu.Unlock()
	return nil
}

func (f *Forwarder) stream(id string) (*forwarded, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.streams[id]
	if !ok {
		return nil, fmt.Errorf("ingest %s: not joined", id)
	}
	return s, nil
}

// Ingest sends one frame of the stream.
func (f *Forwarder) Ingest(stream string, seq uint64, capture time.Time, fr *media.Frame, truth []media.Box) error {
	s, err := f.stream(stream)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return s.err
	}
	if s.joining {
		return fmt.Errorf("ingest %s: still joining", stream)
	}
	if s.cl == nil {
		// broken: skip the frame; join again when the backoff is over
		if !s.reopening && !time.Now().Before(s.nextTry) {
			s.reopening = true
			go f.reopen(s, stream)
		}
		return nil
	}
	if err := s.cl.Send(&api.IngestMessage{Seq: seq, CaptureUnixNs: capture.UnixNano(), Frame: wire.FrameToPB(fr), Truth: wire.BoxesToPB(truth)}); err != nil {
		err = closeErr(s.cl, err)
		if permanent(err, true) {
			s.err = fmt.Errorf("ingest %s: %w", stream, err)
			return s.err
		}
		s.cancel()
		s.cl = nil
		s.broke()
		return nil
	}
	s.backoff = 0
	return nil
}

// broke schedules the next attempt to join again (s.mu held).
func (s *forwarded) broke() {
	s.backoff = min(max(2*s.backoff, rejoinFirst), rejoinMax)
	s.nextTry = time.Now().Add(s.backoff)
}

// reopen joins a broken stream again on a new call, off the caller's
// goroutine (opening waits for the connection).
func (f *Forwarder) reopen(s *forwarded, stream string) {
	ctx, cancel := context.WithCancel(context.Background())
	s.mu.Lock()
	if s.left {
		s.mu.Unlock()
		cancel()
		return
	}
	s.cancel = cancel // Leave cancels the attempt
	s.mu.Unlock()
	cl, _, err := f.route.open(ctx, s.app, stream)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reopening = false
	switch {
	case s.left:
		cancel()
	case err != nil && permanent(err, true):
		cancel()
		s.err = fmt.Errorf("ingest %s: join again: %w", stream, err)
	case err != nil:
		cancel()
		s.broke()
	default:
		s.cl = cl
	}
}

// Leave ends the stream's call (the coordinator leaves the session) and
// returns its count of accepted and rejected frames.
func (f *Forwarder) Leave(stream string) error {
	_, err := f.leave(stream)
	return err
}

func (f *Forwarder) leave(stream string) (*api.IngestReply, error) {
	f.mu.Lock()
	s, ok := f.streams[stream]
	delete(f.streams, stream)
	f.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("ingest %s: not joined", stream)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.left = true
	defer s.cancel()
	if s.joining {
		return nil, nil // its Join, cancelled, reports it
	}
	if s.err != nil {
		return nil, s.err
	}
	if s.cl == nil {
		return nil, nil // broken, not joined again yet: nothing to close
	}
	reply, err := s.cl.CloseAndRecv()
	if err != nil {
		return nil, fmt.Errorf("ingest %s: %w", stream, err)
	}
	return reply, nil
}

// Close leaves every stream still joined; later Joins are refused.
func (f *Forwarder) Close() error {
	defer f.route.close()
	f.mu.Lock()
	f.closed = true
	ids := make([]string, 0, len(f.streams))
	for id := range f.streams {
		ids = append(ids, id)
	}
	f.mu.Unlock()
	var errs []error
	for _, id := range ids {
		if _, err := f.leave(id); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
