package coordinator

import (
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/ingest/synth"
	"github.com/mdag/mdag/media"
	"github.com/mdag/mdag/modules"
)

// opTap records what a stateful op of a live app did: every frame it
// processed, per stream, with the items that came out. The op itself is
// the real one (modules.Builtin), built with the app's params; the tap
// only looks.
type opTap struct {
	mu     sync.Mutex
	frames map[string][]tapFrame // by stream, in call order
}

// tapFrame is one ProcessFrame call.
type tapFrame struct {
	seq uint64
	in  int
	out []*media.Item
}

// tapProc is the real processor with the tap around ProcessFrame.
type tapProc struct {
	inner interface {
		modules.Processor
		modules.Stateful
	}
	tap *opTap
}

func (p *tapProc) Process(it *media.Item) ([]*media.Item, error) { return p.inner.Process(it) }

func (p *tapProc) ProcessFrame(stream string, seq uint64, items []*media.Item) ([]*media.Item, error) {
	out, err := p.inner.ProcessFrame(stream, seq, items)
	if err == nil {
		p.tap.mu.Lock()
		p.tap.frames[stream] = append(p.tap.frames[stream], tapFrame{seq: seq, in: len(items), out: out})
		p.tap.mu.Unlock()
	}
	return out, err
}

func (p *tapProc) Snapshot(stream string) ([]byte, error) { return p.inner.Snapshot(stream) }
func (p *tapProc) Restore(stream string, b []byte) error  { return p.inner.Restore(stream, b) }
func (p *tapProc) Close()                                 { p.inner.Close() }

func newOpTap() *opTap { return &opTap{frames: map[string][]tapFrame{}} }

// calls is what the op did for stream, in call order.
func (t *opTap) calls(stream string) []tapFrame {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Clone(t.frames[stream])
}

// tappedOps is the builtin ops with every stateful module of app built by
// the real op with the app's params, behind a tap (one per module).
func tappedOps(t *testing.T, app *dag.App) (*modules.Registry, map[dag.ModuleID]*opTap) {
	t.Helper()
	reg := modules.Builtin()
	taps := map[dag.ModuleID]*opTap{}
	for _, m := range app.Modules {
		op, ok := modules.Lookup(modules.OpID(m.Op))
		if m.Kind != dag.CPU || !ok || !op.Stateful {
			continue
		}
		tap, raw, name := newOpTap(), m.Params, modules.OpID(m.Op)
		taps[m.Name] = tap
		err := reg.Replace(name, func(modules.Params) (modules.Processor, error) {
			p, err := modules.Builtin().New(name, raw)
			if err != nil {
				return nil, err
			}
			inner, ok := p.(interface {
				modules.Processor
				modules.Stateful
			})
			if !ok {
				return nil, fmt.Errorf("op %s is declared stateful but its processor is not modules.Stateful", name)
			}
			return &tapProc{inner: inner, tap: tap}, nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return reg, taps
}

// liveApp is one of TestAppsLive's apps: how many streams, what the
// synthetic cameras show and what its outputs must say.
type liveApp struct {
	name    string
	streams int
	motion  synth.Motion
	classes []string // nil: the pattern's default (car, person, truck, bus)
	// items is how many items each frame brings to each stateful module
	// (all of them gathered into one call: one per person after a crop,
	// plus track's one at activity)
	items map[dag.ModuleID]int
	check func(t *testing.T, r *appRun)
}

// appRun is what TestAppsLive's run of one app left to check.
type appRun struct {
	app    *dag.App
	f      *fakeRun
	pat    *synth.Pattern
	ids    []string // the streams, by pattern index
	frames uint64   // frames sent per stream
	taps   map[dag.ModuleID]*opTap
	ss     SessionStatus
}

// results is the outcome of every frame of stream, by seq.
func (r *appRun) results(t *testing.T, stream string) []FrameResult {
	t.Helper()
	out := make([]FrameResult, r.frames)
	for seq := range r.frames {
		res, ok := r.f.rec.result(stream, seq)
		if !ok {
			t.Fatalf("%s frame %d: no outcome", stream, seq)
		}
		out[seq] = res
	}
	return out
}

// liveObjects is how many objects each synthetic frame of TestAppsLive
// shows.
const liveObjects = 3

// liveSpan is how long TestAppsLive's cameras stream, in fake time.
const liveSpan = 10 * time.Second

// TestAppsLive runs each of the six video apps of Scrooge's seven (the
// audio app has its own source) live on the fake clock: 2-4 synthetic
// cameras at the app's fps for 10 s on emulated GPUs (their profiles'
// latencies) and the real CPU ops, the stateful ones included. Every frame
// must be accounted for (sent = finished + late + dropped, none open),
// at least 95% must finish within the SLO, every stateful module must have
// processed every frame that finished, in seq order per stream, holding
// state for every stream, with all of a frame's items in one call, and
// each app's outputs must be what its pipeline computes from the
// cameras' objects (see each case).
func TestAppsLive(t *testing.T) {
	cases := []liveApp{
		{name: "traffic", streams: 4, check: checkTraffic},
		{name: "face", streams: 3, check: checkFace},
		{name: "tracker", streams: 3, motion: synth.Lanes, classes: []string{"person"}, items: map[dag.ModuleID]int{"track": liveObjects}, check: checkTracker},
		{name: "pose", streams: 3, motion: synth.Lanes, classes: []string{"person"}, items: map[dag.ModuleID]int{"window": 1}, check: checkSteps("window", 8)},
		{name: "caption", streams: 2, items: map[dag.ModuleID]int{"order": 1}, check: checkSteps("order", 16)},
		{name: "actdet", streams: 2, motion: synth.Lanes, classes: []string{"person"},
			items: map[dag.ModuleID]int{"track": liveObjects, "activity": liveObjects + 1}, check: checkActdet},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) { runAppLive(t, c) })
		})
	}
}

func runAppLive(t *testing.T, c liveApp) {
	app, prof := loadExample(t, c.name)
	ops, taps := tappedOps(t, app)
	f := startFake(t, Config{Log: testLog(t), Ops: ops}, everyType)
	if err := f.e.Deploy(app, prof); err != nil {
		t.Fatal(err)
	}
	pat, err := synth.NewPattern(320, 240, liveObjects)
	if err != nil {
		t.Fatal(err)
	}
	pat.Motion = c.motion
	if c.classes != nil {
		pat.Classes = c.classes
	}
	r := &appRun{app: app, f: f, pat: pat, frames: uint64(liveSpan.Seconds() * app.FPS), taps: taps}
	for i := range c.streams {
		id := fmt.Sprintf("%s-%d", c.name, i)
		r.ids = append(r.ids, id)
		f.stream(app.Name, id, i, pat, app.FPS, r.frames)
	}
	f.advance(liveSpan)
	f.until("every frame to end", 20*time.Second, func() bool { return f.e.Status().Sessions[0].Open == 0 })
	r.ss = f.e.Status().Sessions[0]
	tot := r.ss.Total
	t.Logf("%s: %d streams at %g fps: sent %d, finished %d, late %d, dropped %d; finish rate %.4f; p50 %.1f ms, p99 %.1f ms; drops %v",
		c.name, c.streams, app.FPS, tot.Sent, tot.Finished, tot.Late, tot.Dropped, tot.FinishRate(), r.ss.P50MS, r.ss.P99MS, r.ss.Drops)
	if want := uint64(c.streams) * r.frames; tot.Sent != want || tot.Finished+tot.Late+tot.Dropped != tot.Sent || r.ss.Open != 0 {
		t.Fatalf("accounting: %+v, open %d; want %d sent, every one ended", tot, r.ss.Open, want)
	}
	if rate := tot.FinishRate(); rate < 0.95 {
		t.Errorf("finish rate %.4f < 0.95 (drops %v)", rate, r.ss.Drops)
	}
	for _, m := range app.Modules {
		tap := taps[m.Name]
		if tap == nil {
			continue
		}
		if st := stateOf(r.ss, m.Name); st == nil || st.Streams != c.streams {
			t.Errorf("module %s: state %+v, want state for %d streams", m.Name, st, c.streams)
		}
		for _, id := range r.ids {
			calls := tap.calls(id)
			finished := 0
			for _, res := range r.results(t, id) {
				if res.Outcome == Finished {
					finished++
				}
			}
			if len(calls) < finished {
				t.Errorf("module %s, %s: %d frames processed, fewer than the %d that finished", m.Name, id, len(calls), finished)
			}
			for _, call := range calls {
				if call.in != c.items[m.Name] {
					t.Errorf("module %s, %s frame %d: %d items in one call, want the frame's %d (gathered)", m.Name, id, call.seq, call.in, c.items[m.Name])
				}
			}
			for i := 1; i < len(calls); i++ {
				if calls[i].seq <= calls[i-1].seq {
					t.Errorf("module %s, %s: frame %d processed after frame %d", m.Name, id, calls[i].seq, calls[i-1].seq)
				}
			}
		}
	}
	c.check(t, r)
}

// truth is what the camera of stream index showed on frame seq.
func (r *appRun) truth(t *testing.T, index int, seq uint64) []media.Box {
	t.Helper()
	_, boxes, err := r.pat.Frame(index, seq)
	if err != nil {
		t.Fatal(err)
	}
	return boxes
}

// finished calls f with every finished frame of every stream.
func (r *appRun) finished(t *testing.T, f func(index int, stream string, res FrameResult)) {
	t.Helper()
	for i, id := range r.ids {
		for _, res := range r.results(t, id) {
			if res.Outcome == Finished {
				f(i, id, res)
			}
		}
	}
}

// sortedClasses is the classes of boxes, sorted.
func sortedClasses(boxes []media.Box) []string {
	out := make([]string, len(boxes))
	for i, b := range boxes {
		out[i] = b.Class
	}
	slices.Sort(out)
	return out
}

// checkTraffic: each finished frame's labels are its objects' classes
// (vehicles classified, people's faces recognised) and its counts are its
// vehicles by class (count after classify).
func checkTraffic(t *testing.T, r *appRun) {
	r.finished(t, func(i int, id string, res FrameResult) {
		truth := r.truth(t, i, res.Seq)
		vehicles := map[string]int{}
		for _, b := range truth {
			if b.Class != "person" {
				vehicles[b.Class]++
			}
		}
		labels := slices.Sorted(slices.Values(res.Labels))
		if !slices.Equal(labels, sortedClasses(truth)) || !maps.Equal(res.Counts, vehicles) {
			t.Errorf("%s frame %d: labels %v, counts %v; want labels %v, counts %v", id, res.Seq, labels, res.Counts, sortedClasses(truth), vehicles)
		}
	})
}

// checkFace: each finished frame carries one keypoints result per object
// (the crop takes every detection; the emulated PRNet labels each crop
// with its class).
func checkFace(t *testing.T, r *appRun) {
	r.finished(t, func(i int, id string, res FrameResult) {
		truth := r.truth(t, i, res.Seq)
		if labels := slices.Sorted(slices.Values(res.Labels)); !slices.Equal(labels, sortedClasses(truth)) {
			t.Errorf("%s frame %d: labels %v, want one per object: %v", id, res.Seq, labels, sortedClasses(truth))
		}
	})
}

// checkTracks checks the tracks of the finished frames against the
// objects (people going back and forth in lanes of their own, so they
// never overlap): from the second frame on (min_hits 2) every frame has
// one confirmed, matched track per object, each track's box is its
// object's box in that frame, and each track id follows one object for
// the whole run (its lane, the box's Y, never changes): no id switches.
// It returns the track id of each lane, per stream.
func checkTracks(t *testing.T, r *appRun) map[string]map[uint64]int {
	lanes := map[string]map[uint64]int{}
	r.finished(t, func(i int, id string, res FrameResult) {
		if lanes[id] == nil {
			lanes[id] = map[uint64]int{}
		}
		if res.Seq == 0 {
			if len(res.Tracks) != 0 {
				t.Errorf("%s frame 0: tracks %+v before min_hits 2", id, res.Tracks)
			}
			return
		}
		truth := r.truth(t, i, res.Seq)
		if len(res.Tracks) != len(truth) {
			t.Errorf("%s frame %d: %d tracks %+v, want one per object (%d)", id, res.Seq, len(res.Tracks), res.Tracks, len(truth))
			return
		}
		for _, tr := range res.Tracks {
			k := slices.IndexFunc(truth, func(b media.Box) bool { return b.Y == tr.Box.Y })
			if k < 0 || tr.Missed != 0 || tr.Box != truth[k] {
				t.Errorf("%s frame %d: track %+v is no object's box (objects %+v)", id, res.Seq, tr, truth)
				continue
			}
			if y, ok := lanes[id][tr.ID]; ok && y != tr.Box.Y {
				t.Errorf("%s frame %d: track %d moved from the object at y=%d to the one at y=%d (id switch)", id, res.Seq, tr.ID, y, tr.Box.Y)
			}
			lanes[id][tr.ID] = tr.Box.Y
		}
	})
	for _, id := range r.ids {
		if n := len(lanes[id]); n != liveObjects {
			t.Errorf("%s: %d track ids over the run, want %d (one per object): %v", id, n, liveObjects, lanes[id])
		}
	}
	return lanes
}

func checkTracker(t *testing.T, r *appRun) { checkTracks(t, r) }

// checkSteps checks a window-like module's outputs (window for pose,
// sequence for caption): per stream, each frame's output carries the
// last min(size, frames so far) frames the module processed as Steps,
// oldest first, ending with the frame itself, whose Step has the frame's
// objects (the emulated model before it reports them).
func checkSteps(m dag.ModuleID, size int) func(*testing.T, *appRun) {
	return func(t *testing.T, r *appRun) {
		for i, id := range r.ids {
			calls := r.taps[m].calls(id)
			if len(calls) == 0 {
				t.Fatalf("%s: %s processed no frame", id, m)
			}
			for k, c := range calls {
				if len(c.out) != 1 {
					t.Fatalf("%s: %s frame %d: %d outputs, want 1", id, m, c.seq, len(c.out))
				}
				var got, want []uint64
				for _, st := range c.out[0].Steps {
					got = append(got, st.Seq)
				}
				for _, p := range calls[max(0, k+1-size) : k+1] {
					want = append(want, p.seq)
				}
				if !slices.Equal(got, want) {
					t.Fatalf("%s: %s frame %d: steps of frames %v, want %v", id, m, c.seq, got, want)
				}
				if last := c.out[0].Steps[len(got)-1]; !slices.Equal(last.Boxes, r.truth(t, i, c.seq)) {
					t.Fatalf("%s: %s frame %d: its step has boxes %v, want the frame's objects %v", id, m, c.seq, last.Boxes, r.truth(t, i, c.seq))
				}
			}
		}
	}
}

// checkActdet: the tracks are right as the tracker's are (checkTracks),
// and examples/actdet's activity rules fire exactly when the tracked
// people do what the rules say: "middle", the line x = 160 drawn bottom
// to top, once per crossing of a matched track's centre between two
// frames, "left-to-right" when it moves right on the image; "left", the
// zone x <= 80, once 2 s (capture time) after a centre entered it and
// stayed. Each event names the track and its identity (reid's label).
// The people cross the middle and linger at the left edge in these 10 s
// (the Lanes motion), so both rules must fire.
func checkActdet(t *testing.T, r *appRun) {
	checkTracks(t, r)
	const line, zone, dwell = 160.0, 80.0, 2 * time.Second
	period := time.Duration(float64(time.Second) / r.app.FPS)
	type episode struct {
		side    int
		in      bool
		since   uint64
		dwelled bool
	}
	kinds := map[string]int{}
	for _, id := range r.ids {
		eps := map[uint64]*episode{}
		var want, got []media.Event
		for _, c := range r.taps["activity"].calls(id) {
			out := c.out[0]
			got = append(got, out.Events...)
			for _, tr := range out.Tracks {
				if tr.Missed != 0 {
					continue
				}
				cx := float64(tr.Box.X) + float64(tr.Box.W)/2
				side := 0
				switch {
				case cx > line:
					side = 1
				case cx < line:
					side = -1
				}
				inside := cx <= zone
				e := eps[tr.ID]
				if e == nil {
					eps[tr.ID] = &episode{side: side, in: inside, since: c.seq}
					continue
				}
				if side != 0 && e.side != 0 && side != e.side {
					dir := map[int]string{1: "left-to-right", -1: "right-to-left"}[side]
					want = append(want, media.Event{Kind: "line-cross", Rule: "middle", Track: tr.ID,
						Detail: fmt.Sprintf("track %d (person) crossed line middle %s", tr.ID, dir)})
				}
				if side != 0 {
					e.side = side
				}
				switch {
				case !inside:
					e.in, e.dwelled = false, false
				case !e.in:
					e.in, e.since, e.dwelled = true, c.seq, false
				case !e.dwelled && time.Duration(c.seq-e.since)*period >= dwell:
					e.dwelled = true
					want = append(want, media.Event{Kind: "dwell", Rule: "left", Track: tr.ID,
						Detail: fmt.Sprintf("track %d (person) stayed in zone left for %v", tr.ID, time.Duration(c.seq-e.since)*period)})
				}
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s: events\n  %+v\nwant\n  %+v", id, got, want)
		}
		n := 0
		for _, e := range want {
			kinds[e.Kind]++
			if e.Kind == "line-cross" {
				n++
			}
		}
		if n == 0 {
			t.Errorf("%s: no line crossing in %v: the test's people should cross the middle", id, liveSpan)
		}
		// The results carry the events to the client.
		var results []media.Event
		for _, res := range r.results(t, id) {
			results = append(results, res.Events...)
		}
		if !slices.Equal(results, got) {
			t.Errorf("%s: the frames' results carry events %+v, want the activity module's %+v", id, results, got)
		}
	}
	if kinds["dwell"] == 0 {
		t.Errorf("no dwell event in any stream (events by kind %v): the test's people should stay at the left edge 2 s", kinds)
	}
	t.Logf("activity events by kind: %v", kinds)
}
