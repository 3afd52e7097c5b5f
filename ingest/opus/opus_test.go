package opus

import (
	"errors"
	"math"
	"testing"

	"github.com/mdag/mdag/media"
)

// tone is n samples per channel of a sine at freq Hz, amplitude amp,
// interleaved into channels (the right channel at half the amplitude).
func tone(n, channels int, freq, amp float64, start int) []int16 {
	out := make([]int16, n*channels)
	for i := range n {
		v := amp * math.Sin(2*math.Pi*freq*float64(start+i)/SampleRate)
		out[i*channels] = int16(v)
		if channels == 2 {
			out[i*channels+1] = int16(v / 2)
		}
	}
	return out
}

// rms is the root mean square of channel ch of interleaved pcm.
func rms(pcm []int16, channels, ch int) float64 {
	var s float64
	n := 0
	for i := ch; i < len(pcm); i += channels {
		s += float64(pcm[i]) * float64(pcm[i])
		n++
	}
	if n == 0 {
		return 0
	}
	return math.Sqrt(s / float64(n))
}

// goertzel is the power of channel ch of pcm at freq Hz.
func goertzel(pcm []int16, channels, ch int, freq float64) float64 {
	w := 2 * math.Pi * freq / SampleRate
	c := 2 * math.Cos(w)
	var s1, s2 float64
	for i := ch; i < len(pcm); i += channels {
		s := float64(pcm[i]) + c*s1 - s2
		s2, s1 = s1, s
	}
	return s1*s1 + s2*s2 - c*s1*s2
}

// encodeTone encodes frames 20 ms frames of a 440 Hz tone.
func encodeTone(t testing.TB, channels, bitrate, frames int) ([]int16, [][]byte) {
	t.Helper()
	enc, err := NewEncoder(EncoderConfig{Channels: channels, Bitrate: bitrate})
	if err != nil {
		t.Fatal(err)
	}
	defer enc.Close()
	var src []int16
	var pkts [][]byte
	for i := range frames {
		pcm := tone(960, channels, 440, 8000, i*960)
		p, err := enc.Encode(pcm)
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		src = append(src, pcm...)
		pkts = append(pkts, p)
	}
	return src, pkts
}

func TestRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name              string
		channels, bitrate int
	}{
		{"mono 32k", 1, 32000},
		{"mono 64k", 1, 64000},
		{"stereo 32k", 2, 32000},
		{"stereo 64k", 2, 64000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src, pkts := encodeTone(t, tc.channels, tc.bitrate, 50) // 1 s
			dec, err := NewDecoder(tc.channels)
			if err != nil {
				t.Fatal(err)
			}
			defer dec.Close()
			var out []int16
			for i, p := range pkts {
				a, err := dec.Decode(p)
				if err != nil {
					t.Fatalf("packet %d: %v", i, err)
				}
				if a.Rate != SampleRate || a.Channels != tc.channels || len(a.PCM) != 960*tc.channels {
					t.Fatalf("packet %d: %d Hz, %d channels, %d samples; want %d, %d, %d", i, a.Rate, a.Channels, len(a.PCM), SampleRate, tc.channels, 960*tc.channels)
				}
				if err := a.Valid(); err != nil {
					t.Fatal(err)
				}
				out = append(out, a.PCM...)
			}
			if len(out) != len(src) {
				t.Fatalf("decoded %d samples, sent %d", len(out), len(src))
			}
			// Skip the first 100 ms: the codec's delay and start-up.
			skip := 4800 * tc.channels
			for ch := range tc.channels {
				in, got := rms(src[skip:], tc.channels, ch), rms(out[skip:], tc.channels, ch)
				if r := got / in; r < 0.8 || r > 1.2 {
					t.Errorf("channel %d: decoded RMS %.0f, sent %.0f (ratio %.2f, want 0.8..1.2)", ch, got, in, r)
				}
				at, off := goertzel(out[skip:], tc.channels, ch, 440), goertzel(out[skip:], tc.channels, ch, 1000)
				if at < 100*off {
					t.Errorf("channel %d: power at 440 Hz %.3g, at 1 kHz %.3g: the tone is not what came back", ch, at, off)
				}
			}
		})
	}
}

func TestDecodeErrors(t *testing.T) {
	_, pkts := encodeTone(t, 1, 32000, 1)
	for _, tc := range []struct {
		name string
		pkt  []byte
		want error
	}{
		{"empty", nil, ErrPacketSize},
		{"too large", make([]byte, MaxPacket+1), ErrPacketSize},
		// Code 3 (RFC 6716 3.2.5) with a frame count of 0: invalid.
		{"code 3 no frames", []byte{0x03, 0x00}, ErrInvalidPacket},
		// Code 1 (two frames of equal size) with an odd payload length.
		{"code 1 odd", []byte{0x01, 0x00, 0x00, 0x00}, ErrInvalidPacket},
		// Code 2 with a first frame longer than the packet.
		{"code 2 overlong", []byte{0x02, 0xfb, 0x00}, ErrInvalidPacket},
		{"valid", pkts[0], nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dec, err := NewDecoder(1)
			if err != nil {
				t.Fatal(err)
			}
			defer dec.Close()
			a, err := dec.Decode(tc.pkt)
			if !errors.Is(err, tc.want) || (tc.want == nil) != (a != nil) {
				t.Fatalf("Decode = %v, %v; want error %v", a, err, tc.want)
			}
			if err != nil && err.Error() == tc.want.Error() && tc.want != ErrPacketSize {
				t.Errorf("error %q: want it to say where (op, code)", err)
			}
		})
	}
}

func TestErrorCodes(t *testing.T) {
	for code, want := range map[int]error{-1: ErrBadArg, -2: ErrBufferTooSmall, -3: ErrInternal, -4: ErrInvalidPacket,
		-5: ErrUnimplemented, -6: ErrInvalidState, -7: ErrAllocFail, -99: ErrUnknown} {
		err := &Error{Op: "decode", Code: code}
		if !errors.Is(err, want) {
			t.Errorf("code %d: %v is not %v", code, err, want)
		}
	}
}

func TestArgs(t *testing.T) {
	for _, tc := range []struct {
		name string
		fn   func() error
	}{
		{"decoder 0 channels", func() error { _, err := NewDecoder(0); return err }},
		{"decoder 3 channels", func() error { _, err := NewDecoder(3); return err }},
		{"encoder 3 channels", func() error { _, err := NewEncoder(EncoderConfig{Channels: 3}); return err }},
		{"encoder bitrate", func() error { _, err := NewEncoder(EncoderConfig{Channels: 1, Bitrate: 1000}); return err }},
		{"encoder complexity", func() error { _, err := NewEncoder(EncoderConfig{Channels: 1, Complexity: 11}); return err }},
		{"encode odd frame", func() error {
			e, err := NewEncoder(EncoderConfig{Channels: 1})
			if err != nil {
				return nil
			}
			defer e.Close()
			_, err = e.Encode(make([]int16, 1000))
			return err
		}},
		{"encode stereo uneven", func() error {
			e, err := NewEncoder(EncoderConfig{Channels: 2})
			if err != nil {
				return nil
			}
			defer e.Close()
			_, err = e.Encode(make([]int16, 961))
			return err
		}},
		{"conceal odd length", func() error {
			d, err := NewDecoder(1)
			if err != nil {
				return nil
			}
			defer d.Close()
			_, err = d.Conceal(100)
			return err
		}},
		{"decode closed", func() error {
			d, err := NewDecoder(1)
			if err != nil {
				return nil
			}
			d.Close()
			d.Close()
			_, err = d.Decode([]byte{1, 2, 3})
			return err
		}},
		{"encode closed", func() error {
			e, err := NewEncoder(EncoderConfig{Channels: 1})
			if err != nil {
				return nil
			}
			e.Close()
			_, err = e.Encode(make([]int16, 960))
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.fn(); err == nil {
				t.Fatal("no error")
			}
		})
	}
}

func TestDecodeRTP(t *testing.T) {
	_, pkts := encodeTone(t, 1, 32000, 20)
	for _, tc := range []struct {
		name   string
		seqs   []uint16 // the packets sent: pkts[i] numbered seqs[i]
		chunks int      // chunks of PCM out
		stats  Stats
	}{
		{"in order", []uint16{10, 11, 12, 13}, 4, Stats{Packets: 4}},
		{"wraps", []uint16{65534, 65535, 0, 1}, 4, Stats{Packets: 4}},
		{"one lost", []uint16{10, 11, 13, 14}, 5, Stats{Packets: 4, Lost: 1, Concealed: 1}},
		{"gap across wrap", []uint16{65534, 1, 2}, 5, Stats{Packets: 3, Lost: 2, Concealed: 2}},
		{"long gap bounded", []uint16{10, 30, 31}, 3 + MaxConceal, Stats{Packets: 3, Lost: 19, Concealed: MaxConceal}},
		{"late and duplicate", []uint16{10, 12, 11, 12, 13}, 4, Stats{Packets: 3, Lost: 1, Concealed: 1, Late: 2}},
		{"restart behind", []uint16{5000, 5001, 7, 8}, 4, Stats{Packets: 4, Restarts: 1}},
		{"restart ahead", []uint16{10, 11, 20000, 20001}, 4, Stats{Packets: 4, Restarts: 1}},
		{"just below the jump", []uint16{10, 10 + MaxSeqJump - 1}, 2 + MaxConceal, Stats{Packets: 2, Lost: MaxSeqJump - 2, Concealed: MaxConceal}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dec, err := NewDecoder(1)
			if err != nil {
				t.Fatal(err)
			}
			defer dec.Close()
			chunks := 0
			for i, seq := range tc.seqs {
				out, err := dec.DecodeRTP(seq, pkts[i])
				if err != nil {
					t.Fatalf("packet %d (seq %d): %v", i, seq, err)
				}
				for _, a := range out {
					if len(a.PCM) != 960 {
						t.Errorf("packet %d: a chunk of %d samples, want 960 (concealment repeats the last length)", i, len(a.PCM))
					}
				}
				chunks += len(out)
			}
			if chunks != tc.chunks || dec.Stats() != tc.stats {
				t.Errorf("%d chunks, stats %+v; want %d, %+v", chunks, dec.Stats(), tc.chunks, tc.stats)
			}
		})
	}
}

// TestDecodeRTPCorrupt: a corrupt payload is an error and, after the
// first packet, a concealed frame in its place.
func TestDecodeRTPCorrupt(t *testing.T) {
	_, pkts := encodeTone(t, 1, 32000, 2)
	dec, err := NewDecoder(1)
	if err != nil {
		t.Fatal(err)
	}
	defer dec.Close()
	if out, err := dec.DecodeRTP(1, []byte{0x03, 0x00}); !errors.Is(err, ErrInvalidPacket) || len(out) != 0 {
		t.Fatalf("corrupt first packet: %d chunks, %v; want none and ErrInvalidPacket", len(out), err)
	}
	if out, err := dec.DecodeRTP(2, pkts[0]); err != nil || len(out) != 1 {
		t.Fatalf("packet after it: %d chunks, %v", len(out), err)
	}
	out, err := dec.DecodeRTP(3, []byte{0x03, 0x00})
	if !errors.Is(err, ErrInvalidPacket) || len(out) != 1 || len(out[0].PCM) != 960 {
		t.Fatalf("corrupt packet: %d chunks, %v; want one concealed 960-sample chunk and ErrInvalidPacket", len(out), err)
	}
	if s := dec.Stats(); s != (Stats{Packets: 1, Concealed: 1}) {
		t.Errorf("stats %+v", s)
	}
}

// TestConcealContinues checks concealment carries the tone on: a made-up
// frame after a loss has energy at the tone's frequency, not silence.
func TestConcealContinues(t *testing.T) {
	_, pkts := encodeTone(t, 1, 32000, 10)
	dec, err := NewDecoder(1)
	if err != nil {
		t.Fatal(err)
	}
	defer dec.Close()
	for i := range 9 {
		if _, err := dec.DecodeRTP(uint16(i), pkts[i]); err != nil {
			t.Fatal(err)
		}
	}
	out, err := dec.DecodeRTP(10, pkts[9]) // 9 lost
	if err != nil || len(out) != 2 {
		t.Fatalf("%d chunks, %v; want 2 (the concealed one, then the packet's)", len(out), err)
	}
	if r := rms(out[0].PCM, 1, 0); r < 1000 {
		t.Errorf("concealed frame RMS %.0f: want the tone carried on (> 1000; the tone's is 5657)", r)
	}
}

// FuzzDecode: arbitrary bytes, as packets and as RTP payloads, never
// crash and decode to well-formed chunks or errors.
func FuzzDecode(f *testing.F) {
	_, pkts := encodeTone(f, 2, 64000, 3)
	for _, p := range pkts {
		f.Add(p)
	}
	f.Add([]byte{0x03, 0x00})
	f.Add([]byte{0xff, 0xff, 0xff})
	f.Add([]byte{0xfc})
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, ch := range []int{1, 2} {
			dec, err := NewDecoder(ch)
			if err != nil {
				t.Fatal(err)
			}
			check := func(a *media.Audio) {
				if err := a.Valid(); err != nil || a.Channels != ch || len(a.PCM) > MaxFrameSamples*ch {
					t.Fatalf("chunk %d channels, %d samples: %v", a.Channels, len(a.PCM), err)
				}
			}
			if a, err := dec.Decode(data); err == nil {
				check(a)
			}
			// As a stream: the bytes split into packets with a gap.
			for i, seq := range []uint16{1, 3} {
				part := data[i*len(data)/2 : (i+1)*len(data)/2]
				out, _ := dec.DecodeRTP(seq, part)
				for _, a := range out {
					check(a)
				}
			}
			dec.Close()
		}
	})
}
