package modules

import (
	"fmt"
	"slices"
	"sort"

	"github.com/mdag/mdag/media"
)

// window is the `window` op: the last `size` items of a stream.
//
// Each input item of a frame becomes one media.Step (its seq, boxes,
// labels and tracks; never pixels) inserted into the stream's window,
// which is kept sorted by seq (items of one frame in the order they came),
// so input that arrives reordered comes out in order. When the window
// holds more than `size` steps the oldest go. A step older than the
// window's oldest while the window is full would be the first to go: it is
// ignored (the output does not say so; the window it carries shows which
// frames are in).
//
// Every frame emits one item: Derive of the frame's first item, keeping
// its Frame, Boxes and Labels, whose Steps are the window, oldest first,
// this frame's items included. Until `size` items have come the window is
// shorter: it still emits, with the steps so far.
type window struct {
	size    int
	streams streamStates[windowState]
}

// windowState is one stream's window (snapshot payload v1): steps sorted
// by seq.
type windowState struct {
	Steps []media.Step `json:"steps"`
}

func newWindow(p Params) *window { return &window{size: p.Int("size")} }

func freshWindowState() windowState { return windowState{} }

func (w *window) Process(it *media.Item) ([]*media.Item, error) { return processOne(w, it) }

func (w *window) Close() { w.streams.clear() }

func (w *window) Snapshot(stream string) ([]byte, error) {
	return w.streams.snapshot("window", stream, freshWindowState)
}

// Restore takes a window of any length up to 4096 steps; one longer than
// this processor's size keeps its newest size steps.
func (w *window) Restore(stream string, b []byte) error {
	return w.streams.restore("window", stream, b, func(s *windowState) error {
		if err := checkSteps(s.Steps); err != nil {
			return err
		}
		if len(s.Steps) > w.size {
			s.Steps = slices.Clone(s.Steps[len(s.Steps)-w.size:])
		}
		return nil
	})
}

// checkSteps validates a snapshot's steps: bounded, each valid, sorted by
// seq.
func checkSteps(steps []media.Step) error {
	if len(steps) > maxSteps {
		return fmt.Errorf("%d steps: at most %d", len(steps), maxSteps)
	}
	for i := range steps {
		if err := checkStep(&steps[i]); err != nil {
			return err
		}
		if i > 0 && steps[i].Seq < steps[i-1].Seq {
			return fmt.Errorf("steps out of order (%d after %d)", steps[i].Seq, steps[i-1].Seq)
		}
	}
	return nil
}

// stepOf is an item's step: its results, copied (the state never shares
// slices with items that flow on).
func stepOf(it *media.Item) media.Step {
	return admitStep(media.Step{Seq: it.Seq, Boxes: it.Boxes, Labels: it.Labels, Tracks: it.Tracks})
}

// insertStep inserts s after every step with a seq <= s.Seq.
func insertStep(steps []media.Step, s media.Step) []media.Step {
	i := sort.Search(len(steps), func(i int) bool { return steps[i].Seq > s.Seq })
	return slices.Insert(steps, i, s)
}

func (w *window) ProcessFrame(stream string, seq uint64, items []*media.Item) ([]*media.Item, error) {
	if err := checkFrame("window", stream, seq, items); err != nil {
		return nil, err
	}
	st := w.streams.get(stream, freshWindowState)
	st.mu.Lock()
	defer st.mu.Unlock()
	s := &st.s
	for _, it := range items {
		if len(s.Steps) >= w.size && it.Seq < s.Steps[0].Seq {
			continue
		}
		s.Steps = insertStep(s.Steps, stepOf(it))
		if n := len(s.Steps) - w.size; n > 0 {
			s.Steps = slices.Delete(s.Steps, 0, n)
		}
	}
	first := items[0]
	o := first.Derive()
	o.Frame, o.Boxes, o.Labels = first.Frame, first.Boxes, first.Labels
	o.Steps = slices.Clone(s.Steps)
	return []*media.Item{o}, nil
}
