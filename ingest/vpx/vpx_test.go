package vpx

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/mdag/mdag/media"
)

// scene is a gradient with a bright square that moves with i.
func scene(w, h, i int) *media.Frame {
	f := media.NewFrame(w, h)
	for y := range h {
		for x := range w {
			p := f.Pix[(y*w+x)*3:]
			p[0], p[1], p[2] = byte(x*255/w), byte(y*255/h), byte((x+y)/4)
			if x >= 20+4*i && x < 80+4*i && y >= 40 && y < 100 {
				p[0], p[1], p[2] = 240, 240, 240
			}
		}
	}
	return f
}

func psnr(a, b *media.Frame) float64 {
	var se float64
	for i := range a.Pix {
		d := float64(a.Pix[i]) - float64(b.Pix[i])
		se += d * d
	}
	mse := se / float64(len(a.Pix))
	if mse == 0 {
		return math.Inf(1)
	}
	return 10 * math.Log10(255*255/mse)
}

// encodeScene encodes n frames of the scene.
func encodeScene(t testing.TB, w, h, n int) ([]*media.Frame, []Encoded) {
	t.Helper()
	enc, err := NewEncoder(EncoderConfig{Width: w, Height: h, FPS: 30, BitrateKbps: 2000})
	if err != nil {
		t.Fatal(err)
	}
	defer enc.Close()
	var src []*media.Frame
	var out []Encoded
	for i := range n {
		f := scene(w, h, i)
		pk, err := enc.Encode(f, int64(i), false)
		if err != nil {
			t.Fatal(err)
		}
		if len(pk) != 1 {
			t.Fatalf("frame %d: %d packets, want 1 (no lag)", i, len(pk))
		}
		src = append(src, f)
		out = append(out, pk[0])
	}
	return src, out
}

func TestRoundTrip(t *testing.T) {
	src, pkts := encodeScene(t, 320, 240, 30)
	if !pkts[0].Key || pkts[1].Key {
		t.Errorf("key flags %v %v: want the first frame key and the second not", pkts[0].Key, pkts[1].Key)
	}
	dec, err := NewDecoder()
	if err != nil {
		t.Fatal(err)
	}
	defer dec.Close()
	for i, p := range pkts {
		f, err := dec.Decode(p.Data)
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		if f == nil || f.W != 320 || f.H != 240 {
			t.Fatalf("frame %d: decoded %+v", i, f)
		}
		// The colour conversions and VP8 at 2 Mb/s keep the picture.
		if q := psnr(src[i], f); q < 28 {
			t.Errorf("frame %d: PSNR %.1f dB, want >= 28", i, q)
		}
	}
}

// flat is a frame of one BGR colour.
func flat(w, h int, bgr [3]byte) *media.Frame {
	f := media.NewFrame(w, h)
	for i := 0; i < len(f.Pix); i += 3 {
		copy(f.Pix[i:], bgr[:])
	}
	return f
}

// keyFrame encodes f alone, as a key frame.
func keyFrame(t testing.TB, f *media.Frame) []byte {
	t.Helper()
	enc, err := NewEncoder(EncoderConfig{Width: f.W, Height: f.H, BitrateKbps: 2000})
	if err != nil {
		t.Fatal(err)
	}
	defer enc.Close()
	pk, err := enc.Encode(f, 0, true)
	if err != nil || len(pk) != 1 || !pk[0].Key {
		t.Fatalf("%dx%d: encode: %d packets, %v", f.W, f.H, len(pk), err)
	}
	return pk[0].Data
}

// TestColours: flat colours come back within 3 levels in every pixel, so
// the decoder's conversion is BT.601 at limited range, as the encoder's
// (and WebRTC's): a full-range reading is 16 levels off at black and
// white, BT.709's matrix 10 to 40 off in the saturated colours. Sizes: a
// multiple of 16 (libswscale's vector path), odd sides (its generic path
// and I420's rounded-up chroma) and 2x2. (1x1 is left out: VP8 itself
// shifts a lone pixel's colour by up to 15 levels, whatever converts it.)
func TestColours(t *testing.T) {
	colours := []struct {
		name string
		bgr  [3]byte
	}{
		{"black", [3]byte{0, 0, 0}},
		{"white", [3]byte{255, 255, 255}},
		{"grey", [3]byte{128, 128, 128}},
		{"limited black", [3]byte{16, 16, 16}},
		{"limited white", [3]byte{235, 235, 235}},
		{"red", [3]byte{0, 0, 255}},
		{"green", [3]byte{0, 255, 0}},
		{"blue", [3]byte{255, 0, 0}},
		{"skin", [3]byte{120, 150, 220}},
		{"purple", [3]byte{200, 40, 180}},
	}
	for _, sz := range [][2]int{{64, 48}, {33, 17}, {2, 2}} {
		dec, err := NewDecoder()
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range colours {
			t.Run(fmt.Sprintf("%s %dx%d", c.name, sz[0], sz[1]), func(t *testing.T) {
				src := flat(sz[0], sz[1], c.bgr)
				f, err := dec.Decode(keyFrame(t, src))
				if err != nil || f == nil {
					t.Fatalf("decode: %v, %v", f, err)
				}
				if err := f.Valid(); err != nil || f.W != sz[0] || f.H != sz[1] {
					t.Fatalf("decoded %dx%d: %v", f.W, f.H, err)
				}
				for i := range f.Pix {
					if d := int(f.Pix[i]) - int(src.Pix[i]); d < -3 || d > 3 {
						px := i / 3
						t.Fatalf("pixel (%d,%d) %s: %d, source %d (%+d levels)", px%sz[0], px/sz[0], []string{"blue", "green", "red"}[i%3], f.Pix[i], src.Pix[i], d)
					}
				}
			})
		}
		dec.Close()
	}
}

// TestEveryWidth: every pixel of every row is converted, at every width
// from 2 to 72 (libswscale's x86 yuv2rgb works in blocks of 8 pixels and
// left the last ones of a row unconverted where a block did not fit the
// row: see mdag_bgr_stride), at an even height (its vector path) and an
// odd one (its generic path).
func TestEveryWidth(t *testing.T) {
	dec, err := NewDecoder()
	if err != nil {
		t.Fatal(err)
	}
	defer dec.Close()
	colour := [3]byte{60, 110, 200}
	for _, h := range []int{18, 17} {
		for w := 2; w <= 72; w++ {
			src := flat(w, h, colour)
			f, err := dec.Decode(keyFrame(t, src))
			if err != nil || f == nil {
				t.Fatalf("%dx%d: %v, %v", w, h, f, err)
			}
			if f.W != w || f.H != h || f.Valid() != nil {
				t.Fatalf("%dx%d: decoded %dx%d (%d bytes)", w, h, f.W, f.H, len(f.Pix))
			}
			bad, first := 0, -1
			for i := range f.Pix {
				if d := int(f.Pix[i]) - int(src.Pix[i]); d < -3 || d > 3 {
					if bad++; first < 0 {
						first = i / 3
					}
				}
			}
			if bad > 0 {
				t.Errorf("%dx%d: %d samples more than 3 levels off, the first at (%d,%d): %v, source %v", w, h, bad, first%w, first/w, f.Pix[first*3:first*3+3], colour)
			}
		}
	}
}

// TestSizeChange: one decoder across key frames of other sizes (a VP8
// stream may change size at a key frame) converts each at its own size:
// the conversion set up for one size is not used for another. 854x480
// (16:9 480p) is a width whose last 6 columns libswscale's x86 yuv2rgb
// left unconverted at a stride of w*3.
func TestSizeChange(t *testing.T) {
	dec, err := NewDecoder()
	if err != nil {
		t.Fatal(err)
	}
	defer dec.Close()
	for i, tc := range []struct{ w, h int }{
		{320, 240}, {640, 360}, {161, 121}, {320, 240}, {34, 18}, {854, 480}, {320, 240}, {320, 240},
	} {
		src := scene(tc.w, tc.h, i)
		f, err := dec.Decode(keyFrame(t, src))
		if err != nil || f == nil {
			t.Fatalf("step %d, %dx%d: %v, %v", i, tc.w, tc.h, f, err)
		}
		if f.W != tc.w || f.H != tc.h || f.Valid() != nil {
			t.Fatalf("step %d: decoded %dx%d (%d bytes), want %dx%d", i, f.W, f.H, len(f.Pix), tc.w, tc.h)
		}
		if q := psnr(src, f); q < 28 {
			t.Errorf("step %d, %dx%d: PSNR %.1f dB, want >= 28", i, tc.w, tc.h, q)
		}
	}
}

// TestCorruptInput: damaged frames give errors or pictures, never a crash;
// the next key frame decodes cleanly.
func TestCorruptInput(t *testing.T) {
	_, pkts := encodeScene(t, 160, 120, 10)
	dec, err := NewDecoder()
	if err != nil {
		t.Fatal(err)
	}
	defer dec.Close()
	if _, err := dec.Decode(nil); err == nil || !strings.Contains(err.Error(), "empty frame") {
		t.Errorf("empty: %v", err)
	}
	if _, err := dec.Decode([]byte{1, 2, 3}); err == nil {
		t.Error("3 garbage bytes decoded")
	}
	for _, p := range pkts[1:] {
		bad := append([]byte(nil), p.Data...)
		for i := 3; i < len(bad); i += 7 {
			bad[i] ^= 0x5a
		}
		_, _ = dec.Decode(bad) // either is fine; it must not crash
	}
	f, err := dec.Decode(pkts[0].Data)
	if err != nil || f == nil {
		t.Fatalf("key frame after corrupt input: %v %v", f, err)
	}
}

func TestErrors(t *testing.T) {
	if _, err := NewEncoder(EncoderConfig{Width: 0, Height: 10}); err == nil {
		t.Error("0-wide encoder accepted")
	}
	if _, err := NewEncoder(EncoderConfig{Width: 8000, Height: 8000}); err == nil {
		t.Error("64-megapixel encoder accepted")
	}
	enc, err := NewEncoder(EncoderConfig{Width: 64, Height: 48})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := enc.Encode(media.NewFrame(32, 32), 0, false); err == nil || !strings.Contains(err.Error(), "frame 32x32, encoder is 64x48") {
		t.Errorf("wrong size: %v", err)
	}
	if _, err := enc.Encode(&media.Frame{W: 64, H: 48}, 0, false); err == nil {
		t.Error("frame without pixels accepted")
	}
	enc.Close()
	enc.Close()
	if _, err := enc.Encode(media.NewFrame(64, 48), 0, false); err == nil {
		t.Error("closed encoder encoded")
	}
	dec, err := NewDecoder()
	if err != nil {
		t.Fatal(err)
	}
	dec.Close()
	if _, err := dec.Decode([]byte{1}); err == nil {
		t.Error("closed decoder decoded")
	}
}

// FuzzDecode feeds arbitrary bytes to a decoder that has seen a key frame.
func FuzzDecode(f *testing.F) {
	_, pkts := encodeScene(f, 64, 48, 3)
	for _, p := range pkts {
		f.Add(p.Data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		dec, err := NewDecoder()
		if err != nil {
			t.Fatal(err)
		}
		defer dec.Close()
		if _, err := dec.Decode(pkts[0].Data); err != nil {
			t.Fatal(err)
		}
		fr, err := dec.Decode(data)
		if err == nil && fr != nil {
			if verr := fr.Valid(); verr != nil {
				t.Fatalf("decoded an invalid frame: %v", verr)
			}
		}
	})
}

// BenchmarkDecode is VP8 decode + I420->BGR (libswscale) per frame at two
// sizes, one core (the decoder is single-threaded).
func BenchmarkDecode(b *testing.B) {
	for _, sz := range [][2]int{{640, 480}, {1280, 720}} {
		b.Run(fmt.Sprintf("%dx%d", sz[0], sz[1]), func(b *testing.B) {
			_, pkts := encodeScene(b, sz[0], sz[1], 60)
			dec, err := NewDecoder()
			if err != nil {
				b.Fatal(err)
			}
			defer dec.Close()
			b.ResetTimer()
			for i := range b.N {
				p := pkts[i%len(pkts)] // every 60th is the key frame again
				if _, err := dec.Decode(p.Data); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "frames/s")
		})
	}
}
