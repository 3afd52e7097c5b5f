package modules

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"math"
	"slices"

	"github.com/mdag/mdag/media"
)

// tracker is the `track` op: a SORT-like multi-object tracker per stream.
//
// Detections of a frame: each input item's Region (a crop's box, after
// crop -> reid: its class in Region.Class, the item's Labels carried), or,
// for an item without Region, each of its Boxes (no labels). Boxes without
// a positive size are ignored.
//
// Association: every track's box is predicted at the frame's seq with a
// constant velocity (the top-left corner moves by the velocity times the
// seq gap since the track's last match, so frames dropped upstream are
// predicted over; the size stays the last matched size). The velocity is
// the displacement between the track's last two matched boxes divided by
// their seq gap. Pairs of (track, detection) of the same class whose IoU is
// at least `iou` are matched greedily, best IoU first (ties: lower track
// id, then earlier detection); greedy, not Hungarian: with the IoU floor
// the two rarely differ, and greedy is deterministic and cheap (every
// track-detection pair is checked, most rejected on the boxes' extents
// before any IoU; only overlapping pairs are sorted). A matched track takes the detection's box, score and labels.
// An unmatched detection opens a new track (ids 1, 2, ... per stream,
// never reused), unless the stream already has 4096 tracks. A track
// unmatched for more than `max_age` frames in a row (counted in seq
// numbers: frames dropped upstream count) is deleted: one unmatched on
// max_age frames and matched on the next keeps its id.
//
// Output: one item per frame (Derive of the first input, no Region; the
// whole frame when an input carries it, for annotate) whose Tracks are the
// confirmed tracks, by id: a track is
// confirmed once it has been matched `min_hits` times, and from then on is
// reported every frame until deleted, with Missed = 0 when matched in this
// frame (its box is the detection) or Missed > 0 while it coasts (its box
// is the prediction). Boxes are the matched confirmed tracks' boxes (the
// coasting ones are in Tracks only), in the same order, class kept, and
// Labels the labels of their detections, in the same order.
//
// A frame whose seq is not after the last one processed (a duplicate or
// late frame) never moves the state: its detections are matched against
// the tracks' last matched boxes (no prediction, as there is no negative
// gap), and the output reports the confirmed tracks matched, with the
// detection's box and Missed = 0; nothing is created, updated or deleted.
type tracker struct {
	maxAge  int
	iou     float64
	minHits int
	streams streamStates[trackState]
}

// trackState is one stream's tracker state (snapshot payload v1: binary,
// encodeTrackState).
type trackState struct {
	Started bool        // a frame was processed
	Last    uint64      // the last frame's seq
	NextID  uint64      // the next track's id (ids start at 1)
	Tracks  []trackItem // by id
}

// trackItem is one track: its last matched box (float, as velocities
// make fractional positions), the velocity of its top-left corner per
// frame, and its counters.
type trackItem struct {
	ID     uint64
	Class  string
	X      float64
	Y      float64
	W      float64
	H      float64
	VX     float64
	VY     float64
	Score  float32
	Labels []string
	First  uint64 // seq of its first match
	Seen   uint64 // seq of its last match
	Hits   int
}

func newTracker(p Params) *tracker {
	t := &tracker{maxAge: p.Int("max_age"), iou: p.Float("iou"), minHits: p.Int("min_hits")}
	t.streams.encode, t.streams.decode = encodeTrackState, decodeTrackState
	return t
}

// encodeTrackState writes the binary payload (v1): a flags byte (1:
// started), uvarints last and next id, a uvarint count of tracks, then per
// track: uvarint id, class (uvarint length, bytes), x, y, w, h, vx, vy
// (float64 big-endian bits), score (float32 bits), a uvarint count of
// labels and each label, uvarints first, seen and hits.
func encodeTrackState(s *trackState) []byte {
	b := make([]byte, 0, 24+len(s.Tracks)*80)
	var flags byte
	if s.Started {
		flags = 1
	}
	b = append(b, flags)
	b = binary.AppendUvarint(b, s.Last)
	b = binary.AppendUvarint(b, s.NextID)
	b = binary.AppendUvarint(b, uint64(len(s.Tracks)))
	for i := range s.Tracks {
		tr := &s.Tracks[i]
		b = binary.AppendUvarint(b, tr.ID)
		b = appendString(b, tr.Class)
		b = binary.BigEndian.AppendUint64(b, math.Float64bits(tr.X))
		b = binary.BigEndian.AppendUint64(b, math.Float64bits(tr.Y))
		b = binary.BigEndian.AppendUint64(b, math.Float64bits(tr.W))
		b = binary.BigEndian.AppendUint64(b, math.Float64bits(tr.H))
		b = binary.BigEndian.AppendUint64(b, math.Float64bits(tr.VX))
		b = binary.BigEndian.AppendUint64(b, math.Float64bits(tr.VY))
		b = binary.BigEndian.AppendUint32(b, math.Float32bits(tr.Score))
		b = binary.AppendUvarint(b, uint64(len(tr.Labels)))
		for _, l := range tr.Labels {
			b = appendString(b, l)
		}
		b = binary.AppendUvarint(b, tr.First)
		b = binary.AppendUvarint(b, tr.Seen)
		b = binary.AppendUvarint(b, uint64(tr.Hits))
	}
	return b
}

// minTrackBytes is the smallest encoded track.
const minTrackBytes = 1 + 1 + 6*8 + 4 + 1 + 3

func decodeTrackState(p []byte, s *trackState) error {
	r := &payloadReader{b: p}
	switch f := r.byte("flags"); f {
	case 0, 1:
		s.Started = f == 1
	default:
		r.fail("flags %#x: want 0 or 1", f)
	}
	s.Last = r.uvarint("last frame")
	s.NextID = r.uvarint("next id")
	n := r.count("tracks", maxTracks, minTrackBytes)
	if n > 0 {
		s.Tracks = make([]trackItem, n)
	}
	for i := 0; i < n && r.err == nil; i++ {
		tr := &s.Tracks[i]
		tr.ID = r.uvarint("track id")
		if c := r.field("class"); i > 0 && string(c) == s.Tracks[i-1].Class {
			tr.Class = s.Tracks[i-1].Class // one string per run of a class
		} else {
			tr.Class = string(c)
		}
		tr.X, tr.Y, tr.W, tr.H = r.float64("x"), r.float64("y"), r.float64("w"), r.float64("h")
		tr.VX, tr.VY = r.float64("vx"), r.float64("vy")
		tr.Score = r.float32("score")
		if k := r.count("labels", maxStepItems, 1); k > 0 {
			tr.Labels = make([]string, k)
			for j := range tr.Labels {
				tr.Labels[j] = r.string("label")
			}
		}
		tr.First = r.uvarint("first frame")
		tr.Seen = r.uvarint("last match")
		if h := r.uvarint("hits"); h > math.MaxInt32 {
			r.fail("track %d: %d hits", tr.ID, h)
		} else {
			tr.Hits = int(h)
		}
	}
	return r.end()
}

func freshTrackState() trackState { return trackState{NextID: 1} }

func (t *tracker) Process(it *media.Item) ([]*media.Item, error) { return processOne(t, it) }

func (t *tracker) Close() { t.streams.clear() }

func (t *tracker) Snapshot(stream string) ([]byte, error) {
	return t.streams.snapshot("track", stream, freshTrackState)
}

func (t *tracker) Restore(stream string, b []byte) error {
	return t.streams.restore("track", stream, b, checkTrackState)
}

func checkTrackState(s *trackState) error {
	if s.NextID == 0 || s.NextID > 1<<62 {
		return fmt.Errorf("next track id %d: want 1..2^62 (ids start at 1 and must never wrap)", s.NextID)
	}
	if len(s.Tracks) > maxTracks {
		return fmt.Errorf("%d tracks: at most %d", len(s.Tracks), maxTracks)
	}
	if !s.Started && len(s.Tracks) > 0 {
		return fmt.Errorf("%d tracks before any frame", len(s.Tracks))
	}
	for i, tr := range s.Tracks {
		for _, f := range []float64{tr.X, tr.Y, tr.W, tr.H, tr.VX, tr.VY} {
			if math.IsNaN(f) || math.IsInf(f, 0) || math.Abs(f) > 1<<30 {
				return fmt.Errorf("track %d: box or velocity %v: want finite numbers within ±2^30", tr.ID, f)
			}
		}
		if err := checkBox(tr.box(0)); err != nil {
			return fmt.Errorf("track %d: %v", tr.ID, err)
		}
		switch {
		case tr.ID == 0 || tr.ID >= s.NextID:
			return fmt.Errorf("track id %d: want 1..%d (the next id is %d)", tr.ID, s.NextID-1, s.NextID)
		case i > 0 && tr.ID <= s.Tracks[i-1].ID:
			return fmt.Errorf("track ids out of order or repeated (%d after %d)", tr.ID, s.Tracks[i-1].ID)
		case tr.First > tr.Seen || tr.Seen > s.Last:
			return fmt.Errorf("track %d: first match %d, last %d, stream at %d: want first <= last <= stream", tr.ID, tr.First, tr.Seen, s.Last)
		case tr.Hits < 1 || uint64(tr.Hits-1) > tr.Seen-tr.First:
			return fmt.Errorf("track %d: %d hits between frames %d and %d", tr.ID, tr.Hits, tr.First, tr.Seen)
		}
		if err := checkLabels(tr.Labels); err != nil {
			return fmt.Errorf("track %d: %v", tr.ID, err)
		}
		s.Tracks[i].Labels = nilIfEmpty(tr.Labels)
	}
	s.Tracks = nilIfEmpty(s.Tracks)
	return nil
}

// box is the track's box predicted gap frames after its last match.
func (tr *trackItem) box(gap float64) media.Box {
	return media.Box{X: int(math.Round(tr.X + tr.VX*gap)), Y: int(math.Round(tr.Y + tr.VY*gap)),
		W: int(math.Round(tr.W)), H: int(math.Round(tr.H)), Class: tr.Class, Score: tr.Score}
}

// detection is one box a frame offers the tracker.
type detection struct {
	box    media.Box
	labels []string
}

func detections(items []*media.Item) []detection {
	var out []detection
	for _, it := range items {
		// Boxes a snapshot could not hold (no size, far outside, a score
		// that is not a number) are not detections.
		if it.Region != nil {
			if checkBox(*it.Region) == nil {
				out = append(out, detection{*it.Region, admitLabels(it.Labels)})
			}
			continue
		}
		for _, b := range it.Boxes {
			if checkBox(b) == nil {
				out = append(out, detection{b, nil})
			}
		}
	}
	return out
}

// iouOf is the intersection over union of two boxes.
func iouOf(a, b media.Box) float64 {
	ix := min(a.X+a.W, b.X+b.W) - max(a.X, b.X)
	iy := min(a.Y+a.H, b.Y+b.H) - max(a.Y, b.Y)
	if ix <= 0 || iy <= 0 {
		return 0
	}
	inter := float64(ix) * float64(iy)
	return inter / (float64(a.W)*float64(a.H) + float64(b.W)*float64(b.H) - inter)
}

// associate matches boxes (per track) with detections greedily by IoU,
// same class only, IoU >= floor. It returns, per track, the index of its
// detection or -1, and per detection whether it was taken.
func associate(boxes []media.Box, dets []detection, floor float64) ([]int, []bool) {
	type pair struct {
		iou  float64
		t, d int
	}
	var pairs []pair
	for i := range boxes {
		b := &boxes[i]
		for j := range dets {
			d := &dets[j].box
			if d.X >= b.X+b.W || b.X >= d.X+d.W || d.Y >= b.Y+b.H || b.Y >= d.Y+d.H || b.Class != d.Class {
				continue // no overlap (most pairs): skip the division
			}
			if v := iouOf(*b, *d); v > 0 && v >= floor {
				pairs = append(pairs, pair{v, i, j})
			}
		}
	}
	slices.SortFunc(pairs, func(x, y pair) int {
		switch {
		case x.iou != y.iou:
			return cmp.Compare(y.iou, x.iou)
		case x.t != y.t:
			return cmp.Compare(x.t, y.t)
		}
		return cmp.Compare(x.d, y.d)
	})
	match := make([]int, len(boxes))
	for i := range match {
		match[i] = -1
	}
	taken := make([]bool, len(dets))
	for _, p := range pairs {
		if match[p.t] < 0 && !taken[p.d] {
			match[p.t], taken[p.d] = p.d, true
		}
	}
	return match, taken
}

func (t *tracker) ProcessFrame(stream string, seq uint64, items []*media.Item) ([]*media.Item, error) {
	if err := checkFrame("track", stream, seq, items); err != nil {
		return nil, err
	}
	st := t.streams.get(stream, freshTrackState)
	st.mu.Lock()
	defer st.mu.Unlock()
	s := &st.s
	dets := detections(items)
	o := items[0].Derive()
	o.Frame = wholeFrame(items) // annotate after it draws on the frame
	if s.Started && seq <= s.Last {
		t.late(s, seq, dets, o)
		return []*media.Item{o}, nil
	}
	// Tracks that missed more than max_age frames before this one (frames
	// dropped upstream count) are gone; the others are predicted at seq.
	t.prune(s, seq, 1)
	pred := make([]media.Box, len(s.Tracks))
	for i := range s.Tracks {
		pred[i] = s.Tracks[i].box(float64(seq - s.Tracks[i].Seen))
	}
	match, taken := associate(pred, dets, t.iou)
	matched := make(map[uint64]int, len(dets))
	for i := range s.Tracks {
		j := match[i]
		if j < 0 {
			continue
		}
		tr, d := &s.Tracks[i], dets[j].box
		gap := float64(seq - tr.Seen)
		tr.VX, tr.VY = (float64(d.X)-tr.X)/gap, (float64(d.Y)-tr.Y)/gap
		tr.X, tr.Y, tr.W, tr.H, tr.Score = float64(d.X), float64(d.Y), float64(d.W), float64(d.H), d.Score
		tr.Labels = slices.Clone(dets[j].labels)
		tr.Seen = seq
		tr.Hits++
		matched[tr.ID] = j
	}
	// Unmatched tracks that now missed more than max_age frames go.
	t.prune(s, seq, 0)
	for j, d := range dets {
		if taken[j] || len(s.Tracks) >= maxTracks {
			continue
		}
		b := d.box
		s.Tracks = append(s.Tracks, trackItem{ID: s.NextID, Class: b.Class, X: float64(b.X), Y: float64(b.Y),
			W: float64(b.W), H: float64(b.H), Score: b.Score, Labels: slices.Clone(d.labels), First: seq, Seen: seq, Hits: 1})
		matched[s.NextID] = j
		s.NextID++
	}
	s.Started, s.Last = true, seq
	for i := range s.Tracks {
		tr := &s.Tracks[i]
		if tr.Hits < t.minHits {
			continue
		}
		out := media.Track{ID: tr.ID, Age: int(min(seq-tr.First, math.MaxInt32)) + 1, Hits: tr.Hits, Missed: int(seq - tr.Seen)}
		if _, ok := matched[tr.ID]; ok {
			out.Box = tr.box(0)
			o.Boxes = append(o.Boxes, out.Box)
			o.Labels = append(o.Labels, tr.Labels...)
		} else {
			out.Box = tr.box(float64(seq - tr.Seen))
		}
		o.Tracks = append(o.Tracks, out)
	}
	return []*media.Item{o}, nil
}

// prune deletes the tracks that, at frame seq, have missed more than
// max_age frames, not counting the last `spare` frames.
func (t *tracker) prune(s *trackState, seq, spare uint64) {
	live := s.Tracks[:0]
	for _, tr := range s.Tracks {
		if seq-tr.Seen <= uint64(t.maxAge)+spare {
			live = append(live, tr)
		}
	}
	clear(s.Tracks[len(live):])
	s.Tracks = live
}

// late handles a frame at or before the last one processed: read-only
// association against the tracks' last matched boxes.
func (t *tracker) late(s *trackState, seq uint64, dets []detection, o *media.Item) {
	boxes := make([]media.Box, len(s.Tracks))
	for i := range s.Tracks {
		boxes[i] = s.Tracks[i].box(0)
	}
	match, _ := associate(boxes, dets, t.iou)
	for i := range s.Tracks {
		tr := &s.Tracks[i]
		if match[i] < 0 || tr.Hits < t.minHits {
			continue
		}
		d := dets[match[i]]
		age := 1
		if seq >= tr.First {
			age = int(min(seq-tr.First, math.MaxInt32)) + 1
		}
		o.Tracks = append(o.Tracks, media.Track{ID: tr.ID, Box: d.box, Age: age, Hits: tr.Hits})
		o.Boxes = append(o.Boxes, d.box)
		o.Labels = append(o.Labels, d.labels...)
	}
}
