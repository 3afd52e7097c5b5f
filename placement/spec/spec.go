// Package spec reads the planning CLI's strict YAML inputs: cluster
// snapshots for `mdag place` (LoadCluster), model sessions for `mdag pack`
// (LoadSessions) and models for `mdag partition` (LoadModels). Unknown
// fields, wrong types and bad values are all reported, each with its
// file:line and field path (internal/yamlx). It imports placement,
// placement/squishy and placement/partition (so it links lp_solve; the
// planners themselves never import it), dag, profile and internal/yamlx.
package spec

import (
	"fmt"
	"os"
	"time"

	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/internal/yamlx"
	"github.com/mdag/mdag/placement"
	"github.com/mdag/mdag/placement/partition"
	"github.com/mdag/mdag/placement/squishy"
	"github.com/mdag/mdag/profile"
)

// ClusterFile is a cluster snapshot as written in YAML for `mdag place`.
type ClusterFile struct {
	TurnOffDelay time.Duration                `yaml:"turnOffDelay"`
	Limits       map[profile.WorkerTypeID]int `yaml:"limits"`
	Instances    []clusterInstance            `yaml:"instances"`
}

type clusterInstance struct {
	ID      placement.InstanceID `yaml:"id"`
	Type    profile.WorkerTypeID `yaml:"type"`
	State   placement.State      `yaml:"state"`
	WarmFor time.Duration        `yaml:"warmFor"`
	Modules []placement.Load     `yaml:"modules"`
	Loaded  []dag.ModuleID       `yaml:"loaded"`
}

func (c *clusterInstance) SetDefaults() { c.State = placement.Active }

// LoadCluster reads a cluster snapshot file; every problem is reported with
// its line. Warm instances are released warmFor after now (the turn-off
// delay when unset).
func LoadCluster(path string, now time.Time, workers []profile.WorkerType) (placement.Snapshot, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return placement.Snapshot{}, err
	}
	return ParseCluster(path, data, now, workers)
}

// ParseCluster is LoadCluster on a document in memory.
func ParseCluster(path string, data []byte, now time.Time, workers []profile.WorkerType) (placement.Snapshot, error) {
	var f ClusterFile
	pos, errs := yamlx.Decode(path, data, &f)
	add := func(p, format string, args ...any) { errs = append(errs, pos.Errorf(p, format, args...)) }
	known := map[profile.WorkerTypeID]bool{}
	for _, w := range workers {
		known[w.Type] = true
	}
	if f.TurnOffDelay < 0 {
		add("turnOffDelay", "must be >= 0, got %v", f.TurnOffDelay)
	}
	for t, n := range f.Limits {
		if !known[t] {
			add("limits."+string(t), "unknown worker type %q", t)
		}
		if n < 0 {
			add("limits."+string(t), "must be >= 0, got %d", n)
		}
	}
	snap := placement.Snapshot{Now: now, Limits: f.Limits, TurnOffDelay: f.TurnOffDelay}
	if snap.TurnOffDelay == 0 {
		snap.TurnOffDelay = placement.DefaultTurnOff
	}
	ids := map[placement.InstanceID]bool{}
	for i, in := range f.Instances {
		at := fmt.Sprintf("instances[%d]", i)
		switch {
		case in.ID == "":
			add(at+".id", "required")
		case ids[in.ID]:
			add(at+".id", "duplicate instance %q", in.ID)
		}
		ids[in.ID] = true
		if !known[in.Type] {
			add(at+".type", "unknown worker type %q", in.Type)
		}
		if in.State != placement.Active && in.State != placement.Starting && in.State != placement.Warm {
			add(at+".state", "must be active, starting or warm, got %q", in.State)
		}
		if in.State == placement.Warm && len(in.Modules) > 0 {
			add(at+".modules", "a warm instance serves nothing; list its models under loaded:")
		}
		var used float64
		for j, l := range in.Modules {
			lat := fmt.Sprintf("%s.modules[%d]", at, j)
			if l.App == "" || l.Module == "" {
				add(lat, "app and module are required")
			}
			if l.Full {
				l.Fraction = 1
				in.Modules[j].Fraction = 1
			}
			if l.Fraction <= 0 || l.Fraction > 1 {
				add(lat+".fraction", "must be in (0, 1] (rate / capacity), got %g", l.Fraction)
			}
			used += l.Fraction
		}
		if used > 1+placement.CapacityEps {
			add(at+".modules", "loads add up to %.4g of the instance's capacity, over 1", used)
		}
		inst := placement.Instance{ID: in.ID, Type: in.Type, State: in.State, Loads: in.Modules, Loaded: in.Loaded}
		if in.State == placement.Warm {
			wait := in.WarmFor
			if wait == 0 {
				wait = snap.TurnOffDelay
			}
			inst.ReleaseAt = now.Add(wait)
		}
		snap.Instances = append(snap.Instances, inst)
	}
	if err := errs.Err(); err != nil {
		return placement.Snapshot{}, err
	}
	return snap, nil
}

// SessionsFile is the input of `mdag pack`.
type SessionsFile struct {
	GPUMemory profile.Bytes `yaml:"gpuMemory"`
	MaxBatch  int           `yaml:"maxBatch"`
	Sessions  []sessionYAML `yaml:"sessions"`
}

type sessionYAML struct {
	Name    string          `yaml:"name"`
	Model   string          `yaml:"model"`
	SLO     time.Duration   `yaml:"slo"`
	Rate    float64         `yaml:"rate"`
	Memory  profile.Bytes   `yaml:"memory"`
	Alpha   time.Duration   `yaml:"alpha"`
	Beta    time.Duration   `yaml:"beta"`
	Profile []profile.Point `yaml:"profile"`
}

// LoadSessions reads a sessions file: each session gives either batch
// profile points or alpha and beta (l(b) = alpha*b + beta for b up to
// maxBatch, default 64).
func LoadSessions(path string) ([]squishy.Session, squishy.PackOptions, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, squishy.PackOptions{}, err
	}
	return ParseSessions(path, data)
}

// ParseSessions is LoadSessions on a document in memory.
func ParseSessions(path string, data []byte) ([]squishy.Session, squishy.PackOptions, error) {
	var f SessionsFile
	pos, errs := yamlx.Decode(path, data, &f)
	add := func(p, format string, args ...any) { errs = append(errs, pos.Errorf(p, format, args...)) }
	if f.MaxBatch == 0 {
		f.MaxBatch = 64
	}
	if f.MaxBatch < 1 || f.MaxBatch > 4096 {
		add("maxBatch", "must be in 1..4096, got %d", f.MaxBatch)
	}
	if len(f.Sessions) == 0 {
		add("sessions", "required: at least one session")
	}
	var out []squishy.Session
	names := map[string]bool{}
	for i, s := range f.Sessions {
		at := fmt.Sprintf("sessions[%d]", i)
		if s.Model == "" {
			add(at+".model", "required")
		}
		if s.SLO <= 0 {
			add(at+".slo", "required: a positive latency objective, e.g. 100ms")
		}
		if s.Rate <= 0 {
			add(at+".rate", "required: requests per second, > 0")
		}
		id := s.Name
		if id == "" {
			id = fmt.Sprintf("%s@%v", s.Model, s.SLO)
		}
		if names[id] {
			add(at, "duplicate session %q (give it a name:)", id)
		}
		names[id] = true
		var bp squishy.BatchProfile
		switch {
		case len(s.Profile) > 0 && (s.Alpha != 0 || s.Beta != 0):
			add(at, "give either profile points or alpha and beta, not both")
		case len(s.Profile) > 0:
			for j, pt := range s.Profile {
				pat := fmt.Sprintf("%s.profile[%d]", at, j)
				if pt.Batch < 1 || pt.Latency <= 0 || pt.Concurrency != 1 || pt.Throughput != 0 {
					add(pat, "want {batch >= 1, latency > 0} (no concurrency or throughput in a Nexus profile)")
					continue
				}
				if j > 0 && pt.Batch <= s.Profile[j-1].Batch {
					add(pat+".batch", "batches must increase, got %d after %d", pt.Batch, s.Profile[j-1].Batch)
				}
				bp.Batches = append(bp.Batches, pt.Batch)
				bp.Latency = append(bp.Latency, pt.Latency)
			}
		case s.Alpha > 0 && s.Beta >= 0:
			bp = squishy.LinearProfile(s.Alpha, s.Beta, f.MaxBatch)
		default:
			add(at, "needs a batch profile: profile points, or alpha > 0 and beta >= 0")
		}
		out = append(out, squishy.Session{ID: id, Model: s.Model, SLO: s.SLO, Rate: s.Rate, Profile: bp, Memory: s.Memory})
	}
	if err := errs.Err(); err != nil {
		return nil, squishy.PackOptions{}, err
	}
	return out, squishy.PackOptions{GPUMemory: f.GPUMemory}, nil
}

// ModelsFile is the input of `mdag partition`.
type ModelsFile struct {
	MaxRate     float64       `yaml:"maxRate"`
	MaxMemory   profile.Bytes `yaml:"maxMemory"`
	W           float64       `yaml:"w"`
	MaxMoveCost *float64      `yaml:"maxMoveCost"`
	Models      []modelYAML   `yaml:"models"`
}

type modelYAML struct {
	Name     string        `yaml:"name"`
	Rate     float64       `yaml:"rate"`
	Static   profile.Bytes `yaml:"static"`
	Dynamic  profile.Bytes `yaml:"dynamic"`
	Current  *int          `yaml:"current"`
	MoveCost float64       `yaml:"moveCost"`
}

// LoadModels reads a models file into a partition request (without the
// number of sub-clusters, which the caller sets).
func LoadModels(path string) (partition.Request, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return partition.Request{}, err
	}
	return ParseModels(path, data)
}

// ParseModels is LoadModels on a document in memory.
func ParseModels(path string, data []byte) (partition.Request, error) {
	var f ModelsFile
	pos, errs := yamlx.Decode(path, data, &f)
	add := func(p, format string, args ...any) { errs = append(errs, pos.Errorf(p, format, args...)) }
	req := partition.Request{MaxRate: f.MaxRate, MaxMemory: f.MaxMemory, W: f.W, MaxMoveCost: -1}
	if f.MaxMoveCost != nil {
		req.MaxMoveCost = *f.MaxMoveCost
		if req.MaxMoveCost < 0 {
			add("maxMoveCost", "must be >= 0 (omit it for no bound), got %g", req.MaxMoveCost)
		}
	}
	if f.MaxRate < 0 || f.W < 0 {
		add("", "maxRate and w must be >= 0")
	}
	if len(f.Models) == 0 {
		add("models", "required: at least one model")
	}
	names := map[string]bool{}
	for i, m := range f.Models {
		at := fmt.Sprintf("models[%d]", i)
		if m.Name == "" {
			add(at+".name", "required")
		} else if names[m.Name] {
			add(at+".name", "duplicate model %q", m.Name)
		}
		names[m.Name] = true
		if m.Rate < 0 {
			add(at+".rate", "must be >= 0, got %g", m.Rate)
		}
		if m.MoveCost < 0 {
			add(at+".moveCost", "must be >= 0, got %g", m.MoveCost)
		}
		cur := -1
		if m.Current != nil {
			cur = *m.Current
			if cur < 0 {
				add(at+".current", "must be a sub-cluster index >= 0, got %d", cur)
			}
		}
		req.Models = append(req.Models, partition.Model{Name: m.Name, Rate: m.Rate, Static: m.Static, Dynamic: m.Dynamic, Current: cur, MoveCost: m.MoveCost})
	}
	if err := errs.Err(); err != nil {
		return partition.Request{}, err
	}
	return req, nil
}
