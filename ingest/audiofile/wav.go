// Package audiofile reads the audio files `mdag client --audio` streams:
// WAV (RIFF, 16-bit PCM, mono or stereo, any rate; ReadWAV, with
// Resample to Opus's 48 kHz) and Ogg Opus (RFC 7845 in Ogg pages, RFC
// 3533; ReadOggOpus: the Opus packets as they are, to send without
// re-encoding), and PacketSamples, the length of an Opus packet from its
// TOC (RFC 6716 3.1). Pure Go; the parsers take outside input and are
// strict: every malformed field is an error that names it and where, and
// sizes are bounded before anything is allocated.
package audiofile

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/mdag/mdag/media"
)

// MaxBytes bounds what a reader takes from one file (about 45 minutes of
// 48 kHz stereo PCM): a larger file is refused, not read.
const MaxBytes = 512 << 20

// readAll reads r up to MaxBytes; more is an error.
func readAll(r io.Reader, what string) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, MaxBytes+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if len(b) > MaxBytes {
		return nil, fmt.Errorf("%s: larger than %d bytes", what, MaxBytes)
	}
	return b, nil
}

// WAV format tags (the fmt chunk's first field).
const (
	wavPCM        = 1
	wavExtensible = 0xfffe
)

// ReadWAV reads a RIFF WAVE file of 16-bit little-endian PCM, 1 or 2
// channels, at any rate from 8 to 384 kHz (WAVE_FORMAT_PCM, or
// WAVE_FORMAT_EXTENSIBLE with the PCM subformat); chunks other than fmt
// and data are skipped. Other encodings (float, 8/24/32-bit, compressed)
// are refused with what they are.
func ReadWAV(r io.Reader) (*media.Audio, error) {
	b, err := readAll(r, "WAV")
	if err != nil {
		return nil, err
	}
	if len(b) < 12 || string(b[0:4]) != "RIFF" || string(b[8:12]) != "WAVE" {
		return nil, errors.New("WAV: not a RIFF WAVE file (no RIFF....WAVE header)")
	}
	var a *media.Audio
	bits := 0
	for off := 12; off+8 <= len(b); {
		id, size := string(b[off:off+4]), int64(binary.LittleEndian.Uint32(b[off+4:]))
		body := off + 8
		if int64(body)+size > int64(len(b)) {
			if id != "data" {
				return nil, fmt.Errorf("WAV: chunk %q at byte %d: %d bytes, the file ends after %d", id, off, size, len(b)-body)
			}
			size = int64(len(b) - body) // a data chunk cut short (a recording stopped): what is there
		}
		data := b[body : body+int(size)]
		switch id {
		case "fmt ":
			if a != nil {
				return nil, fmt.Errorf("WAV: a second fmt chunk at byte %d", off)
			}
			if len(data) < 16 {
				return nil, fmt.Errorf("WAV: fmt chunk of %d bytes, want at least 16", len(data))
			}
			tag := binary.LittleEndian.Uint16(data)
			channels := int(binary.LittleEndian.Uint16(data[2:]))
			rate := int(binary.LittleEndian.Uint32(data[4:]))
			align := int(binary.LittleEndian.Uint16(data[12:]))
			bits = int(binary.LittleEndian.Uint16(data[14:]))
			if tag == wavExtensible {
				// cbSize, valid bits, channel mask, then the subformat GUID,
				// whose first two bytes are the format tag.
				if len(data) < 40 {
					return nil, fmt.Errorf("WAV: WAVE_FORMAT_EXTENSIBLE fmt chunk of %d bytes, want 40", len(data))
				}
				tag = binary.LittleEndian.Uint16(data[24:])
			}
			switch {
			case tag != wavPCM:
				return nil, fmt.Errorf("WAV: format tag 0x%04x: want PCM (1); float and compressed WAV are not read", tag)
			case bits != 16:
				return nil, fmt.Errorf("WAV: %d-bit samples: want 16-bit PCM", bits)
			case channels != 1 && channels != 2:
				return nil, fmt.Errorf("WAV: %d channels: want 1 or 2", channels)
			case rate < 8000 || rate > 384000:
				return nil, fmt.Errorf("WAV: sample rate %d Hz: want 8000..384000", rate)
			case align != 2*channels:
				return nil, fmt.Errorf("WAV: block align %d: want %d for %d channels of 16 bits", align, 2*channels, channels)
			}
			a = &media.Audio{Rate: rate, Channels: channels}
		case "data":
			if a == nil {
				return nil, fmt.Errorf("WAV: data chunk at byte %d before the fmt chunk", off)
			}
			if a.PCM != nil {
				return nil, fmt.Errorf("WAV: a second data chunk at byte %d", off)
			}
			n := len(data) / (2 * a.Channels) * a.Channels // whole sample frames
			a.PCM = make([]int16, n)
			for i := range n {
				a.PCM[i] = int16(binary.LittleEndian.Uint16(data[2*i:]))
			}
		}
		off = body + int(size) + int(size&1) // chunks are padded to even sizes
	}
	switch {
	case a == nil:
		return nil, errors.New("WAV: no fmt chunk")
	case a.PCM == nil:
		return nil, errors.New("WAV: no data chunk")
	case len(a.PCM) == 0:
		return nil, errors.New("WAV: the data chunk holds no samples")
	}
	return a, nil
}

// WriteWAV writes a as a 16-bit PCM WAV file (for tests and tools).
func WriteWAV(w io.Writer, a *media.Audio) error {
	if err := a.Valid(); err != nil {
		return err
	}
	n := 2 * len(a.PCM)
	b := make([]byte, 44+n)
	copy(b, "RIFF")
	binary.LittleEndian.PutUint32(b[4:], uint32(36+n))
	copy(b[8:], "WAVEfmt ")
	binary.LittleEndian.PutUint32(b[16:], 16)
	binary.LittleEndian.PutUint16(b[20:], wavPCM)
	binary.LittleEndian.PutUint16(b[22:], uint16(a.Channels))
	binary.LittleEndian.PutUint32(b[24:], uint32(a.Rate))
	binary.LittleEndian.PutUint32(b[28:], uint32(a.Rate*a.Channels*2))
	binary.LittleEndian.PutUint16(b[32:], uint16(2*a.Channels))
	binary.LittleEndian.PutUint16(b[34:], 16)
	copy(b[36:], "data")
	binary.LittleEndian.PutUint32(b[40:], uint32(n))
	for i, v := range a.PCM {
		binary.LittleEndian.PutUint16(b[44+2*i:], uint16(v))
	}
	_, err := w.Write(b)
	return err
}

// Resample converts a to rate by linear interpolation between samples
// (per channel): simple, without an anti-aliasing filter, which is enough
// for speech going up to 48 kHz (8 and 16 kHz recordings) and adds some
// aliasing going down from a higher rate. The same rate returns a.
func Resample(a *media.Audio, rate int) (*media.Audio, error) {
	if err := a.Valid(); err != nil {
		return nil, err
	}
	if rate <= 0 || rate > 384000 {
		return nil, fmt.Errorf("resample to %d Hz: want 1..384000", rate)
	}
	if a.Rate == rate {
		return a, nil
	}
	ch := a.Channels
	in := len(a.PCM) / ch
	out := int(int64(in) * int64(rate) / int64(a.Rate))
	o := &media.Audio{Rate: rate, Channels: ch, PCM: make([]int16, out*ch)}
	for i := range out {
		// The position of output sample i in input samples, in 1/2^16.
		pos := int64(i) * int64(a.Rate) << 16 / int64(rate)
		j, frac := int(pos>>16), pos&0xffff
		for c := range ch {
			x0 := int64(a.PCM[j*ch+c])
			x1 := x0
			if j+1 < in {
				x1 = int64(a.PCM[(j+1)*ch+c])
			}
			o.PCM[i*ch+c] = int16(x0 + (x1-x0)*frac>>16)
		}
	}
	return o, nil
}
