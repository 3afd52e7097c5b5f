package avc

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/rand"
	"strings"
	"testing"

	"github.com/mdag/mdag/ingest/synth"
	"github.com/mdag/mdag/ingest/vpx"
	"github.com/mdag/mdag/media"
)

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

// patternClip draws n frames of ingest/synth's moving shapes.
func patternClip(t testing.TB, w, h, n int) []*media.Frame {
	t.Helper()
	p, err := synth.NewPattern(w, h, 4)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]*media.Frame, n)
	for i := range out {
		if out[i], _, err = p.Frame(0, uint64(i)); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// scene is ingest/vpx's benchmark clip: a gradient with a bright square
// that moves with i.
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

func encodeAll(t testing.TB, enc *Encoder, frames []*media.Frame) []Encoded {
	t.Helper()
	var out []Encoded
	for i, f := range frames {
		pk, err := enc.Encode(f, int64(i), false)
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		out = append(out, pk...)
	}
	return out
}

// The H.265 encoders the tests use (libx265 through libavcodec): real-time
// (no B-frames), with B-frames (the decoder then hands pictures out late),
// and Main 10.
var (
	h265Live    = encoderSetup{codec: H265, pixFmt: pixYUV420P, opts: []string{"preset=ultrafast", "tune=zerolatency", "x265-params=log-level=none"}}
	h265BFrames = encoderSetup{codec: H265, pixFmt: pixYUV420P, bframes: 3, opts: []string{"preset=ultrafast", "x265-params=log-level=none:bframes=3"}}
	h265Main10  = encoderSetup{codec: H265, pixFmt: pixYUV420P10, opts: []string{"preset=ultrafast", "tune=zerolatency", "x265-params=log-level=none"}}
	h264Setup   = encoderSetup{codec: H264, pixFmt: pixYUV420P, opts: []string{"preset=veryfast", "tune=zerolatency", "profile=baseline", "forced-idr=1"}}
)

func with(s encoderSetup, f func(*encoderSetup)) encoderSetup {
	f(&s)
	return s
}

// encodeClip encodes frames with the setup and returns every access unit
// the encoder produced (for encoders with lookahead, flushed by encoding
// the last frame again until all frames are out).
func encodeClip(t testing.TB, s encoderSetup, cfg EncoderConfig, frames []*media.Frame) []Encoded {
	t.Helper()
	enc, err := newEncoder(cfg, s)
	if err != nil {
		t.Fatal(err)
	}
	defer enc.Close()
	out := encodeAll(t, enc, frames)
	for extra := 0; len(out) < len(frames); extra++ {
		if extra > 64 {
			t.Fatalf("%d access units for %d frames after %d extra frames", len(out), len(frames), extra)
		}
		pk, err := enc.Encode(frames[len(frames)-1], int64(len(frames)+extra), false)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, pk...)
	}
	return out[:len(frames)]
}

// TestRoundTrip encodes ingest/synth's pattern and decodes it back: every
// picture comes out at its size and close to its source (and not close to
// another frame of the clip), key frames are flagged and found by
// IsKeyFrame, and the decoder's delay is what the stream needs.
func TestRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name     string
		codec    Codec
		setup    encoderSetup
		w, h     int
		minPSNR  float64
		maxDelay int // access units in before the first picture out
	}{
		{"H264/640x480", H264, h264Setup, 640, 480, 35, 0},
		{"H264/1280x720", H264, h264Setup, 1280, 720, 35, 0},
		{"H264/322x242 (cropped, rows not 16-byte aligned)", H264, h264Setup, 322, 242, 35, 0},
		{"H264/full-range", H264, with(h264Setup, func(s *encoderSetup) { s.full = true }), 320, 240, 35, 0},
		{"H264/B-frames", H264, encoderSetup{codec: H264, pixFmt: pixYUV420P, bframes: 2, opts: []string{"preset=veryfast", "profile=main"}}, 320, 240, 35, 4},
		{"H264/BT709", H264, with(h264Setup, func(s *encoderSetup) { s.bt709 = true }), 320, 240, 35, 0},
		{"H265/640x480", H265, h265Live, 640, 480, 35, 0},
		{"H265/B-frames", H265, h265BFrames, 320, 240, 35, 4},
		{"H265/Main10", H265, h265Main10, 320, 240, 35, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := patternClip(t, tc.w, tc.h, 20)
			aus := encodeClip(t, tc.setup, EncoderConfig{Width: tc.w, Height: tc.h, BitrateKbps: 2000, KeyEvery: 10}, src)
			dec, err := NewDecoder(tc.codec)
			if err != nil {
				t.Fatal(err)
			}
			defer dec.Close()
			var got []*media.Frame
			delay := -1
			for i, au := range aus {
				if au.Key != IsKeyFrame(tc.codec, au.Data) {
					t.Errorf("access unit %d: encoder says key %v, IsKeyFrame %v", i, au.Key, !au.Key)
				}
				if i == 0 && !au.Key {
					t.Error("the first access unit is not a key frame")
				}
				f, err := dec.Decode(au.Data)
				if err != nil {
					t.Fatalf("access unit %d: %v", i, err)
				}
				if f == nil {
					if delay >= 0 {
						t.Errorf("access unit %d: no picture after the decoder's delay of %d", i, delay)
					}
					continue
				}
				if delay < 0 {
					delay = i
				}
				got = append(got, f)
			}
			if delay < 0 || delay > tc.maxDelay {
				t.Fatalf("first picture after %d access units, want at most %d", delay, tc.maxDelay)
			}
			if len(got) != len(src)-delay {
				t.Fatalf("%d pictures from %d access units with delay %d", len(got), len(aus), delay)
			}
			for i, f := range got { // in display order
				if f.W != tc.w || f.H != tc.h || f.Valid() != nil {
					t.Fatalf("picture %d: %dx%d with %d bytes", i, f.W, f.H, len(f.Pix))
				}
				// The pattern is flat shapes: the codec at 2 Mb/s and
				// the two colour conversions keep it well above 35 dB;
				// another frame of the clip (shapes moved) is far below.
				if q := psnr(src[i], f); q < tc.minPSNR {
					t.Errorf("picture %d: PSNR %.1f dB against its source, want >= %.0f", i, q, tc.minPSNR)
				}
				if j := (i + 10) % len(src); psnr(src[j], f) > 30 {
					t.Errorf("picture %d looks like frame %d (PSNR %.1f dB)", i, j, psnr(src[j], f))
				}
			}
		})
	}
}

// TestLooksLikeVP8: the same source through VP8 (ingest/vpx) and through
// H.264 comes out alike, with no shift in colour or level between them
// (both convert with libswscale's fast path at BT.601, limited range: the
// channel means are within 0.4 levels on this scene; the fast path is
// within about 2 levels of an exact conversion, hence the 2.5-level
// bound); a wrong matrix or range is 5 to 20 levels off.
func TestLooksLikeVP8(t *testing.T) {
	const w, h = 320, 240
	src := scene(w, h, 3)
	venc, err := vpx.NewEncoder(vpx.EncoderConfig{Width: w, Height: h, BitrateKbps: 2000})
	if err != nil {
		t.Fatal(err)
	}
	defer venc.Close()
	vpk, err := venc.Encode(src, 0, true)
	if err != nil || len(vpk) != 1 {
		t.Fatalf("vp8: %d packets, %v", len(vpk), err)
	}
	vdec, err := vpx.NewDecoder()
	if err != nil {
		t.Fatal(err)
	}
	defer vdec.Close()
	v, err := vdec.Decode(vpk[0].Data)
	if err != nil {
		t.Fatal(err)
	}
	aus := encodeClip(t, h264Setup, EncoderConfig{Width: w, Height: h, BitrateKbps: 2000}, []*media.Frame{src})
	dec, err := NewDecoder(H264)
	if err != nil {
		t.Fatal(err)
	}
	defer dec.Close()
	a, err := dec.Decode(aus[0].Data)
	if err != nil || a == nil {
		t.Fatalf("h264: %v %v", a, err)
	}
	if q := psnr(v, a); q < 35 {
		t.Errorf("VP8 and H.264 pictures of one source: PSNR %.1f dB, want >= 35", q)
	}
	for c, name := range []string{"blue", "green", "red"} {
		var sv, sa float64
		for i := c; i < len(v.Pix); i += 3 {
			sv += float64(v.Pix[i])
			sa += float64(a.Pix[i])
		}
		if d := (sa - sv) / float64(w*h); math.Abs(d) > 2.5 {
			t.Errorf("%s: H.264 mean %.1f levels off VP8's", name, d)
		}
	}
}

// TestResolutionChange: a stream whose new SPS (and VPS) changes the
// picture size mid-stream decodes at the new size from the key frame on,
// down and up again.
func TestResolutionChange(t *testing.T) {
	sizes := [][2]int{{320, 240}, {640, 360}, {160, 120}, {320, 240}}
	for _, tc := range []struct {
		codec Codec
		setup encoderSetup
	}{{H264, h264Setup}, {H265, h265Live}} {
		t.Run(tc.codec.String(), func(t *testing.T) {
			dec, err := NewDecoder(tc.codec)
			if err != nil {
				t.Fatal(err)
			}
			defer dec.Close()
			for _, sz := range sizes {
				src := patternClip(t, sz[0], sz[1], 5)
				for i, au := range encodeClip(t, tc.setup, EncoderConfig{Width: sz[0], Height: sz[1], BitrateKbps: 1000}, src) {
					f, err := dec.Decode(au.Data)
					if err != nil || f == nil {
						t.Fatalf("%dx%d frame %d: %v, %v", sz[0], sz[1], i, f, err)
					}
					if f.W != sz[0] || f.H != sz[1] {
						t.Fatalf("%dx%d frame %d: decoded %dx%d", sz[0], sz[1], i, f.W, f.H)
					}
					if q := psnr(src[i], f); q < 33 {
						t.Errorf("%dx%d frame %d: PSNR %.1f", sz[0], sz[1], i, q)
					}
				}
			}
		})
	}
}

// TestCorruptInput: damaged access units are errors (never a crash or a
// picture passed off as good), and the decoder is whole again from the
// next key frame on.
func TestCorruptInput(t *testing.T) {
	for _, tc := range []struct {
		codec Codec
		setup encoderSetup
	}{{H264, h264Setup}, {H265, h265Live}} {
		t.Run(tc.codec.String(), func(t *testing.T) {
			src := patternClip(t, 320, 240, 20)
			aus := encodeClip(t, tc.setup, EncoderConfig{Width: 320, Height: 240, BitrateKbps: 1000, KeyEvery: 10}, src)
			if !aus[10].Key {
				t.Fatal("access unit 10 is not a key frame")
			}
			p := aus[3].Data // a P frame
			rng := rand.New(rand.NewSource(27))
			random := make([]byte, 400)
			rng.Read(random)
			flipped := append([]byte(nil), p...)
			for i := 8; i < len(flipped); i += 13 {
				flipped[i] ^= 1 << (i % 8)
			}
			for _, bad := range []struct {
				name string
				data []byte
				want string // in the error
			}{
				{"empty", nil, "empty access unit"},
				{"no start code", random, "does not begin with an Annex-B start code"},
				{"random after a start code", append([]byte{0, 0, 0, 1}, random...), ""},
				{"start code only", []byte{0, 0, 0, 1}, ""},
				{"truncated", p[:len(p)/2], ""},
				{"flipped bits", flipped, ""},
				{"over the size limit", append([]byte{0, 0, 1}, make([]byte, maxAU)...), "above the"},
			} {
				dec, err := NewDecoder(tc.codec)
				if err != nil {
					t.Fatal(err)
				}
				for i := range 3 {
					if _, err := dec.Decode(aus[i].Data); err != nil {
						t.Fatalf("%s: access unit %d: %v", bad.name, i, err)
					}
				}
				f, err := dec.Decode(bad.data)
				t.Logf("%s: %v", bad.name, err)
				if err == nil {
					t.Errorf("%s: decoded without error (picture %v)", bad.name, f != nil)
				} else if !strings.Contains(err.Error(), bad.want) || !strings.Contains(err.Error(), tc.codec.String()) {
					t.Errorf("%s: error %q, want the codec and %q", bad.name, err, bad.want)
				}
				for i := 10; i < 13; i++ { // the next key frame and what follows it
					f, err := dec.Decode(aus[i].Data)
					if err != nil || f == nil {
						t.Fatalf("%s: access unit %d after the damage: %v, %v", bad.name, i, f, err)
					}
					if q := psnr(src[i], f); q < 35 {
						t.Errorf("%s: access unit %d after the damage: PSNR %.1f", bad.name, i, q)
					}
				}
				dec.Close()
			}
		})
	}
}

// TestSkip: Skip decodes (later frames reference what it decoded) without
// handing out a picture; a decoder that never saw those frames does not
// produce the same picture.
func TestSkip(t *testing.T) {
	src := patternClip(t, 320, 240, 8)
	aus := encodeClip(t, h264Setup, EncoderConfig{Width: 320, Height: 240, BitrateKbps: 1000}, src)
	dec, err := NewDecoder(H264)
	if err != nil {
		t.Fatal(err)
	}
	defer dec.Close()
	if _, err := dec.Decode(aus[0].Data); err != nil {
		t.Fatal(err)
	}
	for i := 1; i < 7; i++ {
		if err := dec.Skip(aus[i].Data); err != nil {
			t.Fatalf("skip %d: %v", i, err)
		}
	}
	f, err := dec.Decode(aus[7].Data)
	if err != nil || f == nil {
		t.Fatalf("after skips: %v, %v", f, err)
	}
	if q := psnr(src[7], f); q < 35 {
		t.Errorf("after skips: PSNR %.1f", q)
	}
	if err := dec.Skip([]byte{1, 2, 3}); err == nil {
		t.Error("Skip accepted garbage")
	}
	// Control: frame 7 right after the key frame lacks its references.
	ctl, err := NewDecoder(H264)
	if err != nil {
		t.Fatal(err)
	}
	defer ctl.Close()
	if _, err := ctl.Decode(aus[0].Data); err != nil {
		t.Fatal(err)
	}
	if g, err := ctl.Decode(aus[7].Data); err == nil && g != nil && psnr(src[7], g) >= 35 {
		t.Error("frame 7 decoded cleanly without frames 1-6: the test cannot tell Skip from doing nothing")
	}
}

// TestTooLarge: pictures above MaxPixels are refused with ErrTooLarge, by
// libavcodec before it allocates (4096x2304) or by the check after
// decoding (3856x2160, above MaxPixels but within libavcodec's slack), by
// Decode and Skip; the decoder then takes a normal stream.
func TestTooLarge(t *testing.T) {
	if testing.Short() {
		t.Skip("encodes 4K pictures")
	}
	small := patternClip(t, 320, 240, 1)
	good := encodeClip(t, h264Setup, EncoderConfig{Width: 320, Height: 240}, small)[0]
	for _, sz := range []struct {
		w, h int
		want string // which check refused it
	}{{4096, 2304, "exceeds specified max pixel count"}, {3856, 2160, "3856x2160, at most 8294400 pixels"}} {
		big := encodeClip(t, h264Setup, EncoderConfig{Width: sz.w, Height: sz.h}, []*media.Frame{scene(sz.w, sz.h, 0)})[0]
		for _, skip := range []bool{false, true} {
			dec, err := NewDecoder(H264)
			if err != nil {
				t.Fatal(err)
			}
			if skip {
				err = dec.Skip(big.Data)
			} else {
				var f *media.Frame
				f, err = dec.Decode(big.Data)
				if f != nil {
					t.Errorf("%dx%d: handed out a %dx%d picture", sz.w, sz.h, f.W, f.H)
				}
			}
			if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), sz.want) {
				t.Errorf("%dx%d (skip %v): %v, want ErrTooLarge saying %q", sz.w, sz.h, skip, err, sz.want)
			}
			if f, err := dec.Decode(good.Data); err != nil || f == nil || f.W != 320 {
				t.Errorf("%dx%d: a normal key frame after the refusal: %v, %v", sz.w, sz.h, f, err)
			}
			dec.Close()
		}
	}
}

func TestCodec(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Codec
	}{{"h264", H264}, {"H264", H264}, {"avc", H264}, {"H.264", H264}, {"h265", H265}, {"HEVC", H265}, {" hevc ", H265}, {"vp8", 0}, {"", 0}, {"h266", 0}} {
		got, err := ParseCodec(tc.in)
		if got != tc.want || (err != nil) != (tc.want == 0) {
			t.Errorf("ParseCodec(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
		if err != nil && !strings.Contains(err.Error(), fmt.Sprintf("%q", tc.in)) {
			t.Errorf("ParseCodec(%q): error %q does not name the input", tc.in, err)
		}
	}
	for c, want := range map[Codec]string{H264: "H264", H265: "H265", 0: "Codec(0)", 9: "Codec(9)"} {
		if c.String() != want {
			t.Errorf("Codec %d prints %q, want %q", int(c), c.String(), want)
		}
	}
	for _, c := range []Codec{0, 3} {
		if _, err := NewDecoder(c); err == nil {
			t.Errorf("NewDecoder(%v) succeeded", c)
		}
	}
}

func TestIsKeyFrame(t *testing.T) {
	sc := []byte{0, 0, 0, 1}
	au := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	for _, tc := range []struct {
		name  string
		codec Codec
		au    []byte
		want  bool
	}{
		{"h264 sps pps idr", H264, au(sc, []byte{0x67, 1, 2}, sc, []byte{0x68, 3}, sc, []byte{0x65, 0x88}), true},
		{"h264 idr, 3-byte start code", H264, []byte{0, 0, 1, 0x65, 0x88}, true},
		{"h264 non-idr", H264, au(sc, []byte{0x41, 0x9a}), false},
		{"h264 sps only", H264, au(sc, []byte{0x67, 1, 2}), false},
		{"h264 sei payload holding 00 00 01 41", H264, au(sc, []byte{0x06, 0, 0, 1, 0x41}), false},
		{"h265 idr_w_radl", H265, au(sc, []byte{0x40, 1}, sc, []byte{0x42, 1}, sc, []byte{0x44, 1}, sc, []byte{0x26, 1}), true},
		{"h265 cra", H265, au(sc, []byte{0x2a, 1}), true},
		{"h265 bla_w_lp", H265, au(sc, []byte{0x20, 1}), true},
		{"h265 trail_r", H265, au(sc, []byte{0x02, 1}), false},
		{"h265 reserved irap 22", H265, au(sc, []byte{0x2c, 1}), false},
		{"h265 idr read as h264 (type 6)", H264, au(sc, []byte{0x26, 1}), false},
		{"h264 idr read as h265 (type 50)", H265, au(sc, []byte{0x65, 1}), false},
		{"start code without a header", H264, []byte{0, 0, 1}, false},
		{"empty", H265, nil, false},
	} {
		if got := IsKeyFrame(tc.codec, tc.au); got != tc.want {
			t.Errorf("%s: IsKeyFrame = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestEncoderErrors(t *testing.T) {
	for _, cfg := range []EncoderConfig{{Width: 0, Height: 10}, {Width: 64, Height: -2}, {Width: 63, Height: 48}, {Width: 64, Height: 47}, {Width: 16000, Height: 9000}} {
		if _, err := NewEncoder(cfg); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("%dx%d", cfg.Width, cfg.Height)) {
			t.Errorf("NewEncoder(%dx%d): %v, want an error naming the size", cfg.Width, cfg.Height, err)
		}
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
	// A forced key frame (a PLI) is an IDR with its parameter sets.
	for i := range 3 {
		pk, err := enc.Encode(media.NewFrame(64, 48), int64(i), i == 2)
		if err != nil || len(pk) != 1 {
			t.Fatalf("frame %d: %d access units, %v", i, len(pk), err)
		}
		if pk[0].PTS != int64(i) {
			t.Errorf("frame %d: PTS %d", i, pk[0].PTS)
		}
		key := i != 1
		if pk[0].Key != key || IsKeyFrame(H264, pk[0].Data) != key {
			t.Errorf("frame %d: key %v, IsKeyFrame %v, want %v", i, pk[0].Key, IsKeyFrame(H264, pk[0].Data), key)
		}
		if hasSPS := bytes.Contains(pk[0].Data, []byte{0, 0, 1, 0x67}); hasSPS != key {
			t.Errorf("frame %d: SPS in band %v, want %v", i, hasSPS, key)
		}
	}
	enc.Close()
	enc.Close()
	if _, err := enc.Encode(media.NewFrame(64, 48), 0, false); err == nil {
		t.Error("closed encoder encoded")
	}
	dec, err := NewDecoder(H265)
	if err != nil {
		t.Fatal(err)
	}
	dec.Close()
	dec.Close()
	if _, err := dec.Decode([]byte{0, 0, 1, 0x26}); err == nil || !strings.Contains(err.Error(), "closed") {
		t.Errorf("closed decoder: %v", err)
	}
	if err := dec.Skip([]byte{0, 0, 1, 0x26}); err == nil {
		t.Error("closed decoder skipped")
	}
}

// fuzzSeeds are real access units of both codecs (key frame first).
func fuzzSeeds(t testing.TB) map[Codec][]Encoded {
	src := patternClip(t, 64, 48, 3)
	return map[Codec][]Encoded{
		H264: encodeClip(t, h264Setup, EncoderConfig{Width: 64, Height: 48}, src),
		H265: encodeClip(t, h265Live, EncoderConfig{Width: 64, Height: 48}, src),
	}
}

// FuzzDecode feeds arbitrary bytes to a decoder that has seen a key frame:
// it returns an error or a valid picture within the size limit, never
// crashes or hangs.
func FuzzDecode(f *testing.F) {
	seeds := fuzzSeeds(f)
	for c, aus := range seeds {
		for _, au := range aus {
			f.Add(c == H265, au.Data)
		}
	}
	f.Fuzz(func(t *testing.T, hevc bool, data []byte) {
		c := H264
		if hevc {
			c = H265
		}
		dec, err := NewDecoder(c)
		if err != nil {
			t.Fatal(err)
		}
		defer dec.Close()
		if _, err := dec.Decode(seeds[c][0].Data); err != nil {
			t.Fatal(err)
		}
		for range 2 { // twice: the second sees what the first left behind
			fr, err := dec.Decode(data)
			if err == nil && fr != nil {
				if verr := fr.Valid(); verr != nil || fr.W*fr.H > MaxPixels {
					t.Fatalf("decoded an invalid picture %dx%d: %v", fr.W, fr.H, verr)
				}
			}
		}
	})
}

// BenchmarkDecode is decode + conversion to BGR per frame, one core, on
// ingest/vpx's benchmark clip (gradient and moving square, 60 frames at
// 2 Mb/s, a key frame every 60), for H.264 and, beside it in the same run
// so the ratio holds on a noisy machine, VP8 (ingest/vpx) and H.265. VP8
// spends far fewer bits on this clip than its 2 Mb/s target, so H264-vp8size
// is H.264 at the bitrate VP8 actually produced.
func BenchmarkDecode(b *testing.B) { benchDecode(b, false) }

// BenchmarkSkip is BenchmarkDecode without the conversion to BGR (Skip):
// the decoders alone.
func BenchmarkSkip(b *testing.B) { benchDecode(b, true) }

func benchDecode(b *testing.B, skip bool) {
	for _, sz := range [][2]int{{640, 480}, {1280, 720}} {
		clip := make([]*media.Frame, 60)
		for i := range clip {
			clip[i] = scene(sz[0], sz[1], i)
		}
		cfg := EncoderConfig{Width: sz[0], Height: sz[1], FPS: 30, BitrateKbps: 2000}
		venc, err := vpx.NewEncoder(vpx.EncoderConfig{Width: sz[0], Height: sz[1], FPS: 30, BitrateKbps: 2000})
		if err != nil {
			b.Fatal(err)
		}
		var vp8 [][]byte
		vbytes := 0
		for i, f := range clip {
			pk, err := venc.Encode(f, int64(i), false)
			if err != nil || len(pk) != 1 {
				b.Fatal(len(pk), err)
			}
			vp8 = append(vp8, pk[0].Data)
			vbytes += len(pk[0].Data)
		}
		venc.Close()
		avcClip := func(s encoderSetup, kbps int) [][]byte {
			c := cfg
			c.BitrateKbps = kbps
			var out [][]byte
			for _, au := range encodeClip(b, s, c, clip) {
				out = append(out, au.Data)
			}
			return out
		}
		vkbps := vbytes * 8 * 30 / len(clip) / 1000
		for _, v := range []struct {
			name  string
			codec Codec // 0: VP8
			data  [][]byte
		}{
			{"H264", H264, avcClip(h264Setup, 2000)},
			{"VP8", 0, vp8},
			{"H264-vp8size", H264, avcClip(h264Setup, vkbps)},
			{"H265", H265, avcClip(h265Live, 2000)},
		} {
			b.Run(fmt.Sprintf("%s/%dx%d", v.name, sz[0], sz[1]), func(b *testing.B) {
				var decode func([]byte) error
				if v.codec == 0 {
					dec, err := vpx.NewDecoder()
					if err != nil {
						b.Fatal(err)
					}
					defer dec.Close()
					decode = func(d []byte) error { _, err := dec.Decode(d); return err }
					if skip {
						decode = dec.Skip
					}
				} else {
					dec, err := NewDecoder(v.codec)
					if err != nil {
						b.Fatal(err)
					}
					defer dec.Close()
					decode = func(d []byte) error { _, err := dec.Decode(d); return err }
					if skip {
						decode = dec.Skip
					}
				}
				total := 0
				for _, d := range v.data {
					total += len(d)
				}
				b.ResetTimer()
				for i := range b.N {
					if err := decode(v.data[i%len(v.data)]); err != nil { // every 60th is the key frame again
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "frames/s")
				b.ReportMetric(float64(total)/float64(len(v.data)), "bytes/frame")
			})
		}
	}
}

// TestEveryWidth: a flat picture of every even width from 16 to 72 (and
// 854, 16:9 480p) comes back flat to its last column: libswscale's x86
// yuv2rgb left the last 2-6 columns of some widths (34, 36, 50, 854, ...)
// black at a stride of w*3.
func TestEveryWidth(t *testing.T) {
	colour := [3]byte{60, 110, 200}
	widths := []int{854}
	for w := 16; w <= 72; w += 2 {
		widths = append(widths, w)
	}
	for _, w := range widths {
		const h = 18
		src := media.NewFrame(w, h)
		for i := 0; i < len(src.Pix); i += 3 {
			copy(src.Pix[i:i+3], colour[:])
		}
		enc, err := NewEncoder(EncoderConfig{Width: w, Height: h, FPS: 10, BitrateKbps: 500})
		if err != nil {
			t.Fatal(err)
		}
		out, err := enc.Encode(src, 0, true)
		enc.Close()
		if err != nil || len(out) != 1 {
			t.Fatalf("%dx%d: encode: %v (%d units)", w, h, err, len(out))
		}
		dec, err := NewDecoder(H264)
		if err != nil {
			t.Fatal(err)
		}
		f, err := dec.Decode(out[0].Data)
		dec.Close()
		if err != nil || f == nil || f.W != w || f.H != h || f.Valid() != nil {
			t.Fatalf("%dx%d: decoded %v, %v", w, h, f, err)
		}
		bad, first := 0, -1
		for i := range f.Pix {
			if d := int(f.Pix[i]) - int(colour[i%3]); d < -4 || d > 4 {
				if bad++; first < 0 {
					first = i / 3
				}
			}
		}
		if bad > 0 {
			t.Errorf("%dx%d: %d samples more than 4 levels off, the first at (%d,%d): %v, source %v", w, h, bad, first%w, first/w, f.Pix[first*3:first*3+3], colour)
		}
	}
}
