//go:build !lean

package main

import (
	"github.com/mdag/mdag/clips"
	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/ingest/avc"
	"github.com/mdag/mdag/media"
)

// clipsBuilt: the full build records clips.
func clipsBuilt(*dag.App) error { return nil }

// clipEncoder is ingest/avc's H.264 encoder (libx264) as clips wants it.
type clipEncoder struct {
	e   *avc.Encoder
	pts int64
}

// newClipEncoder makes the clips' encoder; key frames come when clips
// asks for them (one a second), libx264's own at most every 10 s.
func newClipEncoder(w, h, fps, kbps int) (clips.Encoder, error) {
	e, err := avc.NewEncoder(avc.EncoderConfig{Width: w, Height: h, FPS: fps, BitrateKbps: kbps, KeyEvery: 10 * fps})
	if err != nil {
		return nil, err
	}
	return &clipEncoder{e: e}, nil
}

func (c *clipEncoder) Encode(f *media.Frame, key bool) ([]byte, bool, error) {
	out, err := c.e.Encode(f, c.pts, key)
	c.pts++
	if err != nil || len(out) == 0 {
		return nil, false, err
	}
	var au []byte
	k := false
	for _, o := range out {
		au = append(au, o.Data...)
		k = k || o.Key
	}
	return au, k, nil
}

func (c *clipEncoder) Close() { c.e.Close() }
