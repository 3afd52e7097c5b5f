package rtsp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sort"
	"sync"
	"time"

	"github.com/mdag/mdag/ingest"
	"github.com/mdag/mdag/internal/clock"
)

// Options tune the camera readers; zero fields take the defaults.
type Options struct {
	// Clock times the handshake bound, the backoff and the gaps
	// (default clock.Real).
	Clock clock.Clock
	// Log receives camera-lost events (WARN), refused feeds and failed
	// connections (ERROR for 401 and refusals, WARN otherwise). Default:
	// slog.Default().
	Log *slog.Logger
	// DialTimeout bounds a connection's setup: TCP connect, OPTIONS,
	// DESCRIBE, SETUP and PLAY together (default 5 s).
	DialTimeout time.Duration
	// ReadTimeout ends a connection that delivers no packet for this
	// long once playing (default 10 s).
	ReadTimeout time.Duration
	// BackoffMin and BackoffMax bound the wait before a reconnect: it
	// starts at BackoffMin and doubles up to BackoffMax (defaults 1 s and
	// 30 s); each wait is jittered down by up to a half.
	BackoffMin, BackoffMax time.Duration
	// StableAfter: a connection that delivered frames this long resets
	// the backoff to BackoffMin when it ends (default 10 s).
	StableAfter time.Duration
	// Jitter returns a number in [0, 1): the share of the wait taken off
	// (times a half). Default math/rand; tests fix it.
	Jitter func() float64
}

func (o *Options) defaults() {
	if o.Clock == nil {
		o.Clock = clock.Real{}
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.DialTimeout <= 0 {
		o.DialTimeout = 5 * time.Second
	}
	if o.ReadTimeout <= 0 {
		o.ReadTimeout = 10 * time.Second
	}
	if o.BackoffMin <= 0 {
		o.BackoffMin = time.Second
	}
	if o.BackoffMax < o.BackoffMin {
		o.BackoffMax = max(30*time.Second, o.BackoffMin)
	}
	if o.StableAfter <= 0 {
		o.StableAfter = 10 * time.Second
	}
	if o.Jitter == nil {
		o.Jitter = rand.Float64
	}
}

// State is a camera's state in status.
type State string

// The states of a camera.
const (
	// Connecting: the first connection is being set up.
	Connecting State = "connecting"
	// Streaming: playing; frames flow.
	Streaming State = "streaming"
	// Reconnecting: the camera went away or refused; waiting or
	// connecting again.
	Reconnecting State = "reconnecting"
	// Failed: a permanent error (no H.264 or H.265 video); not retried.
	Failed State = "failed"
	// Stopped: the stream ended (the server ended it for shutdown, or
	// Close).
	Stopped State = "stopped"
)

// CameraStatus is one camera's state for `mdag status`, the dashboard and
// metrics. It never holds a password.
type CameraStatus struct {
	Name      string    `json:"name"`
	App       string    `json:"app"`
	Source    string    `json:"source"`              // the URL without user information
	Codec     string    `json:"codec,omitempty"`     // h264 or h265, once described
	Transport string    `json:"transport,omitempty"` // tcp or udp, once playing
	State     State     `json:"state"`
	Since     time.Time `json:"since"` // when State was entered
	// Connects counts connections that reached PLAY; Reconnects the
	// connection attempts after the first (failed ones included);
	// CameraLost the connections lost while streaming (camera-lost
	// events).
	Connects   uint64 `json:"connects"`
	Reconnects uint64 `json:"reconnects"`
	CameraLost uint64 `json:"camera_lost"`
	// Frames and KeyFrames handed to the feed; Lost access units that
	// never arrived whole.
	Frames    uint64 `json:"frames"`
	KeyFrames uint64 `json:"key_frames"`
	Lost      uint64 `json:"lost"`
	// LastError is the latest error (no password), LastErrorAt its time.
	LastError   string    `json:"last_error,omitempty"`
	LastErrorAt time.Time `json:"last_error_at,omitempty"`
	// LastGap is the latest gap in frames across a camera-lost event or
	// a stream the server ended (the last frame before it to the first
	// after); GapTotal all gaps;
	// Down how long the camera has been without frames now (0 while
	// streaming): since its last frame, or for a camera that never
	// delivered one, since its first connection attempt.
	LastGap  time.Duration `json:"last_gap_ns"`
	GapTotal time.Duration `json:"gap_total_ns"`
	Down     time.Duration `json:"down_ns"`
	// NextRetry is when the next connection attempt starts (zero unless
	// waiting).
	NextRetry time.Time `json:"next_retry,omitempty"`
}

// Manager reads a set of cameras, one goroutine each, into an ingest
// server's Feeds.
type Manager struct {
	opts   Options
	feeds  ingest.Feeds
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu   sync.Mutex
	cams []*camera
}

// Start checks cams (Check, without the app list: the server refuses an
// app it does not serve) and starts reading each; it returns at once.
// Close stops them.
func Start(ctx context.Context, cams []Camera, feeds ingest.Feeds, opts Options) (*Manager, error) {
	if feeds == nil {
		return nil, errors.New("rtsp: no ingest server (Feeds) to hand the cameras to")
	}
	if err := Check(cams, nil); err != nil {
		return nil, err
	}
	opts.defaults()
	ctx, cancel := context.WithCancel(ctx)
	m := &Manager{opts: opts, feeds: feeds, cancel: cancel}
	now := opts.Clock.Now()
	for _, c := range cams {
		cam := &camera{m: m, cfg: c,
			log: opts.Log.With("camera", c.Name, "source", c.Source())}
		cam.st = CameraStatus{Name: c.Name, App: c.App, Source: c.Source(), State: Connecting, Since: now}
		m.cams = append(m.cams, cam)
	}
	for _, cam := range m.cams {
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			cam.run(ctx)
		}()
	}
	return m, nil
}

// Run reads cams until ctx ends, then stops them (Start, Close).
func Run(ctx context.Context, cams []Camera, feeds ingest.Feeds, opts Options) error {
	m, err := Start(ctx, cams, feeds, opts)
	if err != nil {
		return err
	}
	<-ctx.Done()
	m.Close()
	return nil
}

// Close stops every camera: the connections close and each feed still
// open ends with kind "shutdown". It waits for the goroutines.
func (m *Manager) Close() {
	m.cancel()
	m.wg.Wait()
}

// Wait blocks until every camera has stopped: failed permanently, ended by
// the server for shutdown, or closed.
func (m *Manager) Wait() { m.wg.Wait() }

// Status is every camera's status, by name.
func (m *Manager) Status() []CameraStatus {
	now := m.opts.Clock.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]CameraStatus, 0, len(m.cams))
	for _, c := range m.cams {
		s := c.st
		since := c.downSince
		if c.lastFrame.IsZero() {
			// Never a frame (a wrong password, a wrong path, no H.264 or
			// H.265): down since the first connection attempt.
			since = c.firstAttempt
		}
		if !since.IsZero() && s.State != Streaming {
			s.Down = now.Sub(since)
		}
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// camera is one camera's reader.
type camera struct {
	m   *Manager
	cfg Camera
	log *slog.Logger

	// under m.mu
	st           CameraStatus
	downSince    time.Time // the last frame before the current outage
	lastFrame    time.Time
	firstAttempt time.Time // the start of the first connection attempt

	feed   ingest.Feed // the camera's feed, opened at the first connect and after the server ended one
	codec  string
	endErr error // why the server ended the last feed (serverEnded)
}

func (c *camera) update(f func(s *CameraStatus)) {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	f(&c.st)
}

func (c *camera) setState(s State) {
	now := c.m.opts.Clock.Now()
	c.update(func(st *CameraStatus) {
		if st.State != s {
			st.State, st.Since = s, now
		}
		if s != Reconnecting {
			st.NextRetry = time.Time{}
		}
	})
}

// fail records err (already redacted) as the last error.
func (c *camera) fail(msg string) {
	now := c.m.opts.Clock.Now()
	c.update(func(st *CameraStatus) { st.LastError, st.LastErrorAt = msg, now })
}

// feedDone is the open feed's Done, or nil (blocks forever in a select).
func (c *camera) feedDone() <-chan struct{} {
	if c.feed == nil {
		return nil
	}
	return c.feed.Done()
}

// run connects, streams and reconnects until ctx ends, the server ends the
// feed for shutdown, or a permanent error.
func (c *camera) run(ctx context.Context) {
	o := &c.m.opts
	backoff := o.BackoffMin
	attempts := 0
	failed := false
	defer func() {
		if c.feed != nil && ctx.Err() != nil {
			select {
			case <-c.feed.Done():
			default:
				c.feed.End("shutdown", "mdag is stopping: camera "+c.cfg.Name+" closed")
			}
		}
		if !failed {
			c.setState(Stopped)
		}
	}()
	for {
		if ctx.Err() != nil {
			return
		}
		retry := attempts > 0
		start := o.Clock.Now()
		c.update(func(st *CameraStatus) {
			if c.firstAttempt.IsZero() {
				c.firstAttempt = start
			}
			st.NextRetry = time.Time{} // not waiting any more
			if retry {
				st.Reconnects++
			}
		})
		attempts++
		res := c.connect(ctx)
		if ctx.Err() != nil {
			return
		}
		if res.ended {
			if c.serverEnded() {
				return
			}
			res.err, res.refused = c.endErr, true
		}
		if res.permanent {
			c.fail(res.err.Error())
			c.log.Error("camera failed: not retried", "err", res.err.Error())
			if c.feed != nil {
				c.feed.End("error", res.err.Error())
			}
			c.setState(Failed)
			failed = true
			return
		}
		if res.streamed >= o.StableAfter {
			backoff = o.BackoffMin
		}
		wait := backoff
		if res.auth {
			wait = o.BackoffMax // a wrong password does not fix itself soon
		}
		if res.err != nil {
			c.fail(res.err.Error())
		}
		backoff = min(backoff*2, o.BackoffMax)
		wait -= time.Duration(o.Jitter() * float64(wait) / 2)
		c.setState(Reconnecting)
		// The timer is set before NextRetry is shown: a test that reads
		// NextRetry and moves a fake clock there finds the timer set.
		timer := o.Clock.After(wait)
		next := o.Clock.Now().Add(wait)
		c.update(func(st *CameraStatus) { st.NextRetry = next })
		if res.err != nil {
			lvl := slog.LevelWarn
			if res.auth || res.refused {
				lvl = slog.LevelError
			}
			c.log.Log(ctx, lvl, "camera: retrying", "err", res.err.Error(), "retry_in", wait.Round(time.Millisecond))
		}
		for waiting := true; waiting; {
			select {
			case <-ctx.Done():
				return
			case <-c.feedDone():
				// The server ended the stream while the camera was away.
				if c.serverEnded() {
					return
				}
			case <-timer:
				waiting = false
			}
		}
	}
}

// serverEnded handles the end of the camera's feed by the server (its Done
// closed): for "shutdown" (mdag is stopping) and "client" (the camera's own
// end) it reports true: the camera stops. Any other kind (capacity,
// stream-limit, join-failed, connect-timeout, overload, error: the server
// or its session refused the stream for now) is recorded as the last error
// (endErr), the outage starts, and the feed is dropped: the next
// connection opens a new one, a new stream of the session.
func (c *camera) serverEnded() (stop bool) {
	kind, why := c.feed.Ended()
	switch kind {
	case "shutdown", "client":
		return true
	}
	if kind == "" {
		kind = "unknown"
	}
	msg := "the server ended the stream (" + kind + ")"
	if why != "" {
		msg += ": " + RedactText(why)
	}
	c.endErr = c.errorf("%s", msg)
	c.log.Error("camera: the server ended the stream", "err", c.endErr.Error())
	c.fail(c.endErr.Error())
	now := c.m.opts.Clock.Now()
	c.m.mu.Lock()
	if c.downSince.IsZero() {
		c.downSince = c.lastFrame
		if c.downSince.IsZero() {
			c.downSince = now
		}
	}
	c.m.mu.Unlock()
	c.feed, c.codec = nil, ""
	return false
}

// result is how one connection ended.
type result struct {
	err       error         // why (redacted), nil for a clean stop
	permanent bool          // not worth retrying
	auth      bool          // 401: retried slowly
	refused   bool          // the server refused the feed
	ended     bool          // the feed ended (by the server): serverEnded decides
	streamed  time.Duration // from the first frame to the end
}

// errorf builds a camera error: "camera NAME: SOURCE: what", without the
// user information of any URL in it (RedactText: the arguments may be
// library errors that quote the camera's URL).
func (c *camera) errorf(format string, args ...any) error {
	msg := fmt.Sprintf("camera %s: %s: ", c.cfg.Name, c.cfg.Source()) + fmt.Sprintf(format, args...)
	return errors.New(RedactText(msg))
}
