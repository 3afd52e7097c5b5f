package wire

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/mdag/mdag/api"
	"github.com/mdag/mdag/media"
)

// ErrAudioSize tells that an audio chunk was over its size cap
// (errors.Is).
var ErrAudioSize = errors.New("audio chunk over the size limit")

// AudioToPB encodes an audio chunk: its PCM as little-endian int16 bytes.
func AudioToPB(a *media.Audio) *api.Audio {
	if a == nil {
		return nil
	}
	b := make([]byte, 2*len(a.PCM))
	for i, v := range a.PCM {
		binary.LittleEndian.PutUint16(b[2*i:], uint16(v))
	}
	return &api.Audio{Rate: uint32(a.Rate), Channels: uint32(a.Channels), Pcm: b}
}

// AudioFromPB decodes an audio chunk from outside (a source): its PCM at
// most maxBytes (ErrAudioSize), a whole number of 16-bit samples of every
// channel, not empty, and a rate and channel count media.Audio takes.
// Errors say what is wrong and the limit.
func AudioFromPB(p *api.Audio, maxBytes int) (*media.Audio, error) {
	if p == nil {
		return nil, errors.New("no audio")
	}
	if len(p.Pcm) > maxBytes {
		return nil, fmt.Errorf("%w: %d bytes of PCM, at most %d", ErrAudioSize, len(p.Pcm), maxBytes)
	}
	if p.Rate == 0 || p.Rate > 384000 || p.Channels < 1 || p.Channels > 2 {
		return nil, fmt.Errorf("audio of %d Hz, %d channels: want 1..384000 Hz, 1 or 2 channels", p.Rate, p.Channels)
	}
	if len(p.Pcm) == 0 || len(p.Pcm)%(2*int(p.Channels)) != 0 {
		return nil, fmt.Errorf("audio of %d bytes: want a positive multiple of %d (16-bit samples of %d channels)", len(p.Pcm), 2*p.Channels, p.Channels)
	}
	a := &media.Audio{Rate: int(p.Rate), Channels: int(p.Channels), PCM: make([]int16, len(p.Pcm)/2)}
	for i := range a.PCM {
		a.PCM[i] = int16(binary.LittleEndian.Uint16(p.Pcm[2*i:]))
	}
	return a, a.Valid()
}
