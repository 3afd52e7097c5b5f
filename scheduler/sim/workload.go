// Package sim is a discrete-event simulator for the batch scheduler: it
// drives the real scheduler code (package scheduler) in virtual time with
// emulated GPUs that finish a batch after l(b) (optionally with jitter),
// arrival processes (uniform, Poisson, Gamma bursts, per-minute traces),
// Zipf popularity across models and fixed network delays. It is seeded and
// reproducible: the same workload and seed give the same numbers.
//
// The package is pure Go: it imports scheduler, profile, internal/yamlx and
// the standard library, never lp_solve, OpenCV or WebRTC.
package sim

import (
	"bufio"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/mdag/mdag/internal/yamlx"
	"github.com/mdag/mdag/profile"
	"github.com/mdag/mdag/scheduler"
)

// Workload is a simulation input, as in workload YAML files.
type Workload struct {
	GPUs     int           `yaml:"gpus"`
	Duration time.Duration `yaml:"duration"`
	Seed     uint64        `yaml:"seed"`
	Arrival  Arrival       `yaml:"arrival"`
	Network  NetworkYAML   `yaml:"network"`
	Rate     float64       `yaml:"rate"`   // total requests/s for models given by share or Zipf
	Zipf     float64       `yaml:"zipf"`   // popularity skew across models without rate or share (0: equal)
	Jitter   float64       `yaml:"jitter"` // execution time x (1 + U(-jitter, +jitter))
	MaxBatch int           `yaml:"maxBatch"`
	Models   []ModelYAML   `yaml:"models"`

	dir   string
	trace []float64 // per-minute request counts, when arrival is a trace
}

// Arrival is the arrival process.
type Arrival struct {
	Kind  string  `yaml:"kind"`  // uniform | poisson | gamma | trace
	Shape float64 `yaml:"shape"` // gamma
	File  string  `yaml:"file"`  // trace: one request count per minute per line (CSV: last column)
}

// NetworkYAML is the network delay of a batch.
type NetworkYAML struct {
	Control    time.Duration `yaml:"control"`
	PerRequest time.Duration `yaml:"per_request"`
}

// ModelYAML is one model of a workload: alpha/beta or a profile from a
// profiles file (target = name, on worker), its SLO and its rate (absolute,
// or a share of the total).
type ModelYAML struct {
	Name    string        `yaml:"name"`
	Alpha   time.Duration `yaml:"alpha"`
	Beta    time.Duration `yaml:"beta"`
	Profile string        `yaml:"profile"`
	Worker  string        `yaml:"worker"`
	SLO     time.Duration `yaml:"slo"`
	Rate    float64       `yaml:"rate"`
	Share   float64       `yaml:"share"`

	latency []time.Duration
}

func (w *Workload) SetDefaults() {
	w.GPUs, w.Duration, w.Seed, w.Arrival.Kind, w.MaxBatch = 1, 60*time.Second, 1, "poisson", 64
}

// LoadWorkload reads and validates a workload file.
func LoadWorkload(path string) (*Workload, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return ParseWorkload(path, data)
}

// ParseWorkload decodes and validates a workload; profile and trace files
// are read relative to the workload's directory.
func ParseWorkload(path string, data []byte) (*Workload, error) {
	var w Workload
	pos, errs := yamlx.Decode(path, data, &w)
	w.dir = filepath.Dir(path)
	add := func(p, format string, args ...any) { errs = append(errs, pos.Errorf(p, format, args...)) }
	if w.GPUs < 1 || w.GPUs > 100000 {
		add("gpus", "must be in 1..100000, got %d", w.GPUs)
	}
	if w.Duration <= 0 || w.Duration > 24*time.Hour {
		add("duration", "must be in (0, 24h], got %v", w.Duration)
	}
	if w.MaxBatch < 1 || w.MaxBatch > 4096 {
		add("maxBatch", "must be in 1..4096, got %d", w.MaxBatch)
	}
	if w.Jitter < 0 || w.Jitter >= 1 {
		add("jitter", "must be in [0, 1), got %g", w.Jitter)
	}
	if w.Zipf < 0 || w.Rate < 0 {
		add("", "zipf and rate must be >= 0")
	}
	if w.Network.Control < 0 || w.Network.PerRequest < 0 {
		add("network", "delays must be >= 0")
	}
	switch w.Arrival.Kind {
	case "uniform", "poisson":
	case "gamma":
		if w.Arrival.Shape <= 0 {
			add("arrival.shape", "gamma arrivals need shape > 0 (e.g. 0.1 for bursts; 1 is Poisson)")
		}
	case "trace":
		if w.Arrival.File == "" {
			add("arrival.file", "trace arrivals need a file of per-minute request counts")
		} else if tr, err := readTrace(filepath.Join(w.dir, w.Arrival.File)); err != nil {
			add("arrival.file", "%v", err)
		} else {
			w.trace = tr
		}
	default:
		add("arrival.kind", "must be uniform, poisson, gamma or trace, got %q", w.Arrival.Kind)
	}
	if len(w.Models) == 0 {
		add("models", "required: at least one model")
	}
	names := map[string]bool{}
	for i := range w.Models {
		m := &w.Models[i]
		at := fmt.Sprintf("models[%d]", i)
		if m.Name == "" || names[m.Name] {
			add(at+".name", "required and unique, got %q", m.Name)
		}
		names[m.Name] = true
		if m.SLO <= 0 {
			add(at+".slo", "required: a positive latency objective")
		}
		if m.Rate < 0 || m.Share < 0 || m.Rate > 0 && m.Share > 0 {
			add(at, "give rate (requests/s) or share (of the total), not both, and neither negative")
		}
		switch {
		case m.Profile != "" && (m.Alpha != 0 || m.Beta != 0):
			add(at, "give alpha and beta, or profile and worker, not both")
		case m.Profile != "":
			lat, err := profileLatency(filepath.Join(w.dir, m.Profile), m.Name, m.Worker, w.MaxBatch)
			if err != nil {
				add(at+".profile", "%v", err)
			}
			m.latency = lat
		case m.Alpha > 0 && m.Beta >= 0:
			m.latency = scheduler.LinearLatency(m.Alpha, m.Beta, w.MaxBatch)
		default:
			add(at, "needs a latency profile: alpha > 0 and beta >= 0, or profile and worker")
		}
	}
	if err := errs.Err(); err != nil {
		return nil, err
	}
	return &w, nil
}

// profileLatency reads l(b) for b = 1..maxBatch from a profiles file: the
// concurrency-1 points of target name on the worker type, linearly
// interpolated between profiled batch sizes and extrapolated beyond the last.
func profileLatency(path, name, worker string, maxBatch int) ([]time.Duration, error) {
	pf, err := profile.Load(path)
	if err != nil {
		return nil, err
	}
	var pts []profile.Point
	// One frame size: the one the planner plans at (profiles measured at
	// several sizes are not mixed).
	if p, ok := pf.ProfileAt(name, profile.WorkerTypeID(worker), profile.FrameSize{}); ok {
		for _, pt := range p.Points {
			if pt.Concurrency == 1 {
				pts = append(pts, pt)
			}
		}
	}
	if len(pts) == 0 {
		return nil, fmt.Errorf("%s has no concurrency-1 profile of %q on worker %q", path, name, worker)
	}
	fit, ok := profile.FitLinear(func() []profile.Config {
		var c []profile.Config
		for _, pt := range pts {
			c = append(c, profile.Config{Batch: pt.Batch, Latency: pt.Latency})
		}
		return c
	}())
	out := make([]time.Duration, maxBatch)
	for b := 1; b <= maxBatch; b++ {
		switch {
		case ok:
			out[b-1] = max(time.Microsecond, fit.Alpha*time.Duration(b)+fit.Beta)
		default:
			out[b-1] = pts[0].Latency * time.Duration(b) / time.Duration(pts[0].Batch)
		}
	}
	// Exact points where profiled.
	for _, pt := range pts {
		if pt.Batch <= maxBatch {
			out[pt.Batch-1] = pt.Latency
		}
	}
	for b := 1; b < maxBatch; b++ { // keep l non-decreasing
		out[b] = max(out[b], out[b-1])
	}
	return out, nil
}

func readTrace(path string) ([]float64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []float64
	sc := bufio.NewScanner(f)
	line := 0
	for sc.Scan() {
		line++
		t := strings.TrimSpace(sc.Text())
		if t == "" || strings.HasPrefix(t, "#") {
			continue
		}
		fields := strings.Split(t, ",")
		v, err := strconv.ParseFloat(strings.TrimSpace(fields[len(fields)-1]), 64)
		if err != nil {
			if len(out) == 0 && line == 1 {
				continue // a header
			}
			return nil, fmt.Errorf("%s:%d: want a request count per minute, got %q", path, line, t)
		}
		if v < 0 || math.IsNaN(v) || math.IsInf(v, 0) {
			return nil, fmt.Errorf("%s:%d: count must be >= 0", path, line)
		}
		out = append(out, v)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no counts", path)
	}
	return out, sc.Err()
}

// rates resolves each model's rate: explicit rates, shares of the total, and
// Zipf-weighted shares of what is left for models with neither. A total
// given with every model at an explicit rate scales them to that total.
func (w *Workload) rates(total float64) []float64 {
	out := make([]float64, len(w.Models))
	var explicit, shares, zipfSum float64
	var zipfIdx []int
	for i, m := range w.Models {
		switch {
		case m.Rate > 0:
			explicit += m.Rate
		case m.Share > 0:
			shares += m.Share
		default:
			zipfIdx = append(zipfIdx, i)
			zipfSum += 1 / math.Pow(float64(len(zipfIdx)), w.Zipf)
		}
	}
	if total <= 0 {
		total = w.Rate
	}
	scale := 1.0
	if total > 0 && shares == 0 && len(zipfIdx) == 0 && explicit > 0 {
		scale = total / explicit
	}
	rest := math.Max(0, total*(1-shares))
	for i, m := range w.Models {
		switch {
		case m.Rate > 0:
			out[i] = m.Rate * scale
		case m.Share > 0:
			out[i] = m.Share * total
		}
	}
	for rank, i := range zipfIdx {
		out[i] = rest * (1 / math.Pow(float64(rank+1), w.Zipf)) / zipfSum
	}
	return out
}
