package audiofile

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"
)

// OggOpus is an Ogg Opus file (RFC 7845): its identification header and
// its audio packets, as they are.
type OggOpus struct {
	Channels  int    // 1 or 2 (the Publisher sends them as they are)
	PreSkip   int    // samples at 48 kHz to drop from the decoded start
	InputRate uint32 // the original rate (information only; Opus runs at 48 kHz)
	Packets   [][]byte
}

// MaxOggPacket bounds a packet reassembled from Ogg pages (an Opus packet
// is at most a few kB; RFC 7845's comment header may be larger, but not
// this).
const MaxOggPacket = 1 << 20

// oggCRC is the Ogg CRC-32 table (polynomial 0x04c11db7, no reflection,
// initial value 0, no final xor; RFC 3533 6).
var oggCRC = func() (t [256]uint32) {
	for i := range t {
		r := uint32(i) << 24
		for range 8 {
			if r&0x80000000 != 0 {
				r = r<<1 ^ 0x04c11db7
			} else {
				r <<= 1
			}
		}
		t[i] = r
	}
	return t
}()

func oggChecksum(b []byte) uint32 {
	var c uint32
	for _, x := range b {
		c = c<<8 ^ oggCRC[byte(c>>24)^x]
	}
	return c
}

// Page header flags (RFC 3533 6).
const (
	oggContinued = 1
	oggBOS       = 2
	oggEOS       = 4
)

// ReadOggOpus reads an Ogg file of one Opus stream: pages checked (capture
// pattern, version 0, checksum, page sequence, one serial number: a
// multiplexed or chained file is refused), packets reassembled across
// pages, the OpusHead (version 1, 1 or 2 channels, mapping family 0 or 1)
// and OpusTags headers checked, each audio packet's TOC read
// (PacketSamples). Errors name the page and byte.
func ReadOggOpus(r io.Reader) (*OggOpus, error) {
	b, err := readAll(r, "Ogg")
	if err != nil {
		return nil, err
	}
	var (
		out     OggOpus
		serial  uint32
		seq     uint32
		pending []byte // a packet continued on the next page
		open    bool   // pending is a packet still being reassembled
		npkt    int
		eos     bool
	)
	for page, off := 0, 0; off < len(b); page++ {
		if eos {
			return nil, fmt.Errorf("Ogg: page %d at byte %d after the end-of-stream page (chained or multiplexed streams are not read)", page, off)
		}
		if len(b)-off < 27 {
			return nil, fmt.Errorf("Ogg: page %d at byte %d: %d bytes left, a page header is 27", page, off, len(b)-off)
		}
		h := b[off:]
		if string(h[:4]) != "OggS" {
			return nil, fmt.Errorf("Ogg: page %d at byte %d: no OggS capture pattern", page, off)
		}
		if h[4] != 0 {
			return nil, fmt.Errorf("Ogg: page %d: stream structure version %d, want 0", page, h[4])
		}
		flags := h[5]
		if flags&^(oggContinued|oggBOS|oggEOS) != 0 {
			return nil, fmt.Errorf("Ogg: page %d: unknown header flags 0x%02x", page, flags)
		}
		ser, pseq, sum := binary.LittleEndian.Uint32(h[14:]), binary.LittleEndian.Uint32(h[18:]), binary.LittleEndian.Uint32(h[22:])
		nseg := int(h[26])
		if len(h) < 27+nseg {
			return nil, fmt.Errorf("Ogg: page %d: segment table of %d entries cut short", page, nseg)
		}
		lacing := h[27 : 27+nseg]
		size := 27 + nseg
		for _, l := range lacing {
			size += int(l)
		}
		if len(h) < size {
			return nil, fmt.Errorf("Ogg: page %d at byte %d: %d bytes, the file ends after %d", page, off, size, len(h))
		}
		pg := append([]byte(nil), h[:size]...)
		binary.LittleEndian.PutUint32(pg[22:], 0)
		if c := oggChecksum(pg); c != sum {
			return nil, fmt.Errorf("Ogg: page %d at byte %d: checksum 0x%08x, the page's is 0x%08x (damaged)", page, off, sum, c)
		}
		switch {
		case page == 0 && flags&oggBOS == 0:
			return nil, errors.New("Ogg: the first page is not a beginning-of-stream page")
		case page > 0 && flags&oggBOS != 0:
			return nil, fmt.Errorf("Ogg: page %d begins another stream (multiplexed or chained Ogg is not read)", page)
		case page > 0 && ser != serial:
			return nil, fmt.Errorf("Ogg: page %d: serial number %d, the stream's is %d (multiplexed Ogg is not read)", page, ser, serial)
		case page > 0 && pseq != seq+1:
			return nil, fmt.Errorf("Ogg: page %d: page sequence number %d after %d (a page is missing)", page, pseq, seq)
		case flags&oggContinued != 0 && !open:
			return nil, fmt.Errorf("Ogg: page %d continues a packet but none is open", page)
		case flags&oggContinued == 0 && open:
			return nil, fmt.Errorf("Ogg: page %d does not continue the packet the page before left open", page)
		}
		serial, seq, eos = ser, pseq, flags&oggEOS != 0
		body := h[27+nseg : size]
		for _, l := range lacing {
			pending = append(pending, body[:l]...)
			body = body[l:]
			if len(pending) > MaxOggPacket {
				return nil, fmt.Errorf("Ogg: page %d: a packet above %d bytes", page, MaxOggPacket)
			}
			if l == 255 {
				open = true
				continue
			}
			if err := out.packet(npkt, page, pending); err != nil {
				return nil, err
			}
			npkt++
			pending, open = nil, false
		}
		off += size
	}
	switch {
	case open:
		return nil, errors.New("Ogg: the file ends inside a packet")
	case npkt == 0:
		return nil, errors.New("Ogg: no packets")
	case npkt < 2:
		return nil, errors.New("Ogg: no OpusTags header")
	case len(out.Packets) == 0:
		return nil, errors.New("Ogg: no audio packets")
	}
	return &out, nil
}

// packet takes packet n (found on page): the two headers, then audio.
func (o *OggOpus) packet(n, page int, p []byte) error {
	switch n {
	case 0:
		if len(p) < 19 || string(p[:8]) != "OpusHead" {
			return fmt.Errorf("Ogg: the first packet is not an OpusHead header (not an Ogg Opus file)")
		}
		if v := p[8]; v>>4 != 0 {
			return fmt.Errorf("Ogg: OpusHead version %d: want 1 (major 0)", v)
		}
		o.Channels = int(p[9])
		o.PreSkip = int(binary.LittleEndian.Uint16(p[10:]))
		o.InputRate = binary.LittleEndian.Uint32(p[12:])
		family := p[18]
		switch {
		case o.Channels != 1 && o.Channels != 2:
			return fmt.Errorf("Ogg: OpusHead: %d channels, want 1 or 2", o.Channels)
		case family > 1:
			return fmt.Errorf("Ogg: OpusHead: channel mapping family %d, want 0 or 1 (mono or stereo)", family)
		case family == 1 && (len(p) < 21+o.Channels || int(p[19]) != 1):
			return fmt.Errorf("Ogg: OpusHead: a mapping family 1 table of more than one stream (%d bytes)", len(p))
		}
		return nil
	case 1:
		if len(p) < 8 || string(p[:8]) != "OpusTags" {
			return fmt.Errorf("Ogg: page %d: the second packet is not an OpusTags header", page)
		}
		return nil
	}
	if _, err := PacketSamples(p); err != nil {
		return fmt.Errorf("Ogg: page %d, audio packet %d: %w", page, n-2, err)
	}
	if len(o.Packets) >= MaxOggPackets {
		return fmt.Errorf("Ogg: page %d: more than %d audio packets (%v of audio at 20 ms a packet): a longer file is not read", page, MaxOggPackets, time.Duration(MaxOggPackets)*20*time.Millisecond)
	}
	o.Packets = append(o.Packets, p)
	return nil
}

// MaxOggPackets bounds the audio packets read from one Ogg Opus file: 2^18
// (87 minutes at 20 ms a packet). Tiny packets could otherwise make a file
// within MaxBytes hold millions, each its own allocation.
const MaxOggPackets = 1 << 18

// PacketSamples is the length of an Opus packet at 48 kHz, per channel,
// from its TOC byte and frame count (RFC 6716 3.1, 3.2.5): frames of 2.5 to
// 60 ms, at most 120 ms a packet.
func PacketSamples(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, errors.New("empty Opus packet")
	}
	toc := p[0]
	cfg := int(toc >> 3)
	var frame int // samples per frame at 48 kHz
	switch {
	case cfg < 12: // SILK: 10, 20, 40, 60 ms
		frame = []int{480, 960, 1920, 2880}[cfg%4]
	case cfg < 16: // hybrid: 10, 20 ms
		frame = []int{480, 960}[cfg%2]
	default: // CELT: 2.5, 5, 10, 20 ms
		frame = []int{120, 240, 480, 960}[cfg%4]
	}
	var frames int
	switch toc & 3 {
	case 0:
		frames = 1
	case 1, 2:
		frames = 2
	case 3:
		if len(p) < 2 {
			return 0, errors.New("Opus packet of code 3 without its frame count byte")
		}
		frames = int(p[1] & 0x3f)
		if frames == 0 {
			return 0, errors.New("Opus packet of code 3 with 0 frames")
		}
	}
	if n := frames * frame; n <= 5760 {
		return n, nil
	}
	return 0, fmt.Errorf("Opus packet of %d frames of %d samples: above 120 ms", frames, frame)
}

// WriteOggOpus writes an Ogg Opus file of packets (each one page; for
// tests and tools): the headers for channels and preSkip, granule
// positions from PacketSamples.
func WriteOggOpus(w io.Writer, channels, preSkip int, packets [][]byte) error {
	head := make([]byte, 19)
	copy(head, "OpusHead")
	head[8], head[9] = 1, byte(channels)
	binary.LittleEndian.PutUint16(head[10:], uint16(preSkip))
	binary.LittleEndian.PutUint32(head[12:], 48000)
	tags := append([]byte("OpusTags"), 4, 0, 0, 0, 'm', 'd', 'a', 'g', 0, 0, 0, 0)
	var granule uint64
	all := append([][]byte{head, tags}, packets...)
	for i, p := range all {
		if i >= 2 {
			n, err := PacketSamples(p)
			if err != nil {
				return fmt.Errorf("packet %d: %w", i-2, err)
			}
			granule += uint64(n)
		}
		var flags byte
		switch {
		case i == 0:
			flags = oggBOS
		case i == len(all)-1:
			flags = oggEOS
		}
		if err := writePage(w, flags, granule, 0x6d646167, uint32(i), p); err != nil {
			return err
		}
	}
	return nil
}

// writePage writes one page holding packet p whole (at most 255*255-1
// bytes).
func writePage(w io.Writer, flags byte, granule uint64, serial, seq uint32, p []byte) error {
	var lacing []byte
	n := len(p)
	for ; n >= 255; n -= 255 {
		lacing = append(lacing, 255)
	}
	lacing = append(lacing, byte(n))
	if len(lacing) > 255 {
		return fmt.Errorf("packet of %d bytes does not fit one page", len(p))
	}
	pg := make([]byte, 27, 27+len(lacing)+len(p))
	copy(pg, "OggS")
	pg[5] = flags
	binary.LittleEndian.PutUint64(pg[6:], granule)
	binary.LittleEndian.PutUint32(pg[14:], serial)
	binary.LittleEndian.PutUint32(pg[18:], seq)
	pg[26] = byte(len(lacing))
	pg = append(append(pg, lacing...), p...)
	binary.LittleEndian.PutUint32(pg[22:], oggChecksum(pg))
	_, err := w.Write(pg)
	return err
}
