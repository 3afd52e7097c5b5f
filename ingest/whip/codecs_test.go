package whip

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/pion/webrtc/v4"
)

// offerWith is a real offer (pion) listing codecs in that order.
func offerWith(t testing.TB, codecs []string) string {
	t.Helper()
	api, err := clientAPI(codecs)
	if err != nil {
		t.Fatal(err)
	}
	pc, err := api.NewPeerConnection(webrtc.Configuration{})
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	if _, err := pc.AddTransceiverFromKind(webrtc.RTPCodecTypeVideo, webrtc.RTPTransceiverInit{Direction: webrtc.RTPTransceiverDirectionSendonly}); err != nil {
		t.Fatal(err)
	}
	o, err := pc.CreateOffer(nil)
	if err != nil {
		t.Fatal(err)
	}
	return o.SDP
}

// TestCodecChoice: the answer carries exactly one codec, the first of the
// server's order its offer has, whatever the offer's order; an offer with
// none of the server's codecs gets 400 naming both sides.
func TestCodecChoice(t *testing.T) {
	for _, c := range []struct {
		name          string
		server, offer []string
		want          string // the answer's codec; "" for 400
		says          string
	}{
		{"default prefers VP8", nil, []string{CodecH264, CodecVP8}, "VP8/90000", ""},
		{"operator prefers H.264", []string{CodecH264, CodecVP8}, []string{CodecVP8, CodecH264}, "H264/90000", ""},
		{"H.264 only", nil, []string{CodecH264}, "H264/90000", ""},
		{"VP8 server, H.264 offer", []string{CodecVP8}, []string{CodecH264}, "", "offered: H264 (profile-level-id 42e01f, packetization-mode 1), H264"},
		{"H.264 server, VP8 offer", []string{CodecH264}, []string{CodecVP8}, "", "offered: VP8); supported: H264 (packetization-mode 1"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, _, hs := newTestServer(t, Config{Codecs: c.server})
			req, _ := http.NewRequest(http.MethodPost, hs.URL+"/whip/face", strings.NewReader(offerWith(t, c.offer)))
			req.Header.Set("Content-Type", "application/sdp")
			req.Header.Set("Authorization", "Bearer s3cret")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if c.want == "" {
				if resp.StatusCode != 400 || !strings.Contains(string(body), c.says) {
					t.Fatalf("%d %q; want 400 saying %q", resp.StatusCode, body, c.says)
				}
				return
			}
			if resp.StatusCode != 201 {
				t.Fatalf("%d %s", resp.StatusCode, body)
			}
			if n := strings.Count(string(body), "a=rtpmap:"); n != 1 || !strings.Contains(string(body), c.want) {
				t.Errorf("answer has %d codecs, want only %s:\n%s", n, c.want, body)
			}
		})
	}
}

// TestParseCodecs: the --codecs list.
func TestParseCodecs(t *testing.T) {
	for _, c := range []struct {
		in, want, err string
	}{
		{"vp8,h264", "vp8,h264", ""},
		{" H264 , VP8", "h264,vp8", ""},
		{"avc", "h264", ""},
		{"vp9", "", `codec "vp9": want vp8 or h264`},
		{"vp8,vp8", "", "listed twice"},
		{"", "", `codec "": want vp8 or h264`},
	} {
		got, err := ParseCodecs(c.in)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%q: %v, want an error with %q", c.in, err, c.err)
			}
			continue
		}
		if err != nil || strings.Join(got, ",") != c.want {
			t.Errorf("%q: %v %v, want %s", c.in, got, err, c.want)
		}
	}
}
