package wire

import (
	"errors"
	"fmt"

	"github.com/mdag/mdag/api"
	"github.com/mdag/mdag/media"
)

// IngestAudioFromPB decodes an audio chunk from outside (a source): its
// PCM at most maxBytes (ErrAudioSize), a whole number of 16-bit samples of
// every channel, not empty, and a rate and channel count media.Audio
// takes. Errors say what is wrong and the limit.
func IngestAudioFromPB(p *api.Audio, maxBytes int) (*media.Audio, error) {
	if p == nil {
		return nil, errors.New("no audio")
	}
	if len(p.Pcm) > maxBytes {
		return nil, fmt.Errorf("%w: %d bytes of PCM, at most %d", ErrAudioSize, len(p.Pcm), maxBytes)
	}
	if p.Rate <= 0 || p.Rate > 384000 || p.Channels < 1 || p.Channels > 2 {
		return nil, fmt.Errorf("audio of %d Hz, %d channels: want 1..384000 Hz, 1 or 2 channels", p.Rate, p.Channels)
	}
	if len(p.Pcm) == 0 || len(p.Pcm)%(2*int(p.Channels)) != 0 {
		return nil, fmt.Errorf("audio of %d bytes: want a positive multiple of %d (16-bit samples of %d channels)", len(p.Pcm), 2*p.Channels, p.Channels)
	}
	return AudioFromPB(p)
}
