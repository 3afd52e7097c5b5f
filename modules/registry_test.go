package modules_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mdag/mdag/modules"
)

func TestRegistry(t *testing.T) {
	names := modules.Names()
	if !slices.IsSorted(names) || len(names) != len(modules.Ops()) {
		t.Fatalf("Names() = %v", names)
	}
	for _, n := range names {
		op, ok := modules.Lookup(modules.OpID(n))
		if !ok || string(op.Name) != n || op.Summary == "" {
			t.Errorf("Lookup(%s) = %+v %v", n, op, ok)
		}
	}
	if op, _ := modules.Lookup("track"); !op.Stateful {
		t.Error("track is stateful")
	}
	if _, ok := modules.Lookup("blur"); ok {
		t.Error("unknown op found")
	}
}

// TestDecode: params decode to their kinds with defaults, and every
// problem is reported by key.
func TestDecode(t *testing.T) {
	tests := []struct {
		op   modules.OpID
		raw  map[string]any
		want modules.Params
		errs []string
	}{
		{"resize", map[string]any{"width": 64, "height": 48.0}, modules.Params{"width": 64, "height": 48}, nil},
		{"resize", map[string]any{"width": -5, "height": "tall"}, nil, []string{"params.height: want an integer, got tall", "params.width: must be > 0, got -5"}},
		{"resize", nil, nil, []string{"params.height: required by op resize", "params.width: required by op resize"}},
		{"crop", nil, modules.Params{"pad": 0, "min_score": 0.0}, nil},
		{"crop", map[string]any{"classes": []any{"car", 7}}, nil, []string{"params.classes[1]: want a string, got 7"}},
		{"haar-face", map[string]any{"min_neighbors": 5}, modules.Params{"scale_factor": 1.1, "min_neighbors": 5}, nil},
		{"segment", map[string]any{"chunk": "40ms"}, modules.Params{"chunk": 40 * time.Millisecond}, nil},
		{"segment", map[string]any{"chunk": "soon"}, nil, []string{`params.chunk: want a duration like 40ms, got "soon"`}},
		{"sink", map[string]any{"x": 1}, nil, []string{`params.x: op sink takes no param "x" (known: none)`}},
		{"segment", nil, modules.Params{"chunk": 40 * time.Millisecond}, nil},
		{"segment", map[string]any{"chunk": "2m"}, nil, []string{"params.chunk: must be > 0 and at most 10s, got 2m0s"}},
		{"track", nil, modules.Params{"max_age": 15, "iou": 0.3, "min_hits": 2}, nil},
		{"track", map[string]any{"iou": 1.5, "min_hits": 0}, nil, []string{"params.iou: must be between 0 and 1", "params.min_hits: must be > 0"}},
		{"window", nil, modules.Params{"size": 8}, nil},
		{"window", map[string]any{"size": 5000}, nil, []string{"params.size: must be between 1 and 4096, got 5000"}},
		{"sequence", nil, modules.Params{"context": 16, "max_gap": 30}, nil},
		{"activity", map[string]any{"rules": []any{"line a 0,0,1,1", "zone b 0,0,1,1 dwell"}}, nil, []string{`params.rules[1]: zone: 4 words (want "zone NAME x1,y1,x2,y2 dwell DURATION")`}},
	}
	for _, tc := range tests {
		op, _ := modules.Lookup(tc.op)
		got, errs := op.Decode(tc.raw)
		var msgs []string
		for _, e := range errs {
			msgs = append(msgs, e.Error())
		}
		if len(msgs) != len(tc.errs) {
			t.Errorf("%s %v: errors %q, want %q", tc.op, tc.raw, msgs, tc.errs)
			continue
		}
		for i := range msgs {
			if !strings.HasPrefix(msgs[i], tc.errs[i]) {
				t.Errorf("%s %v: error %q, want %q", tc.op, tc.raw, msgs[i], tc.errs[i])
			}
		}
		if tc.want != nil && fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("%s %v = %v, want %v", tc.op, tc.raw, got, tc.want)
		}
	}
}

// TestRegistry refuses undeclared and duplicate ops and names what is
// missing from a binary.
func TestRegistryFactories(t *testing.T) {
	r := modules.Builtin()
	if err := r.Register("blur", nil); err == nil || !strings.Contains(err.Error(), "not a declared op") {
		t.Errorf("undeclared op registered: %v", err)
	}
	if err := r.Register("crop", func(modules.Params) (modules.Processor, error) { return nil, nil }); err == nil {
		t.Error("crop registered twice")
	}
	_, err := r.New("resize", map[string]any{"width": 2, "height": 2})
	if !errors.Is(err, modules.ErrNotImplemented) || !strings.Contains(err.Error(), "op resize: op has no implementation in this binary (implemented: activity, count, crop, place, segment, sequence, sink, text-crop, track, window)") {
		t.Errorf("resize in the builtin registry: %v", err)
	}
	if _, err := r.New("crop", map[string]any{"pad": -1}); err == nil || !strings.Contains(err.Error(), "params.pad: must be >= 0") {
		t.Errorf("bad params built: %v", err)
	}
}
