package coordinator

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/mdag/mdag/coordinator/why"
	"github.com/mdag/mdag/dag"
)

// AdaptConfig tunes when observed scaling and ballooning re-plan a session
// (Scrooge Section 3.5): observations are taken over short windows, a
// module must differ from what the plan assumed by more than Threshold for
// Windows evaluations in a row (hysteresis), and re-plans are at least
// MinInterval apart. Factors are bounded (MaxScale, MaxBalloon), and a
// session whose finish rate stays below FinishTarget gets more headroom.
type AdaptConfig struct {
	Window      time.Duration // default 250 ms
	Threshold   float64       // relative change, default 0.25
	Windows     int           // consecutive evaluations, default 2
	MinInterval time.Duration // default 1 s
	// MinItems is the fewest finished items an evaluation of a module's
	// scaling needs (default 4); a slower module's windows are pooled
	// until they hold that many.
	MinItems int
	// MaxScale bounds a learned scaling factor (default 64 items per
	// input); more is reported in the trigger, not planned for.
	MaxScale float64
	// MaxBalloon bounds a learned ballooning factor (default 64); more is
	// reported, not planned for. The bound is far: a model that runs 17x
	// slower than profiled (a profile taken at another frame size, a
	// starved or shared device) is planned at its real latency, since the
	// runtime drops a frame only when it cannot finish within its SLO and
	// the embedded host is never planned beyond its cores; a tighter bound
	// left such a slowdown unfixed for good.
	MaxBalloon float64
	// MinExcess is the least a task must run beyond its profiled time, on
	// average, to count as ballooning (default 0.5 ms): a 50 us op that
	// takes 300 us because its goroutine waited for a core is noise, not
	// a slower module.
	MinExcess time.Duration
	// StaleWindows: when some module has received work and finished none
	// of it for this many windows in a row (default 8, 2 s), the factors
	// no observation confirmed over that time go back to the app's (a
	// plan made for a stream that left may serve nothing, and then
	// nothing would ever correct it).
	StaleWindows int
	// FinishTarget: a session whose complete 1 s windows since its last
	// plan all finish fewer frames than this (default 0.95), for
	// FinishWindows windows (default 3), mostly for reasons more capacity
	// fixes, is re-planned with HeadroomStep (default 1.25) times its
	// headroom, up to MaxHeadroom (default 2).
	FinishTarget  float64
	FinishWindows int
	HeadroomStep  float64
	MaxHeadroom   float64
	// NoFinishRate turns the finish-rate trigger off: no headroom is ever
	// added (mdag eval's Nexus-style system, which has no such rule).
	NoFinishRate bool
}

// MinScale is the smallest observed scaling factor a re-plan assumes.
const MinScale = 0.25

// Observation is one module's behaviour over one window.
type Observation struct {
	In      int           // items that entered the module
	Done    int           // items it finished
	Out     int           // items those produced (counted even when downstream drops them)
	Dropped int           // items dropped at the module (before or instead of running)
	Tasks   int           // tasks whose execution was measured against a profile
	Balloon float64       // measured / profiled execution time over those tasks; 0 if none
	Excess  time.Duration // mean execution time beyond the profile per measured task
}

// add pools o into a (for modules too slow to fill one window).
func (a Observation) add(o Observation) Observation {
	if n := a.Tasks + o.Tasks; n > 0 {
		a.Balloon = (a.Balloon*float64(a.Tasks) + o.Balloon*float64(o.Tasks)) / float64(n)
		a.Excess = (a.Excess*time.Duration(a.Tasks) + o.Excess*time.Duration(o.Tasks)) / time.Duration(n)
	}
	a.In += o.In
	a.Done += o.Done
	a.Out += o.Out
	a.Dropped += o.Dropped
	a.Tasks += o.Tasks
	return a
}

// Trigger is a detector's verdict: re-plan with these factors (and this
// headroom), because.
type Trigger struct {
	Kind     why.Trigger // why.OnScaling, OnBallooning or OnFinishRate
	Scale    map[dag.ModuleID]float64
	Balloon  map[dag.ModuleID]float64
	Headroom float64 // the session's headroom multiplier (1 = the engine's)
	Reason   string
	// Problems are observations beyond the bounds, reported not planned
	// for (a factor above MaxScale or MaxBalloon).
	Problems []string
}

// detector decides when a session's observed scaling or ballooning factors
// have moved far enough from the plan's to re-plan, and when its finish
// rate asks for more capacity. It is a pure state machine: time comes in
// with each call.
type detector struct {
	cfg      AdaptConfig
	def      map[dag.ModuleID]float64 // the app's scaling factors (YAML)
	scale    map[dag.ModuleID]float64 // what the current plan assumes
	balloon  map[dag.ModuleID]float64
	headroom float64
	acc      map[dag.ModuleID]Observation // pooled windows not yet evaluated
	streak   map[string]int
	smooth   map[string]float64
	over     map[string]float64   // raw observations beyond the bound, in the current streak
	stale    map[string]int       // windows since an observation last confirmed the factor
	dropRun  map[dag.ModuleID]int // items a module dropped since it last finished one
	starved  int                  // windows in a row with some module at MinItems drops since it last finished one
	lastPlan time.Time            // a plan changed the detector's factors, or a trigger asked for one
	planned  time.Time            // the current plan was applied
	frAsked  bool                 // a finish-rate re-plan is on its way
}

// newDetector returns a detector for an app whose modules declare the
// scaling factors def (nil: 1 for every module).
func newDetector(cfg AdaptConfig, def map[dag.ModuleID]float64) *detector {
	d := &detector{cfg: cfg.withDefaults(), def: copyMap(def)}
	d.Forget()
	return d
}

// Forget drops everything learned: the session's last stream left, and
// what its streams taught describes nothing that still runs. The next plan
// is made with the app's factors and the engine's headroom.
func (d *detector) Forget() {
	d.scale, d.balloon = copyMap(d.def), map[dag.ModuleID]float64{}
	d.headroom = 1
	d.acc = map[dag.ModuleID]Observation{}
	d.streak, d.smooth, d.over, d.stale = map[string]int{}, map[string]float64{}, map[string]float64{}, map[string]int{}
	d.dropRun, d.starved = map[dag.ModuleID]int{}, 0
	d.frAsked = false
}

// Planned records the factors and headroom a new plan was made with, at
// now. What the detector accumulated towards a factor the plan changed is
// spent: its streak and smoothed value start again, measured against the
// new value (keeping the old smoothed value is how a 6x spike used to
// re-trigger "6 -> 6" for ever). A streak towards a factor the plan left
// as it was (a re-plan for a join, another module, the epoch) is still
// evidence against it and carries on.
// Warmed tells the detector that the plan's instances finished warming
// up at now: the finish-rate rule judges only windows that start after
// it. What a warm-up loses (frames that waited for new instances) is not a
// lack of rate, and more headroom would start more instances to warm up.
func (d *detector) Warmed(now time.Time) {
	if !d.planned.IsZero() && now.After(d.planned) {
		d.planned = now
	}
}

func (d *detector) Planned(now time.Time, scale, balloon map[dag.ModuleID]float64, headroom float64) {
	oldScale, oldBalloon, oldHeadroom := copyMap(d.scale), copyMap(d.balloon), d.headroom
	d.scale, d.balloon = copyMap(scale), copyMap(balloon)
	d.headroom = max(1, headroom)
	d.planned = now
	d.frAsked = false
	// The minimum interval spaces re-plans that change what the detector
	// decides; a plan that changed none of it (a join, the epoch) does not
	// hold the next adaptation back.
	changed := d.headroom != oldHeadroom
	for _, m := range d.modules(oldScale, oldBalloon) {
		was := d.defScale(m)
		if v, ok := oldScale[m]; ok {
			was = v
		}
		if max(1, oldBalloon[m]) != d.plannedBalloon(m) || was != d.plannedScale(m) {
			changed = true
		}
	}
	if changed || d.lastPlan.IsZero() {
		d.lastPlan = now
	}
	for _, k := range append(sortedKeys(d.smooth), streakKeys(d.streak)...) {
		m, kind, _ := strings.Cut(k, "\x00")
		id := dag.ModuleID(m)
		var was, is float64
		if kind == "scale" {
			was, is = d.defScale(id), d.plannedScale(id)
			if v, ok := oldScale[id]; ok {
				was = v
			}
		} else {
			was, is = max(1, oldBalloon[id]), d.plannedBalloon(id)
		}
		if was != is {
			delete(d.streak, k)
			delete(d.smooth, k)
			delete(d.over, k)
		}
	}
}

func streakKeys(m map[string]int) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

func copyMap(m map[dag.ModuleID]float64) map[dag.ModuleID]float64 {
	out := make(map[dag.ModuleID]float64, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func (d *detector) defScale(m dag.ModuleID) float64 {
	if v, ok := d.def[m]; ok {
		return v
	}
	return 1
}

func (d *detector) plannedScale(m dag.ModuleID) float64 {
	if v, ok := d.scale[m]; ok {
		return v
	}
	return d.defScale(m)
}

// plannedBalloon is what the plan assumes (plans never assume better than
// the profile).
func (d *detector) plannedBalloon(m dag.ModuleID) float64 { return max(1, d.balloon[m]) }

func key(m dag.ModuleID, kind string) string { return string(m) + "\x00" + kind }

// Observe takes one window's observations. It returns a trigger when some
// module's factor has been off by more than the threshold for enough
// evaluations, the factors it would plan with differ from the current
// plan's, and the minimum interval since the last plan has passed.
func (d *detector) Observe(now time.Time, obs map[dag.ModuleID]Observation) (Trigger, bool) {
	names := make([]dag.ModuleID, 0, len(obs))
	for m := range obs {
		names = append(names, m)
	}
	sort.Slice(names, func(i, j int) bool { return names[i] < names[j] })
	d.countStarved(names, obs)
	reasons := d.checkWindow(names, obs)
	t := Trigger{Scale: copyMap(d.scale), Balloon: copyMap(d.balloon), Headroom: d.headroom}
	stale := d.resetStale(&t)
	if len(reasons) == 0 && len(stale) == 0 || now.Sub(d.lastPlan) < d.cfg.MinInterval {
		return Trigger{}, false
	}
	also := d.rideAlong(&t)
	scaleMoved, balloonMoved := d.moved(t)
	if !scaleMoved && !balloonMoved {
		// A re-plan with the factors the plan already has changes
		// nothing: the streak was noise around the planned value
		// (windows off both ways), or a smoothed value fell back inside
		// the threshold.
		for _, k := range sortedKeys(d.smooth) {
			d.streak[k] = 0
		}
		clear(d.smooth)
		clear(d.over)
		return Trigger{}, false
	}
	d.lastPlan = now // the re-plan this asks for is on its way
	t.Kind = why.OnScaling
	if balloonMoved && !scaleMoved {
		t.Kind = why.OnBallooning
	}
	t.Reason = strings.Join(reasons, "; ")
	if len(stale) > 0 {
		because := fmt.Sprintf("unconfirmed for %d windows while work was dropped unfinished: %s", d.starved, strings.Join(stale, ", "))
		if t.Reason == "" {
			t.Reason = because
		} else {
			t.Reason += "; " + because
		}
	}
	if len(also) > 0 {
		t.Reason += "; with " + strings.Join(also, ", ") + " (1 window)"
	}
	for _, m := range sortedModules(t.Scale) {
		t.Scale[m] = min(t.Scale[m], d.cfg.MaxScale)
	}
	for _, m := range sortedModules(t.Balloon) {
		t.Balloon[m] = min(t.Balloon[m], d.cfg.MaxBalloon)
	}
	return t, true
}

// countStarved counts the windows in a row in which some module has
// dropped at least MinItems items since it last finished one (over as many
// windows as that takes: one 10 fps stream brings 2-3 frames a window).
func (d *detector) countStarved(names []dag.ModuleID, obs map[dag.ModuleID]Observation) {
	starved := false
	for _, m := range names {
		if o := obs[m]; o.Done > 0 {
			d.dropRun[m] = 0
		} else {
			d.dropRun[m] += o.Dropped
		}
		if d.dropRun[m] >= d.cfg.MinItems {
			starved = true
		}
	}
	if starved {
		d.starved++
	} else {
		d.starved = 0
	}
}

// checkWindow pools each module's window with the ones before it and
// checks its ballooning (every window with tasks) and scaling (once
// MinItems items are pooled) factors against the plan's; it returns the
// factors that moved past the hysteresis.
func (d *detector) checkWindow(names []dag.ModuleID, obs map[dag.ModuleID]Observation) []string {
	var reasons []string
	for _, m := range names {
		o := d.acc[m].add(obs[m])
		sk, bk := key(m, "scale"), key(m, "balloon")
		d.stale[sk]++
		d.stale[bk]++
		if o.Tasks > 0 {
			d.stale[bk] = 0
			b := max(1, o.Balloon)
			if o.Excess < d.cfg.MinExcess {
				b = 1 // too little time to matter, whatever the ratio
			}
			d.check(m, "balloon", b, d.plannedBalloon(m), 0.1, d.cfg.MaxBalloon, &reasons)
		}
		if o.Done < d.cfg.MinItems {
			o.Tasks, o.Balloon, o.Excess = 0, 0, 0 // ballooning evaluated; keep pooling items
			d.acc[m] = o
			continue
		}
		delete(d.acc, m)
		d.stale[sk] = 0
		d.check(m, "scale", float64(o.Out)/float64(o.Done), d.plannedScale(m), 0.5, d.cfg.MaxScale, &reasons)
	}
	return reasons
}

// resetStale sends the factors no observation has confirmed while work
// was being dropped unfinished back to the app's (they were learned from
// streams whose plan now serves nothing), in t; it returns what it reset.
func (d *detector) resetStale(t *Trigger) []string {
	var stale []string
	if d.starved < d.cfg.StaleWindows {
		return nil
	}
	for _, m := range d.modules() {
		sk, bk := key(m, "scale"), key(m, "balloon")
		if p, def := d.plannedScale(m), d.defScale(m); d.stale[sk] >= d.cfg.StaleWindows && !same(p, def, d.cfg.Threshold, 0.5) {
			t.Scale[m] = def
			stale = append(stale, fmt.Sprintf("%s scale %.3g -> %.3g", m, p, def))
		}
		if p := d.plannedBalloon(m); d.stale[bk] >= d.cfg.StaleWindows && !same(p, 1, d.cfg.Threshold, 0.1) {
			t.Balloon[m] = 1
			stale = append(stale, fmt.Sprintf("%s balloon %.3g -> 1", m, p))
		}
	}
	return stale
}

// rideAlong puts every smoothed factor in t. Hysteresis decides whether
// to re-plan; once re-planning, every factor off in the latest window
// rides along (a slowdown that hits several modules is seen a window apart
// in each; without this the second module waits out another minimum
// interval while it drops frames). It returns the factors seen off for
// fewer windows than the hysteresis asks.
func (d *detector) rideAlong(t *Trigger) []string {
	var also []string
	for _, k := range sortedKeys(d.smooth) {
		v := d.smooth[k]
		m, kind, _ := strings.Cut(k, "\x00")
		planned := d.plannedBalloon(dag.ModuleID(m))
		if kind == "scale" {
			planned = d.plannedScale(dag.ModuleID(m))
		}
		if v < planned && d.streak[k] < d.need(v, planned) {
			continue // a fall not yet confirmed does not ride along
		}
		if d.streak[k] < d.cfg.Windows {
			also = append(also, fmt.Sprintf("%s %s -> %.3g", m, kind, v))
		}
		if kind == "scale" {
			// A module seen idle keeps capacity for a quarter item per
			// input, so the first objects find an instance.
			t.Scale[dag.ModuleID(m)] = max(v, MinScale)
		} else {
			t.Balloon[dag.ModuleID(m)] = max(1, v)
		}
		if raw, ok := d.over[k]; ok {
			t.Problems = append(t.Problems, fmt.Sprintf("%s %s observed %.3g, beyond the bound %.3g: planned at the bound", m, kind, raw, v))
		}
	}
	return also
}

// moved says whether t's scaling and ballooning factors differ from the
// plan's beyond the threshold.
func (d *detector) moved(t Trigger) (scale, balloon bool) {
	for _, m := range d.modules(t.Scale, t.Balloon) {
		if !same(t.Scale[m], d.plannedScale(m), d.cfg.Threshold, 0.5) {
			if _, ok := t.Scale[m]; ok {
				scale = true
			}
		}
		if !same(max(1, t.Balloon[m]), d.plannedBalloon(m), d.cfg.Threshold, 0.1) {
			balloon = true
		}
	}
	return scale, balloon
}

// same says whether a and b are equal within the relative threshold or the
// absolute floor.
func same(a, b, threshold, floor float64) bool {
	diff := math.Abs(a - b)
	return diff <= threshold*math.Abs(b) || diff < floor
}

// modules is every module the detector (or one of more) knows a factor
// for, sorted.
func (d *detector) modules(more ...map[dag.ModuleID]float64) []dag.ModuleID {
	set := map[dag.ModuleID]bool{}
	for _, mm := range append(more, d.def, d.scale, d.balloon) {
		for m := range mm {
			set[m] = true
		}
	}
	return slices.Sorted(maps.Keys(set))
}

func sortedModules(m map[dag.ModuleID]float64) []dag.ModuleID { return slices.Sorted(maps.Keys(m)) }

func sortedKeys(m map[string]float64) []string { return slices.Sorted(maps.Keys(m)) }

// check updates one factor's smoothed value and streak; floor is the
// smallest absolute change that counts (so 0 -> 0.2 objects is not news),
// bound the largest value planned for.
func (d *detector) check(m dag.ModuleID, kind string, v, planned, floor, bound float64, reasons *[]string) {
	k := key(m, kind)
	if v > bound {
		d.over[k] = max(d.over[k], v)
		v = bound
	}
	if same(v, planned, d.cfg.Threshold, floor) {
		d.streak[k] = 0
		delete(d.smooth, k)
		delete(d.over, k)
		return
	}
	// Off in this evaluation: the decision uses the raw value (one odd
	// window resets nothing and triggers nothing); the factor re-planned
	// with is the worst of the streak when it rises (the first window of
	// a jump is partly before it; a plan that assumes fewer items or less
	// than the slowdown runs out of headroom: a camera's people come and
	// go, 2 to 6 a frame, and a plan at their mean drops the frames of
	// every peak), the mean when it falls back.
	if s, ok := d.smooth[k]; ok {
		n := float64(d.streak[k])
		if v > planned && s > planned {
			v = max(s, v)
		} else if (v > planned) == (s > planned) {
			v = (s*n + v) / (n + 1)
		} else {
			// The other side of the plan: a new streak.
			d.streak[k] = 0
		}
	}
	d.smooth[k] = v
	d.streak[k]++
	if d.streak[k] >= d.need(v, planned) {
		*reasons = append(*reasons, fmt.Sprintf("%s %s %.3g -> %.3g", m, kind, planned, v))
	}
}

// FallWindows multiplies the evaluations a factor needs to come down: a
// real executor on a shared machine measures 1x, 3x, 2x in windows a
// second apart, and a plan that follows every fall re-plans back and forth
// (1.33 -> 3.21 -> 1.81 -> 1.05 -> 2.17 in 5 s); the people in a camera's
// view, 2 to 6 a frame, did the same to the scaling factor (5.93 -> 2.55
// -> 4.45 in 2 s, the frames of each rise dropped while capacity that had
// just been stopped warmed up again). Rising stays quick: a plan that
// assumes fewer items or less than the slowdown drops frames.
const FallWindows = 4

// need is the streak a factor's change needs before it re-plans.
func (d *detector) need(v, planned float64) int {
	if v < planned {
		return FallWindows * d.cfg.Windows
	}
	return d.cfg.Windows
}

// FinishRate takes a session's complete windows (oldest first). When the
// FinishWindows most recent of them started after the current plan was
// applied, all finished fewer frames than the target, and most of what
// they did not finish was late or dropped for reasons capacity fixes, it
// returns a trigger that raises the session's headroom by one step, unless
// a module measures slower than the plan assumes (missing latency, which
// the ballooning re-plan fixes, not missing rate). It
// fires at most once per plan: the next needs windows of the plan it
// asked for.
func (d *detector) FinishRate(now time.Time, ws []WindowStatus) (Trigger, bool) {
	n := d.cfg.FinishWindows
	if d.cfg.NoFinishRate || d.frAsked || len(ws) < n || d.planned.IsZero() {
		return Trigger{}, false
	}
	ws = ws[len(ws)-n:]
	var sent, fin, fixable uint64
	byReason := map[string]uint64{}
	for _, w := range ws {
		if w.Start.Before(d.planned) || w.Sent == 0 || w.FinishRate >= d.cfg.FinishTarget {
			return Trigger{}, false
		}
		sent += w.Sent
		fin += w.Finished
		fixable += w.Late
		if w.Late > 0 {
			byReason["late"] += w.Late
		}
		for k, c := range w.Drops {
			_, reason, _ := strings.Cut(k, ": ")
			if why.Drop(reason).Capacity() {
				fixable += c
				byReason[k] += c
			}
		}
	}
	if 2*fixable < sent-fin {
		return Trigger{}, false // mostly not a capacity problem (workers lost, no plan, bad results)
	}
	if slow := d.slower(); len(slow) > 0 {
		// Missing latency, not rate: modules run slower than the plan
		// assumes, and the ballooning re-plan (on its way once its streak
		// is long enough) plans them at what they measure. More headroom
		// would buy rate that frames do not lack.
		return Trigger{}, false
	}
	h := min(d.headroom*d.cfg.HeadroomStep, d.cfg.MaxHeadroom)
	reasons := make([]string, 0, len(byReason))
	for _, k := range sortedKeys64(byReason) {
		reasons = append(reasons, fmt.Sprintf("%s %d", k, byReason[k]))
	}
	because := fmt.Sprintf("finish rate %.1f%% over the last %d s (target %.0f%%; %s)", 100*float64(fin)/float64(sent), n,
		100*d.cfg.FinishTarget, strings.Join(reasons, ", "))
	if h <= d.headroom {
		// At the bound: say so once per plan, re-plan nothing.
		d.frAsked = true
		return Trigger{Kind: why.OnFinishRate, Headroom: d.headroom, Reason: because,
			Problems: []string{fmt.Sprintf("%s; headroom already at its bound x%.3g", because, d.cfg.MaxHeadroom)}}, false
	}
	d.frAsked = true
	d.lastPlan = now
	return Trigger{Kind: why.OnFinishRate, Scale: copyMap(d.scale), Balloon: copyMap(d.balloon), Headroom: h,
		Reason: fmt.Sprintf("%s: headroom x%.3g -> x%.3g", because, d.headroom, h)}, true
}

// slower lists the modules whose measured ballooning is, in the current
// streak, above what the plan assumes by more than the threshold.
func (d *detector) slower() []string {
	var out []string
	for _, k := range sortedKeys(d.smooth) {
		m, kind, _ := strings.Cut(k, "\x00")
		if kind == "balloon" && d.smooth[k] > d.plannedBalloon(dag.ModuleID(m))*(1+d.cfg.Threshold) {
			out = append(out, m)
		}
	}
	return out
}

func sortedKeys64(m map[string]uint64) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
