//go:build lean

package main

import (
	"fmt"

	"github.com/mdag/mdag/clips"
	"github.com/mdag/mdag/dag"
)

// clipsBuilt: the lean build links no libx264, so it records no clips; an
// app with a clips section is refused.
func clipsBuilt(app *dag.App) error {
	return fmt.Errorf("%s: clips: event clips (the app's clips: section) are not in the lean build (no H.264 encoder); the full build records clips: bin/mdag (make build)", app.File)
}

// newClipEncoder: the lean build links no libavcodec, so no clips.
func newClipEncoder(w, h, fps, kbps int) (clips.Encoder, error) {
	return nil, fmt.Errorf("clips need an H.264 encoder (libx264): %s", fullBuild)
}
