package modules

import (
	"fmt"
	"image"
	"time"
)

// Frame is an 8-bit BGR image kept in Go memory, so items can be shared
// between goroutines, copied and sent over the wire without OpenCV lifetimes.
type Frame struct {
	W, H int
	Pix  []byte // len W*H*3, row-major BGR
}

// NewFrame allocates a black frame.
func NewFrame(w, h int) *Frame { return &Frame{W: w, H: h, Pix: make([]byte, w*h*3)} }

// Valid reports whether the pixel buffer matches the size.
func (f *Frame) Valid() error {
	if f == nil {
		return fmt.Errorf("no frame")
	}
	if f.W <= 0 || f.H <= 0 || len(f.Pix) != f.W*f.H*3 {
		return fmt.Errorf("frame %dx%d has %d bytes, want %d", f.W, f.H, len(f.Pix), max(0, f.W*f.H*3))
	}
	return nil
}

// Box is a detection or ground-truth object in frame coordinates.
type Box struct {
	X, Y, W, H int
	Class      string
	Score      float32
}

// Rect is the box as an image rectangle.
func (b Box) Rect() image.Rectangle { return image.Rect(b.X, b.Y, b.X+b.W, b.Y+b.H) }

// Item is what flows between modules: a frame, or something derived from
// one (a crop, detections, labels), with the identity and timing of the
// frame it came from.
type Item struct {
	Stream   string
	Seq      uint64    // frame sequence number within the stream
	Capture  time.Time // when the source captured the frame
	Deadline time.Time // capture + the app's SLO
	Frame    *Frame    // the frame or the crop
	Region   *Box      // for crops: the box the crop was cut from
	Boxes    []Box     // detections
	Truth    []Box     // objects a synthetic source drew (emulated detectors report them)
	Labels   []string
	Counts   map[string]int
}

// Derive returns a new item of the same frame, carrying identity, timing
// and ground truth but no payload.
func (it *Item) Derive() *Item {
	return &Item{Stream: it.Stream, Seq: it.Seq, Capture: it.Capture, Deadline: it.Deadline, Truth: it.Truth}
}
