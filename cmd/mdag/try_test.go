package main

import (
	"bytes"
	"encoding/json"
	"image"
	"image/color"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// requireBlazeFace skips unless ONNX Runtime and build/models' BlazeFace
// are here (make deps, make models), or fails when MDAG_REQUIRE_ORT or
// MDAG_REQUIRE_MODELS says they must be.
func requireBlazeFace(t *testing.T) {
	t.Helper()
	requireORT(t)
	if _, err := os.Stat("../../build/models/blazeface-front-128.onnx"); err != nil {
		if os.Getenv("MDAG_REQUIRE_MODELS") != "" {
			t.Fatalf("%v (MDAG_REQUIRE_MODELS is set: run make models)", err)
		}
		t.Skipf("%v: make models builds it", err)
	}
}

// faceJPEG is gocv's sample face (what gpu/onnx's BlazeFace test reads).
func faceJPEG(t *testing.T) string {
	t.Helper()
	dir, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "gocv.io/x/gocv").Output()
	if err == nil {
		p := filepath.Join(strings.TrimSpace(string(dir)), "images", "face.jpg")
		if _, err = os.Stat(p); err == nil {
			return p
		}
	}
	if os.Getenv("MDAG_REQUIRE_MODELS") != "" {
		t.Fatalf("gocv's images/face.jpg: %v", err)
	}
	t.Skipf("gocv's images/face.jpg: %v", err)
	return ""
}

func tryJSON(t *testing.T, args ...string) tryResult {
	t.Helper()
	var out, errb bytes.Buffer
	if code := run(append([]string{"try"}, args...), &out, &errb); code != exitOK {
		t.Fatalf("try %s: exit %d\n%s", strings.Join(args, " "), code, errb.String())
	}
	var res tryResult
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	return res
}

func readPNG(t *testing.T, path string) image.Image {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return img
}

// checkDrawn: the PNG has the frame's size and each box's edges (the
// middle of its left, right and bottom sides) are in the box's colour.
func checkDrawn(t *testing.T, f tryFrame) {
	t.Helper()
	img := readPNG(t, f.PNG)
	if b := img.Bounds(); b.Dx() != f.Width || b.Dy() != f.Height {
		t.Fatalf("%s is %dx%d, the frame %dx%d", f.PNG, b.Dx(), b.Dy(), f.Width, f.Height)
	}
	for _, b := range f.Boxes {
		want := parseHex(b.Colour)
		for _, p := range []image.Point{{b.X, b.Y + b.H/2}, {b.X + b.W - 1, b.Y + b.H/2}, {b.X + b.W/2, b.Y + b.H - 1}} {
			if got := color.RGBAModel.Convert(img.At(p.X, p.Y)).(color.RGBA); got != want {
				t.Errorf("%s: pixel %v on the edge of box %+v is %v, want the box colour %v", f.PNG, p, b, got, want)
			}
		}
	}
}

// TestTryImage: the real BlazeFace on a face photo finds the face, says
// so as JSON and draws it on a PNG of the photo's size.
func TestTryImage(t *testing.T) {
	requireBlazeFace(t)
	face := faceJPEG(t)
	out := filepath.Join(t.TempDir(), "face.png")
	res := tryJSON(t, "--models", "../../examples/models.yaml", "--model", "blazeface", "--out", out, face)
	if res.Model != "blazeface" || res.Executor != "onnx" || res.Kind != "image" || len(res.Frames) != 1 {
		t.Fatalf("result %+v", res)
	}
	f := res.Frames[0]
	if f.Width != 640 || f.Height != 480 || len(f.Boxes) != 1 || f.Boxes[0].Class != "face" || f.Boxes[0].Score < 0.6 || f.PNG != out {
		t.Fatalf("frame %+v, want one face on 640x480, drawn in %s", f, out)
	}
	// gpu/onnx's BlazeFace test: OpenCV's executor finds 243,198 229x172 here
	if b := f.Boxes[0]; abs(b.X-243) > 10 || abs(b.Y-198) > 10 || abs(b.W-229) > 10 || abs(b.H-172) > 10 {
		t.Errorf("box %+v, want about 243,198 229x172", b)
	}
	checkDrawn(t, f)

	// a higher threshold than the face's score: nothing found, nothing drawn
	res = tryJSON(t, "--models", "../../examples/models.yaml", "--model", "blazeface", "--threshold", "0.999", face)
	if len(res.Frames) != 1 || len(res.Frames[0].Boxes) != 0 || res.Frames[0].PNG != "" || res.Threshold != 0.999 {
		t.Errorf("threshold 0.999: %+v", res)
	}
}

// TestTryApp: try runs a whole app (face-live: BlazeFace, then count and
// sink) on the face photo through the embedded engine and reports what
// its sinks hand a client: the face, the count, the frame's outcome.
func TestTryApp(t *testing.T) {
	requireBlazeFace(t)
	face := faceJPEG(t)
	out := filepath.Join(t.TempDir(), "app.png")
	res := tryJSON(t, "-f", "../../examples/face-live/app.yaml", "-p", "../../examples/face-live/profiles.yaml", "--models", "../../examples/models.yaml", "--out", out, face)
	if res.App != "face-live" || res.Model != "" || res.SLOMillis != 500 || len(res.Frames) != 1 {
		t.Fatalf("result %+v", res)
	}
	f := res.Frames[0]
	if f.Outcome != "finished" || f.LatencyMS <= 0 || len(f.Boxes) != 1 || f.Boxes[0].Class != "face" || f.Counts["face"] != 1 || f.PNG != out {
		t.Fatalf("frame %+v, want one face finished and counted, drawn in %s", f, out)
	}
	if b := f.Boxes[0]; abs(b.X-243) > 10 || abs(b.Y-198) > 10 || abs(b.W-229) > 10 || abs(b.H-172) > 10 {
		t.Errorf("box %+v, want about 243,198 229x172 (the model alone finds it there)", b)
	}
	checkDrawn(t, f)
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

// TestTryRefusals: what try cannot do is said before anything runs.
func TestTryRefusals(t *testing.T) {
	dir := t.TempDir()
	img := filepath.Join(dir, "x.png")
	var b bytes.Buffer
	if err := png.Encode(&b, image.NewRGBA(image.Rect(0, 0, 4, 4))); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(img, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	reg := "../../examples/models.yaml"
	for _, c := range []struct {
		args string
		want string
	}{
		{"--models " + reg + " --model blazeface", "want one image or video file, got 0"},
		{"--model blazeface " + img, "--models models.yaml and --model NAME are required"},
		{"--models " + reg + " --model blazeface --executor emulated " + img, "a file's frames carry none"},
		{"--models " + reg + " --model blazeface --executor opencv " + img, `--executor "opencv": want onnx or kserve`},
		{"--models " + reg + " --model nope " + img, `model "nope" is not in the registry`},
		{"--models " + reg + " --model resnet50-remote " + img, "model resnet50-remote is format kserve: --executor onnx runs format: onnx entries"},
		{"--models " + reg + " --model blazeface --out x.jpg " + img, "--out x.jpg: want a .png file"},
		{"--models " + reg + " --model blazeface --threshold 2 " + img, "--threshold 2: want 0..1"},
		{"--models " + reg + " --model blazeface " + filepath.Join(dir, "none.jpg"), "no such file"},
		{"--example face-live --models " + reg + " --model blazeface " + img, "give --model NAME (one model) or -f/-p or --example (a whole app), not both"},
		{"--example face-live --models " + reg + " --threshold 0.5 " + img, "--threshold is for one model"},
		{"--example face-live " + img, "--models models.yaml and --model NAME are required (or -f app.yaml"},
		{"-f ../../examples/face-live/app.yaml --models " + reg + " " + img, "need -f app.yaml and -p profiles.yaml"},
		{"--example traffic --models " + reg + " " + img, "is not in the model registry"},
	} {
		var out, errb bytes.Buffer
		if code := run(append([]string{"try"}, strings.Fields(c.args)...), &out, &errb); code != exitInvalid || !strings.Contains(errb.String(), c.want) || out.Len() != 0 {
			t.Errorf("try %s: exit %d, stdout %q, stderr %q, want %q", c.args, code, out.String(), errb.String(), c.want)
		}
	}
}

// TestTryFlags: every problem with the flags and the arguments at once,
// counted, then where the flags are told.
func TestTryFlags(t *testing.T) {
	var out, errb bytes.Buffer
	code := run(strings.Fields("try --example face-live --model m --executor tpu --max-frames 0 --out x.jpg a.png"), &out, &errb)
	want := `mdag try: give --model NAME (one model) or -f/-p or --example (a whole app), not both
mdag try: --models models.yaml and --model NAME are required (or -f app.yaml -p profiles.yaml --models models.yaml for a whole app)
mdag try: --executor "tpu": want onnx or kserve
mdag try: --max-frames 0: must be >= 1
mdag try: --out x.jpg: want a .png file
5 problems found
Run 'mdag try -h' for its flags.
`
	if code != exitInvalid || out.Len() != 0 || errb.String() != want {
		t.Errorf("exit %d, stdout %q, stderr:\n%s\nwant exit 2 and:\n%s", code, out.String(), errb.String(), want)
	}
	// an app's -f without -p is a flag problem, found before any file is read
	out.Reset()
	errb.Reset()
	code = run(strings.Fields("try -f nowhere.yaml --models nowhere-models.yaml a.png"), &out, &errb)
	want = "mdag try: need -f app.yaml and -p profiles.yaml, or --example NAME\nRun 'mdag try -h' for its flags.\n"
	if code != exitInvalid || errb.String() != want {
		t.Errorf("exit %d, stderr:\n%s\nwant exit 2 and:\n%s", code, errb.String(), want)
	}
}
