package nvml

import (
	"os"
	"strings"
	"testing"
)

// TestTelemetryState: without a driver the snapshot says so cleanly; with
// one (the GPU machine) it lists devices with sane memory figures.
func TestTelemetryState(t *testing.T) {
	s := Telemetry()
	if !s.Available {
		if s.Reason == "" || len(s.Devices) != 0 {
			t.Fatalf("unavailable snapshot %+v: want a reason and no devices", s)
		}
		if os.Getenv("MDAG_EXPECT_GPU") != "" {
			t.Fatalf("MDAG_EXPECT_GPU set but telemetry says: %s", s.Reason)
		}
		t.Logf("no GPU: %s", s.Summary())
		return
	}
	for _, d := range s.Devices {
		if d.Name == "" || d.MemTotalMiB == 0 || d.MemUsedMiB > d.MemTotalMiB || d.UtilGPU > 100 {
			t.Errorf("device %+v: implausible", d)
		}
	}
	if !strings.Contains(s.Summary(), s.Devices[0].Name) {
		t.Errorf("summary %q does not name the device", s.Summary())
	}
	t.Logf("GPU: %s", s.Summary())
}
