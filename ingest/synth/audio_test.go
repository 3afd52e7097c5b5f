package synth

import (
	"context"
	"math"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/media"
)

func rms(pcm []int16) float64 {
	var s float64
	for _, v := range pcm {
		s += float64(v) * float64(v)
	}
	return math.Sqrt(s / float64(max(1, len(pcm))))
}

// TestTone: chirps where they should be, silence between them, chunks that
// join into the same signal whatever their length, streams that differ.
func TestTone(t *testing.T) {
	tone := NewTone()
	if err := tone.Check(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		seq     uint64
		samples int
		silent  bool
	}{
		{"first 20 ms", 0, 960, false},
		{"inside the chirp", 20, 960, false},
		{"in the gap (800..1200 ms)", 45, 960, true},
		{"second chirp", 61, 960, false},
		{"40 ms chunk in the gap", 21, 1920, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := tone.Chunk(0, tc.seq, tc.samples)
			if err := a.Valid(); err != nil || len(a.PCM) != tc.samples || a.Rate != 48000 {
				t.Fatalf("chunk %d Hz, %d samples: %v", a.Rate, len(a.PCM), err)
			}
			r := rms(a.PCM)
			if tc.silent && r != 0 || !tc.silent && (r < 4000 || r > 6500) {
				t.Errorf("RMS %.0f; silent %v (a sine of 8000 is 5657)", r, tc.silent)
			}
		})
	}
	// 20 ms chunks 2k and 2k+1 are the 40 ms chunk k.
	long := tone.Chunk(0, 7, 1920)
	a, b := tone.Chunk(0, 14, 960), tone.Chunk(0, 15, 960)
	for i := range 1920 {
		want := a.PCM
		j := i
		if i >= 960 {
			want, j = b.PCM, i-960
		}
		if long.PCM[i] != want[j] {
			t.Fatalf("sample %d: 40 ms chunk %d, 20 ms chunks %d", i, long.PCM[i], want[j])
		}
	}
	if s0, s1 := tone.Chunk(0, 3, 960), tone.Chunk(1, 3, 960); rms(s0.PCM) == 0 || equal(s0, s1) {
		t.Error("streams 0 and 1 are the same signal")
	}
	stereo := *tone
	stereo.Channels = 2
	if c := stereo.Chunk(0, 3, 960); len(c.PCM) != 1920 || c.PCM[100] != c.PCM[101] || c.Valid() != nil {
		t.Errorf("stereo chunk: %d samples, channels differ %v", len(c.PCM), c.PCM[100] != c.PCM[101])
	}
}

func equal(a, b *media.Audio) bool {
	for i := range a.PCM {
		if a.PCM[i] != b.PCM[i] {
			return false
		}
	}
	return true
}

func TestToneCheck(t *testing.T) {
	for _, tc := range []struct {
		name string
		mod  func(*Tone)
		want string
	}{
		{"rate", func(x *Tone) { x.Rate = 100 }, "rate"},
		{"channels", func(x *Tone) { x.Channels = 3 }, "channels"},
		{"on", func(x *Tone) { x.On = 0 }, "on"},
		{"nyquist", func(x *Tone) { x.High = 30000 }, "half the rate"},
		{"amplitude", func(x *Tone) { x.Amplitude = 40000 }, "amplitude"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := NewTone()
			tc.mod(x)
			if err := x.Check(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Check = %v, want it to name %q", err, tc.want)
			}
		})
	}
}

// TestToneGenerate: chunks of 1/fps at fps on a fake clock, numbered,
// capture times on the schedule.
func TestToneGenerate(t *testing.T) {
	for _, tc := range []struct {
		fps     float64
		samples int
	}{{50, 960}, {25, 1920}} {
		clk := clock.NewFake(time.Unix(1e9, 0))
		start := clk.Now()
		type got struct {
			seq     uint64
			capture time.Time
			n       int
		}
		out := make(chan got, 16)
		done := make(chan error, 1)
		go func() {
			done <- NewTone().Generate(context.Background(), clk, 0, "s", tc.fps, 5, func(stream string, seq uint64, capture time.Time, a *media.Audio) error {
				out <- got{seq, capture, len(a.PCM)}
				return nil
			})
		}()
		period := time.Duration(float64(time.Second) / tc.fps)
		for i := range 5 {
			if i > 0 {
				for clk.Pending() == 0 { // the generator waits for chunk i's slot
					runtime.Gosched()
				}
				clk.Advance(period)
			}
			g := <-out
			if g.seq != uint64(i) || !g.capture.Equal(start.Add(time.Duration(i)*period)) || g.n != tc.samples {
				t.Errorf("fps %g chunk %d: seq %d at %v, %d samples; want %d at %v, %d", tc.fps, i, g.seq, g.capture.Sub(start), g.n, i, time.Duration(i)*period, tc.samples)
			}
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	if err := NewTone().Generate(context.Background(), clock.Real{}, 0, "s", 0, 1, nil); err == nil {
		t.Error("fps 0 accepted")
	}
}
