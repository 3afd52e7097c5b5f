package remote

import (
	"context"
	"fmt"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/mdag/mdag/allocator/milp"
	"github.com/mdag/mdag/coordinator"
	"github.com/mdag/mdag/internal/testapps"
	"github.com/mdag/mdag/media"
	"github.com/mdag/mdag/profile"
	"github.com/mdag/mdag/remote/client"
)

// BenchmarkHop sends one 320x240 frame at a time through chains of 1 and 5
// no-op modules, on an in-process worker (embedded) and on a worker behind
// loopback gRPC. Per extra hop = (p50 of 5 - p50 of 1) / 4, likewise p99.
// Every hop over gRPC carries the frame both ways (task down, result up);
// on grpc-direct (the direct data plane) the frame goes down once and the
// worker keeps what its modules make: the next module on the same worker
// takes it from its store, and results carry references.
func BenchmarkHop(b *testing.B) {
	for _, mode := range []string{"embedded", "grpc", "grpc-direct"} {
		for _, n := range []int{1, 5} {
			b.Run(fmt.Sprintf("%s/modules-%d", mode, n), func(b *testing.B) {
				done := make(chan time.Duration, 1)
				e := startChain(b, mode, n, func(r coordinator.FrameResult) { done <- r.Latency })
				f := media.NewFrame(320, 240)
				lat := make([]time.Duration, 0, b.N)
				b.ResetTimer()
				for i := range b.N {
					if err := e.Ingest("s", uint64(i), time.Now(), f, nil); err != nil {
						b.Fatal(err)
					}
					lat = append(lat, <-done)
				}
				b.StopTimer()
				slices.Sort(lat)
				b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-us")
				b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-us")
			})
		}
	}
}

func startChain(b *testing.B, mode string, n int, onFrame func(coordinator.FrameResult)) *coordinator.Engine {
	app, prof, err := testapps.NoopChain(n)
	if err != nil {
		b.Fatal(err)
	}
	var e *coordinator.Engine
	if mode == "embedded" {
		e, _, err = coordinator.NewEmbedded(coordinator.Config{MILPSolver: milp.Solver{}, OnFrame: onFrame}, map[profile.WorkerTypeID]int{"CPU": 1})
	} else {
		e, err = coordinator.New(coordinator.Config{MILPSolver: milp.Solver{}, OnFrame: onFrame})
	}
	if err != nil {
		b.Fatal(err)
	}
	e.Start()
	b.Cleanup(e.Close)
	if err := e.Deploy(app, prof); err != nil {
		b.Fatal(err)
	}
	if mode != "embedded" {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		srv := &Server{Engine: e}
		g := NewGRPC(srv)
		go func() { _ = g.Serve(ln) }()
		cc, err := client.Dial(ln.Addr().String())
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		stopped := make(chan struct{})
		var dp *client.DataPlane
		stopPeer := func() {}
		if mode == "grpc-direct" {
			pl, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			dp = &client.DataPlane{Addr: pl.Addr().String(), Store: &client.Store{}}
			pg := client.NewPeerGRPC(&client.PeerServer{ID: "w", Store: dp.Store})
			go func() { _ = pg.Serve(pl) }()
			stopPeer = pg.Stop
		}
		go func() {
			defer close(stopped)
			_ = client.RunWorker(ctx, cc, client.WorkerConfig{ID: "w", Type: "CPU", Data: dp})
		}()
		b.Cleanup(func() { cancel(); <-stopped; cc.Close(); g.Stop(); stopPeer() })
		deadline := time.Now().Add(5 * time.Second)
		for len(srv.Workers()) == 0 && time.Now().Before(deadline) {
			<-time.After(time.Millisecond)
		}
	}
	if err := e.Join("chain", "s"); err != nil {
		b.Fatal(err)
	}
	return e
}

// BenchmarkWorkerLoss is TestLoopbackWorkerLoss's figure: the finish rate
// of the windows from 1 s to 10 s after the V100 hosting modules dies (two
// cameras at 10 fps, a spare V100 and a CPU worker over loopback gRPC).
// One iteration is ~8 s of live streams; run with -benchtime 1x -count N.
func BenchmarkWorkerLoss(b *testing.B) {
	for range b.N {
		r := runWorkerLoss(b)
		b.ReportMetric(r.finishRate()*100, "finish-%")
	}
}
