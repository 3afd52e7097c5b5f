package coordinator

import (
	"fmt"
	"maps"
	"sort"
	"strings"
	"time"

	"github.com/mdag/mdag/allocator"
	"github.com/mdag/mdag/coordinator/why"
	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/placement"
)

// armTick schedules the next adaptation window.
func (e *Engine) armTick() {
	e.tickTm = e.clk.AfterFunc(e.cfg.Adapt.Window, func() { e.post(e.tick) })
}

// tick closes an adaptation window: it publishes each module's observed
// behaviour, asks each session's detector whether to re-plan, counts frames
// open far past their deadline as lost, and runs the periodic epoch.
func (e *Engine) tick() {
	now := e.now()
	var triggers []adaptDue
	for _, id := range e.appIDs() {
		s := e.sessions[id]
		obs := e.closeWindow(s)
		e.checkIngest(id, s)
		if t, ok := e.adapt(id, s, obs, now); ok {
			triggers = append(triggers, t)
		}
		e.loseOverdue(s, now)
	}
	for _, t := range triggers {
		e.trigger(t.kind, "adapt "+t.text)
	}
	if now.Sub(e.lastEpoch) >= e.cfg.Epoch {
		e.lastEpoch = now
		e.trigger(why.OnEpoch, "epoch")
	}
	e.checkpointsDue(now)
	e.releaseDrained()
	e.publishMetrics(now)
	e.armTick()
}

// adaptDue is a re-plan a session's detector asked for in a tick: run
// once every session's window is closed.
type adaptDue struct {
	kind why.Trigger
	text string
}

// closeWindow ends the adaptation window of a session's modules: their
// observations for the detector, their status for /v1/status (a module
// idle in the window keeps its last figures).
func (e *Engine) closeWindow(s *session) map[dag.ModuleID]Observation {
	win := e.cfg.Adapt.Window.Seconds()
	obs := map[dag.ModuleID]Observation{}
	for m, ms := range s.mods {
		o := ms.obs.Observation
		o.Dropped = ms.obs.dropped
		if ms.obs.balloonN > 0 && ms.obs.profiled > 0 {
			o.Tasks = ms.obs.balloonN
			o.Balloon = float64(ms.obs.measured) / float64(ms.obs.profiled)
			o.Excess = (ms.obs.measured - ms.obs.profiled) / time.Duration(ms.obs.balloonN)
		}
		obs[m] = o
		st := ModuleStatus{Module: m, Kind: ms.mod.Kind, RateIn: float64(o.In) / win, RateOut: float64(o.Out) / win,
			Balloon: o.Balloon, BudgetMS: ms.budget.Seconds() * 1000, Instances: len(ms.routes), Dropped: ms.last.Dropped + uint64(ms.obs.dropped),
			Rejected: ms.last.Rejected + uint64(ms.obs.rejected)}
		if o.Done > 0 {
			st.Scale = float64(o.Out) / float64(o.Done)
		} else {
			st.Scale = ms.last.Scale
		}
		if ms.obs.latN > 0 {
			st.LatencyMS = ms.obs.latSum.Seconds() * 1000 / float64(ms.obs.latN)
		} else {
			st.LatencyMS = ms.last.LatencyMS
		}
		if ms.obs.tasks > 0 {
			st.ExecMS = ms.obs.execSum.Seconds() * 1000 / float64(ms.obs.tasks)
			st.MeanBatch = float64(ms.obs.batches) / float64(ms.obs.tasks)
		} else {
			st.ExecMS, st.MeanBatch = ms.last.ExecMS, ms.last.MeanBatch
			if o.Balloon == 0 {
				st.Balloon = ms.last.Balloon
			}
		}
		ms.last = st
		ms.obs = modObs{}
	}
	return obs
}

// checkIngest says loudly when frames reach the session half its SLO or
// more after capture (they cannot finish; new streams are refused), and
// when that ends.
func (e *Engine) checkIngest(id dag.AppID, s *session) {
	if d, ok := s.ingestP95(); ok && len(s.streams) > 0 && d >= s.app.SLO/2 {
		if s.ingestOver == "" {
			s.ingestOver = fmt.Sprintf("ingest saturated: frames reach the session %v after capture (p95), half the %v SLO or more; they cannot finish, and new streams are refused", d.Round(time.Millisecond), s.app.SLO)
			e.log.Warn("ingest saturated", "app", id, "ingest_p95", d.Round(time.Millisecond), "slo", s.app.SLO, "streams", len(s.streams))
		}
	} else if s.ingestOver != "" {
		e.log.Info("ingest recovered", "app", id)
		s.ingestOver = ""
	}
}

// adapt runs a planned session's detectors on the window: the ingest
// delay against the plan's reserve (a re-plan now, at most every 5 s),
// then the scaling and ballooning factors, else the finish rate; it
// returns the re-plan they ask for.
func (e *Engine) adapt(id dag.AppID, s *session, obs map[dag.ModuleID]Observation, now time.Time) (adaptDue, bool) {
	if s.plan == nil || len(s.streams) == 0 {
		return adaptDue{}, false
	}
	if r := s.ingestReserve(); now.Sub(s.reserveAt) >= 5*time.Second && absDur(r-s.reserve) > max(10*time.Millisecond, s.reserve/4) {
		s.reserveAt = now
		e.trigger(why.OnIngest, fmt.Sprintf("%s: ingest delay p95 %v, the plan reserved %v of the SLO", id, r, s.reserve))
	}
	if t, ok := s.det.Observe(now, obs); ok {
		s.scale, s.balloon = t.Scale, t.Balloon
		e.adaptProblems(id, t)
		return adaptDue{t.Kind, string(id) + ": " + t.Reason}, true
	} else if t, ok := s.det.FinishRate(now, s.acct.windowsBefore(now.Add(-s.app.SLO-100*time.Millisecond), e.cfg.Adapt.FinishWindows)); ok {
		s.headroom = t.Headroom
		return adaptDue{t.Kind, string(id) + ": " + t.Reason}, true
	} else {
		e.adaptProblems(id, t)
	}
	return adaptDue{}, false
}

// loseOverdue ends the session's frames far past their deadline as lost:
// counted, never forgotten.
func (e *Engine) loseOverdue(s *session, now time.Time) {
	var lost []*frame
	for _, fr := range s.frames {
		if now.Sub(fr.deadline) > e.cfg.LostAfter {
			lost = append(lost, fr)
		}
	}
	sort.Slice(lost, func(i, j int) bool {
		if lost[i].key.stream != lost[j].key.stream {
			return lost[i].key.stream < lost[j].key.stream
		}
		return lost[i].key.seq < lost[j].key.seq
	})
	for _, fr := range lost {
		if !fr.dropped {
			fr.dropped, fr.reason = true, why.Lost
			fr.module = "-"
		}
		e.finishFrame(s, fr)
	}
}

// adaptProblems says loudly what a detector saw and will not plan for.
func (e *Engine) adaptProblems(id dag.AppID, t Trigger) {
	for _, p := range t.Problems {
		e.log.Warn("adaptation problem", "app", id, "problem", p)
	}
}

// publishMetrics sets the state gauges: per app its streams, last
// complete window's finish rate, cost and module factors; the instances by
// type and state and the cluster's cost.
func (e *Engine) publishMetrics(now time.Time) {
	m := e.cfg.Observer
	prices := map[string]float64{}
	var allocated float64
	for _, id := range e.appIDs() {
		s := e.sessions[id]
		for _, w := range s.cat.Workers() {
			prices[string(w.Type)] = w.Price
		}
		ws := s.acct.windowsBefore(now.Add(-s.app.SLO-100*time.Millisecond), 1)
		var rate float64
		if len(ws) > 0 {
			rate = ws[0].FinishRate
		}
		var alloc, whole float64
		if s.alloc != nil && s.rate > 0 {
			alloc = s.alloc.CostPerHour
		}
		if s.plan != nil {
			whole = sessionWholeCost(s, e)
		}
		allocated += alloc
		m.Session(string(id), len(s.streams), rate, len(ws) > 0 && ws[0].Sent > 0, alloc, whole)
		for mid, ms := range s.mods {
			m.ModuleFactors(string(id), string(mid), ms.last.Scale, ms.last.Balloon)
		}
	}
	counts := map[[2]string]int{}
	var whole float64
	for _, in := range e.insts {
		counts[[2]string{string(in.typ), string(in.state)}]++
		if in.state != placement.Warm {
			whole += prices[string(in.typ)]
		}
	}
	m.Instances(counts)
	m.Cost(whole, allocated)
}

func absDur(d time.Duration) time.Duration { return max(d, -d) }

func (e *Engine) appIDs() []dag.AppID {
	out := make([]dag.AppID, 0, len(e.sessions))
	for id := range e.sessions {
		out = append(out, id)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// ---- status ----

// Status is the engine's state for `mdag status` and the dashboard.
type Status struct {
	At        time.Time        `json:"at"`
	Policy    string           `json:"policy"`
	Sessions  []SessionStatus  `json:"sessions"`
	Instances []InstanceStatus `json:"instances"`
	Replans   []Replan         `json:"replans"` // the last 20
	// ReplansTotal counts every re-plan recorded; ReplansUnchanged those
	// among them that changed nothing (event-driven churn: should be 0).
	ReplansTotal     int `json:"replans_total"`
	ReplansUnchanged int `json:"replans_unchanged"`
	// Persist is the state store's (nil without one).
	Persist *PersistStatus `json:"persist,omitempty"`
	// Loop is the engine loop's work so far.
	Loop LoopStats `json:"loop"`
}

// SessionStatus is one app's session.
type SessionStatus struct {
	App            dag.AppID         `json:"app"`
	Streams        int               `json:"streams"`
	StreamIDs      []string          `json:"stream_ids"`
	FPS            float64           `json:"fps"`
	SLOMS          float64           `json:"slo_ms"`
	Total          Counts            `json:"total"`
	Open           uint64            `json:"open"`
	FinishRate     float64           `json:"finish_rate"`       // the last complete second
	FinishRateAll  float64           `json:"finish_rate_total"` // since the start
	P50MS          float64           `json:"p50_ms"`
	P99MS          float64           `json:"p99_ms"`
	IngestP95MS    float64           `json:"ingest_p95_ms"`     // capture to the session, recent frames
	IngestReserve  float64           `json:"ingest_reserve_ms"` // what the plan keeps of the SLO for it
	CostWhole      float64           `json:"cost_whole_per_hour"`
	CostFractional float64           `json:"cost_fractional_per_hour"`
	Drops          map[string]uint64 `json:"drops,omitempty"`
	Windows        []WindowStatus    `json:"windows"` // the last complete seconds, oldest first
	Modules        []ModuleStatus    `json:"modules"`
	Planned        bool              `json:"planned"`
	CriticalPath   string            `json:"critical_path,omitempty"` // the plan's longest path and its latency
	CriticalMS     float64           `json:"critical_ms,omitempty"`
	// Admitted is the share of the streams' frames the plan carries; below
	// 1 the rest are shed at ingest and Degraded says why.
	Admitted float64 `json:"admitted"`
	Degraded string  `json:"degraded,omitempty"`
}

// ModuleStatus is one module's behaviour over the last adaptation window.
type ModuleStatus struct {
	Module    dag.ModuleID `json:"module"`
	Kind      dag.Kind     `json:"kind"`
	RateIn    float64      `json:"rate_in"`
	RateOut   float64      `json:"rate_out"`
	Scale     float64      `json:"scale"`
	ExecMS    float64      `json:"exec_ms"`
	LatencyMS float64      `json:"latency_ms"` // mean, entering the module to its result (queueing included)
	Balloon   float64      `json:"balloon"`
	MeanBatch float64      `json:"mean_batch"`
	BudgetMS  float64      `json:"budget_ms"`
	Instances int          `json:"instances"`
	Dropped   uint64       `json:"dropped"`
	Rejected  uint64       `json:"rejected"`
	// The current plan's allocation of the module and why (the allocator's
	// own explanation).
	Allocation []allocator.InstanceAllocation `json:"allocation,omitempty"`
	Why        string                         `json:"why,omitempty"`
	// State: a stateful module's streams, state moves and losses.
	State *StateStatus `json:"state,omitempty"`
}

// InstanceStatus is one worker instance.
type InstanceStatus struct {
	ID         string `json:"id"`
	Type       string `json:"type"`
	State      string `json:"state"`
	Registered bool   `json:"registered"`
	// Pending: the provisioner started it (a Kubernetes pod) and its
	// worker has not registered yet; State is "starting" (or "warm" once
	// a plan unloaded it meanwhile). StartingS is for how long.
	Pending     bool     `json:"pending,omitempty"`
	StartingS   float64  `json:"starting_s,omitempty"`
	Modules     []string `json:"modules"`
	Outstanding int      `json:"outstanding"`
}

// Status returns a snapshot (taken on the loop).
func (e *Engine) Status() Status {
	var st Status
	e.call(func() {
		now := e.now()
		st = Status{At: now, Policy: string(e.cfg.Policy), Sessions: []SessionStatus{}, Instances: []InstanceStatus{}, Loop: e.Loop()}
		for _, id := range e.appIDs() {
			s := e.sessions[id]
			ss := SessionStatus{App: id, Streams: len(s.streams), FPS: s.app.FPS, SLOMS: s.app.SLO.Seconds() * 1000,
				Total: s.acct.total, Open: s.acct.total.Open(), FinishRateAll: s.acct.total.FinishRate(),
				P50MS: pct(s.acct.lat, 0.5), P99MS: pct(s.acct.lat, 0.99), Drops: maps.Clone(s.acct.drops), Planned: s.plan != nil}
			if d, ok := s.ingestP95(); ok {
				ss.IngestP95MS = millis(d)
			}
			ss.IngestReserve = millis(s.reserve)
			ss.Admitted, ss.Degraded = s.admit, strings.Trim(s.degraded+"; "+s.ingestOver, "; ")
			ss.StreamIDs = make([]string, 0, len(s.streams))
			for sid := range s.streams {
				ss.StreamIDs = append(ss.StreamIDs, sid)
			}
			sort.Strings(ss.StreamIDs)
			ss.Windows = s.acct.windowsBefore(now.Add(-s.app.SLO-100*time.Millisecond), 10)
			if n := len(ss.Windows); n > 0 {
				ss.FinishRate = ss.Windows[n-1].FinishRate
			}
			if s.alloc != nil {
				ss.CostFractional = s.alloc.CostPerHour
			}
			if s.plan != nil {
				ss.CostWhole = sessionWholeCost(s, e)
			}
			byMod := map[dag.ModuleID]*allocator.ModuleAllocation{}
			if s.alloc != nil {
				ss.CriticalPath, ss.CriticalMS = s.alloc.CriticalPath, s.alloc.CriticalLatencyMS
				for i := range s.alloc.Modules {
					byMod[s.alloc.Modules[i].Module] = &s.alloc.Modules[i]
				}
			}
			for _, m := range s.g.Order() {
				ms := s.mods[m].last
				if a := byMod[m]; a != nil {
					ms.Allocation, ms.Why = a.Allocations, a.Why
				}
				if s.mods[m].stateful {
					ms.State = e.stateStatus(s.mods[m])
				}
				ss.Modules = append(ss.Modules, ms)
			}
			st.Sessions = append(st.Sessions, ss)
		}
		for _, in := range e.sortedInsts() {
			is := InstanceStatus{ID: in.id, Type: string(in.typ), State: string(in.state), Registered: in.registered, Outstanding: len(in.outstanding)}
			if in.pending {
				is.Pending, is.StartingS = true, now.Sub(in.startedAt).Seconds()
			}
			for _, l := range in.loads {
				is.Modules = append(is.Modules, string(l.App)+"/"+string(l.Module))
			}
			st.Instances = append(st.Instances, is)
		}
		st.Replans = append([]Replan(nil), e.replans[max(0, len(e.replans)-20):]...)
		st.ReplansTotal, st.ReplansUnchanged = e.nextPlan, e.unchanged
		st.Persist = e.persistStatus()
	})
	return st
}

// sessionWholeCost charges a session the whole price of every serving
// instance it has a load on, shared pro rata by load fraction with other
// sessions on the same instance.
func sessionWholeCost(s *session, e *Engine) float64 {
	var cost float64
	for _, in := range e.insts {
		if in.state == "warm" {
			continue
		}
		var mine, all float64
		for _, l := range in.loads {
			all += l.Fraction
			if l.App == s.app.Name {
				mine += l.Fraction
			}
		}
		if all > 0 && mine > 0 {
			price := 0.0
			for _, w := range s.cat.Workers() {
				if w.Type == in.typ {
					price = w.Price
				}
			}
			cost += price * mine / all
		}
	}
	return cost
}

// Replans returns every re-plan so far (the last 200).
func (e *Engine) Replans() []Replan {
	var out []Replan
	e.call(func() { out = append(out, e.replans...) })
	return out
}
