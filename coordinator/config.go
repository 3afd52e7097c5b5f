package coordinator

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"time"

	"github.com/mdag/mdag/allocator"
	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/modules"
	"github.com/mdag/mdag/profile"
	"github.com/mdag/mdag/scheduler"
)

// withDefaults fills the zero fields of cfg with their defaults and
// refuses the ones out of range, naming each (a negative epoch or a
// headroom below 1 is a mistake to report, not a value to replace).
func (cfg Config) withDefaults() (Config, error) {
	var errs []error
	bad := func(field string, v any, want string) {
		errs = append(errs, fmt.Errorf("coordinator.Config.%s = %v: %s", field, v, want))
	}
	dur := func(field string, d *time.Duration, def time.Duration) {
		switch {
		case *d < 0:
			bad(field, *d, "must be >= 0 (0: the default "+def.String()+")")
		case *d == 0:
			*d = def
		}
	}
	// atLeast checks a factor: 0 takes the default, a value below lo (or
	// NaN) is refused.
	atLeast := func(field string, f *float64, lo, def float64, strict bool) {
		switch {
		case *f == 0:
			*f = def
		case math.IsNaN(*f) || math.IsInf(*f, 0) || *f < lo || (strict && *f == lo):
			op := ">="
			if strict {
				op = ">"
			}
			bad(field, *f, fmt.Sprintf("must be %s %g (0: the default %g)", op, lo, def))
		}
	}
	count := func(field string, n *int, def int) {
		switch {
		case *n < 0:
			bad(field, *n, fmt.Sprintf("must be >= 0 (0: the default %d)", def))
		case *n == 0:
			*n = def
		}
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.Policy == "" {
		cfg.Policy = DefaultPolicy
	} else if !slices.Contains(scheduler.Policies, cfg.Policy) {
		bad("Policy", cfg.Policy, fmt.Sprintf("unknown (known: %v)", scheduler.Policies))
	}
	if cfg.Method != "" && !slices.Contains(allocator.Methods, cfg.Method) {
		bad("Method", cfg.Method, fmt.Sprintf("unknown (known: %v)", allocator.Methods))
	}
	if cfg.MILPSolver == nil && (cfg.Method == "" || cfg.Method == allocator.MILP) {
		bad("MILPSolver", "nil", "the milp method (the default) needs a solver: hand in allocator/milp.Solver{} (or choose another Method)")
	}
	if cfg.Ops == nil {
		cfg.Ops = modules.Builtin()
	}
	if cfg.Observer == nil {
		cfg.Observer = nop{}
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	dur("Epoch", &cfg.Epoch, 30*time.Second)
	dur("DispatchDelay", &cfg.DispatchDelay, 10*time.Millisecond)
	dur("LostAfter", &cfg.LostAfter, 5*time.Second)
	if cfg.TurnOff < 0 {
		bad("TurnOff", cfg.TurnOff, "must be >= 0 (0: placement's default)")
	}
	atLeast("Headroom", &cfg.Headroom, 1, 1.25, false)

	a := &cfg.Adapt
	dur("Adapt.Window", &a.Window, 250*time.Millisecond)
	atLeast("Adapt.Threshold", &a.Threshold, 0, 0.25, true)
	count("Adapt.Windows", &a.Windows, 2)
	dur("Adapt.MinInterval", &a.MinInterval, time.Second)
	count("Adapt.MinItems", &a.MinItems, 4)
	atLeast("Adapt.MaxScale", &a.MaxScale, MinScale, 64, false)
	atLeast("Adapt.MaxBalloon", &a.MaxBalloon, 1, 4, false)
	dur("Adapt.MinExcess", &a.MinExcess, 500*time.Microsecond)
	count("Adapt.StaleWindows", &a.StaleWindows, 8)
	if a.FinishTarget > 1 {
		bad("Adapt.FinishTarget", a.FinishTarget, "must be at most 1 (a share of frames)")
	} else {
		atLeast("Adapt.FinishTarget", &a.FinishTarget, 0, 0.95, true)
	}
	count("Adapt.FinishWindows", &a.FinishWindows, 3)
	atLeast("Adapt.HeadroomStep", &a.HeadroomStep, 1, 1.25, true)
	atLeast("Adapt.MaxHeadroom", &a.MaxHeadroom, 1, 2, false)
	return cfg, errors.Join(errs...)
}

// withDefaults fills the zero fields of an AdaptConfig (NewDetector's;
// the engine's own was checked by New, which reports values out of range).
func (c AdaptConfig) withDefaults() AdaptConfig {
	full, _ := Config{Adapt: c}.withDefaults()
	return full.Adapt
}

// MustNew is New for configs known to be valid (tests, fixed wiring): an
// error panics.
func MustNew(cfg Config) *Engine {
	e, err := New(cfg)
	if err != nil {
		panic(err)
	}
	return e
}

// MustEmbedded is NewEmbedded for configs known to be valid: an error
// panics.
func MustEmbedded(cfg Config, limit map[profile.WorkerTypeID]int) (*Engine, *Local) {
	e, l, err := NewEmbedded(cfg, limit)
	if err != nil {
		panic(err)
	}
	return e, l
}
