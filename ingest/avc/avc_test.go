package avc

import (
	"fmt"
	"math"
	"testing"

	"github.com/mdag/mdag/ingest/synth"
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

func TestRoundTripH264(t *testing.T) {
	for _, sz := range [][2]int{{640, 480}, {1280, 720}} {
		t.Run(fmt.Sprintf("%dx%d", sz[0], sz[1]), func(t *testing.T) {
			src := patternClip(t, sz[0], sz[1], 20)
			enc, err := NewEncoder(EncoderConfig{Width: sz[0], Height: sz[1], BitrateKbps: 2000})
			if err != nil {
				t.Fatal(err)
			}
			defer enc.Close()
			aus := encodeAll(t, enc, src)
			if len(aus) != len(src) {
				t.Fatalf("%d access units for %d frames, want one each (zero latency)", len(aus), len(src))
			}
			dec, err := NewDecoder(H264)
			if err != nil {
				t.Fatal(err)
			}
			defer dec.Close()
			for i, au := range aus {
				f, err := dec.Decode(au.Data)
				if err != nil {
					t.Fatalf("frame %d: %v", i, err)
				}
				if f == nil || f.W != sz[0] || f.H != sz[1] {
					t.Fatalf("frame %d: decoded %v", i, f)
				}
				if want := i == 0; au.Key != want || IsKeyFrame(H264, au.Data) != want {
					t.Errorf("frame %d: key %v, IsKeyFrame %v: want %v", i, au.Key, IsKeyFrame(H264, au.Data), want)
				}
				// The pattern is flat shapes: H.264 at 2 Mb/s and the two
				// colour conversions keep it well above 35 dB, while
				// another frame of the clip (shapes moved) is far below.
				if q := psnr(src[i], f); q < 35 {
					t.Errorf("frame %d: PSNR %.1f dB against its source, want >= 35", i, q)
				}
				if j := (i + 10) % len(src); psnr(src[j], f) > 30 {
					t.Errorf("frame %d looks like frame %d (PSNR %.1f dB)", i, j, psnr(src[j], f))
				}
			}
		})
	}
}
