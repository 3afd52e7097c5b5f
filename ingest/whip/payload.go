package whip

import (
	"errors"
	"fmt"

	"github.com/pion/rtp/codecs"
)

// vp8Format is VP8's RTP payload (RFC 7741): pion's depacketizer strips
// the payload descriptor; a frame begins at the partition head (S=1,
// PID=0), whose frame tag says whether it is a key frame.
type vp8Format struct{}

func (vp8Format) parse(payload []byte) ([]byte, bool, bool, bool) {
	var d codecs.VP8Packet
	data, err := d.Unmarshal(payload)
	if err != nil || len(data) == 0 {
		return nil, false, false, false
	}
	head := d.S == 1 && d.PID == 0
	return data, head, head && data[0]&1 == 0, true // frame tag: P bit 0 is a key frame
}

func (vp8Format) join(parts [][]byte) ([]byte, error) {
	n := 0
	for _, p := range parts {
		n += len(p)
	}
	out := make([]byte, 0, n)
	for _, p := range parts {
		out = append(out, p...)
	}
	return out, nil
}

// H.264 NAL unit types (RFC 6184, ITU-T H.264 table 7-1).
const (
	nalSlice = 1  // coded slice of a non-IDR picture
	nalIDR   = 5  // coded slice of an IDR picture: a key frame
	nalSEI   = 6  //
	nalSPS   = 7  //
	nalPPS   = 8  //
	nalAUD   = 9  // access unit delimiter
	nalSTAPA = 24 // single-time aggregation packet
	nalFUA   = 28 // fragmentation unit
)

var annexB = []byte{0, 0, 0, 1}

// h264Format is H.264's RTP payload in packetization mode 1 (RFC 6184):
// single NAL unit packets, STAP-A and FU-A; the interleaved mode's STAP-B,
// MTAP and FU-B are not negotiated and are discarded. Packets are kept
// whole; join makes the frame an Annex-B access unit (a start code before
// each NAL unit), which is what the decoder takes.
//
// H.264's payload does not mark a frame's first packet: one can begin a
// frame if its first NAL unit is an access unit delimiter, a parameter set,
// SEI, or a slice whose first_mb_in_slice is 0 (the first bit of the slice
// header, ue(v) 0 = "1"); the assembler takes the earliest such packet of
// the frame's timestamp as its head.
type h264Format struct{}

func (h264Format) parse(p []byte) ([]byte, bool, bool, bool) {
	if len(p) < 1 || p[0]&0x80 != 0 { // empty, or the forbidden bit set
		return nil, false, false, false
	}
	switch t := p[0] & 0x1f; {
	case t >= 1 && t <= 23:
		return p, beginsAU(p), t == nalIDR, true
	case t == nalSTAPA:
		var head, key, first = false, false, true
		err := eachAggregated(p, func(nal []byte) {
			if first {
				head, first = beginsAU(nal), false
			}
			key = key || nal[0]&0x1f == nalIDR
		})
		if err != nil {
			return nil, false, false, false
		}
		return p, head, key, true
	case t == nalFUA:
		if len(p) < 3 {
			return nil, false, false, false
		}
		inner := p[1] & 0x1f
		if inner == 0 || inner > 23 {
			return nil, false, false, false
		}
		head := p[1]&0x80 != 0 && beginsAU([]byte{p[0]&0xe0 | inner, p[2]})
		return p, head, inner == nalIDR, true
	default: // 0, STAP-B, MTAP16/24, FU-B, 30, 31
		return nil, false, false, false
	}
}

// beginsAU reports whether NAL unit nal can be the first of an access unit.
func beginsAU(nal []byte) bool {
	switch nal[0] & 0x1f {
	case nalAUD, nalSPS, nalPPS, nalSEI:
		return true
	case nalSlice, nalIDR:
		return len(nal) > 1 && nal[1]&0x80 != 0 // first_mb_in_slice == 0
	}
	return false
}

// eachAggregated calls f with each NAL unit of STAP-A packet p; an error
// for a malformed one (a size running past the end, an empty unit).
func eachAggregated(p []byte, f func(nal []byte)) error {
	rest := p[1:]
	n := 0
	for len(rest) > 0 {
		if len(rest) < 2 {
			return errors.New("STAP-A: a truncated size")
		}
		size := int(rest[0])<<8 | int(rest[1])
		rest = rest[2:]
		if size == 0 || size > len(rest) {
			return fmt.Errorf("STAP-A: unit %d of %d bytes, %d left", n, size, len(rest))
		}
		f(rest[:size])
		rest = rest[size:]
		n++
	}
	if n == 0 {
		return errors.New("STAP-A: no units")
	}
	return nil
}

func (h264Format) join(parts [][]byte) ([]byte, error) {
	n := 0
	for _, p := range parts {
		n += len(p) + 2*len(annexB)
	}
	out := make([]byte, 0, n)
	inFU := false
	for i, p := range parts {
		switch t := p[0] & 0x1f; {
		case t == nalSTAPA:
			if inFU {
				return nil, fmt.Errorf("packet %d: STAP-A inside a fragmented unit", i)
			}
			_ = eachAggregated(p, func(nal []byte) { // parse checked it
				out = append(append(out, annexB...), nal...)
			})
		case t == nalFUA:
			start, end := p[1]&0x80 != 0, p[1]&0x40 != 0
			switch {
			case start && inFU:
				return nil, fmt.Errorf("packet %d: a fragmented unit starts before the last one ended", i)
			case start:
				out = append(append(out, annexB...), p[0]&0xe0|p[1]&0x1f)
			case !inFU:
				return nil, fmt.Errorf("packet %d: a fragment without its start", i)
			}
			out = append(out, p[2:]...)
			inFU = !end
		default:
			if inFU {
				return nil, fmt.Errorf("packet %d: NAL unit inside a fragmented unit", i)
			}
			out = append(append(out, annexB...), p...)
		}
	}
	if inFU {
		return nil, errors.New("the frame ends inside a fragmented unit")
	}
	return out, nil
}
