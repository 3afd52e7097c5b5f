package modules

import (
	"fmt"
	"slices"
	"testing"

	"github.com/mdag/mdag/media"
)

// stepSeqs lists the seqs of an output's steps.
func stepSeqs(it *media.Item) []uint64 {
	var out []uint64
	for _, s := range it.Steps {
		out = append(out, s.Seq)
	}
	return out
}

// labelled is a frame of items, one per label, at seq.
func labelled(seq uint64, labels ...string) []*media.Item {
	var out []*media.Item
	for _, l := range labels {
		it := item("s", seq)
		it.Labels = []string{l}
		it.Boxes = []media.Box{{X: int(seq), Y: 0, W: 4, H: 4, Class: l}}
		it.Frame = media.NewFrame(2, 2)
		out = append(out, it)
	}
	return out
}

// TestWindow: the window's steps after each frame, for frames in order,
// reordered, several items per frame and a step too old for a full
// window.
func TestWindow(t *testing.T) {
	type in struct {
		seq    uint64
		labels []string
	}
	tests := []struct {
		name   string
		size   int
		frames []in
		want   [][]uint64 // steps' seqs after each frame
	}{
		{"fills then slides", 3, []in{{1, []string{"a"}}, {2, []string{"b"}}, {3, []string{"c"}}, {4, []string{"d"}}},
			[][]uint64{{1}, {1, 2}, {1, 2, 3}, {2, 3, 4}}},
		{"reordered input comes out sorted", 4, []in{{1, []string{"a"}}, {3, []string{"c"}}, {2, []string{"b"}}, {5, []string{"e"}}, {4, []string{"d"}}},
			[][]uint64{{1}, {1, 3}, {1, 2, 3}, {1, 2, 3, 5}, {2, 3, 4, 5}}},
		{"an item older than a full window's oldest is ignored", 2, []in{{5, []string{"a"}}, {6, []string{"b"}}, {4, []string{"x"}}, {7, []string{"c"}}},
			[][]uint64{{5}, {5, 6}, {5, 6}, {6, 7}}},
		{"a window not yet full takes an older item", 3, []in{{5, []string{"a"}}, {4, []string{"b"}}},
			[][]uint64{{5}, {4, 5}}},
		{"each item of a frame is a step", 3, []in{{1, []string{"a", "b"}}, {2, []string{"c", "d"}}},
			[][]uint64{{1, 1}, {1, 2, 2}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w := newStateful(t, "window", map[string]any{"size": tc.size})
			for i, f := range tc.frames {
				items := labelled(f.seq, f.labels...)
				out, err := w.ProcessFrame("s", f.seq, items)
				if err != nil || len(out) != 1 {
					t.Fatalf("frame %d: %v %v", f.seq, out, err)
				}
				o := out[0]
				if got := stepSeqs(o); !slices.Equal(got, tc.want[i]) {
					t.Errorf("after frame %d: steps %v, want %v", f.seq, got, tc.want[i])
				}
				if o.Seq != f.seq || o.Frame != items[0].Frame || !slices.Equal(o.Labels, items[0].Labels) || fmt.Sprint(o.Boxes) != fmt.Sprint(items[0].Boxes) {
					t.Errorf("frame %d: output %+v does not keep the first item's frame, boxes and labels", f.seq, o)
				}
			}
		})
	}
}

// TestWindowStepsAreCopies: a step carries the item's results, and
// changing an input or output afterwards does not change the window.
func TestWindowStepsAreCopies(t *testing.T) {
	w := newStateful(t, "window", map[string]any{"size": 2})
	in := labelled(1, "a")
	in[0].Tracks = []media.Track{{ID: 3, Box: media.Box{X: 1, Y: 1, W: 2, H: 2}}}
	out, _ := w.ProcessFrame("s", 1, in)
	want := "[{1 [{1 0 4 4 a 0}] [a] [{3 {1 1 2 2  0} 0 0 0}]}]"
	if got := fmt.Sprint(out[0].Steps); got != want {
		t.Fatalf("steps %s, want %s", got, want)
	}
	in[0].Labels[0], in[0].Boxes[0].X = "changed", 99
	out[0].Steps[0].Seq = 42
	out, _ = w.ProcessFrame("s", 2, labelled(2, "b"))
	if got := fmt.Sprint(out[0].Steps[0]); got != "{1 [{1 0 4 4 a 0}] [a] [{3 {1 1 2 2  0} 0 0 0}]}" {
		t.Errorf("the window shares memory with items: %s", got)
	}
}
