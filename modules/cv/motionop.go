package cv

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync"

	"github.com/mdag/mdag/media"
	"github.com/mdag/mdag/modules"
)

// motionOp is the motion op: Motion (MOG2 background subtraction) as a
// stateful module, one background model per stream. Each frame's regions
// become the frame item's Boxes; with drop_still a frame without motion
// after the warm-up is emitted nowhere, so it finishes there.
//
// State and migration: OpenCV cannot serialise a MOG2 model, so a snapshot
// carries what can be carried (frames seen, the last frame's seq and
// regions) and a restored stream's model relearns the background: for the
// first warmup frames after a Restore the op reports no regions and drops
// nothing, as at a stream's start.
type motionOp struct {
	warmup    int
	minArea   float64
	dropStill bool
	class     string // every region's class; "": Motion's rule

	mu      sync.Mutex
	streams map[string]*motionStream
	closed  bool
}

// motionStream is one stream's state.
type motionStream struct {
	mu      sync.Mutex
	m       *Motion // nil after Close or until the first frame
	seen    uint64  // frames processed for the stream, carried across restores
	lastSeq uint64
	last    []media.Box // the last frame's regions
	gone    bool        // forgotten or closed: a caller holding it takes the map's again
}

var _ modules.Stateful = (*motionOp)(nil)

// motionStateVersion is the motion op's snapshot payload version.
const motionStateVersion = 1

// motionMaxBoxes bounds the regions a snapshot may carry (Motion reports
// at most motionMax; a larger count is a corrupt snapshot).
const motionMaxBoxes = motionMax

func newMotionOp(p modules.Params) (modules.Processor, error) {
	return &motionOp{warmup: p.Int("warmup"), minArea: p.Float("min_area"), dropStill: p.Int("drop_still") == 1,
		class: p.String("class"), streams: map[string]*motionStream{}}, nil
}

// stream returns stream's state, made when new.
func (o *motionOp) stream(id string) (*motionStream, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return nil, errors.New("motion: processor closed")
	}
	s := o.streams[id]
	if s == nil {
		s = &motionStream{}
		o.streams[id] = s
	}
	return s, nil
}

// lockStream returns stream's state locked, made when new. A state
// forgotten between the map lookup and the lock (a Restore racing a frame,
// which the runtime never does) is looked up again, so no model is made on
// a state nobody will close.
func (o *motionOp) lockStream(id string) (*motionStream, error) {
	for {
		s, err := o.stream(id)
		if err != nil {
			return nil, err
		}
		s.mu.Lock()
		if !s.gone {
			return s, nil
		}
		s.mu.Unlock()
	}
}

// Process runs one item as its stream's next frame (the runtime calls
// ProcessFrame for a stateful op; this serves direct callers).
func (o *motionOp) Process(it *media.Item) ([]*media.Item, error) {
	return o.ProcessFrame(it.Stream, it.Seq, []*media.Item{it})
}

// ProcessFrame feeds the frame to stream's background model. The item
// carrying the whole frame (the first with a valid frame and no Region;
// else the first with a valid frame) is emitted as a copy whose Boxes are
// the moving regions; the frame's other items pass unchanged. With
// drop_still, a warm model seeing no motion emits nothing at all.
func (o *motionOp) ProcessFrame(stream string, seq uint64, items []*media.Item) ([]*media.Item, error) {
	pick := -1
	for i, it := range items {
		if it == nil || it.Frame.Valid() != nil {
			continue
		}
		if it.Region == nil {
			pick = i
			break
		}
		if pick < 0 {
			pick = i
		}
	}
	if pick < 0 {
		return nil, fmt.Errorf("motion: frame %d of stream %q: none of its %d items carries a valid frame", seq, stream, len(items))
	}
	s, err := o.lockStream(stream)
	if err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = newMotion(o.warmup, o.minArea)
	}
	boxes := s.m.Boxes(items[pick].Frame)
	if o.class != "" {
		for i := range boxes {
			boxes[i].Class = o.class
		}
	}
	s.seen++
	s.lastSeq, s.last = seq, boxes
	if o.dropStill && len(boxes) == 0 && s.m.Warm() {
		return nil, nil
	}
	out := make([]*media.Item, len(items))
	copy(out, items)
	c := *items[pick]
	c.Boxes = boxes
	out[pick] = &c
	return out, nil
}

// Snapshot encodes frames seen, the last seq and the last regions (not
// the background model: OpenCV cannot serialise it).
func (o *motionOp) Snapshot(stream string) ([]byte, error) {
	o.mu.Lock()
	s := o.streams[stream]
	o.mu.Unlock()
	var st motionState
	if s != nil {
		s.mu.Lock()
		st = motionState{seen: s.seen, lastSeq: s.lastSeq, last: s.last}
		s.mu.Unlock()
	}
	return modules.EncodeState("motion", motionStateVersion, st.encode()), nil
}

// Restore replaces stream's state with a snapshot's: a fresh background
// model (it relearns for warmup frames) with the carried counters and
// regions. Nil or empty forgets the stream.
func (o *motionOp) Restore(stream string, state []byte) error {
	var st *motionState
	if len(state) > 0 {
		v, payload, err := modules.DecodeState("motion", state)
		if err == nil && v != motionStateVersion {
			err = fmt.Errorf("snapshot version %d, this binary reads %d", v, motionStateVersion)
		}
		if err == nil {
			st, err = decodeMotionState(payload)
		}
		if err != nil {
			o.forget(stream)
			return fmt.Errorf("motion: restore stream %q: %w", stream, err)
		}
	}
	o.forget(stream)
	if st == nil {
		return nil
	}
	s, err := o.lockStream(stream)
	if err != nil {
		return err
	}
	s.seen, s.lastSeq, s.last = st.seen, st.lastSeq, st.last
	s.mu.Unlock()
	return nil
}

// forget drops stream's state and releases its model.
func (o *motionOp) forget(stream string) {
	o.mu.Lock()
	s := o.streams[stream]
	delete(o.streams, stream)
	o.mu.Unlock()
	if s != nil {
		s.release()
	}
}

// release closes the stream's model and marks it gone.
func (s *motionStream) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m != nil {
		s.m.Close()
		s.m = nil
	}
	s.gone = true
}

// Close releases every stream's model.
func (o *motionOp) Close() {
	o.mu.Lock()
	streams := o.streams
	o.streams, o.closed = map[string]*motionStream{}, true
	o.mu.Unlock()
	for _, s := range streams {
		s.release()
	}
}

// motionState is the carried part of a stream's state.
type motionState struct {
	seen, lastSeq uint64
	last          []media.Box
}

// encode writes the payload: uvarint seen, uvarint lastSeq, uvarint box
// count, then per box varint X, Y, W, H, uvarint class length, the class
// and the score's float32 bits (big endian).
func (s motionState) encode() []byte {
	b := binary.AppendUvarint(nil, s.seen)
	b = binary.AppendUvarint(b, s.lastSeq)
	b = binary.AppendUvarint(b, uint64(len(s.last)))
	for _, x := range s.last {
		for _, v := range []int{x.X, x.Y, x.W, x.H} {
			b = binary.AppendVarint(b, int64(v))
		}
		b = binary.AppendUvarint(b, uint64(len(x.Class)))
		b = append(b, x.Class...)
		b = binary.BigEndian.AppendUint32(b, math.Float32bits(x.Score))
	}
	return b
}

// maxClassLen bounds a carried class name.
const maxClassLen = 256

// decodeMotionState reads encode's payload; it never panics.
func decodeMotionState(p []byte) (*motionState, error) {
	r := stateReader{p: p}
	st := &motionState{seen: r.uvarint("frames seen"), lastSeq: r.uvarint("last seq")}
	n := r.uvarint("region count")
	if r.err == nil && n > motionMaxBoxes {
		r.fail("%d regions, at most %d", n, motionMaxBoxes)
	}
	for i := uint64(0); r.err == nil && i < n; i++ {
		var b media.Box
		b.X, b.Y, b.W, b.H = r.int("x"), r.int("y"), r.int("width"), r.int("height")
		if cl := r.uvarint("class length"); r.err == nil {
			if cl > maxClassLen || cl > uint64(len(r.p)) {
				r.fail("class of %d bytes", cl)
			} else {
				b.Class, r.p = string(r.p[:cl]), r.p[cl:]
			}
		}
		if r.err == nil {
			if len(r.p) < 4 {
				r.fail("truncated score")
			} else {
				b.Score, r.p = math.Float32frombits(binary.BigEndian.Uint32(r.p)), r.p[4:]
			}
		}
		if r.err == nil && (b.W < 0 || b.H < 0) {
			r.fail("region %d has a negative size %dx%d", i, b.W, b.H)
		}
		st.last = append(st.last, b)
	}
	if r.err == nil && len(r.p) > 0 {
		r.fail("%d bytes after the regions", len(r.p))
	}
	if r.err != nil {
		return nil, r.err
	}
	return st, nil
}

// stateReader reads varints, keeping the first error.
type stateReader struct {
	p   []byte
	err error
}

func (r *stateReader) fail(format string, args ...any) {
	if r.err == nil {
		r.err = fmt.Errorf("motion state: "+format, args...)
	}
}

func (r *stateReader) uvarint(what string) uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.p)
	if n <= 0 {
		r.fail("bad %s", what)
		return 0
	}
	r.p = r.p[n:]
	return v
}

func (r *stateReader) int(what string) int {
	if r.err != nil {
		return 0
	}
	v, n := binary.Varint(r.p)
	if n <= 0 || v < math.MinInt32 || v > math.MaxInt32 {
		r.fail("bad %s", what)
		return 0
	}
	r.p = r.p[n:]
	return int(v)
}
