package registry

import (
	"os"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
)

// withMetadata appends metadata_props (ModelProto field 14) to a model:
// fields of a message may come in any order, so the result is the model
// an exporter that writes them would have made.
func withMetadata(model []byte, props ...Prop) []byte {
	out := slices.Clone(model)
	for _, p := range props {
		var e []byte
		e = protowire.AppendTag(e, 1, protowire.BytesType)
		e = protowire.AppendString(e, p.Key)
		e = protowire.AppendTag(e, 2, protowire.BytesType)
		e = protowire.AppendString(e, p.Value)
		out = protowire.AppendTag(out, 14, protowire.BytesType)
		out = protowire.AppendBytes(out, e)
	}
	return out
}

// ParseGraph reads the opset, the producer and metadata_props, and an
// Ultralytics export's metadata becomes its names, input size and task.
func TestParseGraphMetadata(t *testing.T) {
	b, err := os.ReadFile("../decode/testdata/heads/yolov8.onnx")
	if err != nil {
		t.Fatal(err)
	}
	g, err := ParseGraph(b)
	if err != nil {
		t.Fatal(err)
	}
	if want := []Opset{{"", 13}}; !slices.Equal(g.Opsets, want) || g.Opset() != 13 {
		t.Errorf("opsets %v (opset %d), want %v", g.Opsets, g.Opset(), want)
	}
	if g.Producer != "mdag tools/models/heads.py" || g.IRVersion != 8 || len(g.Metadata) != 0 {
		t.Errorf("producer %q, ir_version %d, metadata %v", g.Producer, g.IRVersion, g.Metadata)
	}
	if _, ok, _ := g.Ultralytics(); ok {
		t.Error("a model without metadata read as an Ultralytics export")
	}
	props := []Prop{{"description", "Ultralytics YOLOv8n model"}, {"author", "Ultralytics"}, {"stride", "32"}, {"task", "detect"},
		{"batch", "1"}, {"imgsz", "[48, 64]"}, {"names", `{0: 'person', 2: "men's bag", 1: 'traffic light'}`}}
	g, err = ParseGraph(withMetadata(b, props...))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(g.Metadata, props) {
		t.Errorf("metadata %v, want %v", g.Metadata, props)
	}
	if v, ok := g.Meta("task"); !ok || v != "detect" {
		t.Errorf("Meta(task) = %q %v", v, ok)
	}
	u, ok, err := g.Ultralytics()
	if !ok || err != nil {
		t.Fatalf("Ultralytics: %v %v", ok, err)
	}
	want := Ultralytics{Names: []string{"person", "traffic light", "men's bag"}, Height: 48, Width: 64, Stride: 32, Task: "detect", Batch: 1}
	if !slices.Equal(u.Names, want.Names) || u.Height != want.Height || u.Width != want.Width || u.Stride != want.Stride || u.Task != want.Task || u.Batch != want.Batch {
		t.Errorf("Ultralytics %+v, want %+v", u, want)
	}
	g, err = ParseGraph(withMetadata(b, Prop{"author", "Ultralytics"}, Prop{"names", "{0: 'a', 2: 'c'}"}, Prop{"imgsz", "[a]"}))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok, err := g.Ultralytics(); !ok || err == nil || !strings.Contains(err.Error(), "1 is missing") || !strings.Contains(err.Error(), "imgsz") {
		t.Errorf("bad names and imgsz: %v %v", ok, err)
	}
}

func TestPythonNames(t *testing.T) {
	for _, c := range []struct {
		in   string
		want []string
		err  string
	}{
		{"{0: 'person', 1: 'bicycle'}", []string{"person", "bicycle"}, ""},
		{"{}", []string{}, ""},
		{"['a', \"b\\\"c\", 'd\\x41']", []string{"a", `b"c`, "dA"}, ""},
		{"{0: 'a',}", []string{"a"}, ""},
		{"{0: 'a', 0: 'b'}", nil, "given twice"},
		{"{0: 'a'", nil, "want , or }"},
		{"{0: 'a', ", nil, "want a class index"},
		{"{0 'a'}", nil, "want :"},
		{"person", nil, "want a dict"},
		{"['a'] x", nil, "trailing text"},
		{"['a", nil, "unterminated"},
	} {
		got, err := PythonNames(c.in)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%q: %v %v, want error %q", c.in, got, err, c.err)
			}
			continue
		}
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("%q: %q %v, want %q", c.in, got, err, c.want)
		}
	}
}
