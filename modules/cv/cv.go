// Package cv holds the CPU ops and frame helpers that need OpenCV (gocv):
// the resize, haar-face, hog-people, motion (stateful: one background model
// per stream), annotate and letterbox ops (Register adds them to a
// modules.Registry),
// Resize and ResizeArea (the full binary's media.Scaler), ToMat/FromMat,
// Thumbnail (the dashboard's JPEG encoder) and Motion, the
// background-subtraction detector of the live sources. It is an edge
// package: the full binary (cmd/mdag without the lean tag) and gpu/opencv
// import it; the pure packages are handed what they need.
package cv

import (
	"fmt"
	"image"
	"os"
	"slices"
	"sync"

	"gocv.io/x/gocv"

	"github.com/mdag/mdag/media"
	"github.com/mdag/mdag/modules"
)

// DefaultCascade is Debian's frontal-face Haar cascade (package opencv-data).
const DefaultCascade = "/usr/share/opencv4/haarcascades/haarcascade_frontalface_default.xml"

// Register adds the OpenCV ops to r: resize, haar-face, hog-people,
// motion, annotate and letterbox.
func Register(r *modules.Registry) error {
	for _, op := range []struct {
		name modules.OpID
		f    modules.Factory
	}{
		{"resize", func(p modules.Params) (modules.Processor, error) {
			return resize{w: p.Int("width"), h: p.Int("height")}, nil
		}},
		{"haar-face", newHaar},
		{"hog-people", newHOG},
		{"motion", newMotionOp},
		{"annotate", newAnnotate},
		{"letterbox", newLetterbox},
	} {
		if err := r.Register(op.name, op.f); err != nil {
			return err
		}
	}
	return nil
}

// resize scales the frame (and its boxes) to width x height.
type resize struct{ w, h int }

func (r resize) Process(it *media.Item) ([]*media.Item, error) {
	f, err := Resize(it.Frame, r.w, r.h, gocv.InterpolationLinear)
	if err != nil {
		return nil, fmt.Errorf("resize: %w", err)
	}
	o := *it
	o.Frame = f
	sx, sy := float64(r.w)/float64(it.Frame.W), float64(r.h)/float64(it.Frame.H)
	o.Boxes = media.ScaleBoxes(it.Boxes, sx, sy)
	o.Truth = media.ScaleBoxes(it.Truth, sx, sy)
	return []*media.Item{&o}, nil
}

// haar runs an OpenCV Haar cascade. CascadeClassifier is not safe for
// concurrent use, so calls are serialised; the runtime sizes the pool.
type haar struct {
	mu           sync.Mutex
	cc           gocv.CascadeClassifier
	scale        float64
	minNeighbors int
}

func newHaar(p modules.Params) (modules.Processor, error) {
	path := DefaultCascade
	if v := p.String("cascade"); v != "" {
		path = v
	}
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("haar-face: cascade %s: %w (Debian package opencv-data; `make deps` installs it)", path, err)
	}
	cc := gocv.NewCascadeClassifier()
	if !cc.Load(path) {
		cc.Close()
		return nil, fmt.Errorf("haar-face: OpenCV could not load cascade %s", path)
	}
	return &haar{cc: cc, scale: p.Float("scale_factor"), minNeighbors: p.Int("min_neighbors")}, nil
}

func (h *haar) Process(it *media.Item) ([]*media.Item, error) {
	m, err := ToMat(it.Frame)
	if err != nil {
		return nil, fmt.Errorf("haar-face: %w", err)
	}
	defer m.Close()
	gray := gocv.NewMat()
	defer gray.Close()
	gocv.CvtColor(m, &gray, gocv.ColorBGRToGray)
	h.mu.Lock()
	rects := h.cc.DetectMultiScaleWithParams(gray, h.scale, h.minNeighbors, 0, image.Pt(24, 24), image.Pt(0, 0))
	h.mu.Unlock()
	o := *it
	o.Boxes = nil
	for _, r := range rects {
		o.Boxes = append(o.Boxes, media.Box{X: r.Min.X, Y: r.Min.Y, W: r.Dx(), H: r.Dy(), Class: "face", Score: 1})
	}
	return []*media.Item{&o}, nil
}

func (h *haar) Close() { h.cc.Close() }

func (resize) Close() {}

// Resize returns a copy of f scaled to w x h with the given interpolation.
func Resize(f *media.Frame, w, h int, interp gocv.InterpolationFlags) (*media.Frame, error) {
	m, err := ToMat(f)
	if err != nil {
		return nil, err
	}
	defer m.Close()
	dst := gocv.NewMat()
	defer dst.Close()
	gocv.Resize(m, &dst, image.Pt(w, h), 0, 0, interp)
	return FromMat(dst), nil
}

// ResizeArea is Resize with area interpolation: a media.Scaler.
func ResizeArea(f *media.Frame, w, h int) (*media.Frame, error) {
	return Resize(f, w, h, gocv.InterpolationArea)
}

// ToMat copies a frame into a new OpenCV matrix (the caller closes it).
func ToMat(f *media.Frame) (gocv.Mat, error) {
	if err := f.Valid(); err != nil {
		return gocv.Mat{}, err
	}
	return gocv.NewMatFromBytes(f.H, f.W, gocv.MatTypeCV8UC3, slices.Clone(f.Pix))
}

// FromMat copies an 8-bit 3-channel matrix into a frame.
func FromMat(m gocv.Mat) *media.Frame {
	return &media.Frame{W: m.Cols(), H: m.Rows(), Pix: m.ToBytes()}
}

// Thumbnail scales f to width pixels (the aspect kept) with area
// interpolation and encodes it as a JPEG of quality 70: the dashboard's
// thumbnail encoder in the full binary.
func Thumbnail(f *media.Frame, width int) ([]byte, error) {
	small, err := ResizeArea(f, width, max(1, f.H*width/max(1, f.W)))
	if err != nil {
		return nil, err
	}
	mat, err := ToMat(small)
	if err != nil {
		return nil, err
	}
	defer mat.Close()
	buf, err := gocv.IMEncodeWithParams(gocv.JPEGFileExt, mat, []int{gocv.IMWriteJpegQuality, 70})
	if err != nil {
		return nil, err
	}
	defer buf.Close()
	return append([]byte(nil), buf.GetBytes()...), nil
}
