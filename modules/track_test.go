package modules

import (
	"fmt"
	"slices"
	"testing"

	"github.com/mdag/mdag/media"
)

// obj is an object of a tracker scenario: its box at frame seq, or
// absent (W == 0).
type obj func(seq int) media.Box

// moving is an object at x0,y0 moving vx,vy per frame, seen on frames
// [from, to] except those in gone.
func moving(class string, x0, y0, vx, vy, from, to int, gone ...int) obj {
	return func(seq int) media.Box {
		if seq < from || seq > to || slices.Contains(gone, seq) {
			return media.Box{}
		}
		return media.Box{X: x0 + vx*seq, Y: y0 + vy*seq, W: 40, H: 40, Class: class, Score: 1}
	}
}

// runScenario feeds frames seqs with the objects' boxes (as Boxes of one
// item) and returns, per frame, the id of the track on each object (0:
// none reported matched on it).
func runScenario(t *testing.T, params map[string]any, seqs []int, objs []obj) [][]uint64 {
	t.Helper()
	tr := newStateful(t, "track", params)
	var out [][]uint64
	for _, seq := range seqs {
		it := item("s", uint64(seq))
		var want []media.Box
		for _, o := range objs {
			if b := o(seq); b.W > 0 {
				it.Boxes = append(it.Boxes, b)
			}
			want = append(want, o(seq))
		}
		res, err := tr.ProcessFrame("s", uint64(seq), []*media.Item{it})
		if err != nil || len(res) != 1 {
			t.Fatalf("frame %d: %v %v", seq, res, err)
		}
		ids := make([]uint64, len(objs))
		for i, b := range want {
			for _, tk := range res[0].Tracks {
				if b.W > 0 && tk.Missed == 0 && tk.Box == b {
					ids[i] = tk.ID
				}
			}
		}
		out = append(out, ids)
	}
	return out
}

func seqRange(from, to int, skip ...int) []int {
	var out []int
	for i := from; i <= to; i++ {
		if !slices.Contains(skip, i) {
			out = append(out, i)
		}
	}
	return out
}

// TestTrackIDs: the ids the tracker reports on each object, frame by
// frame, for scenarios of crossing paths, occlusions shorter and longer
// than max_age, frames dropped upstream, and classes.
func TestTrackIDs(t *testing.T) {
	tests := []struct {
		name   string
		params map[string]any
		seqs   []int
		objs   []obj
		want   map[int][]uint64 // frame -> ids per object (frames not listed: not checked)
	}{
		{"crossing paths keep their ids", nil, seqRange(1, 30), []obj{
			moving("car", 0, 100, 10, 0, 1, 30),
			moving("car", 300, 110, -10, 0, 1, 30), // they overlap around frame 15
		}, map[int][]uint64{1: {0, 0}, 2: {1, 2}, 14: {1, 2}, 15: {1, 2}, 16: {1, 2}, 30: {1, 2}}},
		{"missing fewer frames than max_age keeps the id", map[string]any{"max_age": 5}, seqRange(1, 20), []obj{
			moving("car", 0, 0, 8, 2, 1, 20, 8, 9, 10, 11, 12),
		}, map[int][]uint64{7: {1}, 13: {1}, 20: {1}}},
		{"missing more than max_age gets a new id", map[string]any{"max_age": 4}, seqRange(1, 20), []obj{
			moving("car", 0, 0, 8, 2, 1, 20, 8, 9, 10, 11, 12),
		}, map[int][]uint64{7: {1}, 13: {0}, 14: {2}, 20: {2}}},
		{"dropped frames are predicted over", map[string]any{"max_age": 10}, seqRange(1, 20, 6, 7, 8, 9), []obj{
			// 12 px per frame on a 40 px box: after the 5-frame gap it moved
			// 60 px, no overlap with its last box; only the prediction matches.
			moving("car", 0, 0, 12, 0, 1, 20),
			moving("car", 0, 200, 0, 12, 1, 20),
		}, map[int][]uint64{5: {1, 2}, 10: {1, 2}, 20: {1, 2}}},
		{"classes never match each other", map[string]any{"min_hits": 1}, seqRange(1, 6), []obj{
			moving("car", 0, 0, 2, 0, 1, 6),
			moving("person", 0, 0, 2, 0, 1, 6), // the same box, another class
		}, map[int][]uint64{1: {1, 2}, 6: {1, 2}}},
		{"min_hits 3 reports from the third match on", map[string]any{"min_hits": 3}, seqRange(1, 5), []obj{
			moving("car", 0, 0, 2, 0, 1, 5),
		}, map[int][]uint64{1: {0}, 2: {0}, 3: {1}, 5: {1}}},
		{"ids are never reused", map[string]any{"max_age": 1, "min_hits": 1}, seqRange(1, 12), []obj{
			moving("car", 0, 0, 2, 0, 1, 3),
			moving("car", 0, 0, 2, 0, 6, 8),
			moving("car", 0, 0, 2, 0, 11, 12),
		}, map[int][]uint64{2: {1, 0, 0}, 7: {0, 2, 0}, 12: {0, 0, 3}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := runScenario(t, tc.params, tc.seqs, tc.objs)
			for i, seq := range tc.seqs {
				if want, ok := tc.want[seq]; ok && !slices.Equal(got[i], want) {
					t.Errorf("frame %d: ids %v, want %v (all: %v)", seq, got[i], want, got)
				}
			}
		})
	}
}

// TestTrackOutput: what one frame's output carries: the confirmed tracks
// by id (coasting ones flagged Missed > 0 with a predicted box), Boxes and
// Labels of the matched ones only, detections from Regions with labels.
func TestTrackOutput(t *testing.T) {
	tr := newStateful(t, "track", map[string]any{"min_hits": 2, "max_age": 3})
	frameAt := func(seq uint64, regions ...media.Box) []*media.Item {
		var out []*media.Item
		for i, r := range regions {
			it := item("s", seq)
			box := r
			it.Region, it.Labels = &box, []string{fmt.Sprint("id", i)}
			it.Boxes = []media.Box{{X: 1, Y: 1, W: 1, H: 1}} // ignored: the Region is the detection
			out = append(out, it)
		}
		if len(out) == 0 {
			out = append(out, item("s", seq))
		}
		return out
	}
	a := func(seq int) media.Box { return media.Box{X: 10 * seq, Y: 0, W: 50, H: 50, Class: "person"} }
	b := func(seq int) media.Box { return media.Box{X: 500, Y: 5 * seq, W: 50, H: 50, Class: "person"} }
	tests := []struct {
		seq    uint64
		in     []*media.Item
		tracks string
		boxes  string
		labels []string
	}{
		{1, frameAt(1, a(1), b(1)), "[]", "[]", nil},
		{2, frameAt(2, a(2), b(2)), "[{1 {20 0 50 50 person 0} 2 2 0} {2 {500 10 50 50 person 0} 2 2 0}]", "[{20 0 50 50 person 0} {500 10 50 50 person 0}]", []string{"id0", "id1"}},
		// b unseen: it coasts at its predicted box (5 px per frame).
		{3, frameAt(3, a(3)), "[{1 {30 0 50 50 person 0} 3 3 0} {2 {500 15 50 50 person 0} 3 2 1}]", "[{30 0 50 50 person 0}]", []string{"id0"}},
		// a frame with no detections: both coast.
		{5, frameAt(5), "[{1 {50 0 50 50 person 0} 5 3 2} {2 {500 25 50 50 person 0} 5 2 3}]", "[]", nil},
		// b is deleted (4 frames unmatched > max_age 3); a comes back.
		{6, frameAt(6, a(6)), "[{1 {60 0 50 50 person 0} 6 4 0}]", "[{60 0 50 50 person 0}]", []string{"id0"}},
		// a late frame (4 <= 6) is matched read-only on the last boxes.
		{4, frameAt(4, a(6)), "[{1 {60 0 50 50 person 0} 4 4 0}]", "[{60 0 50 50 person 0}]", []string{"id0"}},
		// and changed nothing: frame 7 continues from frame 6.
		{7, frameAt(7, a(7)), "[{1 {70 0 50 50 person 0} 7 5 0}]", "[{70 0 50 50 person 0}]", []string{"id0"}},
	}
	for _, tc := range tests {
		out, err := tr.ProcessFrame("s", tc.seq, tc.in)
		if err != nil || len(out) != 1 {
			t.Fatalf("frame %d: %v %v", tc.seq, out, err)
		}
		o := out[0]
		if got := fmt.Sprint(o.Tracks); got != tc.tracks {
			t.Errorf("frame %d: tracks %s, want %s", tc.seq, got, tc.tracks)
		}
		if got := fmt.Sprint(o.Boxes); got != tc.boxes {
			t.Errorf("frame %d: boxes %s, want %s", tc.seq, got, tc.boxes)
		}
		if !slices.Equal(o.Labels, tc.labels) || o.Region != nil || o.Seq != tc.seq {
			t.Errorf("frame %d: labels %q region %v seq %d, want %q, nil, %d", tc.seq, o.Labels, o.Region, o.Seq, tc.labels, tc.seq)
		}
	}
}

// BenchmarkTrack: the tracker's cost per frame against objects per frame
// (objects moving back and forth in a grid, all matched every frame), and the cost of a
// snapshot plus a restore of such a stream.
func BenchmarkTrack(b *testing.B) {
	for _, n := range []int{1, 4, 16, 64} {
		frames := make([][]*media.Item, 64)
		for f := range frames {
			it := item("s", uint64(f+1))
			tri := min(f, 64-f) // back and forth, so the frames loop smoothly
			for i := range n {
				it.Boxes = append(it.Boxes, media.Box{X: (i%8)*100 + 2*tri, Y: (i/8)*100 + tri, W: 40, H: 40, Class: "car"})
			}
			frames[f] = []*media.Item{it}
		}
		b.Run(fmt.Sprintf("objects=%d", n), func(b *testing.B) {
			tr := newStateful(b, "track", nil)
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				f := frames[i%len(frames)]
				seq := uint64(i + 1)
				f[0].Seq = seq
				if _, err := tr.ProcessFrame("s", seq, f); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/frame")
		})
		b.Run(fmt.Sprintf("snapshot+restore/objects=%d", n), func(b *testing.B) {
			tr := newStateful(b, "track", nil)
			for i, f := range frames[:8] {
				f[0].Seq = uint64(i + 1)
				if _, err := tr.ProcessFrame("s", uint64(i+1), f); err != nil {
					b.Fatal(err)
				}
			}
			other := newStateful(b, "track", nil)
			b.ReportAllocs()
			b.ResetTimer()
			var size int
			for range b.N {
				snap, err := tr.Snapshot("s")
				if err != nil {
					b.Fatal(err)
				}
				if err := other.Restore("s", snap); err != nil {
					b.Fatal(err)
				}
				size = len(snap)
			}
			b.ReportMetric(float64(size), "bytes")
		})
	}
}
