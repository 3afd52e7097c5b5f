//go:build !lean

package main

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"sort"
	"strings"

	"gocv.io/x/gocv"

	"github.com/mdag/mdag/gpu/onnx"
	"github.com/mdag/mdag/gpu/registry"
	"github.com/mdag/mdag/media"
	"github.com/mdag/mdag/modules"
	"github.com/mdag/mdag/modules/cv"
)

// mdag trace measures objects per frame: it reads a video file with OpenCV,
// samples its frames by timestamp at --fps and runs one real detector on
// each sampled frame, writing `t_s,objects` as CSV after one comment line
// that names the video (and its sha256), the detector with every param,
// the rates and this binary. The traces under examples/traces are made
// with it (make traces).

const traceSynopsis = "--video FILE --detector hog|haar|motion|blazeface [--fps 10] [--out FILE] [--max-frames N] [--models examples/models.yaml] [--ort-lib PATH]"

// traceDetectors are the detectors and the module op each runs (blazeface:
// the registry model of that name on ONNX Runtime).
var traceDetectors = map[string]string{"hog": "hog-people", "haar": "haar-face", "motion": "motion", "blazeface": "blazeface"}

func runTrace(args []string, stdout, stderr io.Writer) int {
	return execute("trace", traceSynopsis, new(traceCmd), args, stdout, stderr)
}

// traceCmd is mdag trace's options.
type traceCmd struct {
	video, detector, out, models, ortLib string
	fps                                  float64
	maxFrames                            int
}

func (c *traceCmd) flags(fs *flag.FlagSet) {
	fs.StringVar(&c.video, "video", "", "the video file to read (any OpenCV reads: .avi, .mp4, ...)")
	fs.StringVar(&c.detector, "detector", "", "hog (hog-people op), haar (haar-face op), motion (motion op: MOG2, one model over the sampled frames) or blazeface (the registry's blazeface model on ONNX Runtime)")
	fs.Float64Var(&c.fps, "fps", 10, "frames sampled per second of video (by timestamp); above the video's rate every frame is taken")
	fs.StringVar(&c.out, "out", "", "write the CSV here (default: stdout)")
	fs.IntVar(&c.maxFrames, "max-frames", 0, "stop after this many sampled frames (0: the whole video)")
	fs.StringVar(&c.models, "models", "examples/models.yaml", "with --detector blazeface: the model registry holding the blazeface entry")
	fs.StringVar(&c.ortLib, "ort-lib", onnx.DefaultLib(), "with --detector blazeface: the ONNX Runtime shared library (env "+onnx.LibEnv+"; make deps installs it)")
}

func (c *traceCmd) validate(fs *flag.FlagSet) []error {
	var bad []error
	if c.video == "" {
		bad = append(bad, errors.New("--video is required"))
	}
	if _, ok := traceDetectors[c.detector]; !ok {
		bad = append(bad, fmt.Errorf("--detector %q: want one of %s", c.detector, strings.Join(traceDetectorNames(), ", ")))
	}
	if !(c.fps > 0) || math.IsInf(c.fps, 0) {
		bad = append(bad, fmt.Errorf("--fps %v: must be > 0", c.fps))
	}
	if c.maxFrames < 0 {
		bad = append(bad, fmt.Errorf("--max-frames %d: must be >= 0 (0: the whole video)", c.maxFrames))
	}
	if c.detector != "blazeface" {
		for _, name := range []string{"models", "ort-lib"} {
			if flagGiven(fs, name) {
				bad = append(bad, fmt.Errorf("--%s needs --detector blazeface", name))
			}
		}
	}
	return bad
}

func (c *traceCmd) run(env *cmdEnv) error {
	sum, err := fileSHA256(c.video)
	if err != nil {
		return invalidf("--video: %v", err)
	}
	vc, vfps, err := openTraceVideo(c.video)
	if err != nil {
		return err
	}
	defer vc.Close()
	det, params, err := newTraceDetector(c.detector, c.models, c.ortLib)
	if err != nil {
		return fmt.Errorf("detector %s: %w", c.detector, err)
	}
	defer det.Close()
	w, closeOut, err := c.output(env.stdout)
	if err != nil {
		return err
	}
	bw := bufio.NewWriter(w)
	fmt.Fprintf(bw, "# mdag trace: video=%s sha256=%s detector=%s params=%s fps=%g video_fps=%g size=%dx%d mdag=%s commit=%s\n",
		filepath.Base(c.video), sum, c.detector, params, c.fps, vfps,
		int(vc.Get(gocv.VideoCaptureFrameWidth)), int(vc.Get(gocv.VideoCaptureFrameHeight)), version, vcsRevision())
	fmt.Fprintln(bw, "t_s,objects")
	n, err := traceVideo(vc, c.video, vfps, c.fps, c.maxFrames, det, bw)
	if err == nil {
		err = bw.Flush()
	}
	if cerr := closeOut(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(env.stderr, "mdag trace: %d frames of %s sampled at %g fps through %s\n", n, c.video, c.fps, c.detector)
	return nil
}

// output is where the CSV goes: --out, or stdout.
func (c *traceCmd) output(stdout io.Writer) (io.Writer, func() error, error) {
	if c.out == "" {
		return stdout, func() error { return nil }, nil
	}
	f, err := os.Create(c.out)
	if err != nil {
		return nil, nil, fmt.Errorf("--out: %w", err)
	}
	return f, f.Close, nil
}

// openTraceVideo opens a video for tracing and reads its frame rate; a
// file OpenCV cannot read as video, or one without a usable rate, is
// refused before any output is written.
func openTraceVideo(path string) (*gocv.VideoCapture, float64, error) {
	if err := probeVideo(path); err != nil {
		return nil, 0, invalidf("--video %v", err)
	}
	vc, err := gocv.VideoCaptureFile(path)
	if err != nil || !vc.IsOpened() {
		if vc != nil {
			vc.Close()
		}
		return nil, 0, fmt.Errorf("--video %s: OpenCV cannot open it as video (%v)", path, errOrNone(err))
	}
	vfps := vc.Get(gocv.VideoCaptureFPS)
	if !(vfps > 0) || vfps > 1000 {
		vc.Close()
		return nil, 0, invalidf("--video %s: the container gives no usable frame rate (%v); timestamps cannot be computed", path, vfps)
	}
	return vc, vfps, nil
}

// probeVideo opens path and reads its first frame, so a file OpenCV
// cannot read as video is refused before any output is written.
func probeVideo(path string) error {
	vc, err := gocv.VideoCaptureFile(path)
	if err != nil || !vc.IsOpened() {
		if vc != nil {
			vc.Close()
		}
		return fmt.Errorf("%s: OpenCV cannot open it as video (%v)", path, errOrNone(err))
	}
	defer vc.Close()
	m := gocv.NewMat()
	defer m.Close()
	if !vc.Read(&m) || m.Empty() {
		return fmt.Errorf("%s: OpenCV opened it but read no frame (not a video it can decode, or empty)", path)
	}
	if m.Type() != gocv.MatTypeCV8UC3 {
		return fmt.Errorf("%s: frames of type %v, want 8-bit BGR", path, m.Type())
	}
	return nil
}

func traceDetectorNames() []string {
	names := make([]string, 0, len(traceDetectors))
	for n := range traceDetectors {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

func errOrNone(err error) error {
	if err == nil {
		return errors.New("not opened")
	}
	return err
}

// fileSHA256 hashes path, saying what is wrong when it is not a readable
// regular file.
func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return "", err
	}
	if !st.Mode().IsRegular() {
		return "", fmt.Errorf("%s is not a regular file", path)
	}
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// buildCommit is the commit the binary was built from, set by the linker
// (make traces: -ldflags "-X main.buildCommit=..."); else Go's VCS stamp.
var buildCommit string

// vcsRevision is the commit this binary was built from (with "+dirty"
// when the tree had changes), or "unknown" (go test, go run, a build
// without either stamp).
func vcsRevision() string {
	if buildCommit != "" {
		return buildCommit
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	rev, dirty := "", false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if rev == "" {
		return "unknown"
	}
	if dirty {
		rev += "+dirty"
	}
	return rev
}

// traceVideo reads every frame, takes those whose timestamp (index /
// video rate) reaches the next sampling instant k/fps, counts their
// objects and writes a line each. It returns the frames sampled.
func traceVideo(vc *gocv.VideoCapture, name string, vfps, fps float64, maxFrames int, det traceDetector, w io.Writer) (int, error) {
	mat := gocv.NewMat()
	defer mat.Close()
	const eps = 1e-9
	next, sampled := 0.0, 0
	for i := 0; maxFrames == 0 || sampled < maxFrames; i++ {
		if !vc.Read(&mat) || mat.Empty() {
			return sampled, nil
		}
		t := float64(i) / vfps
		if t+eps < next {
			continue
		}
		next = (math.Floor(t*fps+eps) + 1) / fps
		if mat.Type() != gocv.MatTypeCV8UC3 {
			return sampled, fmt.Errorf("%s: frame %d is of type %v, want 8-bit BGR", name, i, mat.Type())
		}
		n, err := det.Count(cv.FromMat(mat), uint64(sampled))
		if err != nil {
			return sampled, fmt.Errorf("%s: frame %d (t=%.3f s): %w", name, i, t, err)
		}
		if _, err := fmt.Fprintf(w, "%.3f,%d\n", t, n); err != nil {
			return sampled, err
		}
		sampled++
	}
	return sampled, nil
}

// traceDetector counts the objects in one sampled frame.
type traceDetector interface {
	Count(f *media.Frame, seq uint64) (int, error)
	Close()
}

// traceStream is the one stream a trace feeds a stateful op.
const traceStream = "trace"

// newTraceDetector builds the detector and describes its params (every
// param with its value, defaults included).
func newTraceDetector(name, models, ortLib string) (traceDetector, string, error) {
	op := traceDetectors[name]
	if name == "blazeface" {
		return newBlazeTrace(models, ortLib)
	}
	p, err := modules.DecodeParams(modules.OpID(op), nil)
	if err != nil {
		return nil, "", err
	}
	reg := modules.NewRegistry()
	if err := cv.Register(reg); err != nil {
		return nil, "", err
	}
	proc, err := reg.New(modules.OpID(op), nil)
	if err != nil {
		return nil, "", err
	}
	return opTrace{proc: proc}, describeParams(op, p), nil
}

// describeParams writes op's params as op{k:v,...} in key order.
func describeParams(op string, p modules.Params) string {
	keys := make([]string, 0, len(p))
	for k := range p {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s:%v", k, p[k])
	}
	return op + "{" + strings.Join(parts, ",") + "}"
}

// opTrace runs a module op: a stateful one (motion) frame by frame as the
// runtime does (ProcessFrame, one stream, seq increasing), the others with
// Process. Objects are the boxes of its outputs.
type opTrace struct{ proc modules.Processor }

func (o opTrace) Count(f *media.Frame, seq uint64) (int, error) {
	it := &media.Item{Stream: traceStream, Seq: seq, Frame: f}
	var (
		outs []*media.Item
		err  error
	)
	if s, ok := o.proc.(modules.Stateful); ok {
		outs, err = s.ProcessFrame(traceStream, seq, []*media.Item{it})
	} else {
		outs, err = o.proc.Process(it)
	}
	if err != nil {
		return 0, err
	}
	n := 0
	for _, o := range outs {
		n += len(o.Boxes)
	}
	return n, nil
}

func (o opTrace) Close() { o.proc.Close() }

// blazeTrace runs the registry's blazeface model on ONNX Runtime, one
// frame a batch.
type blazeTrace struct{ x *onnx.Executor }

func newBlazeTrace(models, ortLib string) (traceDetector, string, error) {
	reg, err := registry.Load(models)
	if err != nil {
		return nil, "", err
	}
	m, ok := reg.Models["blazeface"]
	if !ok {
		return nil, "", fmt.Errorf("%s has no blazeface entry (it has: %s)", models, strings.Join(reg.Names(), ", "))
	}
	if m.Format != "onnx" {
		return nil, "", fmt.Errorf("%s: blazeface is format %s, want onnx", models, m.Format)
	}
	if _, err := os.Stat(m.Path); err != nil {
		return nil, "", fmt.Errorf("model file: %w (make models builds it)", err)
	}
	// Only blazeface is loaded: the registry's other models are not needed.
	one := &registry.Registry{File: reg.File, Models: map[string]*registry.Model{"blazeface": m}}
	x, err := onnx.New(one, onnx.Config{Lib: ortLib, Sessions: 1})
	if err != nil {
		return nil, "", err
	}
	d := m.Decoder
	return blazeTrace{x: x}, fmt.Sprintf("blazeface{file:%s,input:%dx%d,threshold:%g,nms:%g}", filepath.Base(m.File), m.Input.Width, m.Input.Height, d.Threshold, d.NMS), nil
}

func (b blazeTrace) Count(f *media.Frame, seq uint64) (int, error) {
	outs, err := b.x.Run(context.Background(), "blazeface", []*media.Item{{Stream: traceStream, Seq: seq, Frame: f}})
	if err != nil {
		return 0, err
	}
	n := 0
	for _, o := range outs[0] {
		n += len(o.Boxes)
	}
	return n, nil
}

func (b blazeTrace) Close() { b.x.Close() }
