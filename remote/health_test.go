package remote

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/media"
	"github.com/mdag/mdag/remote/client"
)

// flipExec is an executor with a health probe that a test turns bad
// (gpu/kserve's, whose inference server may go away).
type flipExec struct {
	bad    atomic.Pointer[string]
	probes atomic.Int64
}

func (f *flipExec) Kind() string { return "flip" }

func (f *flipExec) Run(context.Context, string, []*media.Item) ([][]*media.Item, error) {
	return nil, errors.New("flip runs no batches")
}

func (f *flipExec) Health(context.Context) error {
	f.probes.Add(1)
	if p := f.bad.Load(); p != nil {
		return errors.New(*p)
	}
	return nil
}

func (f *flipExec) set(why string) { f.bad.Store(&why) }

// probeClock is a fake clock that counts the timers of one duration (the
// health interval's): a wait on the probe's timer that no other timer
// (heartbeat, a task's) can satisfy.
type probeClock struct {
	*clock.Fake
	interval time.Duration
	timers   atomic.Int64
}

func (c *probeClock) After(d time.Duration) <-chan time.Time {
	ch := c.Fake.After(d)
	if d == c.interval {
		c.timers.Add(1)
	}
	return ch
}

// An executor whose probe fails does not register (RunWorker says why);
// once connected it is probed every HealthInterval on the worker's clock,
// and a failed probe ends the connection, so the coordinator counts the
// instance lost and re-plans.
func TestExecutorHealth(t *testing.T) {
	app, prof := loadExample(t, "traffic")
	c := startCoordinator(t, app, prof, time.Minute)
	registered := func(id string) bool { return slices.Contains(c.srv.Workers(), id) }

	x := &flipExec{}
	x.set("kserve: endpoint 127.0.0.1:8001: cannot reach the server")
	err := client.RunWorker(context.Background(), c.cc, client.WorkerConfig{ID: "flip-0", Type: "CPU", Exec: x})
	if err == nil || !strings.Contains(err.Error(), "not registering: executor flip unhealthy: kserve: endpoint 127.0.0.1:8001: cannot reach the server") {
		t.Fatalf("RunWorker with a dead executor: %v", err)
	}
	if registered("flip-0") {
		t.Fatal("a worker whose executor is unhealthy registered")
	}

	x = &flipExec{}
	clk := &probeClock{Fake: clock.NewFake(time.Unix(0, 0)), interval: 3 * time.Second}
	done := make(chan error, 1)
	go func() {
		done <- client.RunWorker(context.Background(), c.cc, client.WorkerConfig{ID: "flip-1", Type: "CPU", Exec: x, Clock: clk, HealthInterval: 3 * time.Second})
	}()
	waitFor(t, "flip-1 to register", 5*time.Second, func() bool { return registered("flip-1") })
	// the heartbeat (a minute), the probe (3 s) and any task timers wait
	// on the fake clock: wait for the probe's own timer
	waitFor(t, "the probe's timer", 5*time.Second, func() bool { return clk.timers.Load() >= 1 })
	clk.Advance(2 * time.Second)
	if n := x.probes.Load(); n != 1 {
		t.Fatalf("%d probes before the interval passed, want 1 (before registering)", n)
	}
	clk.Advance(time.Second)
	waitFor(t, "the second probe", 5*time.Second, func() bool { return x.probes.Load() == 2 })
	if !registered("flip-1") {
		t.Fatal("a healthy probe ended the connection")
	}
	waitFor(t, "the next probe's timer", 5*time.Second, func() bool { return clk.timers.Load() >= 2 })
	x.set("kserve: model resnet50 at 127.0.0.1:8001: server model resnet50 is not ready on the server")
	clk.Advance(3 * time.Second)
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "executor flip unhealthy: kserve: model resnet50 at 127.0.0.1:8001: server model resnet50 is not ready") {
			t.Fatalf("RunWorker ended with %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a failed probe did not end the connection")
	}
	waitFor(t, "the coordinator to count flip-1 lost", 5*time.Second, func() bool {
		for _, r := range c.e.Replans() {
			if strings.Contains(r.Trigger, "worker flip-1 lost") {
				return !registered("flip-1")
			}
		}
		return false
	})
}
