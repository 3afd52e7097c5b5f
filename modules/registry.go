// Package modules declares the CPU operations that mDAG applications name
// with `op:` and how the runtime builds them. It is pure Go (it imports
// media only), so the planners, `mdag validate` and the lean binary know
// every op without linking OpenCV.
//
// Three things make an op's contract, all here:
//   - its declaration (Ops, Lookup): name, summary, whether it keeps
//     per-stream state, and its params, each with a kind, a default and a
//     range check;
//   - Decode, which turns the YAML's `params:` into typed Params and reports
//     every problem by field (`params.width: must be > 0`); `mdag validate`
//     runs it, so what validates also builds;
//   - a Registry of factories (Processor constructors) that the binary fills
//     explicitly: RegisterBuiltin adds the pure-Go ops (crop, text-crop,
//     place, count, sink and the stateful track, window, sequence, activity and segment),
//     modules/cv adds the OpenCV ones (resize, haar-face, hog-people,
//     motion, annotate, letterbox). A worker builds
//     processors only from its registry and refuses an op it lacks by name.
//
// The processor of every op declared Stateful implements Stateful
// (state.go): per-stream state behind a lock, frames of a stream in seq
// order through ProcessFrame, and versioned snapshots (EncodeState) that
// Restore validates, so the runtime can move a stream's state between
// instances. Each op's file documents what it keeps and emits.
package modules

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"time"
)

// OpID names a CPU operation.
type OpID string

// Op declares one CPU operation.
type Op struct {
	Name     OpID
	Summary  string
	Stateful bool    // keeps per-stream state across frames (a tracker, a window)
	Params   []Param // accepted keys under `params:`
}

// ParamNames lists the op's param keys in declaration order.
func (o Op) ParamNames() []string {
	out := make([]string, len(o.Params))
	for i, p := range o.Params {
		out[i] = p.Name
	}
	return out
}

// Kind is the type of a param's value.
type Kind int

// Param kinds.
const (
	Int      Kind = iota // a whole number
	Number               // any number
	String               // a string
	Strings              // a list of strings
	Duration             // a Go duration string ("40ms") or a number of seconds
)

func (k Kind) String() string {
	return [...]string{"an integer", "a number", "a string", "a list of strings", "a duration"}[k]
}

// Param declares one key under `params:`.
type Param struct {
	Name     string
	Kind     Kind
	Required bool
	Default  any               // used when absent (int, float64, string, []string or time.Duration); nil: none
	Check    func(v any) error // range check on the decoded value; nil: any value of the kind
	Doc      string
}

var declared = []Op{
	{Name: "resize", Summary: "scale a frame to width x height", Params: []Param{
		{Name: "width", Kind: Int, Required: true, Check: positive, Doc: "output width in pixels"},
		{Name: "height", Kind: Int, Required: true, Check: positive, Doc: "output height in pixels"}}},
	{Name: "crop", Summary: "cut one item per detection box out of the frame (fan-out)", Params: []Param{
		{Name: "pad", Kind: Int, Default: 0, Check: nonNegative, Doc: "pixels added around each box"},
		{Name: "classes", Kind: Strings, Doc: "only boxes of these classes (default: all)"},
		{Name: "min_score", Kind: Number, Default: 0.0, Check: unit, Doc: "only boxes scoring at least this"}}},
	{Name: "text-crop", Summary: "cut one text line per detection box out of the frame, scaled to height keeping its aspect and padded to width (a text recogniser's input; fan-out)", Params: []Param{
		{Name: "width", Kind: Int, Default: 320, Check: between(8, 4096), Doc: "width of every crop: the text scaled to height, left-aligned, the rest filled (a wider line is squeezed); PP-OCR rec: 320"},
		{Name: "height", Kind: Int, Default: 48, Check: between(8, 1024), Doc: "height every line is scaled to (PP-OCRv3/v4 rec: 48)"},
		{Name: "fill", Kind: Int, Default: 128, Check: between(0, 255), Doc: "grey value of the padding (128: PP-OCR's 0 after its normalisation)"},
		{Name: "pad", Kind: Int, Default: 0, Check: nonNegative, Doc: "pixels added around each box before scaling"},
		{Name: "classes", Kind: Strings, Doc: "only boxes of these classes (default: all)"},
		{Name: "min_score", Kind: Number, Default: 0.0, Check: unit, Doc: "only boxes scoring at least this"}}},
	{Name: "place", Summary: "put a crop's result back onto the frame: one box, the crop's region, classed by its first label (the text a recogniser read) and scored by its first box's score"},
	{Name: "haar-face", Summary: "detect faces with an OpenCV Haar cascade", Params: []Param{
		{Name: "cascade", Kind: String, Doc: "cascade XML file (default: Debian's frontal-face cascade)"},
		{Name: "scale_factor", Kind: Number, Default: 1.1, Check: above(1), Doc: "image pyramid step, > 1"},
		{Name: "min_neighbors", Kind: Int, Default: 3, Check: nonNegative, Doc: "detections needed to keep a face"}}},
	// The vision ops of issue 23 (modules/cv implements them).
	{Name: "hog-people", Summary: "detect people with OpenCV's HOG people detector (boxes of class person)", Params: []Param{
		{Name: "scale", Kind: Number, Default: 1.05, Check: above(1), Doc: "image pyramid step, > 1 (larger: faster, misses more)"},
		{Name: "hit_threshold", Kind: Number, Default: 0.0, Doc: "SVM margin a window needs; higher: fewer, surer detections (may be negative)"},
		{Name: "width", Kind: Int, Default: 640, Check: zeroOrAtLeast(64),
			Doc: "frames wider than this are downscaled to it before detection (boxes scaled back); 0: never; else >= 64, the detection window's width"},
		{Name: "min_score", Kind: Number, Default: 0.0, Check: unit,
			Doc: "only people scoring at least this (the score is the logistic of the SVM margin: 0.5 at hit_threshold 0's boundary)"}}},
	{Name: "motion", Summary: "moving regions by background subtraction (OpenCV MOG2), one model per stream; a snapshot cannot hold the model: a restored stream relearns it for warmup frames", Stateful: true, Params: []Param{
		{Name: "min_area", Kind: Number, Default: 0.002, Check: unitOpen, Doc: "smallest region reported, as a fraction of the frame (0..1)"},
		{Name: "drop_still", Kind: Int, Default: 0, Check: flag,
			Doc: "1: a frame with no motion after the warm-up goes no further (nothing is emitted); 0: it is emitted with no boxes"},
		{Name: "warmup", Kind: Int, Default: 5, Check: positive,
			Doc: "frames the background model learns before reporting (at a stream's start, after a size change and after a restore)"},
		{Name: "class", Kind: String, Doc: "class of every region (default: person when taller than wide, else car)"}}},
	{Name: "annotate", Summary: "draw the item's boxes, labels, tracks and events onto a copy of its frame", Params: []Param{
		{Name: "thickness", Kind: Int, Default: 2, Check: between(1, 32), Doc: "line thickness in pixels (1..32)"},
		{Name: "labels", Kind: Int, Default: 1, Check: flag, Doc: "1: write class, score, track ids, labels and events as text; 0: outlines only"}}},
	{Name: "letterbox", Summary: "scale a frame into width x height keeping its aspect, padding the rest (YOLO input)", Params: []Param{
		{Name: "width", Kind: Int, Default: 640, Check: between(1, 16384), Doc: "output width in pixels"},
		{Name: "height", Kind: Int, Default: 640, Check: between(1, 16384), Doc: "output height in pixels"},
		{Name: "pad", Kind: Int, Default: 114, Check: between(0, 255), Doc: "grey value of the padding (0..255; 114 is YOLO's)"}}},
	{Name: "count", Summary: "count items per frame by class", Params: []Param{
		{Name: "classes", Kind: Strings, Doc: "only these classes (default: all)"}}},
	{Name: "track", Summary: "associate detections across frames into tracks", Stateful: true, Params: []Param{
		{Name: "max_age", Kind: Int, Default: 15, Check: positive, Doc: "frames a track survives unmatched (dropped frames count)"},
		{Name: "iou", Kind: Number, Default: 0.3, Check: unit, Doc: "overlap (IoU) needed to match a detection to a track"},
		{Name: "min_hits", Kind: Int, Default: 2, Check: positive, Doc: "matches before a track is reported"}}},
	{Name: "window", Summary: "keep the last N items of a stream and emit them together", Stateful: true, Params: []Param{
		{Name: "size", Kind: Int, Default: 8, Check: between(1, maxSteps), Doc: "items per window"}}},
	{Name: "sequence", Summary: "restore frame order and keep per-stream context", Stateful: true, Params: []Param{
		{Name: "context", Kind: Int, Default: 16, Check: between(1, maxSteps), Doc: "frames of context kept"},
		{Name: "max_gap", Kind: Int, Default: 30, Check: nonNegative, Doc: "frames missing in a row after which the context restarts"}}},
	{Name: "activity", Summary: "match tracks and identities against activity rules", Stateful: true, Params: []Param{
		{Name: "rules", Kind: Strings, Check: checkRules, Doc: "rules: `line NAME x1,y1,x2,y2`, `zone NAME x1,y1,x2,y2 dwell DURATION`, `loiter NAME x1,y1,x2,y2 DURATION [radius PIXELS]` (DURATION: 5s or 150f frames)"}}},
	{Name: "segment", Summary: "cut an audio stream into fixed-length chunks", Stateful: true, Params: []Param{
		{Name: "chunk", Kind: Duration, Default: 40 * time.Millisecond, Check: durationUpTo(10 * time.Second), Doc: "chunk length, at most 10 s (a whole number of samples at the audio's rate; a chunk crosses the wire in one message)"}}},
	{Name: "sink", Summary: "deliver results to the client"},
}

// Lookup returns the declaration of the op with the given name.
func Lookup(name OpID) (Op, bool) {
	i := slices.IndexFunc(declared, func(o Op) bool { return o.Name == name })
	if i < 0 {
		return Op{}, false
	}
	return declared[i], true
}

// Names lists every declared op, sorted.
func Names() []string {
	out := make([]string, len(declared))
	for i, o := range declared {
		out[i] = string(o.Name)
	}
	sort.Strings(out)
	return out
}

// Ops returns a copy of the declarations, sorted by name.
func Ops() []Op {
	out := slices.Clone(declared)
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Params are an op's decoded params: every declared key with a value or a
// default, as int, float64, string, []string or time.Duration by kind.
type Params map[string]any

// Int returns an Int param (0 when absent without default).
func (p Params) Int(k string) int { v, _ := p[k].(int); return v }

// Float returns a Number param.
func (p Params) Float(k string) float64 { v, _ := p[k].(float64); return v }

// String returns a String param.
func (p Params) String(k string) string { v, _ := p[k].(string); return v }

// Strings returns a Strings param.
func (p Params) Strings(k string) []string { v, _ := p[k].([]string); return v }

// Duration returns a Duration param.
func (p Params) Duration(k string) time.Duration { v, _ := p[k].(time.Duration); return v }

// ParamError is one problem with one param: Key is the path below
// `params` ("width", "classes[1]").
type ParamError struct {
	Key string
	Msg string
}

func (e ParamError) Error() string { return "params." + e.Key + ": " + e.Msg }

// Decode checks raw (the YAML's `params:` map) against the op's
// declaration and returns the typed params and every problem, sorted by key:
// unknown keys, missing required ones, values of the wrong kind and values
// out of range.
func (o Op) Decode(raw map[string]any) (Params, []ParamError) {
	out := Params{}
	var errs []ParamError
	for _, k := range sortedKeys(raw) {
		if !slices.ContainsFunc(o.Params, func(p Param) bool { return p.Name == k }) {
			known := "none"
			if len(o.Params) > 0 {
				known = strings.Join(o.ParamNames(), ", ")
			}
			errs = append(errs, ParamError{k, fmt.Sprintf("op %s takes no param %q (known: %s)", o.Name, k, known)})
		}
	}
	for _, p := range o.Params {
		v, ok := raw[p.Name]
		if !ok {
			if p.Required {
				errs = append(errs, ParamError{p.Name, fmt.Sprintf("required by op %s: %s", o.Name, p.Doc)})
			} else if p.Default != nil {
				out[p.Name] = p.Default
			}
			continue
		}
		d, err := decodeValue(p, v)
		if err == nil && p.Check != nil {
			err = p.Check(d)
		}
		if err != nil {
			if pe, ok := err.(ParamError); ok { // an element of a list
				errs = append(errs, ParamError{p.Name + pe.Key, pe.Msg})
			} else {
				errs = append(errs, ParamError{p.Name, err.Error()})
			}
			continue
		}
		out[p.Name] = d
	}
	sort.SliceStable(errs, func(i, j int) bool { return errs[i].Key < errs[j].Key })
	return out, errs
}

// DecodeParams decodes op's params into one error (all problems joined), or
// says the op is unknown.
func DecodeParams(op OpID, raw map[string]any) (Params, error) {
	o, ok := Lookup(op)
	if !ok {
		return nil, fmt.Errorf("unknown op %q (known: %s)", op, strings.Join(Names(), ", "))
	}
	p, errs := o.Decode(raw)
	if len(errs) > 0 {
		msgs := make([]string, len(errs))
		for i, e := range errs {
			msgs[i] = e.Error()
		}
		return nil, fmt.Errorf("op %s: %s", op, strings.Join(msgs, "; "))
	}
	return p, nil
}

func decodeValue(p Param, v any) (any, error) {
	switch p.Kind {
	case Int:
		switch x := v.(type) {
		case int:
			return x, nil
		case int64:
			return int(x), nil
		case float64:
			if x == float64(int(x)) {
				return int(x), nil
			}
		}
	case Number:
		switch x := v.(type) {
		case int:
			return float64(x), nil
		case int64:
			return float64(x), nil
		case float64:
			if math.IsNaN(x) || math.IsInf(x, 0) {
				return nil, fmt.Errorf("want a finite number, got %v", x)
			}
			return x, nil
		}
	case String:
		if s, ok := v.(string); ok {
			return s, nil
		}
	case Strings:
		switch x := v.(type) {
		case []string:
			return slices.Clone(x), nil
		case []any:
			out := make([]string, len(x))
			for i, e := range x {
				s, ok := e.(string)
				if !ok {
					return nil, ParamError{fmt.Sprintf("[%d]", i), fmt.Sprintf("want a string, got %v", e)}
				}
				out[i] = s
			}
			return out, nil
		}
	case Duration:
		switch x := v.(type) {
		case string:
			d, err := time.ParseDuration(x)
			if err != nil {
				return nil, fmt.Errorf("want a duration like 40ms, got %q", x)
			}
			return d, nil
		case time.Duration:
			return x, nil
		case int:
			if x > math.MaxInt64/int(time.Second) || x < math.MinInt64/int(time.Second) {
				return nil, fmt.Errorf("%d seconds is out of range", x)
			}
			return time.Duration(x) * time.Second, nil
		case float64:
			if math.IsNaN(x) || math.Abs(x) > float64(math.MaxInt64/int64(time.Second)) {
				return nil, fmt.Errorf("%v seconds is out of range", x)
			}
			return time.Duration(x * float64(time.Second)), nil
		}
	}
	return nil, fmt.Errorf("want %s, got %v", p.Kind, v)
}

func sortedKeys(m map[string]any) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func positive(v any) error {
	if asFloat(v) <= 0 {
		return fmt.Errorf("must be > 0, got %v", v)
	}
	return nil
}

func nonNegative(v any) error {
	if asFloat(v) < 0 {
		return fmt.Errorf("must be >= 0, got %v", v)
	}
	return nil
}

func unit(v any) error {
	if f := asFloat(v); f < 0 || f > 1 {
		return fmt.Errorf("must be between 0 and 1, got %v", v)
	}
	return nil
}

func durationUpTo(hi time.Duration) func(any) error {
	return func(v any) error {
		if d, _ := v.(time.Duration); d <= 0 || d > hi {
			return fmt.Errorf("must be > 0 and at most %v, got %v", hi, v)
		}
		return nil
	}
}

func above(lo float64) func(any) error {
	return func(v any) error {
		if asFloat(v) <= lo {
			return fmt.Errorf("must be > %g, got %v", lo, v)
		}
		return nil
	}
}

func asFloat(v any) float64 {
	switch x := v.(type) {
	case int:
		return float64(x)
	case float64:
		return x
	case time.Duration:
		return float64(x)
	}
	return 0
}

// flag accepts 0 (off) and 1 (on): the params that switch something.
func flag(v any) error {
	if f := asFloat(v); f != 0 && f != 1 {
		return fmt.Errorf("must be 0 (off) or 1 (on), got %v", v)
	}
	return nil
}

func between(lo, hi float64) func(any) error {
	return func(v any) error {
		if f := asFloat(v); f < lo || f > hi {
			return fmt.Errorf("must be between %g and %g, got %v", lo, hi, v)
		}
		return nil
	}
}

// unitOpen accepts a fraction strictly between 0 and 1.
func unitOpen(v any) error {
	if f := asFloat(v); f <= 0 || f >= 1 {
		return fmt.Errorf("must be > 0 and < 1, got %v", v)
	}
	return nil
}

func zeroOrAtLeast(lo float64) func(any) error {
	return func(v any) error {
		if f := asFloat(v); f != 0 && f < lo {
			return fmt.Errorf("must be 0 or >= %g, got %v", lo, v)
		}
		return nil
	}
}
