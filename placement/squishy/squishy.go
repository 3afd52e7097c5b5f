// Package squishy is Nexus's squishy bin packing (Nexus Section 6.1,
// Algorithm 1): model sessions, each a batch profile under a latency SLO at
// a request rate, onto GPUs with duty cycles. Pack plans from nothing;
// Repack keeps sessions where they still fit and counts the moves. Both
// are pure functions of their inputs that return a plan with diagnostics.
// The package is pure Go and imports only profile and the standard
// library, so the Nexus scheduler (scheduler) uses it without lp_solve.
package squishy

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/mdag/mdag/profile"
)

// BatchProfile gives a model's batch execution latency l(b) for the batch
// sizes it runs, ascending. Nexus only assumes l(b)/b does not grow with b.
type BatchProfile struct {
	Batches []int
	Latency []time.Duration
}

// LinearProfile is l(b) = alpha*b + beta for b = 1..maxBatch.
func LinearProfile(alpha, beta time.Duration, maxBatch int) BatchProfile {
	var p BatchProfile
	for b := 1; b <= maxBatch; b++ {
		p.Batches = append(p.Batches, b)
		p.Latency = append(p.Latency, alpha*time.Duration(b)+beta)
	}
	return p
}

// atLeast returns the smallest profiled batch >= b and its latency.
func (p BatchProfile) atLeast(b int) (int, time.Duration, bool) {
	i, _ := slices.BinarySearch(p.Batches, b)
	if i == len(p.Batches) {
		return 0, 0, false
	}
	return p.Batches[i], p.Latency[i], true
}

// Session is a model served under one latency SLO at a request rate, Nexus's
// unit of scheduling.
type Session struct {
	ID      string
	Model   string
	SLO     time.Duration
	Rate    float64
	Profile BatchProfile
	Memory  profile.Bytes
}

// Assignment is a session's share of one GPU.
type Assignment struct {
	Session string        `json:"session"`
	Model   string        `json:"model"`
	Batch   int           `json:"batch"`
	Latency time.Duration `json:"-"`
	Rate    float64       `json:"rate"` // requests/s this GPU carries for the session
	// Worst is the worst-case latency: 2 l(b) on a saturated GPU, duty
	// cycle + l(b) on a shared one.
	Worst time.Duration `json:"-"`

	LatencyMS float64 `json:"latency_ms"`
	WorstMS   float64 `json:"worst_ms"`
}

// GPU is one packed GPU.
type GPU struct {
	ID        int           `json:"gpu"`
	Saturated bool          `json:"saturated"` // one session running back to back at its largest batch
	DutyCycle time.Duration `json:"-"`
	Occupancy float64       `json:"occupancy"` // sum of l(b) / duty cycle
	Memory    profile.Bytes `json:"memory"`
	Sessions  []Assignment  `json:"sessions"`

	DutyCycleMS float64 `json:"duty_cycle_ms"`
}

// SessionError says why a session could not be scheduled at all.
type SessionError struct {
	Session string `json:"session"`
	Reason  string `json:"reason"`
}

// PackResult is the outcome of Pack or Repack.
type PackResult struct {
	GPUs          []GPU          `json:"gpus"`
	Unschedulable []SessionError `json:"unschedulable,omitempty"`
	// LowerBound is sum over sessions of rate / (best single-GPU
	// throughput); Efficiency is LowerBound / GPUs used (Nexus's measure).
	LowerBound float64 `json:"lower_bound_gpus"`
	Efficiency float64 `json:"efficiency"`
	// DutyBound is the fewest GPUs any duty-cycle packing of these loads
	// can use: the saturated GPUs plus each residual's occupancy when alone
	// (merging only shrinks batches, which raises occupancy). Packing
	// efficiency is DutyBound / GPUs used: how well the packer did, apart
	// from what the SLOs and rates force.
	DutyBound         float64 `json:"duty_bound_gpus"`
	PackingEfficiency float64 `json:"packing_efficiency"`
	// Moves counts sessions that changed GPU and GPUs started or released
	// (Repack only).
	Moves int `json:"moves"`
}

// PackOptions bounds the packing.
type PackOptions struct {
	GPUMemory profile.Bytes // per GPU; 0 means no limit
}

// saturation is ScheduleSaturate's answer for one session.
type saturation struct {
	batch int
	lat   time.Duration
	tput  float64 // requests/s of one GPU at that batch
	n     int     // whole GPUs
	rest  float64 // residual rate
}

// saturate finds the largest batch with 2 l(b) <= SLO. A session with no
// such batch (Nexus bug uwsampl/nexus#21: "largest batch 0") is an error for
// that session, not a crash.
func saturate(s Session) (saturation, error) {
	if len(s.Profile.Batches) == 0 {
		return saturation{}, fmt.Errorf("no batch profile")
	}
	if s.Rate <= 0 {
		return saturation{}, fmt.Errorf("rate must be > 0, got %g", s.Rate)
	}
	best := -1
	for i := range s.Profile.Batches {
		if 2*s.Profile.Latency[i] <= s.SLO {
			best = i
		}
	}
	if best < 0 {
		return saturation{}, fmt.Errorf("profile too slow for the SLO: even batch %d takes %v, and 2 x %v > %v",
			s.Profile.Batches[0], s.Profile.Latency[0], s.Profile.Latency[0], s.SLO)
	}
	sat := saturation{batch: s.Profile.Batches[best], lat: s.Profile.Latency[best]}
	sat.tput = float64(sat.batch) / sat.lat.Seconds()
	sat.n = int(math.Floor(s.Rate/sat.tput + 1e-9))
	sat.rest = s.Rate - float64(sat.n)*sat.tput
	if sat.rest < 1e-9*s.Rate {
		sat.rest = 0
	}
	return sat, nil
}

// node is a shared GPU during packing: sessions with residual rates in one
// duty cycle.
type node struct {
	id      int
	duty    time.Duration
	members []member
}

type member struct {
	s    *Session
	rate float64
	b    int
	lat  time.Duration
}

func (n *node) occupancy() float64 {
	var sum time.Duration
	for _, m := range n.members {
		sum += m.lat
	}
	return float64(sum) / float64(n.duty)
}

// residue is ScheduleResidue for one residual load: the largest batch with
// l(b) + b/r <= SLO and its duty cycle b/r. When even the smallest batch
// cannot gather in time (a very low rate) the duty cycle is cut to
// SLO - l(b): the GPU runs partly filled batches, over-provisioned but within
// the SLO.
func residue(s *Session, r float64) (member, time.Duration, bool) {
	p := s.Profile
	for i := len(p.Batches) - 1; i >= 0; i-- {
		d := time.Duration(float64(p.Batches[i]) / r * float64(time.Second))
		if p.Latency[i]+d <= s.SLO {
			return member{s: s, rate: r, b: p.Batches[i], lat: p.Latency[i]}, d, true
		}
	}
	if d := s.SLO - p.Latency[0]; d >= p.Latency[0] {
		return member{s: s, rate: r, b: p.Batches[0], lat: p.Latency[0]}, d, true
	}
	return member{}, 0, false
}

// merged returns the node n would become with extra added (or just n
// re-fitted when extra is nil) under duty cycle min(d_n, d_extra): each
// session's batch becomes the smallest profiled one >= d*r (so its rate is
// met), and the batches must fit in the duty cycle, each session's SLO and
// the GPU's memory.
func merged(members []member, duty time.Duration, mem profile.Bytes) ([]member, bool) {
	var sum time.Duration
	var used profile.Bytes
	out := make([]member, len(members))
	for i, m := range members {
		want := max(1, int(math.Ceil(duty.Seconds()*m.rate-1e-9)))
		b, lat, ok := m.s.Profile.atLeast(want)
		if !ok || duty+lat > m.s.SLO {
			return nil, false
		}
		out[i] = member{s: m.s, rate: m.rate, b: b, lat: lat}
		sum += lat
		used += m.s.Memory
	}
	if sum > duty || mem > 0 && used > mem {
		return nil, false
	}
	return out, true
}

// Pack runs Nexus's squishy bin packing (Algorithm 1): whole GPUs for each
// session's saturating load, then its residual loads merged best-fit
// decreasing by occupancy into shared GPUs with duty cycles.
func Pack(sessions []Session, opt PackOptions) PackResult {
	return Repack(nil, sessions, opt)
}

// Repack packs sessions incrementally from a previous result (Nexus Section
// 6.1, "incremental across epochs"): sessions stay on their GPUs while they
// fit; an overloaded GPU evicts its smallest sessions until it fits; when the
// total load fell, the least used shared GPUs are emptied into others where
// possible; evicted and new loads are packed best fit. With prev nil it is
// Pack. An unchanged input gives the same GPUs and no moves.
func Repack(prev []GPU, sessions []Session, opt PackOptions) PackResult {
	var res PackResult
	byID := map[string]*Session{}
	sats := map[string]saturation{}
	var order []*Session
	for i := range sessions {
		s := &sessions[i]
		if s.ID == "" {
			s.ID = fmt.Sprintf("%s@%v", s.Model, s.SLO)
		}
		sat, err := saturate(*s)
		if err != nil {
			res.Unschedulable = append(res.Unschedulable, SessionError{Session: s.ID, Reason: err.Error()})
			continue
		}
		if opt.GPUMemory > 0 && s.Memory > opt.GPUMemory {
			res.Unschedulable = append(res.Unschedulable, SessionError{Session: s.ID,
				Reason: fmt.Sprintf("model needs %v of GPU memory, a GPU has %v", s.Memory, opt.GPUMemory)})
			continue
		}
		byID[s.ID], sats[s.ID] = s, sat
		order = append(order, s)
		res.LowerBound += s.Rate / sat.tput
	}
	nextID := 0
	for _, g := range prev {
		nextID = max(nextID, g.ID+1)
	}
	newID := func() int { nextID++; return nextID - 1 }
	where := map[string]map[int]bool{} // session -> GPUs it was on before
	for _, g := range prev {
		for _, a := range g.Sessions {
			if where[a.Session] == nil {
				where[a.Session] = map[int]bool{}
			}
			where[a.Session][g.ID] = true
		}
	}
	var prevLoad float64
	for _, g := range prev {
		for _, a := range g.Sessions {
			prevLoad += a.Rate
		}
	}
	var newLoad float64
	for _, s := range order {
		newLoad += s.Rate
	}

	// Saturated GPUs: keep a session's previous ones first.
	var gpus []GPU
	for _, s := range order {
		sat := sats[s.ID]
		res.DutyBound += float64(sat.n)
		for k := 0; k < sat.n; k++ {
			id := reuseSaturated(prev, s.ID, gpus, newID)
			gpus = append(gpus, GPU{ID: id, Saturated: true, DutyCycle: sat.lat, Occupancy: 1, Memory: s.Memory,
				Sessions: []Assignment{{Session: s.ID, Model: s.Model, Batch: sat.batch, Latency: sat.lat, Rate: sat.tput, Worst: 2 * sat.lat}}})
		}
	}

	// Residual loads, and the previous shared GPUs re-fitted to them.
	resid := map[string]member{}
	duty := map[string]time.Duration{}
	for _, s := range order {
		r := sats[s.ID].rest
		if r <= 0 {
			continue
		}
		m, d, ok := residue(s, r)
		if !ok || m.lat > d {
			// No batch gathers in time, or the one that does runs longer
			// than its own duty cycle (occupancy > 1: Algorithm 1 assumes
			// this never happens). One more GPU at the saturating batch
			// carries the residual within the SLO.
			sat := sats[s.ID]
			res.DutyBound++
			gpus = append(gpus, GPU{ID: reuseSaturated(prev, s.ID, gpus, newID), Saturated: true, DutyCycle: sat.lat,
				Occupancy: r / sat.tput, Memory: s.Memory,
				Sessions: []Assignment{{Session: s.ID, Model: s.Model, Batch: sat.batch, Latency: sat.lat, Rate: r, Worst: 2 * sat.lat}}})
			continue
		}
		resid[s.ID], duty[s.ID] = m, d
		res.DutyBound += float64(m.lat) / float64(d)
	}
	var nodes []*node
	placed := map[string]bool{}
	for _, g := range prev {
		if g.Saturated {
			continue
		}
		n := &node{id: g.ID, duty: time.Duration(math.MaxInt64)}
		for _, a := range g.Sessions {
			if m, ok := resid[a.Session]; ok && !placed[a.Session] {
				n.members = append(n.members, m)
				n.duty = min(n.duty, duty[a.Session])
				placed[a.Session] = true
			}
		}
		if len(n.members) == 0 {
			continue
		}
		// Evict the smallest sessions until the GPU fits again.
		for {
			if fitted, ok := merged(n.members, n.duty, opt.GPUMemory); ok {
				n.members = fitted
				break
			}
			small := 0
			for i, m := range n.members {
				if float64(m.lat)/float64(duty[m.s.ID]) < float64(n.members[small].lat)/float64(duty[n.members[small].s.ID]) {
					small = i
				}
			}
			placed[n.members[small].s.ID] = false
			n.members = slices.Delete(n.members, small, small+1)
			n.duty = time.Duration(math.MaxInt64)
			for _, m := range n.members {
				n.duty = min(n.duty, duty[m.s.ID])
			}
			if len(n.members) == 0 {
				break
			}
		}
		if len(n.members) > 0 {
			nodes = append(nodes, n)
		}
	}
	// Load fell: try to empty the least used shared GPUs into the others.
	if prev != nil && newLoad < prevLoad*(1-1e-9) {
		slices.SortStableFunc(nodes, func(a, b *node) int { return cmp.Compare(a.occupancy(), b.occupancy()) })
		for i := 0; i < len(nodes); i++ {
			src := nodes[i]
			trial := make([]*node, 0, len(nodes))
			for _, n := range nodes {
				if n != src {
					c := *n
					c.members = slices.Clone(n.members)
					trial = append(trial, &c)
				}
			}
			ok := true
			for _, m := range src.members {
				if !mergeBest(trial, m, duty[m.s.ID], opt.GPUMemory) {
					ok = false
					break
				}
			}
			if ok {
				nodes = trial
				i = -1 // start over from the least used
			}
		}
	}
	// ScheduleResidue: the rest, by decreasing occupancy, best fit.
	var pending []member
	for _, s := range order {
		if m, ok := resid[s.ID]; ok && !placed[s.ID] {
			pending = append(pending, m)
		}
	}
	slices.SortStableFunc(pending, func(a, b member) int {
		oa, ob := float64(a.lat)/float64(duty[a.s.ID]), float64(b.lat)/float64(duty[b.s.ID])
		return cmp.Or(cmp.Compare(ob, oa), cmp.Compare(a.s.ID, b.s.ID))
	})
	slices.SortStableFunc(nodes, func(a, b *node) int { return cmp.Compare(a.id, b.id) })
	for _, m := range pending {
		if !mergeBest(nodes, m, duty[m.s.ID], opt.GPUMemory) {
			nodes = append(nodes, &node{id: newID(), duty: duty[m.s.ID], members: []member{m}})
		}
	}
	for _, n := range nodes {
		g := GPU{ID: n.id, DutyCycle: n.duty, Occupancy: n.occupancy()}
		for _, m := range n.members {
			g.Memory += m.s.Memory
			g.Sessions = append(g.Sessions, Assignment{Session: m.s.ID, Model: m.s.Model, Batch: m.b, Latency: m.lat,
				Rate: m.rate, Worst: n.duty + m.lat})
		}
		gpus = append(gpus, g)
	}
	slices.SortFunc(gpus, func(a, b GPU) int { return cmp.Compare(a.ID, b.ID) })
	for i := range gpus {
		g := &gpus[i]
		g.DutyCycleMS = msf(g.DutyCycle)
		for j := range g.Sessions {
			g.Sessions[j].LatencyMS, g.Sessions[j].WorstMS = msf(g.Sessions[j].Latency), msf(g.Sessions[j].Worst)
		}
	}
	res.GPUs = gpus
	if len(gpus) > 0 {
		res.Efficiency = res.LowerBound / float64(len(gpus))
		res.PackingEfficiency = res.DutyBound / float64(len(gpus))
	}
	// Moves: sessions now on a GPU they were not on, GPUs started, GPUs released.
	if prev != nil {
		now := map[int]bool{}
		for _, g := range gpus {
			now[g.ID] = true
			for _, a := range g.Sessions {
				if !where[a.Session][g.ID] {
					res.Moves++
				}
			}
		}
		for _, g := range prev {
			if !now[g.ID] {
				res.Moves++
			}
		}
		for _, g := range gpus {
			if !slices.ContainsFunc(prev, func(p GPU) bool { return p.ID == g.ID }) {
				res.Moves++
			}
		}
	}
	return res
}

// mergeBest merges m into the node where it wastes the least: the smallest
// growth in occupancy beyond m's own (a merge that shrinks the node's
// batches to a shorter duty cycle costs GPU time), ties going to the
// fullest result (best fit). Nexus's Algorithm 1 takes the fullest result
// outright, which rewards exactly the merges that shrink batches. On the
// benchmark grid this choice was never worse and saved 9 of 864 GPUs at 1000
// sessions (docs/benchmarks.md). False when m fits nowhere.
func mergeBest(nodes []*node, m member, d time.Duration, mem profile.Bytes) bool {
	alone := float64(m.lat) / float64(d)
	var best *node
	var bestMembers []member
	var bestDuty time.Duration
	bestWaste, bestOcc := math.Inf(1), -1.0
	for _, n := range nodes {
		nd := min(n.duty, d)
		members, ok := merged(append(slices.Clone(n.members), m), nd, mem)
		if !ok {
			continue
		}
		c := node{duty: nd, members: members}
		occ := c.occupancy()
		waste := occ - n.occupancy() - alone
		if waste < bestWaste-1e-9 || math.Abs(waste-bestWaste) <= 1e-9 && occ > bestOcc {
			best, bestMembers, bestDuty, bestWaste, bestOcc = n, members, nd, waste, occ
		}
	}
	if best == nil {
		return false
	}
	best.members, best.duty = bestMembers, bestDuty
	return true
}

func msf(d time.Duration) float64 {
	return math.Round(float64(d)/float64(time.Millisecond)*1000) / 1000
}

// reuseSaturated returns the ID of a GPU that was saturated by the session
// before and is not taken yet, or a new ID.
func reuseSaturated(prev []GPU, session string, taken []GPU, newID func() int) int {
	for _, g := range prev {
		if g.Saturated && len(g.Sessions) == 1 && g.Sessions[0].Session == session &&
			!slices.ContainsFunc(taken, func(t GPU) bool { return t.ID == g.ID }) {
			return g.ID
		}
	}
	return newID()
}
