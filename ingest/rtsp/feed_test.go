package rtsp

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bluenviron/mediacommon/pkg/codecs/h264"

	"github.com/mdag/mdag/ingest"
)

// fakeFeeds is a recording ingest.Feeds: it decodes nothing, but checks
// what a decoder would need (Annex-B start codes, parameter sets in every
// key frame, key flags that match the NAL types, calls one at a time),
// skips frames before the first key frame after every open and every
// Disconnected as the server does (counting them: waitingKey), and counts
// everything.
type fakeFeeds struct {
	mu      sync.Mutex
	refuse  error // OpenFeed's answer while set
	opened  []*fakeFeed
	configs []ingest.FeedConfig
	tries   int
	changed chan struct{}
}

func newFakeFeeds() *fakeFeeds { return &fakeFeeds{changed: make(chan struct{}, 1)} }

func (f *fakeFeeds) notify() {
	select {
	case f.changed <- struct{}{}:
	default:
	}
}

func (f *fakeFeeds) OpenFeed(cfg ingest.FeedConfig) (ingest.Feed, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	defer f.notify()
	f.tries++
	f.configs = append(f.configs, cfg)
	if f.refuse != nil {
		return nil, f.refuse
	}
	for _, o := range f.opened {
		if o.cfg.Name == cfg.Name && !o.ended() {
			return nil, fmt.Errorf("stream %s is live: name in use", cfg.Name)
		}
	}
	ff := &fakeFeed{owner: f, cfg: cfg, done: make(chan struct{}), needKey: true}
	f.opened = append(f.opened, ff)
	return ff, nil
}

func (f *fakeFeeds) setRefuse(err error) {
	f.mu.Lock()
	f.refuse = err
	f.mu.Unlock()
}

// feed is the i-th feed opened, or nil.
func (f *fakeFeeds) feed(i int) *fakeFeed {
	f.mu.Lock()
	defer f.mu.Unlock()
	if i < len(f.opened) {
		return f.opened[i]
	}
	return nil
}

// waitFor waits until cond holds, on every change of any feed; it fails
// the test after d (a bound for a loaded machine, not a speed figure).
func (f *fakeFeeds) waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	// Status changes (states, timers) do not notify: re-check those
	// now and then as well.
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-f.changed:
		case <-tick.C:
		case <-deadline.C:
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
	}
}

type fakeFeed struct {
	owner *fakeFeeds
	cfg   ingest.FeedConfig
	busy  atomic.Int32 // calls in progress: more than one is a bug

	mu           sync.Mutex
	frames, keys int
	lost         int
	srs          int
	lastSR       [2]uint64
	disconnects  []string
	endKind      string
	endWhy       string
	problems     []string
	needKey      bool // frames wait for a key frame (open, Disconnected)
	waitingKey   int  // frames skipped waiting for one
	afterGap     int  // frames since the last Disconnected
	lastTS       uint32
	firstKeyNALs []int

	done     chan struct{}
	doneOnce sync.Once
}

func (f *fakeFeed) enter() func() {
	if f.busy.Add(1) != 1 {
		f.problem("two Feed calls at once")
	}
	return func() {
		f.busy.Add(-1)
		f.owner.notify()
	}
}

func (f *fakeFeed) problem(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.problems) < 20 {
		f.problems = append(f.problems, fmt.Sprintf(format, args...))
	}
}

func (f *fakeFeed) ID() string { return f.cfg.Name }

func (f *fakeFeed) Frame(au []byte, ts uint32, key bool) {
	defer f.enter()()
	nalus, err := h264.AnnexBUnmarshal(au)
	if err != nil || len(au) < 5 || au[0] != 0 || au[1] != 0 || au[2] != 0 || au[3] != 1 {
		f.problem("frame %d: not Annex-B with 4-byte start codes: %v", f.frames, err)
		return
	}
	var types []int
	isKey := false
	for _, n := range nalus {
		if len(n) == 0 {
			f.problem("frame %d: an empty NAL unit", f.frames)
			return
		}
		t := int(n[0] & 0x1f)
		if f.cfg.Codec == H265 {
			t = int(n[0]>>1) & 0x3f
		}
		types = append(types, t)
		if f.cfg.Codec == H265 && t >= 16 && t <= 21 || f.cfg.Codec == H264 && t == 5 {
			isKey = true
		}
	}
	if isKey != key {
		f.problem("frame %d: key %v, but its NAL types are %v", f.frames, key, types)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.needKey && !key {
		// As the server does: skipped and counted until a key frame.
		f.waitingKey++
		f.frames++
		return
	}
	if key {
		want := []int{7, 8}
		if f.cfg.Codec == H265 {
			want = []int{32, 33, 34}
		}
		for _, w := range want {
			if !containsInt(types, w) {
				f.problems = append(f.problems, fmt.Sprintf("key frame %d without parameter set %d (types %v)", f.frames, w, types))
			}
		}
		if f.firstKeyNALs == nil {
			f.firstKeyNALs = types
		}
		f.keys++
	}
	f.needKey = false
	f.frames++
	f.afterGap++
	f.lastTS = ts
}

func containsInt(list []int, v int) bool {
	for _, x := range list {
		if x == v {
			return true
		}
	}
	return false
}

func (f *fakeFeed) SenderReport(ntp uint64, ts uint32) {
	defer f.enter()()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.srs++
	f.lastSR = [2]uint64{ntp, uint64(ts)}
}

func (f *fakeFeed) Lost(n int) {
	defer f.enter()()
	if n <= 0 {
		f.problem("Lost(%d)", n)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lost += n
}

func (f *fakeFeed) Disconnected(why string) {
	defer f.enter()()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.disconnects = append(f.disconnects, why)
	f.needKey = true
	f.afterGap = 0
}

func (f *fakeFeed) End(kind, why string) {
	defer f.enter()()
	f.mu.Lock()
	if f.endKind == "" {
		f.endKind, f.endWhy = kind, why
	}
	f.mu.Unlock()
	f.doneOnce.Do(func() { close(f.done) })
}

// serverEnd ends the feed as the server does (shutdown, shed).
func (f *fakeFeed) serverEnd(kind, why string) {
	f.mu.Lock()
	if f.endKind == "" {
		f.endKind, f.endWhy = kind, why
	}
	f.mu.Unlock()
	f.doneOnce.Do(func() { close(f.done) })
	f.owner.notify()
}

func (f *fakeFeed) Done() <-chan struct{} { return f.done }

func (f *fakeFeed) Ended() (kind, why string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.endKind, f.endWhy
}

func (f *fakeFeed) ended() bool {
	select {
	case <-f.done:
		return true
	default:
		return false
	}
}

// snapshot is a copy of the counters.
type feedCounts struct {
	frames, keys, lost, srs, afterGap int
	waitingKey                        int
	disconnects                       []string
	endKind, endWhy                   string
	problems                          []string
}

func (f *fakeFeed) counts() feedCounts {
	if f == nil {
		return feedCounts{}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return feedCounts{frames: f.frames, keys: f.keys, waitingKey: f.waitingKey, lost: f.lost, srs: f.srs, afterGap: f.afterGap,
		disconnects: append([]string(nil), f.disconnects...), endKind: f.endKind, endWhy: f.endWhy,
		problems: append([]string(nil), f.problems...)}
}

var errRefused = errors.New("no CPU capacity for another stream")
