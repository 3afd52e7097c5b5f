package modules

import (
	"fmt"
	"math"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/mdag/mdag/media"
)

// activity is the `activity` op: rules over a stream's tracks.
//
// Inputs of a frame: items with Tracks (from `track`) and identity items
// (from reid: Labels and a Region). An identity is attached to the track
// of the frame whose box overlaps its Region best (IoU > 0) and kept: a
// track keeps its last identity, which events name.
//
// Rules (param `rules`, one string each, words separated by spaces;
// coordinates are frame pixels, numbers with an optional fraction):
//
//	line NAME x1,y1,x2,y2
//	    "line-cross" each time a track's box centre crosses the segment
//	    from (x1,y1) to (x2,y2) between two frames where it was matched;
//	    the Detail says the direction: "left-to-right" or "right-to-left"
//	    as seen looking from (x1,y1) towards (x2,y2) on the image.
//	zone NAME x1,y1,x2,y2 dwell DURATION
//	    "dwell" once a track's centre has stayed inside the rectangle
//	    (corners x1,y1 and x2,y2, x1 < x2, y1 < y2) for DURATION.
//	loiter NAME x1,y1,x2,y2 DURATION [radius PIXELS]
//	    "loiter" once a track's centre, inside the rectangle, has stayed
//	    within PIXELS (default 25) of where it settled for DURATION; moving
//	    farther settles it anew.
//
// DURATION is a Go duration ("5s", "1m30s"), measured between the frames'
// Capture times, or a whole number of frames written with an "f" ("150f"),
// measured in seq numbers. NAMEs are letters, digits, '_', '-', '.',
// unique among the rules.
//
// Each event fires once per (rule, track) episode: a crossing is an
// episode; a dwell episode lasts while the centre stays inside the zone,
// a loiter episode while it stays inside the area within the radius of
// its settling point. Only tracks matched in the frame (Missed = 0) move
// episodes on; a coasting track keeps its episodes as they are. A track
// not matched for 300 frames is forgotten (its ids are never reused, so
// this only bounds memory).
//
// Output: one item per frame (Derive of the first input) carrying the
// frame's tracks (by id), the events (by track id, then rule order) and
// Labels = the events' kinds, in the same order. A frame whose seq is not
// after the last one processed (duplicate or late) moves no episode: its
// output carries its tracks and no events.
type activity struct {
	rules   []rule
	names   []string
	streams streamStates[activityState]
}

type ruleKind int

const (
	ruleLine ruleKind = iota
	ruleZone
	ruleLoiter
)

// rule is one parsed activity rule.
type rule struct {
	kind           ruleKind
	name           string
	x1, y1, x2, y2 float64
	frames         uint64        // DURATION in frames, or
	dur            time.Duration // in time
	radius         float64
}

// staleTrackFrames is how long activity remembers a track not matched.
const staleTrackFrames = 300

// maxRules bounds the rules of one module.
const maxRules = 256

var ruleName = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)

// parseRules parses the rules param, the first problem as a ParamError
// keyed by the rule's index ("[1]").
func parseRules(src []string) ([]rule, error) {
	if len(src) > maxRules {
		return nil, fmt.Errorf("%d rules: at most %d", len(src), maxRules)
	}
	var out []rule
	seen := map[string]int{}
	for i, s := range src {
		r, err := parseRule(s)
		if err == nil {
			if j, dup := seen[r.name]; dup {
				err = fmt.Errorf("rule name %q already used by rules[%d]", r.name, j)
			}
		}
		if err != nil {
			return nil, ParamError{Key: fmt.Sprintf("[%d]", i), Msg: err.Error()}
		}
		seen[r.name] = i
		out = append(out, r)
	}
	return out, nil
}

func checkRules(v any) error {
	rs, _ := v.([]string)
	_, err := parseRules(rs)
	return err
}

var ruleSyntax = map[string]string{
	"line":   "line NAME x1,y1,x2,y2",
	"zone":   "zone NAME x1,y1,x2,y2 dwell DURATION",
	"loiter": "loiter NAME x1,y1,x2,y2 DURATION [radius PIXELS]",
}

func parseRule(s string) (rule, error) {
	w := strings.Fields(s)
	if len(w) == 0 {
		return rule{}, fmt.Errorf("empty rule: want one of %q, %q, %q", ruleSyntax["line"], ruleSyntax["zone"], ruleSyntax["loiter"])
	}
	syntax, ok := ruleSyntax[w[0]]
	if !ok {
		return rule{}, fmt.Errorf("unknown rule kind %q: want line, zone or loiter", w[0])
	}
	kind := w[0]
	bad := func(format string, args ...any) (rule, error) {
		return rule{}, fmt.Errorf("%s: %s (want %q)", kind, fmt.Sprintf(format, args...), syntax)
	}
	want := map[string][]int{"line": {3}, "zone": {5}, "loiter": {4, 6}}[w[0]]
	if !slices.Contains(want, len(w)) {
		return bad("%d words", len(w))
	}
	if !ruleName.MatchString(w[1]) {
		return bad("name %q: want 1 to 64 letters, digits, '_', '-' or '.'", w[1])
	}
	r := rule{name: w[1]}
	c := strings.Split(w[2], ",")
	if len(c) != 4 {
		return bad("coordinates %q: want x1,y1,x2,y2", w[2])
	}
	var xy [4]float64
	for i, f := range c {
		v, err := strconv.ParseFloat(f, 64)
		if err != nil || math.IsNaN(v) || math.IsInf(v, 0) || math.Abs(v) > 1<<24 {
			return bad("coordinate %q: want a number within ±16777216", f)
		}
		xy[i] = v
	}
	r.x1, r.y1, r.x2, r.y2 = xy[0], xy[1], xy[2], xy[3]
	switch w[0] {
	case "line":
		r.kind = ruleLine
		if r.x1 == r.x2 && r.y1 == r.y2 {
			return bad("the line's two ends are the same point")
		}
		return r, nil
	case "zone":
		r.kind = ruleZone
		if w[3] != "dwell" {
			return bad("%q where \"dwell\" goes", w[3])
		}
		w = w[4:]
	default:
		r.kind = ruleLoiter
		r.radius = 25
		if len(w) == 6 {
			if w[4] != "radius" {
				return bad("%q where \"radius\" goes", w[4])
			}
			v, err := strconv.ParseFloat(w[5], 64)
			if err != nil || !(v > 0) || v > 1<<24 {
				return bad("radius %q: want a number of pixels > 0", w[5])
			}
			r.radius = v
		}
		w = w[3:]
	}
	if r.x1 >= r.x2 || r.y1 >= r.y2 {
		return bad("rectangle %s: want x1 < x2 and y1 < y2", c)
	}
	d := w[0]
	if n, ok := strings.CutSuffix(d, "f"); ok {
		v, err := strconv.ParseUint(n, 10, 32)
		if err != nil || v == 0 {
			return bad("duration %q: want a whole number of frames > 0 before the f", d)
		}
		r.frames = v
		return r, nil
	}
	v, err := time.ParseDuration(d)
	if err != nil || v <= 0 {
		return bad("duration %q: want a positive Go duration (5s) or frames (150f)", d)
	}
	r.dur = v
	return r, nil
}

// activityState is one stream's rule state (snapshot payload v1).
type activityState struct {
	Rules   []string   `json:"rules"` // the rule names the state is for
	Started bool       `json:"started"`
	Last    uint64     `json:"last"`
	Tracks  []actTrack `json:"tracks"` // by id
}

type actTrack struct {
	ID       uint64    `json:"id"`
	Identity string    `json:"identity"`
	Seen     uint64    `json:"seen"` // the last frame it was matched in
	X        float64   `json:"x"`    // its box centre there
	Y        float64   `json:"y"`
	Rules    []actRule `json:"rules"` // per rule
}

// actRule is a track's episode of one rule.
type actRule struct {
	Side  int8    `json:"side"` // line: the last side it was on (-1, 1; 0: none yet)
	In    bool    `json:"in"`   // zone, loiter: an episode is on
	Seq   uint64  `json:"seq"`  // when it started: frame
	At    int64   `json:"at"`   // and capture time (Unix ns)
	X     float64 `json:"x"`    // loiter: where it settled
	Y     float64 `json:"y"`
	Fired bool    `json:"fired"` // the episode's event has fired
}

func newActivity(p Params) (*activity, error) {
	rs, err := parseRules(p.Strings("rules"))
	if err != nil {
		if pe, ok := err.(ParamError); ok {
			return nil, fmt.Errorf("op activity: params.rules%s: %s", pe.Key, pe.Msg)
		}
		return nil, fmt.Errorf("op activity: params.rules: %v", err)
	}
	a := &activity{rules: rs}
	for _, r := range rs {
		a.names = append(a.names, r.name)
	}
	return a, nil
}

func (a *activity) fresh() activityState { return activityState{Rules: slices.Clone(a.names)} }

func (a *activity) Process(it *media.Item) ([]*media.Item, error) { return processOne(a, it) }

func (a *activity) Close() { a.streams.clear() }

func (a *activity) Snapshot(stream string) ([]byte, error) {
	return a.streams.snapshot("activity", stream, a.fresh)
}

// Restore takes a snapshot of a module with the same rule names (rules
// are matched by name and order; a snapshot of other rules is refused).
func (a *activity) Restore(stream string, b []byte) error {
	return a.streams.restore("activity", stream, b, func(s *activityState) error {
		if !slices.Equal(s.Rules, a.names) && !(len(s.Rules) == 0 && len(a.names) == 0) {
			return fmt.Errorf("a state for rules %q, this module has %q", s.Rules, a.names)
		}
		s.Rules = slices.Clone(a.names)
		if len(s.Tracks) > maxTracks {
			return fmt.Errorf("%d tracks: at most %d", len(s.Tracks), maxTracks)
		}
		if !s.Started && len(s.Tracks) > 0 {
			return fmt.Errorf("%d tracks before any frame", len(s.Tracks))
		}
		for i, tr := range s.Tracks {
			switch {
			case i > 0 && tr.ID <= s.Tracks[i-1].ID:
				return fmt.Errorf("track ids out of order or repeated (%d after %d)", tr.ID, s.Tracks[i-1].ID)
			case tr.Seen > s.Last:
				return fmt.Errorf("track %d seen at frame %d, after the last %d", tr.ID, tr.Seen, s.Last)
			case len(tr.Identity) > maxLabelLength:
				return fmt.Errorf("track %d: identity of %d bytes: at most %d", tr.ID, len(tr.Identity), maxLabelLength)
			case len(tr.Rules) != len(a.rules):
				return fmt.Errorf("track %d: state for %d rules, want %d", tr.ID, len(tr.Rules), len(a.rules))
			case !finite(tr.X, tr.Y):
				return fmt.Errorf("track %d: centre %v,%v: want finite numbers", tr.ID, tr.X, tr.Y)
			}
			for j, r := range tr.Rules {
				if r.Side < -1 || r.Side > 1 || !finite(r.X, r.Y) || r.Seq > tr.Seen {
					return fmt.Errorf("track %d: rule %s: side %d, settled at %v,%v, from frame %d (seen at %d)", tr.ID, a.names[j], r.Side, r.X, r.Y, r.Seq, tr.Seen)
				}
			}
		}
		s.Tracks = nilIfEmpty(s.Tracks)
		return nil
	})
}

func finite(fs ...float64) bool {
	for _, f := range fs {
		if math.IsNaN(f) || math.IsInf(f, 0) || math.Abs(f) > 1<<40 {
			return false
		}
	}
	return true
}

func (a *activity) ProcessFrame(stream string, seq uint64, items []*media.Item) ([]*media.Item, error) {
	if err := checkFrame("activity", stream, seq, items); err != nil {
		return nil, err
	}
	o := items[0].Derive()
	o.Frame = wholeFrame(items) // annotate after it draws on the frame
	seen := map[uint64]bool{}
	for _, it := range items {
		for _, tr := range it.Tracks {
			if !seen[tr.ID] {
				seen[tr.ID] = true
				o.Tracks = append(o.Tracks, tr)
			}
		}
	}
	sort.SliceStable(o.Tracks, func(i, j int) bool { return o.Tracks[i].ID < o.Tracks[j].ID })
	st := a.streams.get(stream, a.fresh)
	st.mu.Lock()
	defer st.mu.Unlock()
	s := &st.s
	if s.Started && seq <= s.Last {
		return []*media.Item{o}, nil
	}
	s.Started, s.Last = true, seq
	// Identities: each identity item goes to the track it overlaps best.
	ident := map[uint64]string{}
	for _, it := range items {
		if it.Region == nil || len(it.Labels) == 0 {
			continue
		}
		best, bestIoU := -1, 0.0
		for i, tr := range o.Tracks {
			if v := iouOf(tr.Box, *it.Region); v > bestIoU {
				best, bestIoU = i, v
			}
		}
		if best >= 0 {
			ident[o.Tracks[best].ID] = strings.Join(it.Labels, ",")
		}
	}
	at := items[0].Capture.UnixNano()
	for _, tr := range o.Tracks {
		if tr.Missed != 0 || tr.Box.W <= 0 || tr.Box.H <= 0 {
			continue
		}
		i := sort.Search(len(s.Tracks), func(i int) bool { return s.Tracks[i].ID >= tr.ID })
		cx, cy := float64(tr.Box.X)+float64(tr.Box.W)/2, float64(tr.Box.Y)+float64(tr.Box.H)/2
		if i == len(s.Tracks) || s.Tracks[i].ID != tr.ID {
			if len(s.Tracks) >= maxTracks {
				continue
			}
			s.Tracks = slices.Insert(s.Tracks, i, actTrack{ID: tr.ID, Seen: seq, X: cx, Y: cy, Rules: make([]actRule, len(a.rules))})
			a.start(&s.Tracks[i], seq, at)
		} else {
			o.Events = append(o.Events, a.step(&s.Tracks[i], seq, at, cx, cy)...)
		}
		if id, ok := ident[tr.ID]; ok {
			s.Tracks[i].Identity = id
		}
		for j := len(o.Events) - 1; j >= 0 && o.Events[j].Track == tr.ID; j-- {
			if id := s.Tracks[i].Identity; id != "" {
				o.Events[j].Detail = fmt.Sprintf("track %d (%s) %s", tr.ID, id, o.Events[j].Detail)
			} else {
				o.Events[j].Detail = fmt.Sprintf("track %d %s", tr.ID, o.Events[j].Detail)
			}
		}
	}
	live := s.Tracks[:0]
	for _, t := range s.Tracks {
		if seq-t.Seen <= staleTrackFrames {
			live = append(live, t)
		}
	}
	clear(s.Tracks[len(live):])
	s.Tracks = nilIfEmpty(live)
	for _, e := range o.Events {
		o.Labels = append(o.Labels, e.Kind)
	}
	return []*media.Item{o}, nil
}

// start sets a new track's episodes from its first position (no event:
// a track appearing inside a zone starts dwelling there).
func (a *activity) start(t *actTrack, seq uint64, at int64) {
	for j, r := range a.rules {
		e := &t.Rules[j]
		switch r.kind {
		case ruleLine:
			e.Side = r.side(t.X, t.Y)
		default:
			if r.inside(t.X, t.Y) {
				*e = actRule{In: true, Seq: seq, At: at, X: t.X, Y: t.Y}
			}
		}
	}
}

// step moves a known track to (cx, cy) at frame seq and returns the
// events of its episodes (Detail without the track, which the caller
// prefixes).
func (a *activity) step(t *actTrack, seq uint64, at int64, cx, cy float64) []media.Event {
	var out []media.Event
	for j, r := range a.rules {
		e := &t.Rules[j]
		switch r.kind {
		case ruleLine:
			side := r.side(cx, cy)
			if side != 0 && e.Side != 0 && side != e.Side && r.crossed(t.X, t.Y, cx, cy) {
				dir := "left-to-right"
				if side < 0 {
					dir = "right-to-left"
				}
				out = append(out, media.Event{Kind: "line-cross", Rule: r.name, Track: t.ID, Detail: "crossed line " + r.name + " " + dir})
			}
			if side != 0 {
				e.Side = side
			}
		case ruleZone, ruleLoiter:
			switch {
			case !r.inside(cx, cy):
				*e = actRule{}
			case !e.In || (r.kind == ruleLoiter && math.Hypot(cx-e.X, cy-e.Y) > r.radius):
				*e = actRule{In: true, Seq: seq, At: at, X: cx, Y: cy}
			case !e.Fired && r.elapsed(e, seq, at):
				e.Fired = true
				kind, what := "dwell", "stayed in zone "
				if r.kind == ruleLoiter {
					kind, what = "loiter", "loitered in "
				}
				out = append(out, media.Event{Kind: kind, Rule: r.name, Track: t.ID, Detail: what + r.name + " for " + r.since(e, seq, at)})
			}
		}
	}
	t.Seen, t.X, t.Y = seq, cx, cy
	return out
}

// side is which side of the line (x, y) is on: 1 right, -1 left (looking
// from the first end to the second on the image, y down), 0 on it.
func (r rule) side(x, y float64) int8 {
	c := (r.x2-r.x1)*(y-r.y1) - (r.y2-r.y1)*(x-r.x1)
	switch {
	case c > 0:
		return 1
	case c < 0:
		return -1
	}
	return 0
}

// crossed reports whether the move (ax,ay)->(bx,by) meets the segment.
func (r rule) crossed(ax, ay, bx, by float64) bool {
	orient := func(px, py, qx, qy, x, y float64) float64 { return (qx-px)*(y-py) - (qy-py)*(x-px) }
	d1, d2 := orient(ax, ay, bx, by, r.x1, r.y1), orient(ax, ay, bx, by, r.x2, r.y2)
	return (d1 <= 0 && d2 >= 0) || (d1 >= 0 && d2 <= 0)
}

func (r rule) inside(x, y float64) bool { return x >= r.x1 && x <= r.x2 && y >= r.y1 && y <= r.y2 }

// elapsed reports whether the episode e has lasted the rule's duration.
func (r rule) elapsed(e *actRule, seq uint64, at int64) bool {
	if r.frames > 0 {
		return seq-e.Seq >= r.frames
	}
	return at-e.At >= int64(r.dur)
}

func (r rule) since(e *actRule, seq uint64, at int64) string {
	if r.frames > 0 {
		return fmt.Sprintf("%d frames", seq-e.Seq)
	}
	return time.Duration(at - e.At).String()
}
