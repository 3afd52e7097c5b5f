// Package registry reads the model registry (models.yaml): per model name
// the file or endpoint, how frames become its input tensor, its largest
// batch, the decoder of its outputs and the devices it may run on. Loading
// is strict like the app YAML (internal/yamlx: unknown keys, bad values,
// every problem with file:line and field path), and Check compares an ONNX
// entry with the graph in its file (ReadGraph, pure Go), so a model whose
// input is not what the entry says is refused before a runtime sees it.
//
// Pure Go: the executors (gpu/onnx, gpu/opencv) and `mdag validate` use it.
package registry

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/mdag/mdag/gpu/decode"
	"github.com/mdag/mdag/internal/yamlx"
)

// Registry is a loaded models.yaml.
type Registry struct {
	File   string            // the YAML file, as given
	Models map[string]*Model // by name
	pos    *yamlx.Positions
}

// Model is one registry entry.
type Model struct {
	Format   string   `yaml:"format"`  // onnx or kserve
	File     string   `yaml:"file"`    // onnx: the model file, relative to the YAML
	KServe   *KServe  `yaml:"kserve"`  // kserve: where it is served
	Input    Input    `yaml:"input"`   // how frames become the input tensor
	Outputs  []string `yaml:"outputs"` // output tensors the decoder reads, in order (default: all, graph order)
	MaxBatch int      `yaml:"max_batch"`
	Decoder  Decoder  `yaml:"decoder"`
	Devices  []string `yaml:"devices"` // cpu, cuda (default: cpu)

	Name   string   `yaml:"-"`
	Path   string   `yaml:"-"` // File joined to the YAML's directory
	Labels []string `yaml:"-"` // read from Decoder.Labels
}

// KServe is a model served over the Open Inference Protocol (KServe v2 /
// Triton), run by the kserve executor (gpu/kserve) over gRPC.
type KServe struct {
	Endpoint string `yaml:"endpoint"` // host:port (gRPC) or unix:PATH; http(s):// validates but the executor speaks gRPC
	Model    string `yaml:"model"`
	Version  string `yaml:"version"`
	// SharedMemory: auto (the executor's setting, default: shared memory
	// when the endpoint is on this host and the server offers it), on or
	// off.
	SharedMemory string `yaml:"shared_memory"`
}

// Input describes the input tensor and the preprocessing into it:
// x = (pixel*scale - mean[c]) / std[c] in the colour order, after resizing
// the frame to width x height (stretch, or letterbox: aspect kept, padded
// with zeros).
type Input struct {
	Name   string    `yaml:"name"`
	DType  string    `yaml:"dtype"`  // float32, float16, uint8
	Layout string    `yaml:"layout"` // NCHW, NHWC
	Width  int       `yaml:"width"`
	Height int       `yaml:"height"`
	Colour string    `yaml:"colour"` // rgb, bgr
	Scale  float64   `yaml:"scale"`  // default 1
	Mean   []float64 `yaml:"mean"`   // per channel, in colour order (default 0)
	Std    []float64 `yaml:"std"`    // per channel (default 1)
	Resize string    `yaml:"resize"` // stretch (default), letterbox
}

// Decoder names the output decoder and its settings.
type Decoder struct {
	Name      string  `yaml:"name"`      // classify, blazeface, boxes, keypoints, db, ctc (decode.Names)
	Labels    string  `yaml:"labels"`    // a file of class names, one a line, relative to the YAML
	TopK      int     `yaml:"top_k"`     // classify (default 1)
	Softmax   bool    `yaml:"softmax"`   // classify: the output is logits
	Threshold float64 `yaml:"threshold"` // detectors: the score a box needs
	NMS       float64 `yaml:"nms"`       // detectors: IoU for suppression (default decode.NMSFor: 0.45, none for heads that suppress inside; blazeface 0.3)
	Format    string  `yaml:"format"`    // boxes: ssd (default), yolo = yolov5, yolov8, yolox, ssd-tf, detr, rtdetr, e2e; keypoints: yolov8 (decode.Formats)
	// db: the probability a text pixel needs (default 0.3) and DB's
	// unclip ratio, how far a text region grows back (default 1.5).
	Binarize float64 `yaml:"binarize"`
	Unclip   float64 `yaml:"unclip"`
	// ctc: a gap between two characters reads as a space when the space
	// class reaches this probability in it (default 0: only where the
	// space is the best class, PaddleOCR's greedy decoding).
	Space float64 `yaml:"space"`
}

type doc struct {
	Models map[string]*Model `yaml:"models"`
}

// Params are the decoder's settings as decode.Params.
func (m *Model) Params() decode.Params {
	d := m.Decoder
	return decode.Params{Threshold: d.Threshold, NMS: d.NMS, TopK: d.TopK, Softmax: d.Softmax, Labels: m.Labels, Format: d.Format, Binarize: d.Binarize, Unclip: d.Unclip, Space: d.Space}
}

// Load reads and validates a registry file.
func Load(path string) (*Registry, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(path, b)
}

// Parse decodes and validates a registry; relative paths are resolved
// against file's directory, labels files are read.
func Parse(file string, data []byte) (*Registry, error) {
	var d doc
	pos, errs := yamlx.Decode(file, data, &d)
	r := &Registry{File: file, Models: map[string]*Model{}, pos: pos}
	if len(d.Models) == 0 && len(errs) == 0 {
		errs = append(errs, pos.Errorf("models", "no models (want models: {NAME: {format: onnx, file: ...}})"))
	}
	var sem yamlx.ErrorList
	dir := filepath.Dir(file)
	for _, name := range sortedKeys(d.Models) {
		m := d.Models[name]
		if m == nil {
			sem = append(sem, pos.Errorf("models."+name, "empty entry"))
			continue
		}
		m.Name = name
		sem = append(sem, m.validate(pos, "models."+name, dir)...)
		r.Models[name] = m
	}
	all := errs.Merge(sem)
	all.Sort()
	if err := all.Err(); err != nil {
		return nil, err
	}
	return r, nil
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func oneOf(pos *yamlx.Positions, path, v string, allowed ...string) *yamlx.Error {
	if slices.Contains(allowed, v) {
		return nil
	}
	if v == "" {
		return pos.Errorf(path, "missing (one of %s)", strings.Join(allowed, ", "))
	}
	return pos.Errorf(path, "%q unknown (one of %s)", v, strings.Join(allowed, ", "))
}

func (m *Model) validate(pos *yamlx.Positions, p, dir string) yamlx.ErrorList {
	var errs yamlx.ErrorList
	add := func(e *yamlx.Error) {
		if e != nil {
			errs = append(errs, e)
		}
	}
	add(oneOf(pos, p+".format", m.Format, "onnx", "kserve"))
	switch m.Format {
	case "onnx":
		if m.File == "" {
			add(pos.Errorf(p+".file", "missing: the ONNX file, relative to this YAML"))
		} else {
			m.Path = m.File
			if !filepath.IsAbs(m.File) {
				m.Path = filepath.Join(dir, m.File)
			}
		}
		if m.KServe != nil {
			add(pos.Errorf(p+".kserve", "only with format: kserve"))
		}
	case "kserve":
		if m.File != "" {
			add(pos.Errorf(p+".file", "only with format: onnx"))
		}
		if m.KServe == nil {
			add(pos.Errorf(p+".kserve", "missing: {endpoint, model, version}"))
		} else {
			k := m.KServe
			if k.Endpoint == "" {
				add(pos.Errorf(p+".kserve.endpoint", "missing (http://host:port, https://... or host:port for gRPC)"))
			} else if err := checkEndpoint(k.Endpoint); err != nil {
				add(pos.Errorf(p+".kserve.endpoint", "%v", err))
			}
			if k.Model == "" {
				add(pos.Errorf(p+".kserve.model", "missing: the model name on the server"))
			}
			if k.Version != "" && strings.ContainsAny(k.Version, "/ ") {
				add(pos.Errorf(p+".kserve.version", "%q: no slashes or spaces", k.Version))
			}
			if k.SharedMemory != "" {
				add(oneOf(pos, p+".kserve.shared_memory", k.SharedMemory, "auto", "on", "off"))
			}
		}
	}
	in, ip := &m.Input, p+".input"
	if in.Name == "" {
		add(pos.Errorf(ip+".name", "missing: the graph's input tensor name"))
	}
	add(oneOf(pos, ip+".dtype", in.DType, "float32", "float16", "uint8"))
	add(oneOf(pos, ip+".layout", in.Layout, "NCHW", "NHWC"))
	if in.Colour == "" {
		in.Colour = "rgb"
	}
	add(oneOf(pos, ip+".colour", in.Colour, "rgb", "bgr"))
	if in.Resize == "" {
		in.Resize = "stretch"
	}
	add(oneOf(pos, ip+".resize", in.Resize, "stretch", "letterbox"))
	for _, f := range []struct {
		name string
		v    int
	}{{"width", in.Width}, {"height", in.Height}} {
		if f.v < 1 || f.v > 8192 {
			add(pos.Errorf(ip+"."+f.name, "%d: want 1..8192", f.v))
		}
	}
	if in.DType == "uint8" && (in.Scale != 0 || len(in.Mean) > 0 || len(in.Std) > 0) {
		add(pos.Errorf(ip, "a uint8 input takes the pixels as they are: no scale, mean or std"))
	}
	if in.Scale < 0 {
		add(pos.Errorf(ip+".scale", "%g: must be > 0", in.Scale))
	}
	if in.Scale == 0 {
		in.Scale = 1
	}
	for _, f := range []struct {
		name string
		v    []float64
		def  float64
	}{{"mean", in.Mean, 0}, {"std", in.Std, 1}} {
		if len(f.v) != 0 && len(f.v) != 3 {
			add(pos.Errorf(ip+"."+f.name, "%d values: want 3, one per channel in colour order", len(f.v)))
		}
		if f.name == "std" {
			for i, s := range f.v {
				if s <= 0 {
					add(pos.Errorf(fmt.Sprintf("%s.std[%d]", ip, i), "%g: must be > 0", s))
				}
			}
		}
	}
	if len(in.Mean) != 3 {
		in.Mean = []float64{0, 0, 0}
	}
	if len(in.Std) != 3 {
		in.Std = []float64{1, 1, 1}
	}
	if m.MaxBatch < 1 || m.MaxBatch > 1024 {
		add(pos.Errorf(p+".max_batch", "%d: want 1..1024", m.MaxBatch))
	}
	for i, o := range m.Outputs {
		if o == "" || slices.Contains(m.Outputs[:i], o) {
			add(pos.Errorf(fmt.Sprintf("%s.outputs[%d]", p, i), "%q: empty or given twice", o))
		}
	}
	dp := p + ".decoder"
	d := &m.Decoder
	if _, ok := decode.Lookup(d.Name); !ok {
		add(oneOf(pos, dp+".name", d.Name, decode.Names()...))
	}
	if d.TopK < 0 {
		add(pos.Errorf(dp+".top_k", "%d: must be >= 0", d.TopK))
	}
	if d.Threshold < 0 || d.Threshold > 1 {
		add(pos.Errorf(dp+".threshold", "%g: want 0..1", d.Threshold))
	}
	if d.NMS < 0 || d.NMS > 1 {
		add(pos.Errorf(dp+".nms", "%g: want 0..1", d.NMS))
	}
	if fs := decode.Formats(d.Name); len(fs) > 0 {
		if d.Format == "" {
			d.Format = fs[0]
		}
		add(oneOf(pos, dp+".format", d.Format, fs...))
	} else if d.Format != "" {
		add(pos.Errorf(dp+".format", "only for the boxes and keypoints decoders"))
	}
	if d.NMS == 0 {
		d.NMS = decode.NMSFor(d.Name, d.Format)
	}
	if d.Name == "db" {
		if d.Binarize == 0 {
			d.Binarize = decode.DefaultBinarize
		}
		if d.Unclip == 0 {
			d.Unclip = decode.DefaultUnclip
		}
		if d.Binarize <= 0 || d.Binarize >= 1 {
			add(pos.Errorf(dp+".binarize", "%g: want > 0 and < 1", d.Binarize))
		}
		if d.Unclip < 1 || d.Unclip > 4 {
			add(pos.Errorf(dp+".unclip", "%g: want 1..4 (DB: 1.5 to 2)", d.Unclip))
		}
	} else if d.Binarize != 0 || d.Unclip != 0 {
		add(pos.Errorf(dp, "binarize and unclip are for the db decoder"))
	}
	if d.Space < 0 || d.Space >= 1 {
		add(pos.Errorf(dp+".space", "%g: want 0 (off) up to below 1", d.Space))
	} else if d.Space != 0 && d.Name != "ctc" {
		add(pos.Errorf(dp+".space", "only for the ctc decoder"))
	}
	if d.Name == "ctc" && d.Labels == "" {
		add(pos.Errorf(dp+".labels", "missing: the ctc decoder needs the keys file (one character a line)"))
	}
	if d.Name != "classify" && (d.TopK != 0 || d.Softmax) {
		add(pos.Errorf(dp, "top_k and softmax are for the classify decoder"))
	}
	if d.Labels != "" {
		lp := d.Labels
		if !filepath.IsAbs(lp) {
			lp = filepath.Join(dir, lp)
		}
		b, err := os.ReadFile(lp)
		if err != nil {
			add(pos.Errorf(dp+".labels", "%v", err))
		} else {
			// ASCII blanks only: a keys file may hold a character
			// TrimSpace would take (PP-OCR's has U+3000, the ideographic space)
			for _, l := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
				m.Labels = append(m.Labels, strings.Trim(l, " \t\r"))
			}
		}
	}
	if len(m.Devices) == 0 {
		m.Devices = []string{"cpu"}
	}
	for i, dv := range m.Devices {
		add(oneOf(pos, fmt.Sprintf("%s.devices[%d]", p, i), dv, "cpu", "cuda"))
		if slices.Contains(m.Devices[:i], dv) {
			add(pos.Errorf(fmt.Sprintf("%s.devices[%d]", p, i), "%q given twice", dv))
		}
	}
	return errs
}

func checkEndpoint(s string) error {
	rest := s
	if h, ok := strings.CutPrefix(s, "http://"); ok {
		rest = h
	} else if h, ok := strings.CutPrefix(s, "https://"); ok {
		rest = h
	} else if strings.Contains(s, "://") {
		return fmt.Errorf("%q: scheme must be http or https (or none: host:port for gRPC)", s)
	}
	host, _, _ := strings.Cut(rest, "/")
	if host == "" || strings.ContainsAny(host, " \t") {
		return fmt.Errorf("%q: no host", s)
	}
	return nil
}

// Names lists the models, sorted.
func (r *Registry) Names() []string { return sortedKeys(r.Models) }

// Line is the line of a model's entry in the YAML (0 if unknown).
func (r *Registry) Line(model string) int {
	if r.pos == nil {
		return 0
	}
	return r.pos.Line("models." + model)
}

// Get returns the named model or an error listing the known ones.
func (r *Registry) Get(name string) (*Model, error) {
	if m, ok := r.Models[name]; ok {
		return m, nil
	}
	return nil, fmt.Errorf("model %q is not in the registry %s (it has: %s)", name, r.File, strings.Join(r.Names(), ", "))
}

// CheckFiles reads the graph of every ONNX model and compares it with its
// entry (Check); each problem is prefixed with the entry's file:line.
func (r *Registry) CheckFiles() error {
	var errs yamlx.ErrorList
	for _, n := range r.Names() {
		m := r.Models[n]
		if m.Format != "onnx" {
			continue
		}
		g, err := ReadGraph(m.Path)
		if err == nil {
			err = m.Check(g)
		}
		if err != nil {
			errs = append(errs, r.pos.Errorf("models."+n+".file", "%v", err))
		}
	}
	errs.Sort()
	return errs.Err()
}
