//go:build lean

package main

// edgeFeatures are what the lean build's edges have: none of the full
// build's (mdag version names what it lacks).
func edgeFeatures() []feature {
	return []feature{
		{"whip", "none: no WebRTC (WHIP) ingest, no mdag client or demo (" + fullBuild + ")"},
		{"rtsp", "none: no RTSP cameras"},
		{"opencv", "none: pure-Go CPU ops, area-average scaling, standard-library JPEG thumbnails"},
	}
}
