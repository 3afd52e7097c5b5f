package main

import (
	"bytes"
	"context"
	"errors"
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
	fs := newFlags("try", trySynopsis, stderr)
	models := fs.String("models", "", "the model registry (models.yaml) that names --model, or the app's GPU modules' models")
	model := fs.String("model", "", "the registry entry to run (or -f/-p or --example: a whole app)")
	file := fs.String("f", "", "run this app's whole graph instead of one model (with -p)")
	profiles := fs.String("p", "", "the app's profiles (with -f): the plan its frames run on")
	example := fs.String("example", "", "run an embedded example app's whole graph instead of one model (e.g. face-live)")
	executor := fs.String("executor", "onnx", "the executor that runs it: onnx (ONNX Runtime; format: onnx entries) or kserve (the entry's Open Inference Protocol server; format: kserve)")
	device := fs.String("device", "cpu", "with --executor onnx: cpu or cuda")
	lib := fs.String("ort-lib", onnx.DefaultLib(), "with --executor onnx: the ONNX Runtime shared library (env "+onnx.LibEnv+"; make deps installs it)")
	threshold := fs.Float64("threshold", -1, "the score a detection needs, instead of the entry's decoder threshold (0..1; -1: the entry's; one model only)")
	maxFrames := fs.Int("max-frames", 8, "for a video: the frames to run, from the first")
	out := fs.String("out", "", "write the annotated frame here as a PNG (a video: one PNG per frame, FILE-0000.png, FILE-0001.png, ...); default none")
	pos, code, ok := parseWithArgs(fs, args)
	if !ok {
		return code
	}
	usageErr := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "mdag try: "+format+"\n", a...)
		return exitInvalid
	}
	isApp := *file != "" || *profiles != "" || *example != ""
	switch {
	case len(pos) != 1:
		return usageErr("want one image or video file, got %d arguments", len(pos))
	case isApp && *model != "":
		return usageErr("give --model NAME (one model) or -f/-p or --example (a whole app), not both")
	case *models == "" || (!isApp && *model == ""):
		return usageErr("--models models.yaml and --model NAME are required (or -f app.yaml -p profiles.yaml --models models.yaml for a whole app)")
	case *executor == "emulated":
		return usageErr("--executor emulated reports the objects a synthetic source drew into its frames; a file's frames carry none: try runs the models themselves (onnx or kserve)")
	case *executor != "onnx" && *executor != "kserve":
		return usageErr("--executor %q: want onnx or kserve", *executor)
	case *maxFrames < 1:
		return usageErr("--max-frames %d: must be >= 1", *maxFrames)
	case *threshold != -1 && (*threshold < 0 || *threshold > 1):
		return usageErr("--threshold %g: want 0..1", *threshold)
	case *threshold != -1 && isApp:
		return usageErr("--threshold is for one model: an app's models run with their registry thresholds")
	case *out != "" && !strings.EqualFold(filepath.Ext(*out), ".png"):
		return usageErr("--out %s: want a .png file", *out)
	}
	reg, err := registry.Load(*models)
	if err != nil {
		fmt.Fprintf(stderr, "mdag try: ")
		printErrors(stderr, err)
		return exitInvalid
	}
	frames, kind, err := readFrames(pos[0], *maxFrames)
	if err != nil {
		fmt.Fprintf(stderr, "mdag try: %v\n", err)
		return exitInvalid
	}
	var tr *tryRun
	if isApp {
		tr, code = startTryApp(tryAppArgs{file: *file, profiles: *profiles, example: *example, reg: reg, executor: *executor, device: *device, lib: *lib}, stderr)
	} else {
		tr, code = startTryModel(reg, *model, *executor, *device, *lib, *threshold, stderr)
	}
	if tr == nil {
		return code
	}
	defer tr.close()
	res := tr.res
	res.Executor, res.Input, res.Kind = *executor, pos[0], kind
	for i, f := range frames {
		tf, err := tr.step(i, f)
		if err != nil {
			fmt.Fprintf(stderr, "mdag try: frame %d: %v\n", i, err)
			return exitFailure
		}
		tf.Frame, tf.Width, tf.Height = i, f.W, f.H
		if *out != "" {
			tf.PNG = *out
			if kind == "video" {
				ext := filepath.Ext(*out)
				tf.PNG = fmt.Sprintf("%s-%04d%s", strings.TrimSuffix(*out, ext), i, ext)
			}
			if err := writePNG(tf.PNG, annotate(f, tf)); err != nil {
				fmt.Fprintf(stderr, "mdag try: --out: %v\n", err)
				return exitFailure
			}
		}
		res.Frames = append(res.Frames, tf)
	}
	writeJSON(stdout, res, true)
	n := 0
	for _, f := range res.Frames {
		n += len(f.Boxes)
	}
	what := res.Model
	if res.App != "" {
		what = "app " + res.App
	}
	fmt.Fprintf(stderr, "mdag try: %d frame(s) of %s through %s on %s: %d box(es)", len(res.Frames), pos[0], what, *executor, n)
	if *out != "" {
		fmt.Fprintf(stderr, ", drawn in %s", res.Frames[0].PNG)
		if len(res.Frames) > 1 {
			fmt.Fprintf(stderr, " .. %s", res.Frames[len(res.Frames)-1].PNG)
		}
	}
	fmt.Fprintln(stderr)
	return exitOK
}

// tryRun is what try runs each frame through: one model, or an app.
type tryRun struct {
	res   tryResult                                     // filled but for the frames
	step  func(i int, f *media.Frame) (tryFrame, error) // one frame's boxes and labels
	close func()
}

// startTryModel loads one registry model on the executor.
func startTryModel(reg *registry.Registry, name, executor, device, lib string, threshold float64, stderr io.Writer) (*tryRun, int) {
	m, err := reg.Get(name)
	if err != nil {
		fmt.Fprintf(stderr, "mdag try: %v\n", err)
		return nil, exitInvalid
	}
	if m.Format != executor {
		fmt.Fprintf(stderr, "mdag try: model %s is format %s: --executor %s runs format: %s entries\n", m.Name, m.Format, executor, executor)
		return nil, exitInvalid
	}
	if threshold >= 0 {
		m.Decoder.Threshold = threshold
	}
	// only this model is loaded: the registry's others are not needed
	one := &registry.Registry{File: reg.File, Models: map[string]*registry.Model{m.Name: m}}
	x, err := tryExecutor(one, executor, device, lib)
	if err != nil {
		fmt.Fprintf(stderr, "mdag try: %v\n", err)
		return nil, exitFailure
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
	return &tryRun{res: tryResult{Model: m.Name, Threshold: m.Decoder.Threshold}, step: step, close: x.Close}, exitOK
}

// tryExecutor is the executor of reg's models: ONNX Runtime (one session
// a model) or Open Inference Protocol servers.
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
