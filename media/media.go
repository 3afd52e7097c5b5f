// Package media holds what flows through an application: a Frame (BGR
// pixels in Go memory), a Box (a detection or a ground-truth object) and an
// Item (a frame or something derived from one, with its stream, sequence
// number, capture time and deadline). It is the floor of the building: pure
// Go, it imports nothing of mdag's, so planners, the worker, the wire codec
// and ingest can share items without OpenCV.
package media

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
	// Ref, on the direct data plane (issue 25), names the worker that
	// holds the pixels; Pix is then nil. The coordinator routes such a
	// frame by reference; the worker that runs the next module fetches
	// the pixels before its op sees the item.
	Ref *FrameRef
}

// FrameRef names a frame a worker holds: its instance ID, the address of
// its peer service and the frame's key there.
type FrameRef struct {
	Holder string
	Addr   string
	ID     uint64
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
	// Keypoints are a pose model's points of this object (the keypoints
	// decoder), nil for a plain detection. A pointer, so Box stays
	// comparable (== compares the points' identity) and prints as before;
	// read-only once set, like the rest of an item. The gRPC wire
	// (remote/wire, api.Box) carries them, at most wire.MaxKeypoints a box.
	Keypoints *Keypoints `json:",omitempty"`
}

// Keypoints are the points of one object, in the model's order (for
// COCO pose models: nose, eyes, ears, shoulders, elbows, wrists, hips,
// knees, ankles).
type Keypoints struct {
	Points []Keypoint
}

// Keypoint is one point in frame coordinates (pixels, fractional) and the
// model's confidence that it is visible (0..1).
type Keypoint struct {
	X, Y, Score float32
}

// String prints the box as {X Y W H Class Score}, as fmt printed it before
// Keypoints existed, with the number of points appended when it has some.
func (b Box) String() string {
	s := fmt.Sprintf("{%d %d %d %d %s %v}", b.X, b.Y, b.W, b.H, b.Class, b.Score)
	if b.Keypoints != nil {
		s = s[:len(s)-1] + fmt.Sprintf(" %d keypoints}", len(b.Keypoints.Points))
	}
	return s
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
	Tracks   []Track // a tracker's tracks in this frame
	Steps    []Step  // earlier items a window or sequence carries
	Events   []Event // what activity rules saw
	Audio    *Audio  // audio apps: the PCM chunk (Frame is nil)
}

// Derive returns a new item of the same frame, carrying identity, timing
// and ground truth but no payload.
func (it *Item) Derive() *Item {
	return &Item{Stream: it.Stream, Seq: it.Seq, Capture: it.Capture, Deadline: it.Deadline, Truth: it.Truth}
}

// Crop copies the part of f inside r (which must lie within f).
func (f *Frame) Crop(r image.Rectangle) *Frame {
	o := NewFrame(r.Dx(), r.Dy())
	for y := 0; y < r.Dy(); y++ {
		src := ((r.Min.Y+y)*f.W + r.Min.X) * 3
		copy(o.Pix[y*o.W*3:(y+1)*o.W*3], f.Pix[src:src+o.W*3])
	}
	return o
}

// ScaleBoxes returns in with coordinates multiplied by sx, sy (nil stays nil).
func ScaleBoxes(in []Box, sx, sy float64) []Box {
	if in == nil {
		return nil
	}
	out := make([]Box, len(in))
	for i, b := range in {
		out[i] = Box{X: int(float64(b.X) * sx), Y: int(float64(b.Y) * sy), W: int(float64(b.W) * sx), H: int(float64(b.H) * sy), Class: b.Class, Score: b.Score}
	}
	return out
}

// Scaler returns a copy of f scaled to w x h. ScaleArea is the pure-Go
// one; the full binary injects OpenCV's (modules/cv.ResizeArea), faster.
type Scaler func(f *Frame, w, h int) (*Frame, error)

// ScaleArea scales f to w x h by averaging the source pixels each output
// pixel covers (nearest pixel when enlarging).
func ScaleArea(f *Frame, w, h int) (*Frame, error) {
	if err := f.Valid(); err != nil {
		return nil, err
	}
	if w <= 0 || h <= 0 {
		return nil, fmt.Errorf("scale to %dx%d: want a positive size", w, h)
	}
	o := NewFrame(w, h)
	for y := range h {
		y0 := y * f.H / h
		y1 := max(y0+1, (y+1)*f.H/h)
		for x := range w {
			x0 := x * f.W / w
			x1 := max(x0+1, (x+1)*f.W/w)
			var b, g, r, n int
			for yy := y0; yy < y1; yy++ {
				row := (yy*f.W + x0) * 3
				for i := row; i < row+(x1-x0)*3; i += 3 {
					b, g, r, n = b+int(f.Pix[i]), g+int(f.Pix[i+1]), r+int(f.Pix[i+2]), n+1
				}
			}
			i := (y*w + x) * 3
			o.Pix[i], o.Pix[i+1], o.Pix[i+2] = uint8(b/n), uint8(g/n), uint8(r/n)
		}
	}
	return o, nil
}

// Track is one object a tracker follows across a stream's frames: a stable
// ID (unique within the stream for the tracker's lifetime, never reused),
// its box in this frame (predicted when Missed > 0), how many frames it has
// lived and been matched, and how many frames in a row it went unmatched.
type Track struct {
	ID     uint64
	Box    Box
	Age    int // frames since the track started
	Hits   int // frames it was matched to a detection
	Missed int // frames in a row without a match (0: matched in this frame)
}

// Step is an earlier item of a stream that a stateful op carries forward
// (window: the last N items; sequence: the context): its frame number and
// results, never pixels.
type Step struct {
	Seq    uint64
	Boxes  []Box
	Labels []string
	Tracks []Track
}

// Event is something an activity rule saw: Kind ("line-cross", "dwell",
// "loiter"), the Rule (its name as configured) and the Track it concerns,
// with a human-readable Detail.
type Event struct {
	Kind   string
	Rule   string
	Track  uint64
	Detail string
}

// Audio is a chunk of 16-bit PCM, interleaved by channel.
type Audio struct {
	Rate     int     // samples per second per channel
	Channels int     // 1 (mono) or 2 (stereo)
	PCM      []int16 // len = samples per channel * Channels
}

// Valid reports whether the chunk's shape is consistent.
func (a *Audio) Valid() error {
	switch {
	case a == nil:
		return fmt.Errorf("no audio")
	case a.Rate <= 0 || a.Rate > 384000:
		return fmt.Errorf("audio sample rate %d: want 1..384000", a.Rate)
	case a.Channels < 1 || a.Channels > 2:
		return fmt.Errorf("audio with %d channels: want 1 or 2", a.Channels)
	case len(a.PCM)%a.Channels != 0:
		return fmt.Errorf("audio: %d samples do not divide into %d channels", len(a.PCM), a.Channels)
	}
	return nil
}

// Duration is the chunk's length in time.
func (a *Audio) Duration() time.Duration {
	if a == nil || a.Rate <= 0 || a.Channels <= 0 {
		return 0
	}
	return time.Duration(len(a.PCM)/a.Channels) * time.Second / time.Duration(a.Rate)
}
