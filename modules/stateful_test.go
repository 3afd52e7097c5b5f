package modules

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mdag/mdag/media"
)

// render writes items' results (not pixels) in one comparable string.
func render(items []*media.Item) string {
	var b strings.Builder
	for _, it := range items {
		fmt.Fprintf(&b, "%s/%d boxes=%v labels=%q tracks=%v events=%v steps=%v", it.Stream, it.Seq, it.Boxes, it.Labels, it.Tracks, it.Events, it.Steps)
		if it.Audio != nil {
			fmt.Fprintf(&b, " audio=%d/%d/%v", it.Audio.Rate, it.Audio.Channels, it.Audio.PCM)
		}
		b.WriteString("\n")
	}
	return b.String()
}

// frame is one frame's items for a stateful op.
type frame []*media.Item

var t0 = time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)

// item makes an item of stream s, frame seq (captured seq/10 s after t0).
func item(s string, seq uint64) *media.Item {
	return &media.Item{Stream: s, Seq: seq, Capture: t0.Add(time.Duration(seq) * 100 * time.Millisecond)}
}

// trackFrames: three objects (two cars crossing, a person) moving at
// constant velocity over n frames with frames 9 and 10 dropped and the
// person unseen on frames 14-16.
func trackFrames(stream string, n int) []frame {
	var out []frame
	for seq := uint64(1); seq <= uint64(n); seq++ {
		if seq == 9 || seq == 10 {
			continue
		}
		it := item(stream, seq)
		s := int(seq)
		it.Boxes = []media.Box{
			{X: 10 + 6*s, Y: 100, W: 40, H: 30, Class: "car", Score: 0.9},
			{X: 400 - 6*s, Y: 104, W: 40, H: 30, Class: "car", Score: 0.8},
		}
		if seq < 14 || seq > 16 {
			it.Boxes = append(it.Boxes, media.Box{X: 200, Y: 20 + 3*s, W: 20, H: 50, Class: "person", Score: 0.7})
		}
		out = append(out, frame{it})
	}
	return out
}

// windowFrames: frames with one or two items, delivered with 4 and 5
// swapped.
func windowFrames(stream string, n int) []frame {
	var out []frame
	for i := 1; i <= n; i++ {
		seq := uint64(i)
		switch i {
		case 4:
			seq = 5
		case 5:
			seq = 4
		}
		it := item(stream, seq)
		it.Boxes = []media.Box{{X: i, Y: i, W: 10, H: 10, Class: "kp"}}
		it.Labels = []string{fmt.Sprint("pose", i)}
		f := frame{it}
		if i%3 == 0 {
			it2 := item(stream, seq)
			it2.Labels = []string{"second"}
			f = append(f, it2)
		}
		out = append(out, f)
	}
	return out
}

// activityFrames: one track walking right across x=100 and into a zone,
// an identity item for it every frame.
func activityFrames(stream string, n int) []frame {
	var out []frame
	for seq := uint64(1); seq <= uint64(n); seq++ {
		b := media.Box{X: 40 + 10*int(min(seq, 20)), Y: 40, W: 20, H: 20, Class: "person"}
		tr := item(stream, seq)
		tr.Tracks = []media.Track{{ID: 7, Box: b, Hits: int(seq), Age: int(seq)}, {ID: 9, Box: media.Box{X: 400, Y: 400, W: 10, H: 10}, Missed: 1}}
		id := item(stream, seq)
		id.Region, id.Labels = &b, []string{"alice"}
		out = append(out, frame{tr, id})
	}
	return out
}

// segmentFrames: 16 kHz mono audio in pieces of 300 samples (a 40 ms
// chunk is 640).
func segmentFrames(stream string, n int) []frame {
	var out []frame
	k := int16(0)
	for seq := uint64(1); seq <= uint64(n); seq++ {
		it := item(stream, seq)
		pcm := make([]int16, 300)
		for i := range pcm {
			pcm[i], k = k, k+1
		}
		it.Audio = &media.Audio{Rate: 16000, Channels: 1, PCM: pcm}
		out = append(out, frame{it})
	}
	return out
}

var statefulCases = []struct {
	op     OpID
	params map[string]any
	frames func(stream string, n int) []frame
	marker string // in the outputs of every cut's remaining frames: the test is not vacuous
}{
	{"track", nil, trackFrames, "tracks=[{"},
	{"track", map[string]any{"min_hits": 1, "max_age": 2}, trackFrames, "tracks=[{"},
	{"window", map[string]any{"size": 4}, windowFrames, "steps=[{"},
	{"sequence", map[string]any{"context": 5, "max_gap": 0}, windowFrames, "steps=[{"},
	// line-cross at frame 6, dwell at 13 (entered at 10), loiter at 23.
	{"activity", map[string]any{"rules": []any{"line door 100,0,100,200", "zone desk 150,0,300,100 dwell 3f", "loiter hall 200,0,400,100 300ms radius 5"}}, activityFrames, "events=[{"},
	{"segment", map[string]any{"chunk": "40ms"}, segmentFrames, "audio="},
}

func newStateful(t testing.TB, op OpID, params map[string]any) Stateful {
	t.Helper()
	p, err := Builtin().New(op, params)
	if err != nil {
		t.Fatal(err)
	}
	st, ok := p.(Stateful)
	if !ok {
		t.Fatalf("%s: processor %T is not Stateful", op, p)
	}
	return st
}

func runFrames(t testing.TB, st Stateful, frames []frame) string {
	t.Helper()
	var b strings.Builder
	for _, f := range frames {
		out, err := st.ProcessFrame(f[0].Stream, f[0].Seq, f)
		if err != nil {
			t.Fatalf("frame %s/%d: %v", f[0].Stream, f[0].Seq, err)
		}
		b.WriteString(render(out))
	}
	return b.String()
}

// TestStatefulRegistry: every declared op with Stateful builds (from
// RegisterBuiltin, with default params) a processor implementing
// Stateful, and the builtin registry implements every pure-Go op.
func TestStatefulRegistry(t *testing.T) {
	r := Builtin()
	n := 0
	for _, op := range Ops() {
		if !op.Stateful {
			continue
		}
		n++
		if op.Name == "motion" {
			continue // OpenCV's: modules/cv tests it
		}
		if !r.Has(op.Name) {
			t.Errorf("stateful op %s has no builtin factory", op.Name)
			continue
		}
		p, err := r.New(op.Name, nil)
		if err != nil {
			t.Errorf("%s with default params: %v", op.Name, err)
			continue
		}
		if _, ok := p.(Stateful); !ok {
			t.Errorf("%s: processor %T does not implement Stateful", op.Name, p)
		}
		p.Close()
	}
	for _, name := range r.Implemented() {
		if op, _ := Lookup(OpID(name)); !op.Stateful {
			p, err := r.New(op.Name, nil)
			if err != nil {
				t.Errorf("%s: %v", name, err)
				continue
			}
			if _, ok := p.(Stateful); ok {
				t.Errorf("%s is not declared Stateful but its processor is", name)
			}
		}
	}
	if n != 6 {
		t.Errorf("%d stateful ops declared, want 6 (track window sequence activity segment motion)", n)
	}
}

// TestSnapshotRestoreContinues is the property the engine's migration
// relies on: for every op, N frames through one processor, a snapshot,
// a restore into a new processor and M more frames there give exactly the
// outputs of one processor running N+M frames. Another stream runs
// interleaved on the old processor and must not be disturbed; Restore(nil)
// forgets; the snapshot of a restored state is the same bytes.
func TestSnapshotRestoreContinues(t *testing.T) {
	for _, tc := range statefulCases {
		t.Run(fmt.Sprintf("%s%v", tc.op, tc.params), func(t *testing.T) {
			frames := tc.frames("cam", 24)
			other := tc.frames("other", 24)
			for _, cut := range []int{1, 5, 9, 12, 13, len(frames) - 1} {
				whole := newStateful(t, tc.op, tc.params)
				runFrames(t, whole, frames[:cut])
				want := runFrames(t, whole, frames[cut:])
				if cut < len(frames)-1 && !strings.Contains(want, tc.marker) {
					t.Fatalf("cut %d: no %q in the outputs after the cut:\n%s", cut, tc.marker, want)
				}

				a := newStateful(t, tc.op, tc.params)
				for i := 0; i < cut; i++ {
					runFrames(t, a, frames[i:i+1])
					runFrames(t, a, other[i:i+1])
				}
				snap, err := a.Snapshot("cam")
				if err != nil {
					t.Fatal(err)
				}
				b := newStateful(t, tc.op, tc.params)
				if err := b.Restore("cam", snap); err != nil {
					t.Fatalf("cut %d: restore: %v", cut, err)
				}
				again, err := b.Snapshot("cam")
				if err != nil || !bytes.Equal(again, snap) {
					t.Fatalf("cut %d: the restored state snapshots differently (err %v)", cut, err)
				}
				if err := a.Restore("cam", nil); err != nil {
					t.Fatal(err)
				}
				if got := runFrames(t, b, frames[cut:]); got != want {
					t.Fatalf("cut %d: after restore\n%s\nwant\n%s", cut, got, want)
				}
				// The other stream on a is untouched by cam's export.
				solo := newStateful(t, tc.op, tc.params)
				runFrames(t, solo, other[:cut])
				if got, want := runFrames(t, a, other[cut:]), runFrames(t, solo, other[cut:]); got != want {
					t.Fatalf("cut %d: stream other after cam left\n%s\nwant\n%s", cut, got, want)
				}
				// cam forgotten on a: it starts fresh there.
				if got, want := runFrames(t, a, frames[:cut]), runFrames(t, newStateful(t, tc.op, tc.params), frames[:cut]); got != want {
					t.Fatalf("cut %d: cam after Restore(nil)\n%s\nwant a fresh start\n%s", cut, got, want)
				}
			}
		})
	}
}

func enc(s trackState) []byte { return encodeTrackState(&s) }

// tk is a track of id with width w, matched first at frame first and
// last at seen, hits times.
func tk(id uint64, w float64, first, seen uint64, hits int) trackItem {
	return trackItem{ID: id, Class: "car", X: 1, Y: 1, W: w, H: 5, First: first, Seen: seen, Hits: hits, Labels: []string{"a"}}
}

// TestRestoreRefuses: snapshots of another op, another version, damaged
// or invalid payloads are refused with ErrState and leave the stream fresh.
func TestRestoreRefuses(t *testing.T) {
	tests := []struct {
		op      OpID
		params  map[string]any
		payload []byte
		version uint16
		want    string
	}{
		{"track", nil, enc(trackState{Started: true, Last: 5, NextID: 1}), 2, "state version 2"},
		{"track", nil, enc(trackState{Started: true, Last: 5}), 1, "next track id 0"},
		{"track", nil, enc(trackState{Started: true, Last: 5, NextID: 3, Tracks: []trackItem{tk(3, 5, 1, 2, 1)}}), 1, "track id 3: want 1..2"},
		{"track", nil, enc(trackState{Started: true, Last: 5, NextID: 3, Tracks: []trackItem{tk(1, 0, 1, 2, 1)}}), 1, "want a positive size"},
		{"track", nil, enc(trackState{Started: true, Last: 5, NextID: 3, Tracks: []trackItem{tk(1, math.NaN(), 1, 2, 1)}}), 1, "want finite numbers"},
		{"track", nil, enc(trackState{Started: true, Last: 5, NextID: 3, Tracks: []trackItem{tk(1, 4, 1, 7, 1)}}), 1, "want first <= last <= stream"},
		{"track", nil, enc(trackState{Started: true, Last: 5, NextID: 3, Tracks: []trackItem{tk(1, 4, 1, 2, 9)}}), 1, "9 hits between frames 1 and 2"},
		{"track", nil, enc(trackState{Started: true, Last: 5, NextID: 3, Tracks: []trackItem{tk(2, 4, 1, 2, 1), tk(1, 4, 1, 2, 1)}}), 1, "out of order"},
		{"track", nil, enc(trackState{Last: 5, NextID: 3, Tracks: []trackItem{tk(1, 4, 1, 2, 1)}}), 1, "1 tracks before any frame"},
		{"track", nil, append(enc(trackState{Started: true, Last: 5, NextID: 3}), 0), 1, "1 bytes after the state"},
		{"track", nil, enc(trackState{Started: true, Last: 5, NextID: 3, Tracks: []trackItem{tk(1, 4, 1, 2, 1)}})[:65], 1, "truncated"},
		{"track", nil, []byte{2, 5, 3, 0}, 1, "flags 0x2: want 0 or 1"},
		{"track", nil, []byte{1, 5, 3, 0xff, 0xff, 0x03}, 1, "tracks: 65535, more than the 4096 allowed"},
		{"track", nil, []byte{1, 5, 3, 2, 1}, 1, "tracks: 2, more than the 4096 allowed or than the 1 bytes left hold"},
		{"track", nil, []byte(`{"started":true,"last":5,"next":3}`), 1, "flags 0x7b"},
		{"window", nil, []byte(`{"steps":[{"Seq":4},{"Seq":2}]}`), 1, "steps out of order (2 after 4)"},
		{"window", nil, []byte(`{"steps":[{"Seq":4,"Boxes":[{"X":1,"Y":1,"W":-1,"H":3}]}]}`), 1, "want a positive size"},
		{"sequence", nil, []byte(`{"started":true,"newest":4,"start":1,"steps":[{"Seq":2},{"Seq":2}]}`), 1, "two steps of frame 2"},
		{"sequence", nil, []byte(`{"started":true,"newest":4,"start":3,"steps":[{"Seq":2}]}`), 1, "outside the scene"},
		{"activity", map[string]any{"rules": []any{"line a 0,0,1,1"}}, []byte(`{"rules":["b"],"started":false}`), 1, `a state for rules ["b"]`},
		{"activity", map[string]any{"rules": []any{"line a 0,0,1,1"}}, []byte(`{"rules":["a"],"started":true,"last":3,"tracks":[{"id":1,"seen":2,"x":1,"y":1,"rules":[]}]}`), 1, "state for 0 rules, want 1"},
		{"activity", map[string]any{"rules": []any{"line a 0,0,1,1"}}, []byte(`{"rules":["a"],"started":true,"last":3,"tracks":[{"id":1,"seen":2,"x":1,"y":1,"rules":[{"side":3}]}]}`), 1, "side 3"},
		{"segment", nil, []byte(`{"rate":16000,"channels":3,"pcm":[1,2,3]}`), 1, "audio with 3 channels"},
		{"segment", nil, []byte(`{"rate":16000,"channels":2,"pcm":[1,2,3]}`), 1, "do not divide"},
		{"segment", nil, []byte(`{"rate":16000,"channels":1,"pcm":[1,2,70000]}`), 1, "payload"},
	}
	for _, tc := range tests {
		t.Run(tc.want, func(t *testing.T) {
			st := newStateful(t, tc.op, tc.params)
			before, _ := st.Snapshot("s")
			err := st.Restore("s", EncodeState(tc.op, tc.version, tc.payload))
			if !errors.Is(err, ErrState) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("restore %s: %v, want ErrState and %q", tc.payload, err, tc.want)
			}
			if after, _ := st.Snapshot("s"); !bytes.Equal(after, before) {
				t.Errorf("a refused restore left state behind: %s", after)
			}
			other := "window"
			if tc.op == "window" {
				other = "track"
			}
			if err := st.Restore("s", EncodeState(OpID(other), 1, []byte("{}"))); !errors.Is(err, ErrState) {
				t.Errorf("a snapshot of op %s restored into %s: %v", other, tc.op, err)
			}
		})
	}
}

// TestProcessFrameRefuses: a frame with no items or an item of another
// frame is an error, as is a nil item to Process.
func TestProcessFrameRefuses(t *testing.T) {
	for _, tc := range statefulCases {
		st := newStateful(t, tc.op, tc.params)
		if _, err := st.ProcessFrame("s", 1, nil); err == nil || !strings.Contains(err.Error(), "has no items") {
			t.Errorf("%s: empty frame: %v", tc.op, err)
		}
		if _, err := st.ProcessFrame("s", 1, []*media.Item{item("s", 2)}); err == nil || !strings.Contains(err.Error(), "item 0 is of frame s/2") {
			t.Errorf("%s: mixed frame: %v", tc.op, err)
		}
		if _, err := st.(Processor).Process(nil); err == nil {
			t.Errorf("%s: nil item processed", tc.op)
		}
	}
}

// fuzzRestore: arbitrary bytes to Restore never panic; bytes it accepts
// snapshot to a state that restores to the same snapshot, and the
// processor runs frames after any restore without panicking. The bytes go
// in as they are and as the payload of a valid envelope (random bytes
// rarely pass the envelope's checksum: this reaches the payload checks).
func fuzzRestore(f *testing.F, op OpID, params map[string]any, frames func(string, int) []frame) {
	st := newStateful(f, op, params)
	fs := frames("s", 12)
	for i, fr := range fs {
		if _, err := st.ProcessFrame("s", fr[0].Seq, fr); err != nil {
			f.Fatal(err)
		}
		if i%4 == 0 {
			b, err := st.Snapshot("s")
			if err != nil {
				f.Fatal(err)
			}
			_, payload, err := DecodeState(op, b)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(b)
			f.Add(payload)
		}
	}
	f.Add([]byte{})
	f.Add(EncodeState(op, 1, []byte("{}")))
	f.Add(EncodeState(op, 1, []byte("null")))
	f.Fuzz(func(t *testing.T, b []byte) {
		restoreRun(t, op, params, fs, b)
		restoreRun(t, op, params, fs, EncodeState(op, 1, b))
	})
}

func restoreRun(t *testing.T, op OpID, params map[string]any, fs []frame, b []byte) {
	st := newStateful(t, op, params)
	if err := st.Restore("s", b); err != nil {
		if !errors.Is(err, ErrState) {
			t.Fatalf("restore error without ErrState: %v", err)
		}
		return
	}
	s1, err := st.Snapshot("s")
	if err != nil {
		t.Fatal(err)
	}
	st2 := newStateful(t, op, params)
	if err := st2.Restore("s", s1); err != nil {
		t.Fatalf("restore of a snapshot: %v", err)
	}
	if s2, _ := st2.Snapshot("s"); !bytes.Equal(s1, s2) {
		t.Fatalf("snapshot does not round-trip:\n%q\n%q", s1, s2)
	}
	for _, fr := range fs[len(fs)-3:] {
		_, _ = st.ProcessFrame("s", fr[0].Seq+1<<20, relabel(fr, fr[0].Seq+1<<20))
		_, _ = st.ProcessFrame("s", fr[0].Seq, fr)
	}
}

// relabel copies a frame's items to frame seq.
func relabel(f frame, seq uint64) []*media.Item {
	out := make([]*media.Item, len(f))
	for i, it := range f {
		c := *it
		c.Seq = seq
		out[i] = &c
	}
	return out
}

func FuzzRestoreTrack(f *testing.F) { fuzzRestore(f, "track", nil, trackFrames) }
func FuzzRestoreWindow(f *testing.F) {
	fuzzRestore(f, "window", map[string]any{"size": 4}, windowFrames)
}
func FuzzRestoreSequence(f *testing.F) {
	fuzzRestore(f, "sequence", map[string]any{"context": 5}, windowFrames)
}
func FuzzRestoreActivity(f *testing.F) {
	fuzzRestore(f, "activity", statefulCases[4].params, activityFrames)
}
func FuzzRestoreSegment(f *testing.F) { fuzzRestore(f, "segment", nil, segmentFrames) }

// TestStatefulConcurrentStreams: streams processed at once on one
// processor (as the runtime does for different streams), with snapshots
// taken meanwhile, give each stream the outputs it gets alone (run under
// -race: the per-stream locks).
func TestStatefulConcurrentStreams(t *testing.T) {
	for _, tc := range statefulCases {
		t.Run(fmt.Sprintf("%s%v", tc.op, tc.params), func(t *testing.T) {
			shared := newStateful(t, tc.op, tc.params)
			streams := []string{"a", "b", "c", "d"}
			got := make([]string, len(streams))
			errs := make(chan error, len(streams))
			var wg sync.WaitGroup
			for i, s := range streams {
				wg.Add(1)
				go func() {
					defer wg.Done()
					var b strings.Builder
					for _, f := range tc.frames(s, 24) {
						out, err := shared.ProcessFrame(s, f[0].Seq, f)
						if err != nil {
							errs <- err
							return
						}
						b.WriteString(render(out))
						if _, err := shared.Snapshot(streams[(i+1)%len(streams)]); err != nil {
							errs <- err
							return
						}
					}
					got[i] = b.String()
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			for i, s := range streams {
				if want := runFrames(t, newStateful(t, tc.op, tc.params), tc.frames(s, 24)); got[i] != want {
					t.Errorf("stream %s run beside others:\n%s\nwant\n%s", s, got[i], want)
				}
			}
		})
	}
}
