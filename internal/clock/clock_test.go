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
