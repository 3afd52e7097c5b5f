// Package placement turns allocations into instances (Scrooge Section
// 3.4). Place is a pure function over a snapshot that returns a plan with
// diagnostics; the caller applies the plan. Full allocations take whole
// instances; partial allocations are packed best-fit by input-rate
// proportionality across modules and apps; instances that already have a
// module loaded are preferred; unused instances wait warm for a turn-off
// delay before release; a plan moves as little as possible from the
// previous one; a worker type that runs out is reported so allocation can
// be re-run without it.
//
// The package is pure Go: it imports allocator (for Demands), dag, modules,
// profile and the standard library, never lp_solve. Its neighbours:
// placement/squishy (Nexus's squishy bin packing, pure),
// placement/partition (Symphony's sub-cluster partitioning, the one that
// links lp_solve) and placement/spec (the CLI's YAML inputs).
package placement

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/mdag/mdag/allocator"
	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/modules"
	"github.com/mdag/mdag/profile"
)

// InstanceID names a worker instance.
type InstanceID string

// State is an instance's lifecycle state.
type State string

const (
	Active   State = "active"   // serving
	Starting State = "starting" // requested, not yet serving; counts as active capacity
	Warm     State = "warm"     // idle, kept (models loaded) until ReleaseAt
	// Draining: an operator asked the instance to be emptied (mdag drain):
	// it takes no loads, its loads move elsewhere (stateful modules'
	// state with them) and it counts towards its type's limit until it
	// goes.
	Draining State = "draining"
)

// Load is one module's share of an instance.
type Load struct {
	App         dag.AppID    `json:"app" yaml:"app"`
	Module      dag.ModuleID `json:"module" yaml:"module"`
	Full        bool         `json:"full" yaml:"full"`
	Batch       int          `json:"batch" yaml:"batch"`
	Concurrency int          `json:"concurrency" yaml:"concurrency"`
	Rate        float64      `json:"rate" yaml:"rate"`
	Fraction    float64      `json:"fraction" yaml:"fraction"` // rate / capacity; 1 for a full instance
	Stateful    bool         `json:"stateful,omitempty" yaml:"stateful"`
}

// Instance is a worker instance in a snapshot or a plan.
type Instance struct {
	ID        InstanceID           `json:"id" yaml:"id"`
	Type      profile.WorkerTypeID `json:"type" yaml:"type"`
	State     State                `json:"state" yaml:"state"`
	ReleaseAt time.Time            `json:"release_at,omitzero" yaml:"-"` // warm instances
	Loads     []Load               `json:"loads" yaml:"modules"`
	// Loaded lists modules whose weights a warm instance still holds.
	Loaded []dag.ModuleID `json:"loaded,omitempty" yaml:"loaded"`
}

// Used is the fraction of the instance's capacity its loads take.
func (in *Instance) Used() float64 {
	var u float64
	for _, l := range in.Loads {
		u += l.Fraction
	}
	return u
}

// Snapshot is the cluster as the planner sees it.
type Snapshot struct {
	Now          time.Time
	Instances    []Instance
	Limits       map[profile.WorkerTypeID]int // most instances per type (active, starting and warm); absent = no limit
	TurnOffDelay time.Duration                // how long an unused instance stays warm; default 30 s
	Prices       map[profile.WorkerTypeID]float64
	// Idle lists apps that need nothing now (no streams): their loads are
	// removed like those of planned apps, though they have no demands.
	Idle []dag.AppID
	// NextID is, per type, the least number a new instance's ID (TYPE-N)
	// may take, so that a caller's IDs of instances gone are not given
	// again; absent: one past the snapshot's highest of the type.
	NextID map[profile.WorkerTypeID]int
}

// Demand is one module's allocation to place.
type Demand struct {
	App      dag.AppID
	Module   dag.ModuleID
	Stateful bool
	Choice   profile.Choice
}

// MoveKind names a step of a plan.
type MoveKind string

const (
	StartInstance   MoveKind = "start"      // request a new instance
	ReuseWarm       MoveKind = "reuse-warm" // put a warm instance back to work
	StopInstance    MoveKind = "stop"       // nothing left on it: keep it warm
	ReleaseInstance MoveKind = "release"    // warm past the turn-off delay: give it back
	LoadModule      MoveKind = "load"       // load a module onto an instance
	UnloadModule    MoveKind = "unload"     // remove a module from an instance
	Reroute         MoveKind = "reroute"    // same placement, different rate or configuration
	MigrateState    MoveKind = "migrate"    // a stateful module's streams move: state must follow
)

// DefaultTurnOff is how long an unused instance stays warm by default
// (Scrooge Section 3.6).
const DefaultTurnOff = 30 * time.Second

// Move is one step of a plan, with its reason.
type Move struct {
	Kind     MoveKind             `json:"kind"`
	Instance InstanceID           `json:"instance"`
	Type     profile.WorkerTypeID `json:"type"`
	App      dag.AppID            `json:"app,omitempty"`
	Module   dag.ModuleID         `json:"module,omitempty"`
	From     InstanceID           `json:"from,omitempty"`
	Reason   string               `json:"reason"`
}

// Shortage says a worker type ran out: allocation should be re-run without it.
type Shortage struct {
	Type   profile.WorkerTypeID `json:"type"`
	Needed int                  `json:"needed"` // instances that could not be had
	Limit  int                  `json:"limit"`
}

// Plan is the outcome of Place.
type Plan struct {
	Instances      []Instance `json:"instances"` // active, starting and warm, sorted by ID
	Moves          []Move     `json:"moves"`
	CostWhole      float64    `json:"cost_whole_per_hour"`      // active and starting instances at full price
	CostFractional float64    `json:"cost_fractional_per_hour"` // the allocations' pro-rata cost
	Shortages      []Shortage `json:"shortages,omitempty"`
}

// item is one thing to put on an instance: a full instance's worth of a
// module, or a module's partial allocation.
type item struct {
	app      dag.AppID
	module   dag.ModuleID
	stateful bool
	typ      profile.WorkerTypeID
	load     Load
	seq      int // for full items: which of the module's full instances
}

func (it item) key() string {
	kind := "partial"
	if it.load.Full {
		kind = "full"
	}
	return fmt.Sprintf("%s/%s/%s", it.app, it.module, kind)
}

// CapacityEps absorbs float noise when fractions add up to exactly 1: an
// instance's loads may sum to 1 + CapacityEps.
const CapacityEps = 1e-9

// Place places demands on the snapshot's instances. Loads of apps not among
// the demands (nor Idle) are left as they are. It is deterministic: the same inputs give
// the same plan.
func Place(snap Snapshot, demands []Demand) Plan {
	delay := snap.TurnOffDelay
	if delay <= 0 {
		delay = DefaultTurnOff
	}
	planned := map[dag.AppID]bool{}
	for _, a := range snap.Idle {
		planned[a] = true
	}
	var items []item
	var fractional float64
	for _, d := range demands {
		planned[d.App] = true
		ch := d.Choice
		fractional += ch.Cost
		for k := 0; k < ch.N; k++ {
			items = append(items, item{d.App, d.Module, d.Stateful, ch.Full.Worker, Load{App: d.App, Module: d.Module, Full: true,
				Batch: ch.Full.Batch, Concurrency: ch.Full.Concurrency, Rate: ch.Full.Cap, Fraction: 1, Stateful: d.Stateful}, k})
		}
		if ch.T > 0 {
			items = append(items, item{d.App, d.Module, d.Stateful, ch.Partial.Worker, Load{App: d.App, Module: d.Module,
				Batch: ch.Partial.Batch, Concurrency: ch.Partial.Concurrency, Rate: ch.T, Fraction: ch.T / ch.Partial.Cap,
				Stateful: d.Stateful}, 0})
		}
	}
	// Full items first, then partials by decreasing fraction (best-fit
	// decreasing); ties in a fixed order so the plan is deterministic.
	slices.SortStableFunc(items, func(a, b item) int {
		if a.load.Full != b.load.Full {
			if a.load.Full {
				return -1
			}
			return 1
		}
		return cmp.Or(cmp.Compare(b.load.Fraction, a.load.Fraction), cmp.Compare(a.typ, b.typ),
			cmp.Compare(a.app, b.app), cmp.Compare(a.module, b.module), cmp.Compare(a.seq, b.seq))
	})

	p := &placer{snap: snap, delay: delay, planned: planned}
	p.init()
	placed := make([]bool, len(items))
	// Phase 1: keep what is already where it should be; stateful modules
	// first, since moving one moves its streams' state (a pause of their
	// frames) while moving a stateless one costs nothing but a load.
	for _, statefulPass := range []bool{true, false} {
		for i, it := range items {
			if it.stateful != statefulPass {
				continue
			}
			if in := p.findKept(it); in != nil {
				p.assign(in, it, true)
				placed[i] = true
			}
		}
	}
	// Phase 2: everything else, best fit on active instances, then warm
	// ones, then new ones.
	// Items that find no instance are packed the same way onto virtual
	// ones, to say how many instances of the type are missing.
	short := map[profile.WorkerTypeID]int{}
	virtual := map[profile.WorkerTypeID][]float64{} // used fraction per missing instance
	for i, it := range items {
		if placed[i] {
			continue
		}
		in := p.bestFit(it)
		if in == nil {
			in = p.open(it)
		}
		if in != nil {
			p.assign(in, it, false)
			continue
		}
		bins := virtual[it.typ]
		best := -1
		for b, used := range bins {
			if !it.load.Full && used < 1 && used+it.load.Fraction <= 1+CapacityEps && (best < 0 || used > bins[best]) {
				best = b
			}
		}
		if best >= 0 {
			bins[best] += it.load.Fraction
		} else {
			virtual[it.typ] = append(bins, it.load.Fraction)
			short[it.typ]++
		}
	}
	return p.finish(short, fractional)
}

type placer struct {
	snap    Snapshot
	delay   time.Duration
	planned map[dag.AppID]bool
	insts   []*Instance
	prev    map[InstanceID][]Load // loads of planned apps before this plan
	moves   []Move
	nextID  map[profile.WorkerTypeID]int
	where   map[string][]InstanceID // item key -> instances that held it before
}

func (p *placer) init() {
	p.prev = map[InstanceID][]Load{}
	p.nextID = map[profile.WorkerTypeID]int{}
	for t, n := range p.snap.NextID {
		p.nextID[t] = n
	}
	p.where = map[string][]InstanceID{}
	ids := slices.Clone(p.snap.Instances)
	slices.SortFunc(ids, func(a, b Instance) int { return cmp.Compare(a.ID, b.ID) })
	for _, src := range ids {
		in := src
		in.Loads = nil
		in.Loaded = slices.Clone(src.Loaded)
		for _, l := range src.Loads {
			if p.planned[l.App] {
				p.prev[in.ID] = append(p.prev[in.ID], l)
				k := item{app: l.App, module: l.Module, load: Load{Full: l.Full}}.key()
				p.where[k] = append(p.where[k], in.ID)
			} else {
				in.Loads = append(in.Loads, l) // another app's load stays
			}
		}
		if n, ok := numericSuffix(string(in.ID), string(in.Type)); ok && n >= p.nextID[in.Type] {
			p.nextID[in.Type] = n + 1
		}
		p.insts = append(p.insts, &in)
	}
}

func numericSuffix(id, typ string) (int, bool) {
	rest, ok := strings.CutPrefix(id, typ+"-")
	if !ok {
		return 0, false
	}
	n := 0
	for _, c := range rest {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, rest != ""
}

func fits(in *Instance, f float64) bool { return in.Used()+f <= 1+CapacityEps }

func serving(in *Instance) bool { return in.State == Active || in.State == Starting }

// findKept returns the instance that held this item in the previous plan,
// if it is still serving, of the right type and has room.
func (p *placer) findKept(it item) *Instance {
	for _, id := range p.where[it.key()] {
		for _, in := range p.insts {
			if in.ID != id || in.Type != it.typ || !serving(in) || p.holds(in, it) {
				continue
			}
			if it.load.Full && len(in.Loads) > 0 || !fits(in, it.load.Fraction) {
				continue
			}
			return in
		}
	}
	return nil
}

// holds reports whether the instance already took this item in this plan.
func (p *placer) holds(in *Instance, it item) bool {
	for _, l := range in.Loads {
		if l.App == it.app && l.Module == it.module && l.Full == it.load.Full {
			return true
		}
	}
	return false
}

// bestFit returns the serving instance of the item's type with the least
// room left that still fits a partial item (full items need an empty
// instance); instances with the module loaded before win ties.
func (p *placer) bestFit(it item) *Instance {
	var best *Instance
	bestLeft := math.Inf(1)
	for _, in := range p.insts {
		if in.Type != it.typ || !serving(in) {
			continue
		}
		if it.load.Full {
			if len(in.Loads) == 0 && (best == nil || p.hadModule(in, it) && !p.hadModule(best, it)) {
				best = in
			}
			continue
		}
		if len(in.Loads) > 0 && in.Loads[0].Full || !fits(in, it.load.Fraction) {
			continue
		}
		left := 1 - in.Used() - it.load.Fraction
		if left < bestLeft-CapacityEps || math.Abs(left-bestLeft) <= CapacityEps && p.hadModule(in, it) && !p.hadModule(best, it) {
			best, bestLeft = in, left
		}
	}
	return best
}

func (p *placer) hadModule(in *Instance, it item) bool {
	if in == nil {
		return false
	}
	for _, l := range p.prev[in.ID] {
		if l.App == it.app && l.Module == it.module {
			return true
		}
	}
	return slices.Contains(in.Loaded, it.module)
}

// open puts a warm instance of the item's type back to work (one with the
// module loaded first), or starts a new one within the type's limit.
func (p *placer) open(it item) *Instance {
	var warm *Instance
	for _, in := range p.insts {
		if in.Type == it.typ && in.State == Warm && (warm == nil || p.hadModule(in, it) && !p.hadModule(warm, it)) {
			warm = in
		}
	}
	if warm != nil {
		warm.State, warm.ReleaseAt = Active, time.Time{}
		reason := "warm instance of the type"
		if p.hadModule(warm, it) {
			reason = "warm instance with the module already loaded"
		}
		p.moves = append(p.moves, Move{Kind: ReuseWarm, Instance: warm.ID, Type: warm.Type, Reason: reason})
		return warm
	}
	if limit, ok := p.snap.Limits[it.typ]; ok {
		n := 0
		for _, in := range p.insts {
			if in.Type == it.typ {
				n++
			}
		}
		if n >= limit {
			return nil
		}
	}
	id := InstanceID(fmt.Sprintf("%s-%d", it.typ, p.nextID[it.typ]))
	p.nextID[it.typ]++
	in := &Instance{ID: id, Type: it.typ, State: Starting}
	p.insts = append(p.insts, in)
	what := "no serving or warm instance of the type has room"
	if it.load.Full {
		what = "a full allocation needs a whole instance"
	}
	p.moves = append(p.moves, Move{Kind: StartInstance, Instance: id, Type: it.typ, Reason: what})
	return in
}

func (p *placer) assign(in *Instance, it item, kept bool) {
	in.Loads = append(in.Loads, it.load)
	if !slices.Contains(in.Loaded, it.module) {
		in.Loaded = append(in.Loaded, it.module)
	}
	if kept {
		for _, l := range p.prev[in.ID] {
			if l.App == it.app && l.Module == it.module && l.Full == it.load.Full &&
				(math.Abs(l.Rate-it.load.Rate) > 1e-6*math.Max(1, l.Rate) || l.Batch != it.load.Batch || l.Concurrency != it.load.Concurrency) {
				p.moves = append(p.moves, Move{Kind: Reroute, Instance: in.ID, Type: in.Type, App: it.app, Module: it.module,
					Reason: fmt.Sprintf("rate %.4g -> %.4g/s, <%d,%d> -> <%d,%d>", l.Rate, it.load.Rate, l.Batch, l.Concurrency,
						it.load.Batch, it.load.Concurrency)})
			}
		}
		return
	}
	reason := "partial allocation, best fit by residual capacity"
	if it.load.Full {
		reason = "full allocation"
	}
	p.moves = append(p.moves, Move{Kind: LoadModule, Instance: in.ID, Type: in.Type, App: it.app, Module: it.module, Reason: reason})
	if it.stateful {
		if from := p.where[it.key()]; len(from) > 0 && !slices.Contains(from, in.ID) {
			p.moves = append(p.moves, Move{Kind: MigrateState, Instance: in.ID, Type: in.Type, App: it.app, Module: it.module,
				From: from[0], Reason: "stateful module moves: its per-stream state must be migrated or rebuilt"})
		}
	}
}

func (p *placer) finish(short map[profile.WorkerTypeID]int, fractional float64) Plan {
	// Unloads: modules of planned apps that were on an instance and are no
	// longer (a kept or re-placed module is not unloaded).
	for _, in := range p.insts {
		for _, l := range p.prev[in.ID] {
			still := false
			for _, nl := range in.Loads {
				still = still || nl.App == l.App && nl.Module == l.Module && nl.Full == l.Full
			}
			if !still {
				p.moves = append(p.moves, Move{Kind: UnloadModule, Instance: in.ID, Type: in.Type, App: l.App, Module: l.Module,
					Reason: "no longer allocated here"})
			}
		}
	}
	var out []Instance
	plan := Plan{CostFractional: fractional}
	for _, in := range p.insts {
		switch {
		case serving(in) && len(in.Loads) == 0:
			in.State, in.ReleaseAt = Warm, p.snap.Now.Add(p.delay)
			p.moves = append(p.moves, Move{Kind: StopInstance, Instance: in.ID, Type: in.Type,
				Reason: fmt.Sprintf("unused: kept warm for the turn-off delay (%v)", p.delay)})
		case in.State == Warm && !in.ReleaseAt.After(p.snap.Now):
			p.moves = append(p.moves, Move{Kind: ReleaseInstance, Instance: in.ID, Type: in.Type,
				Reason: "warm past the turn-off delay"})
			continue
		}
		if serving(in) {
			plan.CostWhole += p.snap.Prices[in.Type]
		}
		out = append(out, *in)
	}
	slices.SortFunc(out, func(a, b Instance) int { return cmp.Compare(a.ID, b.ID) })
	plan.Instances = out
	plan.Moves = p.moves
	if plan.Moves == nil {
		plan.Moves = []Move{}
	}
	for t, n := range short {
		plan.Shortages = append(plan.Shortages, Shortage{Type: t, Needed: n, Limit: p.snap.Limits[t]})
	}
	slices.SortFunc(plan.Shortages, func(a, b Shortage) int { return cmp.Compare(a.Type, b.Type) })
	return plan
}

// Demands turns an app's allocation into the demands Place takes.
func Demands(app *dag.App, a *allocator.Allocation) []Demand {
	var out []Demand
	for _, m := range a.Modules {
		mod, _ := app.Module(m.Module)
		stateful := mod != nil && mod.Stateful
		if mod != nil && mod.Kind == dag.CPU {
			if op, ok := modules.Lookup(modules.OpID(mod.Op)); ok && op.Stateful {
				stateful = true
			}
		}
		out = append(out, Demand{App: app.Name, Module: m.Module, Stateful: stateful, Choice: m.Choice})
	}
	return out
}
