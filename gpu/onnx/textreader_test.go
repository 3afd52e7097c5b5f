package onnx

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"image"
	"image/color"
	"image/jpeg"
	"os"
	"strings"
	"testing"

	"github.com/mdag/mdag/gpu/decode"
	"github.com/mdag/mdag/gpu/registry"
	"github.com/mdag/mdag/media"
	"github.com/mdag/mdag/modules"
)

// examples/text-reader through the real PP-OCRv4 models (`make models`)
// on the text clip tools/textclip/make_clip.py writes (known strings on
// signs moving over vtest.avi, the truth per frame beside it): text-det
// (db decoder) -> text-crop -> text-rec (ctc decoder), as the app runs
// it, and the strings read against the truth.

const (
	textModels = "../../examples/text-reader/models.yaml"
	textClip   = "../../build/textclip/text-clip.avi"
	textTruth  = "../../build/textclip/text-clip.json"
)

type clipTruth struct {
	Frames []struct {
		Frame int `json:"frame"`
		Texts []struct {
			Text       string `json:"text"`
			X, Y, W, H int
		} `json:"texts"`
	} `json:"frames"`
}

// requireFiles skips (fails under MDAG_REQUIRE_MODELS) when a file `make
// models` writes is missing.
func requireFiles(t testing.TB, paths ...string) {
	t.Helper()
	for _, p := range paths {
		if _, err := os.Stat(p); err != nil {
			if os.Getenv("MDAG_REQUIRE_MODELS") != "" {
				t.Fatalf("%v (MDAG_REQUIRE_MODELS is set: run make models)", err)
			}
			t.Skipf("%v: run make models", err)
		}
	}
}

// loadTextModels loads examples/text-reader/models.yaml on ORT.
func loadTextModels(t testing.TB, threads int) (*Executor, *registry.Registry) {
	t.Helper()
	requireLib(t)
	requireFiles(t, "../../build/models/ch_PP-OCRv4_det_infer.onnx", "../../build/models/ch_PP-OCRv4_rec_infer.onnx", "../../build/models/ppocr_keys_v1.txt")
	reg, err := registry.Load(textModels)
	if err != nil {
		t.Fatal(err)
	}
	x, err := New(reg, Config{IntraThreads: threads})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(x.Close)
	return x, reg
}

// mjpegFrames reads the frames of a Motion JPEG AVI (the chunks ##dc of
// its movi list) whose index is in want, as BGR frames.
func mjpegFrames(t testing.TB, path string, want func(i int) bool) map[int]*media.Frame {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]*media.Frame{}
	n := 0
	var walk func(b []byte)
	walk = func(b []byte) {
		for len(b) >= 8 {
			id, size := string(b[:4]), int(binary.LittleEndian.Uint32(b[4:8]))
			if size > len(b)-8 {
				t.Fatalf("%s: chunk %q of %d bytes past the end", path, id, size)
			}
			body := b[8 : 8+size]
			switch {
			case id == "RIFF" || id == "LIST":
				walk(body[4:])
			case len(id) == 4 && id[2:] == "dc":
				if want(n) {
					out[n] = jpegBytesFrame(t, body)
				}
				n++
			}
			b = b[8+size+size%2:]
		}
	}
	walk(b)
	if n == 0 {
		t.Fatalf("%s: no video chunks", path)
	}
	return out
}

func jpegBytesFrame(t testing.TB, b []byte) *media.Frame {
	img, err := jpeg.Decode(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	yc, ok := img.(*image.YCbCr)
	if !ok {
		t.Fatalf("jpeg decodes to %T, want YCbCr", img)
	}
	r := yc.Bounds()
	f := media.NewFrame(r.Dx(), r.Dy())
	for y := range f.H {
		for x := range f.W {
			yi, ci := yc.YOffset(x+r.Min.X, y+r.Min.Y), yc.COffset(x+r.Min.X, y+r.Min.Y)
			R, G, B := color.YCbCrToRGB(yc.Y[yi], yc.Cb[ci], yc.Cr[ci])
			i := (y*f.W + x) * 3
			f.Pix[i], f.Pix[i+1], f.Pix[i+2] = B, G, R
		}
	}
	return f
}

// editDistance is the Levenshtein distance between a and b in characters.
func editDistance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	prev, cur := make([]int, len(rb)+1), make([]int, len(rb)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(ra); i++ {
		cur[0] = i
		for j := 1; j <= len(rb); j++ {
			c := prev[j-1]
			if ra[i-1] != rb[j-1] {
				c++
			}
			cur[j] = min(c, prev[j]+1, cur[j-1]+1)
		}
		prev, cur = cur, prev
	}
	return prev[len(rb)]
}

// TestTextReaderAccuracy reads every sixth frame of the text clip through
// the real models as the app does and compares each sign's string with the
// detection overlapping its plate best (IoU >= 0.3; none: nothing read):
// character accuracy (1 - edit distance / length, over all strings)
// >= 95% and exact strings >= 90%, spaces included (the registry's ctc
// space setting reads word gaps the Chinese recogniser seldom marks as
// spaces itself; the figures without spaces are logged beside).
func TestTextReaderAccuracy(t *testing.T) {
	x, _ := loadTextModels(t, 0)
	requireFiles(t, textClip, textTruth)
	var truth clipTruth
	b, err := os.ReadFile(textTruth)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &truth); err != nil {
		t.Fatal(err)
	}
	step := 6
	if os.Getenv("MDAG_TEXT_EVERY_FRAME") != "" { // docs/benchmarks.md's figure
		step = 1
	}
	frames := mjpegFrames(t, textClip, func(i int) bool { return i%step == 0 })
	if len(frames) != (len(truth.Frames)+step-1)/step {
		t.Fatalf("%s: %d frames read, the truth has %d (every %dth kept)", textClip, len(frames), len(truth.Frames), step)
	}
	crop, err := modules.Builtin().New("text-crop", nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var chars, dist, strs, exact, extra int
	var charsNS, distNS, exactNS int // spaces left out
	var cols, lines int              // the text's columns in the 320-wide crops: the rest is padding
	for i := 0; i < len(truth.Frames); i += step {
		f := frames[i]
		det, err := x.Run(ctx, "text-det", []*media.Item{{Frame: f}})
		if err != nil {
			t.Fatal(err)
		}
		crops, err := crop.Process(det[0][0])
		if err != nil {
			t.Fatal(err)
		}
		var read []media.Box // each detection with its string as class
		for k := 0; k < len(crops); k += 32 {
			out, err := x.Run(ctx, "text-rec", crops[k:min(k+32, len(crops))])
			if err != nil {
				t.Fatal(err)
			}
			for _, o := range out {
				b := *o[0].Region
				cols += min(320, (b.W*48+b.H-1)/b.H)
				lines++
				b.Class = ""
				if len(o[0].Labels) > 0 {
					b.Class = o[0].Labels[0]
				}
				read = append(read, b)
			}
		}
		used := map[int]bool{}
		for _, tt := range truth.Frames[i].Texts {
			tb := media.Box{X: tt.X, Y: tt.Y, W: tt.W, H: tt.H}
			best, bi := -1, 0.3
			for j, r := range read {
				if v := decode.IoU(tb, r); v >= bi {
					best, bi = j, v
				}
			}
			s := ""
			if best >= 0 {
				s, used[best] = read[best].Class, true
			}
			strs++
			chars += len([]rune(tt.Text))
			dist += min(editDistance(s, tt.Text), len([]rune(tt.Text)))
			if s == tt.Text {
				exact++
			} else {
				t.Logf("frame %d: read %q, want %q (IoU %.2f)", i, s, tt.Text, bi)
			}
			s, want := strings.ReplaceAll(s, " ", ""), strings.ReplaceAll(tt.Text, " ", "")
			charsNS += len([]rune(want))
			distNS += min(editDistance(s, want), len([]rune(want)))
			if s == want {
				exactNS++
			}
		}
		for j, r := range read {
			if !used[j] {
				extra++
				t.Logf("frame %d: also read %q at %d,%d %dx%d (not a sign of the clip: the scene's own text, or a split)", i, r.Class, r.X, r.Y, r.W, r.H)
			}
		}
	}
	charAcc, strAcc := 1-float64(dist)/float64(chars), float64(exact)/float64(strs)
	t.Logf("%d frames, %d strings (%d characters): character accuracy %.4f, exact strings %.4f (%d of %d); %d other detections",
		len(frames), strs, chars, charAcc, strAcc, exact, strs, extra)
	t.Logf("%d crops: the text fills %.1f%% of the recogniser's 320 columns on average (the rest is padding)", lines, 100*float64(cols)/float64(320*lines))
	t.Logf("spaces left out (%d characters): character accuracy %.4f, exact strings %.4f (%d of %d)",
		charsNS, 1-float64(distNS)/float64(charsNS), float64(exactNS)/float64(strs), exactNS, strs)
	if charAcc < 0.95 || strAcc < 0.90 {
		t.Errorf("character accuracy %.4f (want >= 0.95), exact strings %.4f (want >= 0.90)", charAcc, strAcc)
	}
}
