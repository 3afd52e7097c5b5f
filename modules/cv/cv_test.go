package cv

import (
	"errors"
	"strings"
	"testing"

	"github.com/mdag/mdag/ingest/synth"
	"github.com/mdag/mdag/media"
	"github.com/mdag/mdag/modules"
)

// New builds op from a registry with the builtin and OpenCV ops, as the
// full binary has.
func New(op modules.OpID, params map[string]any) (modules.Processor, error) {
	r := modules.NewRegistry()
	modules.Must(modules.RegisterBuiltin(r))
	modules.Must(Register(r))
	return r.New(op, params)
}

func frameWith(w, h int, boxes []media.Box) *media.Item {
	f := media.NewFrame(w, h)
	if err := synth.Draw(f, boxes); err != nil {
		panic(err)
	}
	return &media.Item{Stream: "s", Seq: 1, Frame: f, Boxes: boxes, Truth: boxes}
}

func TestCrop(t *testing.T) {
	boxes := []media.Box{{X: 10, Y: 10, W: 20, H: 20, Class: "car", Score: 0.9}, {X: 90, Y: 50, W: 20, H: 20, Class: "person", Score: 0.8},
		{X: 0, Y: 0, W: 5, H: 5, Class: "car", Score: 0.1}}
	tests := []struct {
		name   string
		params map[string]any
		want   []int // widths of the crops
	}{
		{"every box", nil, []int{20, 20, 5}},
		{"classes", map[string]any{"classes": []any{"car"}}, []int{20, 5}},
		{"min score", map[string]any{"min_score": 0.5}, []int{20, 20}},
		{"pad widens, clamped at the frame edge", map[string]any{"pad": 8, "classes": []any{"car"}}, []int{36, 13}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := New("crop", tc.params)
			if err != nil {
				t.Fatal(err)
			}
			out, err := p.Process(frameWith(120, 80, boxes))
			if err != nil {
				t.Fatal(err)
			}
			if len(out) != len(tc.want) {
				t.Fatalf("%d crops, want %d", len(out), len(tc.want))
			}
			for i, o := range out {
				if o.Frame.W != tc.want[i] || o.Frame.Valid() != nil || o.Region == nil || o.Seq != 1 {
					t.Errorf("crop %d: %dx%d region %v", i, o.Frame.W, o.Frame.H, o.Region)
				}
			}
		})
	}
}

func TestCountResizeHaar(t *testing.T) {
	it := frameWith(64, 48, []media.Box{{X: 1, Y: 1, W: 10, H: 10, Class: "car"}, {X: 20, Y: 20, W: 10, H: 10, Class: "car"}, {X: 40, Y: 1, W: 10, H: 10, Class: "bus"}})
	c, _ := New("count", map[string]any{"classes": []any{"car"}})
	out, err := c.Process(it)
	if err != nil || len(out) != 1 || out[0].Counts["car"] != 2 || out[0].Counts["bus"] != 0 {
		t.Fatalf("count: %v %+v", err, out)
	}
	r, err := New("resize", map[string]any{"width": 32, "height": 24})
	if err != nil {
		t.Fatal(err)
	}
	out, err = r.Process(it)
	if err != nil || out[0].Frame.W != 32 || out[0].Frame.H != 24 || out[0].Boxes[1].X != 10 {
		t.Fatalf("resize: %v %+v", err, out[0].Boxes)
	}
	h, err := New("haar-face", nil)
	if err != nil {
		t.Fatalf("haar-face: %v", err)
	}
	defer h.Close()
	out, err = h.Process(it)
	if err != nil || len(out) != 1 || len(out[0].Boxes) != 0 {
		t.Fatalf("haar on shapes: %v %+v", err, out)
	}
}

func TestNewErrors(t *testing.T) {
	tests := []struct {
		op     modules.OpID
		params map[string]any
		is     error
		msg    string
	}{
		{"warp", nil, nil, `unknown op "warp"`},
		{"resize", map[string]any{"width": 0, "height": 10}, nil, "op resize: params.width: must be > 0, got 0"},
		{"crop", map[string]any{"pad": "x"}, nil, "op crop: params.pad: want an integer, got x"},
		{"crop", map[string]any{"classes": []any{1}}, nil, "op crop: params.classes[0]: want a string, got 1"},
		{"haar-face", map[string]any{"cascade": "/nonexistent.xml"}, nil, "haar-face: cascade /nonexistent.xml"},
		{"haar-face", map[string]any{"scale_factor": 1.0}, nil, "op haar-face: params.scale_factor: must be > 1, got 1"},
		{"hog-people", map[string]any{"scale": 1}, nil, "op hog-people: params.scale: must be > 1, got 1"},
		{"hog-people", map[string]any{"width": 32}, nil, "op hog-people: params.width: must be 0 or >= 64, got 32"},
		{"hog-people", map[string]any{"min_score": 2}, nil, "op hog-people: params.min_score: must be between 0 and 1, got 2"},
		{"motion", map[string]any{"drop_still": true}, nil, "op motion: params.drop_still: want an integer, got true"},
		{"motion", map[string]any{"drop_still": 2}, nil, "op motion: params.drop_still: must be 0 (off) or 1 (on), got 2"},
		{"motion", map[string]any{"min_area": 1}, nil, "op motion: params.min_area: must be > 0 and < 1, got 1"},
		{"motion", map[string]any{"warmup": 0}, nil, "op motion: params.warmup: must be > 0, got 0"},
		{"annotate", map[string]any{"thickness": 0, "labels": "yes"}, nil, "op annotate: params.labels: want an integer, got yes; params.thickness: must be between 1 and 32, got 0"},
		{"letterbox", map[string]any{"pad": 256}, nil, "op letterbox: params.pad: must be between 0 and 255, got 256"},
		{"letterbox", map[string]any{"width": 0}, nil, "op letterbox: params.width: must be between 1 and 16384, got 0"},
	}
	for _, tc := range tests {
		_, err := New(tc.op, tc.params)
		if err == nil || (tc.is != nil && !errors.Is(err, tc.is)) || !contains(err.Error(), tc.msg) {
			t.Errorf("New(%s, %v) = %v, want %q", tc.op, tc.params, err, tc.msg)
		}
	}
	c, _ := New("crop", nil)
	if _, err := c.Process(&media.Item{Frame: &media.Frame{W: 4, H: 4, Pix: make([]byte, 3)}}); err == nil {
		t.Error("crop accepted a frame with a short pixel buffer")
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }
