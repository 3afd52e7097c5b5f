package coordinator

import (
	"sync"
	"sync/atomic"
	"time"
)

// loop is the engine's event loop: every change to the engine's state
// runs as an event on it, one at a time (Stepped: queued until
// RunPending).
type loop struct {
	events    chan func()
	queue     []func() // Stepped: events not yet run
	stepping  bool     // Stepped: RunPending is running
	done      chan struct{}
	wg        sync.WaitGroup
	closed    bool
	mu        sync.Mutex // guards closed and queue
	closeOnce sync.Once
	// busy and ran count the loop's work (not Stepped): time spent running
	// events, on the engine's clock, and the events run. busy over wall
	// time is how loaded the one goroutine that decides everything is.
	busy, ran atomic.Int64
}

// LoopStats is how much the engine's loop has worked: the time it spent
// running events (on the engine's clock) and how many it ran. The loop is
// one goroutine, so Busy growing as fast as time means it is the limit
// (docs/scaling.md).
type LoopStats struct {
	Busy   time.Duration `json:"busy_ns"`
	Events int64         `json:"events"`
}

// Loop returns the loop's counters (from any goroutine).
func (e *Engine) Loop() LoopStats {
	return LoopStats{Busy: time.Duration(e.busy.Load()), Events: e.ran.Load()}
}

// Start runs the loop (Stepped: arms it; RunPending runs it).
func (e *Engine) Start() {
	if !e.cfg.Stepped {
		e.wg.Add(1)
		go func() {
			defer e.wg.Done()
			for {
				select {
				case f := <-e.events:
					at := e.clk.Now()
					e.runEvent(f)
					e.busy.Add(int64(e.clk.Now().Sub(at)))
					e.ran.Add(1)
				case <-e.done:
					return
				}
			}
		}()
	}
	e.post(func() { e.lastEpoch = e.clk.Now(); e.armTick() })
	if e.cfg.Store != nil {
		e.startSaver()
	}
}

// Close stops the loop, the timers and every instance it started. It is
// safe to call more than once and from several goroutines: every call
// returns once the first has finished.
func (e *Engine) Close() { e.closeOnce.Do(e.close) }

func (e *Engine) close() {
	var final *Snapshot
	e.call(func() {
		if e.cfg.Store != nil {
			if e.ps.tm != nil {
				e.ps.tm.Stop()
			}
			final = e.snapshot()
		}
		if e.tickTm != nil {
			e.tickTm.Stop()
		}
		if e.schedTm != nil {
			e.schedTm.Stop()
		}
		if e.turnOffTm != nil {
			e.turnOffTm.Stop()
		}
		if e.gapTm != nil {
			e.gapTm.Stop()
		}
		for _, in := range e.insts {
			if in.startTm != nil {
				in.startTm.Stop()
			}
			in.inst.Close()
		}
	})
	e.mu.Lock()
	e.closed = true
	e.mu.Unlock()
	close(e.done)
	e.wg.Wait()
	if e.cfg.Store != nil && final != nil {
		// The saver's write in progress ends first: the final state is
		// the last one written.
		if e.ps.quit != nil {
			close(e.ps.quit)
			<-e.ps.saverDone
		}
		if _, err := e.write(final); err != nil {
			e.log.Error("saving coordinator state at shutdown failed", "err", err)
		}
	}
	if l, ok := e.cfg.Provisioner.(*Local); ok {
		l.Close()
	}
}

// runEvent runs one event of the loop.
func (e *Engine) runEvent(f func()) {
	f()
	if len(e.dirtyS) > 0 {
		e.advanceDirty()
	}
	if e.releaseDue {
		e.releaseDue = false
		e.releaseDrained()
	}
}

// RunPending runs the queued events of a Stepped engine, and those they
// queue, until none is left; it reports how many ran. It must not be
// called on an engine that is not Stepped.
func (e *Engine) RunPending() int {
	if !e.cfg.Stepped {
		panic("coordinator: RunPending on an engine that is not Stepped")
	}
	if e.stepping {
		return 0 // called from an event (call inside the loop): the outer RunPending goes on
	}
	e.stepping = true
	defer func() { e.stepping = false }()
	n := 0
	for {
		e.mu.Lock() // an instance may post from another goroutine (then the order is its)
		if len(e.queue) == 0 {
			e.mu.Unlock()
			return n
		}
		f := e.queue[0]
		e.queue[0] = nil
		e.queue = e.queue[1:]
		e.mu.Unlock()
		e.runEvent(f)
		n++
	}
}

// post queues f on the loop; after Close it is dropped.
func (e *Engine) post(f func()) {
	e.mu.Lock()
	closed := e.closed
	if e.cfg.Stepped && !closed {
		e.queue = append(e.queue, f)
	}
	e.mu.Unlock()
	if closed || e.cfg.Stepped {
		return
	}
	select {
	case e.events <- f:
	case <-e.done:
	}
}

// call runs f on the loop and waits for it.
func (e *Engine) call(f func()) {
	if e.cfg.Stepped {
		if e.stepping { // from an event: run it now, as the loop would have before returning
			f()
			return
		}
		e.post(f)
		e.RunPending()
		return
	}
	ch := make(chan struct{})
	e.post(func() { f(); close(ch) })
	select {
	case <-ch:
	case <-e.done:
	}
}
