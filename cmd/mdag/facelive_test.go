//go:build !lean

package main

import (
	"bytes"
	"context"
	"fmt"
	"image/jpeg"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/mdag/mdag/coordinator"
	"github.com/mdag/mdag/examples"
	"github.com/mdag/mdag/gpu"
	"github.com/mdag/mdag/gpu/decode"
	"github.com/mdag/mdag/gpu/onnx"
	"github.com/mdag/mdag/gpu/registry"
	"github.com/mdag/mdag/media"
	"github.com/mdag/mdag/profile"
)

// megamind is the sample video of Debian's opencv-doc (make deps installs it).
const megamind = "/usr/share/doc/opencv-doc/examples/data/Megamind.avi"

// megamindFaces are frames of Megamind.avi (0-based, as VideoCapture reads
// them; 720x528) where a character looks at the camera: BlazeFace (threshold
// 0.6) finds exactly one face there with a score >= 0.85. Found once by
// running the blazeface entry of examples/models.yaml at batch 1 over all
// 270 frames (it finds a face on 269; on 21 a second, weaker one).
var megamindFaces = func() []int {
	var fs []int
	for i := 8; i <= 47; i++ {
		fs = append(fs, i)
	}
	return fs
}()

// loadMegamind decodes the listed frames with gocv (the full build's
// VideoCapture); it skips without opencv-doc unless MDAG_REQUIRE_MODELS is
// set (make test).
func loadMegamind(t *testing.T, want []int) []*media.Frame {
	t.Helper()
	if _, err := os.Stat(megamind); err != nil {
		if os.Getenv("MDAG_REQUIRE_MODELS") != "" {
			t.Fatalf("%v (make deps installs opencv-doc)", err)
		}
		t.Skipf("%v: make deps installs opencv-doc", err)
	}
	open, err := sourceOpener(megamind, "640x480", 3, false)
	if err != nil {
		t.Fatal(err)
	}
	src, err := open()
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	keep := map[int]bool{}
	for _, i := range want {
		keep[i] = true
	}
	var out []*media.Frame
	for i := 0; len(out) < len(want); i++ {
		f, err := src.Next(0, uint64(i))
		if err != nil {
			t.Fatalf("%s: frame %d: %v", megamind, i, err)
		}
		if keep[i] {
			out = append(out, f)
		}
	}
	return out
}

// TestServeFaceLive serves examples/face-live in process (the engine, its
// in-process worker and the dashboard's recorder, as mdag serve and mdag
// demo run them) with BlazeFace on the onnx executor, and streams Megamind
// frames into it: two streams at the app's fps. At least 95% of the frames
// finish within the SLO, and each finished frame's result carries the face
// BlazeFace finds on that frame alone (IoU >= 0.9) and its count, and the
// dashboard's thumbnails show the face's outline.
func TestServeFaceLive(t *testing.T) {
	if testing.Short() {
		t.Skip("streams 4 s of video")
	}
	requireORT(t)
	reg, err := registry.Load("../../examples/models.yaml")
	if err != nil {
		t.Fatal(err)
	}
	m, err := reg.Get("blazeface")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(m.Path); err != nil {
		if os.Getenv("MDAG_REQUIRE_MODELS") != "" {
			t.Fatalf("%v (MDAG_REQUIRE_MODELS is set: run make models)", err)
		}
		t.Skipf("%v: run make models", err)
	}
	frames := loadMegamind(t, megamindFaces)
	reg.Models = map[string]*registry.Model{"blazeface": m}
	x, err := onnx.New(reg, onnx.Config{IntraThreads: 1, Sessions: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	// the reference: each frame alone
	want := make([]media.Box, len(frames))
	for i, f := range frames {
		out, err := x.Run(context.Background(), "blazeface", []*media.Item{{Frame: f}})
		if err != nil {
			t.Fatal(err)
		}
		if b := out[0][0].Boxes; len(b) != 1 {
			t.Fatalf("frame %d: %d faces at batch 1, want 1 (megamindFaces lists frames with one face)", megamindFaces[i], len(b))
		}
		want[i] = out[0][0].Boxes[0]
	}

	app, prof, err := examples.Parse("face-live")
	if err != nil {
		t.Fatal(err)
	}
	cfg := coordinator.Config{Executor: func(string, profile.WorkerTypeID) (gpu.Executor, error) { return x, nil }}
	obs, err := startObserved(cfg, map[profile.WorkerTypeID]int{"ORT-CPU": 1}, app, prof)
	if err != nil {
		t.Fatal(err)
	}
	defer obs.Close()
	const streams = 2
	total := streams * len(frames)
	results := make(chan coordinator.FrameResult, total)
	publish := func(r coordinator.FrameResult) { results <- r }
	obs.results.publish.Store(&publish)

	var wg sync.WaitGroup
	for s := range streams {
		id := fmt.Sprintf("megamind-%d", s)
		if err := obs.e.Join(app.Name, id); err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() { // the camera: frames at the app's fps
			defer wg.Done()
			tick := time.NewTicker(time.Duration(float64(time.Second) / app.FPS))
			defer tick.Stop()
			for i, f := range frames {
				if err := obs.ingest(id, uint64(i+1), time.Now(), f, nil); err != nil {
					t.Errorf("%s frame %d: %v", id, i+1, err)
				}
				<-tick.C
			}
		}()
	}
	wg.Wait()
	got := map[string]coordinator.FrameResult{}
	bound := time.After(app.SLO + 30*time.Second) // a bound on a hang, not a wait for logic
	for len(got) < total {
		select {
		case r := <-results:
			got[fmt.Sprint(r.Stream, "/", r.Seq)] = r
		case <-bound:
			t.Fatalf("%d of %d frames accounted for", len(got), total)
		}
	}
	finished, faces := 0, 0
	for key, r := range got {
		if r.Outcome != coordinator.Finished {
			t.Logf("%s: %s %v %s %s", key, r.Outcome, r.Latency, r.Module, r.Reason)
			continue
		}
		finished++
		i := int(r.Seq) - 1
		if len(r.Boxes) != 1 || decode.IoU(r.Boxes[0], want[i]) < 0.9 || r.Counts["face"] != 1 {
			t.Errorf("%s (Megamind frame %d): boxes %v counts %v, want the face %v (batch 1) and count face=1", key, megamindFaces[i], r.Boxes, r.Counts, want[i])
			continue
		}
		faces++
	}
	rate := float64(finished) / float64(total)
	t.Logf("%d frames: %d finished within the %v SLO (%.1f%%), %d with the face", total, finished, app.SLO, 100*rate, faces)
	if rate < 0.95 {
		t.Errorf("finish rate %.1f%%, want >= 95%%", 100*rate)
	}
	// the dashboard's thumbnail of a stream shows the latest face (green
	// outlines: dashboard.Thumbs draws the boxes of the latest result)
	for s := range streams {
		id := fmt.Sprintf("megamind-%d", s)
		img, err := jpeg.Decode(bytes.NewReader(obs.rec.Thumbs().Get(id)))
		if err != nil {
			t.Fatalf("%s's thumbnail: %v", id, err)
		}
		green := 0
		for y := img.Bounds().Min.Y; y < img.Bounds().Max.Y; y++ {
			for x := img.Bounds().Min.X; x < img.Bounds().Max.X; x++ {
				r, g, b, _ := img.At(x, y).RGBA()
				if g>>8 > 200 && r>>8 < 100 && b>>8 < 100 {
					green++
				}
			}
		}
		t.Logf("%s thumbnail: %d green pixels", id, green)
		if green < 60 {
			t.Errorf("%s's thumbnail has %d green pixels: no face outline drawn", id, green)
		}
	}
	if st := obs.e.Status(); len(st.Sessions) > 0 {
		t.Logf("p50 %.1f ms, p99 %.1f ms", st.Sessions[0].P50MS, st.Sessions[0].P99MS)
	}
}
