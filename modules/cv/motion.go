package cv

import (
	"image"
	"slices"

	"github.com/mdag/mdag/media"
	"gocv.io/x/gocv"
)

// Motion estimates the objects in a live stream's frames by background
// subtraction (OpenCV MOG2 on a small grey copy), for the emulated GPU
// detectors: they report an item's ground truth, which a synthetic source
// draws but real video lacks. With Motion the moving regions of a real
// camera become those objects, so the modules after a detector see real
// fan-out (people walking in and out change the scaling factors) instead of
// nothing. It is an emulation aid, not a detector: a region taller than it
// is wide is labelled "person", any other "car"; real detectors (the OpenCV
// executor) ignore it and look at the pixels.
//
// One Motion follows one stream (it learns that camera's background); it
// is not safe for concurrent use. Close releases its OpenCV memory.
type Motion struct {
	mog          gocv.BackgroundSubtractorMOG2
	small, mask  gocv.Mat
	kernel       gocv.Mat
	w, h, sw, sh int // frame size the model learnt, and its small copy's
	seen         int
	warmup       int     // frames learnt before reporting
	minArea      float64 // smallest region, a fraction of the frame
}

// motionWidth is the width the background model runs at; motionWarmup the
// frames it learns before reporting; motionMinArea the smallest region
// reported, as a fraction of the frame; motionMax the most regions.
const (
	motionWidth   = 192
	motionWarmup  = 5
	motionMinArea = 0.002
	motionMax     = 16
)

// NewMotion returns a motion estimator for one stream.
func NewMotion() *Motion { return newMotion(motionWarmup, motionMinArea) }

// newMotion is NewMotion learning warmup frames before reporting and
// reporting regions of at least minArea of the frame (the motion op's
// params).
func newMotion(warmup int, minArea float64) *Motion {
	return &Motion{mog: gocv.NewBackgroundSubtractorMOG2WithParams(300, 32, false), small: gocv.NewMat(), mask: gocv.NewMat(),
		kernel: gocv.GetStructuringElement(gocv.MorphEllipse, image.Pt(3, 3)), warmup: warmup, minArea: minArea}
}

// Warm reports whether the model has learnt its warm-up frames at the
// current frame size: from then on no regions means no motion.
func (m *Motion) Warm() bool { return m.seen > m.warmup }

// Close releases the estimator.
func (m *Motion) Close() {
	_ = m.mog.Close()
	m.small.Close()
	m.mask.Close()
	m.kernel.Close()
}

// Boxes returns the moving regions of f in f's coordinates, largest first
// (none while the background is being learnt, or for an invalid frame). A
// change of frame size starts learning again.
func (m *Motion) Boxes(f *media.Frame) []media.Box {
	if f.Valid() != nil {
		return nil
	}
	if f.W != m.w || f.H != m.h {
		_ = m.mog.Close()
		m.mog = gocv.NewBackgroundSubtractorMOG2WithParams(300, 32, false)
		m.w, m.h, m.seen = f.W, f.H, 0
		m.sw = min(motionWidth, f.W)
		m.sh = max(1, f.H*m.sw/f.W)
	}
	mat, err := ToMat(f)
	if err != nil {
		return nil
	}
	defer mat.Close()
	gocv.Resize(mat, &m.small, image.Pt(m.sw, m.sh), 0, 0, gocv.InterpolationArea)
	m.mog.Apply(m.small, &m.mask)
	if m.seen++; m.seen <= m.warmup {
		return nil
	}
	gocv.MorphologyEx(m.mask, &m.mask, gocv.MorphOpen, m.kernel)
	gocv.Dilate(m.mask, &m.mask, m.kernel) // join a walker's parts into one region
	gocv.Dilate(m.mask, &m.mask, m.kernel)
	cs := gocv.FindContours(m.mask, gocv.RetrievalExternal, gocv.ChainApproxSimple)
	defer cs.Close()
	minArea := m.minArea * float64(m.sw*m.sh)
	sx, sy := float64(f.W)/float64(m.sw), float64(f.H)/float64(m.sh)
	var out []media.Box
	for i := range cs.Size() {
		r := gocv.BoundingRect(cs.At(i))
		if float64(r.Dx()*r.Dy()) < minArea {
			continue
		}
		b := media.Box{X: int(float64(r.Min.X) * sx), Y: int(float64(r.Min.Y) * sy), W: int(float64(r.Dx()) * sx), H: int(float64(r.Dy()) * sy),
			Class: "car", Score: 1}
		if b.H >= b.W {
			b.Class = "person"
		}
		out = append(out, b)
	}
	slices.SortFunc(out, func(a, b media.Box) int { return b.W*b.H - a.W*a.H })
	if len(out) > motionMax {
		out = out[:motionMax]
	}
	return out
}
