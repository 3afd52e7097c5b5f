package engine

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/mdag/mdag/dag"
)

// AdaptConfig tunes when observed scaling and ballooning re-plan a session
// (Scrooge Section 3.5): observations are taken over short windows, a
// module must differ from what the plan assumed by more than Threshold for
// Windows windows in a row (hysteresis), and re-plans are at least
// MinInterval apart.
type AdaptConfig struct {
	Window      time.Duration // default 250 ms
	Threshold   float64       // relative change, default 0.25
	Windows     int           // consecutive windows, default 2
	MinInterval time.Duration // default 1 s
	MinItems    int           // fewest inputs in a window for it to count, default 4
}

func (c AdaptConfig) withDefaults() AdaptConfig {
	if c.Window <= 0 {
		c.Window = 250 * time.Millisecond
	}
	if c.Threshold <= 0 {
		c.Threshold = 0.25
	}
	if c.Windows <= 0 {
		c.Windows = 2
	}
	if c.MinInterval <= 0 {
		c.MinInterval = time.Second
	}
	if c.MinItems <= 0 {
		c.MinItems = 4
	}
	return c
}

// MinScale is the smallest observed scaling factor a re-plan assumes.
const MinScale = 0.25

// Observation is one module's behaviour over one window.
type Observation struct {
	In      int     // items that entered the module
	Done    int     // items it finished
	Out     int     // items those produced
	Balloon float64 // mean measured / profiled execution time; 0 if not measured
}

// Detector decides when a session's observed scaling or ballooning factors
// have moved far enough from the plan's to re-plan. It is a pure state
// machine: time comes in with each call.
type Detector struct {
	cfg      AdaptConfig
	scale    map[dag.ModuleID]float64 // what the current plan assumes
	balloon  map[dag.ModuleID]float64
	streak   map[string]int
	smooth   map[string]float64
	lastPlan time.Time
}

// NewDetector returns a detector; planned are the plan's factors.
func NewDetector(cfg AdaptConfig) *Detector {
	return &Detector{cfg: cfg.withDefaults(), scale: map[dag.ModuleID]float64{}, balloon: map[dag.ModuleID]float64{},
		streak: map[string]int{}, smooth: map[string]float64{}}
}

// Planned records the factors a new plan was made with, at now.
func (d *Detector) Planned(now time.Time, scale, balloon map[dag.ModuleID]float64) {
	d.scale, d.balloon = copyMap(scale), copyMap(balloon)
	d.lastPlan = now
	clear(d.streak)
}

func copyMap(m map[dag.ModuleID]float64) map[dag.ModuleID]float64 {
	out := make(map[dag.ModuleID]float64, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// Trigger is a detector's verdict: re-plan with these factors, because.
type Trigger struct {
	Scale   map[dag.ModuleID]float64
	Balloon map[dag.ModuleID]float64
	Reason  string
}

// Observe takes one window's observations. It returns a trigger when some
// module's factor has been off by more than the threshold for enough
// windows and the minimum interval since the last plan has passed.
func (d *Detector) Observe(now time.Time, obs map[dag.ModuleID]Observation) (Trigger, bool) {
	var reasons []string
	names := make([]dag.ModuleID, 0, len(obs))
	for m := range obs {
		names = append(names, m)
	}
	sort.Slice(names, func(i, j int) bool { return names[i] < names[j] })
	for _, m := range names {
		o := obs[m]
		if o.Done < d.cfg.MinItems {
			continue
		}
		d.check(m, "scale", float64(o.Out)/float64(o.Done), d.scale[m], 0.5, &reasons)
		if o.Balloon > 0 {
			// Running faster than profiled is not news: plans never
			// assume better than the profile.
			d.check(m, "balloon", max(1, o.Balloon), max(1, d.balloon[m]), 0.1, &reasons)
		}
	}
	if len(reasons) == 0 || now.Sub(d.lastPlan) < d.cfg.MinInterval {
		return Trigger{}, false
	}
	d.lastPlan = now // the re-plan this asks for is on its way
	t := Trigger{Scale: copyMap(d.scale), Balloon: copyMap(d.balloon), Reason: strings.Join(reasons, "; ")}
	// Hysteresis decides whether to re-plan; once re-planning, every factor
	// off in the latest window rides along (a slowdown that hits several
	// modules is seen a window apart in each; without this the second
	// module waits out another minimum interval while it drops frames).
	var also []string
	for _, k := range sortedKeys(d.smooth) {
		v := d.smooth[k]
		m, kind, _ := strings.Cut(k, "\x00")
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
	}
	if len(also) > 0 {
		t.Reason += "; with " + strings.Join(also, ", ") + " (1 window)"
	}
	return t, true
}

func sortedKeys(m map[string]float64) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// check updates one factor's smoothed value and streak; floor is the
// smallest absolute change that counts (so 0 -> 0.2 objects is not news).
func (d *Detector) check(m dag.ModuleID, kind string, v, planned, floor float64, reasons *[]string) {
	k := string(m) + "\x00" + kind
	diff := math.Abs(v - planned)
	if diff <= d.cfg.Threshold*math.Abs(planned) || diff < floor {
		d.streak[k] = 0
		delete(d.smooth, k)
		return
	}
	// Off in this window: the decision uses the raw value (one odd window
	// resets nothing and triggers nothing); the factor re-planned with is
	// the mean over the streak for scaling, the maximum for ballooning.
	if s, ok := d.smooth[k]; ok {
		if kind == "balloon" {
			// Slowdowns: the worst window of the streak (the first
			// window of a jump is partly before it; a plan that assumes
			// less than the slowdown runs out of headroom).
			v = max(s, v)
		} else {
			n := float64(d.streak[k])
			v = (s*n + v) / (n + 1)
		}
	}
	d.smooth[k] = v
	d.streak[k]++
	if d.streak[k] >= d.cfg.Windows {
		*reasons = append(*reasons, fmt.Sprintf("%s %s %.3g -> %.3g", m, kind, planned, v))
	}
}
