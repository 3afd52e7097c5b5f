// Package opus is a small cgo wrapper around Debian's libopus (libopus-dev)
// for the audio of WebRTC streams: a Decoder that turns Opus packets (RFC
// 6716) into 16-bit PCM at 48 kHz (media.Audio), with packet loss
// concealment for gaps in a stream's RTP sequence numbers, and an Encoder
// for mdag's own client and the tests.
//
// A Decoder or Encoder is not safe for concurrent use: each stream owns
// one, used from its media goroutine only. Close frees the libopus state;
// a closed one answers every call with ErrClosed. Decoding outside input
// is safe: a packet above MaxPacket is refused before libopus sees it,
// and every libopus error code comes back as a Go error (Error, matching
// one of the sentinel errors below with errors.Is), never a crash.
package opus

/*
#cgo LDFLAGS: -lopus
#include <stdlib.h>
#include <opus/opus.h>

// mdag_enc_set sets the encoder's bitrate (bits per second) and
// complexity (0..10): OPUS_OK or a libopus error code (the ctl macros are
// variadic, which cgo cannot call).
static int mdag_enc_set(OpusEncoder *e, int bitrate, int complexity) {
	int err = opus_encoder_ctl(e, OPUS_SET_BITRATE(bitrate));
	if (err != OPUS_OK) return err;
	return opus_encoder_ctl(e, OPUS_SET_COMPLEXITY(complexity));
}
*/
import "C"

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/mdag/mdag/media"
)

// SampleRate is the rate the decoder outputs and the encoder takes: Opus's
// own (RTP's Opus clock, RFC 7587, is 48 kHz whatever the source was).
const SampleRate = 48000

// MaxPacket bounds a packet handed to Decode: libopus's recommended
// largest encoder output (4000 bytes); RFC 6716 packets of one 120 ms
// frame at the highest rate stay below it, and WebRTC's are near 100.
const MaxPacket = 4000

// MaxFrameSamples is the most samples per channel one packet decodes to:
// 120 ms at 48 kHz (RFC 6716 3.2.5).
const MaxFrameSamples = SampleRate * 120 / 1000

// Sentinel errors, one per libopus error code (Error wraps them).
var (
	ErrBadArg         = errors.New("bad argument")
	ErrBufferTooSmall = errors.New("output buffer too small")
	ErrInternal       = errors.New("libopus internal error")
	ErrInvalidPacket  = errors.New("corrupt packet")
	ErrUnimplemented  = errors.New("unimplemented request")
	ErrInvalidState   = errors.New("invalid decoder or encoder state")
	ErrAllocFail      = errors.New("memory allocation failed")
	ErrUnknown        = errors.New("unknown libopus error")
	// ErrClosed is the answer of a closed Decoder or Encoder.
	ErrClosed = errors.New("opus: closed")
	// ErrPacketSize is a packet that is empty or above MaxPacket.
	ErrPacketSize = errors.New("opus: packet size out of range")
)

// Error is a libopus call that failed: Op says which ("decode", "encode",
// "decoder init", ...), Code is libopus's (negative) error code.
type Error struct {
	Op   string
	Code int
}

func (e *Error) Error() string {
	return fmt.Sprintf("opus: %s: %v (libopus error %d)", e.Op, e.Unwrap(), e.Code)
}

// Unwrap is the sentinel error of the code.
func (e *Error) Unwrap() error { return codeErr(e.Code) }

func codeErr(code int) error {
	switch code {
	case C.OPUS_BAD_ARG:
		return ErrBadArg
	case C.OPUS_BUFFER_TOO_SMALL:
		return ErrBufferTooSmall
	case C.OPUS_INTERNAL_ERROR:
		return ErrInternal
	case C.OPUS_INVALID_PACKET:
		return ErrInvalidPacket
	case C.OPUS_UNIMPLEMENTED:
		return ErrUnimplemented
	case C.OPUS_INVALID_STATE:
		return ErrInvalidState
	case C.OPUS_ALLOC_FAIL:
		return ErrAllocFail
	}
	return ErrUnknown
}

func checkChannels(channels int) error {
	if channels != 1 && channels != 2 {
		return fmt.Errorf("opus: %d channels: want 1 (mono) or 2 (stereo)", channels)
	}
	return nil
}

// Decoder decodes one stream's Opus packets to PCM at SampleRate. Not safe
// for concurrent use.
type Decoder struct {
	d        *C.OpusDecoder
	channels int
	pcm      []int16 // MaxFrameSamples * channels
	last     int     // samples per channel of the last packet decoded (PLC repeats it)

	haveSeq bool
	seq     uint16 // the last RTP sequence number decoded
	stats   Stats
}

// Stats counts what a Decoder did with a stream's RTP packets (DecodeRTP).
type Stats struct {
	Packets   uint64 // packets decoded
	Lost      uint64 // packets missing in the sequence numbers (gaps)
	Concealed uint64 // frames made up by loss concealment for them
	Late      uint64 // packets behind the last one decoded (reordered, duplicates): dropped
	Restarts  uint64 // sequence numbers that jumped by MaxSeqJump or more: a new sequence, no loss counted
}

// MaxConceal is the most packets of one gap DecodeRTP conceals: beyond it
// (100 ms of 20 ms frames) the gap is counted as lost and the stream goes
// on without made-up audio.
const MaxConceal = 5

// MaxSeqJump is how far a sequence number may jump (either way) and still
// be a loss (ahead) or a late packet (behind); a larger jump is a sender
// that started a new sequence (a restart): decoding goes on from it.
const MaxSeqJump = 1000

// NewDecoder returns a decoder to 48 kHz PCM with channels channels (1 or
// 2; a stereo packet decodes to mono and back as libopus mixes).
func NewDecoder(channels int) (*Decoder, error) {
	if err := checkChannels(channels); err != nil {
		return nil, err
	}
	var code C.int
	d := C.opus_decoder_create(SampleRate, C.int(channels), &code)
	if code != C.OPUS_OK || d == nil {
		return nil, &Error{Op: "decoder init", Code: int(code)}
	}
	return &Decoder{d: d, channels: channels, pcm: make([]int16, MaxFrameSamples*channels)}, nil
}

// Channels is the decoder's output channel count.
func (d *Decoder) Channels() int { return d.channels }

// Stats are the decoder's counts so far.
func (d *Decoder) Stats() Stats { return d.stats }

// Decode decodes one packet into a new chunk of PCM.
func (d *Decoder) Decode(pkt []byte) (*media.Audio, error) {
	if d.d == nil {
		return nil, ErrClosed
	}
	if len(pkt) == 0 || len(pkt) > MaxPacket {
		return nil, fmt.Errorf("%w: %d bytes (want 1..%d)", ErrPacketSize, len(pkt), MaxPacket)
	}
	n := C.opus_decode(d.d, (*C.uchar)(unsafe.Pointer(&pkt[0])), C.opus_int32(len(pkt)),
		(*C.opus_int16)(unsafe.Pointer(&d.pcm[0])), C.int(MaxFrameSamples), 0)
	if n < 0 {
		return nil, &Error{Op: fmt.Sprintf("decode %d-byte packet", len(pkt)), Code: int(n)}
	}
	d.last = int(n)
	return d.chunk(int(n)), nil
}

// Conceal makes up samples samples per channel (a multiple of 2.5 ms, at
// most MaxFrameSamples) for a lost packet: libopus's packet loss
// concealment, which extrapolates from the audio before.
func (d *Decoder) Conceal(samples int) (*media.Audio, error) {
	if d.d == nil {
		return nil, ErrClosed
	}
	if samples <= 0 || samples > MaxFrameSamples || samples%(SampleRate/400) != 0 {
		return nil, fmt.Errorf("opus: conceal %d samples: want a multiple of %d (2.5 ms) up to %d", samples, SampleRate/400, MaxFrameSamples)
	}
	n := C.opus_decode(d.d, nil, 0, (*C.opus_int16)(unsafe.Pointer(&d.pcm[0])), C.int(samples), 0)
	if n < 0 {
		return nil, &Error{Op: "conceal", Code: int(n)}
	}
	return d.chunk(int(n)), nil
}

func (d *Decoder) chunk(n int) *media.Audio {
	out := make([]int16, n*d.channels)
	copy(out, d.pcm)
	return &media.Audio{Rate: SampleRate, Channels: d.channels, PCM: out}
}

// DecodeRTP decodes the payload of the RTP packet numbered seq: after a
// gap in the sequence numbers it first conceals the missing packets (at
// most MaxConceal, each as long as the last packet decoded), so the
// chunks it returns are the concealed ones, then the packet's. A packet
// behind the last one decoded (reordered, a duplicate) is dropped and
// counted (Stats.Late): the audio already went on without it; a jump of
// MaxSeqJump or more either way is a new sequence (Stats.Restarts). A corrupt
// payload is an error, with (once a packet has decoded) a concealed frame
// in its place as the last chunk, so the audio keeps its timing; the
// stream can go on with the next packet.
func (d *Decoder) DecodeRTP(seq uint16, payload []byte) ([]*media.Audio, error) {
	if d.d == nil {
		return nil, ErrClosed
	}
	var out []*media.Audio
	if d.haveSeq {
		if diff := int16(seq - d.seq); diff <= -MaxSeqJump || diff >= MaxSeqJump {
			d.stats.Restarts++
			d.haveSeq = false
		}
	}
	if d.haveSeq {
		diff := int16(seq - d.seq)
		if diff <= 0 {
			d.stats.Late++
			return nil, nil
		}
		if missing := int(diff) - 1; missing > 0 {
			d.stats.Lost += uint64(missing)
			if d.last > 0 {
				for range min(missing, MaxConceal) {
					a, err := d.Conceal(d.last)
					if err != nil {
						return out, err
					}
					d.stats.Concealed++
					out = append(out, a)
				}
			}
		}
	}
	d.haveSeq, d.seq = true, seq
	a, err := d.Decode(payload)
	if err != nil {
		if d.last > 0 {
			if c, cerr := d.Conceal(d.last); cerr == nil {
				d.stats.Concealed++
				out = append(out, c)
			}
		}
		return out, err
	}
	d.stats.Packets++
	return append(out, a), nil
}

// Skip takes seq as used without audio (an RTP padding-only packet has
// its own sequence number): the next packet after it is no loss. A seq
// that is not just ahead of the last one is ignored.
func (d *Decoder) Skip(seq uint16) {
	if !d.haveSeq {
		return
	}
	if diff := int16(seq - d.seq); diff > 0 && diff < MaxSeqJump {
		d.seq = seq
	}
}

// Close frees the decoder; it may be called more than once.
func (d *Decoder) Close() {
	if d.d != nil {
		C.opus_decoder_destroy(d.d)
		d.d = nil
	}
}

// Application is the encoder's tuning (OPUS_APPLICATION_*).
type Application int

const (
	// VoIP favours speech intelligibility.
	VoIP Application = C.OPUS_APPLICATION_VOIP
	// Audio favours faithfulness to the input (music, tones).
	Audio Application = C.OPUS_APPLICATION_AUDIO
	// LowDelay turns off the speech modes for the lowest delay.
	LowDelay Application = C.OPUS_APPLICATION_RESTRICTED_LOWDELAY
)

// EncoderConfig configures an Encoder.
type EncoderConfig struct {
	Channels    int         // 1 or 2
	Bitrate     int         // bits per second, 6000..510000 (default 32000 per channel)
	Application Application // default Audio
	Complexity  int         // 0..10 (default 5)
}

// Encoder encodes 48 kHz PCM into Opus packets. Not safe for concurrent
// use.
type Encoder struct {
	e        *C.OpusEncoder
	channels int
	out      []byte
}

// NewEncoder returns an encoder of 48 kHz PCM.
func NewEncoder(cfg EncoderConfig) (*Encoder, error) {
	if err := checkChannels(cfg.Channels); err != nil {
		return nil, err
	}
	if cfg.Bitrate == 0 {
		cfg.Bitrate = 32000 * cfg.Channels
	}
	if cfg.Bitrate < 6000 || cfg.Bitrate > 510000 {
		return nil, fmt.Errorf("opus: bitrate %d: want 6000..510000 bits per second", cfg.Bitrate)
	}
	if cfg.Application == 0 {
		cfg.Application = Audio
	}
	if cfg.Complexity == 0 {
		cfg.Complexity = 5
	}
	if cfg.Complexity < 0 || cfg.Complexity > 10 {
		return nil, fmt.Errorf("opus: complexity %d: want 0..10", cfg.Complexity)
	}
	var code C.int
	e := C.opus_encoder_create(SampleRate, C.int(cfg.Channels), C.int(cfg.Application), &code)
	if code != C.OPUS_OK || e == nil {
		return nil, &Error{Op: "encoder init", Code: int(code)}
	}
	if code := C.mdag_enc_set(e, C.int(cfg.Bitrate), C.int(cfg.Complexity)); code != C.OPUS_OK {
		C.opus_encoder_destroy(e)
		return nil, &Error{Op: fmt.Sprintf("encoder bitrate %d, complexity %d", cfg.Bitrate, cfg.Complexity), Code: int(code)}
	}
	return &Encoder{e: e, channels: cfg.Channels, out: make([]byte, MaxPacket)}, nil
}

// FrameSamples reports whether n samples per channel is a frame length
// Opus encodes: 2.5, 5, 10, 20, 40 or 60 ms at 48 kHz.
func FrameSamples(n int) bool {
	switch n {
	case 120, 240, 480, 960, 1920, 2880:
		return true
	}
	return false
}

// Encode encodes one frame of interleaved PCM (FrameSamples per channel)
// into a new packet.
func (e *Encoder) Encode(pcm []int16) ([]byte, error) {
	if e.e == nil {
		return nil, ErrClosed
	}
	if len(pcm)%e.channels != 0 || !FrameSamples(len(pcm)/e.channels) {
		return nil, fmt.Errorf("opus: encode %d samples of %d channels: want 2.5, 5, 10, 20, 40 or 60 ms at 48 kHz (120, 240, 480, 960, 1920 or 2880 per channel)",
			len(pcm), e.channels)
	}
	n := C.opus_encode(e.e, (*C.opus_int16)(unsafe.Pointer(&pcm[0])), C.int(len(pcm)/e.channels),
		(*C.uchar)(unsafe.Pointer(&e.out[0])), C.opus_int32(len(e.out)))
	if n < 0 {
		return nil, &Error{Op: "encode", Code: int(n)}
	}
	return append([]byte(nil), e.out[:n]...), nil
}

// Close frees the encoder; it may be called more than once.
func (e *Encoder) Close() {
	if e.e != nil {
		C.opus_encoder_destroy(e.e)
		e.e = nil
	}
}
