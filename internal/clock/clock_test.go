package clock

import (
	"testing"
	"time"
)

func TestFakeRunsTimersInOrder(t *testing.T) {
	c := NewFake(time.Unix(0, 0))
	var got []int
	c.AfterFunc(30*time.Millisecond, func() { got = append(got, 3) })
	c.AfterFunc(10*time.Millisecond, func() {
		got = append(got, 1)
		c.AfterFunc(5*time.Millisecond, func() { got = append(got, 2) }) // set from inside a timer
	})
	stopped := c.AfterFunc(20*time.Millisecond, func() { got = append(got, 99) })
	if !stopped.Stop() || stopped.Stop() {
		t.Fatal("Stop: first call reports pending, second not")
	}
	c.Advance(25 * time.Millisecond)
	if want := []int{1, 2}; len(got) != 2 || got[0] != 1 || got[1] != 2 {
		t.Fatalf("after 25 ms: %v, want %v", got, want)
	}
	if c.Now() != time.Unix(0, 0).Add(25*time.Millisecond) {
		t.Fatalf("now %v", c.Now())
	}
	c.Advance(time.Second)
	if len(got) != 3 || got[2] != 3 || c.Pending() != 0 {
		t.Fatalf("after 1 s: %v, pending %d", got, c.Pending())
	}
	ch := c.After(time.Millisecond)
	c.Advance(time.Millisecond)
	select {
	case <-ch:
	default:
		t.Fatal("After did not fire")
	}
}

// TestFakeStep: Step runs one due timer at a time, earliest first (the
// first set among equals), moves the clock to its time and never past
// limit; a timer set from inside a step runs in a later step when due.
// Next tells the earliest pending timer's time.
func TestFakeStep(t *testing.T) {
	t0 := time.Unix(0, 0)
	c := NewFake(t0)
	if _, ok := c.Next(); ok {
		t.Fatal("Next on a clock without timers")
	}
	var got []string
	at := func(d time.Duration, name string) {
		c.AfterFunc(d, func() {
			got = append(got, name)
			if name == "b" {
				c.AfterFunc(0, func() { got = append(got, "b-child") }) // due at once: the next step
			}
		})
	}
	at(20*time.Millisecond, "c")
	at(10*time.Millisecond, "a")
	at(10*time.Millisecond, "b")
	c.AfterFunc(5*time.Millisecond, func() { got = append(got, "stopped") }).Stop()
	const none = -1
	steps := []struct {
		next  time.Duration // Next before the step (none: no timer pending)
		limit time.Duration
		ran   bool
		now   time.Duration // the clock after the step
		last  string        // the timer it ran
	}{
		{10 * time.Millisecond, 5 * time.Millisecond, false, 0, ""},
		{10 * time.Millisecond, time.Second, true, 10 * time.Millisecond, "a"},
		{10 * time.Millisecond, time.Second, true, 10 * time.Millisecond, "b"},
		{10 * time.Millisecond, 10 * time.Millisecond, true, 10 * time.Millisecond, "b-child"},
		{20 * time.Millisecond, 19 * time.Millisecond, false, 10 * time.Millisecond, ""},
		{20 * time.Millisecond, time.Second, true, 20 * time.Millisecond, "c"},
		{none, time.Hour, false, 20 * time.Millisecond, ""},
	}
	for i, s := range steps {
		next, ok := c.Next()
		if ok != (s.next != none) || ok && next != t0.Add(s.next) {
			t.Fatalf("step %d: Next = +%v %v, want +%v", i, next.Sub(t0), ok, s.next)
		}
		n := len(got)
		ran := c.Step(t0.Add(s.limit))
		last := ""
		if len(got) > n {
			last = got[len(got)-1]
		}
		if ran != s.ran || len(got)-n > 1 || last != s.last || c.Now() != t0.Add(s.now) {
			t.Fatalf("step %d (limit %v): ran %v %q, clock +%v; want ran %v %q, clock +%v (all so far %v)",
				i, s.limit, ran, last, c.Now().Sub(t0), s.ran, s.last, s.now, got)
		}
	}
	if c.Pending() != 0 {
		t.Fatalf("%d timers pending after every step", c.Pending())
	}
}
