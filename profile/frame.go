package profile

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Quantile names the figure of a point's batch time the planner plans on
// (`plan: {quantile: ...}`).
type Quantile string

// The quantiles a profiles document can plan on.
const (
	// P50 plans on each point's latency (`mdag profile` writes the median
	// batch time there).
	P50 Quantile = "p50"
	// P99 plans on each point's p99 where it has one, else on its latency:
	// the default, so hand-written profiles that carry only latency plan as
	// before.
	P99 Quantile = "p99"
)

// UnmarshalScalar implements yamlx.Scalar: p50 or p99.
func (q *Quantile) UnmarshalScalar(s string) error {
	switch v := Quantile(strings.TrimSpace(s)); v {
	case P50, P99:
		*q = v
		return nil
	}
	return fmt.Errorf("want p50 (each point's latency) or p99 (each point's p99, its latency where it has none), got %q", s)
}

// or returns q, or P99 when q is unset.
func (q Quantile) or() Quantile {
	if q == "" {
		return P99
	}
	return q
}

// FrameSize is a frame's width and height in pixels, written WxH
// (640x480). The zero value is "no size".
type FrameSize struct{ W, H int }

// ParseFrameSize reads WxH with both sides >= 1.
func ParseFrameSize(s string) (FrameSize, error) {
	a, b, ok := strings.Cut(strings.TrimSpace(s), "x")
	w, err1 := strconv.Atoi(a)
	h, err2 := strconv.Atoi(b)
	if !ok || err1 != nil || err2 != nil || w < 1 || h < 1 || w > 1<<16 || h > 1<<16 {
		return FrameSize{}, fmt.Errorf("want a frame size WxH such as 640x480 (each side 1..65536), got %q", s)
	}
	return FrameSize{W: w, H: h}, nil
}

// UnmarshalScalar implements yamlx.Scalar.
func (f *FrameSize) UnmarshalScalar(s string) error {
	v, err := ParseFrameSize(s)
	if err != nil {
		return err
	}
	*f = v
	return nil
}

// MarshalText renders WxH (JSON); the zero size renders empty.
func (f FrameSize) MarshalText() ([]byte, error) { return []byte(f.String()), nil }

// UnmarshalText reads WxH (JSON); empty is the zero size.
func (f *FrameSize) UnmarshalText(b []byte) error {
	if len(b) == 0 {
		*f = FrameSize{}
		return nil
	}
	return f.UnmarshalScalar(string(b))
}

// String renders WxH, or "" for the zero size.
func (f FrameSize) String() string {
	if f.IsZero() {
		return ""
	}
	return fmt.Sprintf("%dx%d", f.W, f.H)
}

// IsZero reports whether no size is set.
func (f FrameSize) IsZero() bool { return f.W == 0 && f.H == 0 }

// Pixels is W*H.
func (f FrameSize) Pixels() int { return f.W * f.H }

// Plan is a profiles document's `plan:` block: what the planner plans on.
type Plan struct {
	// Quantile is the batch time a configuration is planned with: p50 (each
	// point's latency) or p99 (each point's p99 where it has one, else its
	// latency). Default p99.
	Quantile Quantile `yaml:"quantile" json:"quantile,omitempty"`
	// Frame is the frame size to plan at where a target was profiled at
	// several (profiles with frame:): its points are interpolated linearly
	// in pixels between the measured sizes, the nearest measured size
	// beyond them. Default: each target's largest measured size.
	Frame FrameSize `yaml:"frame" json:"frame,omitzero"`
}

// SetDefaults implements yamlx.Defaulter.
func (p *Plan) SetDefaults() { p.Quantile = P99 }

// At returns the point's batch time at quantile q: its p99 for P99 when it
// has one, else its latency.
func (p Point) At(q Quantile) time.Duration {
	if q.or() == P99 && p.P99 > 0 {
		return p.P99
	}
	return p.Latency
}

// sizes returns the profiles of target on worker, smallest frame first
// (one unsized profile at most: validate refuses more).
func (f *File) sizes(target string, worker WorkerTypeID) []Profile {
	var out []Profile
	for _, pr := range f.Profiles {
		if pr.Target == target && pr.Worker == worker {
			out = append(out, pr)
		}
	}
	slices.SortStableFunc(out, func(a, b Profile) int { return a.Frame.Pixels() - b.Frame.Pixels() })
	return out
}

// ProfileAt returns the profile of target on worker for frames of size:
// the one profile there is when the target was profiled at one size (or
// without one), else one interpolated linearly in pixels between the two
// measured sizes around it (the nearest measured size beyond them; only
// the (batch, concurrency) points both have). The zero size is the
// planning size: plan.frame, else the largest measured. The returned
// profile's Frame is the size it stands for. ok is false when target has
// no profile on worker.
func (f *File) ProfileAt(target string, worker WorkerTypeID, size FrameSize) (Profile, bool) {
	return profileAt(f.sizes(target, worker), f.Plan.Frame, size)
}

// profileAt is ProfileAt over prs, the profiles of one target on one
// worker type, smallest frame first; plan is the plan's frame.
func profileAt(prs []Profile, plan, size FrameSize) (Profile, bool) {
	switch {
	case len(prs) == 0:
		return Profile{}, false
	case len(prs) == 1:
		return prs[0], true
	}
	if size.IsZero() {
		size = plan
	}
	if size.IsZero() {
		return prs[len(prs)-1], true
	}
	px := size.Pixels()
	i, _ := slices.BinarySearchFunc(prs, px, func(p Profile, px int) int { return p.Frame.Pixels() - px })
	switch {
	case i < len(prs) && prs[i].Frame.Pixels() == px:
		out := prs[i]
		out.Frame = size
		return out, true
	case i == 0:
		return prs[0], true
	case i == len(prs):
		return prs[len(prs)-1], true
	}
	return interpolate(prs[i-1], prs[i], size), true
}

// interpolate returns the profile at size between lo and hi (lo's pixels <
// size's < hi's), over the (batch, concurrency) points both have; with none
// in common, the nearer of the two.
func interpolate(lo, hi Profile, size FrameSize) Profile {
	x := float64(size.Pixels()-lo.Frame.Pixels()) / float64(hi.Frame.Pixels()-lo.Frame.Pixels())
	out := Profile{Target: lo.Target, Worker: lo.Worker, Frame: size}
	for _, p := range lo.Points {
		j := slices.IndexFunc(hi.Points, func(q Point) bool { return q.Batch == p.Batch && q.Concurrency == p.Concurrency })
		if j < 0 {
			continue
		}
		q := hi.Points[j]
		pt := Point{Batch: p.Batch, Concurrency: p.Concurrency, Latency: lerp(p.Latency, q.Latency, x)}
		if p.P99 > 0 && q.P99 > 0 {
			pt.P99 = max(lerp(p.P99, q.P99, x), pt.Latency)
		}
		if p.Throughput > 0 && q.Throughput > 0 {
			// time per item is what grows linearly with the pixels
			pt.Throughput = 1 / (1/p.Throughput + x*(1/q.Throughput-1/p.Throughput))
		}
		out.Points = append(out.Points, pt)
	}
	if len(out.Points) == 0 {
		if x < 0.5 {
			return lo
		}
		return hi
	}
	return out
}

func lerp(a, b time.Duration, x float64) time.Duration {
	return max(1, time.Duration(math.Round(float64(a)+x*float64(b-a))))
}

// FrameFactor is how much longer cfg's batch takes on frames of size than
// on the frames it was planned at (cfg.Frame): the ratio of the two
// profiled batch times at the plan's quantile, each interpolated linearly
// in pixels between the measured sizes (the nearest measured size beyond
// them). It is 1 when cfg's target was profiled at one frame size (or none),
// when either size is unknown, or when the point is missing at a size.
func (c *Catalog) FrameFactor(cfg Config, size FrameSize) float64 {
	if size.IsZero() || cfg.Frame.IsZero() || size == cfg.Frame {
		return 1
	}
	prs := c.sized[sizedKey{cfg.Target, cfg.Worker}]
	at := func(s FrameSize) time.Duration {
		pr, ok := profileAt(prs, c.File.Plan.Frame, s)
		if !ok {
			return 0
		}
		for _, p := range pr.Points {
			if p.Batch == cfg.Batch && p.Concurrency == cfg.Concurrency {
				return p.At(c.File.Plan.Quantile)
			}
		}
		return 0
	}
	a, b := at(cfg.Frame), at(size)
	if a <= 0 || b <= 0 {
		return 1
	}
	return float64(b) / float64(a)
}

// ConfigAt returns cfg as it runs on frames of size: its latency times
// FrameFactor and its capacity divided by it (Balloon), so a factor that
// ballooning applied is kept.
func (c *Catalog) ConfigAt(cfg Config, size FrameSize) Config {
	f := c.FrameFactor(cfg, size)
	out := cfg.Balloon(f)
	if f != 1 {
		out.Frame = size
	}
	return out
}

// AtFrame returns the catalog planned at frames of size instead of the
// plan's frame: every target profiled at several sizes gets the
// configurations of ProfileAt(size); the others are unchanged. The zero
// size returns c.
func (c *Catalog) AtFrame(size FrameSize) *Catalog {
	if size.IsZero() {
		return c
	}
	out := &Catalog{File: c.File, bound: c.bound, sized: c.sized, dispatch: c.dispatch}
	out.configs = out.build(size)
	return out
}

// Sized says whether some target of the catalog was profiled at several
// frame sizes: only then does the frame size its streams send change what
// a plan costs (AtFrame).
func (c *Catalog) Sized() bool { return len(c.sized) > 0 }
