package whip

import (
	"context"
	"fmt"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/ingest/synth"
	"github.com/mdag/mdag/media"
)

// BenchmarkGlassToSession streams b.N frames at 30 fps over loopback
// WebRTC and reports the time from each frame's capture (before encoding)
// to its hand-off to the session (after assembly, decode and colour
// conversion): p50 and p99 in ms, for VP8 and H.264. Run with
// -benchtime 300x (10 s).
func BenchmarkGlassToSession(b *testing.B) {
	for _, bc := range []struct {
		codec string
		size  [2]int
	}{{CodecVP8, [2]int{640, 480}}, {CodecVP8, [2]int{1280, 720}}, {CodecH264, [2]int{640, 480}}, {CodecH264, [2]int{1280, 720}}} {
		size := bc.size
		b.Run(fmt.Sprintf("%s/%dx%d", bc.codec, size[0], size[1]), func(b *testing.B) {
			sink := newSink()
			srv, err := New(Config{Apps: map[dag.AppID]float64{"a": 0}}, sink)
			if err != nil {
				b.Fatal(err)
			}
			defer srv.Close()
			hs := httptest.NewServer(srv.Handler())
			defer hs.Close()
			pat, err := synth.NewPattern(size[0], size[1], 3)
			if err != nil {
				b.Fatal(err)
			}
			frames := make([]*media.Frame, 30)
			for i := range frames {
				frames[i], _, _ = pat.Frame(0, uint64(i))
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			p, err := Publish(ctx, ClientConfig{Server: hs.URL, App: "a", Width: size[0], Height: size[1], FPS: 30, BitrateKbps: 2000, Codec: bc.codec})
			if err != nil {
				b.Fatal(err)
			}
			defer p.Close()
			captured := make([]time.Time, b.N)
			b.ResetTimer()
			start := time.Now()
			for i := range b.N {
				at := start.Add(time.Duration(i) * time.Second / 30)
				time.Sleep(time.Until(at)) // a 30 fps camera
				captured[i] = time.Now()
				if err := p.WriteFrame(frames[i%len(frames)], captured[i]); err != nil {
					b.Fatal(err)
				}
			}
			deadline := time.Now().Add(5 * time.Second)
			for sink.count(p.Stream) < b.N && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			b.StopTimer()
			sink.mu.Lock()
			got := sink.frames[p.Stream]
			sink.mu.Unlock()
			var lat, est []float64
			for _, f := range got {
				if int(f.seq) > len(captured) {
					continue
				}
				lat = append(lat, float64(f.at.Sub(captured[f.seq-1]).Microseconds())/1000)
				est = append(est, float64(f.at.Sub(f.capture).Microseconds())/1000)
			}
			if len(lat) < b.N*9/10 {
				b.Fatalf("%d of %d frames reached the session", len(lat), b.N)
			}
			slices.Sort(lat)
			slices.Sort(est)
			b.ReportMetric(lat[len(lat)/2], "p50-ms")
			b.ReportMetric(lat[len(lat)*99/100], "p99-ms")
			b.ReportMetric(est[len(est)/2], "server-est-p50-ms")
		})
	}
}
