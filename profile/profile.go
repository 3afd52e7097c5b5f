// Package profile holds worker types with their prices and the
// throughput-latency profiles of modules and models over (batch,
// concurrency), loaded strictly from YAML. It binds profiles to an app's
// modules and answers the questions the planners ask: every configuration of
// a module per worker type, its capacity and worst-case latency (Scrooge
// Eq. 3), the linear fit l(b) = alpha*b + beta with its R^2, the best
// configuration under a latency budget and the fastest way to carry a rate.
package profile

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/mdag/mdag/internal/yamlx"
)

// WorkerTypeID names a worker type (a VM shape, a node pool).
type WorkerTypeID string

// WorkerType is a kind of machine that can be rented by the hour.
type WorkerType struct {
	Type      WorkerTypeID `yaml:"type" json:"type"`
	Price     float64      `yaml:"price" json:"price"` // dollars per hour
	GPU       string       `yaml:"gpu" json:"gpu,omitempty"`
	GPUs      int          `yaml:"gpus" json:"gpus"`
	CPUs      int          `yaml:"cpus" json:"cpus"`
	GPUMemory Bytes        `yaml:"gpuMemory" json:"gpuMemory,omitempty"`
}

// Point is one profiled configuration. Latency is the batch execution time d
// (`mdag profile` writes the median, p50); P99, when set, is the batch
// time's 99th percentile, which the planner uses under `plan: {quantile:
// p99}` (the default). Throughput, when zero, is derived as
// batch*concurrency/latency.
type Point struct {
	Batch       int           `yaml:"batch" json:"batch"`
	Concurrency int           `yaml:"concurrency" json:"concurrency"`
	Latency     time.Duration `yaml:"latency" json:"latency"`
	P99         time.Duration `yaml:"p99" json:"p99,omitempty"`
	Throughput  float64       `yaml:"throughput" json:"throughput,omitempty"`
}

// SetDefaults implements yamlx.Defaulter: concurrency defaults to 1.
func (p *Point) SetDefaults() { p.Concurrency = 1 }

// Profile is the set of profiled points of one target on one worker type.
// Target is a module name (cpu or gpu module) or a model name (gpu modules).
// Frame, when set, is the input frame size the points were measured at; a
// target may have one profile per frame size on a worker type (ProfileAt
// interpolates between them).
type Profile struct {
	Target string       `yaml:"target" json:"target"`
	Worker WorkerTypeID `yaml:"worker" json:"worker"`
	Frame  FrameSize    `yaml:"frame" json:"frame,omitzero"`
	Points []Point      `yaml:"points" json:"points"`
}

// File is a profiles document: what to plan on, worker types and profiles.
type File struct {
	Plan     Plan         `yaml:"plan" json:"plan"`
	Workers  []WorkerType `yaml:"workers" json:"workers"`
	Profiles []Profile    `yaml:"profiles" json:"profiles"`

	Path string `yaml:"-" json:"-"`
	pos  *yamlx.Positions
}

// Worker returns the worker type with the given name.
func (f *File) Worker(t WorkerTypeID) (WorkerType, bool) {
	for _, w := range f.Workers {
		if w.Type == t {
			return w, true
		}
	}
	return WorkerType{}, false
}

// Load reads, decodes and validates a profiles file.
func Load(path string) (*File, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(path, data)
}

// Parse decodes and validates a profiles document. On failure the error is a
// yamlx.ErrorList with every problem found.
func Parse(file string, data []byte) (*File, error) {
	var f File
	pos, errs := yamlx.Decode(file, data, &f)
	f.Path, f.pos = file, pos
	f.Plan.Quantile = f.Plan.Quantile.or()
	for i := range f.Workers {
		if w := &f.Workers[i]; w.GPU != "" && w.GPUs == 0 {
			w.GPUs = 1
		}
	}
	errs = errs.Merge(f.validate())
	if err := errs.Err(); err != nil {
		return nil, err
	}
	return &f, nil
}

// Validate checks the file on its own (not against an app).
func (f *File) Validate() error { return f.validate().Err() }

func (f *File) positions() *yamlx.Positions {
	if f.pos == nil {
		return &yamlx.Positions{File: f.Path}
	}
	return f.pos
}

func (f *File) validate() yamlx.ErrorList {
	p := f.positions()
	var errs yamlx.ErrorList
	add := func(path, format string, args ...any) { errs = append(errs, p.Errorf(path, format, args...)) }
	if len(f.Workers) == 0 {
		add("workers", "required: at least one worker type")
	}
	types := map[WorkerTypeID]int{}
	for i, w := range f.Workers {
		at := fmt.Sprintf("workers[%d]", i)
		if w.Type == "" {
			add(at+".type", "required")
		} else if j, dup := types[w.Type]; dup {
			add(at+".type", "duplicate worker type %q (first defined at workers[%d])", w.Type, j)
		} else {
			types[w.Type] = i
		}
		if w.Price <= 0 {
			add(at+".price", "must be > 0 dollars per hour, got %g", w.Price)
		}
		if w.GPUs < 0 {
			add(at+".gpus", "must be >= 0, got %d", w.GPUs)
		} else if w.GPUs > 0 && w.GPU == "" {
			add(at+".gpus", "%d gpus but no gpu model named in gpu:", w.GPUs)
		}
		if w.CPUs < 0 {
			add(at+".cpus", "must be >= 0, got %d", w.CPUs)
		}
		if w.GPUMemory < 0 {
			add(at+".gpuMemory", "must be >= 0")
		}
	}
	type key struct {
		target string
		worker WorkerTypeID
		frame  FrameSize
	}
	seen := map[key]int{}
	unsized := map[[2]string][]int{} // (target, worker) -> its profiles without frame:
	sized := map[[2]string]int{}     // (target, worker) -> its first profile with one
	for i, pr := range f.Profiles {
		at := fmt.Sprintf("profiles[%d]", i)
		if pr.Target == "" {
			add(at+".target", "required: a module or model name")
		}
		switch _, ok := types[pr.Worker]; {
		case pr.Worker == "":
			add(at+".worker", "required: a worker type")
		case !ok:
			names := make([]string, 0, len(f.Workers))
			for _, w := range f.Workers {
				names = append(names, string(w.Type))
			}
			add(at+".worker", "unknown worker type %q%s", pr.Worker, yamlx.Suggest(string(pr.Worker), names))
		}
		if pr.Target != "" && pr.Worker != "" {
			k, tw := key{pr.Target, pr.Worker, pr.Frame}, [2]string{pr.Target, string(pr.Worker)}
			if j, dup := seen[k]; dup {
				if pr.Frame.IsZero() {
					add(at, "second profile for target %q on worker %q (first at profiles[%d]); merge their points", pr.Target, pr.Worker, j)
				} else {
					add(at+".frame", "second profile for target %q on worker %q at frame %s (first at profiles[%d]); merge their points", pr.Target, pr.Worker, pr.Frame, j)
				}
			} else {
				seen[k] = i
			}
			if pr.Frame.IsZero() {
				unsized[tw] = append(unsized[tw], i)
			} else if _, ok := sized[tw]; !ok {
				sized[tw] = i
			}
		}
		if len(pr.Points) == 0 {
			add(at+".points", "required: at least one {batch, concurrency, latency} point")
		}
		type bc struct{ b, e int }
		pts := map[bc]int{}
		for j, pt := range pr.Points {
			pat := fmt.Sprintf("%s.points[%d]", at, j)
			if pt.Batch <= 0 {
				add(pat+".batch", "must be >= 1, got %d", pt.Batch)
			}
			if pt.Concurrency <= 0 {
				add(pat+".concurrency", "must be >= 1, got %d", pt.Concurrency)
			}
			if pt.Latency <= 0 {
				add(pat+".latency", "must be > 0, got %v", pt.Latency)
			}
			switch {
			case pt.P99 < 0:
				add(pat+".p99", "must be > 0 (or omitted), got %v", pt.P99)
			case pt.P99 > 0 && pt.P99 < pt.Latency:
				add(pat+".p99", "%v is below latency %v: latency is the median (p50) batch time, p99 its 99th percentile", pt.P99, pt.Latency)
			}
			if pt.Throughput < 0 {
				add(pat+".throughput", "must be > 0 (or omitted to derive batch*concurrency/latency), got %g", pt.Throughput)
			}
			k := bc{pt.Batch, pt.Concurrency}
			if first, dup := pts[k]; dup && pt.Batch > 0 && pt.Concurrency > 0 {
				add(pat, "duplicate point batch %d concurrency %d (first at points[%d])", pt.Batch, pt.Concurrency, first)
			} else {
				pts[k] = j
			}
		}
	}
	for tw, is := range unsized {
		if j, ok := sized[tw]; ok {
			for _, i := range is {
				add(fmt.Sprintf("profiles[%d]", i), "target %q on worker %q is profiled at several frame sizes (profiles[%d] at %s): this profile needs frame: WxH too",
					tw[0], tw[1], j, f.Profiles[j].Frame)
			}
		}
	}
	return errs
}

// Bytes is a size in bytes, written in YAML as 16GiB, 512MiB, 2GB or a plain
// number of bytes.
type Bytes int64

var byteUnits = []struct {
	suffix string
	mult   float64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
	{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}, {"B", 1},
}

// UnmarshalScalar implements yamlx.Scalar.
func (b *Bytes) UnmarshalScalar(s string) error {
	s = strings.TrimSpace(s)
	mult := 1.0
	num := s
	for _, u := range byteUnits {
		if strings.HasSuffix(s, u.suffix) {
			num, mult = strings.TrimSpace(strings.TrimSuffix(s, u.suffix)), u.mult
			break
		}
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil || f < 0 || f*mult > 1<<62 {
		return fmt.Errorf("want a size such as 16GiB or 512MiB, got %q", s)
	}
	*b = Bytes(f * mult)
	return nil
}

// String renders the size with the largest binary unit that divides it.
func (b Bytes) String() string {
	for _, u := range []struct {
		s string
		m int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if b != 0 && int64(b)%u.m == 0 {
			return fmt.Sprintf("%d%s", int64(b)/u.m, u.s)
		}
	}
	return fmt.Sprintf("%dB", int64(b))
}
