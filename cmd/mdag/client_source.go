//go:build !lean

package main

import (
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"gocv.io/x/gocv"

	"github.com/mdag/mdag/ingest/synth"
	"github.com/mdag/mdag/media"
	"github.com/mdag/mdag/modules/cv"
)

// The video sources of mdag client and mdag demo's clients (--source):
// the synthetic pattern, a video file or a camera, read with OpenCV.

// frameSource gives frames; Next(stream, seq) returns io.EOF at the end.
type frameSource interface {
	Next(stream int, seq uint64) (*media.Frame, error)
	Close()
}

// sourceOpener parses --source: each client opens its own source.
func sourceOpener(spec, size string, objects int, loop bool) (func() (frameSource, error), error) {
	switch {
	case spec == "pattern" || spec == "people":
		scene := "shapes"
		if spec == "people" {
			scene = "people"
		}
		pat, err := newPattern(size, objects, scene)
		if err != nil {
			return nil, err
		}
		return func() (frameSource, error) { return patternSource{pat}, nil }, nil
	case strings.HasPrefix(spec, "camera:"):
		n, err := strconv.Atoi(strings.TrimPrefix(spec, "camera:"))
		if err != nil || n < 0 {
			return nil, fmt.Errorf("%q: want camera:N with N >= 0", spec)
		}
		return func() (frameSource, error) {
			vc, err := gocv.OpenVideoCapture(n)
			if err != nil || !vc.IsOpened() {
				return nil, fmt.Errorf("camera %d cannot be opened", n)
			}
			return &captureSource{vc: vc, name: spec}, nil
		}, nil
	default:
		if _, err := os.Stat(spec); err != nil {
			return nil, fmt.Errorf("%q is not pattern, camera:N or a readable video file: %v", spec, err)
		}
		return func() (frameSource, error) {
			vc, err := gocv.VideoCaptureFile(spec)
			if err != nil || !vc.IsOpened() {
				return nil, fmt.Errorf("%s: OpenCV cannot read it as video", spec)
			}
			return &captureSource{vc: vc, name: spec, file: spec, loop: loop}, nil
		}, nil
	}
}

type patternSource struct{ p *synth.Pattern }

func (s patternSource) Next(stream int, seq uint64) (*media.Frame, error) {
	f, _, err := s.p.Frame(stream, seq)
	return f, err
}
func (patternSource) Close() {}

type captureSource struct {
	vc   *gocv.VideoCapture
	name string
	file string
	loop bool
	mat  gocv.Mat
}

func (s *captureSource) Next(int, uint64) (*media.Frame, error) {
	if s.mat.Ptr() == nil {
		s.mat = gocv.NewMat()
	}
	if !s.vc.Read(&s.mat) || s.mat.Empty() {
		if s.file == "" || !s.loop {
			return nil, io.EOF
		}
		s.vc.Close()
		vc, err := gocv.VideoCaptureFile(s.file)
		if err != nil {
			return nil, err
		}
		s.vc = vc
		if !s.vc.Read(&s.mat) || s.mat.Empty() {
			return nil, fmt.Errorf("%s: no frames", s.name)
		}
	}
	if s.mat.Type() != gocv.MatTypeCV8UC3 {
		return nil, fmt.Errorf("%s: frames of type %v, want 8-bit BGR", s.name, s.mat.Type())
	}
	f := cv.FromMat(s.mat)
	return f, f.Valid()
}

func (s *captureSource) Close() {
	if s.mat.Ptr() != nil {
		s.mat.Close()
	}
	s.vc.Close()
}
