// Package eval runs experiments on the real engine in virtual time: the
// coordinator (allocator, placement, GPU scheduler, adaptation loop) of
// `mdag serve`, Stepped on a fake clock, with virtual workers whose tasks
// take their profiled time (emulated GPUs; CPU ops that really run on small
// frames, timed by their profiles). Clients join, send frames at their own
// rates with objects per frame from traces measured on real videos, and
// leave; every frame's outcome and every instance-second is counted. The
// same run of a seed gives the same result, and 1000 virtual seconds take
// seconds of real time, so Scrooge's section 4 experiments (against a
// Nexus-style system run by the same engine) are one command: `mdag eval`.
package eval

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/mdag/mdag/allocator"
	"github.com/mdag/mdag/allocator/milp"
	"github.com/mdag/mdag/coordinator"
	"github.com/mdag/mdag/coordinator/why"
	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/media"
	"github.com/mdag/mdag/modules"
	"github.com/mdag/mdag/profile"
	"github.com/mdag/mdag/scheduler"
)

// System is how a run serves the app: mdag as it ships, or a Nexus-style
// system (Scrooge section 4's description of Nexus) in the same engine.
type System struct {
	Name string
	// Nexus makes the Nexus-style system: GPU modules batch only
	// (concurrency 1) on one GPU type (NexusGPU; the cluster is taken as
	// homogeneous, so it gets as many of that type as the cluster has
	// GPUs), the latency split by dynamic programming (allocator nexus-dp),
	// Nexus's data plane (scheduler policy nexus: squishy bin packing of
	// models onto the GPUs, round-robin batches, early drop), CPU modules
	// in FrontEnds fixed front-ends (CPU-only workers, paid for the whole
	// run whether busy or not), re-planning at 30 s epochs and on workload
	// changes at most every 10 s.
	Nexus     bool
	FrontEnds int
	NexusGPU  profile.WorkerTypeID
	// NoSpatial keeps GPU modules at concurrency 1 (batching only) in
	// mdag: the spatial-multiplexing ablation.
	NoSpatial bool
	// TurnOff is the warm instances' turn-off delay (0: placement's 30 s;
	// negative: none, an idle instance goes at once).
	TurnOff time.Duration
	// Method overrides the allocation method (default milp).
	Method allocator.Method
	// Headroom overrides the engine's (the factor the rate is planned
	// for; default 1.25): the Nexus-style system over-provisioned to
	// find what a finish rate comparable to mdag's costs it.
	Headroom float64
}

// Experiment is one run: an app under a workload, served by a system on a
// cluster.
type Experiment struct {
	App      *dag.App
	Profiles *profile.File
	System   System
	Workload Workload
	// Cluster is how many instances of each worker type can be had.
	Cluster map[profile.WorkerTypeID]int
	Seed    uint64
	// SLO, when set, overrides the app's.
	SLO time.Duration
	// Log, when set, receives the engine's log (default: discarded).
	Log *slog.Logger
}

// Second is one second of a run.
type Second struct {
	T        int     `json:"t"`        // seconds since the start
	Streams  int     `json:"streams"`  // clients sending at its start
	Ingress  float64 `json:"ingress"`  // frames/s the clients send
	Sent     int     `json:"sent"`     // frames captured in it
	Finished int     `json:"finished"` // of those, finished within the SLO
	CostRate float64 `json:"cost"`     // $/h of the instances running at its start
	Objects  float64 `json:"objects"`  // mean objects per frame sent in it
}

// FinishRate is the second's finished share of its frames (1 with none).
func (s Second) FinishRate() float64 {
	if s.Sent == 0 {
		return 1
	}
	return float64(s.Finished) / float64(s.Sent)
}

// Result is what came of a run.
type Result struct {
	System     string              `json:"system"`
	NexusGPU   string              `json:"nexus_gpu,omitempty"`  // the Nexus-style system's GPU type
	FrontEnds  int                 `json:"front_ends,omitempty"` // and its front-ends
	Headroom   float64             `json:"headroom,omitempty"`   // and its headroom, when not the engine's
	App        dag.AppID           `json:"app"`
	Duration   time.Duration       `json:"duration"`
	Sent       uint64              `json:"sent"`
	Finished   uint64              `json:"finished"`
	Late       uint64              `json:"late"`
	Dropped    uint64              `json:"dropped"`
	Open       uint64              `json:"open"` // frames that never ended (must be 0)
	Drops      map[why.Drop]uint64 `json:"drops,omitempty"`
	FinishRate float64             `json:"finish_rate"`
	Cost       float64             `json:"cost"`            // dollars over the run
	CostRate   float64             `json:"cost_per_hour"`   // mean $/h
	Starts     int                 `json:"instance_starts"` // instances started
	Replans    int                 `json:"replans"`
	Plans      []Plan              `json:"plans,omitempty"` // every re-plan: when, why, what it cost
	Seconds    []Second            `json:"seconds"`
	Digest     string              `json:"digest"` // of everything above: the same for a seed
	Wall       time.Duration       `json:"wall"`   // real time the run took
	Problems   []string            `json:"problems,omitempty"`
}

// Plan is one re-plan of a run, as the engine explains it.
type Plan struct {
	T        float64       `json:"t"` // seconds since the start
	Trigger  string        `json:"trigger"`
	Kinds    []why.Trigger `json:"kinds"`
	Cost     float64       `json:"cost_per_hour"` // the plan's whole instances
	Problems []string      `json:"problems,omitempty"`
}

// start is where every run's virtual clock starts (a whole second).
var start = time.Unix(1e9, 0)

// camera is a client while it runs.
type camera struct {
	c      *Client
	period time.Duration
	next   time.Time
	seq    uint64
	r      *rand.Rand
	on     bool
	done   bool
}

// Run runs one experiment in virtual time.
func Run(x Experiment) (*Result, error) {
	wall := time.Now()
	if x.App == nil || x.Profiles == nil {
		return nil, errors.New("eval: an experiment needs an app and its profiles")
	}
	if x.Workload.Duration <= 0 {
		return nil, errors.New("eval: the workload has no duration")
	}
	app := *x.App
	if x.SLO > 0 {
		app.SLO = x.SLO
	}
	pf, limits, fixed, err := x.System.shape(&app, x.Profiles, x.Cluster)
	if err != nil {
		return nil, err
	}
	clk := clock.NewFake(start)
	prices := map[profile.WorkerTypeID]float64{}
	for _, w := range pf.Workers {
		prices[w.Type] = w.Price
	}
	end := start.Add(x.Workload.Duration)
	p := &provisioner{clk: clk, limits: limits, prices: prices, ops: modules.Builtin(), insts: map[string]*vinst{}, bill: newBill(end, fixed.exclude)}
	res := &Result{System: x.System.Name, App: app.Name, Duration: x.Workload.Duration, Drops: map[why.Drop]uint64{}}
	if x.System.Nexus {
		res.NexusGPU, res.FrontEnds, res.Headroom = string(x.System.NexusGPU), x.System.FrontEnds, x.System.Headroom
	}
	secs := int(math.Ceil(x.Workload.Duration.Seconds()))
	res.Seconds = make([]Second, secs)
	for i := range res.Seconds {
		res.Seconds[i].T = i
	}
	cams := make([]*camera, len(x.Workload.Clients))
	byID := map[string]*camera{}
	for i := range x.Workload.Clients {
		c := &x.Workload.Clients[i]
		if c.FPS <= 0 || c.Leave <= c.Join {
			return nil, fmt.Errorf("eval: client %s: fps %v, joins at %v, leaves at %v: want fps > 0 and leave after join", c.ID, c.FPS, c.Join, c.Leave)
		}
		cams[i] = &camera{c: c, period: time.Duration(float64(time.Second) / c.FPS), next: start.Add(c.Join),
			r: rand.New(rand.NewPCG(x.Seed, uint64(i)+1))}
		byID[c.ID] = cams[i]
	}
	captured := func(stream string, seq uint64) int {
		cam := byID[stream]
		if cam == nil {
			return -1
		}
		return int((cam.c.Join + time.Duration(seq)*cam.period) / time.Second)
	}
	var open int64
	onFrame := func(r coordinator.FrameResult) {
		open--
		switch r.Outcome {
		case coordinator.Finished:
			res.Finished++
			if k := captured(r.Stream, r.Seq); k >= 0 && k < secs {
				res.Seconds[k].Finished++
			}
		case coordinator.Late:
			res.Late++
		default:
			res.Dropped++
			res.Drops[r.Reason]++
		}
	}
	method := x.System.Method
	cfg := coordinator.Config{Clock: clk, Stepped: true, Provisioner: p, Method: method, MILPSolver: milp.Solver{},
		OnFrame: onFrame, Log: x.Log, TurnOff: max(0, x.System.TurnOff), Headroom: x.System.Headroom}
	if x.System.TurnOff < 0 {
		cfg.TurnOff = time.Nanosecond // placement's 0 means its default: the least delay there is
	}
	if x.System.Nexus {
		cfg.Method, cfg.Policy, cfg.Epoch, cfg.MinReplanGap = allocator.NexusDP, scheduler.Nexus, 30*time.Second, 10*time.Second
		// Nexus re-plans for the load it sees (rates, objects per frame),
		// not for a finish rate: mdag's headroom rule is not its.
		cfg.Adapt.NoFinishRate = true
	}
	e, err := coordinator.New(cfg)
	if err != nil {
		return nil, err
	}
	p.e = e
	e.Start()
	defer e.Close()
	if err := e.Deploy(&app, pf); err != nil {
		return nil, fmt.Errorf("eval: deploy %s for %s: %w", app.Name, x.System.Name, err)
	}
	frame := media.NewFrame(frameW, frameH)
	// After the last frame, time runs on until every frame has ended
	// (finished, late, dropped or, past LostAfter, lost).
	drainEnd := end.Add(app.SLO + 5*time.Second + 2*time.Second)
	nextSample := start
	objSum := make([]int, secs)
	for {
		e.RunPending()
		var cam *camera
		var camAt time.Time
		for _, c := range cams { // the earliest client event; the first client on a tie
			if c.done {
				continue
			}
			at := c.next
			if !c.on {
				at = start.Add(c.c.Join)
			}
			if leave := start.Add(c.c.Leave); c.on && !at.Before(leave) {
				at = leave
			}
			if cam == nil || at.Before(camAt) {
				cam, camAt = c, at
			}
		}
		t := drainEnd.Add(time.Nanosecond)
		if cam != nil {
			t = camAt
		}
		if nextSample.Before(end) && !nextSample.After(t) {
			t, cam = nextSample, nil // a second's sample comes before its frames
		}
		if tm, ok := clk.Next(); ok && !tm.After(t) {
			clk.Step(tm) // an instant's timers run before its frames and clients
			continue
		}
		if t.After(drainEnd) {
			break
		}
		clk.Set(t)
		if cam == nil { // a second boundary
			k := int(t.Sub(start) / time.Second)
			s := &res.Seconds[k]
			s.CostRate = p.bill.rate() + fixed.rate
			for _, c := range cams {
				if c.on {
					s.Streams++
					s.Ingress += c.c.FPS
				}
			}
			nextSample = nextSample.Add(time.Second)
			continue
		}
		switch {
		case !cam.on:
			if err := e.JoinAt(app.Name, cam.c.ID, cam.c.FPS); err != nil {
				return nil, fmt.Errorf("eval: client %s joins at %v: %w", cam.c.ID, cam.c.Join, err)
			}
			cam.on = true
		case !cam.next.Before(start.Add(cam.c.Leave)):
			if err := e.Leave(cam.c.ID); err != nil {
				return nil, fmt.Errorf("eval: client %s leaves at %v: %w", cam.c.ID, cam.c.Leave, err)
			}
			cam.on, cam.done = false, true
		default:
			at := cam.next.Sub(start)
			truth := x.Workload.boxes(cam.c, at, cam.r)
			if err := e.Ingest(cam.c.ID, cam.seq, cam.next, frame, truth); err != nil {
				return nil, fmt.Errorf("eval: client %s frame %d: %w", cam.c.ID, cam.seq, err)
			}
			open++
			res.Sent++
			if k := int(at / time.Second); k < secs {
				res.Seconds[k].Sent++
				objSum[k] += len(truth)
			}
			cam.seq++
			cam.next = start.Add(cam.c.Join + time.Duration(cam.seq)*cam.period)
		}
	}
	for _, id := range p.bill.ids() {
		p.bill.stop(id, clk.Now())
	}
	res.Cost = p.bill.spent + fixed.rate*x.Workload.Duration.Hours()
	res.CostRate = res.Cost / x.Workload.Duration.Hours()
	res.Starts = p.bill.starts
	res.Open = uint64(max(0, open))
	if res.Sent > 0 {
		res.FinishRate = float64(res.Finished) / float64(res.Sent)
	}
	for k := range res.Seconds {
		if n := res.Seconds[k].Sent; n > 0 {
			res.Seconds[k].Objects = float64(objSum[k]) / float64(n)
		}
	}
	res.Replans = e.Status().ReplansTotal
	for _, rp := range e.Replans() {
		res.Plans = append(res.Plans, Plan{T: rp.At.Sub(start).Seconds(), Trigger: rp.Trigger, Kinds: rp.Kinds, Cost: rp.CostWhole, Problems: rp.Problems})
	}
	if res.Open > 0 {
		res.Problems = append(res.Problems, fmt.Sprintf("%d frames never ended", res.Open))
	}
	res.Digest = res.digest()
	res.Wall = time.Since(wall)
	return res, nil
}

// fixedCost is what a system pays regardless of load: the Nexus-style
// system's front-ends.
type fixedCost struct {
	rate    float64                       // $/h
	exclude map[profile.WorkerTypeID]bool // types whose instances the fixed rate already pays
}

// shape turns the app's profiles and the cluster into what the system
// plans with: the types it may use, the configurations it knows, how many
// of each type it can have and what it pays regardless.
func (s System) shape(app *dag.App, pf *profile.File, cluster map[profile.WorkerTypeID]int) (*profile.File, map[profile.WorkerTypeID]int, fixedCost, error) {
	gpuTargets := map[string]bool{}
	cpuTargets := map[string]bool{}
	for _, m := range app.Modules {
		if m.Kind == dag.GPU {
			gpuTargets[string(m.Name)], gpuTargets[m.Model] = true, true
		} else {
			cpuTargets[string(m.Name)] = true
		}
	}
	limits := maps.Clone(cluster)
	out := &profile.File{Path: pf.Path, Plan: pf.Plan}
	keepPoints := func(p profile.Profile) profile.Profile {
		if !gpuTargets[p.Target] || !(s.Nexus || s.NoSpatial) {
			return p
		}
		q := p
		q.Points = nil
		for _, pt := range p.Points {
			if pt.Concurrency <= 1 {
				q.Points = append(q.Points, pt)
			}
		}
		return q
	}
	if !s.Nexus {
		out.Workers = slices.Clone(pf.Workers)
		for _, p := range pf.Profiles {
			if q := keepPoints(p); len(q.Points) > 0 {
				out.Profiles = append(out.Profiles, q)
			}
		}
		return out, limits, fixedCost{}, nil
	}
	if s.FrontEnds < 1 {
		return nil, nil, fixedCost{}, fmt.Errorf("eval: system %s: a Nexus-style system needs at least one front-end", s.Name)
	}
	gpuW, ok := pf.Worker(s.NexusGPU)
	if !ok || gpuW.GPUs == 0 {
		return nil, nil, fixedCost{}, fmt.Errorf("eval: system %s: GPU type %q is not a GPU worker type of the profiles", s.Name, s.NexusGPU)
	}
	var cpuW *profile.WorkerType
	gpus := 0
	for _, w := range pf.Workers {
		if w.GPUs > 0 {
			gpus += cluster[w.Type] * w.GPUs
		} else if cpuW == nil || w.Price < cpuW.Price {
			cpuW = &w
		}
	}
	if cpuW == nil {
		return nil, nil, fixedCost{}, fmt.Errorf("eval: system %s: the profiles have no CPU-only worker type for the front-ends", s.Name)
	}
	out.Workers = []profile.WorkerType{gpuW, *cpuW}
	for _, p := range pf.Profiles {
		switch {
		case gpuTargets[p.Target] && p.Worker == gpuW.Type, cpuTargets[p.Target] && p.Worker == cpuW.Type:
			if q := keepPoints(p); len(q.Points) > 0 {
				out.Profiles = append(out.Profiles, q)
			}
		}
	}
	limits = map[profile.WorkerTypeID]int{gpuW.Type: gpus / max(1, gpuW.GPUs), cpuW.Type: s.FrontEnds}
	return out, limits, fixedCost{rate: float64(s.FrontEnds) * cpuW.Price, exclude: map[profile.WorkerTypeID]bool{cpuW.Type: true}}, nil
}

// digest hashes the deterministic part of a result.
func (r *Result) digest() string {
	h := sha256.New()
	put := func(v any) { _ = binary.Write(h, binary.LittleEndian, v) }
	fmt.Fprint(h, r.System, "|", r.App, "|")
	put([]uint64{r.Sent, r.Finished, r.Late, r.Dropped, r.Open, uint64(r.Starts), uint64(r.Replans)})
	put(math.Float64bits(r.Cost))
	for _, k := range slices.Sorted(maps.Keys(r.Drops)) {
		fmt.Fprint(h, k, "=", r.Drops[k], ";")
	}
	for _, s := range r.Seconds {
		put([]int64{int64(s.Streams), int64(s.Sent), int64(s.Finished)})
		put([]uint64{math.Float64bits(s.CostRate), math.Float64bits(s.Ingress), math.Float64bits(s.Objects)})
	}
	return fmt.Sprintf("%x", h.Sum(nil))[:16]
}
