package modules

import (
	"fmt"
	"slices"
	"time"

	"github.com/mdag/mdag/media"
)

// segment is the `segment` op: it cuts a stream's audio into chunks of
// exactly `chunk` (the audio app's models take fixed-length input).
//
// Input items carry Audio (16-bit PCM) of whatever length the source
// delivered (20 ms Opus frames over WebRTC, any length from a WAV file).
// The op appends each item's samples to the stream's remainder and emits
// one item per complete chunk: Derive of the item whose samples completed
// it (so the chunk carries that item's Seq and Capture and belongs to its
// frame), with Audio of exactly chunk * rate samples per channel. What is
// left (less than a chunk) waits for the next frame: it is the op's
// per-stream state, hence Stateful. A frame may so emit no item (not a
// chunk yet) or several.
//
// The chunk must be a whole number of samples at the audio's rate (40ms at
// 48 kHz: 1920); otherwise, and for an item without valid audio, the frame
// fails with an error naming both. When an item's rate or channel count
// differs from the remainder's, the remainder (less than a chunk of the
// old format) is dropped and the stream goes on in the new format.
type segment struct {
	chunk   time.Duration
	streams streamStates[segmentState]
}

// segmentState is one stream's remainder (snapshot payload v1).
type segmentState struct {
	Rate     int     `json:"rate"`
	Channels int     `json:"channels"`
	PCM      []int16 `json:"pcm"`
}

// maxRemainder bounds a restored remainder (samples, all channels): a
// minute of stereo at 48 kHz is less.
const maxRemainder = 1 << 23

func newSegment(p Params) *segment { return &segment{chunk: p.Duration("chunk")} }

func freshSegmentState() segmentState { return segmentState{} }

func (g *segment) Process(it *media.Item) ([]*media.Item, error) { return processOne(g, it) }

func (g *segment) Close() { g.streams.clear() }

func (g *segment) Snapshot(stream string) ([]byte, error) {
	return g.streams.snapshot("segment", stream, freshSegmentState)
}

func (g *segment) Restore(stream string, b []byte) error {
	return g.streams.restore("segment", stream, b, func(s *segmentState) error {
		if s.Rate == 0 && s.Channels == 0 && len(s.PCM) == 0 {
			s.PCM = nil
			return nil
		}
		a := media.Audio{Rate: s.Rate, Channels: s.Channels, PCM: s.PCM}
		if err := a.Valid(); err != nil {
			return err
		}
		if len(s.PCM) > maxRemainder {
			return fmt.Errorf("a remainder of %d samples: at most %d", len(s.PCM), maxRemainder)
		}
		s.PCM = nilIfEmpty(s.PCM)
		return nil
	})
}

// samples is the chunk's length in samples per channel at rate, or an
// error when it is not whole.
func (g *segment) samples(rate int) (int, error) {
	n := int64(g.chunk) * int64(rate)
	if n%int64(time.Second) != 0 || n == 0 {
		return 0, fmt.Errorf("segment: params.chunk %v at %d Hz is %.2f samples: want a whole number (a chunk that is a multiple of %v)",
			g.chunk, rate, float64(n)/float64(time.Second), time.Second/time.Duration(gcd(int64(rate), int64(time.Second))))
	}
	return int(n / int64(time.Second)), nil
}

func gcd(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

func (g *segment) ProcessFrame(stream string, seq uint64, items []*media.Item) ([]*media.Item, error) {
	if err := checkFrame("segment", stream, seq, items); err != nil {
		return nil, err
	}
	for _, it := range items {
		if err := it.Audio.Valid(); err != nil {
			return nil, fmt.Errorf("segment: item of frame %s/%d: %w (segment reads an audio app's items)", stream, seq, err)
		}
		if _, err := g.samples(it.Audio.Rate); err != nil {
			return nil, err
		}
	}
	st := g.streams.get(stream, freshSegmentState)
	st.mu.Lock()
	defer st.mu.Unlock()
	s := &st.s
	var out []*media.Item
	for _, it := range items {
		a := it.Audio
		if a.Rate != s.Rate || a.Channels != s.Channels {
			s.Rate, s.Channels, s.PCM = a.Rate, a.Channels, nil
		}
		n, _ := g.samples(a.Rate)
		n *= a.Channels
		if len(s.PCM)+len(a.PCM) < n {
			s.PCM = append(s.PCM, a.PCM...)
			continue
		}
		buf := make([]int16, 0, len(s.PCM)+len(a.PCM))
		buf = append(append(buf, s.PCM...), a.PCM...)
		i := 0
		for ; i+n <= len(buf); i += n {
			o := it.Derive()
			o.Audio = &media.Audio{Rate: a.Rate, Channels: a.Channels, PCM: buf[i : i+n : i+n]}
			out = append(out, o)
		}
		s.PCM = nilIfEmpty(slices.Clone(buf[i:]))
	}
	return out, nil
}
