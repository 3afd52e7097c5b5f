package whip

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/pion/rtp"

	"github.com/mdag/mdag/ingest/synth"
	"github.com/mdag/mdag/internal/clock"
)

// timelineCase is a sender of 20 frames (30 fps) whose RTP timeline does
// something at frame 10.
type timelineCase struct {
	name string
	// ts and seq give frame i's packet its timestamp and sequence number
	// (base: what a steady sender would use).
	ts  func(i int, base uint32) uint32
	seq func(i int, base uint16) uint16
	// resend: packets of these already sent frames are sent again after
	// frame 9 (late retransmissions).
	resend []int
	// The assembler's answer: frames released, lost, packets discarded
	// (-1: the resent packets), timeline restarts.
	frames, lost, discarded, restarts int
	// The media path's: frames handed to the session.
	ingested int
}

const tick = 3000 // RTP ticks per frame at 30 fps

func timelineCases() []timelineCase {
	steadySeq := func(_ int, s uint16) uint16 { return s }
	back := func(d uint32) func(int, uint32) uint32 {
		return func(i int, b uint32) uint32 {
			if i >= 10 {
				return b - d
			}
			return b
		}
	}
	return []timelineCase{
		{name: "steady", ts: func(_ int, b uint32) uint32 { return b }, seq: steadySeq, frames: 20, ingested: 20},
		{name: "back 10 s, sequence goes on", ts: back(10 * videoClockRate), seq: steadySeq, frames: 20, restarts: 1, ingested: 20},
		{name: "back 100 ms", ts: back(videoClockRate / 10), seq: steadySeq, frames: 20, restarts: 1, ingested: 20},
		{name: "back one frame (timestamp repeated)", ts: back(tick), seq: steadySeq, frames: 20, restarts: 1, ingested: 20},
		{name: "back 40 s (beyond the window)", ts: back(40 * videoClockRate), seq: steadySeq, frames: 20, restarts: 1, ingested: 20},
		{name: "back 13 h (timestamp wraps)", ts: back(1 << 32 / 3), seq: steadySeq, frames: 20, restarts: 1, ingested: 20},
		{
			// The sender restarted its sequence numbers too: frames 10-16
			// look like late packets until the eighth stale frame in a row
			// starts the new timeline; they are counted lost, and the media
			// path waits for a key frame (the rest are deltas).
			name: "back 10 s, sequence restarts", ts: back(10 * videoClockRate),
			seq: func(i int, s uint16) uint16 {
				if i >= 10 {
					return s - 5000
				}
				return s
			},
			frames: 13, lost: 7, discarded: -2, restarts: 1, ingested: 10,
		},
		{
			name: "late retransmissions", ts: func(_ int, b uint32) uint32 { return b }, seq: steadySeq,
			resend: []int{7, 8}, frames: 20, discarded: -1, ingested: 20,
		},
	}
}

// timelinePackets builds c's packets in sending order, each with its
// frame number.
func timelinePackets(t *testing.T, c timelineCase) ([]*rtp.Packet, []int) {
	t.Helper()
	var pkts []*rtp.Packet
	var frame []int
	var byFrame [20][]*rtp.Packet
	for _, p := range vp8Packets(t, 20) {
		i := int(p.Timestamp-1000) / tick
		q := p.Clone()
		q.Timestamp = c.ts(i, p.Timestamp)
		q.SequenceNumber = c.seq(i, p.SequenceNumber)
		byFrame[i] = append(byFrame[i], q)
	}
	for i := range 20 {
		if i == 10 {
			for _, r := range c.resend {
				for _, p := range byFrame[r] {
					pkts, frame = append(pkts, p.Clone()), append(frame, 9) // arrives with frame 9
				}
			}
		}
		for _, p := range byFrame[i] {
			pkts, frame = append(pkts, p), append(frame, i)
		}
	}
	return pkts, frame
}

// wantDiscarded resolves the case's discarded packets: -1 the resent
// packets, -2 the packets of frames 10-16.
func wantDiscarded(c timelineCase, pkts []*rtp.Packet, frame []int) int {
	switch c.discarded {
	case -1:
		n := 0
		for _, r := range c.resend {
			for _, f := range frame {
				if f == r {
					n++
				}
			}
		}
		return n
	case -2:
		n := 0
		for _, f := range frame {
			if f >= 10 && f <= 16 {
				n++
			}
		}
		return n
	}
	return c.discarded
}

// TestAssemblerTimeline: a sender whose RTP timestamps jump back starts a
// new timeline (its frames are assembled, not dropped as "already
// released"); late packets are discarded and counted.
func TestAssemblerTimeline(t *testing.T) {
	for _, c := range timelineCases() {
		t.Run(c.name, func(t *testing.T) {
			pkts, frame := timelinePackets(t, c)
			var a assembler
			var got []uint32
			for _, p := range pkts {
				for _, f := range a.push(p) {
					got = append(got, f.TS)
				}
			}
			if len(got) != c.frames || a.lost != c.lost || a.restarts != c.restarts || a.discarded != wantDiscarded(c, pkts, frame) {
				t.Errorf("%d frames, %d lost, %d packets discarded, %d restarts; want %d, %d, %d, %d",
					len(got), a.lost, a.discarded, a.restarts, c.frames, c.lost, wantDiscarded(c, pkts, frame), c.restarts)
			}
			// Within a timeline frames come out in order.
			restarts := 0
			for i := 1; i < len(got); i++ {
				if !newer(got[i], got[i-1]) {
					restarts++
				}
			}
			if restarts != c.restarts {
				t.Errorf("released timestamps go back %d times, want %d: %v", restarts, c.restarts, got)
			}
		})
	}
}

// TestMediaTimeline: the media path over the same senders, frames arriving
// 33 ms apart on a fake clock with a sender report on the old timeline
// before the jump and one still in flight just after it. Every frame the
// assembler releases is decoded and handed to the session with capture
// times that keep going forward one frame interval apart (re-anchored at
// the jump, not 10 s in the past), and the counters say what was dropped.
func TestMediaTimeline(t *testing.T) {
	for _, c := range timelineCases() {
		t.Run(c.name, func(t *testing.T) {
			sink := newSink()
			p, st := testPipeline(t, sink)
			clk := st.s.clk.(*clock.Fake)
			t0 := clk.Now()
			pkts, frame := timelinePackets(t, c)
			// Frame i is captured at t0 + i/30 s and arrives 20 ms later; the
			// sender's clock is ours, its reports stamped on sending (20 ms
			// after capture, as arrivals imply).
			capture := func(i int) time.Time { return t0.Add(time.Duration(i) * time.Second / 30) }
			ntp := func(t time.Time) uint64 {
				return uint64(t.Unix()+2208988800)<<32 | uint64(t.Nanosecond())<<32/uint64(time.Second)
			}
			last := -1
			for k, pk := range pkts {
				f := frame[k]
				if f != last {
					clk.Set(capture(f).Add(20 * time.Millisecond))
				}
				p.packet(pk)
				if f != last && (f == 5 || f == 10) {
					// At 10: the old timeline's report, in flight when the
					// new timeline's first packet came.
					p.sync.senderReport(ntp(capture(f).Add(20*time.Millisecond)), uint32(1000+f*tick), clk.Now())
				}
				last = f
			}
			got := sink.frames["s"]
			info := st.info()
			if len(got) != c.ingested || info.Restarts != uint64(c.restarts) || info.Discarded != uint64(wantDiscarded(c, pkts, frame)) ||
				info.Lost != uint64(c.lost) || info.Frames != uint64(c.frames) || info.DecodeErrors != 0 {
				t.Errorf("ingested %d; info %+v; want %d ingested, %d restarts, %d discarded, %d lost, %d frames",
					len(got), info, c.ingested, c.restarts, wantDiscarded(c, pkts, frame), c.lost, c.frames)
			}
			for i := 1; i < len(got); i++ {
				gap := got[i].capture.Sub(got[i-1].capture)
				if arrived := capture(i).Add(20 * time.Millisecond); c.ingested == 20 && (got[i].capture.After(arrived) || got[i].capture.Before(capture(i))) {
					t.Errorf("frame %d captured at %v, arrived %v after t0", i, got[i].capture.Sub(t0), arrived.Sub(t0))
				}
				if i < 10 || i > 10 {
					if gap < 30*time.Millisecond || gap > 37*time.Millisecond {
						t.Errorf("frames %d-%d: capture gap %v, want 33 ms", i-1, i, gap)
					}
				} else if gap <= 0 || gap > 60*time.Millisecond {
					// At the jump the clock re-anchors on arrival: up to the
					// arrival delay (20 ms) more than a frame interval.
					t.Errorf("frames %d-%d at the jump: capture gap %v, want 33 to 53 ms", i-1, i, gap)
				}
			}
		})
	}
}

// FuzzTimeline drives the assembler with arbitrary sequence numbers,
// timestamps (forward, back, wrapping), markers and partition heads: it
// never holds more than maxPending frames, and released timestamps only go
// back where it counted a new timeline.
func FuzzTimeline(f *testing.F) {
	f.Add([]byte{0, 1, 0, 30, 0x81, 0, 1, 0, 30, 0x81, 0, 1, 0x80, 0, 0x81})
	f.Add([]byte{0, 1, 0, 30, 0x01, 0, 1, 0, 0, 0x80, 0, 2, 0xff, 0xe2, 0x81, 0x80, 0, 0, 30, 0x81})
	f.Fuzz(func(t *testing.T, data []byte) {
		var a assembler
		var seq uint16 = 7
		var ts uint32 = 1 << 31
		var got []uint32
		pushed := 0
		for ; len(data) >= 5; data = data[5:] {
			seq += uint16(int16(uint16(data[0])<<8 | uint16(data[1])))
			ts += uint32(int32(int16(uint16(data[2])<<8|uint16(data[3])))) * 300
			desc := byte(0x00)
			if data[4]&1 != 0 {
				desc = 0x10 // S=1, PID=0: the frame's first packet
			}
			p := &rtp.Packet{Header: rtp.Header{Version: 2, SequenceNumber: seq, Timestamp: ts, Marker: data[4]&0x80 != 0},
				Payload: []byte{desc, data[4] & 0x7e, 0, 0}}
			pushed++
			for _, fr := range a.push(p) {
				got = append(got, fr.TS)
			}
			if len(a.pending) > maxPending {
				t.Fatalf("%d frames pending", len(a.pending))
			}
		}
		back := 0
		for i := 1; i < len(got); i++ {
			if !newer(got[i], got[i-1]) {
				back++
			}
		}
		if back > a.restarts || a.discarded > pushed || a.lost < 0 {
			t.Errorf("released timestamps go back %d times with %d restarts; %d of %d packets discarded, %d lost", back, a.restarts, a.discarded, pushed, a.lost)
		}
	})
}

// TestLoopbackTimelineJump: over a real connection, a camera whose clock
// jumps back 10 s mid-stream (the Publisher stamps RTP from capture
// times): the stream goes on at the app's rate instead of stalling, and the
// restart is counted.
func TestLoopbackTimelineJump(t *testing.T) {
	srv, sink, hs := newTestServer(t, Config{})
	pat, err := synth.NewPattern(160, 120, 1)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	p, err := Publish(ctx, ClientConfig{Server: hs.URL, App: "face", Width: 160, Height: 120, FPS: 30})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	start := time.Now()
	const n = 60 // 2 s at 30 fps; the camera's clock goes back 10 s after 1 s
	for i := range n {
		at := start.Add(time.Duration(i) * time.Second / 30)
		time.Sleep(time.Until(at)) // pacing a real-time source, not waiting for logic
		stamp := at
		if i >= n/2 {
			stamp = at.Add(-10 * time.Second)
		}
		f, _, err := pat.Frame(0, uint64(i))
		if err != nil {
			t.Fatal(err)
		}
		if err := p.WriteFrame(f, stamp); err != nil {
			t.Fatal(err)
		}
	}
	// Both halves reach the app at 10 fps: about 10 frames each.
	waitFor(t, "frames of both timelines", 5*time.Second, func() bool { return sink.count(p.Stream) >= 18 })
	info := srv.Streams()[0]
	if info.Restarts != 1 || info.Lost != 0 || info.DecodeErrors != 0 {
		t.Errorf("stream info %+v: want 1 timeline restart, nothing lost", info)
	}
	sink.mu.Lock()
	got := slices.Clone(sink.frames[p.Stream])
	sink.mu.Unlock()
	for i := 1; i < len(got); i++ {
		if gap := got[i].capture.Sub(got[i-1].capture); gap <= 0 || gap > 200*time.Millisecond {
			t.Errorf("frames %d-%d: capture gap %v, want about 100 ms (10 fps) across the jump", i-1, i, gap)
		}
	}
}
