package remote

import (
	"context"
	"sync/atomic"

	"google.golang.org/grpc/stats"

	"github.com/mdag/mdag/api"
)

// Received is what the coordinator's gRPC port has received, in bytes on
// the wire (after compression, before decoding), by who sent it: the
// workers (their results, heartbeats, load replies) and the sources
// (camera frames, audio). It is what a frame costs the coordinator to
// take in, the figure issue 41 drives down to metadata alone.
type Received struct {
	Workers uint64 `json:"workers_bytes"`
	Sources uint64 `json:"sources_bytes"`
	Other   uint64 `json:"other_bytes"` // calls of no known method (refused)
}

// ingress counts the bytes of every message the gRPC server receives, by
// the method of its call (a grpc stats.Handler).
type ingress struct{ workers, sources, other atomic.Uint64 }

type methodKey struct{}

func (in *ingress) TagRPC(ctx context.Context, info *stats.RPCTagInfo) context.Context {
	return context.WithValue(ctx, methodKey{}, info.FullMethodName)
}

func (in *ingress) HandleRPC(ctx context.Context, s stats.RPCStats) {
	p, ok := s.(*stats.InPayload)
	if !ok {
		return
	}
	n := uint64(max(p.WireLength, 0))
	switch m, _ := ctx.Value(methodKey{}).(string); m {
	case api.Coordinator_Connect_FullMethodName:
		in.workers.Add(n)
	case api.Coordinator_Ingest_FullMethodName:
		in.sources.Add(n)
	default:
		in.other.Add(n)
	}
}

func (*ingress) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }
func (*ingress) HandleConn(context.Context, stats.ConnStats)                       {}

// Received returns the bytes the gRPC port has received so far.
func (s *Server) Received() Received {
	return Received{Workers: s.ingress.workers.Load(), Sources: s.ingress.sources.Load(), Other: s.ingress.other.Load()}
}
