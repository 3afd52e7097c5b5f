package remote

import (
	"context"
	"testing"

	"google.golang.org/grpc/stats"

	"github.com/mdag/mdag/api"
)

func TestIngressByMethod(t *testing.T) {
	s := &Server{}
	for _, c := range []struct {
		method string
		n      int
	}{
		{api.Coordinator_Connect_FullMethodName, 100},
		{api.Coordinator_Ingest_FullMethodName, 230400},
		{api.Coordinator_Ingest_FullMethodName, 7},
		{"/mdag.v1.Coordinator/Nope", 5},
	} {
		ctx := s.ingress.TagRPC(context.Background(), &stats.RPCTagInfo{FullMethodName: c.method})
		s.ingress.HandleRPC(ctx, &stats.InPayload{WireLength: c.n, Length: c.n})
		s.ingress.HandleRPC(ctx, &stats.OutPayload{WireLength: 1 << 20}) // sent: not counted
	}
	if got, want := s.Received(), (Received{Workers: 100, Sources: 230407, Other: 5}); got != want {
		t.Fatalf("Received() = %+v, want %+v", got, want)
	}
}
