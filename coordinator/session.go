package coordinator

import (
	"maps"
	"slices"
	"time"

	"github.com/mdag/mdag/allocator"
	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/modules"
	"github.com/mdag/mdag/placement"
	"github.com/mdag/mdag/profile"
	"github.com/mdag/mdag/scheduler"
)

// session aggregates every stream of one app.
type session struct {
	app     *dag.App
	g       *dag.Graph
	cat     *profile.Catalog // what plans use: base at frame (framesize.go)
	base    *profile.Catalog // the deployed catalog, at the profiles' planning size
	frame   profile.FrameSize
	streams map[string]*stream
	resume  map[string]uint64 // restored streams not back yet: the next sequence number each was due to send
	frames  map[frameKey]*frame
	mods    map[dag.ModuleID]*modState
	acct    *accounting
	det     *detector
	// headroom multiplies the engine's headroom for this session: raised
	// by finish-rate triggers, back to 1 when the last stream leaves.
	headroom float64
	mx       AppObserver
	planned  chan struct{} // closed when the first plan is applied (or failed)

	alloc      *allocator.Allocation
	plan       *placement.Plan
	rate       float64 // ingress rate the plan is for
	scale      map[dag.ModuleID]float64
	balloon    map[dag.ModuleID]float64
	reserve    time.Duration // of the SLO, for the ingest delay (the plan's)
	admit      float64       // share of frames the plan carries; below 1 the rest are shed at ingest
	degraded   string        // why the plan is not the one the session asks for ("" when it is)
	ingestOver string        // set while frames reach the session later than half the SLO

	ingest    []time.Duration // ring of recent ingest delays: capture to the session
	ingestPos int
	reserveAt time.Time                      // when an ingest trigger last asked for a re-plan
	minTail   map[dag.ModuleID]time.Duration // fastest possible time from a module's output to the end
	planTail  map[dag.ModuleID]time.Duration // the plan's time from a module's output to the end (its budgets, GPU ones with the dispatch margin)

	// Stateful modules (affinity.go): which, in graph order; each
	// module's ancestors; each stream's open frames.
	stateful     bool
	statefulMods []dag.ModuleID
	upstream     map[dag.ModuleID][]dag.ModuleID
	open         map[string]map[uint64]*frame
}

// modState is one module of a session at run time.
type modState struct {
	mod       *dag.Module
	key       string
	model     scheduler.ModelID
	budget    time.Duration // the allocation's latency for the module
	fastest   time.Duration // fastest profiled l(1) on any worker type
	routes    []route
	conc      map[string]int             // per instance: pool size
	latency   map[string]time.Duration   // per instance: profiled time of one item
	gpuLat    map[string][]time.Duration // per instance: l(b) the scheduler plans with (ballooned)
	cpuProf   map[string]time.Duration   // per instance: profiled, for the ballooning signal
	gpuProf   map[string][]time.Duration
	scheduled bool
	// The scheduler's cannot-finish drops since a batch of the module last
	// finished, and when that was: an estimate that lets nothing run is
	// re-measured (probe), not trusted for ever.
	expired  int
	lastDone time.Time
	// Stateful modules: each stream's state place, the state events since
	// deploy, the last said in words, and recent migration pauses.
	stateful  bool
	affs      map[string]*affinity
	hostConc  map[string]int // per instance: the pool size it last hosted the module with
	events    map[string]int
	lastEvent string
	pauses    []time.Duration
	obs       modObs
	last      ModuleStatus
	mx        ModuleObserver
}

type route struct {
	inst   string
	weight float64
}

// modObs counts what a module did in the current adaptation window.
type modObs struct {
	Observation
	measured time.Duration // tasks measured against a profile: their execution time
	profiled time.Duration // and what the profile expected
	balloonN int
	batches  int
	tasks    int
	execSum  time.Duration
	latSum   time.Duration // items: entering the module to its result
	latN     int
	dropped  int
	rejected int
}

// expected is the profiled time of a task of b items on instance id (not
// inflated by the plan's ballooning factor: the ratio to it is the signal).
func (ms *modState) expected(id string, b int) time.Duration {
	if l := ms.gpuProf[id]; len(l) > 0 {
		return l[min(b, len(l))-1]
	}
	return ms.cpuProf[id] * time.Duration(max(1, b))
}

func newSession(app *dag.App, g *dag.Graph, cat *profile.Catalog, ac AdaptConfig) *session {
	s := &session{app: app, g: g, cat: cat, base: cat, streams: map[string]*stream{}, frames: map[frameKey]*frame{},
		mods: map[dag.ModuleID]*modState{}, acct: newAccounting(), planned: make(chan struct{}),
		scale: map[dag.ModuleID]float64{}, balloon: map[dag.ModuleID]float64{}, headroom: 1, admit: 1}
	if cat != nil && cat.File != nil {
		s.frame = cat.File.Plan.Frame // zero: each target's largest measured size
	}
	def := map[dag.ModuleID]float64{}
	for i := range app.Modules {
		m := &app.Modules[i]
		ms := &modState{mod: m, key: string(app.Name) + "/" + string(m.Name), model: scheduler.ModelID(string(app.Name) + "/" + string(m.Name)),
			last: ModuleStatus{Module: m.Name, Kind: m.Kind}}
		for _, c := range cat.Configs(m.Name) {
			if c.Batch == 1 && (ms.fastest == 0 || c.Latency < ms.fastest) {
				ms.fastest = c.Latency
			}
		}
		s.mods[m.Name] = ms
		def[m.Name] = g.Scale(m.Name, nil)
	}
	s.upstream, s.open = map[dag.ModuleID][]dag.ModuleID{}, map[string]map[uint64]*frame{}
	for _, m := range g.Order() {
		var up []dag.ModuleID
		for _, in := range g.Inputs(m) {
			up = append(up, in)
			up = append(up, s.upstream[in]...)
		}
		slices.Sort(up)
		s.upstream[m] = slices.Compact(up)
		ms := s.mods[m]
		if ms.mod.Kind == dag.CPU && statefulOp(ms.mod) {
			ms.stateful, ms.affs, ms.hostConc = true, map[string]*affinity{}, map[string]int{}
			s.stateful = true
			s.statefulMods = append(s.statefulMods, m)
		}
	}
	s.det = newDetector(ac, def)
	s.minTail = tails(g, func(m dag.ModuleID) time.Duration { return s.mods[m].fastest })
	return s
}

// forget drops what the session's streams taught it (the last one left):
// the next plan uses the app's scaling factors, the profiles' execution
// times and the engine's headroom.
func (s *session) forget() {
	s.scale, s.balloon, s.headroom = map[dag.ModuleID]float64{}, map[dag.ModuleID]float64{}, 1
	s.det.Forget()
}

// tails is, per module, the longest path from its output to a sink when
// each module takes lat (the module itself excluded).
func tails(g *dag.Graph, lat func(dag.ModuleID) time.Duration) map[dag.ModuleID]time.Duration {
	out := map[dag.ModuleID]time.Duration{}
	order := g.Order()
	for i := len(order) - 1; i >= 0; i-- {
		m := order[i]
		var t time.Duration
		for _, d := range g.Outputs(m) {
			t = max(t, lat(d)+out[d])
		}
		out[m] = t
	}
	return out
}

// ingress is the session's frame rate: the sum of its streams' (each the
// app's fps unless it joined with its own, JoinAt), and the app's fps for
// each stream short of App.Warm.
func (s *session) ingress() float64 {
	r := 0.0
	for _, id := range slices.Sorted(maps.Keys(s.streams)) { // one order: the same sum every run
		st := s.streams[id]
		if st.fps > 0 {
			r += st.fps
		} else {
			r += s.app.FPS
		}
	}
	if n := len(s.streams); n < s.app.Warm {
		r += float64(s.app.Warm-n) * s.app.FPS // capacity kept warm (App.Warm)
	}
	return r
}

// ingestRing is how many recent ingest delays a session keeps.
const ingestRing = 512

// sawIngest records a frame's delay from capture to the session.
func (s *session) sawIngest(d time.Duration) {
	d = max(0, d)
	if len(s.ingest) < ingestRing {
		s.ingest = append(s.ingest, d)
		return
	}
	s.ingest[s.ingestPos] = d
	s.ingestPos = (s.ingestPos + 1) % ingestRing
}

// ingestP95 is the 95th percentile of the recent ingest delays (false
// with fewer than 20).
func (s *session) ingestP95() (time.Duration, bool) {
	if len(s.ingest) < 20 {
		return 0, false
	}
	return time.Duration(pct(s.ingest, 0.95) * float64(time.Millisecond)), true
}

// ingestReserve is what a plan keeps of the SLO for the ingest delay: its
// recent p95 to the millisecond, at most half the SLO (beyond that frames
// are late whatever the graph does; the graph keeps a fair share).
func (s *session) ingestReserve() time.Duration {
	d, ok := s.ingestP95()
	if !ok {
		return 0
	}
	return min(d.Round(time.Millisecond), s.app.SLO/2)
}

// statefulOp says whether a CPU module keeps per-stream state: its op is
// declared stateful (the YAML's `stateful: true` is documentation the
// validator checks against the op; the op decides).
func statefulOp(m *dag.Module) bool {
	op, ok := modules.Lookup(modules.OpID(m.Op))
	return ok && op.Stateful
}
