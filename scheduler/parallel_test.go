package scheduler_test

import (
	"go.uber.org/goleak"

	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/mdag/mdag/scheduler"
)

func parallelConfig(models, gpus int) scheduler.Config {
	cfg := scheduler.Config{}
	for g := 0; g < gpus; g++ {
		cfg.GPUs = append(cfg.GPUs, scheduler.GPUID(g))
	}
	for m := 0; m < models; m++ {
		cfg.Models = append(cfg.Models, scheduler.Model{ID: scheduler.ModelID(fmt.Sprint("m", m)), SLO: 25 * time.Millisecond,
			Latency: scheduler.LinearLatency(1053*time.Microsecond, 5072*time.Microsecond, 32)})
	}
	return cfg
}

// TestParallel drives the parallel scheduler in virtual time: every request
// ends in exactly one action or one drop, no GPU gets an action while its
// previous one is outstanding, and Close leaves no goroutine behind.
func TestParallel(t *testing.T) {
	leaks := goleak.IgnoreCurrent() // what runs before the scheduler starts
	cfg := parallelConfig(6, 8)
	p, err := scheduler.NewParallel(cfg, 3)
	if err != nil {
		t.Fatal(err)
	}
	const total = 20000
	seen := map[uint64]int{}
	outstanding := map[scheduler.GPUID]*scheduler.Action{}
	type running struct {
		a   *scheduler.Action
		end scheduler.Time
	}
	var busy []running
	var now scheduler.Time
	accounted, batched, actions, dropped := 0, 0, 0, 0
	timeout := time.After(30 * time.Second)
	ids := map[uint64]bool{}
	take := func(a *scheduler.Action) {
		if ids[a.ID] {
			t.Fatalf("action ID %d used twice", a.ID)
		}
		ids[a.ID] = true
		if prev := outstanding[a.GPU]; prev != nil {
			t.Fatalf("gpu %d got action %d while action %d is outstanding", a.GPU, a.ID, prev.ID)
		}
		outstanding[a.GPU] = a
		busy = append(busy, running{a, a.Earliest + a.Expected})
		for _, r := range a.Requests {
			seen[r.ID]++
		}
		accounted += len(a.Requests)
		actions++
		if len(a.Requests) > 1 {
			batched++
		}
	}
	gotDrop := func(d scheduler.Drop) {
		seen[d.Request.ID]++
		accounted++
		dropped++
	}
	// next handles one output; without block it returns false when none is ready.
	next := func(block bool) bool {
		if block {
			select {
			case a := <-p.Actions():
				take(a)
			case d := <-p.Drops():
				gotDrop(d)
			case <-timeout:
				t.Fatalf("timed out with %d of %d requests accounted", accounted, total)
			}
			return true
		}
		select {
		case a := <-p.Actions():
			take(a)
		case d := <-p.Drops():
			gotDrop(d)
		default:
			return false
		}
		return true
	}
	drain := func(block bool) {
		if block {
			next(true)
		}
		for next(false) {
		}
	}
	finishDue := func() {
		rest := busy[:0]
		for _, r := range busy {
			if r.end <= now {
				delete(outstanding, r.a.GPU)
				p.Finished(r.end, r.a, r.a.Expected)
			} else {
				rest = append(rest, r)
			}
		}
		busy = rest
	}
	for id := uint64(0); id < total; id++ {
		now += 40 * time.Microsecond // 25000 r/s offered: more than 8 GPUs carry, so drops happen too
		m := cfg.Models[int(id)%len(cfg.Models)]
		p.Arrive(now, scheduler.Request{ID: id, Model: m.ID, Arrival: now, Deadline: now + m.SLO})
		if id%8 == 0 {
			p.Tick(now)
		}
		p.Sync() // virtual time: let the goroutines catch up before it moves on
		drain(false)
		finishDue()
	}
	// Let time run past every deadline: what is still queued is pruned.
	for accounted < total {
		now += time.Millisecond
		finishDue()
		p.Tick(now)
		p.Sync()
		drain(len(busy) == 0 && now > 100*time.Second)
		if now > 200*time.Second {
			t.Fatalf("never quiesced: %d of %d accounted", accounted, total)
		}
	}
	for id := uint64(0); id < total; id++ {
		if seen[id] != 1 {
			t.Fatalf("request %d accounted %d times", id, seen[id])
		}
	}
	t.Logf("%d actions (%d batched), %d drops", actions, batched, dropped)
	if batched < actions/2 || dropped == 0 || actions == 0 {
		t.Errorf("want mostly real batches and some drops under this overload: %d actions, %d batched, %d dropped", actions, batched, dropped)
	}
	p.Close()
	p.Close() // idempotent
	// The shard goroutines end after Close returns; goleak retries until
	// they have (or reports the leak with stacks).
	goleak.VerifyNone(t, leaks)
}

// BenchmarkParallelThroughput measures the ModelThread/RankThread split
// against the single-goroutine machine on the same load (compare with
// BenchmarkThroughput/symphony/models=8/gpus=16).
func BenchmarkParallelThroughput(b *testing.B) {
	for _, shards := range []int{1, 2} {
		b.Run(fmt.Sprintf("shards=%d/models=8/gpus=16", shards), func(b *testing.B) {
			cfg := parallelConfig(8, 16)
			p, err := scheduler.NewParallel(cfg, shards)
			if err != nil {
				b.Fatal(err)
			}
			// The GPUs: one goroutine drains actions, another completes
			// them, so completing never waits on draining.
			completed := make(chan *scheduler.Action, 1<<20)
			var mu sync.Mutex
			closed := false
			done := make(chan struct{})
			go func() {
				defer close(completed)
				for a := range p.Actions() {
					completed <- a
				}
			}()
			go func() {
				defer close(done)
				for a := range completed {
					mu.Lock()
					if !closed {
						p.Finished(a.Earliest+a.Expected, a, a.Expected)
					}
					mu.Unlock()
				}
			}()
			go func() {
				for range p.Drops() {
				}
			}()
			interval := time.Second / (700 * 16)
			var now scheduler.Time
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				now += interval
				m := cfg.Models[i%len(cfg.Models)]
				p.Arrive(now, scheduler.Request{ID: uint64(i), Model: m.ID, Arrival: now, Deadline: now + m.SLO})
			}
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "requests/s")
			// No call may follow Close: stop completing first.
			mu.Lock()
			closed = true
			mu.Unlock()
			p.Close()
			<-done
		})
	}
}
