package clips

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/bluenviron/mediacommon/pkg/codecs/h264"
	"github.com/bluenviron/mediacommon/pkg/formats/fmp4"
	"github.com/bluenviron/mediacommon/pkg/formats/pmp4"
)

// timescale is the MP4 track's: 90 kHz, as RTP video's.
const timescale = 90000

// WriteMP4 writes samples (H.264, Annex-B, the first a key frame with SPS
// and PPS) as a progressive MP4 with one video track. Each sample lasts
// until the next one's capture; the last lasts as long as the one before
// it (or last, if it is the only one).
func WriteMP4(w io.Writer, samples []Sample, last time.Duration) error {
	if len(samples) == 0 {
		return errors.New("clips: no samples")
	}
	if !samples[0].Key {
		return errors.New("clips: the first sample is not a key frame")
	}
	var sps, pps []byte
	track := &pmp4.Track{ID: 1, TimeScale: timescale}
	var start time.Duration
	for i, s := range samples {
		nalus, err := h264.AnnexBUnmarshal(s.Data)
		if err != nil {
			return fmt.Errorf("clips: sample %d (seq %d): %w", i, s.Seq, err)
		}
		keep := nalus[:0:0]
		for _, n := range nalus {
			if len(n) == 0 {
				continue
			}
			switch h264.NALUType(n[0] & 0x1f) {
			case h264.NALUTypeSPS:
				if sps == nil {
					sps = n
				}
			case h264.NALUTypePPS:
				if pps == nil {
					pps = n
				}
			case h264.NALUTypeAccessUnitDelimiter:
			default:
				keep = append(keep, n)
			}
		}
		if len(keep) == 0 {
			return fmt.Errorf("clips: sample %d (seq %d) holds no picture", i, s.Seq)
		}
		avcc, err := h264.AVCCMarshal(keep)
		if err != nil {
			return fmt.Errorf("clips: sample %d (seq %d): %w", i, s.Seq, err)
		}
		var d time.Duration
		switch {
		case i+1 < len(samples):
			d = samples[i+1].Capture.Sub(s.Capture)
		case i > 0:
			d = s.Capture.Sub(samples[i-1].Capture)
		default:
			d = last
		}
		// durations in ticks from the clip's start, rounded, so that their
		// sum is the clip's length whatever the rounding of each
		end := start + max(d, time.Second/timescale)
		ticks := ticksOf(end) - ticksOf(start)
		start = end
		track.Samples = append(track.Samples, &pmp4.Sample{
			Duration:        uint32(max(ticks, 1)),
			IsNonSyncSample: !s.Key,
			PayloadSize:     uint32(len(avcc)),
			GetPayload:      func() ([]byte, error) { return avcc, nil },
		})
	}
	if sps == nil || pps == nil {
		return errors.New("clips: no SPS and PPS in the first key frame")
	}
	track.Codec = &fmp4.CodecH264{SPS: sps, PPS: pps}
	var buf bytes.Buffer // pmp4 writes the header before the data; the clip is small
	p := pmp4.Presentation{Tracks: []*pmp4.Track{track}}
	if err := p.Marshal(&buf); err != nil {
		return fmt.Errorf("clips: mp4: %w", err)
	}
	_, err := w.Write(buf.Bytes())
	return err
}

func ticksOf(d time.Duration) int64 {
	return (int64(d)*timescale + int64(time.Second)/2) / int64(time.Second)
}
