//go:build !lean

package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"image"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"gocv.io/x/gocv"

	"github.com/mdag/mdag/gpu/onnx"
)

// opencvData is where Debian's opencv-doc puts its sample videos.
const opencvData = "/usr/share/doc/opencv-doc/examples/data"

// TestTraceFlags: bad flags and inputs are refused with exit 2 and a line
// that says what and where, before any output.
func TestTraceFlags(t *testing.T) {
	dir := t.TempDir()
	text := filepath.Join(dir, "notes.avi")
	if err := os.WriteFile(text, []byte("not a video\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing.avi")
	for _, tc := range []struct {
		args string
		want []string
	}{
		{"--detector hog", []string{"mdag trace: --video is required"}},
		{"--video " + text, []string{`--detector "": want one of blazeface, haar, hog, motion`}},
		{"--video " + text + " --detector yolo", []string{`--detector "yolo": want one of blazeface, haar, hog, motion`}},
		{"--video " + text + " --detector hog --fps 0", []string{"--fps 0: must be > 0"}},
		{"--video " + text + " --detector hog --fps -3", []string{"--fps -3: must be > 0"}},
		{"--video " + text + " --detector hog --fps NaN", []string{"--fps NaN: must be > 0"}},
		{"--video " + text + " --detector hog --max-frames -1", []string{"--max-frames -1: must be >= 0"}},
		{"--video " + text + " --detector haar --models examples/models.yaml", []string{"--models needs --detector blazeface"}},
		{"--fps 0 --detector nope", []string{"--video is required", `--detector "nope"`, "--fps 0: must be > 0"}},
		{"--video " + text + " --detector hog extra", []string{"mdag trace: unexpected arguments: extra"}},
		{"--video " + text + " --detector hog --fps ten", []string{`invalid value "ten" for flag -fps`}},
		{"--video " + missing + " --detector hog", []string{"mdag trace: --video: open " + missing + ": no such file or directory"}},
		{"--video " + dir + " --detector hog", []string{"mdag trace: --video: " + dir + " is not a regular file"}},
		{"--video " + text + " --detector motion", []string{"mdag trace: --video " + text + ": OpenCV cannot open it as video"}},
	} {
		t.Run(tc.args, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(append([]string{"trace"}, strings.Fields(tc.args)...), &stdout, &stderr)
			if code != exitInvalid {
				t.Errorf("exit %d, want %d; stderr:\n%s", code, exitInvalid, stderr.String())
			}
			for _, w := range tc.want {
				if !strings.Contains(stderr.String(), w) {
					t.Errorf("stderr lacks %q:\n%s", w, stderr.String())
				}
			}
			if stdout.Len() > 0 {
				t.Errorf("stdout written on a refusal:\n%s", stdout.String())
			}
		})
	}
}

// writeWalker writes an MJPG .avi at 20 fps, 160x120, 40 frames: a still
// textured background, and from frame 16 on a dark upright figure (a body
// and a head) walking right 4 pixels a frame. It returns the file.
func writeWalker(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "walker.avi")
	vw, err := gocv.VideoWriterFile(path, "MJPG", 20, 160, 120, true)
	if err != nil {
		t.Fatalf("VideoWriter: %v", err)
	}
	if !vw.IsOpened() {
		t.Fatal("VideoWriter: MJPG .avi not opened")
	}
	m := gocv.NewMatWithSize(120, 160, gocv.MatTypeCV8UC3)
	defer m.Close()
	for i := range 40 {
		m.SetTo(gocv.NewScalar(170, 180, 175, 0))
		for x := 0; x < 160; x += 20 { // a still texture: fence posts
			gocv.Rectangle(&m, image.Rect(x, 70, x+4, 120), color.RGBA{90, 110, 100, 0}, -1)
		}
		if i >= 16 {
			x := 10 + 4*(i-16)
			gocv.Rectangle(&m, image.Rect(x, 40, x+14, 100), color.RGBA{30, 30, 40, 0}, -1)
			gocv.Circle(&m, image.Pt(x+7, 32), 7, color.RGBA{30, 30, 40, 0}, -1)
		}
		if err := vw.Write(m); err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
	}
	if err := vw.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

// traceFile is a parsed trace.
type traceFile struct {
	header map[string]string // the comment line's key=value fields
	t      []float64
	n      []int
}

// parseTrace checks a trace's format: the comment line, the CSV header,
// then t_s,objects rows with t strictly increasing from 0 and counts >= 0.
func parseTrace(data string) (*traceFile, error) {
	lines := strings.Split(strings.TrimSuffix(data, "\n"), "\n")
	if len(lines) < 3 {
		return nil, fmt.Errorf("%d lines: want the comment, the header and rows", len(lines))
	}
	const prefix = "# mdag trace: "
	if !strings.HasPrefix(lines[0], prefix) {
		return nil, fmt.Errorf("line 1 %q: want %q first", lines[0], prefix)
	}
	tr := &traceFile{header: map[string]string{}}
	for _, f := range strings.Fields(strings.TrimPrefix(lines[0], prefix)) {
		k, v, ok := strings.Cut(f, "=")
		if !ok || v == "" {
			return nil, fmt.Errorf("line 1: field %q is not key=value", f)
		}
		tr.header[k] = v
	}
	for _, k := range []string{"video", "sha256", "detector", "params", "fps", "video_fps", "size", "mdag", "commit"} {
		if tr.header[k] == "" {
			return nil, fmt.Errorf("line 1 lacks %s=", k)
		}
	}
	if len(tr.header["sha256"]) != 64 {
		return nil, fmt.Errorf("line 1: sha256=%s is not 64 hex digits", tr.header["sha256"])
	}
	if lines[1] != "t_s,objects" {
		return nil, fmt.Errorf("line 2 %q: want t_s,objects", lines[1])
	}
	for i, l := range lines[2:] {
		ts, ns, ok := strings.Cut(l, ",")
		tv, err1 := strconv.ParseFloat(ts, 64)
		nv, err2 := strconv.Atoi(ns)
		if !ok || err1 != nil || err2 != nil {
			return nil, fmt.Errorf("line %d %q: want t_s,objects", i+3, l)
		}
		if nv < 0 {
			return nil, fmt.Errorf("line %d: %d objects", i+3, nv)
		}
		if i == 0 && tv != 0 {
			return nil, fmt.Errorf("line 3: the first sample is at %v s, want 0", tv)
		}
		if i > 0 && tv <= tr.t[i-1] {
			return nil, fmt.Errorf("line %d: t %v after %v: not increasing", i+3, tv, tr.t[i-1])
		}
		tr.t, tr.n = append(tr.t, tv), append(tr.n, nv)
	}
	return tr, nil
}

// checkSampling checks that sample k is the first frame at or after k/fps:
// within one frame interval of it (plus the 3 decimals written).
func checkSampling(tr *traceFile) error {
	fps, err1 := strconv.ParseFloat(tr.header["fps"], 64)
	vfps, err2 := strconv.ParseFloat(tr.header["video_fps"], 64)
	if err1 != nil || err2 != nil || fps <= 0 || vfps <= 0 {
		return fmt.Errorf("fps=%s video_fps=%s: not rates", tr.header["fps"], tr.header["video_fps"])
	}
	for k, tv := range tr.t {
		lo := float64(k) / fps
		if fps > vfps {
			lo = float64(k) / vfps
		}
		if tv < lo-0.0005 || tv >= lo+1/vfps+0.0005 {
			return fmt.Errorf("sample %d at %v s: want the first frame at or after %.4f s (frames every %.4f s)", k, tv, lo, 1/vfps)
		}
	}
	return nil
}

func sha256File(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// TestTraceMotion runs the motion detector over a video written here:
// the CSV's format, sampling by timestamp (20 fps video at 10 fps), no
// objects while the scene is still and objects on every sample once a
// figure walks.
func TestTraceMotion(t *testing.T) {
	video := writeWalker(t)
	var stdout, stderr bytes.Buffer
	if code := run([]string{"trace", "--video", video, "--detector", "motion"}, &stdout, &stderr); code != exitOK {
		t.Fatalf("exit %d:\n%s", code, stderr.String())
	}
	tr, err := parseTrace(stdout.String())
	if err != nil {
		t.Fatalf("%v in\n%s", err, stdout.String())
	}
	if err := checkSampling(tr); err != nil {
		t.Error(err)
	}
	for k, v := range map[string]string{"video": "walker.avi", "sha256": sha256File(t, video), "detector": "motion",
		"params": "motion{drop_still:0,min_area:0.002,warmup:5}", "fps": "10", "video_fps": "20", "size": "160x120"} {
		if tr.header[k] != v {
			t.Errorf("header %s=%q, want %q", k, tr.header[k], v)
		}
	}
	if len(tr.t) != 20 {
		t.Fatalf("%d samples, want 20 (40 frames at 20 fps sampled at 10 fps):\n%s", len(tr.t), stdout.String())
	}
	for k, tv := range tr.t {
		if want := float64(k) / 10; math.Abs(tv-want) > 1e-9 {
			t.Errorf("sample %d at %v s, want %v (every second frame)", k, tv, want)
		}
		switch {
		case tv < 0.8 && tr.n[k] != 0:
			t.Errorf("t=%v s: %d objects in a still scene, want 0", tv, tr.n[k])
		case tv >= 0.8 && tr.n[k] == 0:
			t.Errorf("t=%v s: no objects while the figure walks", tv)
		}
	}
	if !strings.Contains(stderr.String(), "mdag trace: 20 frames of "+video+" sampled at 10 fps through motion") {
		t.Errorf("stderr lacks the summary:\n%s", stderr.String())
	}
}

// TestTraceOutAndMaxFrames: --out writes the file (nothing on stdout),
// --max-frames stops early and an fps that does not divide the video's
// takes the first frame at or after each k/fps.
func TestTraceOutAndMaxFrames(t *testing.T) {
	video := writeWalker(t)
	out := filepath.Join(t.TempDir(), "t.csv")
	var stdout, stderr bytes.Buffer
	if code := run([]string{"trace", "--video", video, "--detector", "motion", "--fps", "7", "--max-frames", "5", "--out", out}, &stdout, &stderr); code != exitOK {
		t.Fatalf("exit %d:\n%s", code, stderr.String())
	}
	if stdout.Len() > 0 {
		t.Errorf("stdout with --out:\n%s", stdout.String())
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := parseTrace(string(b))
	if err != nil {
		t.Fatalf("%v in\n%s", err, b)
	}
	// 1/7 s falls between frames 2 and 3 (0.10, 0.15 s): frame 3, and so on.
	if got, want := fmt.Sprint(tr.t), "[0 0.15 0.3 0.45 0.6]"; got != want {
		t.Errorf("samples at %s s, want %s", got, want)
	}
	if err := checkSampling(tr); err != nil {
		t.Error(err)
	}
	// an --out that cannot be created is a failure, said with the path
	stderr.Reset()
	bad := filepath.Join(t.TempDir(), "no", "dir", "t.csv")
	if code := run([]string{"trace", "--video", video, "--detector", "motion", "--out", bad}, &stdout, &stderr); code != exitFailure || !strings.Contains(stderr.String(), "mdag trace: --out: open "+bad) {
		t.Errorf("exit %d, want %d with the --out path:\n%s", code, exitFailure, stderr.String())
	}
}

// TestTraceDetectorsOnSamples runs each real detector on the first frames
// of opencv-doc's videos: people in vtest.avi (hog), faces in Megamind.avi
// (haar, blazeface). Skipped without the videos (or, for blazeface, the
// model and ONNX Runtime).
func TestTraceDetectorsOnSamples(t *testing.T) {
	t.Chdir("../..")
	for _, tc := range []struct{ video, detector string }{
		{"vtest.avi", "hog"},
		{"Megamind.avi", "haar"},
		{"Megamind.avi", "blazeface"},
	} {
		t.Run(tc.detector, func(t *testing.T) {
			video := filepath.Join(opencvData, tc.video)
			if _, err := os.Stat(video); err != nil {
				t.Skipf("%s absent (Debian package opencv-doc): %v", video, err)
			}
			if tc.detector == "blazeface" {
				if _, err := os.Stat("build/models/blazeface-front-128.onnx"); err != nil {
					t.Skipf("no BlazeFace model (make models): %v", err)
				}
				if _, err := os.Stat(onnx.DefaultLib()); err != nil {
					t.Skipf("no ONNX Runtime library (make ort): %v", err)
				}
			}
			var stdout, stderr bytes.Buffer
			if code := run([]string{"trace", "--video", video, "--detector", tc.detector, "--max-frames", "3"}, &stdout, &stderr); code != exitOK {
				t.Fatalf("exit %d:\n%s", code, stderr.String())
			}
			tr, err := parseTrace(stdout.String())
			if err != nil {
				t.Fatalf("%v in\n%s", err, stdout.String())
			}
			if len(tr.n) != 3 {
				t.Fatalf("%d samples, want 3 (--max-frames 3)", len(tr.n))
			}
			if tr.n[1]+tr.n[2] == 0 {
				t.Errorf("%s found nothing in frames of %s that show people:\n%s", tc.detector, tc.video, stdout.String())
			}
		})
	}
}

// committedTraces are the traces make traces writes.
var committedTraces = []string{"vtest-hog.csv", "vtest-motion.csv", "megamind-haar.csv", "megamind-blazeface.csv", "megamind-motion.csv"}

// TestCommittedTraces: every committed trace parses (comment line, header,
// t increasing from 0 and sampled as its fps says, counts >= 0); where the
// video is here its sha256 matches, and the motion trace of vtest.avi is
// reproduced exactly on its first 40 samples.
func TestCommittedTraces(t *testing.T) {
	t.Chdir("../..")
	for _, name := range committedTraces {
		t.Run(name, func(t *testing.T) {
			b, err := os.ReadFile(filepath.Join("examples/traces", name))
			if err != nil {
				t.Fatalf("%v (make traces writes it)", err)
			}
			tr, err := parseTrace(string(b))
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if err := checkSampling(tr); err != nil {
				t.Errorf("%s: %v", name, err)
			}
			video, det, _ := strings.Cut(strings.TrimSuffix(name, ".csv"), "-")
			if !strings.EqualFold(strings.TrimSuffix(tr.header["video"], ".avi"), video) || tr.header["detector"] != det {
				t.Errorf("%s: header says video=%s detector=%s", name, tr.header["video"], tr.header["detector"])
			}
			if tr.header["commit"] == "unknown" {
				t.Errorf("%s: commit=unknown: make traces builds with the commit stamped", name)
			}
			path := filepath.Join(opencvData, tr.header["video"])
			if _, err := os.Stat(path); err != nil {
				t.Logf("%s absent (opencv-doc): sha256 not checked", path)
				return
			}
			if got := sha256File(t, path); got != tr.header["sha256"] {
				t.Errorf("%s: sha256 %s, but %s has %s", name, tr.header["sha256"], path, got)
			}
		})
	}
	t.Run("vtest-motion reproduced", func(t *testing.T) {
		video := filepath.Join(opencvData, "vtest.avi")
		if _, err := os.Stat(video); err != nil {
			t.Skipf("%s absent (Debian package opencv-doc): %v", video, err)
		}
		b, err := os.ReadFile("examples/traces/vtest-motion.csv")
		if err != nil {
			t.Fatal(err)
		}
		var stdout, stderr bytes.Buffer
		if code := run([]string{"trace", "--video", video, "--detector", "motion", "--max-frames", "40"}, &stdout, &stderr); code != exitOK {
			t.Fatalf("exit %d:\n%s", code, stderr.String())
		}
		want := strings.SplitN(string(b), "\n", 43)[2:42]
		got := strings.Split(strings.TrimSuffix(stdout.String(), "\n"), "\n")[2:]
		if strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Errorf("the first 40 samples differ from the committed trace:\ngot  %q\nwant %q", got, want)
		}
	})
}
