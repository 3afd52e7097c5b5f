package whip

import (
	"fmt"

	"github.com/mdag/mdag/internal/auth"
)

// streamCaps are a new stream's limits: the server's, narrowed by its
// token's caps.
type streamCaps struct {
	fps        float64 // sampling rate (0: every frame)
	maxW, maxH int
	token      string // the token's name; "": none (open server)
}

// capsFor narrows the app's rate and the server's resolution limit to
// tok's caps. Frames above them are not refused at the offer: an SDP offer
// does not say a sender's resolution or rate, and a browser changes both
// while it streams. The caps go where the server's own limits already
// act, per stream: frames above the resolution are downscaled (or, with
// Oversize reject, end the stream) and frames are sampled to the rate,
// so a capped token costs the decoder and the session no more than its
// caps, and a camera that starts large still streams.
func (s *Server) capsFor(appFPS float64, tok *auth.Token) streamCaps {
	c := streamCaps{fps: appFPS, maxW: s.cfg.MaxWidth, maxH: s.cfg.MaxHeight}
	if tok == nil {
		return c
	}
	c.token = tok.Name
	if tok.MaxFPS > 0 && (c.fps <= 0 || tok.MaxFPS < c.fps) {
		c.fps = tok.MaxFPS
	}
	if tok.MaxWidth > 0 {
		c.maxW = min(c.maxW, tok.MaxWidth)
	}
	if tok.MaxHeight > 0 {
		c.maxH = min(c.maxH, tok.MaxHeight)
	}
	return c
}

// reserveToken takes one of tok's stream slots, or says why not (its
// MaxStreams are live or reserved). A nil token or one without a limit
// takes nothing.
func (s *Server) reserveToken(tok *auth.Token) string {
	if tok == nil {
		return ""
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if tok.MaxStreams > 0 && s.byToken[tok.Name] >= tok.MaxStreams {
		return fmt.Sprintf("token %q has its limit of %d streams at once live; end one (DELETE its resource) before starting another", tok.Name, tok.MaxStreams)
	}
	s.byToken[tok.Name]++
	return ""
}

// unreserveToken gives back a slot reserveToken took for a stream that
// did not start.
func (s *Server) unreserveToken(name string) {
	s.mu.Lock()
	s.releaseTokenLocked(name)
	s.mu.Unlock()
}

func (s *Server) releaseTokenLocked(name string) {
	if name == "" {
		return
	}
	if s.byToken[name]--; s.byToken[name] <= 0 {
		delete(s.byToken, name)
	}
}

// TokenStreams is the number of live streams per token name.
func (s *Server) TokenStreams() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]int, len(s.byToken))
	for k, v := range s.byToken {
		out[k] = v
	}
	return out
}
