package clips

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/ingest/avc"
	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/media"
)

// newAVC is the binary's encoder (cmd/mdag's newClipEncoder), here for the test.
func newAVC(w, h, fps, kbps int) (Encoder, error) {
	e, err := avc.NewEncoder(avc.EncoderConfig{Width: w, Height: h, FPS: fps, BitrateKbps: kbps, KeyEvery: 10 * fps})
	if err != nil {
		return nil, err
	}
	return &avc.AccessUnits{E: e}, nil
}

// scene is a moving gradient, so each frame differs.
func scene(w, h, i int) *media.Frame {
	f := &media.Frame{W: w, H: h, Pix: make([]byte, w*h*3)}
	for y := range h {
		for x := range w {
			p := (y*w + x) * 3
			f.Pix[p], f.Pix[p+1], f.Pix[p+2] = byte(x+4*i), byte(y+2*i), byte(x+y)
		}
	}
	return f
}

// TestClipFFprobe: a clip written around an activity event, by the real
// encoder (libx264) and muxer, opens with ffprobe with the expected codec,
// size, frame count and duration.
func TestClipFFprobe(t *testing.T) {
	probe, err := exec.LookPath("ffprobe")
	if err != nil {
		if os.Getenv("MDAG_REQUIRE_FFMPEG") != "" {
			t.Fatal("ffprobe not found and MDAG_REQUIRE_FFMPEG is set: apt-get install ffmpeg")
		}
		t.Skip("ffprobe not found (apt-get install ffmpeg; MDAG_REQUIRE_FFMPEG=1 makes this a failure)")
	}
	clk := clock.NewFake(t0)
	dir := t.TempDir()
	r, err := New(Config{App: "t", Dir: dir, FPS: 10, Clock: clk, NewEncoder: newAVC, Log: slog.New(slog.DiscardHandler),
		Clips: dag.Clips{Pre: 2 * time.Second, Post: 3 * time.Second, MaxLength: time.Minute, MaxBytes: 1 << 30, MaxAge: time.Hour, PerMinute: 6, BitrateKbps: 500}})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	const w, h = 320, 240
	for i := range 100 { // 10 s at 10 fps; a line-cross at 5.5 s, its result 3 frames later
		capture := at(i)
		clk.Set(capture.Add(50 * time.Millisecond))
		r.Frame("cam", uint64(i), capture, scene(w, h, i))
		r.Sync() // encoded before the next: none dropped from the stream's queue
		if i == 58 {
			r.Event("cam", 55, time.Time{}, media.Event{Kind: "line-cross", Rule: "door", Track: 3, Detail: "crossed line door left-to-right"})
		}
	}
	r.Sync()
	list := r.Store().List()
	if len(list) != 1 {
		t.Fatalf("%d clips, want 1", len(list))
	}
	// from the key frame at 3.0 s (pre-roll to 3.5 s; a key frame every
	// second) to 8.5 s: frames 30..85
	const frames = 56
	c := list[0]
	if c.Frames != frames || c.Duration != 5600*time.Millisecond {
		t.Errorf("clip %+v: want %d frames, 5.6 s", c, frames)
	}
	out, err := exec.Command(probe, "-v", "error", "-count_frames", "-show_entries", "stream=nb_read_frames,codec_name,width,height",
		"-show_entries", "format=duration", "-of", "json", filepath.Join(dir, c.Name)).CombinedOutput()
	if err != nil {
		t.Fatalf("ffprobe: %v\n%s", err, out)
	}
	var p struct {
		Streams []struct {
			Codec  string `json:"codec_name"`
			W      int    `json:"width"`
			H      int    `json:"height"`
			Frames string `json:"nb_read_frames"`
		}
		Format struct {
			Duration string
		}
	}
	if err := json.Unmarshal(out, &p); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	d, _ := strconv.ParseFloat(p.Format.Duration, 64)
	if len(p.Streams) != 1 || p.Streams[0].Codec != "h264" || p.Streams[0].W != w || p.Streams[0].H != h ||
		p.Streams[0].Frames != strconv.Itoa(frames) || d < 5.55 || d > 5.65 {
		t.Errorf("ffprobe: %s\nwant h264 %dx%d, %d frames, 5.6 s", out, w, h, frames)
	}
	t.Logf("ffprobe: %s", out)
	var sc Sidecar
	b, err := os.ReadFile(filepath.Join(dir, c.Name[:len(c.Name)-4]+".json"))
	if err == nil {
		err = json.Unmarshal(b, &sc)
	}
	if err != nil || sc.Event == nil || sc.Event.Rule != "door" || sc.Seq != 55 || sc.Clip.Frames != frames {
		t.Errorf("sidecar: %v %s", err, b)
	}
}

// BenchmarkRecord is the recording's cost per frame with the real encoder
// (libx264, the binary's settings) at the default bitrate: the stream's
// goroutine's encode and the ring, as Frame queues it. cpu-ms/frame is
// the process's CPU time (libx264's threads included) per frame;
// cores@10fps is what one stream at 10 fps costs. 1920x1080 is scaled to
// 1280x720 first (MaxSide). docs/benchmarks.md has the figures.
func BenchmarkRecord(b *testing.B) {
	for _, sz := range [][2]int{{320, 240}, {640, 480}, {1280, 720}, {1920, 1080}} {
		b.Run(fmt.Sprintf("%dx%d", sz[0], sz[1]), func(b *testing.B) {
			clk := clock.NewFake(t0)
			r, err := New(Config{App: "b", Dir: b.TempDir(), FPS: 10, Clock: clk, NewEncoder: newAVC, Log: slog.New(slog.DiscardHandler),
				Clips: dag.Clips{Pre: 5 * time.Second, Post: 5 * time.Second, MaxLength: time.Minute, MaxBytes: 1 << 30, MaxAge: time.Hour, PerMinute: 6, BitrateKbps: 1000}})
			if err != nil {
				b.Fatal(err)
			}
			defer r.Close()
			frames := make([]*media.Frame, 30)
			for i := range frames {
				frames[i] = scene(sz[0], sz[1], i)
			}
			r.Frame("cam", 0, t0, frames[0]) // the encoder's start
			r.Sync()
			cpu0 := cpuTime()
			b.ResetTimer()
			for i := range b.N {
				at := t0.Add(time.Duration(i+1) * 100 * time.Millisecond)
				clk.Set(at)
				r.Frame("cam", uint64(i+1), at, frames[(i+1)%len(frames)])
				r.Sync()
			}
			b.StopTimer()
			per := (cpuTime() - cpu0).Seconds() / float64(b.N)
			b.ReportMetric(per*1000, "cpu-ms/frame")
			b.ReportMetric(per*10, "cores@10fps")
		})
	}
}

// BenchmarkFrameQueue is Frame's cost on the ingest path: it only queues
// the frame (the encoder here takes no time).
func BenchmarkFrameQueue(b *testing.B) {
	r, err := New(Config{App: "b", Dir: b.TempDir(), FPS: 10, Clock: clock.NewFake(t0), Log: slog.New(slog.DiscardHandler), FrameQueue: 1 << 16,
		Clips:      dag.Clips{Pre: 5 * time.Second, Post: 5 * time.Second, MaxLength: time.Minute, MaxBytes: 1 << 30, MaxAge: time.Hour, PerMinute: 6},
		NewEncoder: func(w, h, fps, kbps int) (Encoder, error) { return &fakeEncoder{}, nil }})
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	f := scene(640, 480, 0)
	for i := 0; b.Loop(); i++ {
		r.Frame("cam", uint64(i), t0.Add(time.Duration(i)*100*time.Millisecond), f)
		if i%1000 == 999 {
			b.StopTimer()
			r.Sync()
			b.StartTimer()
		}
	}
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkScale is scaling a 1920x1080 frame to 1280x720.
func BenchmarkScale(b *testing.B) {
	f := scene(1920, 1080, 0)
	for b.Loop() {
		scale(f, 1280)
	}
}
