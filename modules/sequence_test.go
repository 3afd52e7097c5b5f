package modules

import (
	"slices"
	"testing"
)

// TestSequence: the context each frame's output carries, for frames in
// order, reordered, duplicated, after a gap that restarts the scene and
// from before the restart.
func TestSequence(t *testing.T) {
	tests := []struct {
		name    string
		context int
		maxGap  int
		seqs    []uint64
		want    [][]uint64 // steps' seqs of each output
	}{
		{"in order, trimmed to the context", 3, 30, []uint64{1, 2, 3, 4, 5},
			[][]uint64{{1}, {1, 2}, {1, 2, 3}, {2, 3, 4}, {3, 4, 5}}},
		{"reordered input is put in order; a late frame sees the context up to it", 4, 30, []uint64{1, 2, 4, 3, 6, 5, 7},
			[][]uint64{{1}, {1, 2}, {1, 2, 4}, {1, 2, 3}, {2, 3, 4, 6}, {3, 4, 5}, {4, 5, 6, 7}}},
		{"a duplicate leaves the context as it is", 4, 30, []uint64{1, 2, 2, 3},
			[][]uint64{{1}, {1, 2}, {1, 2}, {1, 2, 3}}},
		{"a gap within max_gap keeps the context", 4, 2, []uint64{1, 2, 5, 6},
			[][]uint64{{1}, {1, 2}, {1, 2, 5}, {1, 2, 5, 6}}},
		{"a gap beyond max_gap restarts it", 4, 2, []uint64{1, 2, 6, 7},
			[][]uint64{{1}, {1, 2}, {6}, {6, 7}}},
		{"a frame from before the restart is not kept", 4, 2, []uint64{1, 2, 6, 3, 7},
			[][]uint64{{1}, {1, 2}, {6}, nil, {6, 7}}},
		{"max_gap 0: any missing frame restarts", 4, 0, []uint64{1, 2, 4},
			[][]uint64{{1}, {1, 2}, {4}}},
		{"a frame older than a full context is not kept", 2, 30, []uint64{4, 5, 3, 6},
			[][]uint64{{4}, {4, 5}, nil, {5, 6}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			q := newStateful(t, "sequence", map[string]any{"context": tc.context, "max_gap": tc.maxGap})
			for i, seq := range tc.seqs {
				items := labelled(seq, "a", "b")
				out, err := q.ProcessFrame("s", seq, items)
				if err != nil || len(out) != 1 {
					t.Fatalf("frame %d: %v %v", seq, out, err)
				}
				o := out[0]
				if got := stepSeqs(o); !slices.Equal(got, tc.want[i]) {
					t.Errorf("output %d (frame %d): steps %v, want %v", i, seq, got, tc.want[i])
				}
				if !slices.Equal(o.Labels, []string{"a", "b"}) || o.Frame != items[0].Frame || o.Seq != seq {
					t.Errorf("frame %d: labels %q, frame kept %v", seq, o.Labels, o.Frame == items[0].Frame)
				}
				for _, s := range o.Steps {
					if s.Seq == seq && (len(s.Labels) != 2 || len(s.Boxes) != 2) {
						t.Errorf("frame %d: its step %+v does not merge its two items", seq, s)
					}
				}
			}
		})
	}
}
