// Package vpx is a small cgo wrapper around Debian's libvpx (libvpx-dev)
// for VP8: a Decoder for the WebRTC ingest (RTP -> VP8 frames -> BGR
// frames for sessions) and an Encoder for mdag's own client and tests.
// Frames cross the boundary as media.Frame (8-bit BGR), converted from and
// to I420 with BT.601 at limited range (as WebRTC uses): the decoder's
// I420 -> BGR by libswscale (its SIMD path, as ingest/avc converts, so
// VP8 and H.264 pictures of one source come out alike), the encoder's BGR
// -> I420 by exact fixed-point C here.
//
// A Decoder or Encoder is not safe for concurrent use; each stream owns
// one. Decoding outside input is safe: libvpx rejects corrupt data with an
// error (the caller skips the frame and asks for a key frame), and frames
// above MaxPixels are refused before any conversion.
package vpx

/*
#cgo LDFLAGS: -lvpx -lswscale -lavutil
#include <stdlib.h>
#include <string.h>
#include <vpx/vpx_decoder.h>
#include <vpx/vp8dx.h>
#include <vpx/vpx_encoder.h>
#include <vpx/vp8cx.h>
#include <libavutil/pixfmt.h>
#include <libswscale/swscale.h>

// A decoder: libvpx's context and the libswscale context for the last
// picture size (a VP8 stream may change size at a key frame).
typedef struct {
	vpx_codec_ctx_t ctx;
	struct SwsContext *sws;
	int sw, sh;
} mdag_vdec;

static int mdag_dec_init(mdag_vdec *d) {
	vpx_codec_dec_cfg_t cfg = {0};
	cfg.threads = 1;
	return vpx_codec_dec_init(&d->ctx, vpx_codec_vp8_dx(), &cfg, 0);
}

static void mdag_dec_free(mdag_vdec *d) {
	vpx_codec_destroy(&d->ctx);
	sws_freeContext(d->sws);
	free(d);
}

// mdag_bgr_stride is the row stride mdag_i420_to_bgr converts into for
// width w: 3 bytes a pixel for w rounded up to a multiple of 16. The
// x86 yuv2rgb of libswscale 6 (FFmpeg 5.1) converts rows in blocks of 8
// pixels and, where the last block would not fit in the stride, leaves
// the row's last pixels unconverted (a 34-pixel-wide picture kept 2 black
// columns); with room for whole blocks every pixel is converted.
static int mdag_bgr_stride(int w) { return ((w + 15) & ~15) * 3; }

// mdag_i420_to_bgr writes img (I420, planes with strides) as packed BGR,
// rows d_w*3 bytes apart, to dst, which has room for
// mdag_bgr_stride(d_w)*d_h bytes plus MDAG_DST_PAD (libswscale's vector
// code may write a few pixels past the end of a row): converted with that
// stride, then the rows are moved together. BT.601 limited range in, full
// range BGR out, libswscale's fast path (table/SIMD yuv2rgb), as ingest/avc
// converts. 0 or -1.
#define MDAG_DST_PAD 256
static int mdag_i420_to_bgr(mdag_vdec *d, const vpx_image_t *img, uint8_t *dst) {
	int w = img->d_w, h = img->d_h;
	if (d->sws == NULL || d->sw != w || d->sh != h) {
		sws_freeContext(d->sws);
		d->sw = 0; d->sh = 0;
		d->sws = sws_getContext(w, h, AV_PIX_FMT_YUV420P, w, h, AV_PIX_FMT_BGR24, SWS_BILINEAR, NULL, NULL, NULL);
		if (d->sws == NULL) return -1;
		const int *bt601 = sws_getCoefficients(SWS_CS_ITU601);
		if (sws_setColorspaceDetails(d->sws, bt601, 0, bt601, 1, 0, 1 << 16, 1 << 16) < 0) {
			sws_freeContext(d->sws);
			d->sws = NULL;
			return -1;
		}
		d->sw = w; d->sh = h;
	}
	const uint8_t *src[4] = {img->planes[0], img->planes[1], img->planes[2], NULL};
	int sl[4] = {img->stride[0], img->stride[1], img->stride[2], 0};
	int stride = mdag_bgr_stride(w), row = w * 3;
	uint8_t *dd[4] = {dst, NULL, NULL, NULL};
	int dl[4] = {stride, 0, 0, 0};
	if (sws_scale(d->sws, src, sl, 0, h, dd, dl) != h) return -1;
	if (stride != row) {
		// Row y moves from y*stride down to y*row: never over a row not yet moved.
		for (int y = 1; y < h; y++) memmove(dst + (size_t)y * row, dst + (size_t)y * stride, row);
	}
	return 0;
}

static int mdag_enc_init(vpx_codec_ctx_t *ctx, int w, int h, int fps, int kbps, int kf) {
	vpx_codec_enc_cfg_t cfg;
	vpx_codec_err_t err = vpx_codec_enc_config_default(vpx_codec_vp8_cx(), &cfg, 0);
	if (err) return err;
	cfg.g_w = w;
	cfg.g_h = h;
	cfg.g_timebase.num = 1;
	cfg.g_timebase.den = fps;
	cfg.rc_target_bitrate = kbps;
	cfg.rc_end_usage = VPX_CBR;
	cfg.g_lag_in_frames = 0;
	cfg.g_error_resilient = VPX_ERROR_RESILIENT_DEFAULT;
	cfg.kf_mode = VPX_KF_AUTO;
	cfg.kf_max_dist = kf;
	cfg.g_threads = 1;
	err = vpx_codec_enc_init(ctx, vpx_codec_vp8_cx(), &cfg, 0);
	if (err) return err;
	vpx_codec_control(ctx, VP8E_SET_CPUUSED, 8); // realtime speed
	return 0;
}

static const void *mdag_pkt_buf(const vpx_codec_cx_pkt_t *p) { return p->data.frame.buf; }
static size_t mdag_pkt_sz(const vpx_codec_cx_pkt_t *p) { return p->data.frame.sz; }
static long long mdag_pkt_pts(const vpx_codec_cx_pkt_t *p) { return p->data.frame.pts; }
static int mdag_pkt_key(const vpx_codec_cx_pkt_t *p) { return (p->data.frame.flags & VPX_FRAME_IS_KEY) != 0; }

static unsigned char clamp8(int v) { return v < 0 ? 0 : v > 255 ? 255 : (unsigned char)v; }

// packed BGR -> I420 image (allocated by vpx_img_alloc).
static void mdag_bgr_to_i420(const unsigned char *bgr, vpx_image_t *img) {
	int w = img->d_w, h = img->d_h;
	for (int y = 0; y < h; y++) {
		const unsigned char *in = bgr + (size_t)y * w * 3;
		unsigned char *yp = img->planes[0] + y * img->stride[0];
		for (int x = 0; x < w; x++) {
			int b = in[3 * x], g = in[3 * x + 1], r = in[3 * x + 2];
			yp[x] = clamp8(((66 * r + 129 * g + 25 * b + 128) >> 8) + 16);
		}
	}
	for (int y = 0; y < (h + 1) / 2; y++) {
		unsigned char *up = img->planes[1] + y * img->stride[1];
		unsigned char *vp = img->planes[2] + y * img->stride[2];
		for (int x = 0; x < (w + 1) / 2; x++) {
			int b = 0, g = 0, r = 0, n = 0;
			for (int dy = 0; dy < 2; dy++) for (int dx = 0; dx < 2; dx++) {
				int yy = 2 * y + dy, xx = 2 * x + dx;
				if (yy >= h || xx >= w) continue;
				const unsigned char *p = bgr + ((size_t)yy * w + xx) * 3;
				b += p[0]; g += p[1]; r += p[2]; n++;
			}
			b /= n; g /= n; r /= n;
			up[x] = clamp8(((-38 * r - 74 * g + 112 * b + 128) >> 8) + 128);
			vp[x] = clamp8(((112 * r - 94 * g - 18 * b + 128) >> 8) + 128);
		}
	}
}
*/
import "C"

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/mdag/mdag/media"
)

// MaxPixels is the largest frame a Decoder hands out (4K); larger frames
// are refused with ErrTooLarge.
const MaxPixels = 3840 * 2160

// ErrTooLarge is returned for frames above MaxPixels.
var ErrTooLarge = errors.New("vpx: frame above the size limit")

func codecErr(ctx *C.vpx_codec_ctx_t, op string, code C.vpx_codec_err_t) error {
	msg := C.GoString(C.vpx_codec_err_to_string(code))
	if ctx != nil {
		if d := C.vpx_codec_error_detail(ctx); d != nil {
			msg += ": " + C.GoString(d)
		}
	}
	return fmt.Errorf("vpx: %s: %s", op, msg)
}

// Decoder decodes a VP8 stream.
type Decoder struct {
	c      *C.mdag_vdec
	closed bool
}

// NewDecoder returns a VP8 decoder.
func NewDecoder() (*Decoder, error) {
	c := (*C.mdag_vdec)(C.calloc(1, C.size_t(unsafe.Sizeof(C.mdag_vdec{}))))
	if c == nil {
		return nil, errors.New("vpx: decoder init: cannot allocate the decoder")
	}
	if code := C.mdag_dec_init(c); code != 0 {
		C.free(unsafe.Pointer(c))
		return nil, codecErr(nil, "decoder init", C.vpx_codec_err_t(code))
	}
	return &Decoder{c: c}, nil
}

// Decode decodes one VP8 frame (a whole frame as the depacketizer
// assembled it). It returns nil, nil when the data produced no picture.
func (d *Decoder) Decode(data []byte) (*media.Frame, error) {
	return d.decode(data, true)
}

// Skip decodes one frame without converting the picture: for frames a
// stream does not hand on (sampling to the app's rate), which later frames
// still reference.
func (d *Decoder) Skip(data []byte) error {
	_, err := d.decode(data, false)
	return err
}

func (d *Decoder) decode(data []byte, convert bool) (*media.Frame, error) {
	if d.closed {
		return nil, errors.New("vpx: decoder closed")
	}
	if len(data) == 0 {
		return nil, errors.New("vpx: empty frame")
	}
	buf := C.CBytes(data)
	defer C.free(buf)
	ctx := &d.c.ctx
	if code := C.vpx_codec_decode(ctx, (*C.uint8_t)(buf), C.uint(len(data)), nil, 0); code != 0 {
		return nil, codecErr(ctx, "decode", code)
	}
	var iter C.vpx_codec_iter_t
	var out *media.Frame
	for img := C.vpx_codec_get_frame(ctx, &iter); img != nil; img = C.vpx_codec_get_frame(ctx, &iter) {
		if img.fmt != C.VPX_IMG_FMT_I420 {
			return nil, fmt.Errorf("vpx: decoded image format %d, want I420", int(img.fmt))
		}
		w, h := int(img.d_w), int(img.d_h)
		if w <= 0 || h <= 0 || w*h > MaxPixels {
			return nil, fmt.Errorf("%w: %dx%d", ErrTooLarge, w, h)
		}
		if !convert {
			continue
		}
		buf := make([]byte, int(C.mdag_bgr_stride(C.int(w)))*h+C.MDAG_DST_PAD)
		if C.mdag_i420_to_bgr(d.c, img, (*C.uint8_t)(unsafe.Pointer(&buf[0]))) != 0 {
			return nil, fmt.Errorf("vpx: convert %dx%d I420 to BGR: libswscale refused the conversion", w, h)
		}
		out = &media.Frame{W: w, H: h, Pix: buf[:w*h*3]}
	}
	return out, nil
}

// Close frees the decoder.
func (d *Decoder) Close() {
	if d.closed {
		return
	}
	d.closed = true
	C.mdag_dec_free(d.c)
	d.c = nil
}

// Encoder encodes frames of one size to VP8 for real-time streaming.
type Encoder struct {
	ctx    *C.vpx_codec_ctx_t
	img    *C.vpx_image_t
	w, h   int
	closed bool
}

// EncoderConfig configures an Encoder.
type EncoderConfig struct {
	Width, Height int
	FPS           int // time base; default 30
	BitrateKbps   int // target; default 1000
	KeyEvery      int // at most this many frames between key frames; default 2 s of frames
}

// NewEncoder returns a VP8 encoder (CBR, no lag, error resilient, fastest
// speed: the settings of a live camera).
func NewEncoder(cfg EncoderConfig) (*Encoder, error) {
	if cfg.Width <= 0 || cfg.Height <= 0 || cfg.Width*cfg.Height > MaxPixels {
		return nil, fmt.Errorf("vpx: encoder size %dx%d: want 1..%d pixels", cfg.Width, cfg.Height, MaxPixels)
	}
	if cfg.FPS <= 0 {
		cfg.FPS = 30
	}
	if cfg.BitrateKbps <= 0 {
		cfg.BitrateKbps = 1000
	}
	if cfg.KeyEvery <= 0 {
		cfg.KeyEvery = 2 * cfg.FPS
	}
	ctx := (*C.vpx_codec_ctx_t)(C.calloc(1, C.size_t(unsafe.Sizeof(C.vpx_codec_ctx_t{}))))
	if code := C.mdag_enc_init(ctx, C.int(cfg.Width), C.int(cfg.Height), C.int(cfg.FPS), C.int(cfg.BitrateKbps), C.int(cfg.KeyEvery)); code != 0 {
		C.free(unsafe.Pointer(ctx))
		return nil, codecErr(nil, "encoder init", C.vpx_codec_err_t(code))
	}
	img := C.vpx_img_alloc(nil, C.VPX_IMG_FMT_I420, C.uint(cfg.Width), C.uint(cfg.Height), 16)
	if img == nil {
		C.vpx_codec_destroy(ctx)
		C.free(unsafe.Pointer(ctx))
		return nil, errors.New("vpx: cannot allocate the encoder's image")
	}
	return &Encoder{ctx: ctx, img: img, w: cfg.Width, h: cfg.Height}, nil
}

// Encoded is one compressed frame.
type Encoded struct {
	Data []byte
	Key  bool
	PTS  int64
}

// Encode compresses f (which must be the encoder's size) at pts (in frames
// of the time base); key forces a key frame (answering a PLI).
func (e *Encoder) Encode(f *media.Frame, pts int64, key bool) ([]Encoded, error) {
	if e.closed {
		return nil, errors.New("vpx: encoder closed")
	}
	if err := f.Valid(); err != nil {
		return nil, fmt.Errorf("vpx: encode: %w", err)
	}
	if f.W != e.w || f.H != e.h {
		return nil, fmt.Errorf("vpx: encode: frame %dx%d, encoder is %dx%d", f.W, f.H, e.w, e.h)
	}
	C.mdag_bgr_to_i420((*C.uchar)(unsafe.Pointer(&f.Pix[0])), e.img)
	var flags C.vpx_enc_frame_flags_t
	if key {
		flags = C.VPX_EFLAG_FORCE_KF
	}
	if code := C.vpx_codec_encode(e.ctx, e.img, C.vpx_codec_pts_t(pts), 1, flags, C.VPX_DL_REALTIME); code != 0 {
		return nil, codecErr(e.ctx, "encode", code)
	}
	var out []Encoded
	var iter C.vpx_codec_iter_t
	for pkt := C.vpx_codec_get_cx_data(e.ctx, &iter); pkt != nil; pkt = C.vpx_codec_get_cx_data(e.ctx, &iter) {
		if pkt.kind != C.VPX_CODEC_CX_FRAME_PKT {
			continue
		}
		out = append(out, Encoded{Data: C.GoBytes(C.mdag_pkt_buf(pkt), C.int(C.mdag_pkt_sz(pkt))), Key: C.mdag_pkt_key(pkt) != 0, PTS: int64(C.mdag_pkt_pts(pkt))})
	}
	return out, nil
}

// Close frees the encoder.
func (e *Encoder) Close() {
	if e.closed {
		return
	}
	e.closed = true
	C.vpx_img_free(e.img)
	C.vpx_codec_destroy(e.ctx)
	C.free(unsafe.Pointer(e.ctx))
}
