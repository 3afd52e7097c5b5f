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
	objects atomic.Int64
}

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
	size := max(8, min(p.W, p.H)/8)
	boxes := make([]media.Box, 0, n)
	t := float64(seq)/30 + float64(stream)*0.7
	for i := range n {
		ph := t + float64(i)*1.3
		cx := float64(p.W-size) * (0.5 + 0.5*math.Sin(ph*(0.9+0.1*float64(i%3))))
		cy := float64(p.H-size) * (0.5 + 0.5*math.Cos(ph*(0.7+0.13*float64(i%4))))
		boxes = append(boxes, media.Box{X: int(cx), Y: int(cy), W: size, H: size, Class: p.Classes[i%len(p.Classes)], Score: 1})
	}
	if err := Draw(f, boxes); err != nil {
		return nil, nil, err
	}
	return f, boxes, nil
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

// Draw paints boxes onto a frame, filled, in a colour per class: a disc for
// people, a rectangle for everything else.
func Draw(f *media.Frame, boxes []media.Box) error {
	if err := f.Valid(); err != nil {
		return err
	}
	for _, b := range boxes {
		c := classColor(b.Class)
		r := b.Rect().Intersect(image.Rect(0, 0, f.W, f.H))
		cx2, cy2, rad := 2*b.X+b.W, 2*b.Y+b.H, min(b.W, b.H) // doubled: centre and radius in half pixels
		for y := r.Min.Y; y < r.Max.Y; y++ {
			for x := r.Min.X; x < r.Max.X; x++ {
				if b.Class == "person" {
					dx, dy := 2*x+1-cx2, 2*y+1-cy2
					if dx*dx+dy*dy > rad*rad {
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
