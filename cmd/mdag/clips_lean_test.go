//go:build lean

package main

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/mdag/mdag/dag"
)

// TestLeanClips: the lean build refuses an app's clips section by name,
// saying the full build records clips.
func TestLeanClips(t *testing.T) {
	app, err := dag.Parse("app.yaml", []byte("app: t\nslo: 400ms\nmodules:\n  - {name: detect, kind: gpu, model: ssd, inputs: [source]}\nclips: {}\n"))
	if err != nil {
		t.Fatal(err)
	}
	c, err := startClips(app, t.TempDir(), slog.New(slog.DiscardHandler))
	if c != nil || err == nil || !strings.Contains(err.Error(), "clips: section) are not in the lean build") || !strings.Contains(err.Error(), "the full build records clips") {
		t.Fatalf("startClips: %v %v", c, err)
	}
}
