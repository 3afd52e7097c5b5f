package modules

import (
	"cmp"
	"fmt"
	"image"
	"slices"

	"github.com/mdag/mdag/media"
)

// RegisterBuiltin adds the pure-Go ops to r: crop, text-crop, place, count and sink, and
// the stateful track, window, sequence, activity and segment. Every binary
// has them, the lean one included.
func RegisterBuiltin(r *Registry) error {
	for op, f := range map[OpID]Factory{
		"crop": func(p Params) (Processor, error) {
			return crop{pad: p.Int("pad"), classes: p.Strings("classes"), minScore: float32(p.Float("min_score"))}, nil
		},
		"count":     func(p Params) (Processor, error) { return count{classes: p.Strings("classes")}, nil },
		"text-crop": newTextCrop,
		"place":     func(Params) (Processor, error) { return place{}, nil },
		"sink":      func(Params) (Processor, error) { return passThrough{}, nil },
		"track":     func(p Params) (Processor, error) { return newTracker(p), nil },
		"window":    func(p Params) (Processor, error) { return newWindow(p), nil },
		"sequence":  func(p Params) (Processor, error) { return newSequence(p), nil },
		"activity":  func(p Params) (Processor, error) { return newActivity(p) },
		"segment":   func(p Params) (Processor, error) { return newSegment(p), nil },
	} {
		if err := r.Register(op, f); err != nil {
			return err
		}
	}
	return nil
}

// Builtin returns a new registry holding the pure-Go ops only.
func Builtin() *Registry {
	r := NewRegistry()
	Must(RegisterBuiltin(r))
	return r
}

type passThrough struct{}

func (passThrough) Process(it *media.Item) ([]*media.Item, error) { return []*media.Item{it}, nil }
func (passThrough) Close()                                        {}

// crop cuts one item per matching detection out of the frame: the box's
// rectangle (pad around it, within the frame) as it is, or what cut makes
// of it (text-crop: a text line).
type crop struct {
	pad      int
	classes  []string
	minScore float32
	op       string                                           // "crop" when empty, for errors
	cut      func(*media.Frame, image.Rectangle) *media.Frame // nil: Frame.Crop
}

func (c crop) Process(it *media.Item) ([]*media.Item, error) {
	if err := it.Frame.Valid(); err != nil {
		return nil, fmt.Errorf("%s: %w", cmp.Or(c.op, "crop"), err)
	}
	var out []*media.Item
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
		if c.cut != nil {
			o.Frame = c.cut(it.Frame, r)
		} else {
			o.Frame = it.Frame.Crop(r)
		}
		out = append(out, o)
	}
	return out, nil
}

func (crop) Close() {}

// count tallies labels (or, without labels, detections) by class.
type count struct{ classes []string }

func (c count) Process(it *media.Item) ([]*media.Item, error) {
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
	return []*media.Item{o}, nil
}

func (count) Close() {}
