package audiofile

import (
	"bytes"
	"encoding/binary"
	"math"
	"strings"
	"testing"

	"github.com/mdag/mdag/media"
)

// sine is n samples per channel of a 440 Hz sine at rate, interleaved.
func sine(rate, channels, n int) *media.Audio {
	a := &media.Audio{Rate: rate, Channels: channels, PCM: make([]int16, n*channels)}
	for i := range n {
		for c := range channels {
			a.PCM[i*channels+c] = int16(8000 * math.Sin(2*math.Pi*440*float64(i)/float64(rate)) / float64(c+1))
		}
	}
	return a
}

func wavBytes(t testing.TB, a *media.Audio) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := WriteWAV(&b, a); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func TestWAVRoundTrip(t *testing.T) {
	for _, tc := range []struct{ rate, channels int }{{48000, 1}, {16000, 2}, {8000, 1}, {44100, 2}} {
		a := sine(tc.rate, tc.channels, 1000)
		got, err := ReadWAV(bytes.NewReader(wavBytes(t, a)))
		if err != nil {
			t.Fatal(err)
		}
		if got.Rate != a.Rate || got.Channels != a.Channels || !slicesEqual(got.PCM, a.PCM) {
			t.Errorf("%d Hz %d ch: read %d Hz %d ch %d samples", tc.rate, tc.channels, got.Rate, got.Channels, len(got.PCM))
		}
	}
}

func slicesEqual(a, b []int16) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestWAVErrors: every malformed or unsupported file is an error naming
// what is wrong.
func TestWAVErrors(t *testing.T) {
	good := wavBytes(t, sine(16000, 1, 100))
	mod := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), good...)) }
	for _, tc := range []struct {
		name string
		file []byte
		want string
	}{
		{"empty", nil, "not a RIFF WAVE"},
		{"not riff", mod(func(b []byte) []byte { copy(b, "RIFX"); return b }), "not a RIFF WAVE"},
		{"float", mod(func(b []byte) []byte { binary.LittleEndian.PutUint16(b[20:], 3); return b }), "format tag 0x0003"},
		{"8 bit", mod(func(b []byte) []byte { binary.LittleEndian.PutUint16(b[34:], 8); return b }), "8-bit samples"},
		{"3 channels", mod(func(b []byte) []byte { binary.LittleEndian.PutUint16(b[22:], 3); return b }), "3 channels"},
		{"rate", mod(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[24:], 100); return b }), "sample rate 100"},
		{"align", mod(func(b []byte) []byte { binary.LittleEndian.PutUint16(b[32:], 4); return b }), "block align 4"},
		{"fmt cut", good[:30], `chunk "fmt "`},
		{"no data", good[:36], "no data chunk"},
		{"empty data", mod(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[40:], 0); return b[:44] }), "no samples"},
		{"data before fmt", append(append([]byte("RIFF\x00\x00\x00\x00WAVE"), good[36:]...), good[12:36]...), "before the fmt chunk"},
		{"short fmt", mod(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[16:], 8); return b }), "fmt chunk of 8 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ReadWAV(bytes.NewReader(tc.file))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("ReadWAV = %v, want an error saying %q", err, tc.want)
			}
		})
	}
	// A data chunk cut short (a recording that stopped) gives what is there.
	cut := good[:44+50]
	if a, err := ReadWAV(bytes.NewReader(cut)); err != nil || len(a.PCM) != 25 {
		t.Errorf("cut data: %v, %d samples; want 25", err, len(a.PCM))
	}
}

// TestResample: lengths scale with the rate, a tone keeps its frequency
// and level, the same rate is the same audio.
func TestResample(t *testing.T) {
	for _, tc := range []struct{ from, channels int }{{8000, 1}, {16000, 2}, {44100, 1}, {96000, 2}} {
		a := sine(tc.from, tc.channels, tc.from/2) // 0.5 s
		o, err := Resample(a, 48000)
		if err != nil {
			t.Fatal(err)
		}
		if n := len(o.PCM) / tc.channels; n != 24000 || o.Rate != 48000 || o.Channels != tc.channels {
			t.Fatalf("%d Hz: %d samples at %d Hz, want 24000 at 48000", tc.from, n, o.Rate)
		}
		// Compare with the sine computed at 48 kHz.
		want := sine(48000, tc.channels, 24000)
		var maxErr float64
		// The last input sample has no successor: the outputs after it
		// repeat it (skipped here).
		tail := (48000/tc.from + 1) * tc.channels
		for i := range o.PCM[:len(o.PCM)-tail] {
			maxErr = max(maxErr, math.Abs(float64(o.PCM[i])-float64(want.PCM[i])))
		}
		// Linear interpolation of a 440 Hz sine sampled at 8 kHz is off by
		// at most A(1-cos(pi f/fs)) ~ 120 of 8000.
		if maxErr > 150 {
			t.Errorf("%d Hz -> 48 kHz: largest error %.0f of 8000", tc.from, maxErr)
		}
	}
	a := sine(48000, 1, 10)
	if o, err := Resample(a, 48000); err != nil || o != a {
		t.Errorf("same rate: %v", err)
	}
	if _, err := Resample(a, 0); err == nil {
		t.Error("rate 0 accepted")
	}
}

// opusPacket is a made-up Opus packet with TOC config cfg and code c
// (PacketSamples reads only the TOC and the frame count).
func opusPacket(cfg, code byte, extra ...byte) []byte {
	return append([]byte{cfg<<3 | code}, extra...)
}

func TestPacketSamples(t *testing.T) {
	for _, tc := range []struct {
		name string
		p    []byte
		want int // 0: an error
	}{
		{"silk 10 ms", opusPacket(0, 0), 480},
		{"silk 60 ms", opusPacket(3, 0), 2880},
		{"hybrid 20 ms", opusPacket(13, 0), 960},
		{"celt 2.5 ms", opusPacket(16, 0), 120},
		{"celt 20 ms two frames", opusPacket(31, 1), 1920},
		{"code 2", opusPacket(31, 2), 1920},
		{"code 3 six 20 ms", opusPacket(31, 3, 6), 5760},
		{"code 3 too long", opusPacket(31, 3, 7), 0},
		{"code 3 no count", opusPacket(31, 3), 0},
		{"code 3 zero", opusPacket(31, 3, 0), 0},
		{"empty", nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, err := PacketSamples(tc.p)
			if n != tc.want || (err == nil) != (tc.want > 0) {
				t.Fatalf("PacketSamples = %d, %v; want %d", n, err, tc.want)
			}
		})
	}
}

func oggBytes(t testing.TB, channels int, packets [][]byte) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := WriteOggOpus(&b, channels, 312, packets); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func TestOggRoundTrip(t *testing.T) {
	big := append(opusPacket(31, 0), bytes.Repeat([]byte{7}, 600)...) // crosses 255-byte lacing
	packets := [][]byte{opusPacket(31, 0, 1, 2, 3), big, opusPacket(16, 1, 9, 9)}
	o, err := ReadOggOpus(bytes.NewReader(oggBytes(t, 2, packets)))
	if err != nil {
		t.Fatal(err)
	}
	if o.Channels != 2 || o.PreSkip != 312 || o.InputRate != 48000 || len(o.Packets) != 3 || !bytes.Equal(o.Packets[1], big) {
		t.Errorf("read %+v", o)
	}
	// A packet continued across pages: split the big packet's page by hand.
	var b bytes.Buffer
	head := oggBytes(t, 1, [][]byte{opusPacket(31, 0)})
	// keep the first two pages (the headers) of that file
	n := 0
	for p := 0; p < 2; p++ {
		nseg := int(head[n+26])
		size := 27 + nseg
		for _, l := range head[n+27 : n+27+nseg] {
			size += int(l)
		}
		n += size
	}
	b.Write(head[:n])
	long := append(opusPacket(31, 0), bytes.Repeat([]byte{5}, 300)...)
	// page 2: the first 255 bytes (open), page 3: the rest (continued, EOS)
	if err := writeRawPage(&b, 0, 2, long[:255], []byte{255}); err != nil {
		t.Fatal(err)
	}
	if err := writeRawPage(&b, oggContinued|oggEOS, 3, long[255:], []byte{byte(len(long) - 255)}); err != nil {
		t.Fatal(err)
	}
	o, err = ReadOggOpus(bytes.NewReader(b.Bytes()))
	if err != nil || len(o.Packets) != 1 || !bytes.Equal(o.Packets[0], long) {
		t.Fatalf("continued packet: %v %+v", err, o)
	}
}

// writeRawPage writes a page with the given flags, sequence number, body
// and lacing values (serial as WriteOggOpus's).
func writeRawPage(b *bytes.Buffer, flags byte, seq uint32, body, lacing []byte) error {
	pg := make([]byte, 27)
	copy(pg, "OggS")
	pg[5] = flags
	binary.LittleEndian.PutUint32(pg[14:], 0x6d646167)
	binary.LittleEndian.PutUint32(pg[18:], seq)
	pg[26] = byte(len(lacing))
	pg = append(append(pg, lacing...), body...)
	binary.LittleEndian.PutUint32(pg[22:], oggChecksum(pg))
	_, err := b.Write(pg)
	return err
}

// TestOggErrors: damaged, missing, multiplexed and foreign pages and
// headers are errors naming what is wrong.
func TestOggErrors(t *testing.T) {
	good := oggBytes(t, 1, [][]byte{opusPacket(31, 0, 1), opusPacket(31, 0, 2)})
	mod := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), good...)) }
	// pages of good: head (19 B), tags (20 B), two audio pages
	page2 := 27 + 1 + 19 + 27 + 1 + 20
	for _, tc := range []struct {
		name string
		file []byte
		want string
	}{
		{"empty", nil, "no packets"},
		{"not ogg", []byte("RIFF0000WAVEfmt 0000000000000000000000"), "no OggS"},
		{"short", good[:20], "a page header is 27"},
		{"checksum", mod(func(b []byte) []byte { b[40] ^= 1; return b }), "checksum"},
		{"version", mod(func(b []byte) []byte { b[4] = 1; return b }), "version 1"},
		{"cut", good[:len(good)-1], "the file ends"},
		{"missing page", append(append([]byte(nil), good[:page2]...), good[page2+27+1+2:]...), "page sequence number 3 after 1"},
		{"not opus", rewritePacket(t, good, 0, []byte("FLAC")), "not an OpusHead"},
		{"no tags", rewritePacket(t, good, 1, []byte("OpusTagz")), "not an OpusTags"},
		{"3 channels", rewritePacket(t, good, 0, func() []byte {
			h := []byte("OpusHead\x01\x03\x00\x00\x80\xbb\x00\x00\x00\x00\x00")
			return h
		}()), "3 channels"},
		{"bad audio packet", rewritePacket(t, good, 2, opusPacket(31, 3, 0)), "0 frames"},
		{"second stream", append(append([]byte(nil), good...), good...), "after the end-of-stream page"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ReadOggOpus(bytes.NewReader(tc.file))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("ReadOggOpus = %v, want an error saying %q", err, tc.want)
			}
		})
	}
}

// rewritePacket returns file with page i's packet replaced by p (the page
// rebuilt with its flags and a fresh checksum).
func rewritePacket(t *testing.T, file []byte, i int, p []byte) []byte {
	t.Helper()
	var out bytes.Buffer
	for page, off := 0, 0; off < len(file); page++ {
		nseg := int(file[off+26])
		size := 27 + nseg
		for _, l := range file[off+27 : off+27+nseg] {
			size += int(l)
		}
		if page == i {
			if err := writePage(&out, file[off+5], binary.LittleEndian.Uint64(file[off+6:]), 0x6d646167, uint32(page), p); err != nil {
				t.Fatal(err)
			}
		} else {
			out.Write(file[off : off+size])
		}
		off += size
	}
	return out.Bytes()
}

// FuzzOgg: arbitrary bytes never crash the Ogg reader, and what it
// accepts is well formed.
func FuzzOgg(f *testing.F) {
	f.Add(oggBytes(f, 1, [][]byte{opusPacket(31, 0, 1), opusPacket(16, 3, 2, 0)}))
	f.Add(oggBytes(f, 2, [][]byte{append(opusPacket(31, 0), bytes.Repeat([]byte{1}, 300)...)}))
	f.Add([]byte("OggS"))
	f.Fuzz(func(t *testing.T, data []byte) {
		o, err := ReadOggOpus(bytes.NewReader(data))
		if err != nil {
			return
		}
		if o.Channels < 1 || o.Channels > 2 || len(o.Packets) == 0 {
			t.Fatalf("accepted %+v", o)
		}
		for _, p := range o.Packets {
			if n, err := PacketSamples(p); err != nil || n <= 0 {
				t.Fatalf("accepted packet %x: %d, %v", p, n, err)
			}
		}
	})
}

// FuzzWAV: arbitrary bytes never crash the WAV reader, and what it
// accepts is valid audio.
func FuzzWAV(f *testing.F) {
	f.Add(wavBytes(f, sine(16000, 2, 50)))
	f.Add([]byte("RIFF\x00\x00\x00\x00WAVE"))
	f.Fuzz(func(t *testing.T, data []byte) {
		a, err := ReadWAV(bytes.NewReader(data))
		if err != nil {
			return
		}
		if err := a.Valid(); err != nil || len(a.PCM) == 0 {
			t.Fatalf("accepted %d samples: %v", len(a.PCM), err)
		}
		if o, err := Resample(a, 48000); err != nil || o.Valid() != nil {
			t.Fatalf("resample: %v", err)
		}
	})
}

// TestOggPacketCap: a file of more audio packets than MaxOggPackets (tiny
// ones: each would be its own allocation) is refused, saying why.
func TestOggPacketCap(t *testing.T) {
	packets := make([][]byte, MaxOggPackets+1)
	for i := range packets {
		packets[i] = opusPacket(16, 0) // 2.5 ms, one byte
	}
	_, err := ReadOggOpus(bytes.NewReader(oggBytes(t, 1, packets)))
	if err == nil || !strings.Contains(err.Error(), "audio packets") {
		t.Fatalf("got %v, want the packet cap", err)
	}
	if _, err := ReadOggOpus(bytes.NewReader(oggBytes(t, 1, packets[:MaxOggPackets]))); err != nil {
		t.Fatalf("at the cap: %v", err)
	}
}
