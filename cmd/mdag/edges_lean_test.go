//go:build lean

package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestLeanRefusals: what the lean build lacks is refused by name, saying
// where it is (make test runs these: go test -tags lean -run Lean).
func TestLeanRefusals(t *testing.T) {
	t.Chdir("../..")
	for _, tc := range []struct {
		args string
		code int
		want string
	}{
		{"version", exitOK, "(lean build: "},
		{"client --app traffic", exitInvalid, "mdag client: the WebRTC (WHIP) client is not in the lean build; the full build has it: bin/mdag (make build)"},
		{"demo --duration 1s", exitInvalid, "mdag demo: the live demo (WebRTC clients) is not in the lean build; the full build has it"},
		{"help", exitOK, "demo       the live demo (WHIP clients): not in the lean build, the full build has it"},
		{"serve --example traffic --token-file t", exitInvalid, `invalid value "t" for flag -token-file: WHIP ingest is not in the lean build`},
		{"coordinator --example traffic --open", exitInvalid, "invalid boolean flag open: WHIP ingest is not in the lean build"},
		{"serve --example traffic --listen 127.0.0.1:0 --camera rtsp://u:Hunter22@cam/x", exitInvalid, "mdag serve: RTSP cameras are not in the lean build"},
		{"coordinator --example traffic --grpc 127.0.0.1:0 --listen 127.0.0.1:0 --cameras c.yaml", exitInvalid, "mdag coordinator: RTSP cameras are not in the lean build (they need the WHIP ingest server); the full build has it"},
		{"validate -f examples/traffic/app.yaml --cameras c.yaml", exitInvalid, "RTSP cameras are not in the lean build"},
		{"source --app traffic --coordinator 127.0.0.1:1 --camera rtsp://cam/x --duration 1ms", exitInvalid, "mdag source: RTSP cameras are not in the lean build"},
		{"serve -h", exitOK, "\nWHIP ingest is not in the lean build (the full build has it: bin/mdag (make build)); refused flags: -allow-origin -codecs -connect-timeout"},
		{"trace --video x.avi --detector hog", exitInvalid, "mdag trace: reading videos and running detectors needs OpenCV, which the lean build has not; the full build has it"},
		{"worker --type V100 --executor opencv", exitInvalid, `mdag worker: --executor "opencv": the lean build has emulated, onnx and kserve`},
		{"worker -h", exitOK, "decoders: none in the lean build"},
		{"validate -f examples/traffic/app.yaml --profiles examples/traffic/profiles.yaml", exitOK, "app traffic: valid"},
		// The stateful ops are pure Go (the lean build has them); OpenCV's are not.
		{"serve -f cmd/mdag/testdata/haar-only.yaml -p examples/face/profiles.yaml --listen 127.0.0.1:0", exitInvalid,
			"module crop: op haar-face: op has no implementation in this binary (implemented: activity, count, crop, place, segment, sequence, sink, text-crop, track, window)"},
	} {
		t.Run(tc.args, func(t *testing.T) {
			var out bytes.Buffer
			code := run(strings.Fields(tc.args), &out, &out)
			if code != tc.code || !strings.Contains(out.String(), tc.want) {
				t.Errorf("mdag %s: exit %d, want %d and %q in\n%s", tc.args, code, tc.code, tc.want, out.String())
			}
		})
	}
}
