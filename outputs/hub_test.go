package outputs_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/media"
	"github.com/mdag/mdag/outputs"
	"github.com/mdag/mdag/outputs/spool"
)

// fakeTransport records what it is sent; fail decides each call's outcome.
type fakeTransport struct {
	mu    sync.Mutex
	got   []outputs.Message
	calls int
	fail  func(call int, batch []outputs.Message) (int, error) // nil: all acked
	sent  chan struct{}
}

func newFake() *fakeTransport { return &fakeTransport{sent: make(chan struct{}, 1024)} }

func (f *fakeTransport) Send(ctx context.Context, batch []outputs.Message) (int, error) {
	f.mu.Lock()
	f.calls++
	call := f.calls
	fail := f.fail
	f.mu.Unlock()
	n, err := len(batch), error(nil)
	if fail != nil {
		n, err = fail(call, batch)
	}
	f.mu.Lock()
	f.got = append(f.got, batch[:n]...)
	f.mu.Unlock()
	select {
	case f.sent <- struct{}{}:
	default:
	}
	return n, err
}

func (f *fakeTransport) Describe() string { return "fake" }
func (f *fakeTransport) Close() error     { return nil }

func (f *fakeTransport) messages() []outputs.Message {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.got)
}

// waitFor polls cond (the hub's goroutines run on their own) for at most
// 10 s: a bound for a loaded machine, not a timing.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	end := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(end) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// advanceUntil moves the fake clock on a second at a time until cond
// holds (backoffs and idle waits fire whenever they were armed), for at
// most 10 s of real time.
func advanceUntil(t *testing.T, clk *clock.Fake, what string, cond func() bool) {
	t.Helper()
	waitFor(t, what, func() bool {
		if cond() {
			return true
		}
		clk.Advance(time.Second)
		return false
	})
}

func openSpool(t *testing.T, maxBytes int64, policy spool.Policy, clk clock.Clock) *spool.Spool {
	t.Helper()
	sp, err := spool.Open(spool.Options{Dir: t.TempDir(), MaxBytes: maxBytes, MaxAge: time.Hour, WhenFull: policy, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	return sp
}

func start(t *testing.T, clk clock.Clock, tr outputs.Transport, sp *spool.Spool, kinds ...string) *outputs.Hub {
	t.Helper()
	h, err := outputs.Start(outputs.Config{App: "lot", Clock: clk, BackoffMin: time.Second, BackoffMax: 8 * time.Second,
		Outputs: []outputs.Output{{Name: "o", Kinds: kinds, Every: 10 * time.Second, Transport: tr, Spool: sp}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h
}

func body(t *testing.T, m outputs.Message) outputs.Body {
	t.Helper()
	var b outputs.Body
	if err := json.Unmarshal(m.Body, &b); err != nil {
		t.Fatalf("%v: %s", err, m.Body)
	}
	return b
}

// TestMessages: each kind's messages from a run of results: an event per
// rule event, counts only when they change (and not for a dropped frame),
// every frame's result; the schema's fields and unique ids.
func TestMessages(t *testing.T) {
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	clk := clock.NewFake(base)
	tr := newFake()
	h := start(t, clk, tr, openSpool(t, 1<<20, spool.DropOldest, clk), outputs.KindEvent, outputs.KindCounts, outputs.KindFrame)
	res := func(seq uint64, outcome string, counts map[string]int, ev ...media.Event) outputs.Result {
		return outputs.Result{App: "lot", Stream: "cam/1", Seq: seq, Outcome: outcome, Latency: 40 * time.Millisecond,
			Finished: base.Add(time.Duration(seq) * 100 * time.Millisecond), Counts: counts, Events: ev,
			Boxes: []media.Box{{X: 1, Y: 2, W: 3, H: 4, Class: "car", Score: 0.9}}}
	}
	h.Add(res(0, "finished", map[string]int{"car": 1}, media.Event{Kind: "enter", Rule: "gate", Track: 7}))
	h.Add(res(1, "finished", map[string]int{"car": 1}))
	h.Add(res(2, "dropped", nil))
	h.Add(res(3, "late", nil))
	want := []struct {
		kind string
		seq  uint64
	}{{"event", 0}, {"counts", 0}, {"frame", 0}, {"frame", 1}, {"frame", 2}, {"counts", 3}, {"frame", 3}}
	waitFor(t, "7 messages", func() bool { return len(tr.messages()) >= len(want) })
	got := tr.messages()
	if len(got) != len(want) {
		t.Fatalf("%d messages, want %d", len(got), len(want))
	}
	ids := map[string]bool{}
	for i, m := range got {
		b := body(t, m)
		if b.Kind != want[i].kind || b.Seq != want[i].seq || m.Kind != b.Kind || m.Stream != "cam/1" || m.App != "lot" || b.Schema != outputs.Schema || m.ID != b.ID {
			t.Errorf("message %d: %s %+v, want %s of frame %d", i, m.Body, m, want[i].kind, want[i].seq)
		}
		if ids[m.ID] {
			t.Errorf("message %d: id %s given twice", i, m.ID)
		}
		ids[m.ID] = true
		if wantCap := base.Add(time.Duration(b.Seq)*100*time.Millisecond - 40*time.Millisecond); !b.Capture.Equal(wantCap) {
			t.Errorf("message %d: capture %v, want %v (finished - latency)", i, b.Capture, wantCap)
		}
		if m.Retain != (b.Kind == "counts") {
			t.Errorf("message %d (%s): retain %v", i, b.Kind, m.Retain)
		}
	}
	if e := body(t, got[0]).Event; e == nil || *e != (outputs.Event{Kind: "enter", Rule: "gate", Track: 7}) {
		t.Errorf("event %+v", e)
	}
	if c := body(t, got[5]).Counts; c == nil || len(c) != 0 {
		t.Errorf("counts after the car left: %v, want {} (an empty object)", c)
	}
	if f := body(t, got[4]).Frame; f == nil || f.Outcome != "dropped" {
		t.Errorf("frame 2: %+v", f)
	}
	st := h.Status()[0]
	if st.Published != 7 || st.Waiting != 0 || !st.Connected || st.Dropped() != 0 {
		t.Errorf("status %+v", st)
	}
}

// TestRetryInOrder: sends that fail are tried again after a doubling
// backoff, from the first message not acknowledged (a send that got some
// acknowledged is progress: the rest goes at once, no backoff); order
// holds, the status says the output was down and is back.
func TestRetryInOrder(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	tr := newFake()
	tr.fail = func(call int, batch []outputs.Message) (int, error) {
		if call <= 3 { // 2: one acknowledged, then a failure: progress, sent again at once
			return min(1, len(batch)) * (1 - call%2), errors.New("connection refused")
		}
		return len(batch), nil
	}
	h := start(t, clk, tr, openSpool(t, 1<<20, spool.DropOldest, clk), outputs.KindFrame)
	for i := range 20 {
		h.Add(outputs.Result{Stream: "s", Seq: uint64(i), Outcome: "finished", Finished: clk.Now()})
	}
	waitFor(t, "the output down", func() bool { return !h.Status()[0].Connected })
	advanceUntil(t, clk, "20 messages", func() bool { return h.Status()[0].Published == 20 })
	var seqs []uint64
	for _, m := range tr.messages() {
		seqs = append(seqs, body(t, m).Seq)
	}
	for i, s := range seqs {
		if s != uint64(i) {
			t.Fatalf("delivered in order %v, want 0..19 once each (a failed batch's acked prefix is not sent again)", seqs)
		}
	}
	st := h.Status()[0]
	if !st.Connected || st.Retried != 2 || st.LastError != "connection refused" || !st.DownSince.IsZero() {
		t.Errorf("status %+v", st)
	}
}

// TestPermanent: a message the destination refuses for good is dropped
// and counted; the next ones go.
func TestPermanent(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	tr := newFake()
	var once sync.Once
	tr.fail = func(call int, batch []outputs.Message) (int, error) {
		n := -1
		once.Do(func() { n = 0 })
		if n == 0 {
			return 0, outputs.Permanent("413 too large")
		}
		return len(batch), nil
	}
	h := start(t, clk, tr, openSpool(t, 1<<20, spool.DropOldest, clk), outputs.KindFrame)
	for i := range 3 {
		h.Add(outputs.Result{Stream: "s", Seq: uint64(i), Outcome: "finished", Finished: clk.Now()})
		if i == 0 {
			waitFor(t, "the refusal", func() bool { return h.Status()[0].Rejected == 1 })
		}
	}
	waitFor(t, "2 published", func() bool { return h.Status()[0].Published == 2 })
	if got := tr.messages(); len(got) != 2 || body(t, got[0]).Seq != 1 {
		t.Errorf("delivered %d, want frames 1 and 2", len(got))
	}
	if st := h.Status()[0]; st.Rejected != 1 || st.Dropped() != 1 || !st.Connected {
		t.Errorf("status %+v", st)
	}
}

// TestSpoolFullDropsOldest: while the destination is down a bounded spool
// drops its oldest messages and counts them; when it is back, the rest
// arrive in order, the newest included.
func TestSpoolFullDropsOldest(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	tr := newFake()
	var mu sync.Mutex
	down := true
	tr.fail = func(call int, batch []outputs.Message) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		if down {
			return 0, errors.New("broker down")
		}
		return len(batch), nil
	}
	h := start(t, clk, tr, openSpool(t, 64<<10, spool.DropOldest, clk), outputs.KindFrame)
	const n = 400 // about 300 bytes each: 120 KB into a 64 KiB spool
	for i := range n {
		h.Add(outputs.Result{Stream: "s", Seq: uint64(i), Outcome: "finished", Finished: clk.Now(), Labels: []string{fmt.Sprintf("%0100d", i)}})
	}
	waitFor(t, "every result spooled", func() bool {
		st := h.Status()[0]
		return uint64(st.Waiting)+st.DroppedFull >= n
	})
	waitFor(t, "the output down", func() bool { return !h.Status()[0].Connected })
	st := h.Status()[0]
	if st.DroppedFull == 0 || st.SpoolBytes > 64<<10 {
		t.Fatalf("status %+v: want drops counted and at most 64 KiB waiting while down", st)
	}
	mu.Lock()
	down = false
	mu.Unlock()
	advanceUntil(t, clk, "the spool drained", func() bool { return h.Status()[0].Waiting == 0 })
	st = h.Status()[0]
	got := tr.messages()
	if uint64(len(got))+st.DroppedFull != n || body(t, got[len(got)-1]).Seq != n-1 {
		t.Fatalf("%d delivered + %d dropped, want %d, the last one frame %d", len(got), st.DroppedFull, n, n-1)
	}
	for i := 1; i < len(got); i++ {
		if body(t, got[i]).Seq != body(t, got[i-1]).Seq+1 {
			t.Fatalf("a gap inside what was delivered at %d: the oldest go first, the rest in order", i)
		}
	}
}

// TestState: every Every, each stream that sent since the last tick gets
// its state (latest counts); a quiet stream gets none.
func TestState(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	tr := newFake()
	h := start(t, clk, tr, openSpool(t, 1<<20, spool.DropOldest, clk), outputs.KindState)
	h.Add(outputs.Result{Stream: "a", Seq: 4, Outcome: "finished", Finished: clk.Now(), Counts: map[string]int{"person": 2}})
	h.Add(outputs.Result{Stream: "b", Seq: 9, Outcome: "finished", Finished: clk.Now()})
	// the hub takes the results queued before a tick first
	clk.Advance(10 * time.Second)
	waitFor(t, "2 states", func() bool { return len(tr.messages()) == 2 })
	got := tr.messages()
	a, b := body(t, got[0]), body(t, got[1])
	if a.Stream != "a" || a.Kind != "state" || a.Seq != 4 || a.Counts["person"] != 2 || b.Stream != "b" || b.Counts == nil || !got[0].Retain {
		t.Errorf("states %+v %+v", a, b)
	}
	// a quiet tick sends nothing; then only b sends: only b gets a state
	clk.Advance(10 * time.Second)
	h.Add(outputs.Result{Stream: "b", Seq: 10, Outcome: "finished", Finished: clk.Now()})
	advanceUntil(t, clk, "a third state", func() bool { return len(tr.messages()) >= 3 })
	if got := tr.messages(); body(t, got[2]).Stream != "b" || body(t, got[2]).Seq != 10 {
		t.Errorf("the third state is %s, want b's of frame 10 (a was quiet)", got[2].Body)
	}
}

// TestCloseLeavesNoGoroutines: Close stops the hub's goroutines, and what
// was not sent stays in the spool for the next start.
func TestCloseLeavesNoGoroutines(t *testing.T) {
	before := runtime.NumGoroutine()
	dir := t.TempDir()
	clk := clock.Real{}
	sp, err := spool.Open(spool.Options{Dir: dir, MaxBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	tr := newFake()
	tr.fail = func(int, []outputs.Message) (int, error) { return 0, errors.New("down") }
	h, err := outputs.Start(outputs.Config{App: "lot", Clock: clk, Outputs: []outputs.Output{{Name: "o", Kinds: []string{"frame"}, Transport: tr, Spool: sp}}})
	if err != nil {
		t.Fatal(err)
	}
	h.Add(outputs.Result{Stream: "s", Outcome: "finished", Finished: time.Now()})
	waitFor(t, "a failed send", func() bool { return h.Status()[0].Retried > 0 })
	for i := range 2000 { // queued when Close comes: made into messages first
		h.Add(outputs.Result{Stream: "s", Seq: uint64(i + 1), Outcome: "finished", Finished: time.Now()})
	}
	h.Close()
	waitFor(t, "the goroutines gone", func() bool { return runtime.NumGoroutine() <= before })
	sp, err = spool.Open(spool.Options{Dir: dir, MaxBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer sp.Close()
	if st := sp.Stats(); st.Waiting != 2001 {
		t.Errorf("after Close: %d waiting, want 2001 (the unsent one and the 2000 queued)", st.Waiting)
	}
}
