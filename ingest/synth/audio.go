package synth

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/media"
)

// Tone is the synthetic audio source: 16-bit PCM at Rate, Channels
// channels (the same signal on each), of chirps separated by silence:
// for On a tone sweeps linearly from Low to High Hz, then Off is silent,
// and so on. A stream's index shifts its chirps up (Shift Hz per index)
// so streams differ. Chunks are computed from the absolute sample number,
// so they join without clicks whatever their length.
type Tone struct {
	Rate      int
	Channels  int
	On, Off   time.Duration
	Low, High float64 // Hz
	Shift     float64 // Hz per stream index
	Amplitude float64 // of the sine, at most 32767
}

// NewTone is 48 kHz mono, 800 ms chirps from 300 to 3000 Hz and 400 ms of
// silence, amplitude 8000 (about -12 dBFS), 50 Hz higher per stream.
func NewTone() *Tone {
	return &Tone{Rate: 48000, Channels: 1, On: 800 * time.Millisecond, Off: 400 * time.Millisecond,
		Low: 300, High: 3000, Shift: 50, Amplitude: 8000}
}

// Check says what is wrong with the tone's settings.
func (t *Tone) Check() error {
	switch {
	case t.Rate < 8000 || t.Rate > 384000:
		return fmt.Errorf("tone rate %d Hz: want 8000..384000", t.Rate)
	case t.Channels != 1 && t.Channels != 2:
		return fmt.Errorf("tone channels %d: want 1 or 2", t.Channels)
	case t.On <= 0 || t.Off < 0:
		return fmt.Errorf("tone on %v, off %v: want on > 0, off >= 0", t.On, t.Off)
	case t.Low <= 0 || t.High < t.Low || t.High >= float64(t.Rate)/2:
		return fmt.Errorf("tone %g..%g Hz: want 0 < low <= high < %d (half the rate)", t.Low, t.High, t.Rate/2)
	case t.Amplitude < 0 || t.Amplitude > 32767:
		return fmt.Errorf("tone amplitude %g: want 0..32767", t.Amplitude)
	}
	return nil
}

// Sample is sample n (per channel, from the stream's start) of stream
// index's signal.
func (t *Tone) Sample(index int, n int64) int16 {
	on := int64(t.On) * int64(t.Rate) / int64(time.Second)
	period := on + int64(t.Off)*int64(t.Rate)/int64(time.Second)
	k := n % period
	if k >= on {
		return 0
	}
	// A linear chirp: f(k) = f0 + (f1-f0) k/on; its phase is the integral.
	f0 := t.Low + t.Shift*float64(index)
	f1 := min(t.High+t.Shift*float64(index), float64(t.Rate)/2-1)
	x := float64(k)
	phase := 2 * math.Pi * (f0*x + (f1-f0)*x*x/(2*float64(on))) / float64(t.Rate)
	return int16(t.Amplitude * math.Sin(phase))
}

// Chunk is chunk seq of stream index, samples samples per channel long
// (chunk seq starts at sample seq*samples).
func (t *Tone) Chunk(index int, seq uint64, samples int) *media.Audio {
	a := &media.Audio{Rate: t.Rate, Channels: t.Channels, PCM: make([]int16, samples*t.Channels)}
	start := int64(seq) * int64(samples)
	for i := range samples {
		v := t.Sample(index, start+int64(i))
		for c := range t.Channels {
			a.PCM[i*t.Channels+c] = v
		}
	}
	return a
}

// ChunkSamples is the samples per channel of a chunk at fps chunks a
// second (rounded; at least one).
func (t *Tone) ChunkSamples(fps float64) int {
	return max(1, int(float64(t.Rate)/fps+0.5))
}

// AudioSink receives generated audio chunks.
type AudioSink func(stream string, seq uint64, capture time.Time, a *media.Audio) error

// Generate sends stream index's chunks, each 1/fps long (an audio app's
// frames per second are its chunks per second), at fps on clk until ctx
// ends or count chunks were sent (count 0: no limit); each chunk's capture
// time is its first sample's slot in the schedule.
func (t *Tone) Generate(ctx context.Context, clk clock.Clock, index int, stream string, fps float64, count uint64, sink AudioSink) error {
	if err := t.Check(); err != nil {
		return err
	}
	if fps <= 0 {
		return fmt.Errorf("fps %g: want > 0", fps)
	}
	n := t.ChunkSamples(fps)
	return pace(ctx, clk, fps, count, func(seq uint64, at time.Time) error {
		return sink(stream, seq, at, t.Chunk(index, seq, n))
	})
}
