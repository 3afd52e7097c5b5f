package source

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"

	"github.com/mdag/mdag/api"
)

// RouteTimeout bounds the coordinator's answer to Route.
const RouteTimeout = 5 * time.Second

// router opens a stream's Ingest call where the coordinator's Route says
// (issue 41): on the ingest worker it names, with its ticket, or on the
// coordinator when it names none (no worker ingests, an audio app, a
// coordinator without Route). Without dial every call goes to the
// coordinator. A connection to an ingest worker is dialled once and shared
// by the streams open there; it is closed when the last of them ends (a
// long-running source whose workers come and go keeps no connection to a
// worker it no longer streams to). Safe for concurrent use.
//
// An ingest worker this source cannot reach (the coordinator routed it to
// an address outside its network: a pod IP, a worker behind NAT) does not
// stop the stream: when the worker's connection is not ready within
// WorkerConnectTimeout (or fails at once), or opening the stream there
// fails Unavailable, and this source was never connected to that address,
// the stream goes to the coordinator, and so do that address's next ones
// for WorkerDownFor; it is logged each time. An address reached before
// that fails now is a worker gone: the open fails, and the caller routes
// again after its backoff (the coordinator by then routes elsewhere).
type router struct {
	cc   *grpc.ClientConn
	dial func(addr string) (*grpc.ClientConn, error)
	log  *slog.Logger // nil: none

	mu      sync.Mutex
	conns   map[string]*grpc.ClientConn
	users   map[string]int       // the streams open (or opening) on each connection
	down    map[string]time.Time // addresses never reached: the coordinator until then
	reached map[string]bool      // addresses this source has been connected to (one failing now is a worker gone: route again)
	closed  bool                 // close ran: no more dialling
}

// How long an ingest worker's connection may take to be ready, and how
// long an address that was not stays skipped.
const (
	WorkerConnectTimeout = 5 * time.Second
	WorkerDownFor        = time.Minute
)

// open opens the call for stream of app and sends its join; via says where
// it went, for logs.
func (r *router) open(ctx context.Context, app, stream string) (cl grpc.ClientStreamingClient[api.IngestMessage, api.IngestReply], via string, err error) {
	join := &api.Join{App: app, Stream: stream}
	via = "coordinator"
	if r.dial != nil {
		rctx, cancel := context.WithTimeout(ctx, RouteTimeout)
		rt, err := api.NewCoordinatorClient(r.cc).Route(rctx, &api.RouteRequest{App: app, Stream: stream})
		cancel()
		switch {
		case status.Code(err) == codes.Unimplemented:
			via = "coordinator (it does not route: an older one)"
		case err != nil:
			return nil, "", fmt.Errorf("route: %w", err)
		case rt.Addr == "":
			via = "coordinator (" + rt.Why + ")"
		case r.isDown(rt.Addr):
			via = fmt.Sprintf("coordinator (ingest worker %s at %s was unreachable from here)", rt.Worker, rt.Addr)
		default:
			cc, err := r.conn(rt.Addr)
			if err == nil {
				err = ready(ctx, cc)
			}
			if err == nil {
				cl, err = api.NewIngestClient(cc).Ingest(ctx)
			}
			if cc != nil {
				if err == nil {
					addr := rt.Addr // the stream's use ends with its call
					context.AfterFunc(ctx, func() { r.release(addr) })
				} else {
					r.release(rt.Addr)
				}
			}
			switch {
			case err == nil:
				r.reachedAddr(rt.Addr)
				join.Ticket, via = rt.Ticket, fmt.Sprintf("worker %s at %s", rt.Worker, rt.Addr)
			case ctx.Err() == nil && !r.wasReached(rt.Addr) && (status.Code(err) == codes.Unavailable || status.Code(err) == codes.DeadlineExceeded):
				// never reached from here: another network's address
				r.markDown(rt.Addr, rt.Worker, err)
				via = fmt.Sprintf("coordinator (ingest worker %s at %s unreachable: %v)", rt.Worker, rt.Addr, err)
			default:
				return nil, "", fmt.Errorf("ingest worker %s at %s: %w", rt.Worker, rt.Addr, err)
			}
		}
	}
	if cl == nil {
		if cl, err = api.NewCoordinatorClient(r.cc).Ingest(ctx); err != nil {
			return nil, "", err
		}
	}
	if err := cl.Send(&api.IngestMessage{Join: join}); err != nil {
		return nil, "", closeErr(cl, err)
	}
	return cl, via, nil
}

// ready waits, at most WorkerConnectTimeout, for cc to be connected.
func ready(ctx context.Context, cc *grpc.ClientConn) error {
	ctx, cancel := context.WithTimeout(ctx, WorkerConnectTimeout)
	defer cancel()
	cc.Connect()
	for {
		st := cc.GetState()
		switch st {
		case connectivity.Ready:
			return nil
		case connectivity.TransientFailure:
			return status.Error(codes.Unavailable, "the connection failed")
		}
		if !cc.WaitForStateChange(ctx, st) {
			return status.Errorf(codes.Unavailable, "not connected within %v (%s)", WorkerConnectTimeout, st)
		}
	}
}

func (r *router) reachedAddr(addr string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.reached == nil {
		r.reached = map[string]bool{}
	}
	r.reached[addr] = true
}

func (r *router) wasReached(addr string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.reached[addr]
}

func (r *router) isDown(addr string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	until, ok := r.down[addr]
	if ok && time.Now().After(until) {
		delete(r.down, addr)
		return false
	}
	return ok
}

func (r *router) markDown(addr, worker string, err error) {
	r.mu.Lock()
	if r.down == nil {
		r.down = map[string]time.Time{}
	}
	r.down[addr] = time.Now().Add(WorkerDownFor)
	r.mu.Unlock()
	if r.log != nil {
		r.log.Warn("ingest worker unreachable from this source: its streams go to the coordinator for a while", "worker", worker, "addr", addr, "for", WorkerDownFor, "err", err)
	}
}

// conn is the connection to the ingest worker at addr, dialled when no
// stream uses one, with one more user: each conn that returns one is
// matched by a release.
func (r *router) conn(addr string) (*grpc.ClientConn, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, errors.New("the source is closing")
	}
	cc := r.conns[addr]
	if cc == nil {
		var err error
		if cc, err = r.dial(addr); err != nil {
			return nil, err
		}
		if r.conns == nil {
			r.conns, r.users = map[string]*grpc.ClientConn{}, map[string]int{}
		}
		r.conns[addr] = cc
	}
	r.users[addr]++
	return cc, nil
}

// release ends one use of addr's connection; the last closes it.
func (r *router) release(addr string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.users[addr]--; r.users[addr] > 0 {
		return
	}
	delete(r.users, addr)
	if cc := r.conns[addr]; cc != nil {
		_ = cc.Close()
		delete(r.conns, addr)
	}
}

// close closes the connections to ingest workers.
func (r *router) close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	for a, cc := range r.conns {
		_ = cc.Close()
		delete(r.conns, a)
		delete(r.users, a)
	}
}
