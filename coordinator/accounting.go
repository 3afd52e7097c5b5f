package coordinator

import (
	"maps"
	"slices"
	"sort"
	"time"
)

// accounting keeps a session's per-second windows, keyed by the second the
// frames were captured in, so a window's finish rate compares the frames
// sent in that second with how those same frames ended.
type accounting struct {
	windows map[int64]*window
	total   Counts
	drops   map[string]uint64 // "module: reason"
	lat     []time.Duration   // recent completed frames' latencies (ring)
	latPos  int
}

// Counts are frame outcomes.
type Counts struct {
	Sent     uint64 `json:"sent"`
	Finished uint64 `json:"finished"`
	Late     uint64 `json:"late"`
	Dropped  uint64 `json:"dropped"`
}

// Open is the frames sent and not yet ended.
func (c Counts) Open() uint64 { return c.Sent - c.Finished - c.Late - c.Dropped }

// FinishRate is finished / sent (0 with nothing sent).
func (c Counts) FinishRate() float64 {
	if c.Sent == 0 {
		return 0
	}
	return float64(c.Finished) / float64(c.Sent)
}

type window struct {
	Counts
	drops map[string]uint64
	lat   []time.Duration
}

const keepWindows = 120
const latRing = 4096

func newAccounting() *accounting {
	return &accounting{windows: map[int64]*window{}, drops: map[string]uint64{}}
}

func (a *accounting) win(t time.Time) *window {
	k := t.Unix()
	w := a.windows[k]
	if w == nil {
		w = &window{drops: map[string]uint64{}}
		a.windows[k] = w
		if len(a.windows) > keepWindows {
			oldest := k
			for x := range a.windows {
				oldest = min(oldest, x)
			}
			delete(a.windows, oldest)
		}
	}
	return w
}

func (a *accounting) sent(capture time.Time) {
	a.total.Sent++
	a.win(capture).Sent++
}

func (a *accounting) outcome(capture time.Time, r FrameResult) {
	w := a.win(capture)
	switch r.Outcome {
	case Finished:
		a.total.Finished++
		w.Finished++
	case Late:
		a.total.Late++
		w.Late++
	case Dropped:
		a.total.Dropped++
		w.Dropped++
		k := string(r.Module) + ": " + string(r.Reason)
		a.drops[k]++
		w.drops[k]++
		return
	}
	w.lat = append(w.lat, r.Latency)
	if len(a.lat) < latRing {
		a.lat = append(a.lat, r.Latency)
	} else {
		a.lat[a.latPos] = r.Latency
		a.latPos = (a.latPos + 1) % latRing
	}
}

// WindowStatus is one second of a session.
type WindowStatus struct {
	Start      time.Time         `json:"start"`
	Counts                       //
	FinishRate float64           `json:"finish_rate"`
	P50MS      float64           `json:"p50_ms"`
	P99MS      float64           `json:"p99_ms"`
	Drops      map[string]uint64 `json:"drops,omitempty"`
}

// windowsBefore lists the complete windows, oldest first, at most n. A
// window is complete when it ended before cutoff (all its frames are past
// their deadline) and every frame sent in it has an outcome: a frame still
// open past its deadline ends late or lost later and must be counted in its
// own window, so that window, and every later one, waits for it (windows
// become final in order; the lost-frame sweep bounds the wait).
func (a *accounting) windowsBefore(cutoff time.Time, n int) []WindowStatus {
	var keys []int64
	for k := range a.windows {
		if time.Unix(k+1, 0).Before(cutoff) || time.Unix(k+1, 0).Equal(cutoff) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for i, k := range keys {
		if a.windows[k].Open() > 0 {
			keys = keys[:i]
			break
		}
	}
	if len(keys) > n {
		keys = keys[len(keys)-n:]
	}
	out := make([]WindowStatus, 0, len(keys))
	for _, k := range keys {
		w := a.windows[k]
		ws := WindowStatus{Start: time.Unix(k, 0).UTC(), Counts: w.Counts, FinishRate: w.FinishRate(),
			P50MS: pct(w.lat, 0.5), P99MS: pct(w.lat, 0.99)}
		if len(w.drops) > 0 {
			ws.Drops = maps.Clone(w.drops)
		}
		out = append(out, ws)
	}
	return out
}

// pct is the q-quantile of ds in milliseconds (0 for none).
func pct(ds []time.Duration, q float64) float64 {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(q*float64(len(s)-1) + 0.5)
	return float64(s[i]) / float64(time.Millisecond)
}
