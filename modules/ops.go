package modules

import (
	"errors"
	"fmt"
	"image"
	"image/color"
	"os"
	"slices"
	"strings"
	"sync"

	"gocv.io/x/gocv"
)

// Processor runs one CPU op on items. A Processor may be called from
// several goroutines at once (the runtime's pool for the module); stateless
// ops need no locking, ops holding OpenCV objects lock them.
type Processor interface {
	// Process turns one input item into zero or more outputs (crop fans
	// out one item per detection).
	Process(it *Item) ([]*Item, error)
	// Close releases what the processor holds.
	Close()
}

// Implemented lists the ops New can build, sorted.
func Implemented() []string { return []string{"count", "crop", "haar-face", "resize", "sink"} }

// ErrNotImplemented is returned by New for ops the registry knows but the
// runtime cannot run yet.
var ErrNotImplemented = errors.New("op has no implementation yet")

// DefaultCascade is Debian's frontal-face Haar cascade (package opencv-data).
const DefaultCascade = "/usr/share/opencv4/haarcascades/haarcascade_frontalface_default.xml"

// New builds the processor for op with its params (already validated by
// dag.Validate against the registry's keys).
func New(op OpID, params map[string]any) (Processor, error) {
	switch op {
	case "resize":
		w, err := intParam(params, "width", 0)
		if err != nil {
			return nil, err
		}
		h, err := intParam(params, "height", 0)
		if err != nil {
			return nil, err
		}
		if w <= 0 || h <= 0 {
			return nil, fmt.Errorf("resize: params.width and params.height must be > 0 (got %d x %d)", w, h)
		}
		return resize{w: w, h: h}, nil
	case "crop":
		pad, err := intParam(params, "pad", 0)
		if err != nil {
			return nil, err
		}
		classes, err := stringsParam(params, "classes")
		if err != nil {
			return nil, err
		}
		minScore, err := floatParam(params, "min_score", 0)
		if err != nil {
			return nil, err
		}
		return crop{pad: pad, classes: classes, minScore: float32(minScore)}, nil
	case "count":
		classes, err := stringsParam(params, "classes")
		if err != nil {
			return nil, err
		}
		return count{classes: classes}, nil
	case "haar-face":
		return newHaar(params)
	case "sink":
		return passThrough{}, nil
	}
	if _, ok := Lookup(op); ok {
		return nil, fmt.Errorf("op %s: %w (implemented: %s)", op, ErrNotImplemented, strings.Join(Implemented(), ", "))
	}
	return nil, fmt.Errorf("unknown op %q (known: %v)", op, Names())
}

func intParam(p map[string]any, key string, def int) (int, error) {
	v, ok := p[key]
	if !ok {
		return def, nil
	}
	switch x := v.(type) {
	case int:
		return x, nil
	case float64:
		if x == float64(int(x)) {
			return int(x), nil
		}
	}
	return 0, fmt.Errorf("params.%s: want an integer, got %v", key, v)
}

func floatParam(p map[string]any, key string, def float64) (float64, error) {
	v, ok := p[key]
	if !ok {
		return def, nil
	}
	switch x := v.(type) {
	case int:
		return float64(x), nil
	case float64:
		return x, nil
	}
	return 0, fmt.Errorf("params.%s: want a number, got %v", key, v)
}

func stringsParam(p map[string]any, key string) ([]string, error) {
	v, ok := p[key]
	if !ok {
		return nil, nil
	}
	switch x := v.(type) {
	case []string:
		return x, nil
	case []any:
		out := make([]string, len(x))
		for i, e := range x {
			s, ok := e.(string)
			if !ok {
				return nil, fmt.Errorf("params.%s[%d]: want a string, got %v", key, i, e)
			}
			out[i] = s
		}
		return out, nil
	}
	return nil, fmt.Errorf("params.%s: want a list of strings, got %v", key, v)
}

type passThrough struct{}

func (passThrough) Process(it *Item) ([]*Item, error) { return []*Item{it}, nil }
func (passThrough) Close()                            {}

// crop cuts one item per matching detection out of the frame.
type crop struct {
	pad      int
	classes  []string
	minScore float32
}

func (c crop) Process(it *Item) ([]*Item, error) {
	if err := it.Frame.Valid(); err != nil {
		return nil, fmt.Errorf("crop: %w", err)
	}
	var out []*Item
	for _, b := range it.Boxes {
		if len(c.classes) > 0 && !slices.Contains(c.classes, b.Class) {
			continue
		}
		if b.Score < c.minScore {
			continue
		}
		r := image.Rect(b.X-c.pad, b.Y-c.pad, b.X+b.W+c.pad, b.Y+b.H+c.pad).Intersect(image.Rect(0, 0, it.Frame.W, it.Frame.H))
		if r.Empty() {
			continue
		}
		o := it.Derive()
		box := b
		o.Region = &box
		o.Frame = cropFrame(it.Frame, r)
		out = append(out, o)
	}
	return out, nil
}

func cropFrame(f *Frame, r image.Rectangle) *Frame {
	o := NewFrame(r.Dx(), r.Dy())
	for y := 0; y < r.Dy(); y++ {
		src := ((r.Min.Y+y)*f.W + r.Min.X) * 3
		copy(o.Pix[y*o.W*3:(y+1)*o.W*3], f.Pix[src:src+o.W*3])
	}
	return o
}

// count tallies labels (or, without labels, detections) by class.
type count struct{ classes []string }

func (c count) Process(it *Item) ([]*Item, error) {
	o := it.Derive()
	o.Region, o.Labels, o.Counts = it.Region, it.Labels, map[string]int{}
	add := func(cl string) {
		if len(c.classes) == 0 || slices.Contains(c.classes, cl) {
			o.Counts[cl]++
		}
	}
	for _, l := range it.Labels {
		add(l)
	}
	if len(it.Labels) == 0 {
		for _, b := range it.Boxes {
			add(b.Class)
		}
	}
	return []*Item{o}, nil
}

// resize scales the frame (and its boxes) to width x height.
type resize struct{ w, h int }

func (r resize) Process(it *Item) ([]*Item, error) {
	f, err := Resize(it.Frame, r.w, r.h, gocv.InterpolationLinear)
	if err != nil {
		return nil, fmt.Errorf("resize: %w", err)
	}
	o := *it
	o.Frame = f
	sx, sy := float64(r.w)/float64(it.Frame.W), float64(r.h)/float64(it.Frame.H)
	o.Boxes = scaleBoxes(it.Boxes, sx, sy)
	o.Truth = scaleBoxes(it.Truth, sx, sy)
	return []*Item{&o}, nil
}

func scaleBoxes(in []Box, sx, sy float64) []Box {
	if in == nil {
		return nil
	}
	out := make([]Box, len(in))
	for i, b := range in {
		out[i] = Box{X: int(float64(b.X) * sx), Y: int(float64(b.Y) * sy), W: int(float64(b.W) * sx), H: int(float64(b.H) * sy), Class: b.Class, Score: b.Score}
	}
	return out
}

// haar runs an OpenCV Haar cascade. CascadeClassifier is not safe for
// concurrent use, so calls are serialised; the runtime sizes the pool.
type haar struct {
	mu           sync.Mutex
	cc           gocv.CascadeClassifier
	scale        float64
	minNeighbors int
}

func newHaar(params map[string]any) (Processor, error) {
	path := DefaultCascade
	if v, ok := params["cascade"].(string); ok && v != "" {
		path = v
	}
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("haar-face: cascade %s: %w (Debian package opencv-data; `make deps` installs it)", path, err)
	}
	scale, err := floatParam(params, "scale_factor", 1.1)
	if err != nil {
		return nil, err
	}
	if scale <= 1 {
		return nil, fmt.Errorf("haar-face: params.scale_factor must be > 1, got %g", scale)
	}
	mn, err := intParam(params, "min_neighbors", 3)
	if err != nil {
		return nil, err
	}
	cc := gocv.NewCascadeClassifier()
	if !cc.Load(path) {
		cc.Close()
		return nil, fmt.Errorf("haar-face: OpenCV could not load cascade %s", path)
	}
	return &haar{cc: cc, scale: scale, minNeighbors: mn}, nil
}

func (h *haar) Process(it *Item) ([]*Item, error) {
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
		o.Boxes = append(o.Boxes, Box{X: r.Min.X, Y: r.Min.Y, W: r.Dx(), H: r.Dy(), Class: "face", Score: 1})
	}
	return []*Item{&o}, nil
}

func (h *haar) Close() { h.cc.Close() }

func (crop) Close()   {}
func (count) Close()  {}
func (resize) Close() {}

// Resize returns a copy of f scaled to w x h with the given interpolation.
func Resize(f *Frame, w, h int, interp gocv.InterpolationFlags) (*Frame, error) {
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

// ToMat copies a frame into a new OpenCV matrix (the caller closes it).
func ToMat(f *Frame) (gocv.Mat, error) {
	if err := f.Valid(); err != nil {
		return gocv.Mat{}, err
	}
	return gocv.NewMatFromBytes(f.H, f.W, gocv.MatTypeCV8UC3, slices.Clone(f.Pix))
}

// FromMat copies an 8-bit 3-channel matrix into a frame.
func FromMat(m gocv.Mat) *Frame {
	return &Frame{W: m.Cols(), H: m.Rows(), Pix: m.ToBytes()}
}

// Draw paints boxes onto a frame (filled, in a colour per class); the
// synthetic source uses it to draw its moving shapes.
func Draw(f *Frame, boxes []Box) error {
	m, err := ToMat(f)
	if err != nil {
		return err
	}
	defer m.Close()
	for _, b := range boxes {
		c := classColor(b.Class)
		if b.Class == "person" {
			gocv.Circle(&m, image.Pt(b.X+b.W/2, b.Y+b.H/2), min(b.W, b.H)/2, c, -1)
			continue
		}
		gocv.Rectangle(&m, b.Rect(), c, -1)
	}
	copy(f.Pix, m.ToBytes())
	return nil
}

func classColor(class string) color.RGBA {
	var h uint32 = 2166136261
	for i := 0; i < len(class); i++ {
		h = (h ^ uint32(class[i])) * 16777619
	}
	return color.RGBA{R: uint8(64 + h%192), G: uint8(64 + (h>>8)%192), B: uint8(64 + (h>>16)%192), A: 255}
}
