package profile

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/internal/yamlx"
)

// Config is one way to run a module: a profiled point on a worker type.
type Config struct {
	Module      dag.ModuleID  `json:"module"`
	Target      string        `json:"target"` // the profile target it came from (module or model)
	Worker      WorkerTypeID  `json:"worker"`
	Price       float64       `json:"price"` // of the worker type, dollars per hour
	Batch       int           `json:"batch"`
	Concurrency int           `json:"concurrency"`
	Latency     time.Duration `json:"latency"` // batch execution time d, at the plan's quantile
	Cap         float64       `json:"cap"`     // items per second one instance sustains
	// Frame is the input frame size Latency is for, where the target was
	// profiled at several (Catalog.ConfigAt scales it to another); zero
	// when its profile has one size or none.
	Frame FrameSize `json:"frame,omitzero"`
	// Dispatch marks an instance that starts a batch with whatever is
	// queued as soon as a slot frees (the runtime's workers and its GPU
	// batcher), instead of waiting for b items to arrive as Scrooge's
	// workers do. Such an instance carrying t < cap is no slower than one
	// at full rate: WorstAt(t) is Worst(), not d + b/t.
	Dispatch bool `json:"dispatch,omitempty"`
}

// newConfig is point p of target on worker type w, planned at quantile q.
// A derived capacity (no throughput) is b*e over the point's latency, the
// typical batch time: the p99 is a tail, not a rate.
func newConfig(m dag.ModuleID, target string, w WorkerType, p Point, q Quantile) Config {
	c := Config{Module: m, Target: target, Worker: w.Type, Price: w.Price,
		Batch: p.Batch, Concurrency: p.Concurrency, Latency: p.At(q), Cap: p.Throughput}
	if c.Cap == 0 {
		c.Cap = float64(p.Batch*p.Concurrency) / p.Latency.Seconds()
	}
	return c
}

// Worst is the worst-case latency of a full instance: d + b/cap, the batch
// execution time plus the time to accumulate a batch at full rate.
func (c Config) Worst() time.Duration { return c.Latency + seconds(float64(c.Batch)/c.Cap) }

// WorstAt is the worst-case latency of an instance carrying rate t <= cap:
// d + b/t (Scrooge Eq. 3), the time to fill a batch at rate t and run it.
// A Dispatch instance never waits to fill a batch: its worst case at any
// rate up to cap is that of a full instance, d + b/cap. (Eq. 3 at low rates
// is what made the runtime judge two cameras infeasible: a module at 5
// items/s "waits" 200 ms for a batch of one.)
func (c Config) WorstAt(t float64) time.Duration {
	if t <= 0 {
		return 0
	}
	if c.Dispatch {
		return c.Worst()
	}
	return c.Latency + seconds(float64(c.Batch)/t)
}

// Balloon returns the configuration with its execution time multiplied by f
// (Scrooge's ballooning factor); capacity shrinks by the same factor.
func (c Config) Balloon(f float64) Config {
	if f == 1 || f <= 0 {
		return c
	}
	c.Latency = time.Duration(float64(c.Latency) * f)
	c.Cap /= f
	return c
}

// String renders the configuration as worker<batch,concurrency>.
func (c Config) String() string {
	return fmt.Sprintf("%s<%d,%d>", c.Worker, c.Batch, c.Concurrency)
}

func seconds(s float64) time.Duration { return time.Duration(math.Round(s * float64(time.Second))) }

// Catalog is a profiles file bound to one app: for every module, every
// configuration on every worker type, at the plan's quantile and frame
// size.
type Catalog struct {
	File     *File
	configs  map[dag.ModuleID][]Config
	bound    map[dag.ModuleID][]binding // the profile target each module uses per worker type
	sized    map[sizedKey][]Profile     // bound targets profiled at several frame sizes, smallest first
	dispatch bool                       // every configuration is Dispatch
}

// sizedKey is a (target, worker type).
type sizedKey struct {
	target string
	worker WorkerTypeID
}

// binding is the profile target a module uses on a worker type.
type binding struct {
	worker WorkerType
	target string
}

// Bind checks the profiles against the app and resolves each module's
// configurations. A module uses the profile whose target is its own name if
// one exists for that worker type, else (gpu modules) the one for its model.
// Each configuration's latency is its point's at the plan's quantile
// (Point.At); a target profiled at several frame sizes gives the
// configurations of ProfileAt at the plan's frame (plan.frame, else its
// largest measured size). Problems are reported all at once: profiles for targets that are neither a
// module nor a model of the app, and modules with no profile on any worker.
func Bind(app *dag.App, f *File) (*Catalog, error) {
	fp := f.positions()
	ap := app.Positions()
	if ap == nil {
		ap = &yamlx.Positions{File: app.File}
	}
	var errs yamlx.ErrorList
	known := map[string]bool{}
	for _, m := range app.Modules {
		known[string(m.Name)] = true
		if m.Kind == dag.GPU && m.Model != "" {
			known[m.Model] = true
		}
	}
	for i, pr := range f.Profiles {
		if pr.Target != "" && !known[pr.Target] {
			names := make([]string, 0, len(known))
			for k := range known {
				names = append(names, k)
			}
			errs = append(errs, fp.Errorf(fmt.Sprintf("profiles[%d].target", i),
				"unknown target %q: not a module or model of app %s%s", pr.Target, app.Name, yamlx.Suggest(pr.Target, names)))
		}
	}
	has := map[[2]string]bool{}
	for _, pr := range f.Profiles {
		has[[2]string{pr.Target, string(pr.Worker)}] = true
	}
	cat := &Catalog{File: f, bound: map[dag.ModuleID][]binding{}, sized: map[sizedKey][]Profile{}}
	for i, m := range app.Modules {
		var bs []binding
		for _, w := range f.Workers {
			target := string(m.Name)
			ok := has[[2]string{target, string(w.Type)}]
			if !ok && m.Kind == dag.GPU && m.Model != "" {
				target = m.Model
				ok = has[[2]string{target, string(w.Type)}]
			}
			if ok {
				bs = append(bs, binding{worker: w, target: target})
			}
		}
		if len(bs) == 0 {
			what := fmt.Sprintf("module %q", m.Name)
			if m.Kind == dag.GPU && m.Model != "" {
				what += fmt.Sprintf(" (model %s)", m.Model)
			}
			errs = append(errs, ap.Errorf(fmt.Sprintf("modules[%d]", i),
				"no profile for %s on any worker type in %s", what, nameOr(f.Path, "the profiles")))
			continue
		}
		cat.bound[m.Name] = bs
		for _, b := range bs {
			if prs := f.sizes(b.target, b.worker.Type); len(prs) > 1 {
				cat.sized[sizedKey{b.target, b.worker.Type}] = prs
			}
		}
	}
	if err := errs.Err(); err != nil {
		return nil, err
	}
	cat.configs = cat.build(FrameSize{})
	return cat, nil
}

// build resolves every bound module's configurations at frames of size
// (zero: the plan's frame), grouped by worker type in file order, then by
// concurrency and batch.
func (c *Catalog) build(size FrameSize) map[dag.ModuleID][]Config {
	out := make(map[dag.ModuleID][]Config, len(c.bound))
	workerIndex := map[WorkerTypeID]int{}
	for i, w := range c.File.Workers {
		workerIndex[w.Type] = i
	}
	for m, bs := range c.bound {
		var cfgs []Config
		for _, b := range bs {
			pr, _ := c.File.ProfileAt(b.target, b.worker.Type, size)
			_, several := c.sized[sizedKey{b.target, b.worker.Type}]
			for _, pt := range pr.Points {
				cfg := newConfig(m, b.target, b.worker, pt, c.File.Plan.Quantile)
				cfg.Dispatch = c.dispatch
				if several { // one size (or none): nothing to scale by
					cfg.Frame = pr.Frame
				}
				cfgs = append(cfgs, cfg)
			}
		}
		sort.SliceStable(cfgs, func(a, b int) bool {
			x, y := cfgs[a], cfgs[b]
			if x.Worker != y.Worker {
				return workerIndex[x.Worker] < workerIndex[y.Worker] // file order
			}
			if x.Concurrency != y.Concurrency {
				return x.Concurrency < y.Concurrency
			}
			return x.Batch < y.Batch
		})
		out[m] = cfgs
	}
	return out
}

func nameOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// Configs returns every configuration of module m, grouped by worker type in
// file order, then by concurrency and batch.
func (c *Catalog) Configs(m dag.ModuleID) []Config { return c.configs[m] }

// ConfigsOn returns the configurations of m on one worker type.
func (c *Catalog) ConfigsOn(m dag.ModuleID, w WorkerTypeID) []Config {
	var out []Config
	for _, cfg := range c.configs[m] {
		if cfg.Worker == w {
			out = append(out, cfg)
		}
	}
	return out
}

// Dispatching returns a copy of the catalog whose configurations are all
// Dispatch: the latency model of the runtime, whose instances never wait
// to fill a batch (the planning CLI keeps Scrooge's Eq. 3 by default).
func (c *Catalog) Dispatching() *Catalog {
	out := &Catalog{File: c.File, configs: make(map[dag.ModuleID][]Config, len(c.configs)), bound: c.bound, sized: c.sized, dispatch: true}
	for m, cfgs := range c.configs {
		cp := make([]Config, len(cfgs))
		for i, cfg := range cfgs {
			cfg.Dispatch = true
			cp[i] = cfg
		}
		out.configs[m] = cp
	}
	return out
}

// Workers returns the worker types in file order.
func (c *Catalog) Workers() []WorkerType { return c.File.Workers }

// Fit is a least-squares line l(b) = Alpha*b + Beta through the batch
// execution times of one (target, worker, concurrency) group.
type Fit struct {
	Target      string        `json:"target"`
	Worker      WorkerTypeID  `json:"worker"`
	Concurrency int           `json:"concurrency"`
	Alpha       time.Duration `json:"alpha"` // per item
	Beta        time.Duration `json:"beta"`  // fixed cost per batch
	R2          float64       `json:"r2"`
	Points      int           `json:"points"`
}

func (f Fit) String() string {
	return fmt.Sprintf("%s on %s e=%d: l(b) = %.3fms*b + %.3fms (R^2 %.4f, %d points)",
		f.Target, f.Worker, f.Concurrency, ms(f.Alpha), ms(f.Beta), f.R2, f.Points)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// Fits returns the linear fits of module m's configurations, one per
// (worker, concurrency) with at least two distinct batch sizes.
func (c *Catalog) Fits(m dag.ModuleID) []Fit {
	type key struct {
		w WorkerTypeID
		e int
	}
	groups := map[key][]Config{}
	var order []key
	for _, cfg := range c.configs[m] {
		k := key{cfg.Worker, cfg.Concurrency}
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], cfg)
	}
	var out []Fit
	for _, k := range order {
		if f, ok := FitLinear(groups[k]); ok {
			out = append(out, f)
		}
	}
	return out
}

// FitLinear fits l(b) = alpha*b + beta through the configurations' batch
// execution times by least squares. ok is false with fewer than two distinct
// batch sizes.
func FitLinear(cfgs []Config) (f Fit, ok bool) {
	if len(cfgs) == 0 {
		return Fit{}, false
	}
	var n, sx, sy, sxx, sxy float64
	distinct := map[int]bool{}
	for _, c := range cfgs {
		x, y := float64(c.Batch), ms(c.Latency)
		n++
		sx += x
		sy += y
		sxx += x * x
		sxy += x * y
		distinct[c.Batch] = true
	}
	if len(distinct) < 2 {
		return Fit{}, false
	}
	alpha := (n*sxy - sx*sy) / (n*sxx - sx*sx)
	beta := (sy - alpha*sx) / n
	mean := sy / n
	var ssRes, ssTot float64
	for _, c := range cfgs {
		x, y := float64(c.Batch), ms(c.Latency)
		r := y - (alpha*x + beta)
		ssRes += r * r
		ssTot += (y - mean) * (y - mean)
	}
	r2 := 1.0
	if ssTot > 0 {
		r2 = 1 - ssRes/ssTot
	}
	msDur := func(v float64) time.Duration { return time.Duration(math.Round(v * float64(time.Millisecond))) }
	return Fit{Target: cfgs[0].Target, Worker: cfgs[0].Worker, Concurrency: cfgs[0].Concurrency,
		Alpha: msDur(alpha), Beta: msDur(beta), R2: r2, Points: len(cfgs)}, true
}

// Best returns the configuration with the highest capacity whose worst-case
// latency fits the budget; ties go to the lower latency, then the lower
// price. ok is false when none fits.
func Best(cfgs []Config, budget time.Duration) (best Config, ok bool) {
	for _, c := range cfgs {
		if c.Worst() > budget {
			continue
		}
		if !ok || c.Cap > best.Cap || c.Cap == best.Cap && (c.Worst() < best.Worst() ||
			c.Worst() == best.Worst() && c.Price < best.Price) {
			best, ok = c, true
		}
	}
	return best, ok
}

// Choice is one way for a module to carry rate R under Scrooge's allocation
// model: N full instances of Full (each at its capacity) plus, when T > 0,
// one partial instance of Partial carrying the residual rate T <= its
// capacity. Its latency is the worst of its instances: Full.Worst() when
// N > 0 and Partial.WorstAt(T) when T > 0.
type Choice struct {
	Full    Config        `json:"full"`
	N       int           `json:"n"`
	Partial Config        `json:"partial"`
	T       float64       `json:"t"`
	Latency time.Duration `json:"latency"`
	Cost    float64       `json:"cost"` // dollars per hour, partial charged pro rata
}

// String describes the choice, e.g. "1 x X<4,2> + Y<2,1> at 20/s".
func (ch Choice) String() string {
	var parts []string
	if ch.N > 0 {
		parts = append(parts, fmt.Sprintf("%d x %s", ch.N, ch.Full))
	}
	if ch.T > 0 {
		parts = append(parts, fmt.Sprintf("%s at %.4g/s", ch.Partial, ch.T))
	}
	if len(parts) == 0 {
		return "idle (no input)"
	}
	return strings.Join(parts, " + ")
}

// rateEps absorbs floating-point noise when a rate is an exact multiple of a
// capacity.
const rateEps = 1e-9

// Fastest returns the choice with the lowest latency for carrying rate, ties
// going to the cheaper one. Every (full, partial) pair is tried with the
// fewest full instances that leave the partial within its capacity, which
// maximises the partial's rate and so minimises its batching delay.
func Fastest(cfgs []Config, rate float64) (best Choice, ok bool) {
	if rate <= 0 {
		return Choice{}, true
	}
	consider := func(ch Choice) {
		if !ok || ch.Latency < best.Latency || ch.Latency == best.Latency && ch.Cost < best.Cost {
			best, ok = ch, true
		}
	}
	for _, m := range cfgs {
		// Only full instances: rate is an exact multiple of m's capacity.
		if n := math.Round(rate / m.Cap); n >= 1 && math.Abs(n*m.Cap-rate) <= rateEps*rate {
			consider(Choice{Full: m, N: int(n), Latency: m.Worst(), Cost: n * m.Price})
		}
		for _, p := range cfgs {
			n := 0.0
			if rate > p.Cap {
				n = math.Ceil((rate - p.Cap) / m.Cap * (1 - rateEps))
			}
			t := rate - n*m.Cap
			if t <= rateEps*rate || t > p.Cap*(1+rateEps) {
				continue
			}
			ch := Choice{N: int(n), Partial: p, T: t, Latency: p.WorstAt(t), Cost: p.Price * t / p.Cap}
			if n > 0 {
				ch.Full = m
				ch.Latency = max(ch.Latency, m.Worst())
				ch.Cost += n * m.Price
			}
			consider(ch)
		}
	}
	return best, ok
}
