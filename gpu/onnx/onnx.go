// Package onnx is the GPU executor that runs registry models (gpu/registry)
// on ONNX Runtime through github.com/yalue/onnxruntime_go: one session Run
// per scheduler batch, the batch as the input's leading dimension, frames
// preprocessed straight into a batch tensor each session keeps and reuses,
// N sessions per model so N batches of one model run at once.
//
// It is an edge package, but links no native library: onnxruntime_go
// opens libonnxruntime.so with dlopen at run time (Config.Lib; `make deps`
// installs the CPU library of npm onnxruntime-node@1.30.0), so both the
// full and the lean binary carry it and `ldd bin/mdag-lean` stays libc-only.
//
// Every ONNX Runtime error (a shape or dtype the graph refuses, a missing
// or corrupt file, a failed run) is returned as an error, for load or for
// that batch: the worker counts the batch's frames dropped (reason
// `executor`) and goes on.
package onnx

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	ort "github.com/yalue/onnxruntime_go"

	"github.com/mdag/mdag/gpu/decode"
	"github.com/mdag/mdag/gpu/prep"
	"github.com/mdag/mdag/gpu/queue"
	"github.com/mdag/mdag/gpu/registry"
	"github.com/mdag/mdag/media"
)

// LibEnv is the environment variable that names the library.
const LibEnv = "MDAG_ORT_LIB"

// DefaultLib is where `make deps` (tools/ort-fetch.sh) puts the library:
// ${XDG_CACHE_HOME:-$HOME/.cache}/mdag/onnxruntime-node-1.30.0/libonnxruntime.so.1.
func DefaultLib() string {
	if p := os.Getenv(LibEnv); p != "" {
		return p
	}
	c := os.Getenv("XDG_CACHE_HOME")
	if c == "" {
		h, _ := os.UserHomeDir()
		c = filepath.Join(h, ".cache")
	}
	return filepath.Join(c, "mdag", "onnxruntime-node-1.30.0", "libonnxruntime.so.1")
}

// Config configures the executor.
type Config struct {
	Lib          string // the ONNX Runtime shared library (default DefaultLib)
	Device       string // cpu (default) or cuda
	IntraThreads int    // intra-op threads per session (0: ONNX Runtime's default, the cores)
	Sessions     int    // sessions per model (default 1): batches of one model that run at once
	// NoSpin stops the intra-op threads spinning while they wait for
	// work (session.intra_op.allow_spinning = 0): a little slower per
	// request, but idle sessions leave the cores to others (SERF's c
	// sessions on shared cores; mdag profile --spin=false).
	NoSpin bool
}

var env struct {
	sync.Mutex
	lib     string
	version string
}

// Init loads the library once per process (later calls with another path
// fail, naming both). The error says where it looked and what to do.
func Init(lib string) (version string, err error) {
	if lib == "" {
		lib = DefaultLib()
	}
	if _, err := os.Stat(lib); err != nil {
		return "", fmt.Errorf("ONNX Runtime library not found at %s; run make deps or set %s (%v)", lib, LibEnv, err)
	}
	env.Lock()
	defer env.Unlock()
	if env.lib != "" {
		if env.lib != lib {
			return "", fmt.Errorf("ONNX Runtime is loaded from %s already; one library per process (asked for %s)", env.lib, lib)
		}
		return env.version, nil
	}
	ort.SetSharedLibraryPath(lib)
	// errors come back as values (each batch's error); ORT's own log would
	// print them a second time
	if err := ort.InitializeEnvironment(ort.WithLogLevelFatal()); err != nil {
		return "", fmt.Errorf("ONNX Runtime library %s: %w (the binding, onnxruntime_go v1.27.0, needs API version 24: ONNX Runtime >= 1.24)", lib, err)
	}
	env.lib, env.version = lib, ort.GetVersion()
	return env.version, nil
}

// Executor runs registry models on ONNX Runtime.
type Executor struct {
	cfg     Config
	entries map[string]*registry.Model // every onnx entry of the registry (Load)

	mu     sync.RWMutex
	models map[string]*model // loaded
	names  []string          // loaded, in registry order
}

type model struct {
	m        *registry.Model
	outs     []string
	outInfo  []registry.Tensor // the graph's view of each output
	decode   decode.Func
	sessions chan *session
	all      []*session
}

// session is one ONNX Runtime session with its reused batch buffer: the
// input tensors for each batch size seen wrap the same memory.
type session struct {
	s       *ort.DynamicAdvancedSession
	item    int // values per item
	f32     []float32
	u8      []uint8
	f16     []byte
	scratch []float32           // one item, for float16 inputs
	inputs  map[int]ort.Value   // batch size -> tensor over the buffer
	outputs map[int][]ort.Value // batch size -> the output tensors allocated here (nil: by ORT)
}

// New loads every onnx model of the registry (kserve entries are skipped:
// they are served elsewhere) with cfg.Sessions sessions each. A model that
// fails its graph check, that the device is not listed for, or that ONNX
// Runtime refuses, fails New with the reason; nothing is left loaded.
func New(reg *registry.Registry, cfg Config) (*Executor, error) {
	if cfg.Lib == "" {
		cfg.Lib = DefaultLib()
	}
	if cfg.Device == "" {
		cfg.Device = "cpu"
	}
	if cfg.Device != "cpu" && cfg.Device != "cuda" {
		return nil, fmt.Errorf("device %q: want cpu or cuda", cfg.Device)
	}
	if cfg.IntraThreads < 0 {
		return nil, fmt.Errorf("intra-op threads %d: must be >= 0 (0: ONNX Runtime's default)", cfg.IntraThreads)
	}
	cfg.Sessions = max(1, cfg.Sessions)
	if _, err := Init(cfg.Lib); err != nil {
		return nil, err
	}
	x := &Executor{cfg: cfg, models: map[string]*model{}, entries: map[string]*registry.Model{}}
	var errs []error
	for _, name := range reg.Names() {
		m := reg.Models[name]
		if m.Format != "onnx" {
			continue
		}
		x.entries[name] = m
		lm, err := x.load(m)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		x.models[name] = lm
		x.names = append(x.names, name)
	}
	if len(errs) == 0 && len(x.models) == 0 {
		errs = append(errs, fmt.Errorf("%s has no onnx models", reg.File))
	}
	if len(errs) > 0 {
		x.Close()
		return nil, errors.Join(errs...)
	}
	return x, nil
}

func (x *Executor) load(m *registry.Model) (*model, error) {
	if !slices.Contains(m.Devices, x.cfg.Device) {
		return nil, fmt.Errorf("model %s: device %s is not among its devices (%s)", m.Name, x.cfg.Device, strings.Join(m.Devices, ", "))
	}
	g, err := registry.ReadGraph(m.Path)
	if err != nil {
		return nil, fmt.Errorf("model %s: %w", m.Name, err)
	}
	if err := m.Check(g); err != nil {
		return nil, err
	}
	dec, ok := decode.Lookup(m.Decoder.Name)
	if !ok {
		return nil, fmt.Errorf("model %s: decoder %q unknown (known: %s)", m.Name, m.Decoder.Name, strings.Join(decode.Names(), ", "))
	}
	lm := &model{m: m, outs: m.OutputNames(g), decode: dec, sessions: make(chan *session, x.cfg.Sessions)}
	for _, n := range lm.outs {
		o, _ := g.Output(n)
		if o.DType == "float16" && !fixedTail(o) {
			// onnxruntime_go v1.27.0 cannot hand back a float16 output it
			// allocated (it sizes the copy by elements, not bytes), so
			// float16 outputs are allocated here, which needs their shape
			return nil, fmt.Errorf("model %s: output '%s' is %s in %s: a float16 output needs fixed dimensions after the batch", m.Name, n, o, filepath.Base(m.Path))
		}
		lm.outInfo = append(lm.outInfo, o)
	}
	for range x.cfg.Sessions {
		s, err := x.newSession(m, lm.outs)
		if err != nil {
			lm.close()
			return nil, fmt.Errorf("model %s (%s): %w", m.Name, m.Path, err)
		}
		lm.all = append(lm.all, s)
		lm.sessions <- s
	}
	return lm, nil
}

func (x *Executor) newSession(m *registry.Model, outs []string) (*session, error) {
	opts, err := ort.NewSessionOptions()
	if err != nil {
		return nil, err
	}
	defer opts.Destroy()
	if x.cfg.IntraThreads > 0 {
		if err := opts.SetIntraOpNumThreads(x.cfg.IntraThreads); err != nil {
			return nil, err
		}
	}
	if x.cfg.NoSpin {
		if err := opts.AddSessionConfigEntry("session.intra_op.allow_spinning", "0"); err != nil {
			return nil, err
		}
	}
	if x.cfg.Device == "cuda" {
		cu, err := ort.NewCUDAProviderOptions()
		if err == nil {
			err = opts.AppendExecutionProviderCUDA(cu)
			cu.Destroy()
		}
		if err != nil {
			return nil, fmt.Errorf("--device cuda: the ONNX Runtime library %s has no usable CUDA execution provider (the npm onnxruntime-node library `make deps` installs is CPU-only; "+
				"point --ort-lib at a GPU build with its CUDA provider libraries beside it): %w", env.lib, err)
		}
	}
	s, err := ort.NewDynamicAdvancedSession(m.Path, []string{m.Input.Name}, outs, opts)
	if err != nil {
		return nil, err
	}
	n := m.Input.Width * m.Input.Height * 3
	ss := &session{s: s, item: n, inputs: map[int]ort.Value{}, outputs: map[int][]ort.Value{}}
	switch m.Input.DType {
	case "float32":
		ss.f32 = make([]float32, n*m.MaxBatch)
	case "uint8":
		ss.u8 = make([]uint8, n*m.MaxBatch)
	case "float16":
		ss.f16, ss.scratch = make([]byte, 2*n*m.MaxBatch), make([]float32, n)
	}
	return ss, nil
}

// input is the tensor for a batch of b over the session's buffer.
func (s *session) input(m *registry.Model, b int) (ort.Value, error) {
	if t, ok := s.inputs[b]; ok {
		return t, nil
	}
	shape := ort.NewShape(m.InputShape(b)...)
	var t ort.Value
	var err error
	switch {
	case s.f32 != nil:
		t, err = ort.NewTensor(shape, s.f32[:b*s.item])
	case s.u8 != nil:
		t, err = ort.NewTensor(shape, s.u8[:b*s.item])
	default:
		t, err = ort.NewCustomDataTensor(shape, s.f16[:2*b*s.item], ort.TensorElementDataTypeFloat16)
	}
	if err != nil {
		return nil, err
	}
	s.inputs[b] = t
	return t, nil
}

// fixedTail reports whether every dimension after the batch is fixed.
func fixedTail(t registry.Tensor) bool {
	for _, d := range t.Dims[1:] {
		if !d.Fixed {
			return false
		}
	}
	return len(t.Dims) > 0
}

// outputs are the output tensors for a batch of b: those whose shape the
// graph fixes (after the batch) are allocated once per batch size and
// reused; the rest are left to ORT (nil).
func (s *session) output(m *model, b int) ([]ort.Value, error) {
	if o, ok := s.outputs[b]; ok {
		return o, nil
	}
	out := make([]ort.Value, len(m.outInfo))
	for i, t := range m.outInfo {
		if !fixedTail(t) {
			continue
		}
		dims := []int64{int64(b)}
		for _, d := range t.Dims[1:] {
			dims = append(dims, d.Value)
		}
		shape := ort.NewShape(dims...)
		var err error
		if t.DType == "float16" {
			out[i], err = ort.NewCustomDataTensor(shape, make([]byte, 2*shape.FlattenedSize()), ort.TensorElementDataTypeFloat16)
		} else {
			out[i], err = ort.NewEmptyTensor[float32](shape)
		}
		if err != nil {
			for _, o := range out[:i] {
				if o != nil {
					o.Destroy()
				}
			}
			return nil, err
		}
	}
	s.outputs[b] = out
	return out, nil
}

func (s *session) close() {
	for _, t := range s.inputs {
		t.Destroy()
	}
	for _, outs := range s.outputs {
		for _, o := range outs {
			if o != nil {
				o.Destroy()
			}
		}
	}
	s.s.Destroy()
}

// acquire waits for a free session, or ctx's end, or the model's unload.
func (m *model) acquire(ctx context.Context) (*session, error) {
	select {
	case s, ok := <-m.sessions:
		if !ok {
			return nil, fmt.Errorf("onnx: model %s was unloaded", m.m.Name)
		}
		return s, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (m *model) close() {
	for _, s := range m.all {
		s.close()
	}
	m.all = nil
}

// Kind implements gpu.Executor.
func (x *Executor) Kind() string { return "onnx" }

// Describe says what runs where, for logs: "ONNX Runtime 1.30.0 (/path),
// cpu, 2 sessions per model, intra-op threads 0: face, resnet50".
func (x *Executor) Describe() string {
	env.Lock()
	v, lib := env.version, env.lib
	env.Unlock()
	return fmt.Sprintf("ONNX Runtime %s (%s), %s, %d sessions per model, intra-op threads %d: %s",
		v, lib, x.cfg.Device, x.cfg.Sessions, x.cfg.IntraThreads, strings.Join(x.Models(), ", "))
}

// Models lists the loaded models.
func (x *Executor) Models() []string {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return slices.Clone(x.names)
}

// loaded is the model if it is loaded, else an error that names the
// loaded ones.
func (x *Executor) loaded(name string) (*model, error) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	m := x.models[name]
	if m == nil {
		return nil, fmt.Errorf("onnx: model %q is not loaded here (loaded: %s)", name, strings.Join(x.names, ", "))
	}
	return m, nil
}

// Close frees every session. Batches must have ended.
func (x *Executor) Close() {
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, m := range x.models {
		m.close()
	}
	x.models, x.names = map[string]*model{}, nil
}

// Unload frees a model's sessions (the model repository extension: GPU
// memory as a cache of models). Later batches of it fail at once; the
// batches running finish first.
func (x *Executor) Unload(name string) error {
	x.mu.Lock()
	m := x.models[name]
	if m == nil {
		x.mu.Unlock()
		return fmt.Errorf("onnx: model %q is not loaded here (loaded: %s)", name, strings.Join(x.names, ", "))
	}
	delete(x.models, name)
	x.names = slices.DeleteFunc(x.names, func(n string) bool { return n == name })
	x.mu.Unlock()
	for range m.all { // every session back: no batch runs on it
		<-m.sessions
	}
	close(m.sessions) // batches still waiting for one fail (acquire)
	m.close()
	return nil
}

// Load loads an onnx model of the registry again after Unload (loaded
// already: nothing to do), as New loads it.
func (x *Executor) Load(name string) error {
	e := x.entries[name]
	if e == nil {
		return fmt.Errorf("onnx: model %q is not an onnx entry of the registry (entries: %s)", name, strings.Join(slices.Sorted(maps.Keys(x.entries)), ", "))
	}
	x.mu.RLock()
	_, done := x.models[name]
	x.mu.RUnlock()
	if done {
		return nil
	}
	lm, err := x.load(e)
	if err != nil {
		return err
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if _, done := x.models[name]; done { // a concurrent Load won
		lm.close()
		return nil
	}
	x.models[name] = lm
	x.names = nil
	for _, n := range slices.Sorted(maps.Keys(x.models)) {
		x.names = append(x.names, n)
	}
	return nil
}

// Run implements gpu.Executor: the items as one batch of one session Run.
func (x *Executor) Run(ctx context.Context, name string, items []*media.Item) ([][]*media.Item, error) {
	m, err := x.loaded(name)
	if err != nil {
		return nil, err
	}
	if len(items) == 0 {
		return nil, nil
	}
	if len(items) > m.m.MaxBatch {
		return nil, fmt.Errorf("onnx: model %s: batch of %d exceeds its max_batch %d", name, len(items), m.m.MaxBatch)
	}
	for i, it := range items {
		if it.Frame == nil {
			return nil, fmt.Errorf("onnx: model %s: item %d has no frame", name, i)
		}
		if err := it.Frame.Valid(); err != nil {
			return nil, fmt.Errorf("onnx: model %s: item %d: %w", name, i, err)
		}
	}
	waited := time.Now()
	s, err := m.acquire(ctx)
	if err != nil {
		return nil, err
	}
	queue.Add(ctx, time.Since(waited))
	defer func() { m.sessions <- s }()
	res, err := x.run(m, s, items)
	if err != nil {
		return nil, fmt.Errorf("onnx: model %s, batch of %d: %w", name, len(items), err)
	}
	out := make([][]*media.Item, len(items))
	for i, it := range items {
		o := it.Derive()
		o.Frame, o.Region = it.Frame, it.Region
		o.Boxes, o.Labels = res[i].Boxes, res[i].Labels
		out[i] = []*media.Item{o}
	}
	return out, nil
}

// RunRaw runs one batch and returns each item's outputs undecoded (tests,
// benchmarks, `mdag profile`).
func (x *Executor) RunRaw(name string, frames []*media.Frame) ([][]decode.Output, error) {
	m, err := x.loaded(name)
	if err != nil {
		return nil, err
	}
	if len(frames) == 0 || len(frames) > m.m.MaxBatch {
		return nil, fmt.Errorf("onnx: model %s: batch of %d: want 1..%d", name, len(frames), m.m.MaxBatch)
	}
	s, err := m.acquire(context.Background())
	if err != nil {
		return nil, err
	}
	defer func() { m.sessions <- s }()
	return x.forward(m, s, frames)
}

func (x *Executor) run(m *model, s *session, items []*media.Item) ([]decode.Result, error) {
	frames := make([]*media.Frame, len(items))
	for i, it := range items {
		frames[i] = it.Frame
	}
	outs, err := x.forward(m, s, frames)
	if err != nil {
		return nil, err
	}
	res := make([]decode.Result, len(items))
	p := m.m.Params()
	for i, f := range frames {
		g := decode.Geometry{InW: m.m.Input.Width, InH: m.m.Input.Height, FrameW: f.W, FrameH: f.H, Letterbox: m.m.Input.Resize == "letterbox"}
		if res[i], err = m.decode(outs[i], g, p); err != nil {
			return nil, fmt.Errorf("item %d: %w", i, err)
		}
	}
	return res, nil
}

// forward preprocesses the frames into the session's buffer, runs the
// session once and splits each output along its leading (batch) dimension.
func (x *Executor) forward(m *model, s *session, frames []*media.Frame) ([][]decode.Output, error) {
	in := &m.m.Input
	for i, f := range frames {
		switch {
		case s.f32 != nil:
			prep.Fill(s.f32[i*s.item:(i+1)*s.item], f, in)
		case s.u8 != nil:
			prep.FillU8(s.u8[i*s.item:(i+1)*s.item], f, in)
		default:
			prep.Fill(s.scratch, f, in)
			for j, v := range s.scratch {
				h := prep.ToHalf(float64(v))
				s.f16[2*(i*s.item+j)], s.f16[2*(i*s.item+j)+1] = byte(h), byte(h>>8)
			}
		}
	}
	return x.infer(m, s, len(frames))
}

// runOnce runs the session once on the first n items of its buffer and
// returns its outputs, each with a leading dimension of n; release frees
// what ORT allocated (the outputs are valid until then).
func (x *Executor) runOnce(m *model, s *session, n int) (outs []ort.Value, release func(), err error) {
	t, err := s.input(m.m, n)
	if err != nil {
		return nil, nil, err
	}
	kept, err := s.output(m, n)
	if err != nil {
		return nil, nil, err
	}
	outs = slices.Clone(kept)
	if err := s.s.Run([]ort.Value{t}, outs); err != nil {
		return nil, nil, err
	}
	release = func() {
		for i, o := range outs {
			if o != nil && kept[i] == nil {
				o.Destroy()
			}
		}
	}
	for oi, o := range outs {
		shape := o.GetShape()
		if len(shape) == 0 || shape[0] != int64(n) {
			release()
			return nil, nil, fmt.Errorf("output %s has shape %v: its leading dimension is not the batch of %d", m.outs[oi], shape, n)
		}
	}
	return outs, release, nil
}

// infer runs the session once on the first n items of its buffer and
// splits each output along its leading (batch) dimension.
func (x *Executor) infer(m *model, s *session, n int) ([][]decode.Output, error) {
	outs, release, err := x.runOnce(m, s, n)
	if err != nil {
		return nil, err
	}
	defer release()
	res := make([][]decode.Output, n)
	for oi, o := range outs {
		data, err := floats(o)
		if err != nil {
			return nil, fmt.Errorf("output %s: %w", m.outs[oi], err)
		}
		shape := o.GetShape()
		per := len(data) / n
		for i := range n {
			res[i] = append(res[i], decode.Output{Name: m.outs[oi], Shape: slices.Clone(shape[1:]), Data: slices.Clone(data[i*per : (i+1)*per])})
		}
	}
	return res, nil
}

// floats reads an output as float32 values.
func floats(v ort.Value) ([]float32, error) {
	switch t := v.(type) {
	case *ort.Tensor[float32]:
		return t.GetData(), nil
	case *ort.CustomDataTensor:
		b := t.GetData()
		out := make([]float32, len(b)/2)
		for i := range out {
			out[i] = prep.FromHalf(uint16(b[2*i]) | uint16(b[2*i+1])<<8)
		}
		return out, nil
	}
	return nil, fmt.Errorf("%T: decoders read float32 or float16 tensors", v)
}

// TensorInfo describes an input or output tensor of a loaded model: the
// dtype as the registry names it (float32, float16, uint8) and the shape,
// -1 for the batch (always the leading dimension) and for any other
// dimension the graph leaves symbolic.
type TensorInfo struct {
	Name  string
	DType string
	Shape []int64
}

// ModelInfo describes a loaded model as Infer takes and answers it.
type ModelInfo struct {
	Name     string
	MaxBatch int
	Input    TensorInfo
	Outputs  []TensorInfo // in the order Infer returns them
}

// Meta describes a loaded model (false when it is not loaded here).
func (x *Executor) Meta(name string) (ModelInfo, bool) {
	m, err := x.loaded(name)
	if err != nil {
		return ModelInfo{}, false
	}
	in := m.m.InputShape(1)
	in[0] = -1
	info := ModelInfo{Name: name, MaxBatch: m.m.MaxBatch, Input: TensorInfo{Name: m.m.Input.Name, DType: m.m.Input.DType, Shape: in}}
	for i, o := range m.outInfo {
		t := TensorInfo{Name: m.outs[i], DType: "float32", Shape: make([]int64, len(o.Dims))}
		if o.DType == "float16" {
			t.DType = "float16"
		}
		for j, d := range o.Dims {
			t.Shape[j] = -1
			if j > 0 && d.Fixed {
				t.Shape[j] = d.Value
			}
		}
		info.Outputs = append(info.Outputs, t)
	}
	return info, true
}

// RawOutput is one output tensor of a whole batch: raw little-endian
// bytes, row-major, of DType (float32, or float16 when the graph's output
// is float16).
type RawOutput struct {
	Name  string
	DType string
	Shape []int64
	Data  []byte
}

// Infer runs one batch of already preprocessed input: input is the input
// tensor of batch items as raw little-endian bytes of the model's input
// dtype and layout (what prep.Pack writes, what the Open Inference
// Protocol carries). It is copied into a session's batch buffer and run
// as Run runs a batch; the outputs come back whole, batch leading.
func (x *Executor) Infer(ctx context.Context, name string, batch int, input []byte) ([]RawOutput, error) {
	m, err := x.loaded(name)
	if err != nil {
		return nil, err
	}
	if batch < 1 || batch > m.m.MaxBatch {
		return nil, fmt.Errorf("onnx: model %s: batch of %d: want 1..%d (max_batch)", name, batch, m.m.MaxBatch)
	}
	if want := batch * prep.ItemBytes(&m.m.Input); len(input) != want {
		return nil, fmt.Errorf("onnx: model %s: input '%s' of a batch of %d is %d bytes, %s %v needs %d", name, m.m.Input.Name, batch, len(input), m.m.Input.DType, m.m.InputShape(batch), want)
	}
	s, err := m.acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { m.sessions <- s }()
	switch {
	case s.f32 != nil:
		for i := range batch * s.item {
			s.f32[i] = math.Float32frombits(binary.LittleEndian.Uint32(input[4*i:]))
		}
	case s.u8 != nil:
		copy(s.u8, input)
	default:
		copy(s.f16, input)
	}
	outs, release, err := x.runOnce(m, s, batch)
	if err != nil {
		return nil, fmt.Errorf("onnx: model %s, batch of %d: %w", name, batch, err)
	}
	defer release()
	res := make([]RawOutput, len(outs))
	for i, o := range outs {
		r := RawOutput{Name: m.outs[i], Shape: slices.Clone(o.GetShape())}
		switch t := o.(type) {
		case *ort.Tensor[float32]:
			d := t.GetData()
			r.DType, r.Data = "float32", make([]byte, 4*len(d))
			for j, v := range d {
				binary.LittleEndian.PutUint32(r.Data[4*j:], math.Float32bits(v))
			}
		case *ort.CustomDataTensor:
			r.DType, r.Data = "float16", slices.Clone(t.GetData())
		default:
			return nil, fmt.Errorf("onnx: model %s: output %s is %T: want float32 or float16", name, m.outs[i], o)
		}
		res[i] = r
	}
	return res, nil
}
