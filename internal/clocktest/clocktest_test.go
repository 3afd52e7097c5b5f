package clocktest

import (
	"context"
	"testing"
	"time"
)

func TestAwait(t *testing.T) {
	c := NewCounting(time.Unix(0, 0))
	done := make(chan error, 1)
	go func() { done <- c.Await(context.Background(), time.Second, 2) }()
	c.After(time.Second)
	c.AfterFunc(2*time.Second, func() {}) // another duration: not counted for 1 s
	select {
	case err := <-done:
		t.Fatalf("returned after one timer of 1s: %v", err)
	default:
	}
	ch := c.After(time.Second)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := c.Armed(time.Second); n != 2 {
		t.Fatalf("Armed(1s) = %d, want 2", n)
	}
	c.Advance(time.Second)
	if got := <-ch; !got.Equal(time.Unix(1, 0)) {
		t.Fatalf("After fired at %v, want the clock's time 1s", got)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := c.Await(ctx, time.Minute, 1); err == nil {
		t.Fatal("Await with no such timer and a done context: nil error")
	}
}

func TestRecv(t *testing.T) {
	ch := make(chan int, 1)
	ch <- 7
	if v := Recv(t, ch, time.Second, "a value"); v != 7 {
		t.Fatalf("Recv = %d, want 7", v)
	}
	close(ch)
	if v := Recv(t, ch, time.Second, "the close"); v != 0 {
		t.Fatalf("Recv of a closed channel = %d, want 0", v)
	}
}
