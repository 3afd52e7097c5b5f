//go:build !lean

package main

import (
	"github.com/mdag/mdag/clips"
	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/ingest/avc"
)

// clipsBuilt: the full build records clips.
func clipsBuilt(*dag.App) error { return nil }

// newClipEncoder makes the clips' encoder, ingest/avc's H.264 (libx264); key frames come when clips
// asks for them (one a second), libx264's own at most every 10 s.
func newClipEncoder(w, h, fps, kbps int) (clips.Encoder, error) {
	e, err := avc.NewEncoder(avc.EncoderConfig{Width: w, Height: h, FPS: fps, BitrateKbps: kbps, KeyEvery: 10 * fps})
	if err != nil {
		return nil, err
	}
	return &avc.AccessUnits{E: e}, nil
}
