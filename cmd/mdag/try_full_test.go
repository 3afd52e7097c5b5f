//go:build !lean

package main

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// TestTryVideo: on a video (the full build reads it with OpenCV) try
// runs the first --max-frames frames and draws each on its own PNG,
// --out's name numbered.
func TestTryVideo(t *testing.T) {
	requireBlazeFace(t)
	if _, err := os.Stat(megamind); err != nil {
		if os.Getenv("MDAG_REQUIRE_MODELS") != "" {
			t.Fatalf("%v (make deps installs opencv-doc)", err)
		}
		t.Skipf("%v: make deps installs opencv-doc", err)
	}
	dir := t.TempDir()
	res := tryJSON(t, "--models", "../../examples/models.yaml", "--model", "blazeface", "--max-frames", "3", "--out", filepath.Join(dir, "mm.png"), megamind)
	if res.Kind != "video" || len(res.Frames) != 3 {
		t.Fatalf("result %+v, want 3 video frames", res)
	}
	faces := 0
	for i, f := range res.Frames {
		if want := filepath.Join(dir, fmt.Sprintf("mm-%04d.png", i)); f.Frame != i || f.PNG != want || f.Width != 720 || f.Height != 528 {
			t.Errorf("frame %+v, want %d 720x528 drawn in %s", f, i, want)
		}
		checkDrawn(t, f)
		faces += len(f.Boxes)
	}
	if faces == 0 {
		t.Error("no face on Megamind.avi's first 3 frames")
	}
}
