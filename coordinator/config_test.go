package coordinator

import (
	"strings"
	"testing"
	"time"

	"github.com/mdag/mdag/allocator"
	"github.com/mdag/mdag/allocator/milp"
)

// TestConfigOutOfRange: zero fields take defaults, fields out of range are
// errors naming the field (issue 19: they were silently replaced).
func TestConfigOutOfRange(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		want []string // substrings of the error; none: valid
	}{
		{"zero is every default, the solver handed in", Config{MILPSolver: milp.Solver{}}, nil},
		{"no MILP solver", Config{}, []string{"coordinator.Config.MILPSolver = nil: the milp method (the default) needs a solver"}},
		{"no solver needed by greedy", Config{Method: allocator.Greedy}, nil},
		{"headroom below 1", Config{Headroom: 0.8}, []string{"coordinator.Config.Headroom = 0.8: must be >= 1 (0: the default 1.25)"}},
		{"negative epoch and lost-after", Config{Epoch: -time.Second, LostAfter: -1}, []string{"Config.Epoch = -1s: must be >= 0", "Config.LostAfter = -1ns"}},
		{"unknown policy and method", Config{Policy: "fifo", Method: "magic"}, []string{"Config.Policy = fifo: unknown", "Config.Method = magic: unknown"}},
		{"adaptation bounds", Config{Adapt: AdaptConfig{MaxBalloon: 0.5, FinishTarget: 1.5, HeadroomStep: 1, Windows: -2}},
			[]string{"Adapt.MaxBalloon = 0.5: must be >= 1", "Adapt.FinishTarget = 1.5: must be at most 1", "Adapt.HeadroomStep = 1: must be > 1", "Adapt.Windows = -2"}},
		{"negative turn-off", Config{TurnOff: -time.Second}, []string{"Config.TurnOff = -1s"}},
		{"negative re-plan gap", Config{MinReplanGap: -time.Second}, []string{"Config.MinReplanGap = -1s: must be >= 0"}},
		{"stepped with a store", Config{Stepped: true, Store: &memStore{}}, []string{"Config.Stepped = true: a Stepped engine keeps no Store"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			if cfg.MILPSolver == nil && len(tc.want) > 0 && !strings.Contains(tc.want[0], "MILPSolver") {
				cfg.MILPSolver = milp.Solver{}
			}
			e, err := New(cfg)
			if len(tc.want) == 0 {
				if err != nil || e == nil {
					t.Fatalf("New: %v", err)
				}
				if e.cfg.Headroom != 1.25 || e.cfg.Epoch != 30*time.Second || e.cfg.Adapt.MaxBalloon != 64 || e.cfg.Policy != DefaultPolicy {
					t.Errorf("defaults not applied: %+v", e.cfg)
				}
				return
			}
			if err == nil {
				t.Fatalf("New accepted %+v", tc.cfg)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}
