package coordinator

import (
	"fmt"

	"github.com/mdag/mdag/coordinator/why"
	"github.com/mdag/mdag/profile"
)

// The frame size a session plans at. A profiles document may measure a
// target at several frame sizes (`mdag profile --frame`, `frame:` on a
// profile): preprocessing, resizing and cropping cost more on a 1080p
// camera's frames than on the 640x480 a profile is commonly taken at. The
// plan starts at the document's planning size (plan.frame, else each
// target's largest measured); once streams send frames, the session plans
// at the largest size they send (the costliest of the frames its instances
// must keep up with), re-planning when that size changes.

// sawFrame records the size of a frame stream st sent (video apps) and
// re-plans the session at the largest size its streams send when that
// changed. A catalog with no target profiled at several sizes costs
// nothing here.
func (e *Engine) sawFrame(st *stream, w, h int) {
	s := st.s
	if s.base == nil || !s.base.Sized() || w <= 0 || h <= 0 {
		return
	}
	size := profile.FrameSize{W: w, H: h}
	if st.size == size {
		return
	}
	st.size = size
	e.planFrame(s)
}

// planFrame sets the session's catalog to the largest frame size its
// streams send, and re-plans when that moved.
func (e *Engine) planFrame(s *session) {
	var big profile.FrameSize
	for _, st := range s.streams {
		if st.size.Pixels() > big.Pixels() {
			big = st.size
		}
	}
	if big.IsZero() || big == s.frame {
		return
	}
	was := s.frame
	s.frame, s.cat = big, s.base.AtFrame(big)
	from := "the profiles' planning size"
	if !was.IsZero() {
		from = was.String()
	}
	e.log.Info("planning at the frame size the streams send", "app", s.app.Name, "frame", big.String(), "was", from)
	e.trigger(why.OnFrameSize, fmt.Sprintf("%s: streams send %s frames, planned at %s", s.app.Name, big, from))
}
