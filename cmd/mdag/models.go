package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/mdag/mdag/gpu/decode"
	"github.com/mdag/mdag/gpu/registry"
)

// mdag models inspect FILE.onnx looks at a model the project never saw
// (issue 37): its inputs and outputs, opset and metadata_props, read
// from the protobuf without a runtime (registry.ReadGraph), and a
// proposed registry entry: the input block from the input's shape (the
// layout from where the 3 channels are, the size from fixed dimensions or
// an Ultralytics export's imgsz), the normalisation of the model's family,
// max_batch when the batch is symbolic, the decoder decode.Infer proposes
// from the outputs' shapes (its reason as a comment) and the class names
// an Ultralytics export carries, written to a labels file beside the
// YAML. The entry is checked as `mdag validate --models` would check it
// (registry.Parse, then Check against the graph) before it is printed.

const modelsSynopsis = "inspect FILE.onnx [--name NAME] [--dir DIR] [--max-batch 8] [--write-labels=true] [-o text|yaml|json]"

// runModels is mdag models: its subcommands (inspect) take the shape.
func runModels(args []string, stdout, stderr io.Writer) int {
	return runGroup("models", modelsUsage, []subcmd{
		{"inspect", strings.TrimPrefix(modelsSynopsis, "inspect "), func() subcommand { return new(modelsInspectCmd) }},
	}, args, stdout, stderr)
}

func modelsUsage(w io.Writer) {
	fmt.Fprintf(w, "Subcommands of mdag models:\n  inspect   print a model's inputs, outputs, opset and metadata and propose its registry entry\n\n")
	runModelsInspect([]string{"-h"}, w, w)
}

func runModelsInspect(args []string, stdout, stderr io.Writer) int {
	return executeArgs("models inspect", strings.TrimPrefix(modelsSynopsis, "inspect "), func() positional { return new(modelsInspectCmd) }, args, stdout, stderr)
}

// modelsInspectCmd is mdag models inspect's options.
type modelsInspectCmd struct {
	inspectOptions
	out   string
	files []string // the positional arguments: one FILE.onnx
}

func (c *modelsInspectCmd) setArgs(args []string) { c.files = args }

func (c *modelsInspectCmd) flags(fs *flag.FlagSet) {
	fs.StringVar(&c.name, "name", "", "the entry's name, what apps write in model: (default: the file's name without .onnx)")
	fs.StringVar(&c.dir, "dir", ".", "the directory the registry YAML will be in: file: and labels: are written relative to it, and the labels file goes there")
	fs.IntVar(&c.maxBatch, "max-batch", 8, "max_batch to propose when the batch dimension is symbolic (a fixed batch of 1 gets 1)")
	fs.BoolVar(&c.writeLabels, "write-labels", true, "when the model carries class names (Ultralytics metadata names), write them to DIR/NAME.labels, one a line, for the entry's decoder labels:")
	fs.StringVar(&c.out, "o", "text", "output `format`: text (the report, then the entry), yaml (only the registry document, to redirect into a models.yaml) or json")
}

func (c *modelsInspectCmd) validate(*flag.FlagSet) []error {
	if c.name == "" && len(c.files) == 1 {
		c.name = entryName(c.files[0])
	}
	return failed(
		problem{len(c.files) != 1, fmt.Sprintf("want one model file (FILE.onnx), got %d arguments", len(c.files))},
		problem{c.out != "text" && c.out != "yaml" && c.out != "json", fmt.Sprintf("-o %q: want text, yaml or json", c.out)},
		problem{c.maxBatch < 1 || c.maxBatch > 1024, fmt.Sprintf("--max-batch %d: want 1..1024", c.maxBatch)},
		problem{c.name != "" && !entryNameRE.MatchString(c.name), fmt.Sprintf("--name %q: letters, digits, _ . and - (starting with a letter or digit)", c.name)},
	)
}

// entryNameRE is what an entry's name may be.
var entryNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]*$`)

func (c *modelsInspectCmd) run(env *cmdEnv) error {
	g, err := registry.ReadGraph(c.files[0])
	if err != nil {
		return invalid(err)
	}
	ins, err := inspectModel(g, c.files[0], c.inspectOptions)
	if err != nil {
		return err
	}
	switch c.out {
	case "json":
		writeJSON(env.stdout, ins, true)
	case "yaml":
		io.WriteString(env.stdout, ins.Entry.YAML)
		if !ins.Decoder.OK {
			fmt.Fprintf(env.stderr, "mdag models inspect: no decoder proposed: %s\n", ins.Decoder.Why)
		}
	default:
		writeInspection(env.stdout, ins)
	}
	return nil
}

// entryName is a file's name without its extension, lower case, as an
// entry name.
func entryName(file string) string {
	n := strings.TrimSuffix(filepath.Base(file), filepath.Ext(file))
	n = regexp.MustCompile(`[^A-Za-z0-9_.-]+`).ReplaceAllString(n, "-")
	n = strings.Trim(n, "-.")
	if n == "" {
		return "model"
	}
	return n
}

// inspectOptions are what inspectModel proposes the entry with (mdag models
// inspect's flags).
type inspectOptions struct {
	name, dir   string
	maxBatch    int
	writeLabels bool
}

// inspection is what `mdag models inspect` found (-o json prints it).
type inspection struct {
	File      string            `json:"file"`
	IRVersion int64             `json:"ir_version"`
	Producer  string            `json:"producer,omitempty"`
	Opset     []inspectOpset    `json:"opset"`
	Inputs    []inspectTensor   `json:"inputs"`
	Outputs   []inspectTensor   `json:"outputs"`
	Metadata  map[string]string `json:"metadata,omitempty"`
	// Labels are the class names the metadata carries (Ultralytics names).
	Labels  []string        `json:"labels,omitempty"`
	Family  string          `json:"family"` // whose preprocessing the entry assumes
	Decoder inspectDecoder  `json:"decoder"`
	Entry   inspectProposal `json:"entry"`
	Notes   []string        `json:"notes,omitempty"` // what a person should check
}

type inspectOpset struct {
	Domain  string `json:"domain"`
	Version int64  `json:"version"`
}

type inspectTensor struct {
	Name  string `json:"name"`
	DType string `json:"dtype"`
	Shape []any  `json:"shape"` // a fixed size, or the symbolic dimension's name ("?" when unnamed)
	Text  string `json:"text"`  // dtype[d0,d1,...]
}

type inspectDecoder struct {
	Name   string `json:"name,omitempty"`
	Format string `json:"format,omitempty"`
	Why    string `json:"why"`
	OK     bool   `json:"ok"` // false: no decoder could be inferred (why says what was seen)
}

type inspectProposal struct {
	Name       string          `json:"name"`
	YAML       string          `json:"yaml"`                  // the registry document (models: NAME: ...)
	Model      *registry.Model `json:"model"`                 // the entry as proposed
	LabelsFile string          `json:"labels_file,omitempty"` // written beside the YAML
	Check      string          `json:"check"`                 // "ok", or what `mdag validate --models` would say
}

const (
	scale255  = 1.0 / 255
	scale1275 = 1.0 / 127.5
)

var imagenetMean, imagenetStd = []float64{0.485, 0.456, 0.406}, []float64{0.229, 0.224, 0.225}

func inspectModel(g *registry.Graph, file string, o inspectOptions) (*inspection, error) {
	x := &inspector{g: g, o: o, ins: &inspection{File: file, IRVersion: g.IRVersion, Producer: g.Producer},
		m: &registry.Model{Format: "onnx", Name: o.name, Devices: []string{"cpu"}}, in: g.Inputs[0]}
	x.describe()
	x.input()
	x.batch()
	x.decoder()
	x.preprocessing()
	x.decoderSettings()
	if err := x.labels(); err != nil {
		return nil, err
	}
	x.m.File = x.rel(file)
	x.entry()
	return x.ins, nil
}

// inspector proposes a registry entry for a graph, one step at a time:
// each reads the graph and what the steps before it chose.
type inspector struct {
	g   *registry.Graph
	o   inspectOptions
	ins *inspection
	m   *registry.Model // the proposed entry
	in  registry.Tensor // the input fed

	ultra                                     registry.Ultralytics
	isUltra                                   bool
	inputComment, batchComment, labelsComment string // the entry's YAML comments
	name, format, why                         string // the decoder decode.Infer proposes
	ok                                        bool   // it proposes one
}

// note adds what a person should check.
func (x *inspector) note(format string, a ...any) {
	x.ins.Notes = append(x.ins.Notes, fmt.Sprintf(format, a...))
}

// describe copies the graph's opsets, tensors and metadata, and reads an
// Ultralytics export's.
func (x *inspector) describe() {
	g, ins := x.g, x.ins
	for _, op := range g.Opsets {
		ins.Opset = append(ins.Opset, inspectOpset{Domain: op.Domain, Version: op.Version})
	}
	for _, t := range g.Inputs {
		ins.Inputs = append(ins.Inputs, jsonTensor(t))
	}
	for _, t := range g.Outputs {
		ins.Outputs = append(ins.Outputs, jsonTensor(t))
	}
	if len(g.Metadata) > 0 {
		ins.Metadata = map[string]string{}
		for _, p := range g.Metadata {
			if _, dup := ins.Metadata[p.Key]; !dup {
				ins.Metadata[p.Key] = p.Value
			}
		}
	}
	var err error
	if x.ultra, x.isUltra, err = g.Ultralytics(); err != nil {
		x.note("the Ultralytics metadata is not all readable: %v", err)
	}
	ins.Labels = x.ultra.Names
}

// input proposes the input's name, dtype, layout and size.
func (x *inspector) input() {
	m, in := x.m, x.in
	if len(x.g.Inputs) > 1 {
		x.note("the graph has %d inputs (%s); the executors feed one, the first is proposed", len(x.g.Inputs), strings.Join(registry.Names(x.g.Inputs), ", "))
	}
	m.Input.Name = in.Name
	m.Input.DType = in.DType
	if !slices.Contains([]string{"float32", "float16", "uint8"}, in.DType) {
		x.note("input '%s' is %s: the executors feed float32, float16 or uint8", in.Name, in)
	}
	fixed := func(i int) int64 {
		if i < len(in.Dims) && in.Dims[i].Fixed {
			return in.Dims[i].Value
		}
		return 0
	}
	var h, w int64
	switch {
	case len(in.Dims) != 4:
		m.Input.Layout = "NCHW"
		x.note("input '%s' is %s: the executors feed rank 4, [N,3,H,W] or [N,H,W,3]", in.Name, in)
	case fixed(1) == 3 || (fixed(3) != 3 && fixed(1) > 0 && fixed(1) <= 4):
		m.Input.Layout, h, w = "NCHW", fixed(2), fixed(3)
		x.inputComment = "channels first (dimension 1 is 3)"
	case fixed(3) == 3 || (fixed(3) > 0 && fixed(3) <= 4):
		m.Input.Layout, h, w = "NHWC", fixed(1), fixed(2)
		x.inputComment = "channels last (dimension 3 is 3)"
	default:
		m.Input.Layout, h, w = "NCHW", fixed(2), fixed(3)
		x.inputComment = "layout not told by the shape: NCHW assumed"
		x.note("input '%s' is %s: no dimension is fixed at 3 channels; NCHW is assumed", in.Name, in)
	}
	switch {
	case h > 0 && w > 0:
		x.inputComment += fmt.Sprintf(", %dx%d fixed in the graph", w, h)
	case x.isUltra && x.ultra.Width > 0 && x.ultra.Height > 0:
		w, h = int64(x.ultra.Width), int64(x.ultra.Height)
		x.inputComment += fmt.Sprintf(", %dx%d from the metadata's imgsz (the graph's size is symbolic)", w, h)
	default:
		w, h = 640, 640
		x.inputComment += ", size symbolic in the graph: 640x640 proposed, set the size it was trained at"
		x.note("input '%s' is %s: its size is symbolic; 640x640 is proposed (set the size the model was trained at)", in.Name, in)
	}
	m.Input.Width, m.Input.Height = int(w), int(h)
}

// batch proposes max_batch from the batch dimension.
func (x *inspector) batch() {
	switch d := x.in.Dims; {
	case len(d) == 0:
	case !d[0].Fixed:
		x.m.MaxBatch = x.o.maxBatch
		x.batchComment = fmt.Sprintf("the batch dimension '%s' is symbolic", d[0])
	case d[0].Value == 1:
		x.m.MaxBatch = 1
		x.batchComment = "the batch dimension is fixed at 1 (export with a dynamic batch to batch frames)"
	default:
		x.m.MaxBatch = 1
		x.note("input '%s' is %s: its batch is fixed at %d; the executors run batches of 1..max_batch, so re-export it with a symbolic (dynamic) batch", x.in.Name, x.in, d[0].Value)
	}
}

// decoder proposes the decoder the outputs' shapes fit, checked against
// the metadata's task.
func (x *inspector) decoder() {
	x.name, x.format, x.why, x.ok = decode.Infer(registry.Shapes(x.g.Outputs), decode.Input{W: x.m.Input.Width, H: x.m.Input.Height})
	x.ins.Decoder = inspectDecoder{Name: x.name, Format: x.format, Why: x.why, OK: x.ok}
	if x.isUltra && x.ok {
		switch t := x.ultra.Task; {
		case t == "pose" && x.name != "keypoints", t == "detect" && x.name != "boxes":
			x.note("the metadata says task %s, the outputs' shapes say decoder %s: check", t, x.name)
		case t != "" && t != "pose" && t != "detect":
			x.note("the metadata says task %s: only its boxes are decoded (no masks, angles or class-only outputs)", t)
		}
	}
	x.m.Decoder.Name, x.m.Decoder.Format = x.name, x.format
}

// preprocessing proposes the model family's colour order, resize and
// normalisation.
func (x *inspector) preprocessing() {
	name, format, ins := x.name, x.format, x.ins
	ultraLayout := slices.Contains([]string{"yolov8", "yolov5", "yolo", "e2e"}, format) || name == "keypoints" || (format == "rtdetr" && len(x.g.Outputs) == 1)
	colour, resize := "rgb", "stretch"
	var scale float64
	var mean, std []float64
	switch {
	case x.in.DType == "uint8":
		ins.Family = "uint8 pixels"
		x.inputComment += "; uint8: the pixels as they are"
	case x.isUltra || ultraLayout:
		ins.Family = "Ultralytics"
		scale, resize = scale255, "letterbox"
		x.inputComment += "; Ultralytics: RGB in [0,1] (pixel/255), letterboxed"
	case name == "blazeface":
		ins.Family = "MediaPipe"
		scale, mean = scale1275, []float64{1, 1, 1}
		x.inputComment += "; MediaPipe: RGB in [-1,1] (pixel/127.5 - 1)"
	case format == "yolox":
		ins.Family = "YOLOX"
		scale, colour, resize = 1, "bgr", "letterbox"
		x.inputComment += "; YOLOX: BGR pixels 0..255, not normalised, letterboxed"
	case format == "detr" || name == "classify":
		ins.Family = "ImageNet"
		scale, mean, std = scale255, imagenetMean, imagenetStd
		x.inputComment += "; ImageNet normalisation assumed: (pixel/255 - mean) / std, RGB (check the model's)"
		x.note("the normalisation is ImageNet's, assumed: check the model's preprocessing")
	default:
		ins.Family = "unknown"
		scale = scale255
		x.inputComment += "; RGB in [0,1] assumed (check the model's normalisation: mean, std)"
		x.note("the normalisation is not known from the graph: RGB in [0,1] is assumed, check the model's preprocessing")
	}
	x.m.Input.Colour, x.m.Input.Resize, x.m.Input.Scale, x.m.Input.Mean, x.m.Input.Std = colour, resize, scale, mean, std
}

// decoderSettings proposes the decoder's threshold or top-k.
func (x *inspector) decoderSettings() {
	switch {
	case x.name == "classify":
		x.m.Decoder.TopK = 5
	case x.name == "blazeface":
		x.m.Decoder.Threshold = decode.BlazeFaceThreshold
	case x.ins.Family == "Ultralytics":
		x.m.Decoder.Threshold = 0.25 // Ultralytics' predict default conf
	case x.ok:
		x.m.Decoder.Threshold = 0.5
	}
}

// labels proposes the metadata's class names as the labels file, written
// beside the YAML with --write-labels, when they fit the outputs.
func (x *inspector) labels() error {
	labels := x.ultra.Names
	if !x.ok || len(labels) == 0 {
		return nil
	}
	if err := decode.CheckShapes(x.name, x.format, registry.Shapes(x.g.Outputs), decode.Input{W: x.m.Input.Width, H: x.m.Input.Height}, len(labels)); err != nil {
		x.note("the metadata's %d class names do not fit the outputs (%v): no labels proposed", len(labels), err)
		return nil
	}
	if !x.o.writeLabels {
		x.labelsComment = fmt.Sprintf("the model carries %d class names (metadata names); --write-labels writes them for labels:", len(labels))
		return nil
	}
	lf := x.o.name + ".labels"
	path := filepath.Join(x.o.dir, lf)
	if err := os.WriteFile(path, []byte(strings.Join(labels, "\n")+"\n"), 0o644); err != nil {
		return fmt.Errorf("writing the labels file: %w", err)
	}
	x.ins.Entry.LabelsFile = path
	x.m.Decoder.Labels = lf
	x.labelsComment = fmt.Sprintf("labels: %d class names from the model's metadata, written to %s", len(labels), lf)
	return nil
}

// rel is p as the entry names it: relative to the YAML's directory, unless
// that climbs above its parent.
func (x *inspector) rel(p string) string {
	ad, err1 := filepath.Abs(x.o.dir)
	ap, err2 := filepath.Abs(p)
	if err1 != nil || err2 != nil {
		return p
	}
	if r, err := filepath.Rel(ad, ap); err == nil && !strings.HasPrefix(filepath.ToSlash(r), "../../") {
		return filepath.ToSlash(r)
	}
	return ap
}

// entry writes the proposed entry's YAML and makes the check mdag
// validate --models makes.
func (x *inspector) entry() {
	ins := x.ins
	ins.Entry.Name = x.o.name
	ins.Entry.Model = x.m
	ins.Entry.YAML = entryYAML(x.m, x.inputComment, x.batchComment, x.labelsComment, ins.Decoder)
	ins.Entry.Check = "ok"
	if !x.ok {
		ins.Entry.Check = "no decoder: " + x.why
	} else if reg, err := registry.Parse(filepath.Join(x.o.dir, "models.yaml"), []byte(ins.Entry.YAML)); err != nil {
		ins.Entry.Check = err.Error()
	} else if err := reg.Models[x.o.name].Check(x.g); err != nil {
		ins.Entry.Check = err.Error()
	}
}

func jsonTensor(t registry.Tensor) inspectTensor {
	it := inspectTensor{Name: t.Name, DType: t.DType, Text: t.String(), Shape: []any{}}
	for _, d := range t.Dims {
		if d.Fixed {
			it.Shape = append(it.Shape, d.Value)
		} else {
			it.Shape = append(it.Shape, d.String())
		}
	}
	return it
}

// yamlScalar quotes s when YAML would read it as something else.
func yamlScalar(s string) string {
	if regexp.MustCompile(`^[A-Za-z_./][A-Za-z0-9_./-]*$`).MatchString(s) && !slices.Contains([]string{"true", "false", "yes", "no", "on", "off", "null", "y", "n"}, strings.ToLower(s)) {
		return s
	}
	b, _ := json.Marshal(s)
	return string(b)
}

func yamlFloat(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

func yamlFloats(fs []float64) string {
	s := make([]string, len(fs))
	for i, f := range fs {
		s[i] = yamlFloat(f)
	}
	return "[" + strings.Join(s, ", ") + "]"
}

// comment writes text as YAML comment lines at indent, wrapped at about
// 100 columns.
func comment(b *bytes.Buffer, indent, text string) {
	line := indent + "#"
	for _, w := range strings.Fields(text) {
		if len(line)+1+len(w) > 100 && len(line) > len(indent)+1 {
			b.WriteString(line + "\n")
			line = indent + "#"
		}
		line += " " + w
	}
	b.WriteString(line + "\n")
}

// flow writes a flow mapping of parts after head, wrapped at about 100
// columns with its continuation lines under the first part.
func flow(b *bytes.Buffer, head string, parts []string) {
	line := head
	for i, p := range parts {
		sep := ", "
		if i == 0 {
			sep = ""
		}
		if i > 0 && len(line)+len(sep)+len(p)+1 > 100 {
			b.WriteString(line + ",\n")
			line, sep = strings.Repeat(" ", len(head)), ""
		}
		line += sep + p
	}
	b.WriteString(line + "}\n")
}

// entryYAML is the registry document with the one entry, in the style of
// examples/models.yaml.
func entryYAML(m *registry.Model, inputComment, batchComment, labelsComment string, d inspectDecoder) string {
	var b bytes.Buffer
	const ind = "    "
	fmt.Fprintf(&b, "models:\n  %s:\n", yamlScalar(m.Name))
	fmt.Fprintf(&b, "%sformat: onnx\n%sfile: %s\n", ind, ind, yamlScalar(m.File))
	comment(&b, ind, "input: "+inputComment)
	in := m.Input
	parts := []string{"name: " + yamlScalar(in.Name), "dtype: " + in.DType, "layout: " + in.Layout,
		fmt.Sprintf("width: %d", in.Width), fmt.Sprintf("height: %d", in.Height), "colour: " + in.Colour}
	if in.DType != "uint8" {
		if in.Scale != 0 && in.Scale != 1 {
			parts = append(parts, "scale: "+yamlFloat(in.Scale))
		}
		if in.Mean != nil {
			parts = append(parts, "mean: "+yamlFloats(in.Mean))
		}
		if in.Std != nil {
			parts = append(parts, "std: "+yamlFloats(in.Std))
		}
	}
	parts = append(parts, "resize: "+in.Resize)
	flow(&b, ind+"input: {", parts)
	fmt.Fprintf(&b, "%smax_batch: %d", ind, m.MaxBatch)
	if batchComment != "" {
		b.WriteString("  # " + batchComment)
	}
	b.WriteString("\n")
	if !d.OK {
		comment(&b, ind, "NO DECODER PROPOSED: "+d.Why)
		comment(&b, ind, "name one of "+strings.Join(decode.Names(), ", ")+" (README: The models YAML); until then this entry does not load:")
		fmt.Fprintf(&b, "%s# decoder: {name: ...}\n", ind)
	} else {
		comment(&b, ind, "decoder proposed from the outputs' shapes: "+d.Why)
		if labelsComment != "" {
			comment(&b, ind, labelsComment)
		}
		dp := []string{"name: " + d.Name}
		if d.Format != "" {
			dp = append(dp, "format: "+d.Format)
		}
		if m.Decoder.Threshold > 0 {
			dp = append(dp, "threshold: "+yamlFloat(m.Decoder.Threshold))
		}
		if m.Decoder.TopK > 0 {
			dp = append(dp, fmt.Sprintf("top_k: %d", m.Decoder.TopK))
		}
		if m.Decoder.Labels != "" {
			dp = append(dp, "labels: "+yamlScalar(m.Decoder.Labels))
		}
		flow(&b, ind+"decoder: {", dp)
	}
	fmt.Fprintf(&b, "%sdevices: [cpu]  # add cuda where ONNX Runtime has the CUDA provider\n", ind)
	return b.String()
}

// writeInspection prints the report, then the entry.
func writeInspection(w io.Writer, ins *inspection) {
	var ops []string
	for _, o := range ins.Opset {
		ops = append(ops, registry.Opset{Domain: o.Domain, Version: o.Version}.String())
	}
	fmt.Fprintf(w, "model %s: ONNX IR %d, opset %s", ins.File, ins.IRVersion, strings.Join(ops, ", "))
	if ins.Producer != "" {
		fmt.Fprintf(w, ", producer %s", ins.Producer)
	}
	fmt.Fprintln(w)
	for _, part := range []struct {
		title string
		ts    []inspectTensor
	}{{"inputs", ins.Inputs}, {"outputs", ins.Outputs}} {
		fmt.Fprintf(w, "%s:\n", part.title)
		for _, t := range part.ts {
			var sym []string
			for _, d := range t.Shape {
				if s, ok := d.(string); ok {
					sym = append(sym, s)
				}
			}
			extra := ""
			if len(sym) > 0 {
				extra = "  (symbolic: " + strings.Join(sym, ", ") + ")"
			}
			fmt.Fprintf(w, "  %-24s %s%s\n", t.Name, t.Text, extra)
		}
	}
	if len(ins.Metadata) == 0 {
		fmt.Fprintln(w, "metadata: none")
	} else {
		fmt.Fprintln(w, "metadata:")
		for _, k := range sortedStrings(ins.Metadata) {
			v := ins.Metadata[k]
			if k == "names" && len(ins.Labels) > 0 {
				v = fmt.Sprintf("%d classes: %s", len(ins.Labels), abbreviate(strings.Join(ins.Labels, ", "), 80))
			}
			fmt.Fprintf(w, "  %s: %s\n", k, abbreviate(v, 100))
		}
	}
	if ins.Decoder.OK {
		f := ""
		if ins.Decoder.Format != "" {
			f = " (format " + ins.Decoder.Format + ")"
		}
		fmt.Fprintf(w, "decoder: %s%s: %s\n", ins.Decoder.Name, f, ins.Decoder.Why)
	} else {
		fmt.Fprintf(w, "decoder: cannot infer one: %s\n", ins.Decoder.Why)
	}
	fmt.Fprintf(w, "preprocessing: %s\n", ins.Family)
	if ins.Entry.LabelsFile != "" {
		fmt.Fprintf(w, "labels: %d class names written to %s\n", len(ins.Labels), ins.Entry.LabelsFile)
	}
	for _, n := range ins.Notes {
		fmt.Fprintf(w, "check: %s\n", n)
	}
	if ins.Entry.Check == "ok" {
		fmt.Fprintln(w, "entry: passes the registry's checks against the graph (mdag validate --models)")
	} else {
		fmt.Fprintf(w, "entry: does not pass the registry's checks yet: %s\n", ins.Entry.Check)
	}
	fmt.Fprintf(w, "\nProposed registry entry (the entry under models: goes into your models.yaml; -o yaml prints it alone):\n\n%s", ins.Entry.YAML)
}

func sortedStrings[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func abbreviate(s string, n int) string {
	s = strings.ReplaceAll(s, "\n", " ")
	if len(s) > n {
		return s[:n-3] + "..."
	}
	return s
}
