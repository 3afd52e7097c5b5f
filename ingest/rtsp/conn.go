package rtsp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bluenviron/gortsplib/v4"
	"github.com/bluenviron/gortsplib/v4/pkg/base"
	"github.com/bluenviron/gortsplib/v4/pkg/description"
	"github.com/bluenviron/gortsplib/v4/pkg/format"
	"github.com/bluenviron/gortsplib/v4/pkg/liberrors"
	"github.com/pion/rtcp"
	"github.com/pion/rtp"

	"github.com/mdag/mdag/ingest"
)

// MaxRedirects bounds the RTSP redirects one connection follows.
const MaxRedirects = 3

// dialOnly dials the camera's own address and nothing else: gortsplib
// follows a DESCRIBE redirect to any host and carries the URL's
// user:password there, so a redirect elsewhere is refused (a camera can
// make mdag connect nowhere but to itself), and redirects to itself are
// bounded by MaxRedirects.
func (c *camera) dialOnly(u *base.URL, dial func(ctx context.Context, network, addr string) (net.Conn, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	port := u.Port()
	if port == "" {
		port = "554"
		if u.Scheme == "rtsps" {
			port = "322"
		}
	}
	own := net.JoinHostPort(u.Hostname(), port)
	var dials atomic.Int32
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if addr != own {
			return nil, fmt.Errorf("redirected to %s: mdag connects only to the camera's own address %s (another host would be sent its credentials); give the camera's final URL", addr, own)
		}
		n := dials.Add(1)
		// rtsps runs over TCP from the start: a second dial is a redirect,
		// and the dial cannot see whether it goes to rtsp:// (plaintext,
		// the credentials in the clear), so an rtsps camera's redirects
		// are not followed
		if u.Scheme == "rtsps" && n > 1 {
			return nil, fmt.Errorf("redirected: an rtsps:// camera's redirects are not followed (one to rtsp:// would send its credentials in plaintext); give the camera's final URL")
		}
		// the first dial, a re-dial when UDP gives way to TCP, and the
		// redirects
		if n > MaxRedirects+2 {
			return nil, fmt.Errorf("more than %d redirects", MaxRedirects)
		}
		return dial(ctx, network, addr)
	}
}

// connect runs one connection: DESCRIBE, SETUP and PLAY within
// DialTimeout, then streams until the connection breaks, ctx ends or the
// feed ends.
func (c *camera) connect(ctx context.Context) result {
	o := &c.m.opts
	u, err := base.ParseURL(c.cfg.URL)
	if err != nil {
		return result{err: c.errorf("bad URL: %v", err), permanent: true}
	}
	transport := "udp"
	cl := &gortsplib.Client{
		ReadTimeout: o.ReadTimeout,
		DialContext: c.dialOnly(u, (&net.Dialer{Timeout: o.DialTimeout}).DialContext),
		UserAgent:   "mdag",
		// Losses are counted by the depacketizer, decode errors as losses.
		OnPacketLost:  func(error) {},
		OnDecodeError: func(err error) { c.log.Debug("camera: RTP/RTCP decode error", "err", RedactText(err.Error())) },
		OnTransportSwitch: func(err error) {
			c.log.Info("camera: switching to TCP", "why", RedactText(err.Error()))
			c.update(func(st *CameraStatus) { st.Transport = "tcp" })
		},
	}
	switch c.cfg.Transport {
	case "tcp":
		t := gortsplib.TransportTCP
		cl.Transport, transport = &t, "tcp"
	case "udp":
		t := gortsplib.TransportUDP
		cl.Transport = &t
	default:
		if u.Scheme == "rtsps" {
			t := gortsplib.TransportTCP // RTSPS carries media over the TLS connection
			cl.Transport, transport = &t, "tcp"
		}
	}
	if err := cl.Start(u.Scheme, u.Host); err != nil {
		return result{err: c.errorf("%v", err), permanent: true}
	}
	defer cl.Close()

	// The setup is bounded by DialTimeout on the injected clock: the timer
	// closes the client, which ends the request in flight.
	var timedOut atomic.Bool
	timer := o.Clock.AfterFunc(o.DialTimeout, func() {
		timedOut.Store(true)
		cl.Close()
	})
	stopCtx := context.AfterFunc(ctx, cl.Close)
	defer stopCtx()
	defer timer.Stop()
	fail := func(stage string, err error) result {
		if ctx.Err() != nil {
			return result{}
		}
		if timedOut.Load() {
			return result{err: c.errorf("no answer within %v (%s)", o.DialTimeout, stage)}
		}
		return c.classify(stage, err)
	}

	desc, _, err := cl.Describe(u)
	if err != nil {
		return fail("DESCRIBE", err)
	}
	medi, forma, codec := findVideo(desc)
	if medi == nil {
		return result{err: c.errorf("offers no H.264 or H.265 video (it has: %s)", offered(desc)), permanent: true}
	}
	var params [][]byte
	switch f := forma.(type) {
	case *format.H264:
		if f.PacketizationMode >= 2 {
			return result{err: c.errorf("H.264 packetization-mode %d (interleaved) is not supported: set the camera to mode 0 or 1", f.PacketizationMode), permanent: true}
		}
		sps, pps := f.SafeParams()
		params = [][]byte{sps, pps}
	case *format.H265:
		vps, sps, pps := f.SafeParams()
		params = [][]byte{vps, sps, pps}
	}
	dep, err := newDepacketizer(codec, params...)
	if err != nil {
		return result{err: c.errorf("%v", err), permanent: true}
	}
	if _, err := cl.Setup(desc.BaseURL, medi, 0, 0); err != nil {
		return fail("SETUP", err)
	}
	if r, ok := c.openFeed(codec); !ok {
		return r
	}
	feed := c.feed

	// Packets arrive on gortsplib's goroutines (one per UDP socket, one
	// for TCP): mu makes the feed's calls one at a time, and closed drops
	// what comes after the connection is given up.
	var (
		mu         sync.Mutex
		closed     bool
		firstFrame time.Time
	)
	cl.OnPacketRTP(medi, forma, func(pkt *rtp.Packet) {
		mu.Lock()
		defer mu.Unlock()
		if closed {
			return
		}
		au, ok := dep.packet(pkt)
		if n := dep.takeLost(); n > 0 {
			feed.Lost(n)
			c.update(func(st *CameraStatus) { st.Lost += uint64(n) })
		}
		if !ok {
			return
		}
		now := o.Clock.Now()
		if firstFrame.IsZero() {
			firstFrame = now
			c.firstFrame(now)
		}
		c.m.mu.Lock()
		c.st.Frames++
		if au.key {
			c.st.KeyFrames++
		}
		c.lastFrame = now
		c.m.mu.Unlock()
		feed.Frame(au.data, au.ts, au.key)
	})
	cl.OnPacketRTCP(medi, func(p rtcp.Packet) {
		sr, ok := p.(*rtcp.SenderReport)
		if !ok {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if !closed {
			feed.SenderReport(sr.NTPTime, sr.RTPTime)
		}
	})
	if _, err := cl.Play(nil); err != nil {
		return fail("PLAY", err)
	}
	if !timer.Stop() || timedOut.Load() {
		return fail("PLAY", errors.New("timed out"))
	}
	c.update(func(st *CameraStatus) {
		st.Connects++
		st.Codec = codec
		st.Transport = transport
	})
	c.setState(Streaming)
	c.log.Info("camera: playing", "codec", codec, "transport", transport)

	waitErr := make(chan error, 1)
	go func() { waitErr <- cl.Wait() }()
	var res result
	select {
	case err = <-waitErr:
	case <-ctx.Done():
		cl.Close()
		<-waitErr
	case <-feed.Done():
		cl.Close()
		<-waitErr
		res.ended = true
	}
	mu.Lock()
	closed = true
	mu.Unlock()
	end := o.Clock.Now()
	if !firstFrame.IsZero() {
		res.streamed = end.Sub(firstFrame)
	}
	if ctx.Err() != nil || res.ended {
		return res
	}
	res.err = c.errorf("connection lost: %v", lostWhy(err))
	c.lost(res.err.Error(), end)
	return res
}

// openFeed opens the camera's feed at its first connection; a camera whose
// codec changed gets a new one. It reports false with the result to return
// when the server refuses.
func (c *camera) openFeed(codec string) (result, bool) {
	if c.feed != nil && c.codec == codec {
		return result{}, true
	}
	if c.feed != nil {
		// The server's decoder is per feed: a new codec is a new stream.
		c.feed.End("client", fmt.Sprintf("camera %s switched from %s to %s", c.cfg.Name, c.codec, codec))
		c.feed = nil
	}
	f, err := c.m.feeds.OpenFeed(ingest.FeedConfig{App: c.cfg.App, Name: c.cfg.Name, Codec: codec, Source: c.cfg.Source(), FPS: c.cfg.FPS})
	if err != nil {
		return result{err: c.errorf("the ingest server refused the stream: %v", RedactText(err.Error())), refused: true}, false
	}
	c.feed, c.codec = f, codec
	return result{}, true
}

// firstFrame records the first frame of a connection: the end of a gap.
func (c *camera) firstFrame(now time.Time) {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	if !c.downSince.IsZero() {
		gap := now.Sub(c.downSince)
		c.st.LastGap = gap
		c.st.GapTotal += gap
		c.downSince = time.Time{}
	}
}

// lost records a camera-lost event and tells the feed.
func (c *camera) lost(why string, now time.Time) {
	c.m.mu.Lock()
	c.st.CameraLost++
	if c.downSince.IsZero() {
		c.downSince = c.lastFrame
		if c.downSince.IsZero() {
			c.downSince = now
		}
	}
	c.m.mu.Unlock()
	c.log.Warn("camera-lost", "why", why)
	c.feed.Disconnected(why)
}

// findVideo is the first H.264 or H.265 format of a video media.
func findVideo(desc *description.Session) (*description.Media, format.Format, string) {
	for _, m := range desc.Medias {
		if m.Type != description.MediaTypeVideo || m.IsBackChannel {
			continue
		}
		for _, f := range m.Formats {
			switch f.(type) {
			case *format.H264:
				return m, f, H264
			case *format.H265:
				return m, f, H265
			}
		}
	}
	return nil, nil, ""
}

// offered lists what a description has: "video MJPEG, audio G711".
func offered(desc *description.Session) string {
	var parts []string
	for _, m := range desc.Medias {
		var codecs []string
		for _, f := range m.Formats {
			codecs = append(codecs, f.Codec())
		}
		parts = append(parts, strings.TrimSpace(string(m.Type)+" "+strings.Join(codecs, "/")))
	}
	if len(parts) == 0 {
		return "no media"
	}
	return strings.Join(parts, ", ")
}

// classify turns a setup error into a result.
func (c *camera) classify(stage string, err error) result {
	var bad liberrors.ErrClientBadStatusCode
	if errors.As(err, &bad) {
		switch bad.Code {
		case base.StatusUnauthorized:
			if u, _ := ParseURL(c.cfg.URL); u != nil && u.User == nil {
				return result{err: c.errorf("401 Unauthorized: the camera asks for a user and password: put them in the URL (rtsp://user:password@host/path)"), auth: true}
			}
			return result{err: c.errorf("401 Unauthorized: wrong user or password in the URL"), auth: true}
		case base.StatusForbidden:
			return result{err: c.errorf("403 Forbidden: the user in the URL may not read this stream"), auth: true}
		case base.StatusNotFound:
			return result{err: c.errorf("404 Not Found: no such stream path")}
		}
		return result{err: c.errorf("%s: %d %s", stage, bad.Code, bad.Message)}
	}
	var to liberrors.ErrClientRequestTimedOut
	if errors.As(err, &to) {
		return result{err: c.errorf("no answer within %v (%s)", c.m.opts.ReadTimeout, stage)}
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return result{err: c.errorf("no answer within %v (connecting)", c.m.opts.DialTimeout)}
	}
	return result{err: c.errorf("%s: %v", stage, err)}
}

// lostWhy says why a playing connection ended.
func lostWhy(err error) string {
	if err == nil {
		return "closed"
	}
	return err.Error()
}
