package remote

import (
	"bytes"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/mdag/mdag/api"
	"github.com/mdag/mdag/remote/wire"
)

// Thumbnails of the streams ingested on workers (issue 41): the pixels
// stay there, so the dashboard's thumbnails come from the workers, and
// only while it is watched. WantThumbs (the dashboard read) asks every
// ingest worker that sends them for thumbsFor; each sends a small JPEG of
// each of its streams at most once a second until then.

// thumbsFor is how long one WantThumbs keeps the thumbnails coming;
// thumbsAskEvery how often it asks again at most; thumbsSlack how long
// after thumbsFor a worker's thumbnail is still taken (in flight, clocks).
const (
	thumbsFor      = 10 * time.Second
	thumbsAskEvery = 2 * time.Second
	thumbsSlack    = 5 * time.Second
)

// WantThumbs asks the ingest workers for thumbnails of their streams for
// the next 10 s (the dashboard is being watched); at most once every 2 s,
// and not at all without Thumbs.
func (s *Server) WantThumbs() {
	if s.Thumbs == nil {
		return
	}
	now := s.Clock.Now().UnixNano()
	last := s.thumbsAsked.Load()
	// (a clock stepped back asks at once)
	if d := now - last; (d >= 0 && d < int64(thumbsAskEvery)) || !s.thumbsAsked.CompareAndSwap(last, now) {
		return
	}
	m := &api.CoordinatorMessage{Msg: &api.CoordinatorMessage_ThumbsWanted{ThumbsWanted: &api.ThumbsWanted{ForNs: int64(thumbsFor)}}}
	s.mu.Lock()
	var cs []*conn
	for _, c := range s.workers {
		if c.thumbs {
			cs = append(cs, c)
		}
	}
	s.mu.Unlock()
	for _, c := range cs {
		c.send(m) // a full queue skips this ask; the next read asks again
	}
}

// jpegMagic starts every JPEG (SOI, then a marker).
var jpegMagic = []byte{0xFF, 0xD8, 0xFF}

// thumbnail takes a worker's thumbnail for the dashboard, or refuses it
// (counted, logged at most once an interval): not asked for, a stream not
// joined on that worker, too large or not a JPEG.
func (w *workerSession) thumbnail(t *api.Thumbnail) {
	s, c := w.s, w.c
	c.mu.Lock()
	joined := c.streams[t.Stream] == streamJoined
	c.mu.Unlock()
	var why string
	asked := s.Clock.Now().UnixNano() - s.thumbsAsked.Load()
	switch {
	case s.Thumbs == nil || !c.thumbs || asked < 0 || asked > int64(thumbsFor+thumbsSlack):
		why = "not asked for"
	case !joined:
		why = "of a stream not joined on this worker"
	case len(t.Jpeg) > wire.MaxThumbBytes:
		why = "larger than its limit"
	case !bytes.HasPrefix(t.Jpeg, jpegMagic):
		why = "not a JPEG"
	}
	if why != "" {
		_ = s.refuse(RefusedThumbnail, status.Errorf(codes.InvalidArgument, "worker %s: thumbnail of stream %s (%d bytes): %s", c.id, t.Stream, len(t.Jpeg), why), "instance", c.id, "stream", t.Stream)
		return
	}
	s.Thumbs(t.Stream, t.Jpeg)
}
