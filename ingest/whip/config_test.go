package whip

import (
	"strings"
	"testing"
	"time"
)

// TestConfigOutOfRange: zero fields take defaults, fields out of range are
// errors naming the field (a negative MaxStreams was silently 64).
func TestConfigOutOfRange(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		want []string
	}{
		{"negative stream limit", Config{MaxStreams: -1}, []string{"whip.Config.MaxStreams = -1: must be >= 0 (0: the default 64)"}},
		{"ceiling above 1", Config{CPUCeiling: 1.5}, []string{"whip.Config.CPUCeiling = 1.5: must be between 0 and 1"}},
		{"negative timeouts", Config{ConnectTimeout: -time.Second, IdleTimeout: -1}, []string{"ConnectTimeout = -1s", "IdleTimeout = -1ns"}},
		{"oversize", Config{Oversize: "crop"}, []string{"Oversize = crop: want downscale or reject"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.cfg.withDefaults()
			if err == nil {
				t.Fatalf("accepted %+v", tc.cfg)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
	c, err := Config{ShedAfter: -1}.withDefaults()
	if err != nil || c.MaxStreams != 64 || c.MaxPending != 64 || c.ShedAfter != -1 || c.CPUCeiling != 0.7 {
		t.Errorf("defaults: %+v %v (a negative ShedAfter means never shed)", c, err)
	}
}
