package rtsp

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/bluenviron/gortsplib/v4/pkg/format/rtph264"
	"github.com/bluenviron/gortsplib/v4/pkg/format/rtph265"
	"github.com/bluenviron/mediacommon/pkg/codecs/h264"
	"github.com/pion/rtp"
)

// Codec names as FeedConfig.Codec takes them.
const (
	H264 = "h264"
	H265 = "h265"
)

// nalDecoder is gortsplib's RTP depacketizer for one codec: packets in,
// an access unit (its NAL units) out when the marker bit ends it.
type nalDecoder interface {
	Decode(pkt *rtp.Packet) ([][]byte, error)
}

// accessUnit is what the depacketizer hands on: Annex-B, the RTP timestamp
// and whether it is a key frame (IDR for H.264, IRAP for H.265).
type accessUnit struct {
	data []byte
	ts   uint32
	key  bool
}

// depacketizer turns one connection's RTP packets into access units. It
// tracks sequence numbers itself (gortsplib reorders UDP and reports gaps,
// but its H.264 decoder would emit an access unit that lost a slice): after
// a gap it drops packets until the next marker bit and counts the access
// units that could not be whole. It starts at an access-unit boundary (the
// packet after the first marker) and hands on nothing before the first key
// frame. Key frames that do not carry their parameter sets get the latest
// ones (from the SDP's sprop parameters or seen in band) in front. Not safe
// for concurrent use.
type depacketizer struct {
	codec  string
	newDec func() (nalDecoder, error)
	dec    nalDecoder

	// params are the latest parameter sets by NAL type: H.264 SPS 7, PPS
	// 8; H.265 VPS 32, SPS 33, PPS 34.
	params map[int][]byte

	synced   bool   // the next packet starts an access unit
	started  bool   // synced at least once on this connection
	seqKnown bool   // nextSeq is set
	nextSeq  uint16 // the sequence number expected next
	partial  bool   // packets of the access unit at curTS were taken
	curTS    uint32

	lost     int // access units given up since the last take
	discards int // packets dropped that no loss explains (malformed)
}

// newDepacketizer builds the depacketizer for codec with the SDP's
// parameter sets (nil entries are skipped).
func newDepacketizer(codec string, params ...[]byte) (*depacketizer, error) {
	d := &depacketizer{codec: codec, params: map[int][]byte{}}
	switch codec {
	case H264:
		d.newDec = func() (nalDecoder, error) {
			dec := &rtph264.Decoder{PacketizationMode: 1}
			return dec, dec.Init()
		}
	case H265:
		d.newDec = func() (nalDecoder, error) {
			dec := &rtph265.Decoder{}
			return dec, dec.Init()
		}
	default:
		return nil, fmt.Errorf("codec %q: want %s or %s", codec, H264, H265)
	}
	for _, p := range params {
		if t, ok := d.paramType(p); ok && !malformedNAL(p) {
			d.params[t] = append([]byte(nil), p...)
		}
	}
	if err := d.reset(); err != nil {
		return nil, err
	}
	return d, nil
}

func (d *depacketizer) reset() error {
	dec, err := d.newDec()
	if err != nil {
		return err
	}
	d.dec = dec
	d.partial = false
	return nil
}

// nalType is the NAL unit type of n (-1 for an empty unit).
func (d *depacketizer) nalType(n []byte) int {
	if len(n) == 0 {
		return -1
	}
	if d.codec == H265 {
		return int(n[0]>>1) & 0x3f
	}
	return int(n[0] & 0x1f)
}

// paramType says whether n is a parameter set and which.
func (d *depacketizer) paramType(n []byte) (int, bool) {
	t := d.nalType(n)
	if d.codec == H265 {
		return t, t >= 32 && t <= 34
	}
	return t, t == 7 || t == 8
}

// isKey: H.264 IDR (type 5); H.265 IRAP (types 16..21: BLA, IDR, CRA).
func (d *depacketizer) isKey(t int) bool {
	if d.codec == H265 {
		return t >= 16 && t <= 21
	}
	return t == 5
}

// paramOrder is the order parameter sets go in front of a key frame.
func (d *depacketizer) paramOrder() []int {
	if d.codec == H265 {
		return []int{32, 33, 34}
	}
	return []int{7, 8}
}

// takeLost returns the access units given up since the last call.
func (d *depacketizer) takeLost() int {
	n := d.lost
	d.lost = 0
	return n
}

// packet takes one RTP packet, in arrival order after gortsplib's
// reordering; it returns an access unit when pkt completes one.
func (d *depacketizer) packet(pkt *rtp.Packet) (accessUnit, bool) {
	if d.seqKnown && pkt.SequenceNumber != d.nextSeq {
		d.gap(pkt)
	}
	d.seqKnown = true
	d.nextSeq = pkt.SequenceNumber + 1

	if !d.synced {
		// Drop until a marker bit: the packet after it starts an
		// access unit.
		if pkt.Marker {
			d.synced, d.started = true, true
			if err := d.reset(); err != nil {
				d.synced = false
			}
		}
		return accessUnit{}, false
	}
	nalus, err := d.dec.Decode(pkt)
	switch {
	case err == nil:
	case errors.Is(err, rtph264.ErrMorePacketsNeeded) || errors.Is(err, rtph265.ErrMorePacketsNeeded):
		d.partial, d.curTS = true, pkt.Timestamp
		return accessUnit{}, false
	default:
		// A malformed packet: this access unit cannot be whole.
		d.lost++
		d.discards++
		d.synced = pkt.Marker
		_ = d.reset()
		return accessUnit{}, false
	}
	d.partial = false
	return d.finish(nalus, pkt.Timestamp)
}

// gap handles packets lost before pkt: the access unit in progress and the
// one pkt belongs to cannot be whole (access units lost whole inside a gap
// cannot be told apart and are not counted).
func (d *depacketizer) gap(pkt *rtp.Packet) {
	if !d.started {
		return // not yet at a boundary: nothing was promised
	}
	if d.partial {
		d.lost++
	}
	if !d.partial || pkt.Timestamp != d.curTS {
		d.lost++
	}
	d.synced = false
	d.partial = false
}

// withParams puts the latest parameter sets (in-band ones are already
// the latest) in canonical order after the access unit delimiter and before
// everything else of a key frame, when any is missing from it.
func (d *depacketizer) withParams(nalus [][]byte, have map[int]bool) [][]byte {
	missing := false
	for _, t := range d.paramOrder() {
		if _, known := d.params[t]; known && !have[t] {
			missing = true
		}
	}
	if !missing {
		return nalus
	}
	aud := 9
	if d.codec == H265 {
		aud = 35
	}
	out := make([][]byte, 0, len(nalus)+len(d.params))
	rest := nalus
	for len(rest) > 0 && d.nalType(rest[0]) == aud {
		out = append(out, rest[0])
		rest = rest[1:]
	}
	for _, t := range d.paramOrder() {
		if p, ok := d.params[t]; ok {
			out = append(out, p)
		}
	}
	for _, n := range rest {
		if _, isParam := d.paramType(n); !isParam {
			out = append(out, n)
		}
	}
	return out
}

// finish turns a complete access unit into Annex-B.
func (d *depacketizer) finish(nalus [][]byte, ts uint32) (accessUnit, bool) {
	key := false
	have := map[int]bool{}
	kept := nalus[:0:0]
	for _, n := range nalus {
		if len(n) == 0 {
			continue
		}
		if malformedNAL(n) {
			// Annex-B cannot carry it: its start code would end it early.
			d.lost++
			return accessUnit{}, false
		}
		kept = append(kept, n)
		t := d.nalType(n)
		if d.isKey(t) {
			key = true
		}
		if pt, ok := d.paramType(n); ok {
			d.params[pt] = append([]byte(nil), n...)
			have[pt] = true
		}
	}
	if len(kept) == 0 {
		d.discards++
		return accessUnit{}, false
	}
	// Access units before the connection's first key frame are handed on
	// too (key false): the server skips them and counts them as
	// waiting_key, as it does a WHIP sender's.
	if key {
		kept = d.withParams(kept, have)
	}
	b, err := h264.AnnexBMarshal(kept) // start codes are the same for H.265
	if err != nil {
		d.lost++
		return accessUnit{}, false
	}
	return accessUnit{data: b, ts: ts, key: key}, true
}

// malformedNAL reports a NAL unit that Annex-B cannot carry: one holding
// 00 00 00, 00 00 01 or 00 00 02 (a coded NAL unit never does: emulation
// prevention puts 03 in front of such bytes) or ending in 00 (read as the
// next start code's).
func malformedNAL(n []byte) bool {
	if len(n) == 0 || n[len(n)-1] == 0 {
		return true
	}
	for i := 0; i+2 < len(n); {
		j := bytes.Index(n[i:], zeroZero)
		if j < 0 || i+j+2 >= len(n) {
			return false
		}
		if n[i+j+2] <= 2 {
			return true
		}
		i += j + 1
	}
	return false
}

var zeroZero = []byte{0, 0}
