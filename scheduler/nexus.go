package scheduler

import (
	"fmt"
	"slices"
	"time"

	"github.com/mdag/mdag/placement/squishy"
)

// nexus is Nexus's data plane (Sections 6.1 and 6.3): models are assigned
// to GPUs statically by squishy bin packing at the models' expected rates;
// frontends send each request to one of its model's GPUs in turn, with no
// coordination; each GPU cycles round-robin over its sessions, taking at most
// the packed batch size, after an early drop that slides a window of that
// size along the queue until its first request can still finish. Spare GPUs
// (more than packing needs) are shared out by load.
type nexus struct {
	net     Network
	est     *Estimator
	gpus    []*nexusGPU
	byGPU   map[GPUID]*nexusGPU
	routes  map[ModelID][]*nexusSlot // the model's slots on each of its GPUs
	models  map[ModelID]Model
	actions []*Action
	drops   []Drop
	nextAct uint64
}

type nexusGPU struct {
	id    GPUID
	busy  bool
	held  int // Hold: out of service while > 0
	slots []*nexusSlot
	turn  int
}

type nexusSlot struct {
	model  ModelID
	batch  int
	weight float64 // requests/s the packing gave this slot
	credit float64 // smooth weighted round robin
	q      []Request
}

func newNexus(cfg Config) (*nexus, error) {
	s := &nexus{net: cfg.Network, est: newEstimator(cfg.Models), byGPU: map[GPUID]*nexusGPU{},
		routes: map[ModelID][]*nexusSlot{}, models: map[ModelID]Model{}}
	var sessions []squishy.Session
	for _, m := range cfg.Models {
		s.models[m.ID] = m
		if m.Rate <= 0 {
			return nil, fmt.Errorf("scheduler: nexus needs each model's expected rate (model %s)", m.ID)
		}
		p := squishy.BatchProfile{}
		for b, l := range m.Latency {
			p.Batches = append(p.Batches, b+1)
			p.Latency = append(p.Latency, l)
		}
		sessions = append(sessions, squishy.Session{ID: string(m.ID), Model: string(m.ID), SLO: m.SLO, Rate: m.Rate, Profile: p})
	}
	for _, id := range cfg.GPUs {
		g := &nexusGPU{id: id}
		s.gpus = append(s.gpus, g)
		s.byGPU[id] = g
	}
	if subClusters(cfg.Models) {
		return s, s.packEach(sessions)
	}
	packed := squishy.Pack(sessions, squishy.PackOptions{})
	if len(packed.Unschedulable) > 0 {
		u := packed.Unschedulable[0]
		return nil, fmt.Errorf("scheduler: nexus cannot schedule %s: %s", u.Session, u.Reason)
	}
	// Packed GPUs onto real ones; more packed than real wrap around
	// (overload), fewer leave spares.
	for i, pg := range packed.GPUs {
		g := s.gpus[i%len(s.gpus)]
		for _, a := range pg.Sessions {
			s.addSlot(g, ModelID(a.Session), a.Batch, a.Rate)
		}
	}
	// Spares go one by one to the model with the most load per GPU it has,
	// at its largest batch with 2 l(b) <= SLO (a dedicated GPU).
	for i := len(packed.GPUs); i < len(s.gpus); i++ {
		var best ModelID
		bestLoad := -1.0
		for _, m := range cfg.Models {
			if load := m.Rate / float64(len(s.routes[m.ID])); load > bestLoad {
				best, bestLoad = m.ID, load
			}
		}
		b := saturatingBatch(s.models[best])
		s.addSlot(s.gpus[i], best, b, float64(b)/s.models[best].Latency[b-1].Seconds())
	}
	return s, nil
}

// subClusters says whether every model names the GPUs it is loaded on
// (the runtime's case: placement chose them).
func subClusters(models []Model) bool {
	for _, m := range models {
		if len(m.GPUs) == 0 {
			return false
		}
	}
	return len(models) > 0
}

// packEach is the packing when placement has already put each model on
// its GPUs: each model's rate is split over its GPUs by their Shares (the
// part placement sized each for; evenly without), and each GPU
// squishy-packs the shares of the models it holds (their batch sizes and
// duty cycle). Sessions that do not fit one GPU stay on it all the same
// (overload: its round robin serves them all, early drop sheds the excess).
func (s *nexus) packEach(sessions []squishy.Session) error {
	onGPU := map[GPUID][]squishy.Session{}
	for _, sess := range sessions {
		m := s.models[ModelID(sess.ID)]
		if len(m.Shares) > 0 && len(m.Shares) != len(m.GPUs) {
			return fmt.Errorf("scheduler: model %s has %d shares for %d GPUs", m.ID, len(m.Shares), len(m.GPUs))
		}
		total := 0.0
		for _, w := range m.Shares {
			total += max(0, w)
		}
		for i, g := range m.GPUs {
			if s.byGPU[g] == nil {
				return fmt.Errorf("scheduler: model %s is on GPU %d, which is not in the configuration", m.ID, g)
			}
			share := sess
			share.Rate = m.Rate / float64(len(m.GPUs))
			if total > 0 {
				share.Rate = m.Rate * max(0, m.Shares[i]) / total
			}
			if share.Rate <= 0 {
				continue // sized for none of it: it gets none
			}
			onGPU[g] = append(onGPU[g], share)
		}
	}
	for _, g := range s.gpus {
		if len(onGPU[g.id]) == 0 {
			continue
		}
		packed := squishy.Pack(onGPU[g.id], squishy.PackOptions{})
		for _, pg := range packed.GPUs {
			for _, a := range pg.Sessions {
				s.addSlot(g, ModelID(a.Session), a.Batch, a.Rate)
			}
		}
		for _, u := range packed.Unschedulable {
			// Its SLO is below l(1) on this GPU's profile: it still runs
			// at batch 1, and early drop sheds what cannot finish.
			for _, x := range onGPU[g.id] {
				if x.ID == u.Session {
					s.addSlot(g, ModelID(u.Session), 1, x.Rate)
				}
			}
		}
	}
	return nil
}

func saturatingBatch(m Model) int {
	b := 1
	for i, l := range m.Latency {
		if 2*l <= m.SLO {
			b = i + 1
		}
	}
	return b
}

func (s *nexus) addSlot(g *nexusGPU, m ModelID, batch int, weight float64) {
	slot := &nexusSlot{model: m, batch: batch, weight: weight}
	g.slots = append(g.slots, slot)
	s.routes[m] = append(s.routes[m], slot)
}

func (s *nexus) Estimator() *Estimator { return s.est }

func (s *nexus) Take() ([]*Action, []Drop) {
	a, d := s.actions, s.drops
	s.actions, s.drops = nil, nil
	return a, d
}

func (s *nexus) Next() Time { return Never } // nothing happens without an event

func (s *nexus) Arrive(now Time, r Request) {
	slots := s.routes[r.Model]
	if len(slots) == 0 {
		s.drops = append(s.drops, Drop{Request: r, Reason: DropNoGPU, At: now})
		return
	}
	// Frontends route in proportion to each slot's packed rate (smooth
	// weighted round robin: deterministic, no coordination with the GPUs).
	var total float64
	i := 0
	for j, sl := range slots {
		sl.credit += sl.weight
		total += sl.weight
		if sl.credit > slots[i].credit {
			i = j
		}
	}
	slots[i].credit -= total
	slots[i].q = append(slots[i].q, r)
	for _, g := range s.gpus {
		if !g.busy && g.held == 0 && slices.Contains(g.slots, slots[i]) {
			s.serve(now, g)
		}
	}
}

func (s *nexus) Finished(now Time, a *Action, measured time.Duration) {
	s.est.Record(a.Model, len(a.Requests), measured)
	g := s.byGPU[a.GPU]
	g.busy = false
	s.serve(now, g)
}

func (s *nexus) Rejected(now Time, a *Action) {
	for _, r := range a.Requests {
		s.drops = append(s.drops, Drop{Request: r, Reason: DropRejected, At: now})
	}
	g := s.byGPU[a.GPU]
	g.busy = false
	s.serve(now, g)
}

func (s *nexus) Hold(now Time, id GPUID, held bool) {
	g := s.byGPU[id]
	if g == nil {
		return
	}
	if held {
		g.held++
		return
	}
	if g.held > 0 {
		g.held--
	}
	if !g.busy && g.held == 0 {
		s.serve(now, g)
	}
}

func (s *nexus) Tick(now Time) {
	for _, g := range s.gpus {
		if !g.busy && g.held == 0 {
			s.serve(now, g)
		}
	}
}

// serve gives an idle GPU its next batch: round-robin over its sessions,
// each after its early drop.
func (s *nexus) serve(now Time, g *nexusGPU) {
	if g.held > 0 {
		return
	}
	for tries := 0; tries < len(g.slots); tries++ {
		slot := g.slots[g.turn%len(g.slots)]
		g.turn++
		s.earlyDrop(now, slot)
		if len(slot.q) == 0 {
			continue
		}
		k := min(slot.batch, len(slot.q))
		reqs := slices.Clone(slot.q[:k])
		slot.q = slot.q[k:]
		exp := s.est.Estimate(slot.model, k)
		earliest := now + s.net.Delay(k)
		s.nextAct++
		s.actions = append(s.actions, &Action{ID: s.nextAct, GPU: g.id, Model: slot.model, Requests: reqs,
			Earliest: earliest, Latest: reqs[0].Deadline - exp, Expected: exp})
		g.busy = true
		return
	}
}

// earlyDrop slides a window of the slot's batch size along its queue and
// drops the requests before the first window whose first request can still
// finish (Nexus Section 6.3).
func (s *nexus) earlyDrop(now Time, slot *nexusSlot) {
	i := 0
	for ; i < len(slot.q); i++ {
		k := min(slot.batch, len(slot.q)-i)
		if now+s.net.Delay(k)+s.est.Estimate(slot.model, k) <= slot.q[i].Deadline {
			break
		}
	}
	for _, r := range slot.q[:i] {
		s.drops = append(s.drops, Drop{Request: r, Reason: DropEarly, At: now})
	}
	slot.q = slot.q[i:]
}
