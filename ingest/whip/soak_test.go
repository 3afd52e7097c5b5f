package whip

import (
	"context"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/ingest/synth"
)

// TestSoak: 50 streams on loopback for 60 s (MDAG_SOAK_DURATION changes
// it): every stream keeps delivering, the heap does not grow with time,
// and every goroutine is gone after Close (TestMain's goleak check).
func TestSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	const streams, fps = 50, 5
	dur := 60 * time.Second
	if v, err := time.ParseDuration(os.Getenv("MDAG_SOAK_DURATION")); err == nil && v > 0 {
		dur = v
	}
	srv, sink, hs := newTestServer(t, Config{Apps: map[dag.AppID]float64{"face": 0}, MaxStreams: streams,
		// 50 small streams (160x120 at 5 fps) start at once: predict them
		// small, so admission lets all in on 2 cores (newTestServer's
		// CPU load is 0).
		StreamCost: 0.01})
	pat, err := synth.NewPattern(160, 120, 1)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), dur+60*time.Second)
	defer cancel()
	pubs := make([]*Publisher, streams)
	var wg sync.WaitGroup
	errs := make(chan error, streams)
	for i := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p, err := Publish(ctx, ClientConfig{Server: hs.URL, App: "face", Width: 160, Height: 120, FPS: fps, BitrateKbps: 150})
			if err != nil {
				errs <- err
				return
			}
			pubs[i] = p
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapInuse
	}
	var early uint64
	start := time.Now()
	period := time.Second / fps
	for n := 0; time.Since(start) < dur; n++ {
		time.Sleep(time.Until(start.Add(time.Duration(n) * period))) // real-time pacing of the cameras
		at := time.Now()
		for i, p := range pubs {
			f, _, err := pat.Frame(i, uint64(n))
			if err != nil {
				t.Fatal(err)
			}
			if err := p.WriteFrame(f, at); err != nil {
				t.Fatalf("stream %d frame %d: %v", i, n, err)
			}
		}
		if n == int(dur/period)/3 {
			early = heap()
		}
	}
	late := heap()
	sent := pubs[0].Sent()
	waitFor(t, "the last frames", 10*time.Second, func() bool {
		for _, p := range pubs {
			if uint64(sink.count(p.Stream)) < sent*9/10 {
				return false
			}
		}
		return true
	})
	info := srv.Streams()
	var lost, decErr uint64
	for _, s := range info {
		lost += s.Lost
		decErr += s.DecodeErrors
	}
	t.Logf("%d streams x %d frames in %v: lost %d, decode errors %d; heap in use %.1f MB at 1/3, %.1f MB at the end",
		len(info), sent, dur, lost, decErr, float64(early)/1e6, float64(late)/1e6)
	if late > early*3/2+8<<20 {
		t.Errorf("heap grew from %d to %d bytes", early, late)
	}
	for _, p := range pubs {
		if err := p.Close(); err != nil {
			t.Error(err)
		}
	}
	waitFor(t, "every stream to end", 10*time.Second, func() bool {
		for _, s := range srv.Streams() {
			if s.Ended == "" {
				return false
			}
		}
		return true
	})
	sink.mu.Lock()
	defer sink.mu.Unlock()
	if len(sink.left) != streams {
		t.Errorf("%d of %d streams left the session", len(sink.left), streams)
	}
}
