//go:build lean

package main

import (
	"fmt"

	"github.com/mdag/mdag/media"
)

// readVideo refuses: the lean build reads no video (mdag try takes images
// here: PNG, JPEG, GIF).
func readVideo(path string, _ int) ([]*media.Frame, error) {
	return nil, fmt.Errorf("%s is not an image (PNG, JPEG or GIF); reading videos needs OpenCV, which the lean build has not: give try a picture, or use the full build: bin/mdag (make build)", path)
}
