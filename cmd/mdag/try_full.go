//go:build !lean

package main

import (
	"fmt"

	"gocv.io/x/gocv"

	"github.com/mdag/mdag/media"
	"github.com/mdag/mdag/modules/cv"
)

// readVideo reads a video's first max frames with OpenCV (mdag try).
func readVideo(path string, max int) ([]*media.Frame, error) {
	if err := probeVideo(path); err != nil {
		return nil, fmt.Errorf("%v (not an image either: PNG, JPEG or GIF)", err)
	}
	vc, err := gocv.VideoCaptureFile(path)
	if err != nil || !vc.IsOpened() {
		if vc != nil {
			vc.Close()
		}
		return nil, fmt.Errorf("%s: OpenCV cannot open it as video (%v)", path, errOrNone(err))
	}
	defer vc.Close()
	mat := gocv.NewMat()
	defer mat.Close()
	var out []*media.Frame
	for len(out) < max && vc.Read(&mat) && !mat.Empty() {
		if mat.Type() != gocv.MatTypeCV8UC3 {
			return nil, fmt.Errorf("%s: frame %d is of type %v, want 8-bit BGR", path, len(out), mat.Type())
		}
		out = append(out, cv.FromMat(mat))
	}
	return out, nil
}
