package whip

import (
	"fmt"
	"strings"
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
func h264SPS(w, h int) []byte {
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
	bw.bit(0) // frame_cropping_flag
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
	if w, h, ok := h264KeySize(append([]byte{0, 0, 0, 1}, h264SPS(640, 480)...)); !ok || w != 640 || h != 480 {
		t.Fatalf("the test SPS reads as %dx%d (%v), want 640x480", w, h, ok)
	}
	for _, c := range []struct {
		name    string
		w, h    int
		decoded bool
	}{
		{"16384x16384: refused unread", 16384, 16384, false},
		{"4112x16: refused unread", 4112, 16, false},
		{"640x480: decoded", 640, 480, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, st := testPipelineCodec(t, newSink(), CodecH264)
			d := &countingDecoder{decoder: p.dec}
			p.dec = d
			au := append([]byte{0, 0, 0, 1}, h264SPS(c.w, c.h)...)
			au = append(au, 0, 0, 0, 1, 0x65, 0x88, 0x84, 0x00) // an IDR slice's start
			goesOn := p.frame(codedFrame{Data: au, Key: true}, time.Unix(1e9, 0))
			if goesOn != c.decoded || (d.n > 0) != c.decoded {
				t.Fatalf("goes on %v, decoder calls %d: want %v", goesOn, d.n, c.decoded)
			}
			if c.decoded {
				return
			}
			<-st.done
			st.mu.Lock()
			defer st.mu.Unlock()
			if st.endKind != EndError || !strings.Contains(st.ended, fmt.Sprintf("H.264 SPS declares %dx%d", c.w, c.h)) {
				t.Errorf("ended %q (%s), want an error naming the declared size", st.ended, st.endKind)
			}
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
	<-st.done
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.endKind != EndError || !strings.Contains(st.ended, fmt.Sprintf("%d frames in a row failed to decode", MaxDecodeErrors)) {
		t.Fatalf("ended %q (%s)", st.ended, st.endKind)
	}
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
		if w, h, ok := h264KeySize(b); ok && (w <= 0 || h <= 0) {
			t.Fatalf("h264: %dx%d", w, h)
		}
		if w, h, ok := vp8KeySize(b); ok && (w <= 0 || h <= 0 || w > 0x3fff || h > 0x3fff) {
			t.Fatalf("vp8: %dx%d", w, h)
		}
	})
}
