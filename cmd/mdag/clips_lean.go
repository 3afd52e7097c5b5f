//go:build lean

package main

import (
	"fmt"

	"github.com/mdag/mdag/clips"
)

// newClipEncoder: the lean build links no libavcodec, so no clips.
func newClipEncoder(w, h, fps, kbps int) (clips.Encoder, error) {
	return nil, fmt.Errorf("clips need an H.264 encoder (libx264): %s", fullBuild)
}
