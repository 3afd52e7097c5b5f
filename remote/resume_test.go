package remote

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/mdag/mdag/allocator/milp"
	"github.com/mdag/mdag/coordinator"
	"github.com/mdag/mdag/ingest/synth"
	"github.com/mdag/mdag/media"
	"github.com/mdag/mdag/remote/client"
	"github.com/mdag/mdag/remote/source"
)

// coordinatorAt serves a fresh engine with the traffic app on addr
// (127.0.0.1:0: any port); it returns the address it listens on.
func coordinatorAt(t *testing.T, addr string) (*coordinator.Engine, *grpc.Server, string) {
	t.Helper()
	app, prof := loadExample(t, "traffic")
	e := newEngine(t, coordinator.Config{MILPSolver: milp.Solver{}})
	e.Start()
	if err := e.Deploy(app, prof); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		e.Close()
		t.Fatal(err)
	}
	g := NewGRPC(&Server{Engine: e})
	go func() { _ = g.Serve(ln) }()
	t.Cleanup(func() { e.Close(); g.Stop() })
	return e, g, ln.Addr().String()
}

// waitStream waits until e's session has stream id and at least n frames
// sent; it returns the session.
func waitStream(t *testing.T, e *coordinator.Engine, id string, n uint64) coordinator.SessionStatus {
	t.Helper()
	var ss coordinator.SessionStatus
	waitFor(t, fmt.Sprintf("stream %s with %d frames", id, n), 15*time.Second, func() bool {
		ss = e.Status().Sessions[0]
		return slices.Contains(ss.StreamIDs, id) && ss.Total.Sent >= n
	})
	return ss
}

// TestSourceReconnects (issue 22 part 3): a source's camera outlives its
// coordinator. The coordinator goes away under a live stream and another
// comes up on the same address; the camera joins it again under the same
// stream ID on its own, keeps numbering its frames (the new coordinator
// sees sequence numbers beyond the old one's), and its account adds up:
// every frame it produced was accepted, rejected, sent on the broken
// connection (unconfirmed) or skipped while no connection was up.
func TestSourceReconnects(t *testing.T) {
	e1, g1, addr := coordinatorAt(t, "127.0.0.1:0")
	cc, err := client.Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	pat, err := synth.NewPattern(160, 120, 2)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type out struct {
		r   *source.StreamResult
		err error
	}
	done := make(chan out, 1)
	go func() {
		r, err := source.StreamReconnecting(ctx, cc, "traffic", "cam-r", pat, 0, 20, 0, source.Reconnect{})
		done <- out{r, err}
	}()
	first := waitStream(t, e1, "cam-r", 5)
	g1.Stop() // the coordinator is gone: its connections close under the camera
	e1.Close()
	e2, _, _ := coordinatorAt(t, addr)
	second := waitStream(t, e2, "cam-r", 5)
	cancel()
	var o out
	select {
	case o = <-done:
	case <-time.After(15 * time.Second):
		t.Fatal("the camera did not stop within 15 s of its context ending")
	}
	if o.err != nil {
		t.Fatal(o.err)
	}
	r := o.r
	t.Logf("first coordinator: %d frames; second: %d; camera: %+v", first.Total.Sent, second.Total.Sent, *r)
	if r.Connections != 2 {
		t.Errorf("%d connections; want 2 (one per coordinator)", r.Connections)
	}
	if r.Accepted+r.Rejected+r.Unconfirmed+r.Skipped != r.Generated {
		t.Errorf("account: %d accepted + %d rejected + %d unconfirmed + %d skipped != %d produced", r.Accepted, r.Rejected, r.Unconfirmed, r.Skipped, r.Generated)
	}
	if r.Unconfirmed < first.Total.Sent {
		t.Errorf("%d unconfirmed; the first coordinator had %d of them", r.Unconfirmed, first.Total.Sent)
	}
	if last := e2.Status().Sessions[0].Total.Sent; r.Accepted != last || r.Accepted == 0 {
		t.Errorf("%d accepted on the second connection; the coordinator counted %d", r.Accepted, last)
	}
}

// TestSourceRefusedStops: a join the coordinator refuses for good (an
// app it does not serve) ends the camera with the coordinator's code at
// once; it does not retry.
func TestSourceRefusedStops(t *testing.T) {
	_, _, addr := coordinatorAt(t, "127.0.0.1:0")
	cc, err := client.Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	pat, err := synth.NewPattern(160, 120, 2)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r, err := source.StreamReconnecting(ctx, cc, "nope", "cam-x", pat, 0, 50, 0, source.Reconnect{})
	if status.Code(err) != codes.NotFound || ctx.Err() != nil {
		t.Fatalf("unknown app: %v (context %v); want NotFound before the context ends", err, ctx.Err())
	}
	if r.Connections != 1 {
		t.Errorf("%d connections; want 1", r.Connections)
	}
}

// TestSourceNeverConnected: a camera that never got in (nothing listens
// there) keeps trying while it runs, and says so when it stops.
func TestSourceNeverConnected(t *testing.T) {
	addr := func() string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		return ln.Addr().String()
	}()
	cc, err := client.Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	pat, err := synth.NewPattern(160, 120, 2)
	if err != nil {
		t.Fatal(err)
	}
	r, err := source.StreamReconnecting(context.Background(), cc, "traffic", "cam-n", pat, 0, 20, 6, source.Reconnect{})
	if err == nil || !strings.Contains(err.Error(), "never connected") || status.Code(errors.Unwrap(err)) != codes.Unavailable {
		t.Fatalf("no coordinator: %v; want 'never connected' with Unavailable", err)
	}
	if r.Generated != 6 || r.Skipped != 6 || r.Connections != 0 {
		t.Errorf("account %+v; want 6 produced, 6 skipped, no connection", *r)
	}
}

// TestForwarderRejoins: a forwarded camera (`mdag source --camera`)
// outlives its coordinator too: when the coordinator goes and another comes
// up on the address, the stream's Ingest never fails (the frames meanwhile
// are skipped), the stream joins the new coordinator under its name and
// its frames are accepted there; Leave ends it cleanly.
func TestForwarderRejoins(t *testing.T) {
	e1, g1, addr := coordinatorAt(t, "127.0.0.1:0")
	cc, err := client.Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	f := source.NewForwarder(cc)
	defer f.Close()
	if err := f.Join("traffic", "door"); err != nil {
		t.Fatal(err)
	}
	frame := media.NewFrame(32, 24)
	seq := uint64(0)
	send := func() {
		t.Helper()
		if err := f.Ingest("door", seq, time.Now(), frame, nil); err != nil && !strings.Contains(err.Error(), "still joining") {
			t.Fatalf("ingest %d: %v", seq, err)
		}
		seq++
		<-time.After(5 * time.Millisecond)
	}
	waitFor(t, "the first coordinator to take frames", 10*time.Second, func() bool {
		send()
		return e1.Status().Sessions[0].Total.Sent >= 3
	})
	g1.Stop()
	e1.Close()
	e2, _, _ := coordinatorAt(t, addr)
	waitFor(t, "the second coordinator to take frames", 15*time.Second, func() bool {
		send()
		ss := e2.Status().Sessions[0]
		return slices.Contains(ss.StreamIDs, "door") && ss.Total.Sent >= 3
	})
	if err := f.Leave("door"); err != nil {
		t.Fatalf("leave after the rejoin: %v", err)
	}
	waitFor(t, "the stream to leave the second coordinator", 10*time.Second, func() bool {
		return len(e2.Status().Sessions[0].StreamIDs) == 0
	})
}
