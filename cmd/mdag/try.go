package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"hash/fnv"
	"image"
	"image/color"
	"image/draw"
	_ "image/gif"  // image.Decode reads GIFs too
	_ "image/jpeg" // and JPEGs
	"image/png"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"

	"github.com/mdag/mdag/gpu"
	"github.com/mdag/mdag/gpu/kserve"
	"github.com/mdag/mdag/gpu/onnx"
	"github.com/mdag/mdag/gpu/registry"
	"github.com/mdag/mdag/media"
)

// mdag try runs one registry model, or a whole app, on an image (PNG,
// JPEG, GIF) or the first frames of a video file (the full build reads
// videos with OpenCV) on a real executor, and says what it found: JSON on
// stdout (per frame the boxes with class, score and the colour they are
// drawn in, and a classifier's labels; an app's frames also their outcome,
// latency, counts and events) and, with --out, the frame annotated as a
// PNG (boxes, class and score tags, keypoints; a video's frames as one PNG
// each, --out's name with -0000, -0001, ... before the extension). It is
// the step between `mdag models inspect` and serving: see a model's
// decoder, threshold and preprocessing work on a picture first, then the
// app's whole graph (try_app.go) on the same picture.

const trySynopsis = "(--models models.yaml --model NAME | -f app.yaml -p profiles.yaml --models models.yaml | --example NAME --models models.yaml) " +
	"[--executor onnx|kserve] [--device cpu|cuda] [--ort-lib PATH] [--threshold T] [--max-frames 8] [--out FILE.png] FILE"

func runTry(args []string, stdout, stderr io.Writer) int {
	return executeArgs("try", trySynopsis, func() positional { return new(tryCmd) }, args, stdout, stderr)
}

// tryCmd is mdag try's options.
type tryCmd struct {
	models, model              string // one model
	file, profiles, example    string // or an app
	executor, device, lib, out string
	threshold                  float64
	maxFrames                  int
	inputs                     []string // the positional arguments: one image or video
}

func (c *tryCmd) setArgs(args []string) { c.inputs = args }

func (c *tryCmd) flags(fs *flag.FlagSet) {
	fs.StringVar(&c.models, "models", "", "the model registry (models.yaml) that names --model, or the app's GPU modules' models")
	fs.StringVar(&c.model, "model", "", "the registry entry to run (or -f/-p or --example: a whole app)")
	fs.StringVar(&c.file, "f", "", "run this app's whole graph instead of one model (with -p)")
	fs.StringVar(&c.profiles, "p", "", "the app's profiles (with -f): the plan its frames run on")
	fs.StringVar(&c.example, "example", "", "run an embedded example app's whole graph instead of one model (e.g. face-live)")
	fs.StringVar(&c.executor, "executor", "onnx", "the executor that runs it: onnx (ONNX Runtime; format: onnx entries) or kserve (the entry's Open Inference Protocol server; format: kserve)")
	fs.StringVar(&c.device, "device", "cpu", "with --executor onnx: cpu or cuda")
	fs.StringVar(&c.lib, "ort-lib", onnx.DefaultLib(), "with --executor onnx: the ONNX Runtime shared library (env "+onnx.LibEnv+"; make deps installs it)")
	fs.Float64Var(&c.threshold, "threshold", -1, "the score a detection needs, instead of the entry's decoder threshold (0..1; -1: the entry's; one model only)")
	fs.IntVar(&c.maxFrames, "max-frames", 8, "for a video: the frames to run, from the first")
	fs.StringVar(&c.out, "out", "", "write the annotated frame here as a PNG (a video: one PNG per frame, FILE-0000.png, FILE-0001.png, ...); default none")
}

// isApp says whether try runs a whole app rather than one model.
// app is -f, -p and --example.
func (c *tryCmd) app() appInputs { return appInputs{c.file, c.profiles, c.example} }

func (c *tryCmd) isApp() bool { return c.file != "" || c.profiles != "" || c.example != "" }

func (c *tryCmd) validate(*flag.FlagSet) []error {
	threshold := c.threshold != -1
	appErr := c.app().problem()
	return failed(
		problem{len(c.inputs) != 1, fmt.Sprintf("want one image or video file, got %d arguments", len(c.inputs))},
		problem{c.isApp() && c.model != "", "give --model NAME (one model) or -f/-p or --example (a whole app), not both"},
		problem{c.isApp() && c.model == "" && appErr != nil, fmt.Sprint(appErr)},
		problem{c.models == "" || (!c.isApp() && c.model == ""),
			"--models models.yaml and --model NAME are required (or -f app.yaml -p profiles.yaml --models models.yaml for a whole app)"},
		problem{c.executor == "emulated",
			"--executor emulated reports the objects a synthetic source drew into its frames; a file's frames carry none: try runs the models themselves (onnx or kserve)"},
		problem{c.executor != "emulated" && c.executor != "onnx" && c.executor != "kserve", fmt.Sprintf("--executor %q: want onnx or kserve", c.executor)},
		problem{c.maxFrames < 1, fmt.Sprintf("--max-frames %d: must be >= 1", c.maxFrames)},
		problem{threshold && (c.threshold < 0 || c.threshold > 1), fmt.Sprintf("--threshold %g: want 0..1", c.threshold)},
		problem{threshold && c.isApp(), "--threshold is for one model: an app's models run with their registry thresholds"},
		problem{c.out != "" && !strings.EqualFold(filepath.Ext(c.out), ".png"), fmt.Sprintf("--out %s: want a .png file", c.out)},
	)
}

func (c *tryCmd) run(env *cmdEnv) error {
	tr, frames, err := c.build(env.stderr)
	if err != nil {
		return err
	}
	defer tr.close()
	for i, f := range frames {
		tf, err := c.frame(tr, i, f)
		if err != nil {
			return err
		}
		tr.res.Frames = append(tr.res.Frames, tf)
	}
	writeJSON(env.stdout, tr.res, true)
	c.summary(env.stderr, tr.res)
	return nil
}

// build loads the registry and the input's frames, and starts what the
// frames run through: the model, or the app.
func (c *tryCmd) build(stderr io.Writer) (*tryRun, []*media.Frame, error) {
	reg, err := registry.Load(c.models)
	if err != nil {
		return nil, nil, invalid(err)
	}
	frames, kind, err := readFrames(c.inputs[0], c.maxFrames)
	if err != nil {
		return nil, nil, invalid(err)
	}
	var tr *tryRun
	if c.isApp() {
		tr, err = c.startApp(reg, stderr)
	} else {
		tr, err = c.startModel(reg)
	}
	if err != nil {
		return nil, nil, err
	}
	tr.res.Executor, tr.res.Input, tr.res.Kind = c.executor, c.inputs[0], kind
	return tr, frames, nil
}

// frame runs frame i and draws what it found (--out): a video's frames
// one PNG each.
func (c *tryCmd) frame(tr *tryRun, i int, f *media.Frame) (tryFrame, error) {
	tf, err := tr.step(i, f)
	if err != nil {
		return tf, fmt.Errorf("frame %d: %w", i, err)
	}
	tf.Frame, tf.Width, tf.Height = i, f.W, f.H
	if c.out == "" {
		return tf, nil
	}
	tf.PNG = c.out
	if tr.res.Kind == "video" {
		ext := filepath.Ext(c.out)
		tf.PNG = fmt.Sprintf("%s-%04d%s", strings.TrimSuffix(c.out, ext), i, ext)
	}
	if err := writePNG(tf.PNG, annotate(f, tf)); err != nil {
		return tf, fmt.Errorf("--out: %w", err)
	}
	return tf, nil
}

// summary says on stderr what ran and what it found (stdout is the JSON).
func (c *tryCmd) summary(stderr io.Writer, res tryResult) {
	n := 0
	for _, f := range res.Frames {
		n += len(f.Boxes)
	}
	what := res.Model
	if res.App != "" {
		what = "app " + res.App
	}
	fmt.Fprintf(stderr, "mdag try: %d frame(s) of %s through %s on %s: %d box(es)", len(res.Frames), c.inputs[0], what, c.executor, n)
	if c.out != "" {
		fmt.Fprintf(stderr, ", drawn in %s", res.Frames[0].PNG)
		if len(res.Frames) > 1 {
			fmt.Fprintf(stderr, " .. %s", res.Frames[len(res.Frames)-1].PNG)
		}
	}
	fmt.Fprintln(stderr)
}

// tryRun is what try runs each frame through: one model, or an app.
type tryRun struct {
	res   tryResult                                     // filled but for the frames
	step  func(i int, f *media.Frame) (tryFrame, error) // one frame's boxes and labels
	close func()
}

// startModel loads one registry model on the executor.
func (c *tryCmd) startModel(reg *registry.Registry) (*tryRun, error) {
	m, err := reg.Get(c.model)
	if err != nil {
		return nil, invalid(err)
	}
	if m.Format != c.executor {
		return nil, invalidf("model %s is format %s: --executor %s runs format: %s entries", m.Name, m.Format, c.executor, c.executor)
	}
	if c.threshold >= 0 {
		m.Decoder.Threshold = c.threshold
	}
	// only this model is loaded: the registry's others are not needed
	one := &registry.Registry{File: reg.File, Models: map[string]*registry.Model{m.Name: m}}
	x, err := tryExecutor(one, c.executor, c.device, c.lib)
	if err != nil {
		return nil, err
	}
	step := func(i int, f *media.Frame) (tryFrame, error) {
		outs, err := x.Run(context.Background(), m.Name, []*media.Item{{Stream: "try", Seq: uint64(i), Frame: f}})
		if err != nil {
			return tryFrame{}, err
		}
		tf := tryFrame{Boxes: []tryBox{}, Labels: []string{}}
		for _, o := range outs[0] {
			tf.Boxes = append(tf.Boxes, tryBoxes(o.Boxes, m.Labels)...)
			tf.Labels = append(tf.Labels, o.Labels...)
		}
		return tf, nil
	}
	return &tryRun{res: tryResult{Model: m.Name, Threshold: m.Decoder.Threshold}, step: step, close: x.Close}, nil
}

// tryExecutor is the executor of reg's models: ONNX Runtime (one session
// a model) or Open Inference Protocol servers. It is not buildExecutor's:
// try has none of the worker's --intra-threads, --sessions and --slots,
// and loads only the models it runs (with --threshold applied).
func tryExecutor(reg *registry.Registry, executor, device, lib string) (interface {
	gpu.Executor
	Close()
}, error) {
	if executor == "kserve" {
		return kserve.New(reg, kserve.Config{})
	}
	return onnx.New(reg, onnx.Config{Lib: lib, Device: device, Sessions: 1})
}

// tryBoxes are boxes as try's JSON has them, coloured by class (labels:
// the model's classes, which fix each one's colour).
func tryBoxes(bs []media.Box, labels []string) []tryBox {
	var out []tryBox
	for _, b := range bs {
		tb := tryBox{X: b.X, Y: b.Y, W: b.W, H: b.H, Class: b.Class, Score: b.Score, Colour: hexColour(boxColour(b.Class, labels))}
		if b.Keypoints != nil {
			for _, p := range b.Keypoints.Points {
				tb.Keypoints = append(tb.Keypoints, [3]float32{p.X, p.Y, p.Score})
			}
		}
		out = append(out, tb)
	}
	return out
}

// tryResult is mdag try's JSON.
type tryResult struct {
	Model     string     `json:"model,omitempty"` // one model's run
	App       string     `json:"app,omitempty"`   // or an app's
	Executor  string     `json:"executor"`
	Input     string     `json:"input"`
	Kind      string     `json:"kind"` // image or video
	Threshold float64    `json:"threshold,omitempty"`
	SLOMillis float64    `json:"slo_ms,omitempty"` // an app's
	Frames    []tryFrame `json:"frames"`
}

type tryFrame struct {
	Frame  int      `json:"frame"` // 0-based, in file order
	Width  int      `json:"width"`
	Height int      `json:"height"`
	Boxes  []tryBox `json:"boxes"`
	Labels []string `json:"labels"` // a classifier's
	// an app's frame: how it ended (finished, late, dropped), in how long,
	// and a drop's module and reason; its sinks' counts and events
	Outcome   string         `json:"outcome,omitempty"`
	LatencyMS float64        `json:"latency_ms,omitempty"`
	Module    string         `json:"module,omitempty"`
	Reason    string         `json:"reason,omitempty"`
	Counts    map[string]int `json:"counts,omitempty"`
	Events    []tryEvent     `json:"events,omitempty"`
	PNG       string         `json:"png,omitempty"`
}

type tryEvent struct {
	Kind   string `json:"kind"`
	Rule   string `json:"rule"`
	Track  uint64 `json:"track,omitempty"`
	Detail string `json:"detail,omitempty"`
}

type tryBox struct {
	X         int          `json:"x"`
	Y         int          `json:"y"`
	W         int          `json:"w"`
	H         int          `json:"h"`
	Class     string       `json:"class"`
	Score     float32      `json:"score"`
	Colour    string       `json:"colour"` // #rrggbb, the box's colour in the PNG
	Keypoints [][3]float32 `json:"keypoints,omitempty"`
}

// readFrames reads an image (PNG, JPEG, GIF: one frame), else a video's
// first max frames (readVideo: the full build's OpenCV).
func readFrames(path string, max int) ([]*media.Frame, string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, "", err
	}
	img, _, err := image.Decode(bytes.NewReader(b))
	if err == nil {
		return []*media.Frame{frameOf(img)}, "image", nil
	}
	if !errors.Is(err, image.ErrFormat) {
		return nil, "", fmt.Errorf("%s: %w", path, err)
	}
	frames, err := readVideo(path, max)
	if err != nil {
		return nil, "", err
	}
	return frames, "video", nil
}

// frameOf converts an image to a BGR frame.
func frameOf(img image.Image) *media.Frame {
	r := img.Bounds()
	f := media.NewFrame(r.Dx(), r.Dy())
	for y := range f.H {
		for x := range f.W {
			c := color.NRGBAModel.Convert(img.At(r.Min.X+x, r.Min.Y+y)).(color.NRGBA)
			i := (y*f.W + x) * 3
			f.Pix[i], f.Pix[i+1], f.Pix[i+2] = c.B, c.G, c.R
		}
	}
	return f
}

// tryPalette are the boxes' colours, by class.
var tryPalette = []color.RGBA{
	{255, 56, 56, 255}, {255, 157, 151, 255}, {255, 112, 31, 255}, {255, 178, 29, 255}, {207, 210, 49, 255},
	{72, 249, 10, 255}, {146, 204, 23, 255}, {61, 219, 134, 255}, {26, 147, 52, 255}, {0, 212, 187, 255},
	{44, 153, 168, 255}, {0, 194, 255, 255}, {52, 69, 147, 255}, {100, 115, 255, 255}, {0, 24, 236, 255},
	{132, 56, 255, 255}, {82, 0, 133, 255}, {203, 56, 255, 255}, {255, 149, 200, 255}, {255, 55, 199, 255},
}

// boxColour is a class's colour: by its index in the labels, else by a
// hash of its name.
func boxColour(class string, labels []string) color.RGBA {
	if i := slices.Index(labels, class); i >= 0 {
		return tryPalette[i%len(tryPalette)]
	}
	h := fnv.New32a()
	h.Write([]byte(class))
	return tryPalette[h.Sum32()%uint32(len(tryPalette))]
}

func hexColour(c color.RGBA) string { return fmt.Sprintf("#%02x%02x%02x", c.R, c.G, c.B) }

func parseHex(s string) color.RGBA {
	var c color.RGBA
	fmt.Sscanf(s, "#%02x%02x%02x", &c.R, &c.G, &c.B)
	c.A = 255
	return c
}

// annotate draws the frame's boxes (a 2-pixel or thicker outline inside
// the box), a tag with class and score above each (inside when at the
// top), keypoints as dots, and a classifier's labels at the top left.
func annotate(f *media.Frame, tf tryFrame) *image.RGBA {
	img := image.NewRGBA(image.Rect(0, 0, f.W, f.H))
	for y := range f.H {
		for x := range f.W {
			i := (y*f.W + x) * 3
			img.SetRGBA(x, y, color.RGBA{f.Pix[i+2], f.Pix[i+1], f.Pix[i], 255})
		}
	}
	t := max(2, min(f.W, f.H)/240)
	fill := func(r image.Rectangle, c color.RGBA) {
		draw.Draw(img, r.Intersect(img.Bounds()), image.NewUniform(c), image.Point{}, draw.Src)
	}
	face := basicfont.Face7x13
	text := func(x, y int, s string, c color.RGBA) { // y: the top of a 13-pixel line
		d := font.Drawer{Dst: img, Src: image.NewUniform(c), Face: face, Dot: fixed.P(x, y+11)}
		d.DrawString(s)
	}
	for _, b := range tf.Boxes {
		c := parseHex(b.Colour)
		r := image.Rect(b.X, b.Y, b.X+b.W, b.Y+b.H)
		fill(image.Rect(r.Min.X, r.Min.Y, r.Max.X, r.Min.Y+t), c)
		fill(image.Rect(r.Min.X, r.Max.Y-t, r.Max.X, r.Max.Y), c)
		fill(image.Rect(r.Min.X, r.Min.Y, r.Min.X+t, r.Max.Y), c)
		fill(image.Rect(r.Max.X-t, r.Min.Y, r.Max.X, r.Max.Y), c)
		for _, p := range b.Keypoints {
			if p[2] >= 0.5 {
				px, py := int(p[0]), int(p[1])
				fill(image.Rect(px-t, py-t, px+t+1, py+t+1), c)
			}
		}
		label := fmt.Sprintf("%s %.2f", b.Class, b.Score)
		w := font.MeasureString(face, label).Ceil() + 4
		ty := r.Min.Y - 15
		if ty < 0 {
			ty = r.Min.Y
		}
		fill(image.Rect(r.Min.X, ty, r.Min.X+w, ty+15), c)
		text(r.Min.X+2, ty+1, label, contrast(c))
	}
	for i, l := range tf.Labels {
		w := font.MeasureString(face, l).Ceil() + 4
		fill(image.Rect(0, i*15, w, i*15+15), color.RGBA{0, 0, 0, 255})
		text(2, i*15+1, l, color.RGBA{255, 255, 255, 255})
	}
	return img
}

// contrast is black or white, whichever reads on c.
func contrast(c color.RGBA) color.RGBA {
	if 299*int(c.R)+587*int(c.G)+114*int(c.B) > 128*1000 {
		return color.RGBA{0, 0, 0, 255}
	}
	return color.RGBA{255, 255, 255, 255}
}

func writePNG(path string, img image.Image) error {
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		return err
	}
	return writeFileAtomic(path, b.Bytes())
}
