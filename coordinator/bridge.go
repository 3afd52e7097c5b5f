package coordinator

import (
	"maps"
	"slices"
	"strings"

	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/placement"
	"github.com/mdag/mdag/worker"
)

// Make before break. A plan that moves a GPU module to an instance where it
// must warm up first (a new instance, or one that did not host it) used to
// unload it at once from where it ran warm: for the warm-up's length (0.3 s
// for PRNet on a P100, 0.7 s for face's SSD on a V100, longer for a pod
// still starting) the module had no slot the scheduler could use, and the
// frames of that time waited until they could not finish (face's demo lost
// 2-3% of its frames at every join that reshuffled detect and keypoints).
// Now the instances that hosted it warm keep it loaded and routed, a
// bridge, until every instance the plan routes it to is up and warm; then
// the bridges go and an instance the plan released goes with its last one.
// The scheduler holds the warming slots (Scheduler.Hold), so while both are
// routed the frames go to the warm ones.

// bridgeLoad is a load some instance hosts warm.
type bridgeLoad struct {
	inst string
	load placement.Load
}

// warmHosts lists, by module key, the instances that host a GPU module
// warm now (its plan's loads and its bridges): up, not lost, its warm-up
// done. Taken before a plan is applied, they are what may bridge it.
func (e *Engine) warmHosts() map[string][]bridgeLoad {
	if !e.cfg.Warmup {
		return nil
	}
	out := map[string][]bridgeLoad{}
	for _, in := range e.sortedInsts() {
		if in.lost || in.pending {
			continue // (a draining one bridges too: drained, it serves until its work's new home is warm)
		}
		for _, l := range in.allLoads() {
			ms := e.gpuMod(l)
			if ms == nil || !in.gpuMods[ms.key] || in.warm[ms.key] > 0 {
				continue
			}
			out[ms.key] = append(out[ms.key], bridgeLoad{inst: in.id, load: l})
		}
	}
	return out
}

// gpuMod is the module state of load l when it is a stateless GPU module
// of a deployed app (stateful modules move with their streams' state).
func (e *Engine) gpuMod(l placement.Load) *modState {
	s := e.sessions[l.App]
	if s == nil || s.mods[l.Module] == nil {
		return nil
	}
	if ms := s.mods[l.Module]; ms.mod.Kind == dag.GPU && !ms.stateful {
		return ms
	}
	return nil
}

// hosts says whether instance id is among prev's hosts.
func hosts(prev map[string][]bridgeLoad, id string) bool {
	for _, bs := range prev {
		for _, b := range bs {
			if b.inst == id {
				return true
			}
		}
	}
	return false
}

// bridgeTo sets the bridges of a plan whose loads are on the instances now
// (apply, before they are loaded): each GPU module that some instance of
// the plan has to warm up stays on the instances of prev that the plan
// moved it from.
func (e *Engine) bridgeTo(prev map[string][]bridgeLoad) {
	for _, in := range e.insts {
		in.bridge = nil
	}
	newHosts := map[string][]*instState{}
	for _, in := range e.sortedInsts() {
		for _, l := range in.loads {
			if ms := e.gpuMod(l); ms != nil && !slices.Contains(newHosts[ms.key], in) {
				newHosts[ms.key] = append(newHosts[ms.key], in)
			}
		}
	}
	for _, k := range slices.Sorted(maps.Keys(prev)) {
		cold := false
		for _, in := range newHosts[k] {
			if in.lost {
				continue
			}
			cold = cold || in.pending || !in.gpuMods[k] || in.warm[k] > 0
		}
		if !cold {
			continue
		}
		for _, b := range prev[k] {
			in := e.insts[b.inst]
			if in == nil || in.lost || slices.Contains(newHosts[k], in) {
				continue
			}
			in.bridge = append(in.bridge, b.load)
		}
	}
}

// endBridges takes down the bridges of module key once every instance it
// is routed to is up and warm: the bridging instances unload it (one the
// plan released goes once empty), and the scheduler is rebuilt without
// their slots.
func (e *Engine) endBridges(key string) {
	bridged := false
	for _, in := range e.insts {
		bridged = bridged || slices.ContainsFunc(in.bridge, func(l placement.Load) bool { return e.keyOf(l) == key })
	}
	if !bridged {
		return
	}
	var ms *modState // nil: its app is no longer deployed
	app, mod, _ := strings.Cut(key, "/")
	if s := e.sessions[dag.AppID(app)]; s != nil {
		ms = s.mods[dag.ModuleID(mod)]
	}
	// Every instance the plan put it on is up and warm, and there is one:
	// a host lost meanwhile (its re-plan not yet applied) or whose load
	// failed (its warm-up came back not-loaded) leaves the bridge up.
	hosted := false
	for _, in := range e.insts {
		if in.lost || !slices.ContainsFunc(in.loads, func(l placement.Load) bool { return e.keyOf(l) == key }) {
			continue
		}
		if in.pending || in.warm[key] > 0 || !in.gpuMods[key] {
			return // still starting or warming (or not loaded) somewhere the plan put it
		}
		hosted = true
	}
	if !hosted {
		return
	}
	var ended []string
	for _, in := range e.sortedInsts() {
		n := len(in.bridge)
		in.bridge = slices.DeleteFunc(in.bridge, func(l placement.Load) bool { return e.keyOf(l) == key })
		if len(in.bridge) == n {
			continue
		}
		ended = append(ended, in.id)
		if ms != nil {
			ms.routes = slices.DeleteFunc(ms.routes, func(r route) bool { return r.inst == in.id })
			delete(ms.conc, in.id)
			delete(ms.gpuLat, in.id)
			delete(ms.gpuProf, in.id)
		}
		if err := e.load(in, e.hostSpecs(in, false)); err != nil {
			e.log.Warn("unloading a bridged module failed", "instance", in.id, "module", key, "err", err)
		}
	}
	e.log.Info("bridge ended: the module's new instances are warm", "module", key, "unloaded_from", strings.Join(ended, ","))
	if err := e.rebuildScheduler(); err != nil {
		e.log.Error("scheduler rebuild after a bridge failed", "err", err)
	}
	e.releaseDrained()
}

// bridgeList is the bridges up now, "INSTANCE keeps KEY", sorted.
func (e *Engine) bridgeList() []string {
	var out []string
	for _, in := range e.insts {
		for _, l := range in.bridge {
			out = append(out, in.id+" keeps "+e.keyOf(l))
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// bridgedKeys are the module keys some instance bridges, sorted.
func (e *Engine) bridgedKeys() []string {
	var out []string
	for _, in := range e.insts {
		for _, l := range in.bridge {
			out = append(out, e.keyOf(l))
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// parked is what an instance the plan keeps idle (Warm, until its turn-off
// delay) goes on hosting, unrouted: the GPU modules it hosts now, of apps
// still deployed. Unloading them saved nothing (the instance is paid for
// until it goes) and a stream that came back within the delay met a
// "reuse-warm" instance that had to warm up again (caption's S2VT: 3.4 s
// cold against a 2.5 s SLO, the frames of the join lost). A later plan
// that loads something else there replaces them.
func (e *Engine) parked(in *instState) []worker.ModuleSpec {
	if in.state != placement.Warm || in.releasing || in.draining || in.lost || len(in.bridge) > 0 {
		return nil
	}
	var out []worker.ModuleSpec
	for _, sp := range in.hosted {
		if sp.Kind != dag.GPU {
			continue
		}
		s := e.sessions[sp.App]
		if s == nil || s.mods[sp.Module] == nil || s.mods[sp.Module].mod.Model != sp.Model || s.mods[sp.Module].stateful {
			continue
		}
		out = append(out, sp)
	}
	return out
}

// hostSpecs is what instance in hosts: its loads' and bridges' specs
// (specsFor), or, when it has none, the models it keeps parked.
func (e *Engine) hostSpecs(in *instState, routed bool) []worker.ModuleSpec {
	if specs := e.specsFor(in, routed); len(specs) > 0 {
		return specs
	}
	return e.parked(in)
}

// keyOf is load l's module key ("" for an app no longer deployed).
func (e *Engine) keyOf(l placement.Load) string {
	if s := e.sessions[l.App]; s != nil && s.mods[l.Module] != nil {
		return s.mods[l.Module].key
	}
	return ""
}
