package whip

import (
	"slices"

	"github.com/pion/rtp"
)

// Limits of the frame assembler: what a sender can make the server hold.
const (
	maxPending     = 8       // frames being assembled at once
	maxFramePkts   = 4096    // packets of one frame
	maxFrameBytes  = 8 << 20 // bytes of one frame
	maxRTPPacket   = 1500    // bytes of one RTP packet off the wire
	videoClockRate = 90000
	rtpTimeWindowS = 30 // a timestamp further back than this from the last frame's starts a new timeline at once
	staleRun       = 8  // stale frames in a row (no packet accepted between) that start a new timeline
)

// codedFrame is one assembled frame: VP8 as the decoder takes it, H.264 as
// an Annex-B access unit.
type codedFrame struct {
	Data []byte
	TS   uint32 // RTP timestamp
	Key  bool
}

// A payloadFormat is what the assembler knows of a codec's RTP payload:
// vp8Format (RFC 7741), h264Format (RFC 6184).
type payloadFormat interface {
	// parse checks one packet's payload: the bytes to keep, whether the
	// packet can begin a frame, whether it carries a key frame; ok false
	// for a payload that is not of the codec (discarded).
	parse(payload []byte) (data []byte, head, key, ok bool)
	// join builds a frame from its packets' kept bytes in sequence
	// order; an error for packets that do not make a frame (a fragment
	// without its start): the frame is lost.
	join(parts [][]byte) ([]byte, error)
}

// assembler builds frames from RTP packets; its payloadFormat parses the
// codec's payload (nil: VP8). Frames are assembled here,
// not with pion's samplebuilder, because samplebuilder releases a frame only
// when the first packet of the next frame arrives: one frame interval (33 ms
// at 30 fps) of latency on every frame. A frame is released as soon as its
// packets from the partition head (S=1, PID=0) to the marker bit are all in.
// Reordered packets are put back in sequence order; a frame still incomplete
// when a newer one completes is given up (counted in lost): frames are only
// released in order.
//
// A packet whose timestamp is not after the last released frame's is
// stale: a late or retransmitted packet of a frame already released or
// given up, discarded and counted. Unless the sender's timeline went back
// (an encoder or clock restart): a stale timestamp on the newest sequence
// number (the sender numbers packets on while its timestamps jump back), a
// jump back beyond rtpTimeWindowS, or staleRun stale frames in a row with
// nothing accepted between (sequence numbers restarted too) start a new
// timeline: the frames being assembled are given up and the stale run's
// frames counted lost, and restarts counts it, so the media path can
// re-anchor its capture clock.
type assembler struct {
	format  payloadFormat
	pending []*partial
	last    uint32 // timestamp of the last released frame
	started bool
	tail    uint16 // sequence number of the last released frame's last packet
	hasTail bool
	counted bool // a loss before the next released frame is already counted
	lost    int  // frames given up (incomplete when a newer one completed, or over a limit)

	discarded int      // packets discarded: not VP8, duplicates, stale (of a frame already released or given up)
	padding   int      // padding-only packets (bandwidth probes): no payload
	restarts  int      // times the sender's timeline jumped back and assembly started afresh
	maxSeq    uint16   // the newest sequence number accepted
	hasSeq    bool     // maxSeq is set
	stale     []uint32 // timestamps of the stale frames since the last accepted packet (at most staleRun)
}

type partial struct {
	ts      uint32
	pkts    map[uint16][]byte // sequence number -> the payload bytes the format keeps
	bytes   int
	head    uint16
	hasHead bool
	key     bool
	tail    uint16
	hasTail bool
}

// push adds one packet; it returns the frames it completed, oldest first.
func (a *assembler) push(p *rtp.Packet) []codedFrame {
	if a.format == nil {
		a.format = vp8Format{}
	}
	if len(p.Payload) == 0 {
		// Padding only: a sender probing bandwidth (browsers do, between
		// frames, on the media's sequence numbers). It carries nothing,
		// but its sequence number is not a packet missing between two
		// frames: one right after the last released frame moves the tail.
		a.padding++
		if a.hasTail && p.SequenceNumber == a.tail+1 {
			a.tail++
		}
		return nil
	}
	payload, head, key, ok := a.format.parse(p.Payload)
	if !ok {
		a.discarded++ // not of the codec
		return nil
	}
	if a.started && !newer(p.Timestamp, a.last) && !a.newTimeline(p) {
		a.discarded++ // a packet of a frame already released or given up
		return nil
	}
	a.stale = a.stale[:0]
	if !a.hasSeq || seqNewer(p.SequenceNumber, a.maxSeq) {
		a.maxSeq, a.hasSeq = p.SequenceNumber, true
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
		a.discarded++
		return nil
	}
	if len(fr.pkts) >= maxFramePkts || fr.bytes+len(payload) > maxFrameBytes {
		a.giveUp(fr)
		return nil
	}
	fr.pkts[p.SequenceNumber] = slices.Clone(payload)
	fr.bytes += len(payload)
	if head && (!fr.hasHead || seqNewer(fr.head, p.SequenceNumber)) {
		// The frame's first packet: the earliest that can begin one.
		fr.head, fr.hasHead = p.SequenceNumber, true
	}
	fr.key = fr.key || key
	if p.Marker {
		fr.tail, fr.hasTail = p.SequenceNumber, true
	}
	return a.release()
}

// release hands out the newest complete frame and every complete frame
// before it; incomplete frames older than it are given up.
func (a *assembler) release() []codedFrame {
	newest := -1
	for i, fr := range a.pending {
		if fr.complete() {
			newest = i
		}
	}
	if newest < 0 {
		return nil
	}
	var out []codedFrame
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
		parts := make([][]byte, 0, len(fr.pkts))
		for s := fr.head; ; s++ {
			parts = append(parts, fr.pkts[s])
			if s == fr.tail {
				break
			}
		}
		data, err := a.format.join(parts)
		if err != nil {
			a.lost++ // its packets do not make a frame: as good as lost
			a.counted = true
			continue
		}
		out = append(out, codedFrame{Data: data, TS: fr.ts, Key: fr.key})
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

// newTimeline reports whether stale packet p starts a new timeline of the
// sender; if so assembly starts afresh.
func (a *assembler) newTimeline(p *rtp.Packet) bool {
	jump := ahead(a.last, p.Timestamp) > rtpTimeWindowS*videoClockRate ||
		a.hasSeq && seqNewer(p.SequenceNumber, a.maxSeq)
	if !jump {
		if !slices.Contains(a.stale, p.Timestamp) {
			a.stale = append(a.stale, p.Timestamp)
		}
		if len(a.stale) < staleRun {
			return false
		}
		// Frames of the new timeline were discarded as stale until now.
		a.lost += len(a.stale) - 1
		a.counted = true
	}
	a.lost += len(a.pending)
	a.pending = nil
	a.started, a.hasTail = false, false
	a.restarts++
	return true
}

// newer reports whether RTP timestamp x is after y (RFC 3550 wrap-around).
func newer(x, y uint32) bool { return x != y && x-y < 1<<31 }

// seqNewer reports whether RTP sequence number x is after y (wrap-around).
func seqNewer(x, y uint16) bool { return x != y && x-y < 1<<15 }

// ahead is how far x is after y, in clock ticks, modulo wrap.
func ahead(x, y uint32) uint32 { return x - y }
