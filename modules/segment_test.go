package modules

import (
	"slices"
	"strings"
	"testing"

	"github.com/mdag/mdag/media"
)

// TestSegment: chunks are exactly chunk long, carry the seq of the item
// that completed them, contain the samples in order with none lost or
// repeated, and the remainder waits for the next frame.
func TestSegment(t *testing.T) {
	tests := []struct {
		name     string
		chunk    string
		rate     int
		channels int
		pieces   []int    // samples per channel of each frame's audio
		want     [][2]int // per output: (seq, first sample)
	}{
		// 40 ms at 16 kHz: 640 samples.
		{"20 ms Opus frames, two per chunk", "40ms", 16000, 1, []int{320, 320, 320, 320, 320},
			[][2]int{{2, 0}, {4, 640}}},
		{"uneven pieces", "40ms", 16000, 1, []int{100, 600, 5, 700, 1},
			[][2]int{{2, 0}, {4, 640}}},
		{"one piece gives several chunks", "40ms", 16000, 1, []int{2000, 600},
			[][2]int{{1, 0}, {1, 640}, {1, 1280}, {2, 1920}}},
		{"stereo counts samples per channel", "20ms", 48000, 2, []int{480, 480, 960},
			[][2]int{{2, 0}, {3, 1920}}},
		{"an exact chunk", "10ms", 8000, 1, []int{80, 80},
			[][2]int{{1, 0}, {2, 80}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g := newStateful(t, "segment", map[string]any{"chunk": tc.chunk})
			next := 0
			var got [][2]int
			for i, n := range tc.pieces {
				seq := uint64(i + 1)
				it := item("s", seq)
				pcm := make([]int16, n*tc.channels)
				for j := range pcm {
					pcm[j] = int16(next + j)
				}
				next += len(pcm)
				it.Audio = &media.Audio{Rate: tc.rate, Channels: tc.channels, PCM: pcm}
				out, err := g.ProcessFrame("s", seq, []*media.Item{it})
				if err != nil {
					t.Fatal(err)
				}
				for _, o := range out {
					a := o.Audio
					if a.Rate != tc.rate || a.Channels != tc.channels || a.Duration().String() != tc.chunk || o.Seq != seq || !o.Capture.Equal(it.Capture) {
						t.Fatalf("frame %d: chunk %d Hz x%d of %v, seq %d", seq, a.Rate, a.Channels, a.Duration(), o.Seq)
					}
					for j, v := range a.PCM {
						if int(v) != int(a.PCM[0])+j {
							t.Fatalf("frame %d: chunk not contiguous at %d", seq, j)
						}
					}
					got = append(got, [2]int{int(o.Seq), int(a.PCM[0])})
				}
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("chunks (seq, first sample) %v, want %v", got, tc.want)
			}
		})
	}
}

// TestSegmentErrors: a chunk that is not whole samples at the rate and an
// item without audio fail the frame with a clear error; a format change
// drops the remainder.
func TestSegmentErrors(t *testing.T) {
	g := newStateful(t, "segment", map[string]any{"chunk": "7ms"})
	it := item("s", 1)
	it.Audio = &media.Audio{Rate: 44100, Channels: 1, PCM: make([]int16, 500)}
	_, err := g.ProcessFrame("s", 1, []*media.Item{it})
	if err == nil || !strings.Contains(err.Error(), "segment: params.chunk 7ms at 44100 Hz is 308.70 samples: want a whole number (a chunk that is a multiple of 10ms)") {
		t.Errorf("7ms at 44.1 kHz: %v", err)
	}
	_, err = g.ProcessFrame("s", 2, []*media.Item{item("s", 2)})
	if err == nil || !strings.Contains(err.Error(), "segment: item of frame s/2: no audio") {
		t.Errorf("no audio: %v", err)
	}

	g = newStateful(t, "segment", nil) // 40 ms
	mono := item("s", 1)
	mono.Audio = &media.Audio{Rate: 16000, Channels: 1, PCM: make([]int16, 600)}
	stereo := item("s", 2)
	stereo.Audio = &media.Audio{Rate: 16000, Channels: 2, PCM: make([]int16, 2*100)}
	more := item("s", 3)
	more.Audio = &media.Audio{Rate: 16000, Channels: 2, PCM: make([]int16, 2*539)}
	for i, f := range []*media.Item{mono, stereo, more} {
		out, err := g.ProcessFrame("s", f.Seq, []*media.Item{f})
		if err != nil || len(out) != 0 {
			t.Fatalf("frame %d: %d chunks, %v; want none (the 600 mono samples are dropped at the switch)", i+1, len(out), err)
		}
	}
	last := item("s", 4)
	last.Audio = &media.Audio{Rate: 16000, Channels: 2, PCM: make([]int16, 2*1)}
	if out, err := g.ProcessFrame("s", 4, []*media.Item{last}); err != nil || len(out) != 1 || len(out[0].Audio.PCM) != 2*640 {
		t.Fatalf("the 640th stereo sample: %v %v", out, err)
	}
}
