//go:build lean

package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLeanTryVideo: the lean build reads no video and says so.
func TestLeanTryVideo(t *testing.T) {
	video := filepath.Join(t.TempDir(), "clip.avi")
	if err := os.WriteFile(video, []byte("RIFF....AVI LIST"), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	code := run([]string{"try", "--models", "../../examples/models.yaml", "--model", "blazeface", video}, &out, &errb)
	if code != exitInvalid || !strings.Contains(errb.String(), "reading videos needs OpenCV, which the lean build has not") {
		t.Errorf("exit %d: %s", code, errb.String())
	}
}
