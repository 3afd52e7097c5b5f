package main

import (
	"errors"
	"reflect"
	"testing"

	"github.com/mdag/mdag/allocator/milp"
	"github.com/mdag/mdag/coordinator"
	"github.com/mdag/mdag/gpu/nvml"
	"github.com/mdag/mdag/ingest/whip"
	"github.com/mdag/mdag/observe/metrics"
)

// TestGPUMetrics: NVML's MiB and percents become bytes and ratios; this
// process's memory is summed from its entries; no driver is no devices.
func TestGPUMetrics(t *testing.T) {
	got := toGPUMetrics(nvml.Snapshot{Available: true, Driver: "550", Devices: []nvml.Device{{Index: 1, Name: "NVIDIA H100", UtilGPU: 42,
		MemUsedMiB: 2048, MemTotalMiB: 81559, Processes: []nvml.Usage{{PID: 1, MemMiB: 1000}, {PID: 2, MemMiB: 500, Current: true}}}}})
	want := metrics.GPUSnapshot{Available: true, Devices: []metrics.GPUDevice{{Index: "1", Name: "NVIDIA H100", UtilRatio: 0.42,
		MemUsed: 2048 << 20, MemTotal: 81559 << 20, Processes: 2, CurrentUsed: 500 << 20}}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v\nwant %+v", got, want)
	}
	if got := toGPUMetrics(nvml.Snapshot{Reason: nvml.NoDriver}); got.Available || len(got.Devices) != 0 {
		t.Errorf("no driver: %+v", got)
	}
}

// TestTapSinkAdmit: tapSink forwards Admit to the engine (an app it does
// not serve is refused with the engine's reason).
func TestTapSinkAdmit(t *testing.T) {
	e := newEngine(t, coordinator.Config{MILPSolver: milp.Solver{}})
	e.Start()
	defer e.Close()
	var s whip.Sink = tapSink{e: e}
	a, ok := s.(whip.Admitter)
	if !ok {
		t.Fatal("tapSink is not a whip.Admitter")
	}
	if err := a.Admit("traffic"); !errors.Is(err, coordinator.ErrUnknownApp) {
		t.Errorf("tapSink.Admit of an app the engine does not serve: %v, want ErrUnknownApp", err)
	}
}
