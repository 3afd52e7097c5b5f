package whip

import (
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/pion/sdp/v3"
)

// bundleOffer makes an offer whose media sections carry their own ICE
// credentials acceptable to pion, which runs one ICE transport per peer
// connection (max-bundle) and refuses conflicting ice-ufrag/ice-pwd values.
//
// Offerers with the "balanced" bundle policy (aiortc: a video section and
// a DataChannel section, each with its own ufrag, pwd and candidates) list
// every section in one BUNDLE group; once the answer accepts the group,
// they send everything over the offerer tagged section's transport, the
// first identification tag of the group (RFC 8843 7.2.1). Such an offer is
// rewritten to that transport: every section gets the tagged section's
// ice-ufrag, ice-pwd and fingerprint, and the other sections' candidates
// (transports the offerer abandons) are dropped. An offer whose sections
// differ and are not all in one BUNDLE group cannot be carried on one
// transport: 400 with the sections and their credentials.
//
// pion also takes the offer's first a=group as the BUNDLE group and
// rejects the sections outside it (a DataChannel answered with port 0), so
// a BUNDLE group after another group is moved first.
//
// It returns the offer to use (body itself when nothing differs), or a
// status and reason.
func bundleOffer(body []byte) ([]byte, int, string) {
	var d sdp.SessionDescription
	if err := d.Unmarshal(body); err != nil {
		return nil, http.StatusBadRequest, fmt.Sprintf("malformed SDP offer: %v", err)
	}
	sessUfrag, _ := d.Attribute("ice-ufrag")
	sessPwd, _ := d.Attribute("ice-pwd")
	type creds struct{ mid, ufrag, pwd string }
	secs := make([]creds, len(d.MediaDescriptions))
	differ := false
	for i, m := range d.MediaDescriptions {
		c := creds{ufrag: sessUfrag, pwd: sessPwd}
		c.mid, _ = m.Attribute("mid")
		if u, ok := m.Attribute("ice-ufrag"); ok {
			c.ufrag = u
		}
		if p, ok := m.Attribute("ice-pwd"); ok {
			c.pwd = p
		}
		secs[i] = c
		differ = differ || c.ufrag != secs[0].ufrag || c.pwd != secs[0].pwd
	}
	var group []string
	first, at := -1, -1 // the first group attribute, the first BUNDLE group
	for i, a := range d.Attributes {
		if a.Key != "group" {
			continue
		}
		if first < 0 {
			first = i
		}
		if f := strings.Fields(a.Value); len(f) > 0 && f[0] == "BUNDLE" {
			group, at = f[1:], i
			break
		}
	}
	reorder := at > first
	if reorder {
		// pion answers with the offer's first group as the BUNDLE group
		// (and rejects the sections outside it): put the BUNDLE group first.
		g := d.Attributes[at]
		d.Attributes = slices.Insert(slices.Delete(d.Attributes, at, at+1), first, g)
	}
	if !differ {
		if !reorder {
			return body, 0, ""
		}
		return marshalOffer(&d)
	}
	bundled := len(group) > 0
	for _, c := range secs {
		bundled = bundled && c.mid != "" && slices.Contains(group, c.mid)
	}
	if !bundled {
		var list []string
		for i, c := range secs {
			mid := c.mid
			if mid == "" {
				mid = "(none)"
			}
			list = append(list, fmt.Sprintf("section %d mid %s ice-ufrag %q", i, mid, c.ufrag))
		}
		got := "no a=group:BUNDLE"
		if len(group) > 0 {
			got = "a=group:BUNDLE " + strings.Join(group, " ")
		}
		return nil, http.StatusBadRequest, fmt.Sprintf("the offer's media sections use different ICE credentials (%s) and are not all in one BUNDLE group (%s): "+
			"mdag carries all media of a stream on one ICE transport; offer every section in one BUNDLE group (RFC 8843) or one ice-ufrag/ice-pwd for all (bundle policy max-bundle)",
			strings.Join(list, "; "), got)
	}
	tagged := slices.IndexFunc(secs, func(c creds) bool { return c.mid == group[0] })
	tm := d.MediaDescriptions[tagged]
	fp, hasFP := tm.Attribute("fingerprint")
	if !hasFP {
		fp, hasFP = d.Attribute("fingerprint")
	}
	set := func(attrs []sdp.Attribute, key, value string) []sdp.Attribute {
		for i := range attrs {
			if attrs[i].Key == key {
				attrs[i].Value = value
				return attrs
			}
		}
		return append(attrs, sdp.Attribute{Key: key, Value: value})
	}
	for i, a := range d.Attributes { // session-level ones, if any
		switch a.Key {
		case "ice-ufrag":
			d.Attributes[i].Value = secs[tagged].ufrag
		case "ice-pwd":
			d.Attributes[i].Value = secs[tagged].pwd
		}
	}
	for i, m := range d.MediaDescriptions {
		m.Attributes = set(m.Attributes, "ice-ufrag", secs[tagged].ufrag)
		m.Attributes = set(m.Attributes, "ice-pwd", secs[tagged].pwd)
		if hasFP && slices.ContainsFunc(m.Attributes, func(a sdp.Attribute) bool { return a.Key == "fingerprint" }) {
			m.Attributes = set(m.Attributes, "fingerprint", fp)
		}
		if i != tagged {
			m.Attributes = slices.DeleteFunc(m.Attributes, func(a sdp.Attribute) bool { return a.IsICECandidate() })
		}
	}
	return marshalOffer(&d)
}

func marshalOffer(d *sdp.SessionDescription) ([]byte, int, string) {
	out, err := d.Marshal()
	if err != nil {
		return nil, http.StatusBadRequest, fmt.Sprintf("offer: rewriting it for one BUNDLE transport: %v", err)
	}
	return out, 0, ""
}
