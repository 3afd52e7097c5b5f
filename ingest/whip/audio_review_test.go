package whip

import (
	"testing"
	"time"

	"github.com/pion/rtp"
)

// A padding-only RTP packet has its own sequence number: the next packet
// must not be counted lost nor concealed (packet() says "not a loss").
func TestAudioPaddingTakesItsSeq(t *testing.T) {
	pkts := opusPackets(t, 4, 1)
	sink := newSink()
	p, st, clk := testAudioPipeline(t, sink, 0, 1) // 20 ms chunks
	send := func(seq uint16, ts uint32, pl []byte) {
		clk.Advance(20 * time.Millisecond)
		p.packet(&rtp.Packet{Header: rtp.Header{Version: 2, PayloadType: 111, SequenceNumber: seq, Timestamp: ts}, Payload: pl})
	}
	send(10, 0, pkts[0])
	send(11, 960, pkts[1])
	send(12, 1920, nil) // padding only (RFC 3550 5.1: padding packets take a sequence number)
	send(13, 1920, pkts[2])
	send(14, 2880, pkts[3])
	c := &st.c
	t.Logf("lost %d concealed %d padding %d chunks %d", c.lost.Load(), c.concealed.Load(), c.padding.Load(), len(sink.chunks("s")))
	if c.lost.Load() != 0 || c.concealed.Load() != 0 || len(sink.chunks("s")) != 4 {
		t.Errorf("padding packet: lost %d concealed %d, %d chunks (want 0, 0, 4: 4 packets of 20 ms)", c.lost.Load(), c.concealed.Load(), len(sink.chunks("s")))
	}
}

// A sender that restarts its RTP sequence (new random seq and timestamp
// base, e.g. a republished track) is counted as a restart: its capture
// times must come from arrivals again, as video's do (sync.restart).
func TestAudioRestartRestartsClock(t *testing.T) {
	pkts := opusPackets(t, 6, 1)
	sink := newSink()
	p, st, clk := testAudioPipeline(t, sink, 0, 1)
	send := func(seq uint16, ts uint32, pl []byte) {
		clk.Advance(20 * time.Millisecond)
		p.packet(&rtp.Packet{Header: rtp.Header{Version: 2, PayloadType: 111, SequenceNumber: seq, Timestamp: ts}, Payload: pl})
	}
	const ts0 = 500000000
	send(100, ts0, pkts[0])
	send(101, ts0+960, pkts[1])
	send(102, ts0+1920, pkts[2])
	// new sequence: seq jumps by 20000, timestamps 10 minutes back
	back := uint32(48000 * 600)
	send(20102, ts0-back, pkts[3])
	send(20103, ts0-back+960, pkts[4])
	got := sink.chunks("s")
	last := got[len(got)-1]
	lag := clk.Now().Sub(last.capture)
	t.Logf("restarts %d; last chunk captured %v before now", st.c.restarts.Load(), lag)
	if lag > time.Second {
		t.Errorf("after a restart a chunk's capture time is %v before its arrival", lag)
	}
}

// One late (duplicate) packet with a bogus timestamp re-anchors the
// capture clock although the decoder drops it.
func TestAudioLatePacketKeepsClock(t *testing.T) {
	pkts := opusPackets(t, 6, 1)
	sink := newSink()
	p, _, clk := testAudioPipeline(t, sink, 0, 1)
	send := func(seq uint16, ts uint32, pl []byte) {
		clk.Advance(20 * time.Millisecond)
		p.packet(&rtp.Packet{Header: rtp.Header{Version: 2, PayloadType: 111, SequenceNumber: seq, Timestamp: ts}, Payload: pl})
	}
	send(100, 0, pkts[0])
	send(101, 960, pkts[1])
	send(101, 960+48000*3600, pkts[1]) // duplicate of 101 (dropped as late), timestamp 1 h ahead
	send(102, 1920, pkts[2])
	send(103, 2880, pkts[3])
	got := sink.chunks("s")
	last := got[len(got)-1]
	t.Logf("last chunk captured %v before now", clk.Now().Sub(last.capture))
	if lag := clk.Now().Sub(last.capture); lag > time.Second {
		t.Errorf("a dropped duplicate moved capture times %v into the past", lag)
	}
}

// TestAudioPartialChunkCounted: the audio of an unfinished chunk when the
// stream ends is counted (partial_ms), not lost silently.
func TestAudioPartialChunkCounted(t *testing.T) {
	pkts := opusPackets(t, 6, 1)
	sink := newSink()
	p, st, clk := testAudioPipeline(t, sink, 10, 1) // 100 ms chunks
	for i, pl := range pkts {
		clk.Advance(20 * time.Millisecond)
		p.packet(&rtp.Packet{Header: rtp.Header{Version: 2, PayloadType: 111, SequenceNumber: uint16(100 + i), Timestamp: uint32(960 * i)}, Payload: pl})
	}
	p.end()
	if n, got := len(sink.chunks("s")), st.info().PartialMS; n != 1 || got != 20 {
		t.Errorf("%d chunks and %v ms partial: want 1 chunk of 100 ms and 20 ms left", n, got)
	}
}
