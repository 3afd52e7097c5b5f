package coordinator

import (
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/mdag/mdag/allocator"
	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/internal/defaults"
	"github.com/mdag/mdag/modules"
	"github.com/mdag/mdag/scheduler"
)

// withDefaults fills the zero fields of cfg with their defaults and
// refuses the ones out of range, naming each (a negative epoch or a
// headroom below 1 is a mistake to report, not a value to replace).
func (cfg Config) withDefaults() (Config, error) {
	c := defaults.Fields{Prefix: "coordinator.Config"}
	bad := c.Bad
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
	c.Duration("Epoch", &cfg.Epoch, 30*time.Second)
	c.Duration("DispatchDelay", &cfg.DispatchDelay, 10*time.Millisecond)
	c.Duration("LostAfter", &cfg.LostAfter, 5*time.Second)
	c.Duration("SaveEvery", &cfg.SaveEvery, 200*time.Millisecond)
	c.Duration("StartTimeout", &cfg.StartTimeout, 3*time.Minute)
	if cfg.Checkpoint == 0 {
		cfg.Checkpoint = 2 * time.Second
	}
	if cfg.TurnOff < 0 {
		bad("TurnOff", cfg.TurnOff, "must be >= 0 (0: placement's default)")
	}
	c.AtLeast("Headroom", &cfg.Headroom, 1, 1.25, false)
	if cfg.MinReplanGap < 0 {
		bad("MinReplanGap", cfg.MinReplanGap, "must be >= 0 (0: none)")
	}
	if cfg.Stepped && cfg.Store != nil {
		bad("Stepped", true, "a Stepped engine keeps no Store (its saver runs on a goroutine of its own)")
	}

	cfg.Adapt.check(&c)
	return cfg, c.Err()
}

// check fills a's zero fields with their defaults and records the ones
// out of range in c.
func (a *AdaptConfig) check(c *defaults.Fields) {
	c.Duration("Adapt.Window", &a.Window, 250*time.Millisecond)
	c.AtLeast("Adapt.Threshold", &a.Threshold, 0, 0.25, true)
	c.Count("Adapt.Windows", &a.Windows, 2)
	c.Duration("Adapt.MinInterval", &a.MinInterval, time.Second)
	c.Count("Adapt.MinItems", &a.MinItems, 4)
	c.AtLeast("Adapt.MaxScale", &a.MaxScale, MinScale, 64, false)
	c.AtLeast("Adapt.MaxBalloon", &a.MaxBalloon, 1, 64, false)
	c.Duration("Adapt.MinExcess", &a.MinExcess, 500*time.Microsecond)
	c.Count("Adapt.StaleWindows", &a.StaleWindows, 8)
	if a.FinishTarget > 1 {
		c.Bad("Adapt.FinishTarget", a.FinishTarget, "must be at most 1 (a share of frames)")
	} else {
		c.AtLeast("Adapt.FinishTarget", &a.FinishTarget, 0, 0.95, true)
	}
	c.Count("Adapt.FinishWindows", &a.FinishWindows, 3)
	c.AtLeast("Adapt.HeadroomStep", &a.HeadroomStep, 1, 1.25, true)
	c.AtLeast("Adapt.MaxHeadroom", &a.MaxHeadroom, 1, 2, false)
}

// withDefaults fills the zero fields of an AdaptConfig (newDetector's;
// the engine's own was checked by New, which reports values out of range).
func (a AdaptConfig) withDefaults() AdaptConfig {
	a.check(&defaults.Fields{Prefix: "coordinator.AdaptConfig"})
	return a
}
