// Package clocktest helps tests drive goroutines on a fake clock: Counting
// counts the timers set on it by duration, so a test can wait until the
// goroutine it drives has set its next timer before it moves the clock (a
// timer set after the move would count from the new time, and the test
// would hang or pass for the wrong reason).
package clocktest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/mdag/mdag/internal/clock"
)

// Counting is a clock.Fake that counts AfterFunc (and so After) calls by
// duration. Only tests use it: the count grows with every distinct
// duration, which a long virtual-time run must not pay for.
type Counting struct {
	*clock.Fake
	mu   sync.Mutex
	set  map[time.Duration]int
	wake chan struct{} // closed and replaced at each AfterFunc
}

// NewCounting returns a counting fake clock reading start.
func NewCounting(start time.Time) *Counting {
	return &Counting{Fake: clock.NewFake(start), set: map[time.Duration]int{}, wake: make(chan struct{})}
}

// AfterFunc implements clock.Clock, counting the timer.
func (c *Counting) AfterFunc(d time.Duration, f func()) clock.Timer {
	tm := c.Fake.AfterFunc(d, f)
	c.mu.Lock()
	c.set[d]++
	close(c.wake)
	c.wake = make(chan struct{})
	c.mu.Unlock()
	return tm
}

// After implements clock.Clock, counting the timer.
func (c *Counting) After(d time.Duration) <-chan time.Time {
	ch := make(chan time.Time, 1)
	c.AfterFunc(d, func() { ch <- c.Now() })
	return ch
}

// Armed is how many timers of duration d have been set.
func (c *Counting) Armed(d time.Duration) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.set[d]
}

// Await waits until at least n timers of duration d have been set, or ctx
// ends (an error saying how many were).
func (c *Counting) Await(ctx context.Context, d time.Duration, n int) error {
	for {
		c.mu.Lock()
		got, wake := c.set[d], c.wake
		c.mu.Unlock()
		if got >= n {
			return nil
		}
		select {
		case <-wake:
		case <-ctx.Done():
			return fmt.Errorf("waited for timer %d of %v: %d set (%w)", n, d, got, ctx.Err())
		}
	}
}

// Recv returns the next value from ch (the zero value once it is closed),
// failing the test if none comes within limit. limit is wall time: the
// wait is for another goroutine's step, not for time to pass, and it only
// bounds a failure.
func Recv[T any](t testing.TB, ch <-chan T, limit time.Duration, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(limit):
		t.Fatalf("%s: nothing in %v", what, limit)
		var zero T
		return zero
	}
}
