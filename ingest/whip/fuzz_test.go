package whip

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/pion/rtp"
	"github.com/pion/rtp/codecs"

	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/ingest/synth"
	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/media"
)

// vp8Packets encodes n pattern frames and packetizes them as a sender would.
func vp8Packets(t testing.TB, n int) []*rtp.Packet {
	t.Helper()
	return encodedPackets(t, CodecVP8, n, 200)
}

// encodedPackets encodes n 96x64 pattern frames in codec (a key frame
// first) and packetizes them with pion's payloader at mtu, 30 fps apart.
func encodedPackets(t testing.TB, codec string, n, mtu int) []*rtp.Packet {
	t.Helper()
	pat, err := synth.NewPattern(96, 64, 2)
	if err != nil {
		t.Fatal(err)
	}
	frames := make([]*media.Frame, n)
	for i := range frames {
		if frames[i], _, err = pat.Frame(0, uint64(i)); err != nil {
			t.Fatal(err)
		}
	}
	clip, err := EncodeClip(ClientConfig{Codec: codec, Width: 96, Height: 64, FPS: 30, BitrateKbps: 300}, frames, n+1)
	if err != nil {
		t.Fatal(err)
	}
	var payloader rtp.Payloader = &codecs.VP8Payloader{EnablePictureID: true}
	if codec == CodecH264 {
		payloader = &codecs.H264Payloader{}
	}
	pk := rtp.NewPacketizer(uint16(mtu), 96, 1, payloader, rtp.NewFixedSequencer(100), videoClockRate)
	var out []*rtp.Packet
	for i, data := range clip {
		for _, p := range pk.Packetize(data, 0) {
			p.Timestamp = uint32(1000 + i*3000)
			out = append(out, p)
		}
	}
	return out
}

// testPipeline is a stream's VP8 media path without a peer connection.
func testPipeline(t testing.TB, sink Sink) (*pipeline, *stream) {
	t.Helper()
	return testPipelineCodec(t, sink, CodecVP8)
}

// testPipelineCodec is a stream's media path for codec without a peer
// connection.
func testPipelineCodec(t testing.TB, sink Sink, codec string) (*pipeline, *stream) {
	t.Helper()
	srv, err := New(Config{Apps: map[dag.AppID]float64{"a": 0}, Clock: clock.NewFake(time.Unix(1e9, 0))}, sink)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	st := &stream{s: srv, id: "s", app: "a", codec: codec, subs: map[chan Result]struct{}{}, done: make(chan struct{})}
	dec, err := newDecoder(codec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(dec.Close)
	return &pipeline{st: st, dec: dec, sync: &captureClock{}, needKey: true, sendPLI: func() error { return nil },
		asm: assembler{format: payloadFormatOf(codec)}}, st
}

// TestAssembler: in order, reordered, duplicated and lossy delivery.
func TestAssembler(t *testing.T) {
	pkts := vp8Packets(t, 10)
	frames := func(order []*rtp.Packet) (int, int, bool) {
		var a assembler
		n, keyFirst := 0, false
		for _, p := range order {
			for _, f := range a.push(p) {
				if n == 0 {
					keyFirst = f.Key
				}
				n++
			}
		}
		return n, a.lost, keyFirst
	}
	if n, lost, key := frames(pkts); n != 10 || lost != 0 || !key {
		t.Errorf("in order: %d frames, %d lost, first key %v", n, lost, key)
	}
	// Swap neighbours inside each frame, duplicate every packet.
	var shuffled []*rtp.Packet
	for i := 0; i < len(pkts); i++ {
		if i+1 < len(pkts) && pkts[i].Timestamp == pkts[i+1].Timestamp {
			shuffled = append(shuffled, pkts[i+1], pkts[i], pkts[i+1], pkts[i])
			i++
			continue
		}
		shuffled = append(shuffled, pkts[i], pkts[i])
	}
	if n, lost, _ := frames(shuffled); n != 10 || lost != 0 {
		t.Errorf("reordered and duplicated: %d frames, %d lost", n, lost)
	}
	// Lose one packet of frame 3 (a frame of several packets).
	var lossy []*rtp.Packet
	dropped := false
	for _, p := range pkts {
		if !dropped && p.Timestamp == 1000+3*3000 {
			dropped = true
			continue
		}
		lossy = append(lossy, p)
	}
	if n, lost, _ := frames(lossy); n != 9 || lost != 1 {
		t.Errorf("one packet lost: %d frames, %d lost; want 9 and 1", n, lost)
	}
}

// TestPipelineRecovers: a lost frame makes the pipeline skip to the next
// key frame, asking for one; nothing reaches the session broken.
func TestPipelineRecovers(t *testing.T) {
	sink := newSink()
	p, st := testPipeline(t, sink)
	plis := 0
	p.sendPLI = func() error { plis++; return nil }
	pkts := vp8Packets(t, 6)
	// Frame 2 loses a packet; frames 3-5 are deltas and cannot be decoded
	// correctly without it.
	for _, pk := range pkts {
		if pk.Timestamp == 1000+2*3000 && pk.Marker {
			continue
		}
		p.packet(pk)
	}
	if got := sink.count("s"); got != 2 {
		t.Errorf("ingested %d frames, want 2 (frames 0 and 1; then waiting for a key frame)", got)
	}
	if st.c.lost.Load() != 1 || st.c.waitingKey.Load() != 3 || plis < 1 {
		t.Errorf("lost %d, waiting-key %d, PLIs %d", st.c.lost.Load(), st.c.waitingKey.Load(), plis)
	}
}

// FuzzRTP feeds arbitrary RTP packets (and mutations of real ones) through
// depacketizing, assembly and decoding: errors are counted, never fatal.
func FuzzRTP(f *testing.F) {
	for _, p := range vp8Packets(f, 3) {
		b, err := p.Marshal()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{0x80, 96, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0x10, 0x00})
	f.Fuzz(func(t *testing.T, data []byte) {
		p, _ := testPipeline(t, newSink())
		// The packet as is, then split into pseudo-packets sharing one
		// timestamp so random payloads form "frames" and reach libvpx.
		var pk rtp.Packet
		if pk.Unmarshal(data) == nil {
			p.packet(&pk)
		}
		for i := 0; i*64 < len(data); i++ {
			chunk := data[i*64 : min(len(data), (i+1)*64)]
			payload := append([]byte{0x10}, chunk...) // S=1, PID=0 on the first
			if i > 0 {
				payload[0] = 0x00
			}
			q := &rtp.Packet{Header: rtp.Header{Version: 2, SequenceNumber: uint16(i), Timestamp: 5, Marker: (i+1)*64 >= len(data)}, Payload: payload}
			p.packet(q)
		}
	})
}

// FuzzOffer posts arbitrary bodies to the WHIP endpoint: every answer is a
// 201 or a 4xx with a reason, never a crash or a 5xx.
func FuzzOffer(f *testing.F) {
	f.Add(offerSDP(f))
	f.Add("v=0\r\n")
	f.Add("v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\nm=video 9 UDP/TLS/RTP/SAVPF 96\r\na=rtpmap:96 VP8/90000\r\n")
	f.Add("v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\na=rtpmap:111 opus/48000/2\r\n")
	sink := newSink()
	// a takes video, b audio (Opus): each body goes to both.
	srv, err := New(Config{Apps: map[dag.AppID]float64{"a": 5, "b": 25}, Media: map[dag.AppID]dag.Media{"b": dag.Audio}, MaxStreams: 1 << 20,
		CPUTime: func() time.Duration { return 0 }}, sink)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(srv.Close)
	h := srv.Handler()
	f.Fuzz(func(t *testing.T, body string) {
		for _, app := range []string{"a", "b"} {
			fuzzOffer(t, srv, h, app, body)
		}
	})
}

// fuzzOffer posts body to app's WHIP endpoint: 201 (the stream is ended
// again) or a 4xx with a reason.
func fuzzOffer(t *testing.T, srv *Server, h http.Handler, app, body string) {
	req := httptest.NewRequest(http.MethodPost, "/whip/"+app, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/sdp")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	switch {
	case w.Code == http.StatusCreated:
		id := w.Header().Get("Mdag-Stream")
		if st := srv.lookup(id); st != nil {
			st.endAs(EndClient, "fuzz")
		}
	case w.Code >= 400 && w.Code < 500:
		if len(bytes.TrimSpace(w.Body.Bytes())) == 0 {
			t.Errorf("%d without a reason", w.Code)
		}
	default:
		t.Errorf("answer %d %q", w.Code, w.Body.String())
	}
}

func TestNTPTime(t *testing.T) {
	// 2026-01-01T00:00:00.5Z in NTP: seconds since 1900 and half a second.
	want := time.Date(2026, 1, 1, 0, 0, 0, 5e8, time.UTC)
	sec := uint64(want.Unix() + 2208988800)
	var b [8]byte
	binary.BigEndian.PutUint32(b[:4], uint32(sec))
	binary.BigEndian.PutUint32(b[4:], 1<<31)
	if got := ntpTime(binary.BigEndian.Uint64(b[:])); !got.Equal(want) {
		t.Errorf("ntpTime = %v, want %v", got, want)
	}
}

func TestCaptureClock(t *testing.T) {
	t0 := time.Unix(1e9, 0)
	ntp := func(t time.Time) uint64 {
		return uint64(t.Unix()+2208988800)<<32 | uint64(t.Nanosecond())<<32/uint64(time.Second)
	}
	var c captureClock
	// Before a sender report: from the first arrival.
	if got := c.capture(9000, t0); !got.Equal(t0) {
		t.Errorf("first frame: %v", got)
	}
	if got := c.capture(9000+9000, t0.Add(120*time.Millisecond)); !got.Equal(t0.Add(100 * time.Millisecond)) {
		t.Errorf("100 ms later by RTP: %v", got)
	}
	// A sender report that agrees with arrivals takes over: RTP 90000 was
	// captured at t0 + 80 ms.
	c.senderReport(ntp(t0.Add(80*time.Millisecond)), 90000, t0.Add(85*time.Millisecond))
	if got := c.capture(90000+4500, t0.Add(160*time.Millisecond)); !near(got, t0.Add(130*time.Millisecond)) {
		t.Errorf("with a sender report: %v", got)
	}
	// A later report stamped by a busy sender (its clock read 40 ms after
	// the capture it maps) does not move capture times: the earliest
	// mapping of the window wins.
	c.senderReport(ntp(t0.Add(1120*time.Millisecond)), 90000+90000, t0.Add(1125*time.Millisecond))
	if got := c.capture(90000+90000+9000, t0.Add(1200*time.Millisecond)); !near(got, t0.Add(1180*time.Millisecond)) {
		t.Errorf("after a late-stamped report: %v", got)
	}
	// A sender clock hours off is ignored.
	c.senderReport(ntp(t0.Add(-2*time.Hour)), 0, t0.Add(1300*time.Millisecond))
	if got := c.capture(90000+90000+18000, t0.Add(1300*time.Millisecond)); !near(got, t0.Add(1280*time.Millisecond)) {
		t.Errorf("skewed sender report: %v", got)
	}
	// Reports older than the window stop counting: a sender whose delay
	// really grew is followed.
	c.senderReport(ntp(t0.Add(12*time.Second+50*time.Millisecond)), 90000+12*90000, t0.Add(12*time.Second+55*time.Millisecond))
	if got := c.capture(90000+12*90000+9000, t0.Add(12*time.Second+200*time.Millisecond)); !near(got, t0.Add(12*time.Second+150*time.Millisecond)) {
		t.Errorf("after the window: %v", got)
	}
	// A sender clock that only disagrees with arrivals: from arrivals.
	var d captureClock
	d.capture(0, t0)
	d.senderReport(ntp(t0.Add(3*time.Second)), 0, t0)
	if got := d.capture(9000, t0.Add(100*time.Millisecond)); !got.Equal(t0.Add(100 * time.Millisecond)) {
		t.Errorf("sender clock ahead: %v", got)
	}
	// The only report was stamped 30 ms late: a frame sent at once arrives
	// "before" its capture by it. That frame is captured at its arrival,
	// and the mapping moves 20 ms earlier for the next frames.
	var e captureClock
	e.senderReport(ntp(t0.Add(30*time.Millisecond)), 0, t0.Add(31*time.Millisecond))
	if got := e.capture(900, t0.Add(20*time.Millisecond)); !got.Equal(t0.Add(20 * time.Millisecond)) {
		t.Errorf("early frame: %v", got)
	}
	if got := e.capture(900+9000, t0.Add(150*time.Millisecond)); !near(got, t0.Add(120*time.Millisecond)) {
		t.Errorf("next frame after the correction: %v, want 100 ms after the first", got)
	}
	// A new report whose mapping is 1 ms earlier than the old one takes
	// over; the correction (20 ms) carries over less that 1 ms, so capture
	// times stay 100 ms apart.
	e.senderReport(ntp(t0.Add(229*time.Millisecond)), 18000, t0.Add(231*time.Millisecond))
	if got := e.capture(900+18000, t0.Add(250*time.Millisecond)); !near(got, t0.Add(220*time.Millisecond)) {
		t.Errorf("after an earlier report: %v, want 100 ms after the previous frame", got)
	}
}

// near: within a microsecond (NTP fractions round).
func near(a, b time.Time) bool { return a.Sub(b).Abs() <= time.Microsecond }

// TestSampleOnGrid: a 30 fps source into a 10 fps app, capture times
// jittered by up to +-2 ms and shifted 3 ms earlier half way (a new sender
// report mapping): every third frame is taken, 100 ms apart, 20 of 60.
func TestSampleOnGrid(t *testing.T) {
	t0 := time.Unix(1e9, 0)
	p := &pipeline{st: &stream{fps: 10}}
	var kept []time.Duration
	for i := range 60 {
		at := time.Duration(i) * time.Second / 30
		jitter := time.Duration((i*7919)%5-2) * time.Millisecond
		if i >= 30 {
			jitter -= 3 * time.Millisecond
		}
		if p.sample(t0.Add(at + jitter)) {
			kept = append(kept, at)
		}
	}
	if len(kept) != 20 {
		t.Fatalf("kept %d frames of 60, want 20: %v", len(kept), kept)
	}
	for i := 1; i < len(kept); i++ {
		if gap := kept[i] - kept[i-1]; gap < 99*time.Millisecond || gap > 101*time.Millisecond {
			t.Errorf("frames %d-%d: %v apart, want 100 ms (source frames %v)", i-1, i, gap, kept)
		}
	}
}

// countingDecoder counts the frames that reach the decoder.
type countingDecoder struct {
	decoder
	n int
}

func (d *countingDecoder) Decode(b []byte) (*media.Frame, error) { d.n++; return d.decoder.Decode(b) }
func (d *countingDecoder) Skip(b []byte) error                   { d.n++; return d.decoder.Skip(b) }

// TestVP8DeclaredSizeBeforeDecode (issue 36, finding 5): a 41-byte VP8 key
// frame declaring 16383x16383 made libvpx hold ~870 MB before the
// resolution limit was checked. It is now refused from its header: the
// decoder never sees it and the stream ends with the reason. A key frame
// within the bound goes to the decoder as before.
func TestVP8DeclaredSizeBeforeDecode(t *testing.T) {
	key := func(w, h uint16) []byte {
		b := make([]byte, 41)
		b[0] = 0x10 // key frame (bit 0 clear), version 0, shown
		b[3], b[4], b[5] = 0x9d, 0x01, 0x2a
		binary.LittleEndian.PutUint16(b[6:], w)
		binary.LittleEndian.PutUint16(b[8:], h)
		return b
	}
	for _, c := range []struct {
		name    string
		w, h    uint16
		decoded bool
	}{
		{"16383x16383: refused unread", 16383, 16383, false},
		{"4097x16: refused unread", 4097, 16, false},
		{"640x480: decoded (a broken body: the decoder's error, the stream goes on)", 640, 480, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, st := testPipeline(t, newSink())
			d := &countingDecoder{decoder: p.dec}
			p.dec = d
			goesOn := p.frame(codedFrame{Data: key(c.w, c.h), Key: true}, time.Unix(1e9, 0))
			if goesOn != c.decoded || (d.n > 0) != c.decoded {
				t.Fatalf("goes on %v, decoder calls %d: want %v", goesOn, d.n, c.decoded)
			}
			if c.decoded {
				return
			}
			endedWith(t, st, fmt.Sprintf("declares %dx%d", c.w, c.h))
		})
	}
}

// endedWith waits for st to end and checks it ended as an error whose
// reason holds want.
func endedWith(t *testing.T, st *stream, want string) {
	t.Helper()
	<-st.done
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.endKind != EndError || !strings.Contains(st.ended, want) {
		t.Errorf("ended %q (%s), want an error with %q", st.ended, st.endKind, want)
	}
}
