package whip

import (
	"fmt"
	"testing"
	"time"
)

// bitWriter writes an RBSP MSB first, with Exp-Golomb codes.
type bitWriter struct {
	b []byte
	n int // bits written
}

func (w *bitWriter) bit(v uint) {
	if w.n%8 == 0 {
		w.b = append(w.b, 0)
	}
	if v != 0 {
		w.b[len(w.b)-1] |= 0x80 >> (w.n % 8)
	}
	w.n++
}

func (w *bitWriter) bits(v uint, n int) {
	for i := n - 1; i >= 0; i-- {
		w.bit(v >> i & 1)
	}
}

func (w *bitWriter) ue(v uint) {
	v++
	n := 0
	for x := v; x > 1; x >>= 1 {
		n++
	}
	w.bits(0, n)
	w.bits(v, n+1)
}

// h264SPS is a baseline-profile SPS NAL unit declaring wxh (multiples of 16).
func h264SPS(w, h int) []byte { return h264SPSCropped(w, h, 0, 0) }

// h264SPSCropped is an SPS coded at wxh whose frame cropping shows only
// (w-2*cropX) x (h-2*cropY) (offsets in 4:2:0 units of 2 pixels: cropX/2).
func h264SPSCropped(w, h, cropX, cropY int) []byte {
	bw := &bitWriter{}
	bw.bits(0x67, 8) // forbidden 0, nal_ref_idc 3, type 7 (SPS)
	bw.bits(66, 8)   // profile_idc: baseline
	bw.bits(0xc0, 8) // constraint flags
	bw.bits(31, 8)   // level_idc
	bw.ue(0)         // seq_parameter_set_id
	bw.ue(0)         // log2_max_frame_num_minus4
	bw.ue(2)         // pic_order_cnt_type
	bw.ue(1)         // max_num_ref_frames
	bw.bit(0)        // gaps_in_frame_num_value_allowed_flag
	bw.ue(uint(w/16 - 1))
	bw.ue(uint(h/16 - 1))
	bw.bit(1) // frame_mbs_only_flag
	bw.bit(1) // direct_8x8_inference_flag
	if cropX > 0 || cropY > 0 {
		bw.bit(1) // frame_cropping_flag
		bw.ue(uint(cropX / 2))
		bw.ue(uint(cropX / 2))
		bw.ue(uint(cropY / 2))
		bw.ue(uint(cropY / 2))
	} else {
		bw.bit(0)
	}
	bw.bit(0) // vui_parameters_present_flag
	bw.bit(1) // rbsp_stop_one_bit
	for bw.n%8 != 0 {
		bw.bit(0)
	}
	return bw.b
}

// TestH264DeclaredSizeBeforeDecode (issue 36, finding 5): an H.264 key
// frame's SPS declaring a huge picture is refused from the SPS, before
// the decoder allocates for it; one within the bound reaches the decoder.
func TestH264DeclaredSizeBeforeDecode(t *testing.T) {
	if w, h, dw, dh, ok, err := h264SPSSize(append([]byte{0, 0, 0, 1}, h264SPS(640, 480)...)); !ok || err != nil || w != 640 || h != 480 || dw != 640 || dh != 480 {
		t.Fatalf("the test SPS reads as %dx%d shown %dx%d (%v, %v), want 640x480", w, h, dw, dh, ok, err)
	}
	if w, h, dw, dh, ok, err := h264SPSSize(append([]byte{0, 0, 0, 1}, h264SPSCropped(8192, 8192, 3936, 3976)...)); !ok || err != nil || w != 8192 || h != 8192 || dw != 320 || dh != 240 {
		t.Fatalf("the cropped SPS reads as %dx%d shown %dx%d (%v, %v), want 8192x8192 shown 320x240", w, h, dw, dh, ok, err)
	}
	for _, c := range []struct {
		name    string
		sps     []byte
		key     bool
		decoded bool
		want    string
	}{
		{"16384x16384: refused unread", h264SPS(16384, 16384), true, false, "H.264 SPS declares 16384x16384"},
		{"4112x16: refused unread", h264SPS(4112, 16), true, false, "H.264 SPS declares 4112x16"},
		{"coded 8192x8192 cropped to 320x240: refused unread", h264SPSCropped(8192, 8192, 3936, 3976), true, false, "H.264 SPS declares 8192x8192"},
		{"16384x16384 in an access unit without IDR: refused unread", h264SPS(16384, 16384), false, false, "H.264 SPS declares 16384x16384"},
		{"an SPS cut short before its size: refused unread", h264SPS(640, 480)[:5], true, false, "does not parse as far as its picture size"},
		{"640x480: decoded", h264SPS(640, 480), true, true, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, st := testPipelineCodec(t, newSink(), CodecH264)
			d := &countingDecoder{decoder: p.dec}
			p.dec = d
			if !c.key {
				p.needKey = false // a stream under way: non-IDR units are decoded
			}
			au := append([]byte{0, 0, 0, 1}, c.sps...)
			if c.key {
				au = append(au, 0, 0, 0, 1, 0x65, 0x88, 0x84, 0x00) // an IDR slice's start
			} else {
				au = append(au, 0, 0, 0, 1, 0x41, 0x9a, 0x00, 0x00) // a non-IDR slice's start
			}
			goesOn := p.frame(codedFrame{Data: au, Key: c.key}, time.Unix(1e9, 0))
			if goesOn != c.decoded || (d.n > 0) != c.decoded {
				t.Fatalf("goes on %v, decoder calls %d: want %v", goesOn, d.n, c.decoded)
			}
			if c.decoded {
				return
			}
			endedWith(t, st, c.want)
		})
	}
}

// TestDecodeErrorsEndTheStream (issue 36, finding 5): key frames that
// fail to decode, MaxDecodeErrors in a row, end the stream with the reason
// (before, a sender could make the decoder work on junk for as long as it
// liked); a good frame between resets the run.
func TestDecodeErrorsEndTheStream(t *testing.T) {
	p, st := testPipeline(t, newSink())
	junk := func() codedFrame {
		b := make([]byte, 41)
		b[0] = 0x10
		b[3], b[4], b[5] = 0x9d, 0x01, 0x2a
		b[6], b[8] = 64, 48 // 64x48, then a body libvpx refuses
		for i := 10; i < len(b); i++ {
			b[i] = 0xff
		}
		return codedFrame{Data: b, Key: true}
	}
	now := time.Unix(1e9, 0)
	for i := 1; i < MaxDecodeErrors; i++ {
		if !p.frame(junk(), now) {
			t.Fatalf("the stream ended after %d decode errors, want %d", i, MaxDecodeErrors)
		}
	}
	if p.frame(junk(), now) {
		t.Fatalf("the stream goes on after %d decode errors in a row", MaxDecodeErrors)
	}
	endedWith(t, st, fmt.Sprintf("%d frames in a row failed to decode", MaxDecodeErrors))
	if n := st.c.decodeErrors.Load(); n != MaxDecodeErrors {
		t.Fatalf("%d decode errors counted, want %d", n, MaxDecodeErrors)
	}
}

// FuzzKeySize: the size readers run on a sender's bytes before the
// decoder does; they never panic and say a size only when it is positive.
func FuzzKeySize(f *testing.F) {
	f.Add(append([]byte{0, 0, 0, 1}, h264SPS(640, 480)...))
	f.Add(append([]byte{0, 0, 1}, h264SPS(16384, 16)...))
	f.Add([]byte{0x10, 0, 0, 0x9d, 0x01, 0x2a, 0x80, 0x02, 0xe0, 0x01})
	f.Add([]byte{0, 0, 0, 1, 0x67})
	f.Fuzz(func(t *testing.T, b []byte) {
		if w, h, dw, dh, ok, err := h264SPSSize(b); ok && err == nil && (w <= 0 || h <= 0 || dw <= 0 || dh <= 0 || dw > w || dh > h) {
			t.Fatalf("h264: %dx%d shown %dx%d", w, h, dw, dh)
		}
		if w, h, ok := vp8KeySize(b); ok && (w <= 0 || h <= 0 || w > 0x3fff || h > 0x3fff) {
			t.Fatalf("vp8: %dx%d", w, h)
		}
	})
}
