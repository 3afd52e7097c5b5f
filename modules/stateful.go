package modules

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"sync"

	"github.com/mdag/mdag/media"
)

// What the stateful ops share: a map of per-stream states, each behind its
// own lock (the runtime never runs two frames of one stream at once, but
// runs different streams concurrently, and a Snapshot may come from
// another goroutine), and the payload of their snapshots: JSON, or the
// op's own binary codec (track, whose snapshots are the largest and most
// frequent), always version 1 (stateVersion) and checked on restore.
// A stream's state lives until Restore(stream, nil) or Close: the runtime
// forgets a stream that leaves (the ops cannot tell an ended stream from
// a paused one).

// stateVersion is the payload version every op of this file writes (v1).
const stateVersion = 1

// Bounds a restored snapshot must keep (they bound what a live stream
// can grow to as well).
const (
	maxTracks      = 4096 // tracks per stream (track, activity)
	maxSteps       = 4096 // steps a window or a sequence keeps
	maxStepItems   = 4096 // boxes, labels or tracks in one step
	maxLabelLength = 1024 // bytes in one label or class
)

// streamStates holds an op's state per stream. Snapshots carry the state
// as JSON unless the op sets its own payload codec (encode and decode,
// both or neither).
type streamStates[S any] struct {
	mu     sync.Mutex
	m      map[string]*streamState[S]
	encode func(*S) []byte
	decode func([]byte, *S) error
}

type streamState[S any] struct {
	mu sync.Mutex
	s  S
}

// get returns stream's state, creating a fresh one (fresh()) if needed.
func (t *streamStates[S]) get(stream string, fresh func() S) *streamState[S] {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		t.m = map[string]*streamState[S]{}
	}
	st, ok := t.m[stream]
	if !ok {
		st = &streamState[S]{s: fresh()}
		t.m[stream] = st
	}
	return st
}

// set replaces stream's state.
func (t *streamStates[S]) set(stream string, s S) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		t.m = map[string]*streamState[S]{}
	}
	t.m[stream] = &streamState[S]{s: s}
}

// forget drops stream's state.
func (t *streamStates[S]) forget(stream string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.m, stream)
}

// clear drops every stream.
func (t *streamStates[S]) clear() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.m = nil
}

// snapshot serialises stream's state (a fresh one for an unseen stream)
// in op's envelope.
func (t *streamStates[S]) snapshot(op OpID, stream string, fresh func() S) ([]byte, error) {
	t.mu.Lock()
	st := t.m[stream] // an unseen stream is not added
	t.mu.Unlock()
	if st == nil {
		st = &streamState[S]{s: fresh()}
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	var payload []byte
	if t.encode != nil {
		payload = t.encode(&st.s)
	} else {
		var err error
		if payload, err = json.Marshal(st.s); err != nil {
			return nil, fmt.Errorf("%s: snapshot of stream %q: %w", op, stream, err)
		}
		if len(payload) > maxJSONState {
			// Refused here, the export fails and the state stays where
			// it is; a restore would refuse it anyway.
			return nil, fmt.Errorf("%s: snapshot of stream %q: %d bytes, more than the %d a restore takes", op, stream, len(payload), maxJSONState)
		}
	}
	b := EncodeState(op, stateVersion, payload)
	if len(b) > maxStateBytes {
		return nil, fmt.Errorf("%s: snapshot of stream %q: %d bytes, more than the %d a snapshot may have", op, stream, len(b), maxStateBytes)
	}
	return b, nil
}

// maxJSONState bounds the JSON payload of a snapshot (window, sequence,
// activity, segment): decoding JSON allocates many times its size, so a
// hostile 16 MiB payload must not reach the decoder.
const maxJSONState = 2 << 20

// restore replaces stream's state with b's (nil or empty: forget it):
// the envelope is checked, the payload decoded strictly (unknown fields
// are an error) and validated by check, which may normalise it. On any
// error the stream is left fresh.
func (t *streamStates[S]) restore(op OpID, stream string, b []byte, check func(*S) error) error {
	t.forget(stream)
	if len(b) == 0 {
		return nil
	}
	v, payload, err := DecodeState(op, b)
	if err != nil {
		return fmt.Errorf("%s: restore stream %q: %w", op, stream, err)
	}
	if v != stateVersion {
		return fmt.Errorf("%s: restore stream %q: %w for op %s: state version %d, this binary reads %d", op, stream, ErrState, op, v, stateVersion)
	}
	var s S
	if t.decode != nil {
		if err := t.decode(payload, &s); err != nil {
			return fmt.Errorf("%s: restore stream %q: %w for op %s: payload: %v", op, stream, ErrState, op, err)
		}
	} else {
		if len(payload) > maxJSONState {
			return fmt.Errorf("%s: restore stream %q: %w for op %s: a payload of %d bytes, more than %d", op, stream, ErrState, op, len(payload), maxJSONState)
		}
		dec := json.NewDecoder(bytes.NewReader(payload))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&s); err != nil {
			return fmt.Errorf("%s: restore stream %q: %w for op %s: payload: %v", op, stream, ErrState, op, err)
		}
		if dec.More() {
			return fmt.Errorf("%s: restore stream %q: %w for op %s: payload: data after the state", op, stream, ErrState, op)
		}
	}
	if err := check(&s); err != nil {
		return fmt.Errorf("%s: restore stream %q: %w for op %s: %v", op, stream, ErrState, op, err)
	}
	t.set(stream, s)
	return nil
}

// checkBox validates a box of a snapshot: a positive size, coordinates
// within ±2^30 (frames are far smaller; the bound keeps arithmetic on
// them from overflowing), a finite score and a bounded class.
func checkBox(b media.Box) error {
	const lim = 1 << 30
	switch {
	case b.W <= 0 || b.H <= 0 || b.W > lim || b.H > lim:
		return fmt.Errorf("box %dx%d: want a positive size up to %d", b.W, b.H, lim)
	case b.X < -lim || b.X > lim || b.Y < -lim || b.Y > lim:
		return fmt.Errorf("box at %d,%d: coordinates beyond ±%d", b.X, b.Y, lim)
	case math.IsNaN(float64(b.Score)) || math.IsInf(float64(b.Score), 0):
		return fmt.Errorf("box score %v: want a finite number", b.Score)
	case len(b.Class) > maxLabelLength:
		return fmt.Errorf("box class of %d bytes: at most %d", len(b.Class), maxLabelLength)
	}
	return nil
}

// checkLabels validates a snapshot's labels.
func checkLabels(ls []string) error {
	if len(ls) > maxStepItems {
		return fmt.Errorf("%d labels: at most %d", len(ls), maxStepItems)
	}
	for i, l := range ls {
		if len(l) > maxLabelLength {
			return fmt.Errorf("label %d of %d bytes: at most %d", i, len(l), maxLabelLength)
		}
	}
	return nil
}

// checkStep validates a snapshot's step (window, sequence) and makes its
// empty lists nil, so a restored state equals the one snapshotted.
func checkStep(s *media.Step) error {
	if len(s.Boxes) > maxStepItems || len(s.Tracks) > maxStepItems {
		return fmt.Errorf("step %d: %d boxes and %d tracks: at most %d each", s.Seq, len(s.Boxes), len(s.Tracks), maxStepItems)
	}
	for _, b := range s.Boxes {
		if err := checkBox(b); err != nil {
			return fmt.Errorf("step %d: %v", s.Seq, err)
		}
	}
	for _, tr := range s.Tracks {
		if err := checkBox(tr.Box); err != nil {
			return fmt.Errorf("step %d: track %d: %v", s.Seq, tr.ID, err)
		}
		if tr.Age < 0 || tr.Hits < 0 || tr.Missed < 0 {
			return fmt.Errorf("step %d: track %d: negative age, hits or missed", s.Seq, tr.ID)
		}
	}
	if err := checkLabels(s.Labels); err != nil {
		return fmt.Errorf("step %d: %v", s.Seq, err)
	}
	s.Boxes, s.Labels, s.Tracks = nilIfEmpty(s.Boxes), nilIfEmpty(s.Labels), nilIfEmpty(s.Tracks)
	return nil
}

// admitStep keeps of a step what a snapshot can hold and a restore takes
// (checkStep): boxes and tracks that checkBox accepts, labels up to
// maxLabelLength, at most maxStepItems of each. The state a frame builds
// must always survive a move: a stream whose snapshot a restore refused
// would lose its state.
func admitStep(s media.Step) media.Step {
	keep := func(bs []media.Box) []media.Box {
		var out []media.Box
		for _, b := range bs {
			if checkBox(b) == nil && len(out) < maxStepItems {
				out = append(out, b)
			}
		}
		return out
	}
	out := media.Step{Seq: s.Seq, Boxes: keep(s.Boxes)}
	for _, tr := range s.Tracks {
		if checkBox(tr.Box) == nil && tr.Age >= 0 && tr.Hits >= 0 && tr.Missed >= 0 && len(out.Tracks) < maxStepItems {
			out.Tracks = append(out.Tracks, tr)
		}
	}
	for _, l := range s.Labels {
		if len(l) <= maxLabelLength && len(out.Labels) < maxStepItems {
			out.Labels = append(out.Labels, l)
		}
	}
	out.Boxes, out.Labels, out.Tracks = nilIfEmpty(out.Boxes), nilIfEmpty(out.Labels), nilIfEmpty(out.Tracks)
	return out
}

// admitLabels is ls without the labels a snapshot cannot hold (see
// admitStep).
func admitLabels(ls []string) []string {
	return admitStep(media.Step{Labels: ls}).Labels
}

func nilIfEmpty[T any](s []T) []T {
	if len(s) == 0 {
		return nil
	}
	return s
}

// processOne is a stateful op's Processor.Process: the frame of one item.
func processOne(st Stateful, it *media.Item) ([]*media.Item, error) {
	if it == nil {
		return nil, fmt.Errorf("no item")
	}
	return st.ProcessFrame(it.Stream, it.Seq, []*media.Item{it})
}

// checkFrame checks ProcessFrame's arguments: at least one item, all of
// stream's frame seq.
func checkFrame(op OpID, stream string, seq uint64, items []*media.Item) error {
	if len(items) == 0 {
		return fmt.Errorf("%s: frame %s/%d has no items", op, stream, seq)
	}
	for i, it := range items {
		if it == nil {
			return fmt.Errorf("%s: frame %s/%d: item %d is nil", op, stream, seq, i)
		}
		if it.Stream != stream || it.Seq != seq {
			return fmt.Errorf("%s: frame %s/%d: item %d is of frame %s/%d", op, stream, seq, i, it.Stream, it.Seq)
		}
	}
	return nil
}

// payloadReader reads a binary snapshot payload; the first error sticks
// (later reads return zero values) and every length is checked against
// what is left before anything is allocated. It moves an offset (no
// reslicing: no pointer writes in the hot loop).
type payloadReader struct {
	b   []byte
	off int
	err error
}

func (r *payloadReader) fail(format string, args ...any) {
	if r.err == nil {
		r.err = fmt.Errorf(format, args...)
	}
}

func (r *payloadReader) left() int { return len(r.b) - r.off }

func (r *payloadReader) uvarint(what string) uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b[r.off:])
	if n <= 0 {
		r.fail("%s: truncated or overlong number", what)
		return 0
	}
	r.off += n
	return v
}

// count reads a count of items at most limit, each at least minSize bytes.
func (r *payloadReader) count(what string, limit, minSize int) int {
	v := r.uvarint(what)
	if r.err == nil && (v > uint64(limit) || v*uint64(minSize) > uint64(r.left())) {
		r.fail("%s: %d, more than the %d allowed or than the %d bytes left hold", what, v, limit, r.left())
		return 0
	}
	return int(v)
}

// fixed returns the next n bytes (nil after an error).
func (r *payloadReader) fixed(what string, n int) []byte {
	if r.err != nil {
		return nil
	}
	if r.left() < n {
		r.fail("%s: truncated", what)
		return nil
	}
	p := r.b[r.off : r.off+n]
	r.off += n
	return p
}

func (r *payloadReader) float64(what string) float64 {
	if p := r.fixed(what, 8); p != nil {
		return math.Float64frombits(binary.BigEndian.Uint64(p))
	}
	return 0
}

func (r *payloadReader) float32(what string) float32 {
	if p := r.fixed(what, 4); p != nil {
		return math.Float32frombits(binary.BigEndian.Uint32(p))
	}
	return 0
}

func (r *payloadReader) string(what string) string { return string(r.field(what)) }

// field reads a length-prefixed string's bytes (not copied).
func (r *payloadReader) field(what string) []byte {
	n := r.count(what, maxLabelLength, 1) // (no what+" length": it would allocate per field)
	return r.fixed(what, n)
}

func (r *payloadReader) byte(what string) byte {
	if p := r.fixed(what, 1); p != nil {
		return p[0]
	}
	return 0
}

// end checks the payload was read to its last byte.
func (r *payloadReader) end() error {
	if r.err == nil && r.left() > 0 {
		r.fail("%d bytes after the state", r.left())
	}
	return r.err
}

func appendString(b []byte, s string) []byte {
	return append(binary.AppendUvarint(b, uint64(len(s))), s...)
}

// wholeFrame is the frame of the first item that carries the whole frame
// (a frame, no Region: not a crop), or nil: what a frame's single output
// keeps, so that an op after it (annotate) sees the pixels.
func wholeFrame(items []*media.Item) *media.Frame {
	for _, it := range items {
		if it.Frame != nil && it.Region == nil {
			return it.Frame
		}
	}
	return nil
}
