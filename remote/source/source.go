package source

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"google.golang.org/grpc"

	"github.com/mdag/mdag/api"
	"github.com/mdag/mdag/ingest/synth"
	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/media"
	"github.com/mdag/mdag/remote/wire"
)

// Stream sends one synthetic camera (pattern's stream index) into app at
// fps until ctx ends or count frames were sent (0: no limit), then leaves.
// It returns the coordinator's count of accepted and rejected frames.
func Stream(ctx context.Context, cc *grpc.ClientConn, app, stream string, pat *synth.Pattern, index int, fps float64, count uint64) (*api.IngestReply, error) {
	// The gRPC stream outlives ctx by a moment so that ending the source
	// is a clean close (the camera leaves), not a cancelled call.
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	cl, err := api.NewCoordinatorClient(cc).Ingest(sctx)
	if err != nil {
		return nil, fmt.Errorf("ingest %s: %w", stream, err)
	}
	if err := cl.Send(&api.IngestMessage{Join: &api.Join{App: app, Stream: stream}}); err != nil {
		return nil, fmt.Errorf("ingest %s: join: %w", stream, closeErr(cl, err))
	}
	sink := func(_ string, seq uint64, capture time.Time, f *media.Frame, truth []media.Box) error {
		return cl.Send(&api.IngestMessage{Seq: seq, CaptureUnixNs: capture.UnixNano(), Frame: wire.FrameToPB(f), Truth: wire.BoxesToPB(truth)})
	}
	genErr := pat.Generate(ctx, clock.Real{}, index, stream, fps, count, sink)
	if genErr != nil && !errors.Is(genErr, context.Canceled) && !errors.Is(genErr, context.DeadlineExceeded) {
		return nil, fmt.Errorf("ingest %s: %w", stream, closeErr(cl, genErr))
	}
	reply, err := cl.CloseAndRecv()
	if err != nil {
		return nil, fmt.Errorf("ingest %s: %w", stream, err)
	}
	return reply, nil
}

// closeErr prefers the server's status (why it refused) to a send error.
func closeErr(cl grpc.ClientStreamingClient[api.IngestMessage, api.IngestReply], err error) error {
	if errors.Is(err, io.EOF) {
		if _, serr := cl.CloseAndRecv(); serr != nil {
			return serr
		}
	}
	return err
}
