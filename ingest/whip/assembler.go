package whip

import (
	"slices"

	"github.com/pion/rtp"
	"github.com/pion/rtp/codecs"
)

// Limits of the frame assembler: what a sender can make the server hold.
const (
	maxPending     = 8       // frames being assembled at once
	maxFramePkts   = 4096    // packets of one frame
	maxFrameBytes  = 8 << 20 // bytes of one frame
	maxRTPPacket   = 1500    // bytes of one RTP packet off the wire
	vp8ClockRate   = 90000
	rtpTimeWindowS = 30 // a timestamp further than this from the last frame's restarts the stream
)

// vp8Frame is one assembled VP8 frame.
type vp8Frame struct {
	Data []byte
	TS   uint32 // RTP timestamp
	Key  bool
}

// assembler builds VP8 frames from RTP packets (RFC 7741). pion's VP8
// depacketizer parses each payload descriptor; frames are assembled here,
// not with pion's samplebuilder, because samplebuilder releases a frame only
// when the first packet of the next frame arrives: one frame interval (33 ms
// at 30 fps) of latency on every frame. A frame is released as soon as its
// packets from the partition head (S=1, PID=0) to the marker bit are all in.
// Reordered packets are put back in sequence order; a frame still incomplete
// when a newer one completes is given up (counted in lost): frames are only
// released in order.
type assembler struct {
	pending []*partial
	last    uint32 // timestamp of the last released frame
	started bool
	tail    uint16 // sequence number of the last released frame's last packet
	hasTail bool
	counted bool // a loss before the next released frame is already counted
	lost    int  // frames given up (incomplete when a newer one completed, or over a limit)
}

type partial struct {
	ts      uint32
	pkts    map[uint16][]byte // sequence number -> VP8 payload (descriptor stripped)
	bytes   int
	head    uint16
	hasHead bool
	key     bool
	tail    uint16
	hasTail bool
}

// push adds one packet; it returns the frames it completed, oldest first.
func (a *assembler) push(p *rtp.Packet) []vp8Frame {
	var d codecs.VP8Packet
	payload, err := d.Unmarshal(p.Payload)
	if err != nil || len(payload) == 0 {
		return nil // not VP8: ignored
	}
	if a.started && !newer(p.Timestamp, a.last) {
		if ahead(a.last, p.Timestamp) > rtpTimeWindowS*vp8ClockRate {
			// A jump far back: the sender restarted its timeline.
			a.reset()
		} else {
			return nil // a packet of a frame already released or given up
		}
	}
	fr := a.find(p.Timestamp)
	if fr == nil {
		fr = &partial{ts: p.Timestamp, pkts: map[uint16][]byte{}}
		a.pending = append(a.pending, fr)
		slices.SortFunc(a.pending, func(x, y *partial) int {
			if x.ts == y.ts {
				return 0
			}
			if newer(y.ts, x.ts) {
				return -1
			}
			return 1
		})
		for len(a.pending) > maxPending {
			a.giveUp(a.pending[0])
		}
		if a.find(p.Timestamp) == nil {
			return nil // the new frame was itself the oldest
		}
	}
	if _, dup := fr.pkts[p.SequenceNumber]; dup {
		return nil
	}
	if len(fr.pkts) >= maxFramePkts || fr.bytes+len(payload) > maxFrameBytes {
		a.giveUp(fr)
		return nil
	}
	fr.pkts[p.SequenceNumber] = slices.Clone(payload)
	fr.bytes += len(payload)
	if d.S == 1 && d.PID == 0 {
		fr.head, fr.hasHead = p.SequenceNumber, true
		fr.key = payload[0]&1 == 0 // VP8 frame tag: P bit 0 is a key frame
	}
	if p.Marker {
		fr.tail, fr.hasTail = p.SequenceNumber, true
	}
	return a.release()
}

// release hands out the newest complete frame and every complete frame
// before it; incomplete frames older than it are given up.
func (a *assembler) release() []vp8Frame {
	newest := -1
	for i, fr := range a.pending {
		if fr.complete() {
			newest = i
		}
	}
	if newest < 0 {
		return nil
	}
	var out []vp8Frame
	for _, fr := range a.pending[:newest+1] {
		if !fr.complete() {
			a.lost++
			a.counted = true
			continue
		}
		if a.hasTail && fr.head != a.tail+1 && !a.counted {
			// Packets between the last released frame and this one are
			// missing: a whole frame (or more) never arrived.
			a.lost++
		}
		a.tail, a.hasTail, a.counted = fr.tail, true, false
		data := make([]byte, 0, fr.bytes)
		for s := fr.head; ; s++ {
			data = append(data, fr.pkts[s]...)
			if s == fr.tail {
				break
			}
		}
		out = append(out, vp8Frame{Data: data, TS: fr.ts, Key: fr.key})
	}
	a.last, a.started = a.pending[newest].ts, true
	a.pending = slices.Delete(a.pending, 0, newest+1)
	return out
}

func (fr *partial) complete() bool {
	if !fr.hasHead || !fr.hasTail {
		return false
	}
	n := int(fr.tail-fr.head) + 1 // uint16 arithmetic: wraps
	if n != len(fr.pkts) {
		return false
	}
	for s := fr.head; ; s++ {
		if _, ok := fr.pkts[s]; !ok {
			return false
		}
		if s == fr.tail {
			return true
		}
	}
}

func (a *assembler) find(ts uint32) *partial {
	for _, fr := range a.pending {
		if fr.ts == ts {
			return fr
		}
	}
	return nil
}

func (a *assembler) giveUp(fr *partial) {
	a.lost++
	a.counted = true
	a.pending = slices.DeleteFunc(a.pending, func(x *partial) bool { return x == fr })
	if !a.started || newer(fr.ts, a.last) {
		a.last, a.started = fr.ts, true
	}
}

func (a *assembler) reset() {
	a.lost += len(a.pending)
	a.pending = nil
	a.started, a.hasTail = false, false
}

// newer reports whether RTP timestamp x is after y (RFC 3550 wrap-around).
func newer(x, y uint32) bool { return x != y && x-y < 1<<31 }

// ahead is how far x is after y, in clock ticks, modulo wrap.
func ahead(x, y uint32) uint32 { return x - y }
