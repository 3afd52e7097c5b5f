// Package clock is the time source every deterministic part of mdag takes:
// the runtime reads the time and sets timers only through a Clock, so tests
// drive it with Fake and the service runs on Real.
package clock

import (
	"container/heap"
	"sync"
	"time"
)

// Clock tells the time and runs functions later.
type Clock interface {
	Now() time.Time
	// AfterFunc calls f in its own goroutine after d; Stop cancels it.
	AfterFunc(d time.Duration, f func()) Timer
	// After returns a channel that receives once d has passed.
	After(d time.Duration) <-chan time.Time
}

// Timer is a pending AfterFunc.
type Timer interface {
	// Stop cancels the call; it reports whether the call was still pending.
	Stop() bool
}

// Real is the wall clock.
type Real struct{}

// Now implements Clock.
func (Real) Now() time.Time { return time.Now() }

// AfterFunc implements Clock.
func (Real) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }

// After implements Clock.
func (Real) After(d time.Duration) <-chan time.Time { return time.After(d) }

// After implements Clock.
func (c *Fake) After(d time.Duration) <-chan time.Time {
	ch := make(chan time.Time, 1)
	c.AfterFunc(d, func() { ch <- c.Now() })
	return ch
}

// Fake is a manual clock: time moves only when Advance or Set is called, and
// due timers run, in time order, inside that call. Pending timers sit in a
// heap ordered by (time, set order), so a virtual-time run with many
// thousands of timers steps in O(log n) each.
type Fake struct {
	mu     sync.Mutex
	now    time.Time
	timers timerHeap
	live   int // timers neither run nor stopped
	seq    int
}

type fakeTimer struct {
	c    *Fake
	at   time.Time
	seq  int
	f    func()
	done bool
}

// timerHeap is a min-heap of timers by (at, seq); stopped timers stay in it
// until they reach the top.
type timerHeap []*fakeTimer

func (h timerHeap) Len() int { return len(h) }
func (h timerHeap) Less(i, j int) bool {
	if !h[i].at.Equal(h[j].at) {
		return h[i].at.Before(h[j].at)
	}
	return h[i].seq < h[j].seq
}
func (h timerHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *timerHeap) Push(x any)   { *h = append(*h, x.(*fakeTimer)) }
func (h *timerHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return x
}

// NewFake returns a fake clock reading start.
func NewFake(start time.Time) *Fake { return &Fake{now: start} }

// Now implements Clock.
func (c *Fake) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// AfterFunc implements Clock. The function runs synchronously inside the
// Advance call that reaches its time.
func (c *Fake) AfterFunc(d time.Duration, f func()) Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	t := &fakeTimer{c: c, at: c.now.Add(d), seq: c.seq, f: f}
	heap.Push(&c.timers, t)
	c.live++
	return t
}

// Stop implements Timer.
func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := !t.done
	if was {
		t.done = true
		t.c.live--
	}
	return was
}

// Advance moves the clock forward by d, running due timers in order.
func (c *Fake) Advance(d time.Duration) { c.Set(c.Now().Add(d)) }

// Set moves the clock to t (never backwards), running due timers in order.
func (c *Fake) Set(t time.Time) {
	for c.Step(t) {
	}
	c.mu.Lock()
	if t.After(c.now) {
		c.now = t
	}
	c.mu.Unlock()
}

// top drops stopped timers off the heap and returns the earliest pending
// one (nil if none). c.mu is held.
func (c *Fake) top() *fakeTimer {
	for len(c.timers) > 0 {
		if t := c.timers[0]; !t.done {
			return t
		}
		heap.Pop(&c.timers)
	}
	return nil
}

// Step runs the earliest pending timer due at or before limit (the first
// set among those due at the same instant), moving the clock to its time
// (never backwards), and reports whether one ran. A test that must see
// each timer's effects before the next one fires (a timer that wakes
// another goroutine, which then sets timers of its own) steps one timer
// at a time with a barrier between steps, then Sets the clock to limit.
func (c *Fake) Step(limit time.Time) bool {
	c.mu.Lock()
	next := c.top()
	if next == nil || next.at.After(limit) {
		c.mu.Unlock()
		return false
	}
	heap.Pop(&c.timers)
	next.done = true
	c.live--
	if next.at.After(c.now) {
		c.now = next.at
	}
	c.mu.Unlock()
	next.f()
	return true
}

// Next is the time of the earliest pending timer; false if none is.
func (c *Fake) Next() (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if t := c.top(); t != nil {
		return t.at, true
	}
	return time.Time{}, false
}

// Pending is the number of timers not yet run or stopped.
func (c *Fake) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.live
}
