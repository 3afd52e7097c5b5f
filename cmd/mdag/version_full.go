//go:build !lean

package main

import (
	"gocv.io/x/gocv"

	"github.com/mdag/mdag/ingest/rtsp"
	"github.com/mdag/mdag/ingest/whip"
)

// edgeFeatures are what the full build's edges have, read from the
// packages compiled in (mdag version).
func edgeFeatures() []feature {
	return []feature{
		{"whip", "WebRTC (WHIP) ingest of video (" + commaList(whipVideoCodecs()) + ") and audio (" + whip.CodecOpus + "); mdag client sends " + commaList(clientCodecs) + " or " + whip.CodecOpus},
		{"rtsp", "RTSP cameras (serve --camera): " + commaList([]string{rtsp.H264, rtsp.H265})},
		{"opencv", "OpenCV " + gocv.OpenCVVersion() + " (CPU ops, the opencv DNN executor, video files and cameras for client and trace)"},
	}
}

// whipVideoCodecs are the video codecs the WHIP server takes (--codecs):
// those of the known names it accepts.
func whipVideoCodecs() []string {
	var out []string
	for _, c := range []string{"vp8", "vp9", "h264", "h265", "av1"} {
		if _, err := whip.ParseCodecs(c); err == nil {
			out = append(out, c)
		}
	}
	return out
}
