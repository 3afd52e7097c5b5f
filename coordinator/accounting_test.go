package coordinator

import (
	"testing"
	"time"
)

// TestWindowsWaitForOpenFrames: a window closes only when every frame sent
// in it has ended (issue 18: window 755 listed 40 sent = 24 finished + 9
// dropped, 7 missing, because late outcomes came after it closed).
func TestWindowsWaitForOpenFrames(t *testing.T) {
	a := newAccounting()
	t0 := time.Unix(1000, 0)
	at := func(sec int, ms int) time.Time {
		return t0.Add(time.Duration(sec)*time.Second + time.Duration(ms)*time.Millisecond)
	}
	// Second 0: two frames, one ends, one stays open. Second 1: one frame, ends.
	a.sent(at(0, 100))
	a.sent(at(0, 200))
	a.sent(at(1, 100))
	a.outcome(at(0, 100), FrameResult{Outcome: Finished, Latency: 50 * time.Millisecond})
	a.outcome(at(1, 100), FrameResult{Outcome: Finished, Latency: 50 * time.Millisecond})
	cutoff := at(5, 0)
	if ws := a.windowsBefore(cutoff, 10); len(ws) != 0 {
		t.Fatalf("windows %+v listed while a frame of the first is open", ws)
	}
	a.outcome(at(0, 200), FrameResult{Outcome: Late, Latency: 900 * time.Millisecond})
	ws := a.windowsBefore(cutoff, 10)
	if len(ws) != 2 {
		t.Fatalf("got %d windows, want 2", len(ws))
	}
	for _, w := range ws {
		if w.Sent != w.Finished+w.Late+w.Dropped {
			t.Errorf("window %v: sent %d != finished %d + late %d + dropped %d", w.Start, w.Sent, w.Finished, w.Late, w.Dropped)
		}
	}
	if ws[0].Late != 1 || ws[0].Finished != 1 {
		t.Errorf("first window %+v: the late outcome is not in it", ws[0])
	}
	// Before the cutoff a window is never listed, complete or not.
	if ws := a.windowsBefore(at(1, 500), 10); len(ws) != 1 {
		t.Errorf("cutoff inside second 1: %d windows, want 1", len(ws))
	}
}
