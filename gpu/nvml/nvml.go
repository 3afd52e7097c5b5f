// Package nvml reads NVIDIA GPU telemetry through NVML (go-nvml): devices,
// utilisation, memory and processes, with a clean no-driver state where
// there is none. It is an edge package the full binary links.
package nvml

import (
	"fmt"
	"strings"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Device is one NVIDIA GPU's state as NVML reports it.
type Device struct {
	Index       int     `json:"index"`
	Name        string  `json:"name"`
	UUID        string  `json:"uuid"`
	UtilGPU     uint32  `json:"util_gpu_pct"`    // % of the last sample period a kernel ran
	UtilMemory  uint32  `json:"util_memory_pct"` // % of it memory was read or written
	MemUsedMiB  uint64  `json:"mem_used_mib"`
	MemTotalMiB uint64  `json:"mem_total_mib"`
	Processes   []Usage `json:"processes,omitempty"` // compute processes and their memory
}

// Usage is one process's memory on a device.
type Usage struct {
	PID     uint32 `json:"pid"`
	MemMiB  uint64 `json:"mem_mib"`
	Current bool   `json:"current,omitempty"` // this process
}

// Snapshot is the machine's GPU telemetry at one instant. With no NVIDIA
// driver (CI, laptops, emulated-only workers) Available is false and Reason
// says why; that is a normal state, not an error.
type Snapshot struct {
	Available bool     `json:"available"`
	Reason    string   `json:"reason,omitempty"`
	Driver    string   `json:"driver,omitempty"`
	Devices   []Device `json:"devices,omitempty"`
}

// Summary is one line for logs and worker registration.
func (s Snapshot) Summary() string {
	if !s.Available {
		return s.Reason
	}
	names := make([]string, len(s.Devices))
	for i, d := range s.Devices {
		names[i] = fmt.Sprintf("%d:%s %d%% %d/%d MiB", d.Index, d.Name, d.UtilGPU, d.MemUsedMiB, d.MemTotalMiB)
	}
	return fmt.Sprintf("driver %s; %s", s.Driver, strings.Join(names, "; "))
}

// NoDriver is the reason Telemetry gives when NVML cannot be loaded.
const NoDriver = "no NVIDIA driver (NVML library not found): GPU modules run on the emulated executor"

var nvmlMu sync.Mutex // NVML init/shutdown is process-global

// Telemetry reads every NVIDIA GPU through NVML (go-nvml, which loads
// libnvidia-ml.so at run time: the binary needs no driver to build or
// start). Each call initialises and shuts NVML down again; it is meant for
// heartbeats and status pages (a few calls a second), not a hot path.
func Telemetry() Snapshot {
	nvmlMu.Lock()
	defer nvmlMu.Unlock()
	if ret := nvml.Init(); ret != nvml.SUCCESS {
		if ret == nvml.ERROR_LIBRARY_NOT_FOUND {
			return Snapshot{Reason: NoDriver}
		}
		return Snapshot{Reason: "NVML init failed: " + nvml.ErrorString(ret)}
	}
	defer nvml.Shutdown()
	s := Snapshot{Available: true}
	if v, ret := nvml.SystemGetDriverVersion(); ret == nvml.SUCCESS {
		s.Driver = v
	}
	n, ret := nvml.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return Snapshot{Reason: "NVML device count: " + nvml.ErrorString(ret)}
	}
	self := uint32(currentPID())
	for i := range n {
		dev, ret := nvml.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			continue
		}
		d := Device{Index: i}
		d.Name, _ = dev.GetName()
		d.UUID, _ = dev.GetUUID()
		if u, ret := dev.GetUtilizationRates(); ret == nvml.SUCCESS {
			d.UtilGPU, d.UtilMemory = u.Gpu, u.Memory
		}
		if m, ret := dev.GetMemoryInfo(); ret == nvml.SUCCESS {
			d.MemUsedMiB, d.MemTotalMiB = m.Used>>20, m.Total>>20
		}
		if ps, ret := dev.GetComputeRunningProcesses(); ret == nvml.SUCCESS {
			for _, p := range ps {
				d.Processes = append(d.Processes, Usage{PID: p.Pid, MemMiB: p.UsedGpuMemory >> 20, Current: p.Pid == self})
			}
		}
		s.Devices = append(s.Devices, d)
	}
	if len(s.Devices) == 0 {
		s.Available, s.Reason = false, "NVIDIA driver present but no devices visible"
	}
	return s
}
