package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/mdag/mdag/gpu/registry"
)

const headsDir = "../../gpu/decode/testdata/heads"

// inspectJSON runs `mdag models inspect ARGS -o json` in-process.
func inspectJSON(t *testing.T, args ...string) inspection {
	t.Helper()
	var out, errb bytes.Buffer
	if code := run(append([]string{"models", "inspect", "-o", "json"}, args...), &out, &errb); code != exitOK {
		t.Fatalf("models inspect %s: exit %d\n%s", strings.Join(args, " "), code, errb.String())
	}
	var ins inspection
	if err := json.Unmarshal(out.Bytes(), &ins); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	return ins
}

// checkProposal loads the proposed YAML as the registry would (from a
// models.yaml in dir) and checks the entry against the graph.
func checkProposal(t *testing.T, ins inspection, dir, file string) *registry.Model {
	t.Helper()
	yml := filepath.Join(dir, "models.yaml")
	if err := os.WriteFile(yml, []byte(ins.Entry.YAML), 0o644); err != nil {
		t.Fatal(err)
	}
	reg, err := registry.Load(yml)
	if err != nil {
		t.Fatalf("the proposed entry does not load: %v\n%s", err, ins.Entry.YAML)
	}
	m, err := reg.Get(ins.Entry.Name)
	if err != nil {
		t.Fatal(err)
	}
	g, err := registry.ReadGraph(m.Path)
	if err != nil {
		t.Fatalf("the entry's file: %v", err)
	}
	if abs, _ := filepath.Abs(file); m.Path != abs && filepath.Clean(m.Path) != filepath.Clean(file) {
		if a, _ := filepath.Abs(m.Path); a != abs {
			t.Errorf("the entry's file is %s, want %s", m.Path, file)
		}
	}
	if err := m.Check(g); err != nil {
		t.Fatalf("the proposed entry does not pass Check: %v\n%s", err, ins.Entry.YAML)
	}
	if err := reg.CheckFiles(); err != nil {
		t.Fatalf("CheckFiles: %v", err)
	}
	if ins.Entry.Check != "ok" {
		t.Errorf("inspect's own check: %s", ins.Entry.Check)
	}
	return m
}

// TestModelsInspectHeads: on each generated head (tools/models/heads.py,
// gpu/decode/testdata/heads), inspect proposes the decoder and format the
// head is, and an entry the registry loads and Check passes against the
// graph, written relative to --dir.
func TestModelsInspectHeads(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(headsDir, "heads.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Cases []struct {
			Name, File, Decoder, Format string
			Input                       struct{ W, H int }
		}
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, tc := range d.Cases {
		if seen[tc.File] {
			continue // the yolo alias: yolov5.onnx again
		}
		seen[tc.File] = true
		t.Run(tc.Name, func(t *testing.T) {
			dir := t.TempDir()
			file := filepath.Join(headsDir, tc.File)
			ins := inspectJSON(t, file, "--dir", dir, "--name", "head")
			if !ins.Decoder.OK || ins.Decoder.Name != tc.Decoder || ins.Decoder.Format != tc.Format {
				t.Fatalf("decoder %+v, want %s %s", ins.Decoder, tc.Decoder, tc.Format)
			}
			if len(ins.Opset) != 1 || ins.Opset[0].Version != 13 || len(ins.Inputs) != 1 || ins.Inputs[0].Shape[0] != "N" {
				t.Errorf("opset %v, inputs %v", ins.Opset, ins.Inputs)
			}
			m := checkProposal(t, ins, dir, file)
			in := m.Input
			if in.Name != "input" || in.Layout != "NCHW" || in.Width != tc.Input.W || in.Height != tc.Input.H || m.MaxBatch != 8 {
				t.Errorf("input %+v max_batch %d, want input NCHW %dx%d, max_batch 8", in, m.MaxBatch, tc.Input.W, tc.Input.H)
			}
			if m.Decoder.Name != tc.Decoder || m.Decoder.Format != tc.Format {
				t.Errorf("entry's decoder %+v", m.Decoder)
			}
			if !strings.Contains(ins.Entry.YAML, "# decoder proposed from the outputs' shapes: ") {
				t.Errorf("no why comment:\n%s", ins.Entry.YAML)
			}
		})
	}
}

// appendMetadata adds metadata_props (ModelProto field 14) to a model.
func appendMetadata(model []byte, kv ...string) []byte {
	out := slices.Clone(model)
	for i := 0; i+1 < len(kv); i += 2 {
		var e []byte
		e = protowire.AppendTag(e, 1, protowire.BytesType)
		e = protowire.AppendString(e, kv[i])
		e = protowire.AppendTag(e, 2, protowire.BytesType)
		e = protowire.AppendString(e, kv[i+1])
		out = protowire.AppendTag(out, 14, protowire.BytesType)
		out = protowire.AppendBytes(out, e)
	}
	return out
}

// TestModelsInspectUltralytics: an Ultralytics export's metadata names
// become the labels file beside the YAML and the entry's labels, its
// preprocessing is Ultralytics' (1/255, RGB, letterbox), and a names
// count that does not fit the head is said, not used.
func TestModelsInspectUltralytics(t *testing.T) {
	src, err := os.ReadFile(filepath.Join(headsDir, "yolov8.onnx")) // [N,7,K]: 3 classes
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	file := filepath.Join(dir, "models", "yolo11n.onnx")
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		t.Fatal(err)
	}
	meta := []string{"author", "Ultralytics", "task", "detect", "stride", "32", "batch", "1", "imgsz", "[64, 64]",
		"names", "{0: 'person', 1: 'traffic light', 2: \"men's bag\"}"}
	if err := os.WriteFile(file, appendMetadata(src, meta...), 0o644); err != nil {
		t.Fatal(err)
	}
	ins := inspectJSON(t, file, "--dir", dir)
	if ins.Entry.Name != "yolo11n" || ins.Family != "Ultralytics" || ins.Metadata["task"] != "detect" {
		t.Errorf("name %q, family %q, metadata %v", ins.Entry.Name, ins.Family, ins.Metadata)
	}
	want := []string{"person", "traffic light", "men's bag"}
	if !slices.Equal(ins.Labels, want) {
		t.Errorf("labels %q, want %q", ins.Labels, want)
	}
	m := checkProposal(t, ins, dir, file)
	if !slices.Equal(m.Labels, want) || m.Decoder.Labels != "yolo11n.labels" || m.File != "models/yolo11n.onnx" {
		t.Errorf("entry labels %q from %q, file %q", m.Labels, m.Decoder.Labels, m.File)
	}
	if in := m.Input; in.Scale != 1.0/255 || in.Colour != "rgb" || in.Resize != "letterbox" || m.Decoder.Threshold != 0.25 {
		t.Errorf("input %+v threshold %g, want Ultralytics' 1/255 rgb letterbox, 0.25", in, m.Decoder.Threshold)
	}

	// the text report names what it read and wrote
	var out, errb bytes.Buffer
	if code := run([]string{"models", "inspect", file, "--dir", dir}, &out, &errb); code != exitOK {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	for _, w := range []string{"opset ai.onnx v13", "output0                  float32[N,7,84]  (symbolic: N)", "names: 3 classes: person, traffic light, men's bag",
		"decoder: boxes (format yolov8): ", "labels: 3 class names written to", "entry: passes the registry's checks", "decoder: {name: boxes, format: yolov8, threshold: 0.25, labels: yolo11n.labels}"} {
		if !strings.Contains(out.String(), w) {
			t.Errorf("text output lacks %q:\n%s", w, out.String())
		}
	}

	// two names for three classes: said, and no labels
	if err := os.WriteFile(file, appendMetadata(src, "author", "Ultralytics", "names", "{0: 'a', 1: 'b'}"), 0o644); err != nil {
		t.Fatal(err)
	}
	ins = inspectJSON(t, file, "--dir", t.TempDir(), "--name", "two")
	if ins.Entry.LabelsFile != "" || ins.Entry.Model.Decoder.Labels != "" || !strings.Contains(strings.Join(ins.Notes, "\n"), "class names do not fit the outputs") {
		t.Errorf("mismatched names: labels file %q, notes %q", ins.Entry.LabelsFile, ins.Notes)
	}
}

// onnxModel is a serialized ModelProto with the inputs and outputs given
// (name, dims; a negative dim is symbolic "N"), float32, opset 17, no
// nodes: enough for ReadGraph.
func onnxModel(ios ...[]any) []byte {
	vi := func(name string, dims []int64) []byte {
		var shape []byte
		for _, d := range dims {
			var dim []byte
			if d < 0 {
				dim = protowire.AppendTag(dim, 2, protowire.BytesType)
				dim = protowire.AppendString(dim, "N")
			} else {
				dim = protowire.AppendTag(dim, 1, protowire.VarintType)
				dim = protowire.AppendVarint(dim, uint64(d))
			}
			shape = protowire.AppendTag(shape, 1, protowire.BytesType)
			shape = protowire.AppendBytes(shape, dim)
		}
		var tt []byte
		tt = protowire.AppendTag(tt, 1, protowire.VarintType)
		tt = protowire.AppendVarint(tt, 1)
		tt = protowire.AppendTag(tt, 2, protowire.BytesType)
		tt = protowire.AppendBytes(tt, shape)
		var typ []byte
		typ = protowire.AppendTag(typ, 1, protowire.BytesType)
		typ = protowire.AppendBytes(typ, tt)
		var v []byte
		v = protowire.AppendTag(v, 1, protowire.BytesType)
		v = protowire.AppendString(v, name)
		v = protowire.AppendTag(v, 2, protowire.BytesType)
		return protowire.AppendBytes(v, typ)
	}
	var g []byte
	for _, io := range ios {
		num := protowire.Number(11)
		if io[0].(string) == "out" {
			num = 12
		}
		g = protowire.AppendTag(g, num, protowire.BytesType)
		g = protowire.AppendBytes(g, vi(io[1].(string), io[2].([]int64)))
	}
	var m []byte
	m = protowire.AppendTag(m, 1, protowire.VarintType)
	m = protowire.AppendVarint(m, 8)
	var op []byte
	op = protowire.AppendTag(op, 2, protowire.VarintType)
	op = protowire.AppendVarint(op, 17)
	m = protowire.AppendTag(m, 8, protowire.BytesType)
	m = protowire.AppendBytes(m, op)
	m = protowire.AppendTag(m, 7, protowire.BytesType)
	return protowire.AppendBytes(m, g)
}

// TestModelsInspectNoDecoder: outputs no rule reads are said plainly, in
// the report, the JSON and as a comment where the decoder would be; NHWC
// with a symbolic size and a fixed batch are proposed as well as they can be.
func TestModelsInspectNoDecoder(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "seg.onnx")
	model := onnxModel([]any{"in", "pixel_values", []int64{1, -1, -1, 3}}, []any{"out", "masks", []int64{1, 7, 7, 7}})
	if err := os.WriteFile(file, model, 0o644); err != nil {
		t.Fatal(err)
	}
	ins := inspectJSON(t, file, "--dir", dir)
	if ins.Decoder.OK || !strings.Contains(ins.Decoder.Why, "no known head has outputs") || !strings.HasPrefix(ins.Entry.Check, "no decoder") {
		t.Errorf("decoder %+v, check %q", ins.Decoder, ins.Entry.Check)
	}
	m := ins.Entry.Model
	if m.Input.Layout != "NHWC" || m.Input.Width != 640 || m.MaxBatch != 1 || ins.Opset[0].Version != 17 {
		t.Errorf("input %+v max_batch %d opset %v", m.Input, m.MaxBatch, ins.Opset)
	}
	if !strings.Contains(ins.Entry.YAML, "# NO DECODER PROPOSED: no known head has outputs") {
		t.Errorf("YAML:\n%s", ins.Entry.YAML)
	}
	var out, errb bytes.Buffer
	if code := run([]string{"models", "inspect", file}, &out, &errb); code != exitOK || !strings.Contains(out.String(), "decoder: cannot infer one: no known head has outputs ['masks' [7,7,7]]") ||
		!strings.Contains(out.String(), "its size is symbolic; 640x640 is proposed") {
		t.Errorf("exit %d:\n%s%s", code, out.String(), errb.String())
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"models", "inspect"}, "want one model file"},
		{[]string{"models", "inspect", file, "-o", "xml"}, `-o "xml"`},
		{[]string{"models", "inspect", "/nonexistent.onnx"}, "no such file"},
		{[]string{"models", "list"}, `unknown subcommand "list"`},
		{[]string{"models", "inspect", file, "--name", "a b"}, `--name "a b"`},
	} {
		var out, errb bytes.Buffer
		if code := run(c.args, &out, &errb); code != exitInvalid || !strings.Contains(errb.String(), c.want) {
			t.Errorf("%q: exit %d, %q, want %q", c.args, code, errb.String(), c.want)
		}
	}
}

// TestModelsInspectFlags: every problem with the flags and the arguments
// at once, counted; flags before, between and after the file.
func TestModelsInspectFlags(t *testing.T) {
	var out, errb bytes.Buffer
	code := run([]string{"models", "inspect", "a.onnx", "-o", "xml", "b.onnx", "--max-batch", "0", "--name", "a b"}, &out, &errb)
	want := `mdag models inspect: want one model file (FILE.onnx), got 2 arguments
mdag models inspect: -o "xml": want text, yaml or json
mdag models inspect: --max-batch 0: want 1..1024
mdag models inspect: --name "a b": letters, digits, _ . and - (starting with a letter or digit)
4 problems found
Run 'mdag models inspect -h' for its flags.
`
	if code != exitInvalid || out.Len() != 0 || errb.String() != want {
		t.Errorf("exit %d, stdout %q, stderr:\n%s\nwant exit 2 and:\n%s", code, out.String(), errb.String(), want)
	}
}

// TestSplitArgs: a command's positional arguments come out from among its
// flags, a flag's value staying with it; after a parse error the rest is
// left to execute, which says what is wrong.
func TestSplitArgs(t *testing.T) {
	for _, tc := range []struct {
		args, flags, pos string
	}{
		{"f.onnx", "", "f.onnx"},
		{"--name x f.onnx -o json", "--name x -o json", "f.onnx"},
		{"-o json f.onnx --write-labels=false g.onnx", "-o json --write-labels=false", "f.onnx g.onnx"},
		{"--name -- f.onnx", "--name --", "f.onnx"},
		{"-- -o", "", "-o"},
		{"f.onnx --bogus g.onnx", "--bogus g.onnx", "f.onnx"},
		{"-h f.onnx", "-h f.onnx", ""},
	} {
		flags, pos := splitArgs(new(modelsInspectCmd), strings.Fields(tc.args))
		if strings.Join(flags, " ") != tc.flags || strings.Join(pos, " ") != tc.pos {
			t.Errorf("%q: flags %q, arguments %q; want %q, %q", tc.args, flags, pos, tc.flags, tc.pos)
		}
	}
}
