package whip

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/pion/rtp"
	"github.com/pion/rtp/codecs"

	"github.com/mdag/mdag/ingest/avc"
	"github.com/mdag/mdag/ingest/synth"
	"github.com/mdag/mdag/media"
)

// h264Packets encodes n pattern frames with x264 and packetizes them as a
// WebRTC sender does (pion: SPS and PPS in a STAP-A, slices over the MTU
// in FU-A fragments).
func h264Packets(t testing.TB, n, mtu int) []*rtp.Packet {
	t.Helper()
	return encodedPackets(t, CodecH264, n, mtu)
}

// TestH264Assembler: H.264 frames (STAP-A, FU-A, single NAL units) are
// assembled in order, reordered and duplicated, and with a lost packet;
// every frame released decodes, the first is a key frame.
func TestH264Assembler(t *testing.T) {
	pkts := h264Packets(t, 10, 48) // a small MTU: every frame in FU-A fragments
	types := map[byte]int{}
	for _, p := range pkts {
		types[p.Payload[0]&0x1f]++
	}
	if types[nalSTAPA] == 0 || types[nalFUA] == 0 {
		t.Fatalf("packet types %v: want STAP-A and FU-A", types)
	}
	var shuffled []*rtp.Packet // neighbours in a frame swapped, every packet twice
	for i := 0; i < len(pkts); i++ {
		if i+1 < len(pkts) && pkts[i].Timestamp == pkts[i+1].Timestamp {
			shuffled = append(shuffled, pkts[i+1], pkts[i], pkts[i+1], pkts[i])
			i++
			continue
		}
		shuffled = append(shuffled, pkts[i], pkts[i])
	}
	lossy := slices.Clone(pkts)
	lostAt := -1 // the first delta frame sent in fragments loses its first packet
	for i, p := range lossy {
		if f := int(p.Timestamp-1000) / 3000; f > 0 && !p.Marker {
			lossy = slices.Delete(lossy, i, i+1)
			lostAt = f
			break
		}
	}
	if lostAt < 0 {
		t.Fatal("no delta frame in fragments: nothing to lose")
	}
	for _, c := range []struct {
		name        string
		pkts        []*rtp.Packet
		frames, bad int
	}{
		{"in order", pkts, 10, 0},
		{"reordered and duplicated", shuffled, 10, 0},
		{"a fragment lost", lossy, 9, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			a := assembler{format: h264Format{}}
			dec, err := avc.NewDecoder(avc.H264)
			if err != nil {
				t.Fatal(err)
			}
			defer dec.Close()
			var got []codedFrame
			for _, p := range c.pkts {
				got = append(got, a.push(p)...)
			}
			if len(got) != c.frames || a.lost != c.bad || !got[0].Key {
				t.Fatalf("%d frames (first key %v), %d lost; want %d and %d", len(got), len(got) > 0 && got[0].Key, a.lost, c.frames, c.bad)
			}
			for i, fr := range got {
				if !bytes.HasPrefix(fr.Data, annexB) {
					t.Fatalf("frame %d does not start with a start code", i)
				}
				if c.bad > 0 && i >= lostAt {
					break // deltas after the loss reference the lost frame
				}
				img, err := dec.Decode(fr.Data)
				if err != nil || img == nil || img.W != 96 || img.H != 64 {
					t.Fatalf("frame %d: decode %v (%v)", i, err, img)
				}
			}
		})
	}
}

// TestH264Payload: packets that are not H.264 in packetization mode 1 are
// discarded, and packets that do not make a frame lose it.
func TestH264Payload(t *testing.T) {
	nal := func(typ byte, first bool) []byte {
		b := byte(0x00)
		if first {
			b = 0x80
		}
		return []byte{0x60 | typ, b, 1, 2, 3}
	}
	stap := func(units ...[]byte) []byte {
		out := []byte{0x78}
		for _, u := range units {
			out = append(out, byte(len(u)>>8), byte(len(u)))
			out = append(out, u...)
		}
		return out
	}
	fu := func(typ byte, start, end bool) []byte {
		h := typ
		if start {
			h |= 0x80
		}
		if end {
			h |= 0x40
		}
		return []byte{0x7c, h, 0x80, 9}
	}
	for _, c := range []struct {
		name          string
		payload       []byte
		ok, head, key bool
	}{
		{"IDR slice, first", nal(nalIDR, true), true, true, true},
		{"slice, not first", nal(nalSlice, false), true, false, false},
		{"SPS", nal(nalSPS, false), true, true, false},
		{"STAP-A SPS PPS IDR", stap(nal(nalSPS, false), nal(nalPPS, false), nal(nalIDR, true)), true, true, true},
		{"FU-A start of IDR", fu(nalIDR, true, false), true, true, true},
		{"FU-A middle of IDR", fu(nalIDR, false, false), true, false, true},
		{"empty", nil, false, false, false},
		{"forbidden bit", []byte{0xe5, 0x80}, false, false, false},
		{"STAP-B", []byte{0x79, 0, 1, 0, 2, 0x65, 0x80}, false, false, false},
		{"FU-B", []byte{0x7d, 0x85, 0, 1, 0x80}, false, false, false},
		{"STAP-A size past the end", []byte{0x78, 0, 9, 0x65}, false, false, false},
		{"STAP-A empty unit", []byte{0x78, 0, 0}, false, false, false},
		{"FU-A too short", []byte{0x7c, 0x85}, false, false, false},
		{"FU-A of an aggregate", []byte{0x7c, 0x98, 1}, false, false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, head, key, ok := h264Format{}.parse(c.payload)
			if ok != c.ok || head != c.head || key != c.key {
				t.Errorf("ok %v head %v key %v; want %v %v %v", ok, head, key, c.ok, c.head, c.key)
			}
		})
	}
	for _, c := range []struct {
		name  string
		parts [][]byte
		want  []byte // nil: an error
	}{
		{"single units", [][]byte{{0x67, 1}, {0x65, 0x80}}, []byte{0, 0, 0, 1, 0x67, 1, 0, 0, 0, 1, 0x65, 0x80}},
		{"STAP-A", [][]byte{{0x78, 0, 2, 0x67, 1, 0, 1, 0x68}}, []byte{0, 0, 0, 1, 0x67, 1, 0, 0, 0, 1, 0x68}},
		{"FU-A whole", [][]byte{{0x7c, 0x85, 0x80}, {0x7c, 0x05, 7}, {0x7c, 0x45, 8}}, []byte{0, 0, 0, 1, 0x65, 0x80, 7, 8}},
		{"FU-A without its start", [][]byte{{0x7c, 0x05, 7}, {0x7c, 0x45, 8}}, nil},
		{"FU-A not ended", [][]byte{{0x7c, 0x85, 0x80}, {0x7c, 0x05, 7}}, nil},
		{"FU-A restarted", [][]byte{{0x7c, 0x85, 0x80}, {0x7c, 0x85, 0x80}}, nil},
		{"a unit inside FU-A", [][]byte{{0x7c, 0x85, 0x80}, {0x61, 0x80}}, nil},
	} {
		t.Run("join "+c.name, func(t *testing.T) {
			got, err := h264Format{}.join(c.parts)
			if c.want == nil {
				if err == nil {
					t.Errorf("joined %x, want an error", got)
				}
				return
			}
			if err != nil || !bytes.Equal(got, c.want) {
				t.Errorf("joined %x (%v), want %x", got, err, c.want)
			}
		})
	}
}

// FuzzH264 feeds arbitrary RTP packets (and mutations of real H.264 ones)
// through the H.264 depacketizer, assembly and libavcodec: errors are
// counted, never fatal.
func FuzzH264(f *testing.F) {
	for _, p := range h264Packets(f, 3, 120) {
		b, err := p.Marshal()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{0x80, 102, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0x7c, 0x85, 0x88})
	f.Fuzz(func(t *testing.T, data []byte) {
		p, _ := testPipelineCodec(t, newSink(), CodecH264)
		var pk rtp.Packet
		if pk.Unmarshal(data) == nil {
			p.packet(&pk)
		}
		// The data as FU-A fragments of one IDR frame: random bytes reach
		// the decoder.
		for i := 0; i*64 < len(data); i++ {
			chunk := data[i*64 : min(len(data), (i+1)*64)]
			h := byte(nalIDR)
			if i == 0 {
				h |= 0x80
			}
			last := (i+1)*64 >= len(data)
			if last {
				h |= 0x40
			}
			payload := append([]byte{0x7c, h}, chunk...)
			q := &rtp.Packet{Header: rtp.Header{Version: 2, SequenceNumber: uint16(i), Timestamp: 5, Marker: last}, Payload: payload}
			p.packet(q)
		}
	})
}

// TestPaddingNotLoss: padding-only packets between frames (a browser's
// bandwidth probes, on the media's sequence numbers) are neither a lost
// frame nor discarded: before, each made the next frame look preceded by
// missing packets, which counted a loss, asked for a key frame and skipped
// frames until it came.
func TestPaddingNotLoss(t *testing.T) {
	for _, codec := range []string{CodecVP8, CodecH264} {
		t.Run(codec, func(t *testing.T) {
			pkts := encodedPackets(t, codec, 10, 200)
			// Renumber, with two padding packets after every frame's last.
			var with []*rtp.Packet
			seq := uint16(100)
			add := func(p *rtp.Packet) {
				q := *p
				q.SequenceNumber = seq
				seq++
				with = append(with, &q)
			}
			pads := 0
			for _, p := range pkts {
				add(p)
				if p.Marker {
					for range 2 {
						add(&rtp.Packet{Header: rtp.Header{Version: 2, Padding: true, PayloadType: p.PayloadType, Timestamp: p.Timestamp, SSRC: p.SSRC}})
						pads++
					}
				}
			}
			sink := newSink()
			pl, st := testPipelineCodec(t, sink, codec)
			for _, p := range with {
				pl.packet(p)
			}
			if got := sink.count("s"); got != 10 || st.c.lost.Load() != 0 || st.c.waitingKey.Load() != 0 || st.c.discarded.Load() != 0 || st.c.padding.Load() != uint64(pads) {
				t.Errorf("ingested %d of 10, lost %d, waiting-key %d, discarded %d, padding %d (want %d)",
					got, st.c.lost.Load(), st.c.waitingKey.Load(), st.c.discarded.Load(), st.c.padding.Load(), pads)
			}
		})
	}
}

// TestH264ResolutionChange: an H.264 sender that restarts its encoder at
// another size mid-stream (new SPS and PPS with an IDR, the RTP stream
// going on) keeps streaming: frames of both sizes reach the session, none
// is lost or fails to decode.
func TestH264ResolutionChange(t *testing.T) {
	var pkts []*rtp.Packet
	pk := rtp.NewPacketizer(300, 102, 1, &codecs.H264Payloader{}, rtp.NewFixedSequencer(100), videoClockRate)
	n := 0
	for _, size := range [][2]int{{96, 64}, {160, 120}, {64, 48}} {
		pat, err := synth.NewPattern(size[0], size[1], 2)
		if err != nil {
			t.Fatal(err)
		}
		frames := make([]*media.Frame, 5)
		for i := range frames {
			if frames[i], _, err = pat.Frame(0, uint64(i)); err != nil {
				t.Fatal(err)
			}
		}
		clip, err := EncodeClip(ClientConfig{Codec: CodecH264, Width: size[0], Height: size[1], FPS: 30}, frames, 6)
		if err != nil {
			t.Fatal(err)
		}
		for _, data := range clip {
			for _, p := range pk.Packetize(data, 0) {
				p.Timestamp = uint32(1000 + n*3000)
				pkts = append(pkts, p)
			}
			n++
		}
	}
	sink := newSink()
	pl, st := testPipelineCodec(t, sink, CodecH264)
	for _, p := range pkts {
		pl.packet(p)
	}
	sink.mu.Lock()
	got := sink.frames["s"]
	sink.mu.Unlock()
	var sizes []string
	for _, f := range got {
		if s := fmt.Sprintf("%dx%d", f.w, f.h); len(sizes) == 0 || sizes[len(sizes)-1] != s {
			sizes = append(sizes, s)
		}
	}
	if len(got) != 15 || strings.Join(sizes, " ") != "96x64 160x120 64x48" || st.c.decodeErrors.Load() != 0 || st.c.lost.Load() != 0 {
		t.Errorf("%d of 15 frames at sizes %v, %d decode errors, %d lost", len(got), sizes, st.c.decodeErrors.Load(), st.c.lost.Load())
	}
}
