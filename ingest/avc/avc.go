// Package avc is a small cgo binding to Debian's FFmpeg libraries
// (libavcodec, libavutil, libswscale) for H.264 and H.265: a Decoder for
// the ingest (WHIP with H.264, RTSP cameras with H.264 or H.265: access
// units in Annex-B form -> BGR frames for sessions) and an H.264 Encoder
// (libx264 through libavcodec) for mdag's own client and tests. Frames
// cross the boundary as media.Frame (8-bit BGR); the colour conversion is
// libswscale's.
//
// A Decoder or Encoder is not safe for concurrent use; each stream owns
// one. Decoding outside input is safe: damaged data gives an error (the
// caller counts it and asks for a key frame), and pictures above MaxPixels
// are refused with ErrTooLarge before any conversion; libavcodec itself is
// told to refuse pictures much larger than that before it allocates them.
//
// The package replaces libavutil's log callback (process wide, again with
// every new Decoder or Encoder) with one that prints nothing and keeps, per
// thread, the first error-level message of the current call, so that
// errors carry libavcodec's detail (and its refusal of an oversized
// picture is known as ErrTooLarge) and a corrupt stream does not flood
// stderr.
package avc

/*
#cgo LDFLAGS: -lavcodec -lavutil -lswscale
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <libavcodec/avcodec.h>
#include <libavutil/avutil.h>
#include <libavutil/error.h>
#include <libavutil/frame.h>
#include <libavutil/log.h>
#include <libavutil/mem.h>
#include <libavutil/opt.h>
#include <libavutil/pixdesc.h>
#include <libswscale/swscale.h>

// The first error-level message logged on this thread during the current
// call into this package, and whether it was libavutil's refusal of a
// picture above the decoder's max_pixels.
static __thread char mdag_msg[256];
static __thread int mdag_toolarge;

static void mdag_log(void *avcl, int level, const char *fmt, va_list vl) {
	(void)avcl;
	if (level > AV_LOG_ERROR || fmt == NULL) return;
	int toolarge = strstr(fmt, "max pixel count") != NULL;
	if (mdag_msg[0] != 0 && !(toolarge && !mdag_toolarge)) return; // keep the first (the cause), or the size refusal
	if (toolarge) mdag_toolarge = 1;
	vsnprintf(mdag_msg, sizeof mdag_msg, fmt, vl);
	size_t n = strlen(mdag_msg);
	while (n > 0 && (mdag_msg[n-1] == '\n' || mdag_msg[n-1] == '\r' || mdag_msg[n-1] == ' ')) mdag_msg[--n] = 0;
}

static void mdag_log_init(void) {
	av_log_set_level(AV_LOG_ERROR);
	av_log_set_callback(mdag_log);
}

static void mdag_call_begin(void) { mdag_msg[0] = 0; mdag_toolarge = 0; }

typedef struct {
	int got;      // pictures received in this call
	int damaged;  // of which flagged as damaged (concealed errors, missing references)
	int toolarge; // libavcodec refused a picture above max_pixels
	int w, h;     // the last picture's size
	long long pts; // the last picture's pts: the one given with the access unit it came from
	char msg[256];
} mdag_result;

static void mdag_call_end(mdag_result *r) {
	r->toolarge = mdag_toolarge;
	memcpy(r->msg, mdag_msg, sizeof r->msg);
	r->msg[sizeof r->msg - 1] = 0;
}

static void mdag_strerror(int code, char *buf, size_t n) { av_strerror(code, buf, n); }

typedef struct {
	AVCodecContext *ctx;
	AVPacket *pkt;
	AVFrame *frm, *last;
	uint8_t *buf;
	int cap;
	struct SwsContext *sws;
	int sw, sh, sfmt, scs, srange;
} mdag_dec;

static void mdag_dec_free(mdag_dec *d) {
	avcodec_free_context(&d->ctx);
	av_packet_free(&d->pkt);
	av_frame_free(&d->frm);
	av_frame_free(&d->last);
	av_freep(&d->buf);
	sws_freeContext(d->sws);
	d->sws = NULL;
	free(d);
}

static int mdag_dec_open(mdag_dec **out, int codec_id, long long max_pixels) {
	mdag_dec *d = calloc(1, sizeof *d);
	if (d == NULL) return AVERROR(ENOMEM);
	const AVCodec *c = avcodec_find_decoder(codec_id);
	if (c == NULL) { free(d); return AVERROR_DECODER_NOT_FOUND; }
	d->ctx = avcodec_alloc_context3(c);
	d->pkt = av_packet_alloc();
	d->frm = av_frame_alloc();
	d->last = av_frame_alloc();
	if (d->ctx == NULL || d->pkt == NULL || d->frm == NULL || d->last == NULL) { mdag_dec_free(d); return AVERROR(ENOMEM); }
	d->ctx->thread_count = 1;
	d->ctx->thread_type = 0;
	d->ctx->flags |= AV_CODEC_FLAG_LOW_DELAY;
	d->ctx->max_pixels = max_pixels;
	if (codec_id == AV_CODEC_ID_HEVC) d->ctx->err_recognition |= AV_EF_EXPLODE;
	int err = avcodec_open2(d->ctx, c, NULL);
	if (err < 0) { mdag_dec_free(d); return err; }
	*out = d;
	return 0;
}

// mdag_dec_buf returns the decoder's input buffer with room for n bytes and
// the zeroed padding libavcodec reads past the end of its input.
static uint8_t *mdag_dec_buf(mdag_dec *d, int n) {
	if (n > d->cap) {
		av_freep(&d->buf);
		d->cap = 0;
		d->buf = av_malloc((size_t)n + AV_INPUT_BUFFER_PADDING_SIZE);
		if (d->buf == NULL) return NULL;
		d->cap = n;
	}
	memset(d->buf + n, 0, AV_INPUT_BUFFER_PADDING_SIZE);
	return d->buf;
}

static int mdag_dec_receive(mdag_dec *d, mdag_result *r) {
	for (;;) {
		int err = avcodec_receive_frame(d->ctx, d->frm);
		if (err == AVERROR(EAGAIN) || err == AVERROR_EOF) return 0;
		if (err < 0) return err;
		if (d->frm->decode_error_flags != 0 || (d->frm->flags & AV_FRAME_FLAG_CORRUPT) != 0) r->damaged++;
		av_frame_unref(d->last);
		av_frame_move_ref(d->last, d->frm);
		r->got++;
		r->w = d->last->width;
		r->h = d->last->height;
		r->pts = d->last->best_effort_timestamp != AV_NOPTS_VALUE ? d->last->best_effort_timestamp : d->last->pts;
	}
}

// mdag_dec_decode sends the n bytes in d->buf as one packet and receives
// every picture it completes; the last one is kept in d->last.
static int mdag_dec_decode(mdag_dec *d, int n, long long pts, mdag_result *r) {
	mdag_call_begin();
	av_frame_unref(d->last);
	d->pkt->data = d->buf;
	d->pkt->size = n;
	d->pkt->pts = pts;
	d->pkt->dts = AV_NOPTS_VALUE;
	int err = avcodec_send_packet(d->ctx, d->pkt);
	if (err == AVERROR(EAGAIN)) { // not expected: every call drains; drain and send again
		err = mdag_dec_receive(d, r);
		if (err == 0) err = avcodec_send_packet(d->ctx, d->pkt);
	}
	if (err == 0) err = mdag_dec_receive(d, r);
	d->pkt->data = NULL;
	d->pkt->size = 0;
	mdag_call_end(r);
	if (err < 0) av_frame_unref(d->last);
	return err;
}

static int mdag_sws_cs(int spc) {
	switch (spc) {
	case AVCOL_SPC_BT709: return SWS_CS_ITU709;
	case AVCOL_SPC_FCC: return SWS_CS_FCC;
	case AVCOL_SPC_SMPTE240M: return SWS_CS_SMPTE240M;
	case AVCOL_SPC_BT2020_NCL:
	case AVCOL_SPC_BT2020_CL: return SWS_CS_BT2020;
	default: return SWS_CS_ITU601; // unspecified, BT.601 (BT470BG, SMPTE170M)
	}
}

static int mdag_full_range(const AVFrame *f) {
	switch (f->format) {
	case AV_PIX_FMT_YUVJ420P:
	case AV_PIX_FMT_YUVJ422P:
	case AV_PIX_FMT_YUVJ444P:
	case AV_PIX_FMT_YUVJ440P:
	case AV_PIX_FMT_YUVJ411P:
		return 1;
	}
	return f->color_range == AVCOL_RANGE_JPEG;
}

// mdag_dec_stride is the row stride mdag_dec_convert converts into:
// libswscale (FFmpeg 5.1, x86) converts rows in blocks of 8 pixels and
// leaves the last pixels of a row unconverted (black) where the last block
// would not fit in the stride (widths like 34 or 854), so it converts at a
// stride of whole 16-pixel blocks and the rows are moved together after.
static int mdag_dec_stride(int w) { return ((w + 15) & ~15) * 3; }

// mdag_dec_convert writes d->last as packed BGR (stride w*3) to dst, which
// has room for mdag_dec_stride(w)*h bytes plus MDAG_DST_PAD (libswscale's
// vector code may write a few pixels past the end of a row).
#define MDAG_DST_PAD 256
static int mdag_dec_convert(mdag_dec *d, uint8_t *dst) {
	mdag_call_begin();
	const AVFrame *f = d->last;
	int w = f->width, h = f->height, cs = mdag_sws_cs(f->colorspace), full = mdag_full_range(f);
	if (d->sws == NULL || d->sw != w || d->sh != h || d->sfmt != f->format || d->scs != cs || d->srange != full) {
		sws_freeContext(d->sws);
		// The fast path (libswscale's table/SIMD yuv2rgb for 4:2:0): within
		// about 2 levels of the exact conversion; SWS_ACCURATE_RND |
		// SWS_FULL_CHR_H_INT is exact but halves H.264 decode throughput.
		d->sws = sws_getContext(w, h, f->format, w, h, AV_PIX_FMT_BGR24, SWS_BILINEAR, NULL, NULL, NULL);
		if (d->sws == NULL) return AVERROR(EINVAL);
		d->sw = w; d->sh = h; d->sfmt = f->format; d->scs = cs; d->srange = full;
		// BT.601 limited range for ordinary streams, as the VP8 path converts.
		sws_setColorspaceDetails(d->sws, sws_getCoefficients(cs), full, sws_getCoefficients(SWS_CS_ITU601), 1, 0, 1 << 16, 1 << 16);
	}
	int stride = mdag_dec_stride(w), row = w * 3;
	uint8_t *dd[4] = {dst, NULL, NULL, NULL};
	int dl[4] = {stride, 0, 0, 0};
	int got = sws_scale(d->sws, (const uint8_t *const *)f->data, f->linesize, 0, h, dd, dl);
	av_frame_unref(d->last);
	if (got != h) return AVERROR(EINVAL);
	if (stride != row) {
		// Row y moves from y*stride down to y*row: never over a row not yet moved.
		for (int y = 1; y < h; y++) memmove(dst + (size_t)y * row, dst + (size_t)y * stride, row);
	}
	return 0;
}

static const char *mdag_pix_fmt_name(int f) {
	const char *n = av_get_pix_fmt_name(f);
	return n ? n : "unknown";
}

static int mdag_last_format(mdag_dec *d) { return d->last->format; }

typedef struct {
	AVCodecContext *ctx;
	AVFrame *frm;
	AVPacket *pkt;
	int deep;                 // 10-bit samples (yuv420p10le): 8-bit values shifted up
	int yr, yg, yb, yoff;     // Y  = (yr R + yg G + yb B + yoff) >> 16
	int ur, ug, ub, vr, vg, vb; // Cb, Cr = 128 + (.. + 32768) >> 16
} mdag_enc;

static void mdag_enc_free(mdag_enc *e) {
	avcodec_free_context(&e->ctx);
	av_frame_free(&e->frm);
	av_packet_free(&e->pkt);
	free(e);
}

static unsigned char mdag_clamp8(int v) { return v < 0 ? 0 : v > 255 ? 255 : (unsigned char)v; }

// mdag_enc_matrix sets the fixed-point RGB -> YCbCr coefficients (16
// fractional bits) of colour space spc, limited or full range.
static void mdag_enc_matrix(mdag_enc *e, int spc, int full) {
	double kr = 0.299, kb = 0.114; // BT.601
	if (spc == AVCOL_SPC_BT709) { kr = 0.2126; kb = 0.0722; }
	double kg = 1 - kr - kb;
	double ys = full ? 1.0 : 219.0 / 255.0, cs = full ? 1.0 : 224.0 / 255.0;
	double f = 65536;
	e->yr = (int)(kr * ys * f + 0.5); e->yg = (int)(kg * ys * f + 0.5); e->yb = (int)(kb * ys * f + 0.5);
	e->yoff = (full ? 0 : 16 << 16) + 32768;
	double u = cs / (2 * (1 - kb)), v = cs / (2 * (1 - kr));
	e->ur = (int)(-kr * u * f - 0.5); e->ug = (int)(-kg * u * f - 0.5); e->ub = (int)((1 - kb) * u * f + 0.5);
	e->vr = (int)((1 - kr) * v * f + 0.5); e->vg = (int)(-kg * v * f - 0.5); e->vb = (int)(-kb * v * f - 0.5);
}

static void mdag_put(const mdag_enc *e, uint8_t *row, int x, int val) {
	if (e->deep) ((uint16_t *)row)[x] = (uint16_t)(val << 2);
	else row[x] = (uint8_t)val;
}

// mdag_bgr_to_yuv420 converts packed BGR (w*h*3 bytes) into the encoder's
// picture: luma per pixel, chroma from the mean of each 2x2 block.
static void mdag_bgr_to_yuv420(const mdag_enc *e, const uint8_t *bgr, AVFrame *p) {
	int w = p->width, h = p->height;
	for (int y = 0; y < h; y++) {
		const uint8_t *in = bgr + (size_t)y * w * 3;
		uint8_t *row = p->data[0] + (size_t)y * p->linesize[0];
		for (int x = 0; x < w; x++) {
			int b = in[3 * x], g = in[3 * x + 1], r = in[3 * x + 2];
			mdag_put(e, row, x, mdag_clamp8((e->yr * r + e->yg * g + e->yb * b + e->yoff) >> 16));
		}
	}
	for (int y = 0; y < h / 2; y++) {
		const uint8_t *i0 = bgr + (size_t)(2 * y) * w * 3, *i1 = i0 + (size_t)w * 3;
		uint8_t *ur = p->data[1] + (size_t)y * p->linesize[1], *vr = p->data[2] + (size_t)y * p->linesize[2];
		for (int x = 0; x < w / 2; x++) {
			const uint8_t *a = i0 + 6 * x, *c = i1 + 6 * x;
			int b = a[0] + a[3] + c[0] + c[3], g = a[1] + a[4] + c[1] + c[4], r = a[2] + a[5] + c[2] + c[5];
			// sums of four: (coef * sum/4) in 16.16 is (coef * sum) >> 18
			mdag_put(e, ur, x, mdag_clamp8(128 + ((e->ur * r + e->ug * g + e->ub * b + (1 << 17)) >> 18)));
			mdag_put(e, vr, x, mdag_clamp8(128 + ((e->vr * r + e->vg * g + e->vb * b + (1 << 17)) >> 18)));
		}
	}
}

// mdag_enc_open opens encoder name (libx264, libx265) for w x h BGR input
// (even sides) converted to pix_fmt (yuv420p or yuv420p10le) with the
// matrix of colour space spc (an AVColorSpace: BT.601 or BT.709) in
// limited or full range, both signalled in the stream; opts are
// "key=value" pairs separated by '\n' set on the encoder's private options.
static int mdag_enc_open(mdag_enc **out, const char *name, int w, int h, int fps, int kbps, int keyint, int pix_fmt, int bframes, int spc, int full, const char *opts) {
	mdag_call_begin();
	if (pix_fmt != AV_PIX_FMT_YUV420P && pix_fmt != AV_PIX_FMT_YUV420P10LE) return AVERROR(EINVAL);
	mdag_enc *e = calloc(1, sizeof *e);
	if (e == NULL) return AVERROR(ENOMEM);
	const AVCodec *c = avcodec_find_encoder_by_name(name);
	if (c == NULL) { free(e); return AVERROR_ENCODER_NOT_FOUND; }
	e->ctx = avcodec_alloc_context3(c);
	e->frm = av_frame_alloc();
	e->pkt = av_packet_alloc();
	if (e->ctx == NULL || e->frm == NULL || e->pkt == NULL) { mdag_enc_free(e); return AVERROR(ENOMEM); }
	e->deep = pix_fmt == AV_PIX_FMT_YUV420P10LE;
	mdag_enc_matrix(e, spc, full);
	AVCodecContext *x = e->ctx;
	x->width = w;
	x->height = h;
	x->pix_fmt = pix_fmt;
	x->time_base = (AVRational){1, fps};
	x->framerate = (AVRational){fps, 1};
	x->bit_rate = (int64_t)kbps * 1000;
	x->rc_max_rate = x->bit_rate;
	x->rc_buffer_size = (int)(x->bit_rate); // one second of video
	x->gop_size = keyint;
	x->max_b_frames = bframes;
	x->thread_count = 1;
	x->color_range = full ? AVCOL_RANGE_JPEG : AVCOL_RANGE_MPEG;
	x->colorspace = spc;
	x->color_primaries = spc == AVCOL_SPC_BT709 ? AVCOL_PRI_BT709 : AVCOL_PRI_SMPTE170M;
	x->color_trc = spc == AVCOL_SPC_BT709 ? AVCOL_TRC_BT709 : AVCOL_TRC_SMPTE170M;
	int err = 0;
	char *all = strdup(opts), *save = NULL;
	if (all == NULL) { mdag_enc_free(e); return AVERROR(ENOMEM); }
	for (char *kv = strtok_r(all, "\n", &save); kv != NULL && err >= 0; kv = strtok_r(NULL, "\n", &save)) {
		char *eq = strchr(kv, '=');
		if (eq == NULL) { err = AVERROR(EINVAL); break; }
		*eq = 0;
		err = av_opt_set(x->priv_data, kv, eq + 1, 0);
	}
	free(all);
	if (err >= 0) err = avcodec_open2(x, c, NULL);
	if (err >= 0) {
		e->frm->format = pix_fmt;
		e->frm->width = w;
		e->frm->height = h;
		err = av_frame_get_buffer(e->frm, 0);
	}
	if (err < 0) { mdag_enc_free(e); return err; }
	*out = e;
	return 0;
}

// mdag_enc_send converts the packed BGR picture at bgr (w*h*3 bytes) and
// sends it to the encoder.
static int mdag_enc_send(mdag_enc *e, const uint8_t *bgr, long long pts, int key, mdag_result *r) {
	mdag_call_begin();
	int err = av_frame_make_writable(e->frm);
	if (err >= 0) {
		mdag_bgr_to_yuv420(e, bgr, e->frm);
		e->frm->pts = pts;
		e->frm->pict_type = key ? AV_PICTURE_TYPE_I : AV_PICTURE_TYPE_NONE;
		err = avcodec_send_frame(e->ctx, e->frm);
	}
	mdag_call_end(r);
	return err;
}

// mdag_enc_receive takes the next packet into e->pkt: 0, AVERROR(EAGAIN)
// when there is none, or an error.
static int mdag_enc_receive(mdag_enc *e, mdag_result *r) {
	mdag_call_begin();
	av_packet_unref(e->pkt);
	int err = avcodec_receive_packet(e->ctx, e->pkt);
	mdag_call_end(r);
	return err;
}

static void *mdag_pkt_data(mdag_enc *e) { return e->pkt->data; }
static int mdag_pkt_size(mdag_enc *e) { return e->pkt->size; }
static long long mdag_pkt_pts(mdag_enc *e) { return e->pkt->pts; }
static int mdag_pkt_key(mdag_enc *e) { return (e->pkt->flags & AV_PKT_FLAG_KEY) != 0; }

static int mdag_eagain(void) { return AVERROR(EAGAIN); }
*/
import "C"

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"unsafe"

	"github.com/mdag/mdag/media"
)

// Codec names a video compression format.
type Codec int

// The codecs the Decoder reads.
const (
	H264 Codec = iota + 1
	H265
)

func (c Codec) String() string {
	switch c {
	case H264:
		return "H264"
	case H265:
		return "H265"
	}
	return fmt.Sprintf("Codec(%d)", int(c))
}

// ParseCodec reads a codec name: "h264", "avc" (H264) or "h265", "hevc"
// (H265), in any case.
func ParseCodec(s string) (Codec, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "h264", "h.264", "avc":
		return H264, nil
	case "h265", "h.265", "hevc":
		return H265, nil
	}
	return 0, fmt.Errorf("avc: codec %q: want h264 (avc) or h265 (hevc)", s)
}

func (c Codec) id() (C.int, bool) {
	switch c {
	case H264:
		return C.AV_CODEC_ID_H264, true
	case H265:
		return C.AV_CODEC_ID_HEVC, true
	}
	return 0, false
}

// MaxPixels is the largest picture a Decoder hands out (4K); larger
// pictures are refused with ErrTooLarge.
const MaxPixels = 3840 * 2160

// maxDecodePixels is what libavcodec itself is told to refuse (before it
// allocates): above MaxPixels, since its check counts the picture's width
// rounded up for alignment; sizes between the two are decoded and then
// refused by the exact check.
const maxDecodePixels = MaxPixels + MaxPixels/8

// maxAU bounds one access unit (a 4K intra picture at very high quality
// stays well below it).
const maxAU = 32 << 20

// ErrTooLarge is returned for pictures above MaxPixels.
var ErrTooLarge = errors.New("avc: picture above the size limit")

// quietLogs installs the package's log callback. Every new Decoder and
// Encoder installs it again: OpenCV's FFmpeg backend (gocv's VideoCapture,
// used by mdag client) installs its own when it first opens a file, and
// without ours a refusal by size would read as a plain decode error.
func quietLogs() { C.mdag_log_init() }

func avErr(code C.int) string {
	var buf [128]C.char
	C.mdag_strerror(code, &buf[0], C.size_t(len(buf)))
	return C.GoString(&buf[0])
}

// callErr is libavcodec's error code with the message it logged, if any.
func callErr(prefix string, code C.int, r *C.mdag_result) error {
	msg := avErr(code)
	if r != nil {
		if detail := C.GoString(&r.msg[0]); detail != "" && detail != msg {
			msg += " (" + detail + ")"
		}
	}
	return fmt.Errorf("%s: %s", prefix, msg)
}

// Decoder decodes one H.264 or H.265 stream.
//
// It runs libavcodec with one thread: the ingest admits streams by CPU
// load and accounts CPU per stream, which a private thread pool per
// decoder would hide and oversubscribe (N streams x T threads on the same
// cores); frame threads would also add a frame of delay per thread, and
// slice threads help only streams coded with many slices. Many streams
// use the cores in parallel instead. Low delay is on: pictures are handed
// out as soon as they are decoded (streams with B-frames still come out
// in display order when their SPS declares the reordering, as x264's and
// x265's do).
//
// Damage: an H.264 picture that libavcodec concealed errors in is
// returned as an error; H.265 (whose decoder conceals nothing and flags
// nothing) runs with AV_EF_EXPLODE, so a damaged slice fails the access
// unit. Pictures that only reference a damaged one decode without error:
// after an error the caller drops access units until IsKeyFrame (as
// ingest/whip does for VP8) and asks the sender for a key frame.
type Decoder struct {
	c      *C.mdag_dec
	codec  Codec
	closed bool
	// pts stamps Decode's and Skip's access units in order; lastPTS is
	// the stamp of the last picture libavcodec gave back.
	pts, lastPTS int64
}

// NewDecoder returns a decoder for c.
func NewDecoder(c Codec) (*Decoder, error) {
	id, ok := c.id()
	if !ok {
		return nil, fmt.Errorf("avc: decoder for %v: want H264 or H265", c)
	}
	quietLogs()
	var d *C.mdag_dec
	if code := C.mdag_dec_open(&d, id, C.longlong(maxDecodePixels)); code < 0 {
		return nil, callErr(fmt.Sprintf("avc: %v decoder init", c), code, nil)
	}
	return &Decoder{c: d, codec: c}, nil
}

// Decode decodes one access unit in Annex-B form (a start code before each
// NAL unit; parameter sets in band as they arrive). It returns nil, nil
// when the access unit completed no picture (parameter sets only, or the
// decoder's delay). A damaged picture (concealed errors, a missing
// reference) is an error: the caller asks for a key frame.
func (d *Decoder) Decode(au []byte) (*media.Frame, error) {
	return d.decode(au, true)
}

// Skip decodes one access unit without converting the picture: for frames
// a stream does not hand on (sampling to the app's rate) that later frames
// still reference.
func (d *Decoder) Skip(au []byte) error {
	_, _, err := d.decodeAt(au, d.nextPTS(), false)
	return err
}

// DecodeAt is Decode for streams whose pictures may come out of order (B
// frames): au is given a presentation stamp pts (any increasing numbers,
// e.g. the RTP timestamps), and the picture returned, if any, carries the
// stamp of the access unit it was coded in, which with B-frames is an
// earlier one.
func (d *Decoder) DecodeAt(au []byte, pts int64) (*media.Frame, int64, error) {
	return d.decodeAt(au, pts, true)
}

// SkipAt is Skip with a presentation stamp (see DecodeAt).
func (d *Decoder) SkipAt(au []byte, pts int64) error {
	_, _, err := d.decodeAt(au, pts, false)
	return err
}

// nextPTS stamps the access units of Decode and Skip: in order.
func (d *Decoder) nextPTS() int64 {
	d.pts++
	return d.pts
}

func (d *Decoder) decode(au []byte, convert bool) (*media.Frame, error) {
	f, _, err := d.decodeAt(au, d.nextPTS(), convert)
	return f, err
}

func (d *Decoder) decodeAt(au []byte, pts int64, convert bool) (*media.Frame, int64, error) {
	f, err := d.decodeStamped(au, pts, convert)
	return f, d.lastPTS, err
}

func (d *Decoder) decodeStamped(au []byte, pts int64, convert bool) (*media.Frame, error) {
	if d.closed {
		return nil, fmt.Errorf("avc: %v decoder closed", d.codec)
	}
	if len(au) == 0 {
		return nil, fmt.Errorf("avc: %v: empty access unit", d.codec)
	}
	if len(au) > maxAU {
		return nil, fmt.Errorf("avc: %v: access unit of %d bytes, above the %d-byte limit", d.codec, len(au), maxAU)
	}
	if startCode(au) == 0 {
		return nil, fmt.Errorf("avc: %v: access unit does not begin with an Annex-B start code (00 00 01), begins % x", d.codec, au[:min(len(au), 4)])
	}
	if err := checkNALs(d.codec, au); err != nil {
		return nil, err
	}
	buf := C.mdag_dec_buf(d.c, C.int(len(au)))
	if buf == nil {
		return nil, fmt.Errorf("avc: %v: cannot allocate %d bytes for an access unit", d.codec, len(au))
	}
	C.memcpy(unsafe.Pointer(buf), unsafe.Pointer(&au[0]), C.size_t(len(au)))
	var r C.mdag_result
	code := C.mdag_dec_decode(d.c, C.int(len(au)), C.longlong(pts), &r)
	d.lastPTS = int64(r.pts)
	if r.toolarge != 0 {
		return nil, fmt.Errorf("%w: %v: %s", ErrTooLarge, d.codec, C.GoString(&r.msg[0]))
	}
	if code < 0 {
		return nil, callErr(fmt.Sprintf("avc: %v: decode", d.codec), code, &r)
	}
	if r.got == 0 {
		return nil, nil
	}
	w, h := int(r.w), int(r.h)
	if w <= 0 || h <= 0 || w*h > MaxPixels {
		return nil, fmt.Errorf("%w: %v: %dx%d, at most %d pixels", ErrTooLarge, d.codec, w, h, MaxPixels)
	}
	if r.damaged != 0 {
		detail := ""
		if m := C.GoString(&r.msg[0]); m != "" {
			detail = ": " + m
		}
		return nil, fmt.Errorf("avc: %v: damaged picture (concealed errors or a missing reference)%s", d.codec, detail)
	}
	if !convert {
		return nil, nil
	}
	n := w * h * 3
	pix := make([]byte, int(C.mdag_dec_stride(C.int(w)))*h+C.MDAG_DST_PAD)
	if code := C.mdag_dec_convert(d.c, (*C.uint8_t)(unsafe.Pointer(&pix[0]))); code < 0 {
		return nil, fmt.Errorf("avc: %v: convert %dx%d %s to BGR: %s", d.codec, w, h, C.GoString(C.mdag_pix_fmt_name(C.mdag_last_format(d.c))), avErr(code))
	}
	return &media.Frame{W: w, H: h, Pix: pix[:n:n]}, nil
}

// Close frees the decoder; it may be called more than once.
func (d *Decoder) Close() {
	if d.closed {
		return
	}
	d.closed = true
	C.mdag_dec_free(d.c)
	d.c = nil
}

// startCode is the length of the Annex-B start code at the beginning of b
// (3 or 4), or 0.
func startCode(b []byte) int {
	switch {
	case len(b) >= 4 && b[0] == 0 && b[1] == 0 && b[2] == 0 && b[3] == 1:
		return 4
	case len(b) >= 3 && b[0] == 0 && b[1] == 0 && b[2] == 1:
		return 3
	}
	return 0
}

var startCode3 = []byte{0, 0, 1}

// eachNAL calls f with the offset and the bytes (up to the next start
// code) of every NAL unit in the Annex-B data b, until f returns false.
// The bytes may end in the zero bytes before the next four-byte start code.
func eachNAL(b []byte, f func(off int, nal []byte) bool) {
	i := bytes.Index(b, startCode3)
	for i >= 0 {
		start := i + 3
		next := bytes.Index(b[start:], startCode3)
		end := len(b)
		if next >= 0 {
			end = start + next
		}
		if !f(start, b[start:end]) || next < 0 {
			return
		}
		i = end
	}
}

// IsKeyFrame reports whether the Annex-B access unit au holds a picture
// that decoding can start from: an IDR slice for H.264 (NAL type 5), an
// IRAP picture for H.265 (NAL types 16 to 21).
func IsKeyFrame(c Codec, au []byte) bool {
	key := false
	eachNAL(au, func(_ int, nal []byte) bool {
		if len(nal) == 0 {
			return true
		}
		switch c {
		case H264:
			key = nal[0]&0x1f == 5
		case H265:
			t := (nal[0] >> 1) & 0x3f
			key = t >= 16 && t <= 21
		}
		return !key
	})
	return key
}

// checkNALs rejects access units that cannot be a stream's: a NAL unit
// with its forbidden bit set (RFC 6184 and 7798 use it to mark damaged
// units), an H.265 header with a zero temporal id, or no NAL unit of a
// type the decoder reads (H.264 1 to 23; H.265 base layer 0 to 40), which
// libavcodec would pass over silently.
func checkNALs(c Codec, au []byte) error {
	var err error
	known := false
	eachNAL(au, func(off int, nal []byte) bool {
		if len(nal) == 0 || (c == H265 && len(nal) < 2) {
			err = fmt.Errorf("avc: %v: NAL unit at byte %d: header cut short", c, off)
			return false
		}
		if nal[0]&0x80 != 0 {
			err = fmt.Errorf("avc: %v: NAL unit at byte %d: forbidden_zero_bit set (header %#02x)", c, off, nal[0])
			return false
		}
		switch c {
		case H264:
			if t := nal[0] & 0x1f; t >= 1 && t <= 23 {
				known = true
			}
		case H265:
			if nal[1]&7 == 0 {
				err = fmt.Errorf("avc: %v: NAL unit at byte %d: nuh_temporal_id_plus1 is 0", c, off)
				return false
			}
			layer := (nal[0]&1)<<5 | nal[1]>>3
			if t := (nal[0] >> 1) & 0x3f; layer == 0 && t <= 40 {
				known = true
			}
		}
		return true
	})
	if err == nil && !known {
		err = fmt.Errorf("avc: %v: access unit of %d bytes holds no NAL unit the decoder reads", c, len(au))
	}
	return err
}

// EncoderConfig configures an Encoder.
type EncoderConfig struct {
	Width, Height int // even
	FPS           int // time base; default 30
	BitrateKbps   int // target; default 1000
	KeyEvery      int // at most this many frames between key frames; default 2 s of frames
}

// Encoded is one compressed access unit.
type Encoded struct {
	Data []byte // Annex-B; key frames carry SPS and PPS in band
	Key  bool
	PTS  int64
}

// Encoder encodes frames of one size to H.264 for real-time streaming.
type Encoder struct {
	c      *C.mdag_enc
	codec  Codec
	w, h   int
	closed bool
}

// encoderSetup is what NewEncoder fixes and the tests vary: the codec,
// the encoder's picture format and B-frames.
type encoderSetup struct {
	codec   Codec
	pixFmt  pixFmt
	bframes int
	bt709   bool     // BT.709 matrix (default BT.601)
	full    bool     // full range (default limited)
	opts    []string // libavcodec private options, key=value
}

// pixFmt is a libavutil pixel format (AVPixelFormat).
type pixFmt C.int

// The encoder picture formats: NewEncoder's, and H.265 Main 10's for tests.
const (
	pixYUV420P   pixFmt = C.AV_PIX_FMT_YUV420P
	pixYUV420P10 pixFmt = C.AV_PIX_FMT_YUV420P10LE
)

// NewEncoder returns an H.264 encoder with the settings of a live camera:
// libx264, constrained baseline profile, preset veryfast, tune
// zerolatency (no lookahead, no B-frames: one access unit out per frame
// in), bitrate capped at the target over a one-second buffer, SPS and PPS
// repeated on every key frame, a forced key frame an IDR.
func NewEncoder(cfg EncoderConfig) (*Encoder, error) {
	return newEncoder(cfg, encoderSetup{codec: H264, pixFmt: pixYUV420P,
		opts: []string{"preset=veryfast", "tune=zerolatency", "profile=baseline", "forced-idr=1"}})
}

func newEncoder(cfg EncoderConfig, s encoderSetup) (*Encoder, error) {
	if cfg.Width <= 0 || cfg.Height <= 0 || cfg.Width%2 != 0 || cfg.Height%2 != 0 || cfg.Width*cfg.Height > 4*MaxPixels {
		return nil, fmt.Errorf("avc: encoder size %dx%d: want even sides and 1..%d pixels", cfg.Width, cfg.Height, 4*MaxPixels)
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
	name := map[Codec]string{H264: "libx264", H265: "libx265"}[s.codec]
	if name == "" {
		return nil, fmt.Errorf("avc: no encoder for %v", s.codec)
	}
	quietLogs()
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	copts := C.CString(strings.Join(s.opts, "\n"))
	defer C.free(unsafe.Pointer(copts))
	spc, full := C.int(C.AVCOL_SPC_SMPTE170M), C.int(0)
	if s.bt709 {
		spc = C.AVCOL_SPC_BT709
	}
	if s.full {
		full = 1
	}
	var e *C.mdag_enc
	if code := C.mdag_enc_open(&e, cname, C.int(cfg.Width), C.int(cfg.Height), C.int(cfg.FPS), C.int(cfg.BitrateKbps), C.int(cfg.KeyEvery), C.int(s.pixFmt), C.int(s.bframes), spc, full, copts); code < 0 {
		return nil, callErr(fmt.Sprintf("avc: %s encoder init (%dx%d)", name, cfg.Width, cfg.Height), code, nil)
	}
	return &Encoder{c: e, codec: s.codec, w: cfg.Width, h: cfg.Height}, nil
}

// Encode compresses f (which must be the encoder's size) at pts (in frames
// of the time base); key forces a key frame (answering a PLI). It returns
// the access units the encoder completed: one per frame for NewEncoder's.
func (e *Encoder) Encode(f *media.Frame, pts int64, key bool) ([]Encoded, error) {
	if e.closed {
		return nil, fmt.Errorf("avc: %v encoder closed", e.codec)
	}
	if err := f.Valid(); err != nil {
		return nil, fmt.Errorf("avc: encode: %w", err)
	}
	if f.W != e.w || f.H != e.h {
		return nil, fmt.Errorf("avc: encode: frame %dx%d, encoder is %dx%d", f.W, f.H, e.w, e.h)
	}
	k := C.int(0)
	if key {
		k = 1
	}
	var r C.mdag_result
	if code := C.mdag_enc_send(e.c, (*C.uint8_t)(unsafe.Pointer(&f.Pix[0])), C.longlong(pts), k, &r); code < 0 {
		return nil, callErr(fmt.Sprintf("avc: %v encode", e.codec), code, &r)
	}
	var out []Encoded
	for {
		code := C.mdag_enc_receive(e.c, &r)
		if code == C.mdag_eagain() {
			return out, nil
		}
		if code < 0 {
			return nil, callErr(fmt.Sprintf("avc: %v encode", e.codec), code, &r)
		}
		out = append(out, Encoded{
			Data: C.GoBytes(C.mdag_pkt_data(e.c), C.mdag_pkt_size(e.c)),
			Key:  C.mdag_pkt_key(e.c) != 0,
			PTS:  int64(C.mdag_pkt_pts(e.c)),
		})
	}
}

// Close frees the encoder; it may be called more than once.
func (e *Encoder) Close() {
	if e.closed {
		return
	}
	e.closed = true
	C.mdag_enc_free(e.c)
	e.c = nil
}

// AccessUnits is an Encoder that numbers the frames itself and gives each
// one's output as a single Annex-B access unit, with whether it holds a
// key frame (what event clips record: clips.Encoder).
type AccessUnits struct {
	E   *Encoder
	pts int64
}

// Encode encodes f (a key frame when key); nil when the encoder holds it
// back for now.
func (a *AccessUnits) Encode(f *media.Frame, key bool) ([]byte, bool, error) {
	out, err := a.E.Encode(f, a.pts, key)
	a.pts++
	if err != nil || len(out) == 0 {
		return nil, false, err
	}
	var au []byte
	k := false
	for _, o := range out {
		au = append(au, o.Data...)
		k = k || o.Key
	}
	return au, k, nil
}

// Close closes the encoder.
func (a *AccessUnits) Close() { a.E.Close() }
