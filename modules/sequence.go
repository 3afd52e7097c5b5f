package modules

import (
	"fmt"
	"slices"
	"sort"

	"github.com/mdag/mdag/media"
)

// sequence is the `sequence` op: frame order and per-stream context for
// captioning.
//
// A frame's items become one media.Step (the frame's seq; its items'
// boxes, labels and tracks concatenated in the order the items came). Per
// stream the op keeps the context: the steps of the last `context` frames
// of the current scene, sorted by seq, one per frame.
//
//   - A frame newer than the newest seen is appended. If more than
//     `max_gap` frames are missing in a row before it (seq - newest - 1 >
//     max_gap) the scene moved on: the context restarts with this frame.
//   - A frame older than the newest (reordered input) is inserted in
//     order, unless it is older than the current scene's first frame (it
//     belongs to the scene before the restart) or older than every kept
//     step while the context is full: those are not kept.
//   - A frame whose seq is already in the context (a duplicate) leaves it
//     unchanged: the first wins.
//
// Then the oldest steps beyond `context` go. Every frame emits one item:
// Derive of the frame's first item, keeping its Frame and Boxes, with the
// Labels of all the frame's items and Steps = the context's steps up to
// and including this frame's seq, in order (for frames in order: the whole
// context; for a late frame: the context as it reads at that frame; for a
// frame that was not kept: the kept steps before it, possibly none).
type sequence struct {
	context int
	maxGap  int
	streams streamStates[sequenceState]
}

// sequenceState is one stream's context (snapshot payload v1).
type sequenceState struct {
	Started bool         `json:"started"`
	Newest  uint64       `json:"newest"` // the newest frame seen
	Start   uint64       `json:"start"`  // the current scene's first frame
	Steps   []media.Step `json:"steps"`  // sorted by seq, one per frame
}

func newSequence(p Params) *sequence {
	return &sequence{context: p.Int("context"), maxGap: p.Int("max_gap")}
}

func freshSequenceState() sequenceState { return sequenceState{} }

func (q *sequence) Process(it *media.Item) ([]*media.Item, error) { return processOne(q, it) }

func (q *sequence) Close() { q.streams.clear() }

func (q *sequence) Snapshot(stream string) ([]byte, error) {
	return q.streams.snapshot("sequence", stream, freshSequenceState)
}

// Restore takes a context of up to 4096 steps; one longer than this
// processor's context keeps its newest steps.
func (q *sequence) Restore(stream string, b []byte) error {
	return q.streams.restore("sequence", stream, b, func(s *sequenceState) error {
		if err := checkSteps(s.Steps); err != nil {
			return err
		}
		for i, st := range s.Steps {
			if i > 0 && st.Seq == s.Steps[i-1].Seq {
				return fmt.Errorf("two steps of frame %d", st.Seq)
			}
		}
		switch {
		case !s.Started && (len(s.Steps) > 0 || s.Newest != 0 || s.Start != 0):
			return fmt.Errorf("a context before any frame")
		case s.Start > s.Newest:
			return fmt.Errorf("scene starts at frame %d, after the newest %d", s.Start, s.Newest)
		case len(s.Steps) > 0 && (s.Steps[0].Seq < s.Start || s.Steps[len(s.Steps)-1].Seq > s.Newest):
			return fmt.Errorf("steps %d..%d outside the scene %d..%d", s.Steps[0].Seq, s.Steps[len(s.Steps)-1].Seq, s.Start, s.Newest)
		}
		if len(s.Steps) > q.context {
			s.Steps = slices.Clone(s.Steps[len(s.Steps)-q.context:])
		}
		s.Steps = nilIfEmpty(s.Steps)
		return nil
	})
}

func (q *sequence) ProcessFrame(stream string, seq uint64, items []*media.Item) ([]*media.Item, error) {
	if err := checkFrame("sequence", stream, seq, items); err != nil {
		return nil, err
	}
	step := media.Step{Seq: seq}
	var labels []string
	for _, it := range items {
		step.Boxes = append(step.Boxes, it.Boxes...)
		step.Labels = append(step.Labels, it.Labels...)
		step.Tracks = append(step.Tracks, it.Tracks...)
		labels = append(labels, it.Labels...)
	}
	step = admitStep(step)
	st := q.streams.get(stream, freshSequenceState)
	st.mu.Lock()
	defer st.mu.Unlock()
	s := &st.s
	switch {
	case !s.Started || seq > s.Newest:
		if !s.Started || seq-s.Newest-1 > uint64(q.maxGap) {
			s.Steps, s.Start = nil, seq
		}
		s.Started, s.Newest = true, seq
		s.Steps = append(s.Steps, step)
	case seq < s.Start:
		// the scene before the restart: not kept
	default:
		i := sort.Search(len(s.Steps), func(i int) bool { return s.Steps[i].Seq >= seq })
		dup := i < len(s.Steps) && s.Steps[i].Seq == seq
		if !dup && !(i == 0 && len(s.Steps) >= q.context) {
			s.Steps = slices.Insert(s.Steps, i, step)
		}
	}
	if n := len(s.Steps) - q.context; n > 0 {
		s.Steps = slices.Delete(s.Steps, 0, n)
	}
	n := sort.Search(len(s.Steps), func(i int) bool { return s.Steps[i].Seq > seq })
	first := items[0]
	o := first.Derive()
	o.Frame, o.Boxes, o.Labels = first.Frame, first.Boxes, labels
	o.Steps = slices.Clone(s.Steps[:n])
	return []*media.Item{o}, nil
}
