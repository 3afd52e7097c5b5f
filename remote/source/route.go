package source

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/mdag/mdag/api"
)

// RouteTimeout bounds the coordinator's answer to Route.
const RouteTimeout = 5 * time.Second

// router opens a stream's Ingest call where the coordinator's Route says
// (issue 41): on the ingest worker it names, with its ticket, or on the
// coordinator when it names none (no worker ingests, an audio app, a
// coordinator without Route). Without dial every call goes to the
// coordinator. Connections to ingest workers are dialled once and kept
// until close. Safe for concurrent use.
type router struct {
	cc   *grpc.ClientConn
	dial func(addr string) (*grpc.ClientConn, error)

	mu     sync.Mutex
	conns  map[string]*grpc.ClientConn
	closed bool // close ran: no more dialling
}

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
		default:
			cc, err := r.conn(rt.Addr)
			if err == nil {
				cl, err = api.NewIngestClient(cc).Ingest(ctx)
			}
			if err != nil {
				return nil, "", fmt.Errorf("ingest worker %s at %s: %w", rt.Worker, rt.Addr, err)
			}
			join.Ticket, via = rt.Ticket, fmt.Sprintf("worker %s at %s", rt.Worker, rt.Addr)
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

// conn is the connection to the ingest worker at addr, dialled once.
func (r *router) conn(addr string) (*grpc.ClientConn, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, errors.New("the source is closing")
	}
	if cc := r.conns[addr]; cc != nil {
		return cc, nil
	}
	cc, err := r.dial(addr)
	if err != nil {
		return nil, err
	}
	if r.conns == nil {
		r.conns = map[string]*grpc.ClientConn{}
	}
	r.conns[addr] = cc
	return cc, nil
}

// close closes the connections to ingest workers.
func (r *router) close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	for a, cc := range r.conns {
		_ = cc.Close()
		delete(r.conns, a)
	}
}
