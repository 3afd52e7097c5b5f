package sim

import (
	"container/heap"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/mdag/mdag/scheduler"
)

// Result is what one simulation measured.
type Result struct {
	Policy          scheduler.Policy `json:"policy"`
	OfferedRPS      float64          `json:"offered_rps"`
	GoodputRPS      float64          `json:"goodput_rps"` // finished within SLO per second (with --find-goodput: the highest rate with >= 99% within SLO)
	BadRate         float64          `json:"bad_rate"`    // (late + dropped) / requests
	P50MS           float64          `json:"p50_ms"`      // end-to-end latency of completed requests
	P99MS           float64          `json:"p99_ms"`
	MaxMS           float64          `json:"max_ms"`
	QueueP50MS      float64          `json:"queue_p50_ms"` // arrival to batch start
	QueueP99MS      float64          `json:"queue_p99_ms"`
	MeanBatch       float64          `json:"mean_batch"` // mean batch size a request ran in
	GPUBusyFraction float64          `json:"gpu_busy_fraction"`
	Requests        int              `json:"requests"`
	Good            int              `json:"good"`
	Late            int              `json:"late"`
	Dropped         map[string]int   `json:"dropped"`
	BatchHistogram  map[int]int      `json:"batch_histogram"` // batch size -> batches
	Autoscale       Autoscale        `json:"autoscale"`
	PerModel        []ModelResult    `json:"per_model"`
	VirtualSeconds  float64          `json:"virtual_seconds"`
	Events          int              `json:"events"`
}

// ModelResult is one model's share of a Result.
type ModelResult struct {
	Model      string  `json:"model"`
	OfferedRPS float64 `json:"offered_rps"`
	GoodputRPS float64 `json:"goodput_rps"`
	BadRate    float64 `json:"bad_rate"`
	P99MS      float64 `json:"p99_ms"`
	MeanBatch  float64 `json:"mean_batch"`
}

// Autoscale is Symphony Section 4.4's advice: with bad rate b, add
// N*b/(1-b) GPUs; with idle fraction f, release N*f. Windows are 1 s; the
// advice follows the worst window for adding and the mean for releasing.
type Autoscale struct {
	WorstWindowBadRate float64 `json:"worst_window_bad_rate"`
	IdleFraction       float64 `json:"idle_fraction"`
	AddGPUs            int     `json:"add_gpus"`
	ReleaseGPUs        int     `json:"release_gpus"`
}

// Advice applies Symphony's autoscaling rules to N GPUs: bad rate above
// threshold asks for N*b/(1-b) more; idle fraction f releases N*f.
func Advice(n int, badRate, idle, threshold float64) (add, release int) {
	if badRate > threshold && badRate < 1 {
		add = int(math.Ceil(float64(n) * badRate / (1 - badRate)))
	}
	release = int(math.Floor(float64(n) * idle))
	return add, release
}

type evKind uint8

const (
	evArrival evKind = iota
	evStart          // an action reaches its GPU
	evFinish
	evTimer
)

type event struct {
	t     scheduler.Time
	seq   uint64
	kind  evKind
	model int
	act   *scheduler.Action
	ver   uint64
	dur   time.Duration // evFinish: the batch's execution time
}

type eventHeap []event

func (h eventHeap) Len() int { return len(h) }
func (h eventHeap) Less(i, j int) bool {
	return h[i].t < h[j].t || h[i].t == h[j].t && h[i].seq < h[j].seq
}
func (h eventHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *eventHeap) Push(x any)   { *h = append(*h, x.(event)) }
func (h *eventHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

type outcome struct {
	model      int
	arrival    scheduler.Time
	done, good bool
	latency    time.Duration
	queue      time.Duration
	batch      int
}

// Run simulates the workload under a policy; total (> 0) overrides the
// workload's total rate.
func Run(w *Workload, policy scheduler.Policy, total float64) (*Result, error) {
	r, _, err := run(w, policy, total)
	return r, err
}

// run is Run that also returns every request's outcome, by request ID
// (arrival order).
func run(w *Workload, policy scheduler.Policy, total float64) (*Result, []outcome, error) {
	if policy == Hindsight {
		return runHindsight(w, total)
	}
	rates := w.rates(total)
	cfg := scheduler.Config{Network: scheduler.Network{Control: w.Network.Control, PerRequest: w.Network.PerRequest}}
	for g := 0; g < w.GPUs; g++ {
		cfg.GPUs = append(cfg.GPUs, scheduler.GPUID(g))
	}
	for i, m := range w.Models {
		cfg.Models = append(cfg.Models, scheduler.Model{ID: scheduler.ModelID(m.Name), SLO: m.SLO, Latency: m.latency, Beta: m.Beta,
			Rate: math.Max(rates[i], 1e-9)})
	}
	s, err := scheduler.New(policy, cfg)
	if err != nil {
		return nil, nil, err
	}
	rng := rand.New(rand.NewPCG(w.Seed, 0x6d646167))
	end := scheduler.Time(w.Duration)
	r := &Result{Policy: policy, Dropped: map[string]int{}, BatchHistogram: map[int]int{}}
	for _, x := range rates {
		r.OfferedRPS += x
	}
	if policy == "" {
		r.Policy = scheduler.Symphony
	}
	var h eventHeap
	var seq uint64
	push := func(e event) { seq++; e.seq = seq; heap.Push(&h, e) }
	// The first arrival of each model.
	gens := make([]*arrivals, len(w.Models))
	for i := range w.Models {
		gens[i] = newArrivals(w, rates, i, rng)
		if t := gens[i].next(0); t < end {
			push(event{t: t, kind: evArrival, model: i})
		}
	}
	var outcomes []outcome
	gpuFree := make([]scheduler.Time, w.GPUs)
	var busy time.Duration
	var timerVer uint64
	timerAt := scheduler.Never
	index := map[scheduler.ModelID]int{}
	for i, m := range w.Models {
		index[scheduler.ModelID(m.Name)] = i
	}
	collect := func(now scheduler.Time) {
		acts, drops := s.Take()
		for _, d := range drops {
			r.Dropped[string(d.Reason)]++
			o := &outcomes[d.Request.ID]
			o.done = true
		}
		for _, a := range acts {
			push(event{t: a.Earliest, kind: evStart, act: a})
		}
		if nx := s.Next(); nx != timerAt && nx != scheduler.Never {
			timerVer++
			timerAt = nx
			push(event{t: nx, kind: evTimer, ver: timerVer})
		} else if nx == scheduler.Never {
			timerAt = scheduler.Never
		}
	}
	var now scheduler.Time
	for h.Len() > 0 {
		e := heap.Pop(&h).(event)
		now = e.t
		r.Events++
		switch e.kind {
		case evArrival:
			m := w.Models[e.model]
			id := uint64(len(outcomes))
			outcomes = append(outcomes, outcome{model: e.model, arrival: now})
			s.Arrive(now, scheduler.Request{ID: id, Model: scheduler.ModelID(m.Name), Arrival: now, Deadline: now + m.SLO})
			if t := gens[e.model].next(now); t < end {
				push(event{t: t, kind: evArrival, model: e.model})
			}
		case evStart:
			a := e.act
			g := int(a.GPU)
			start := max(now, gpuFree[g])
			if start > a.Latest {
				s.Rejected(now, a)
				break
			}
			lat := w.Models[index[a.Model]].latency
			d := lat[min(len(a.Requests), len(lat))-1]
			if w.Jitter > 0 {
				d = time.Duration(float64(d) * (1 + w.Jitter*(2*rng.Float64()-1)))
			}
			gpuFree[g] = start + d
			busy += d
			r.BatchHistogram[len(a.Requests)]++
			for _, req := range a.Requests {
				o := &outcomes[req.ID]
				o.queue = start - req.Arrival
				o.batch = len(a.Requests)
			}
			push(event{t: start + d, kind: evFinish, act: a, dur: d})
		case evFinish:
			a := e.act
			for _, req := range a.Requests {
				o := &outcomes[req.ID]
				o.done = true
				o.latency = now - req.Arrival
				o.good = now <= req.Deadline
			}
			s.Finished(now, a, e.dur)
		case evTimer:
			if e.ver != timerVer {
				continue // superseded
			}
			timerAt = scheduler.Never
			s.Tick(now)
		}
		collect(now)
	}
	r.VirtualSeconds = float64(max(now, end)) / float64(time.Second)
	summarize(r, w, outcomes, rates, busy, end)
	return r, outcomes, nil
}

func summarize(r *Result, w *Workload, outs []outcome, rates []float64, busy time.Duration, end scheduler.Time) {
	secs := float64(end) / float64(time.Second)
	var lats, queues []float64
	var batchSum float64
	type acc struct {
		n, good int
		lats    []float64
		batch   float64
	}
	per := make([]acc, len(w.Models))
	for _, o := range outs {
		p := &per[o.model]
		p.n++
		r.Requests++
		if o.done && o.batch > 0 {
			l := float64(o.latency) / float64(time.Millisecond)
			lats = append(lats, l)
			p.lats = append(p.lats, l)
			queues = append(queues, float64(o.queue)/float64(time.Millisecond))
			batchSum += float64(o.batch)
			p.batch += float64(o.batch)
			if o.good {
				r.Good++
				p.good++
			} else {
				r.Late++
			}
		}
	}
	if r.Requests > 0 {
		r.BadRate = round(float64(r.Requests-r.Good)/float64(r.Requests), 6)
	}
	r.GoodputRPS = round(float64(r.Good)/secs, 2)
	r.OfferedRPS = round(r.OfferedRPS, 2)
	r.P50MS, r.P99MS, r.MaxMS = pct(lats, 50), pct(lats, 99), pct(lats, 100)
	r.QueueP50MS, r.QueueP99MS = pct(queues, 50), pct(queues, 99)
	if len(lats) > 0 {
		r.MeanBatch = round(batchSum/float64(len(lats)), 3)
	}
	r.GPUBusyFraction = round(math.Min(1, float64(busy)/(float64(w.GPUs)*float64(end))), 4)
	for i, m := range w.Models {
		p := per[i]
		mr := ModelResult{Model: m.Name, OfferedRPS: round(rates[i], 2), GoodputRPS: round(float64(p.good)/secs, 2), P99MS: pct(p.lats, 99)}
		if p.n > 0 {
			mr.BadRate = round(float64(p.n-p.good)/float64(p.n), 6)
		}
		if len(p.lats) > 0 {
			mr.MeanBatch = round(p.batch/float64(len(p.lats)), 3)
		}
		r.PerModel = append(r.PerModel, mr)
	}
	// Autoscaling advice over 1 s windows of arrivals.
	type win struct{ reqs, bad int }
	wins := make([]win, int(w.Duration/time.Second)+1)
	for _, o := range outs {
		x := &wins[min(len(wins)-1, int(o.arrival/scheduler.Time(time.Second)))]
		x.reqs++
		if !o.good {
			x.bad++
		}
	}
	var worst float64
	for _, x := range wins {
		if x.reqs > 0 {
			worst = math.Max(worst, float64(x.bad)/float64(x.reqs))
		}
	}
	r.Autoscale.WorstWindowBadRate = round(worst, 4)
	r.Autoscale.IdleFraction = round(1-r.GPUBusyFraction, 4)
	r.Autoscale.AddGPUs, r.Autoscale.ReleaseGPUs = Advice(w.GPUs, worst, r.Autoscale.IdleFraction, 0.01)
}

func pct(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	i := int(math.Ceil(p/100*float64(len(s)))) - 1
	return round(s[max(0, min(len(s)-1, i))], 3)
}

func round(x float64, d int) float64 {
	p := math.Pow(10, float64(d))
	return math.Round(x*p) / p
}

// FindGoodput searches the highest total rate at which at least 99% of
// requests finish within their SLO (binary search to 0.5%), and returns the
// simulation at that rate with GoodputRPS set to it.
func FindGoodput(w *Workload, policy scheduler.Policy) (*Result, error) {
	start := w.Rate
	if start <= 0 {
		for i := range w.Models {
			start += w.Models[i].Rate
		}
	}
	if start <= 0 {
		start = 100
	}
	ok := func(rate float64) (*Result, bool, error) {
		res, err := Run(w, policy, rate)
		if err != nil {
			return nil, false, err
		}
		return res, res.BadRate <= 0.01, nil
	}
	lo, hi := 0.0, start
	var best *Result
	for i := 0; i < 30; i++ { // grow hi until it fails
		res, good, err := ok(hi)
		if err != nil {
			return nil, err
		}
		if !good {
			break
		}
		lo, best = hi, res
		hi *= 2
	}
	for hi-lo > 0.005*hi {
		mid := (lo + hi) / 2
		res, good, err := ok(mid)
		if err != nil {
			return nil, err
		}
		if good {
			lo, best = mid, res
		} else {
			hi = mid
		}
	}
	if best == nil {
		res, _, err := ok(lo)
		if err != nil {
			return nil, err
		}
		best = res
	}
	best.GoodputRPS = round(lo, 2)
	return best, nil
}
