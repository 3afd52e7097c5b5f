package whip

import (
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/pion/sdp/v3"
	"github.com/pion/webrtc/v4"
)

// TestBundleOffer: offers whose sections carry their own ICE credentials
// (aiortc with a DataChannel: testdata/aiortc_datachannel_offer.sdp, as
// aiortc 1.4 offers it) are rewritten to the BUNDLE group's tagged
// transport and then accepted by pion; ones that are not all bundled are
// refused with the sections and the group named.
func TestBundleOffer(t *testing.T) {
	raw, err := os.ReadFile("testdata/aiortc_datachannel_offer.sdp")
	if err != nil {
		t.Fatal(err)
	}
	aiortc := string(raw)
	ours := offerSDP(t)
	// The same offer with the group's order reversed: mid 1 is tagged.
	tagged1 := strings.Replace(aiortc, "a=group:BUNDLE 0 1", "a=group:BUNDLE 1 0", 1)
	unbundled := strings.Replace(aiortc, "a=group:BUNDLE 0 1\r\n", "", 1)
	partial := strings.Replace(aiortc, "a=group:BUNDLE 0 1", "a=group:BUNDLE 0", 1)
	lsFirst := strings.Replace(aiortc, "a=group:BUNDLE 0 1", "a=group:LS 0\r\na=group:BUNDLE 0 1", 1)
	cred := func(off string, i int) (string, string) {
		var d sdp.SessionDescription
		if err := d.Unmarshal([]byte(off)); err != nil {
			t.Fatal(err)
		}
		u, _ := d.MediaDescriptions[i].Attribute("ice-ufrag")
		p, _ := d.MediaDescriptions[i].Attribute("ice-pwd")
		return u, p
	}
	u0, p0 := cred(aiortc, 0)
	u1, p1 := cred(aiortc, 1)
	if u0 == u1 || p0 == p1 {
		t.Fatalf("the aiortc offer has one ICE credential for both sections (%s, %s): it no longer exercises the rewrite", u0, u1)
	}
	cases := []struct {
		name       string
		offer      string
		same       bool   // returned unchanged
		ufrag, pwd string // every section's, after
		candidates []int  // candidates left per section
		code       int
		says       []string
	}{
		{name: "one transport already (pion)", offer: ours, same: true},
		{name: "aiortc, video and DataChannel bundled", offer: aiortc, ufrag: u0, pwd: p0, candidates: []int{2, 0}},
		{name: "tagged section second", offer: tagged1, ufrag: u1, pwd: p1, candidates: []int{0, 2}},
		{name: "another group first", offer: lsFirst, ufrag: u0, pwd: p0, candidates: []int{2, 0}},
		{name: "not bundled", offer: unbundled, code: 400,
			says: []string{"different ICE credentials", `mid 0 ice-ufrag "` + u0 + `"`, `mid 1 ice-ufrag "` + u1 + `"`, "no a=group:BUNDLE", "RFC 8843"}},
		{name: "bundle missing a section", offer: partial, code: 400, says: []string{"not all in one BUNDLE group (a=group:BUNDLE 0)"}},
		{name: "malformed", offer: "v=0\r\nm=video\r\n", code: 400, says: []string{"malformed SDP"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, code, msg := bundleOffer([]byte(c.offer))
			if code != c.code {
				t.Fatalf("code %d %q, want %d", code, msg, c.code)
			}
			if code != 0 {
				for _, s := range c.says {
					if !strings.Contains(msg, s) {
						t.Errorf("reason %q lacks %q", msg, s)
					}
				}
				return
			}
			if c.same {
				if string(out) != c.offer {
					t.Errorf("rewrote an offer with one transport")
				}
			} else {
				var d sdp.SessionDescription
				if err := d.Unmarshal(out); err != nil {
					t.Fatal(err)
				}
				for i, m := range d.MediaDescriptions {
					u, _ := m.Attribute("ice-ufrag")
					p, _ := m.Attribute("ice-pwd")
					n := 0
					for _, a := range m.Attributes {
						if a.IsICECandidate() {
							n++
						}
					}
					if u != c.ufrag || p != c.pwd || n != c.candidates[i] {
						t.Errorf("section %d: ufrag %q pwd %q, %d candidates; want %q %q %d", i, u, p, n, c.ufrag, c.pwd, c.candidates[i])
					}
				}
			}
			// pion takes it and answers every section in the group.
			api, err := newAPI(DefaultCodecs, nil)
			if err != nil {
				t.Fatal(err)
			}
			pc, err := api.NewPeerConnection(webrtc.Configuration{})
			if err != nil {
				t.Fatal(err)
			}
			defer pc.Close()
			if err := pc.SetRemoteDescription(webrtc.SessionDescription{Type: webrtc.SDPTypeOffer, SDP: string(out)}); err != nil {
				t.Fatalf("pion refuses the offer: %v", err)
			}
			ans, err := pc.CreateAnswer(nil)
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(ans.SDP, "m=application 0 ") {
				t.Errorf("the DataChannel section was rejected:\n%s", ans.SDP)
			}
			if !c.same && !strings.Contains(ans.SDP, "a=group:BUNDLE 0 1") && !strings.Contains(ans.SDP, "a=group:BUNDLE 1 0") {
				t.Errorf("answer without the BUNDLE group:\n%s", ans.SDP)
			}
		})
	}
	// Through the endpoint: the aiortc offer gets 201, the unbundled one
	// 400 with the reason.
	_, _, hs := newTestServer(t, Config{})
	for _, c := range []struct {
		offer string
		want  int
	}{{aiortc, 201}, {unbundled, 400}} {
		resp, err := http.Post(hs.URL+"/whip/face", "application/sdp", strings.NewReader(c.offer))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Errorf("POST: %d, want %d", resp.StatusCode, c.want)
		}
	}
}

// FuzzBundleOffer: arbitrary offers through bundleOffer: a refusal always
// has a 4xx and a reason; an accepted offer parses and has one ICE
// credential (ufrag and pwd) for all its sections.
func FuzzBundleOffer(f *testing.F) {
	if b, err := os.ReadFile("testdata/aiortc_datachannel_offer.sdp"); err == nil {
		f.Add(string(b))
	}
	f.Add(offerSDP(f))
	f.Add("v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\na=group:BUNDLE a b\r\nm=video 9 UDP/TLS/RTP/SAVPF 96\r\na=mid:a\r\na=ice-ufrag:x\r\na=ice-pwd:y\r\nm=application 9 UDP/DTLS/SCTP webrtc-datachannel\r\na=mid:b\r\na=ice-ufrag:z\r\na=ice-pwd:w\r\n")
	f.Fuzz(func(t *testing.T, offer string) {
		out, code, msg := bundleOffer([]byte(offer))
		if code != 0 {
			if code < 400 || code > 499 || msg == "" {
				t.Fatalf("refused with %d %q", code, msg)
			}
			return
		}
		var d sdp.SessionDescription
		if err := d.Unmarshal(out); err != nil {
			t.Fatalf("the rewritten offer does not parse: %v", err)
		}
		su, _ := d.Attribute("ice-ufrag")
		sp, _ := d.Attribute("ice-pwd")
		var first [2]string
		for i, m := range d.MediaDescriptions {
			u, p := su, sp
			if v, ok := m.Attribute("ice-ufrag"); ok {
				u = v
			}
			if v, ok := m.Attribute("ice-pwd"); ok {
				p = v
			}
			if i == 0 {
				first = [2]string{u, p}
			} else if [2]string{u, p} != first {
				t.Fatalf("section %d: ICE credentials %q %q, section 0 %q %q", i, u, p, first[0], first[1])
			}
		}
	})
}
