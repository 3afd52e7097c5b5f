//go:build lean

package main

import (
	"fmt"
	"io"
)

// The lean build has no OpenCV: mdag trace reads videos and runs the
// OpenCV detectors (trace.go), so here it refuses, saying where it is.
func runTrace(_ []string, _, stderr io.Writer) int {
	fmt.Fprintf(stderr, "mdag trace: reading videos and running detectors needs OpenCV, which the lean build has not; %s\n", fullBuild)
	return exitInvalid
}
