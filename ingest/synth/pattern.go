// Package synth is the synthetic video source: a moving-shapes pattern drawn
// in pure Go, whose objects per frame can be changed while it runs (the
// scaling test's knob); and the synthetic audio source (Tone: chirps with
// silence between them, for apps with `media: audio`). Each frame carries its shapes as ground truth, which
// emulated detectors report back. It imports media and clock only, so the
// lean binary's `mdag source` and `serve --synthetic` have it. Live cameras
// come in over WebRTC through ingest/whip.
package synth

import (
	"context"
	"fmt"
	"image"
	"image/color"
	"math"
	"sync/atomic"
	"time"

	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/media"
)

// Pattern draws frames of moving shapes. Each frame carries the shapes as
// ground truth (Item.Truth), which emulated detectors report back, so the
// number of objects per frame drives the app's fan-out.
type Pattern struct {
	W, H    int
	Classes []string // object classes, cycled; default car, person, truck, bus
	// Motion is how the objects move (default Orbit). Set it, like
	// Classes, before the first frame.
	Motion Motion
	// Upright draws people (class person) half as wide as tall, as people
	// stand, so that a motion estimator that tells people by their shape
	// (taller than wide) sees them in the video; default: every object is
	// a size x size square box.
	Upright bool
	objects atomic.Int64
}

// Motion is how a pattern's objects move.
type Motion int

const (
	// Orbit: each object goes round the frame on its own smooth path
	// (a sine in x, a cosine in y, at speeds that differ by object);
	// paths cross, so objects overlap now and then. The default.
	Orbit Motion = iota
	// Lanes: each object goes back and forth horizontally at a constant
	// speed in its own lane, one pass across the frame every LanePass
	// frames, turning at the edges. Lanes are 1.25 object sizes apart
	// from the top, so objects never overlap while there are no more
	// than LaneCount of them (beyond, objects share lanes at other
	// phases and may overlap). Every object crosses the frame's vertical
	// middle once per pass: a tracker can keep one id per object, and a
	// line-crossing rule on x = W/2 fires for each of them.
	Lanes
)

// LanePass is how many frames an object of the Lanes motion takes to
// cross the frame once.
const LanePass = 60

// String names the motion as the flags and docs do.
func (m Motion) String() string {
	switch m {
	case Orbit:
		return "orbit"
	case Lanes:
		return "lanes"
	}
	return fmt.Sprintf("motion(%d)", int(m))
}

// LaneCount is how many objects of the Lanes motion fit in their own
// lanes in the frame.
func (p *Pattern) LaneCount() int {
	size := p.objectSize()
	return max(1, (p.H-size)/(size+size/4)+1)
}

// objectSize is the side of every object's box.
func (p *Pattern) objectSize() int { return max(8, min(p.W, p.H)/8) }

// NewPattern returns a w x h pattern with n objects per frame.
func NewPattern(w, h, n int) (*Pattern, error) {
	if w < 32 || h < 32 || w > 7680 || h > 4320 {
		return nil, fmt.Errorf("pattern size %dx%d: want 32x32 to 7680x4320", w, h)
	}
	if n < 0 {
		return nil, fmt.Errorf("pattern objects %d: want >= 0", n)
	}
	p := &Pattern{W: w, H: h, Classes: []string{"car", "person", "truck", "bus"}}
	p.objects.Store(int64(n))
	return p, nil
}

// SetObjects changes the number of objects drawn from the next frame on.
func (p *Pattern) SetObjects(n int) { p.objects.Store(int64(max(0, n))) }

// Objects is the current number of objects per frame.
func (p *Pattern) Objects() int { return int(p.objects.Load()) }

// Frame draws frame seq of a stream (the stream's index shifts the phase so
// streams differ) and returns it with its ground truth.
func (p *Pattern) Frame(stream int, seq uint64) (*media.Frame, []media.Box, error) {
	n := p.Objects()
	f := media.NewFrame(p.W, p.H)
	size := p.objectSize()
	boxes := make([]media.Box, 0, n)
	classes := p.Classes
	if len(classes) == 0 {
		classes = []string{"object"}
	}
	switch p.Motion {
	case Orbit:
		t := float64(seq)/30 + float64(stream)*0.7
		for i := range n {
			ph := t + float64(i)*1.3
			cx := float64(p.W-size) * (0.5 + 0.5*math.Sin(ph*(0.9+0.1*float64(i%3))))
			cy := float64(p.H-size) * (0.5 + 0.5*math.Cos(ph*(0.7+0.13*float64(i%4))))
			boxes = append(boxes, p.box(int(cx), int(cy), size, classes[i%len(classes)]))
		}
	case Lanes:
		// A round trip is 2*LanePass frames; object i of stream s starts
		// at its own point of it, so objects and streams differ.
		const trip = 2 * LanePass
		lanes, gap, span := p.LaneCount(), size+size/4, uint64(p.W-size)
		for i := range n {
			k := (seq + uint64(i)*37 + uint64(stream)*23) % trip
			if k > LanePass {
				k = trip - k
			}
			x := int(span * k / LanePass)
			boxes = append(boxes, p.box(x, (i%lanes)*gap, size, classes[i%len(classes)]))
		}
	default:
		return nil, nil, fmt.Errorf("pattern motion %v: want orbit or lanes", p.Motion)
	}
	if err := Draw(f, boxes); err != nil {
		return nil, nil, err
	}
	return f, boxes, nil
}

// box is an object's box at (x, y): size x size, or for an upright
// person half as wide, centred where the square would be.
func (p *Pattern) box(x, y, size int, class string) media.Box {
	b := media.Box{X: x, Y: y, W: size, H: size, Class: class, Score: 1}
	if p.Upright && class == "person" {
		b.W = max(1, size/2)
		b.X += (size - b.W) / 2
	}
	return b
}

// FrameSink receives generated frames.
type FrameSink func(stream string, seq uint64, capture time.Time, f *media.Frame, truth []media.Box) error

// Generate draws frames for one stream at fps on clk until ctx ends or
// count frames were sent (count 0: no limit). Frames are paced from the
// start time (no drift); a frame whose time has passed while the previous
// one was drawn is sent late rather than skipped, so every frame is sent.
func (p *Pattern) Generate(ctx context.Context, clk clock.Clock, index int, stream string, fps float64, count uint64, sink FrameSink) error {
	return pace(ctx, clk, fps, count, func(seq uint64, at time.Time) error {
		f, truth, err := p.Frame(index, seq)
		if err != nil {
			return err
		}
		// The capture time is the frame's slot in the schedule, as a camera
		// stamps frames: a source that falls behind shows up as latency.
		return sink(stream, seq, at, f, truth)
	})
}

// pace calls each with seq 0, 1, ... at fps on clk from now until ctx
// ends or count calls were made (count 0: no limit); at is the call's slot
// in the schedule (no drift; a slot that passed is served late, never
// skipped). An error from each ends it.
func pace(ctx context.Context, clk clock.Clock, fps float64, count uint64, each func(seq uint64, at time.Time) error) error {
	if fps <= 0 {
		return fmt.Errorf("fps %g: want > 0", fps)
	}
	period := time.Duration(float64(time.Second) / fps)
	start := clk.Now()
	for seq := uint64(0); count == 0 || seq < count; seq++ {
		at := start.Add(time.Duration(seq) * period)
		if wait := at.Sub(clk.Now()); wait > 0 {
			tick := make(chan struct{})
			t := clk.AfterFunc(wait, func() { close(tick) })
			select {
			case <-tick:
			case <-ctx.Done():
				t.Stop()
				return nil
			}
		}
		if ctx.Err() != nil {
			return nil
		}
		if err := each(seq, at); err != nil {
			return err
		}
	}
	return nil
}

// Draw paints boxes onto a frame, filled, in a colour per class: the
// ellipse inscribed in the box for people (a disc in a square box), a
// rectangle for everything else.
func Draw(f *media.Frame, boxes []media.Box) error {
	if err := f.Valid(); err != nil {
		return err
	}
	for _, b := range boxes {
		c := classColor(b.Class)
		r := b.Rect().Intersect(image.Rect(0, 0, f.W, f.H))
		// doubled: the centre and the semi-axes (W, H) in half pixels
		cx2, cy2, aw, ah := 2*b.X+b.W, 2*b.Y+b.H, int64(b.W), int64(b.H)
		for y := r.Min.Y; y < r.Max.Y; y++ {
			for x := r.Min.X; x < r.Max.X; x++ {
				if b.Class == "person" {
					dx, dy := int64(2*x+1-cx2), int64(2*y+1-cy2)
					if dx*dx*ah*ah+dy*dy*aw*aw > aw*aw*ah*ah {
						continue
					}
				}
				i := (y*f.W + x) * 3
				f.Pix[i], f.Pix[i+1], f.Pix[i+2] = c.B, c.G, c.R
			}
		}
	}
	return nil
}

func classColor(class string) color.RGBA {
	var h uint32 = 2166136261
	for i := 0; i < len(class); i++ {
		h = (h ^ uint32(class[i])) * 16777619
	}
	return color.RGBA{R: uint8(64 + h%192), G: uint8(64 + (h>>8)%192), B: uint8(64 + (h>>16)%192), A: 255}
}
