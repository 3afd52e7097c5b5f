package whip

import (
	"fmt"
	"slices"
	"strings"

	"github.com/pion/sdp/v3"
	"github.com/pion/webrtc/v4"

	"github.com/mdag/mdag/ingest/avc"
	"github.com/mdag/mdag/ingest/vpx"
	"github.com/mdag/mdag/media"
)

// Codecs the server ingests (Config.Codecs, `--codecs`).
const (
	CodecVP8  = "vp8"
	CodecH264 = "h264"
	// CodecOpus is the one audio codec (RFC 7587, opus/48000/2), for apps
	// with `media: audio`; it is always registered, not in Codecs.
	CodecOpus = "opus"
)

// Opus's format parameters (RFC 7587 7): what the server registers and a
// mono client offers; a stereo client adds that it sends stereo.
const (
	opusFmtp       = "minptime=10;useinbandfec=1"
	opusStereoFmtp = opusFmtp + ";stereo=1;sprop-stereo=1"
)

// opusClockRate is Opus's RTP clock (RFC 7587: 48 kHz whatever the
// source's rate).
const opusClockRate = 48000

// DefaultCodecs is the order of preference when none is configured: VP8
// first, so that a sender offering both (browsers) keeps what it sent
// before H.264 came in.
var DefaultCodecs = []string{CodecVP8, CodecH264}

// h264Profiles are the profile_idc and profile-iop bytes of the H.264
// profile-level-ids accepted (the level is not negotiated: RFC 6184
// 8.2.2): constrained baseline (42e0, and 42c0 as some senders write it),
// baseline (4200), main (4d00), high (6400) and constrained high (640c).
// Only packetization mode 1 (non-interleaved: single NAL units, STAP-A,
// FU-A) is accepted; mode 0 senders (one NAL unit per packet) are rare and
// mode 1's depacketizer reads their packets too, but the mode must be
// answered as offered, so it is not offered here.
var h264Profiles = []string{"42e01f", "42c01f", "42001f", "4d001f", "64001f", "640c1f"}

// ParseCodecs reads a codec list ("vp8,h264"): in order of preference,
// no repeats, each one the server ingests.
func ParseCodecs(s string) ([]string, error) {
	var out []string
	for _, f := range strings.Split(s, ",") {
		c := strings.ToLower(strings.TrimSpace(f))
		switch c {
		case "avc", "h.264":
			c = CodecH264
		}
		if c != CodecVP8 && c != CodecH264 {
			return nil, fmt.Errorf("codec %q: want vp8 or h264 (a comma-separated list in order of preference)", strings.TrimSpace(f))
		}
		if slices.Contains(out, c) {
			return nil, fmt.Errorf("codec %q listed twice", c)
		}
		out = append(out, c)
	}
	return out, nil
}

func checkCodecs(codecs []string) error {
	if len(codecs) == 0 {
		return fmt.Errorf("no codec: want vp8, h264 or both")
	}
	_, err := ParseCodecs(strings.Join(codecs, ","))
	return err
}

func codecMime(c string) string {
	switch c {
	case CodecH264:
		return webrtc.MimeTypeH264
	case CodecOpus:
		return webrtc.MimeTypeOpus
	}
	return webrtc.MimeTypeVP8
}

// codecOf is the codec of a negotiated MIME type ("" when not one of ours).
func codecOf(mime string) string {
	switch {
	case strings.EqualFold(mime, webrtc.MimeTypeVP8):
		return CodecVP8
	case strings.EqualFold(mime, webrtc.MimeTypeH264):
		return CodecH264
	case strings.EqualFold(mime, webrtc.MimeTypeOpus):
		return CodecOpus
	}
	return ""
}

// registerOpus adds Opus (audio) to a media engine: every server and
// client can carry it; the server decodes it for audio apps only.
func registerOpus(m *webrtc.MediaEngine, fmtp string) error {
	return m.RegisterCodec(webrtc.RTPCodecParameters{
		RTPCodecCapability: webrtc.RTPCodecCapability{MimeType: webrtc.MimeTypeOpus, ClockRate: opusClockRate, Channels: 2,
			SDPFmtpLine: fmtp},
		PayloadType: 111,
	}, webrtc.RTPCodecTypeAudio)
}

// registerCodecs adds the codecs to a media engine (payload types are the
// offerer's in an answer; these only need to be distinct).
func registerCodecs(m *webrtc.MediaEngine, codecs []string) error {
	fb := []webrtc.RTCPFeedback{{Type: "nack"}, {Type: "nack", Parameter: "pli"}, {Type: "ccm", Parameter: "fir"}}
	for _, c := range codecs {
		switch c {
		case CodecVP8:
			if err := m.RegisterCodec(webrtc.RTPCodecParameters{
				RTPCodecCapability: webrtc.RTPCodecCapability{MimeType: webrtc.MimeTypeVP8, ClockRate: videoClockRate, RTCPFeedback: fb},
				PayloadType:        96,
			}, webrtc.RTPCodecTypeVideo); err != nil {
				return err
			}
		case CodecH264:
			for i, plid := range h264Profiles {
				if err := m.RegisterCodec(webrtc.RTPCodecParameters{
					RTPCodecCapability: webrtc.RTPCodecCapability{MimeType: webrtc.MimeTypeH264, ClockRate: videoClockRate, RTCPFeedback: fb,
						SDPFmtpLine: "level-asymmetry-allowed=1;packetization-mode=1;profile-level-id=" + plid},
					PayloadType: webrtc.PayloadType(102 + i),
				}, webrtc.RTPCodecTypeVideo); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// offeredCodec is one payload type of an offer's video (or audio)
// section.
type offeredCodec struct {
	pt       uint8
	name     string // as written (VP8, H264, opus, ...)
	clock    uint32
	channels uint32 // audio: the rtpmap's channel count (0: not given)
	fmtp     string
}

// ours is the server codec it is, if it can be answered: VP8, or H.264 in
// packetization mode 1 with a profile accepted.
func (o offeredCodec) ours() string {
	switch {
	case strings.EqualFold(o.name, "VP8"):
		return CodecVP8
	case strings.EqualFold(o.name, "opus"):
		if o.clock == opusClockRate && o.channels == 2 {
			return CodecOpus // RFC 7587 7: always opus/48000/2
		}
		return ""
	case strings.EqualFold(o.name, "H264"):
		params := fmtpParams(o.fmtp)
		plid := params["profile-level-id"]
		if plid == "" {
			plid = "42001f" // RFC 6184 8.1: baseline by default
		}
		if params["packetization-mode"] != "1" || len(plid) != 6 {
			return ""
		}
		for _, p := range h264Profiles {
			if strings.EqualFold(p[:4], plid[:4]) {
				return CodecH264
			}
		}
	}
	return ""
}

// describe is the codec as a message names it: "H264 (profile-level-id
// 42e01f, packetization-mode 0)".
func (o offeredCodec) describe() string {
	if !strings.EqualFold(o.name, "H264") {
		return o.name
	}
	p := fmtpParams(o.fmtp)
	mode := p["packetization-mode"]
	if mode == "" {
		mode = "0"
	}
	if plid := p["profile-level-id"]; plid != "" {
		return fmt.Sprintf("H264 (profile-level-id %s, packetization-mode %s)", plid, mode)
	}
	return fmt.Sprintf("H264 (packetization-mode %s)", mode)
}

func fmtpParams(line string) map[string]string {
	out := map[string]string{}
	for _, kv := range strings.Split(line, ";") {
		k, v, _ := strings.Cut(strings.TrimSpace(kv), "=")
		if k != "" {
			out[strings.ToLower(k)] = strings.TrimSpace(v)
		}
	}
	return out
}

// videoCodecs lists a media section's payload types (video or audio) in
// the offer's order.
func videoCodecs(m *sdp.MediaDescription) []offeredCodec {
	var out []offeredCodec
	fmtps := map[string]string{}
	for _, a := range m.Attributes {
		if a.Key == "fmtp" {
			pt, line, _ := strings.Cut(a.Value, " ")
			fmtps[pt] = line
		}
	}
	for _, a := range m.Attributes {
		if a.Key != "rtpmap" {
			continue
		}
		ptS, enc, _ := strings.Cut(a.Value, " ")
		var pt, clock, channels uint64
		if _, err := fmt.Sscan(ptS, &pt); err != nil || pt > 127 {
			continue
		}
		name, rate, _ := strings.Cut(enc, "/")
		rate, chans, _ := strings.Cut(rate, "/")
		fmt.Sscan(rate, &clock)
		if chans != "" {
			fmt.Sscan(chans, &channels)
		}
		out = append(out, offeredCodec{pt: uint8(pt), name: name, clock: uint32(clock), channels: uint32(min(channels, 255)), fmtp: fmtps[ptS]})
	}
	return out
}

// chooseCodec picks the codec a stream is answered with: the first of the
// server's codecs (in its order of preference) the offer has; the offer's
// first payload type of it. ok false: none (offered lists what it had).
func chooseCodec(offer []offeredCodec, prefer []string) (pick offeredCodec, codec string, offered []string, ok bool) {
	for _, c := range prefer {
		for _, o := range offer {
			if o.ours() == c {
				return o, c, nil, true
			}
		}
	}
	for _, o := range offer {
		d := o.describe()
		if strings.EqualFold(o.name, "rtx") {
			d = "rtx" // one for all
		}
		if !slices.Contains(offered, d) {
			offered = append(offered, d)
		}
	}
	return offeredCodec{}, "", offered, false
}

// supported names the codecs for messages: "VP8, H264 (packetization-mode 1;
// constrained baseline, baseline, main or high profile)".
func supported(codecs []string) string {
	var out []string
	for _, c := range codecs {
		if c == CodecH264 {
			out = append(out, "H264 (packetization-mode 1; constrained baseline, baseline, main or high profile)")
		} else {
			out = append(out, strings.ToUpper(c))
		}
	}
	return strings.Join(out, ", ")
}

// decoder is a stream's video decoder: ingest/vpx for VP8, ingest/avc
// for H.264 (and H.265 from cameras).
type decoder interface {
	Decode(data []byte) (*media.Frame, error)
	Skip(data []byte) error
	Close()
}

func newDecoder(codec string) (decoder, error) {
	switch codec {
	case CodecVP8:
		return vpx.NewDecoder()
	case CodecH264:
		return avc.NewDecoder(avc.H264)
	case "h265":
		return avc.NewDecoder(avc.H265)
	}
	return nil, fmt.Errorf("no decoder for codec %q", codec)
}

// payloadFormatOf is the assembler's payload format for a codec.
func payloadFormatOf(codec string) payloadFormat {
	if codec == CodecH264 {
		return h264Format{}
	}
	return vp8Format{}
}
