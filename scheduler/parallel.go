package scheduler

import (
	"fmt"
	"hash/fnv"
	"sync"
	"time"
)

// Parallel runs the symphony policy across goroutines, as Symphony Section
// 4.5 does with ModelThreads and a RankThread: each shard goroutine owns a
// subset of the models (queues, rate estimates, candidates, estimator) and is
// updated without any shared lock; one rank goroutine owns GPU availability
// and grants a free GPU to the shard whose best schedulable candidate has the
// most requests per GPU-second (ties: the earliest sched_at). The shard then
// forms and emits the action itself.
//
// It is for the live service, where events arrive concurrently. Decisions
// use each shard's latest published candidate, so they can differ from the
// single-goroutine machine (New), which stays the reference and is what the
// simulator runs. Deadlock freedom: shards publish candidates through a
// one-slot mailbox (never blocking on the rank loop), and grants travel on
// channels with room for one grant per GPU (the rank loop never blocks).
// The caller must drain Actions and Drops, and should call Finished from a
// goroutine other than the one draining Actions.
type Parallel struct {
	shards  []*shard
	byModel map[ModelID]*shard
	rankIn  chan rankMsg
	actions chan *Action
	drops   chan Drop
	gpus    []GPUID
	shardWG sync.WaitGroup
	rankWG  sync.WaitGroup
	once    sync.Once
}

type shardMsg struct {
	kind     uint8 // 0 arrive, 2 finished, 3 tick, 4 barrier
	now      Time
	req      Request
	action   *Action
	measured time.Duration
	ack      chan struct{}
}

type rankMsg struct {
	kind  uint8 // 0 candidate published, 1 GPU freed, 2 grant returned unused, 3 barrier
	shard int
	gpu   GPUID
	ack   chan struct{}
}

type summary struct {
	eff float64
	key Time
	ok  bool
}

type shard struct {
	id     int
	c      *central
	in     chan shardMsg
	grants chan GPUID // room for every GPU: the rank loop never blocks on it
	clock  Time       // the latest time this shard has seen
	mu     sync.Mutex // guards latest only: the one-slot mailbox read by the rank loop
	latest summary
	p      *Parallel
}

// NewParallel starts a parallel symphony scheduler with models spread over
// the given number of shards (by model ID hash).
func NewParallel(cfg Config, shards int) (*Parallel, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if shards < 1 {
		return nil, fmt.Errorf("scheduler: parallel needs at least one shard")
	}
	p := &Parallel{byModel: map[ModelID]*shard{}, rankIn: make(chan rankMsg, 1024),
		actions: make(chan *Action, 1<<14), drops: make(chan Drop, 1<<16), gpus: cfg.GPUs}
	groups := make([][]Model, shards)
	for _, m := range cfg.Models {
		h := fnv.New32a()
		h.Write([]byte(m.ID))
		i := int(h.Sum32() % uint32(shards))
		groups[i] = append(groups[i], m)
	}
	for i := range groups {
		c := newCentral(Config{Models: groups[i], GPUs: cfg.GPUs, Network: cfg.Network}, symphonyRule)
		for _, g := range c.gpus {
			g.busy = true // a shard only uses GPUs the rank loop grants it
		}
		c.nextAct, c.actStep = uint64(i)+1-uint64(shards), uint64(shards) // IDs i+1, i+1+shards, ...
		sh := &shard{id: i, c: c, in: make(chan shardMsg, 1024), grants: make(chan GPUID, len(cfg.GPUs)), p: p}
		p.shards = append(p.shards, sh)
		for _, m := range groups[i] {
			p.byModel[m.ID] = sh
		}
	}
	p.shardWG.Add(len(p.shards))
	for _, sh := range p.shards {
		go sh.run()
	}
	p.rankWG.Add(1)
	go p.rank()
	return p, nil
}

// Actions delivers the actions decided; drain it.
func (p *Parallel) Actions() <-chan *Action { return p.actions }

// Drops delivers the drops decided; drain it.
func (p *Parallel) Drops() <-chan Drop { return p.drops }

// Arrive hands a request to its model's shard.
func (p *Parallel) Arrive(now Time, r Request) {
	sh := p.byModel[r.Model]
	if sh == nil {
		p.drops <- Drop{Request: r, Reason: DropNoGPU, At: now}
		return
	}
	sh.in <- shardMsg{kind: 0, now: now, req: r}
}

// Finished reports a completed action: the measurement goes to the model's
// shard, and the GPU is free again.
func (p *Parallel) Finished(now Time, a *Action, measured time.Duration) {
	p.byModel[a.Model].in <- shardMsg{kind: 2, now: now, action: a, measured: measured}
	p.rankIn <- rankMsg{kind: 1, gpu: a.GPU}
}

// Tick lets every shard act on time passing (sched_at, pruning).
func (p *Parallel) Tick(now Time) {
	for _, sh := range p.shards {
		sh.in <- shardMsg{kind: 3, now: now}
	}
}

// Sync returns once everything sent before it has been acted on: the
// shards' messages, the rank loop's grants, and the shards' answers to those
// grants. The live service never needs it; tests and virtual-time drivers
// call it before letting time move on.
func (p *Parallel) Sync() {
	barrier := func() {
		for _, sh := range p.shards {
			ack := make(chan struct{})
			sh.in <- shardMsg{kind: 4, ack: ack}
			<-ack
		}
	}
	barrier()
	ack := make(chan struct{})
	p.rankIn <- rankMsg{kind: 3, ack: ack}
	<-ack
	barrier()
}

// Close stops every goroutine and waits for them; idempotent. No other
// method may be called after Close.
func (p *Parallel) Close() {
	p.once.Do(func() {
		for _, sh := range p.shards {
			close(sh.in)
		}
		p.shardWG.Wait() // shards may still be publishing to the rank loop
		close(p.rankIn)
		p.rankWG.Wait()
		close(p.actions)
		close(p.drops)
	})
}

func (sh *shard) run() {
	defer sh.p.shardWG.Done()
	for {
		select {
		case m, ok := <-sh.in:
			if !ok {
				return
			}
			if m.kind == 4 { // barrier: answer the grants already sent first
				for drained := false; !drained; {
					select {
					case g := <-sh.grants:
						sh.grant(g)
					default:
						drained = true
					}
				}
				close(m.ack)
				continue
			}
			sh.clock = max(sh.clock, m.now)
			switch m.kind {
			case 0:
				sh.c.enqueue(sh.clock, m.req)
			case 2:
				sh.c.est.Record(m.action.Model, len(m.action.Requests), m.measured)
			case 3:
				for _, ms := range sh.c.models {
					sh.c.prune(sh.clock, ms)
				}
			}
			sh.publish(false)
		case g := <-sh.grants:
			sh.grant(g)
		}
	}
}

// grant uses a GPU the rank loop granted, or hands it back.
func (sh *shard) grant(g GPUID) {
	sh.c.setGPU(g, true, sh.clock)
	sh.c.schedule(sh.clock, true)
	if gs := sh.c.byGPU[g]; !gs.busy {
		// Nothing to send after all: hand the GPU back.
		sh.c.setGPU(g, false, sh.clock)
		sh.p.rankIn <- rankMsg{kind: 2, shard: sh.id, gpu: g}
	}
	sh.publish(true)
}

// publish emits the shard's decisions and, when its best candidate changed
// (or it answered a grant), tells the rank loop.
func (sh *shard) publish(granted bool) {
	eff, key, ok := sh.c.candidate(sh.clock)
	acts, drops := sh.c.Take()
	for _, a := range acts {
		sh.p.actions <- a
	}
	for _, d := range drops {
		sh.p.drops <- d
	}
	sh.mu.Lock()
	changed := sh.latest != summary{eff, key, ok}
	sh.latest = summary{eff, key, ok}
	sh.mu.Unlock()
	if granted || changed && ok {
		// The rank loop never blocks, so this send always completes.
		sh.p.rankIn <- rankMsg{kind: 0, shard: sh.id}
	}
}

// rank owns GPU availability: it grants free GPUs to the best candidates.
func (p *Parallel) rank() {
	defer p.rankWG.Done()
	free := map[GPUID]bool{}
	for _, g := range p.gpus {
		free[g] = true
	}
	pending := map[int]bool{} // shards holding a grant they have not answered
	for m := range p.rankIn {
		switch m.kind {
		case 0:
			delete(pending, m.shard)
		case 1:
			free[m.gpu] = true
		case 2:
			free[m.gpu] = true
			delete(pending, m.shard)
			continue // the shard had nothing: wait for its next candidate
		case 3:
			close(m.ack)
			continue
		}
		for {
			var gpu GPUID
			found := false
			for _, g := range p.gpus {
				if free[g] {
					gpu, found = g, true
					break
				}
			}
			if !found {
				break
			}
			best, bestS := -1, summary{}
			for i, sh := range p.shards {
				if pending[i] {
					continue
				}
				sh.mu.Lock()
				s := sh.latest
				sh.mu.Unlock()
				if s.ok && (best < 0 || moreUseful(s.eff, s.key, bestS.eff, bestS.key)) {
					best, bestS = i, s
				}
			}
			if best < 0 {
				break
			}
			free[gpu] = false
			pending[best] = true
			p.shards[best].grants <- gpu // room for every GPU: never blocks
		}
	}
}
