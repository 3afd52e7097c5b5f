package rtsp

import (
	"bytes"
	"testing"

	"github.com/bluenviron/gortsplib/v4/pkg/format/rtph264"
	"github.com/bluenviron/gortsplib/v4/pkg/format/rtph265"
	"github.com/bluenviron/mediacommon/pkg/codecs/h264"
	"github.com/google/go-cmp/cmp"
	"github.com/pion/rtp"
)

// NAL units for the tests: the first byte carries the type; the rest is
// filler, long enough for slices to be fragmented (FU-A / FU).
func nal264(typ int, size int) []byte {
	b := bytes.Repeat([]byte{byte(typ*7 + 1)}, size)
	b[0] = byte(0x60 | typ) // nal_ref_idc 3
	return b
}

func nal265(typ int, size int) []byte {
	b := bytes.Repeat([]byte{byte(typ*5 + 3)}, size)
	b[0], b[1] = byte(typ<<1), 1
	return b
}

// packetize turns access units into RTP packets (payloads of at most 300
// bytes), one slice of packets per access unit, timestamps 3000 apart.
func packetize(t *testing.T, codec string, aus [][][]byte, seq0 uint16) [][]*rtp.Packet {
	t.Helper()
	ssrc := uint32(7)
	var enc interface {
		Encode([][]byte) ([]*rtp.Packet, error)
	}
	switch codec {
	case H264:
		e := &rtph264.Encoder{PayloadType: 96, SSRC: &ssrc, InitialSequenceNumber: &seq0, PayloadMaxSize: 300, PacketizationMode: 1}
		if err := e.Init(); err != nil {
			t.Fatal(err)
		}
		enc = e
	default:
		e := &rtph265.Encoder{PayloadType: 96, SSRC: &ssrc, InitialSequenceNumber: &seq0, PayloadMaxSize: 300}
		if err := e.Init(); err != nil {
			t.Fatal(err)
		}
		enc = e
	}
	out := make([][]*rtp.Packet, len(aus))
	for i, au := range aus {
		pkts, err := enc.Encode(au)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range pkts {
			p.Timestamp = uint32(i * 3000)
		}
		out[i] = pkts
	}
	return out
}

// got is one access unit handed on: its timestamp index, key flag and NAL
// types.
type got struct {
	AU    int
	Key   bool
	Types []int
}

func TestDepacketizer(t *testing.T) {
	sps, pps := nal264(7, 12), nal264(8, 4)
	sps2 := nal264(7, 14)
	idr, p := nal264(5, 900), nal264(1, 200)
	vps, sps5, pps5 := nal265(32, 20), nal265(33, 30), nal265(34, 6)
	type drop struct{ au, pkt int } // packet pkt of access unit au (-1: the last)
	cases := []struct {
		name     string
		codec    string
		sdp      [][]byte
		aus      [][][]byte
		seq0     uint16
		drops    []drop
		dropAUs  []int
		corrupt  []drop
		want     []got
		wantLost int
	}{
		{
			name: "in order: key frame first, params in band", codec: H264, seq0: 100,
			// a marker-ended AU first: the depacketizer starts after a marker
			aus:  [][][]byte{{p}, {sps, pps, idr}, {p}, {p, p}},
			want: []got{{1, true, []int{7, 8, 5}}, {2, false, []int{1}}, {3, false, []int{1, 1}}},
		},
		{
			name: "params only in the SDP go in front of key frames", codec: H264, sdp: [][]byte{sps, pps},
			aus:  [][][]byte{{p}, {idr}, {p}, {idr}},
			want: []got{{1, true, []int{7, 8, 5}}, {2, false, []int{1}}, {3, true, []int{7, 8, 5}}},
		},
		{
			name: "in-band params replace the SDP's", codec: H264, sdp: [][]byte{sps, pps},
			aus:  [][][]byte{{p}, {sps2, idr}, {idr}},
			want: []got{{1, true, []int{7, 8, 5}}, {2, true, []int{7, 8, 5}}},
		},
		{
			name: "the delimiter stays first", codec: H264, sdp: [][]byte{sps, pps},
			aus:  [][][]byte{{p}, {nal264(9, 2), sps2, idr}},
			want: []got{{1, true, []int{9, 7, 8, 5}}},
		},
		{
			// The server skips them and counts them (waiting_key).
			name: "access units before the first key frame are handed on, not key", codec: H264, sdp: [][]byte{sps, pps},
			aus:  [][][]byte{{p}, {p}, {p}, {idr}, {p}},
			want: []got{{1, false, []int{1}}, {2, false, []int{1}}, {3, true, []int{7, 8, 5}}, {4, false, []int{1}}},
		},
		{
			name: "joined mid access unit: from the next boundary", codec: H264, sdp: [][]byte{sps, pps},
			aus: [][][]byte{{idr}, {p}, {idr}}, drops: []drop{{0, 0}},
			want: []got{{1, false, []int{1}}, {2, true, []int{7, 8, 5}}},
		},
		{
			name: "a packet lost inside an access unit", codec: H264, sdp: [][]byte{sps, pps},
			aus: [][][]byte{{p}, {idr}, {idr}, {p}, {p}}, drops: []drop{{2, 1}},
			want:     []got{{1, true, []int{7, 8, 5}}, {3, false, []int{1}}, {4, false, []int{1}}},
			wantLost: 1,
		},
		{
			name: "the marker packet lost: two access units cannot be whole", codec: H264, sdp: [][]byte{sps, pps},
			aus: [][][]byte{{p}, {idr}, {idr}, {p}, {p}}, drops: []drop{{2, -1}},
			want:     []got{{1, true, []int{7, 8, 5}}, {4, false, []int{1}}},
			wantLost: 2,
		},
		{
			name: "a whole access unit lost: the next one is given up", codec: H264, sdp: [][]byte{sps, pps},
			aus: [][][]byte{{p}, {idr}, {p}, {p}, {p}, {p}}, dropAUs: []int{2},
			want:     []got{{1, true, []int{7, 8, 5}}, {4, false, []int{1}}, {5, false, []int{1}}},
			wantLost: 1,
		},
		{
			name: "a malformed packet", codec: H264, sdp: [][]byte{sps, pps},
			aus: [][][]byte{{p}, {idr}, {p}, {p}}, corrupt: []drop{{2, 0}},
			want:     []got{{1, true, []int{7, 8, 5}}, {3, false, []int{1}}},
			wantLost: 1,
		},
		{
			// Annex-B cannot carry a NAL unit holding a start code (no
			// emulation prevention) or ending in 00: the access unit is lost.
			name: "a NAL unit holding a start code", codec: H264, sdp: [][]byte{sps, pps},
			aus:      [][][]byte{{p}, {idr}, {{1, 0x30, 0, 0, 1, 0x30}}, {{1, 0x30, 0}}, {{1, 0, 0, 3, 0, 0, 3, 1}}},
			want:     []got{{1, true, []int{7, 8, 5}}, {4, false, []int{1}}},
			wantLost: 2,
		},
		{
			name: "sequence numbers wrap", codec: H264, sdp: [][]byte{sps, pps}, seq0: 65530,
			aus:  [][][]byte{{p}, {idr}, {p}, {p}, {p}},
			want: []got{{1, true, []int{7, 8, 5}}, {2, false, []int{1}}, {3, false, []int{1}}, {4, false, []int{1}}},
		},
		{
			name: "H.265: IRAP types are key frames, VPS/SPS/PPS from the SDP", codec: H265, sdp: [][]byte{vps, sps5, pps5},
			aus: [][][]byte{{nal265(1, 50)}, {nal265(19, 900)}, {nal265(1, 300)}, {nal265(21, 40)}, {nal265(16, 40)}, {nal265(0, 40)}},
			want: []got{{1, true, []int{32, 33, 34, 19}}, {2, false, []int{1}}, {3, true, []int{32, 33, 34, 21}},
				{4, true, []int{32, 33, 34, 16}}, {5, false, []int{0}}},
		},
		{
			name: "H.265: a lost fragment", codec: H265, sdp: [][]byte{vps, sps5, pps5},
			aus: [][][]byte{{nal265(1, 50)}, {nal265(20, 900)}, {nal265(1, 900)}, {nal265(1, 50)}}, drops: []drop{{2, 1}},
			want:     []got{{1, true, []int{32, 33, 34, 20}}, {3, false, []int{1}}},
			wantLost: 1,
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d, err := newDepacketizer(c.codec, c.sdp...)
			if err != nil {
				t.Fatal(err)
			}
			var out []got
			lost := 0
			for i, pkts := range packetize(t, c.codec, c.aus, c.seq0) {
				if containsInt(c.dropAUs, i) {
					continue
				}
				for j, pkt := range pkts {
					dropped := false
					for _, x := range c.drops {
						if x.au == i && (x.pkt == j || x.pkt == -1 && j == len(pkts)-1) {
							dropped = true
						}
					}
					if dropped {
						continue
					}
					for _, x := range c.corrupt {
						if x.au == i && x.pkt == j {
							pkt.Payload = []byte{pkt.Payload[0]&0xe0 | 28} // an FU-A without its header
							if c.codec == H265 {
								pkt.Payload = []byte{49 << 1}
							}
						}
					}
					au, ok := d.packet(pkt)
					lost += d.takeLost()
					if !ok {
						continue
					}
					if au.ts%3000 != 0 {
						t.Fatalf("timestamp %d", au.ts)
					}
					nalus, err := h264.AnnexBUnmarshal(au.data)
					if err != nil || !bytes.HasPrefix(au.data, []byte{0, 0, 0, 1}) {
						t.Fatalf("access unit %d is not Annex-B: %v", au.ts/3000, err)
					}
					g := got{AU: int(au.ts / 3000), Key: au.key}
					for _, n := range nalus {
						g.Types = append(g.Types, d.nalType(n))
					}
					out = append(out, g)
				}
			}
			if diff := cmp.Diff(c.want, out); diff != "" {
				t.Fatalf("access units (-want +got):\n%s", diff)
			}
			if lost != c.wantLost {
				t.Fatalf("lost %d, want %d", lost, c.wantLost)
			}
		})
	}
}

// TestDepacketizerParamsInBand: the parameter sets in front of a key frame
// are the latest seen (the SPS of the first key frame, not the SDP's).
func TestDepacketizerParamsInBand(t *testing.T) {
	sdpSPS, newSPS, pps := nal264(7, 10), nal264(7, 16), nal264(8, 4)
	d, err := newDepacketizer(H264, sdpSPS, pps)
	if err != nil {
		t.Fatal(err)
	}
	var keys [][]byte
	for _, pkts := range packetize(t, H264, [][][]byte{{nal264(1, 10)}, {newSPS, nal264(5, 500)}, {nal264(5, 500)}}, 1) {
		for _, pkt := range pkts {
			if au, ok := d.packet(pkt); ok && au.key {
				keys = append(keys, au.data)
			}
		}
	}
	if len(keys) != 2 {
		t.Fatalf("%d key frames, want 2", len(keys))
	}
	nalus, _ := h264.AnnexBUnmarshal(keys[1])
	if !bytes.Equal(nalus[0], newSPS) || !bytes.Equal(nalus[1], pps) {
		t.Fatal("the second key frame does not carry the SPS seen in band")
	}
}

// FuzzDepacketizer: arbitrary RTP packets (sequence numbers, markers,
// timestamps and payloads from the input) never panic the depacketizer;
// what it hands on is Annex-B whose key flag matches its NAL types, and
// the losses it counts are never negative.
func FuzzDepacketizer(f *testing.F) {
	f.Add([]byte{0x80, 5, 0x7c, 0x85, 1, 2, 3, 0x81, 5, 0x7c, 0x45, 4, 5, 0x80, 1, 0x18, 0, 2, 0x67, 1, 0, 2, 0x68, 2})
	f.Add([]byte{0x81, 3, 0x65, 0, 0, 0x80, 3, 0x62, 1, 0x93, 1, 0x81, 3, 0x28, 1, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, codec := range []string{H264, H265} {
			d, err := newDepacketizer(codec, []byte{0x67, 1}, []byte{0x68}, []byte{}, []byte{0x40, 1})
			if err != nil {
				t.Fatal(err)
			}
			seq, ts := uint16(0), uint32(0)
			for rest := data; len(rest) >= 2; {
				// header byte: bit 7 marker, bit 6 skip a sequence number,
				// bit 5 new timestamp; then the payload length.
				h, n := rest[0], int(rest[1])
				rest = rest[2:]
				n = min(n, len(rest))
				payload := rest[:n]
				rest = rest[n:]
				if h&0x40 != 0 {
					seq++
				}
				if h&0x20 != 0 {
					ts += 3000
				}
				pkt := &rtp.Packet{Header: rtp.Header{Marker: h&0x80 != 0, SequenceNumber: seq, Timestamp: ts}, Payload: payload}
				seq++
				au, ok := d.packet(pkt)
				if d.takeLost() < 0 {
					t.Fatal("negative loss")
				}
				if !ok {
					continue
				}
				nalus, err := h264.AnnexBUnmarshal(au.data)
				if err != nil {
					t.Fatalf("%s: not Annex-B: %v", codec, err)
				}
				key := false
				for _, nl := range nalus {
					if len(nl) == 0 {
						t.Fatalf("%s: an empty NAL unit", codec)
					}
					key = key || d.isKey(d.nalType(nl))
				}
				if key != au.key {
					t.Fatalf("%s: key %v for NAL units %x", codec, au.key, nalus)
				}
			}
		}
	})
}

// BenchmarkDepacketizer: RTP packets of a 640x480-like H.264 stream (a
// 30 kB key frame every 15 access units, 6 kB otherwise, 1,400-byte
// payloads) to Annex-B access units; one op is one access unit.
func BenchmarkDepacketizer(b *testing.B) {
	sps, pps := nal264(7, 12), nal264(8, 4)
	aus := make([][][]byte, 0, 15)
	aus = append(aus, [][]byte{nal264(1, 6000)}) // the boundary the depacketizer starts after
	aus = append(aus, [][]byte{nal264(5, 30000)})
	for range 14 {
		aus = append(aus, [][]byte{nal264(1, 6000)})
	}
	ssrc, seq := uint32(1), uint16(0)
	enc := &rtph264.Encoder{PayloadType: 96, SSRC: &ssrc, InitialSequenceNumber: &seq, PayloadMaxSize: 1400, PacketizationMode: 1}
	if err := enc.Init(); err != nil {
		b.Fatal(err)
	}
	var pkts [][]*rtp.Packet
	for _, au := range aus {
		p, err := enc.Encode(au)
		if err != nil {
			b.Fatal(err)
		}
		pkts = append(pkts, p)
	}
	d, err := newDepacketizer(H264, sps, pps)
	if err != nil {
		b.Fatal(err)
	}
	var bytesOut int64
	b.ReportAllocs()
	b.ResetTimer()
	n := 0
	ts := uint32(0)
	for i := 0; n < b.N; i++ {
		for _, p := range pkts[i%len(pkts)] {
			p.SequenceNumber = seq
			p.Timestamp = ts
			seq++
			if au, ok := d.packet(p); ok {
				bytesOut += int64(len(au.data))
				n++
			}
		}
		ts += 3000
	}
	b.SetBytes(bytesOut / int64(max(n, 1)))
}
