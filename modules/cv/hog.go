package cv

// #cgo !windows pkg-config: opencv4
// #cgo CXXFLAGS: --std=c++11
// #include <stdlib.h>
// #include "hog.h"
import "C"

import (
	"errors"
	"fmt"
	"image"
	"math"
	"sync"
	"unsafe"

	"github.com/mdag/mdag/media"
	"github.com/mdag/mdag/modules"
)

// hogPeople runs OpenCV's HOG descriptor with its built-in people detector
// (Dalal and Triggs' linear SVM over a 64x128 window) on each frame and
// reports the people as boxes of class "person". It calls OpenCV through
// hog.cpp rather than gocv's HOGDescriptor: gocv v0.31's
// HOGDefaultPeopleDetector hands OpenCV freed memory as the detector's
// coefficients (every frame, a blank one too, then yields the same bogus
// box) and gocv returns no detection weights.
//
// A descriptor is not safe for concurrent use, so the op keeps a free list:
// a call takes one (making one when all are busy, so the list grows to the
// runtime's pool size) and gives it back.
type hogPeople struct {
	scale, hit float64
	width      int     // downscale frames wider than this; 0: never
	minScore   float32 // drop people scoring less

	mu     sync.Mutex
	free   []C.MdagHOG
	closed bool
}

// hogFinalThreshold is OpenCV's default grouping threshold: a detection
// needs more than this many overlapping windows to be kept.
const hogFinalThreshold = 2

func newHOG(p modules.Params) (modules.Processor, error) {
	h := &hogPeople{scale: p.Float("scale"), hit: p.Float("hit_threshold"), width: p.Int("width"), minScore: float32(p.Float("min_score"))}
	// Build one descriptor now so a broken OpenCV fails at load, not on
	// the first frame.
	d, err := h.get()
	if err != nil {
		return nil, err
	}
	h.put(d)
	return h, nil
}

// get takes a free descriptor or makes one.
func (h *hogPeople) get() (C.MdagHOG, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, errors.New("hog-people: processor closed")
	}
	if n := len(h.free); n > 0 {
		d := h.free[n-1]
		h.free = h.free[:n-1]
		return d, nil
	}
	var cerr *C.char
	d := C.mdag_hog_new(&cerr)
	if d == nil {
		return nil, fmt.Errorf("hog-people: OpenCV people detector: %s", takeError(cerr))
	}
	return d, nil
}

// put gives a descriptor back (freeing it when the op was closed meanwhile).
func (h *hogPeople) put(d C.MdagHOG) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		C.mdag_hog_free(d)
		return
	}
	h.free = append(h.free, d)
}

func (h *hogPeople) Process(it *media.Item) ([]*media.Item, error) {
	boxes, err := h.detect(it.Frame)
	if err != nil {
		return nil, err
	}
	o := *it
	o.Boxes = boxes
	return []*media.Item{&o}, nil
}

// detect returns the people in f, in f's coordinates, each scoring the
// logistic of its SVM margin (0.5 at the decision boundary).
func (h *hogPeople) detect(f *media.Frame) ([]media.Box, error) {
	if err := f.Valid(); err != nil {
		return nil, fmt.Errorf("hog-people: %w", err)
	}
	d, err := h.get()
	if err != nil {
		return nil, err
	}
	var (
		dh      C.int
		rects   *C.int
		weights *C.double
		cerr    *C.char
	)
	n := int(C.mdag_hog_detect(d, (*C.uchar)(unsafe.Pointer(&f.Pix[0])), C.int(f.W), C.int(f.H), C.int(h.width),
		C.double(h.hit), C.double(h.scale), hogFinalThreshold, &dh, &rects, &weights, &cerr))
	h.put(d)
	defer C.free(unsafe.Pointer(rects))
	defer C.free(unsafe.Pointer(weights))
	if n < 0 {
		return nil, fmt.Errorf("hog-people: OpenCV on a %dx%d frame: %s", f.W, f.H, takeError(cerr))
	}
	if n == 0 {
		return nil, nil
	}
	rs := unsafe.Slice((*int32)(unsafe.Pointer(rects)), 4*n)
	ws := unsafe.Slice((*float64)(unsafe.Pointer(weights)), n)
	sx, sy := 1.0, 1.0
	if h.width > 0 && h.width < f.W {
		sx, sy = float64(f.W)/float64(h.width), float64(f.H)/float64(dh)
	}
	bounds := image.Rect(0, 0, f.W, f.H)
	out := make([]media.Box, 0, n)
	for i := range n {
		x, y, w, ht := float64(rs[4*i]), float64(rs[4*i+1]), float64(rs[4*i+2]), float64(rs[4*i+3])
		r := image.Rect(int(math.Round(x*sx)), int(math.Round(y*sy)), int(math.Round((x+w)*sx)), int(math.Round((y+ht)*sy))).Intersect(bounds)
		score := float32(1 / (1 + math.Exp(-ws[i])))
		if r.Empty() || score < h.minScore {
			continue
		}
		out = append(out, media.Box{X: r.Min.X, Y: r.Min.Y, W: r.Dx(), H: r.Dy(), Class: "person", Score: score})
	}
	return out, nil
}

// takeError returns and frees a C error message.
func takeError(s *C.char) string {
	if s == nil {
		return "unknown error"
	}
	defer C.free(unsafe.Pointer(s))
	return C.GoString(s)
}

// Close releases the descriptors; one in use is released when given back.
func (h *hogPeople) Close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return
	}
	h.closed = true
	for _, d := range h.free {
		C.mdag_hog_free(d)
	}
	h.free = nil
}
