package modules

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/mdag/mdag/media"
)

// TestActivityRuleErrors: rules are validated at Decode time; each
// problem names the rule and what is wrong.
func TestActivityRuleErrors(t *testing.T) {
	tests := []struct {
		rules []any
		want  string // "" valid
	}{
		{[]any{"line door 100,0,100,200", "zone desk 0,0,50,50 dwell 5s", "loiter hall 0,0,9,9 150f", "loiter h2 0,0,9,9 1m radius 12.5"}, ""},
		{[]any{"line door 100,0,100,200", "circle c 1,2,3"}, `params.rules[1]: unknown rule kind "circle": want line, zone or loiter`},
		{[]any{""}, "params.rules[0]: empty rule"},
		{[]any{"line door 1,2,3"}, `params.rules[0]: line: coordinates "1,2,3": want x1,y1,x2,y2`},
		{[]any{"line door 1,2,x,4"}, `params.rules[0]: line: coordinate "x": want a number`},
		{[]any{"line door 1,2,1,2"}, "params.rules[0]: line: the line's two ends are the same point"},
		{[]any{"line door 1,2,3,4 extra"}, `params.rules[0]: line: 4 words (want "line NAME x1,y1,x2,y2")`},
		{[]any{"line d/or 1,2,3,4"}, `params.rules[0]: line: name "d/or"`},
		{[]any{"line a 0,0,1,1", "zone a 0,0,5,5 dwell 2s"}, `params.rules[1]: rule name "a" already used by rules[0]`},
		{[]any{"zone z 0,0,5,5 stay 2s"}, `params.rules[0]: zone: "stay" where "dwell" goes`},
		{[]any{"zone z 5,0,0,5 dwell 2s"}, "params.rules[0]: zone: rectangle [5 0 0 5]: want x1 < x2 and y1 < y2"},
		{[]any{"zone z 0,0,5,5 dwell soon"}, `params.rules[0]: zone: duration "soon": want a positive Go duration (5s) or frames (150f)`},
		{[]any{"zone z 0,0,5,5 dwell -2s"}, `params.rules[0]: zone: duration "-2s"`},
		{[]any{"zone z 0,0,5,5 dwell 0f"}, `params.rules[0]: zone: duration "0f": want a whole number of frames > 0`},
		{[]any{"loiter l 0,0,5,5 2s radius -1"}, `params.rules[0]: loiter: radius "-1": want a number of pixels > 0`},
		{[]any{"loiter l 0,0,5,5 2s within 3"}, `params.rules[0]: loiter: "within" where "radius" goes`},
		{[]any{"loiter l 0,0,NaN,5 2s"}, `params.rules[0]: loiter: coordinate "NaN"`},
		{[]any{"line a 0,0,1,1", 7}, "params.rules[1]: want a string, got 7"},
	}
	op, _ := Lookup("activity")
	for _, tc := range tests {
		_, errs := op.Decode(map[string]any{"rules": tc.rules})
		switch {
		case tc.want == "" && len(errs) > 0:
			t.Errorf("%q: %v", tc.rules, errs)
		case tc.want != "" && (len(errs) != 1 || !strings.HasPrefix(errs[0].Error(), tc.want)):
			t.Errorf("%q: errors %v, want %q", tc.rules, errs, tc.want)
		}
		if tc.want == "" {
			if _, err := Builtin().New("activity", map[string]any{"rules": tc.rules}); err != nil {
				t.Errorf("%q: valid rules do not build: %v", tc.rules, err)
			}
		}
	}
}

// TestActivityEvents: the events a track moving through rules' areas
// raises, frame by frame: once per episode, with direction, durations in
// frames and in capture time, and the identity of the track.
func TestActivityEvents(t *testing.T) {
	const gone = -1 // the track is not matched in this frame (coasting)
	tests := []struct {
		name  string
		rules []any
		xs    []float64 // the track's centre x per frame 1, 2, ... (y is 50)
		ident string    // an identity item on each frame
		want  map[int][]string
	}{
		{"line crossings, each way, with direction", []any{"line door 100,0,100,200"},
			[]float64{50, 70, 90, 110, 130, 110, 90, 70}, "",
			map[int][]string{4: {"line-cross door track 1 crossed line door right-to-left"}, 7: {"line-cross door track 1 crossed line door left-to-right"}}},
		{"touching the line is no crossing", []any{"line door 100,0,100,200"},
			[]float64{90, 100, 90, 100, 110}, "",
			map[int][]string{5: {"line-cross door track 1 crossed line door right-to-left"}}},
		{"crossing the line beyond the segment is none", []any{"line door 100,0,100,40"},
			[]float64{50, 150}, "", nil},
		{"dwell in frames: once per episode", []any{"zone desk 150,0,300,100 dwell 3f"},
			[]float64{100, 160, 170, 180, 190, 200, 400, 160, 170, 180, 190}, "",
			map[int][]string{5: {"dwell desk track 1 stayed in zone desk for 3 frames"}, 11: {"dwell desk track 1 stayed in zone desk for 3 frames"}}},
		{"dwell in time (capture 100 ms apart)", []any{"zone desk 150,0,300,100 dwell 250ms"},
			[]float64{100, 160, 170, 180, 190, 200}, "",
			map[int][]string{5: {"dwell desk track 1 stayed in zone desk for 300ms"}}},
		{"a track appearing inside starts its episode", []any{"zone desk 0,0,300,100 dwell 2f"},
			[]float64{100, 100, 100, 100}, "",
			map[int][]string{3: {"dwell desk track 1 stayed in zone desk for 2 frames"}}},
		{"coasting frames neither end nor advance an episode", []any{"zone desk 150,0,300,100 dwell 3f"},
			[]float64{160, gone, gone, 400, gone, 160, 170, gone, 180, 190}, "",
			map[int][]string{9: {"dwell desk track 1 stayed in zone desk for 3 frames"}}},
		{"loiter: settles anew when it moves beyond the radius", []any{"loiter hall 0,0,400,400 2f radius 5"},
			[]float64{100, 102, 104, 120, 121, 122, 123, 124}, "",
			map[int][]string{3: {"loiter hall track 1 loitered in hall for 2 frames"}, 6: {"loiter hall track 1 loitered in hall for 2 frames"}}},
		{"identities name the track; several rules", []any{"line door 100,0,100,200", "zone desk 100,0,300,100 dwell 1f"},
			[]float64{90, 110, 120}, "alice",
			map[int][]string{2: {"line-cross door track 1 (alice) crossed line door right-to-left"}, 3: {"dwell desk track 1 (alice) stayed in zone desk for 1 frames"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := newStateful(t, "activity", map[string]any{"rules": tc.rules})
			for i, x := range tc.xs {
				seq := uint64(i + 1)
				tr := item("s", seq)
				b := media.Box{X: int(x) - 10, Y: 40, W: 20, H: 20, Class: "person"}
				missed := 0
				if x == gone {
					b, missed = media.Box{X: 5000, Y: 5000, W: 20, H: 20}, 1
				}
				tr.Tracks = []media.Track{{ID: 1, Box: b, Missed: missed}}
				items := []*media.Item{tr}
				if tc.ident != "" {
					id := item("s", seq)
					region := media.Box{X: b.X + 2, Y: b.Y, W: 20, H: 20}
					id.Region, id.Labels = &region, []string{tc.ident}
					items = append(items, id)
				}
				out, err := a.ProcessFrame("s", seq, items)
				if err != nil || len(out) != 1 {
					t.Fatalf("frame %d: %v %v", seq, out, err)
				}
				var got, kinds []string
				for _, e := range out[0].Events {
					got = append(got, e.Kind+" "+e.Rule+" "+e.Detail)
					kinds = append(kinds, e.Kind)
					if e.Track != 1 {
						t.Errorf("frame %d: event of track %d", seq, e.Track)
					}
				}
				if !slices.Equal(got, tc.want[int(seq)]) {
					t.Errorf("frame %d: events %q, want %q", seq, got, tc.want[int(seq)])
				}
				if !slices.Equal(out[0].Labels, kinds) || fmt.Sprint(out[0].Tracks) != fmt.Sprint(tr.Tracks) {
					t.Errorf("frame %d: labels %q tracks %v, want %q and %v", seq, out[0].Labels, out[0].Tracks, kinds, tr.Tracks)
				}
			}
		})
	}
}

// TestActivityLateFrame: a frame at or before the last one moves no
// episode and raises nothing; frames after it go on as if it never came.
func TestActivityLateFrame(t *testing.T) {
	rules := map[string]any{"rules": []any{"line door 100,0,100,200"}}
	at := func(seq uint64, x int) []*media.Item {
		it := item("s", seq)
		it.Tracks = []media.Track{{ID: 1, Box: media.Box{X: x - 10, Y: 40, W: 20, H: 20}}}
		return []*media.Item{it}
	}
	a := newStateful(t, "activity", rules)
	for _, f := range []struct {
		seq    uint64
		x      int
		events int
	}{{1, 50, 0}, {2, 90, 0}, {1, 150, 0}, {2, 150, 0}, {3, 110, 1}} {
		out, err := a.ProcessFrame("s", f.seq, at(f.seq, f.x))
		if err != nil || len(out[0].Events) != f.events || len(out[0].Tracks) != 1 {
			t.Errorf("frame %d at x %d: %+v %v, want %d events", f.seq, f.x, out, err, f.events)
		}
	}
}
