//go:build !lean

package main

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// TestMultiProcessCameraOnWorkers: an RTSP camera (GStreamer's RTSP
// server) that mdag source --camera reads and decodes goes to an ingest
// worker, not to the coordinator: the coordinator takes in a few KiB a
// frame. Its ingest worker is killed (SIGKILL): the camera's stream joins
// again on the other and goes on; every frame the coordinator saw ends
// finished, late or dropped with a reason.
func TestMultiProcessCameraOnWorkers(t *testing.T) {
	if testing.Short() {
		t.Skip("builds mdag and runs ~10 s of a live camera across processes")
	}
	bin := filepath.Join(t.TempDir(), "mdag")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	t.Chdir("../..")
	port := startRTSPCamera(t)
	ic := startIngestCluster(t, bin)
	src := start(t, bin, "source", nil, "source", "--coordinator", ic.grpc, "--app", "traffic", "--fps", "5", "--duration", "60s",
		"--camera", fmt.Sprintf("door=rtsp://127.0.0.1:%d/x", port))
	metrics := func() string { return get(t, ic.url+"/metrics", 200) }
	taken := func(m string) float64 { return metricValue(m, `mdag_grpc_worker_ingest_frames_total{outcome="taken"}`) }
	waitFor(t, "the camera's frames on an ingest worker", 30*time.Second, func() bool { return taken(metrics()) >= 10 && ic.on("door") != "" })
	m := metrics()
	if perFrame := (metricValue(m, `mdag_grpc_received_bytes_total{from="workers"}`) + metricValue(m, `mdag_grpc_received_bytes_total{from="sources"}`)) / taken(m); perFrame > 8192 ||
		metricValue(m, `mdag_grpc_received_bytes_total{from="sources"}`) > 64<<10 {
		t.Errorf("the coordinator took in %.0f bytes a frame, %.0f from the source: want no pixels", perFrame, metricValue(m, `mdag_grpc_received_bytes_total{from="sources"}`))
	}
	victim := ic.on("door")
	if err := ic.workers[victim].cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	before := taken(m)
	waitFor(t, "the camera joined again on the other ingest worker, frames going on", 30*time.Second, func() bool {
		m := metrics()
		return ic.on("door") != victim && metricValue(m, "mdag_grpc_worker_ingest_streams") == 1 && taken(m) >= before+10
	})
	src.stop(t)
	waitFor(t, "every frame to end", 10*time.Second, func() bool { ss := getStatus(t, ic.url).Sessions[0]; return ss.Open == 0 && ss.Streams == 0 })
	ss := getStatus(t, ic.url).Sessions[0]
	tot := ss.Total
	var reasons uint64
	for _, n := range ss.Drops {
		reasons += n
	}
	if tot.Sent == 0 || tot.Finished+tot.Late+tot.Dropped != tot.Sent || reasons != tot.Dropped {
		t.Errorf("accounting: sent %d = finished %d + late %d + dropped %d (%d with a reason: %v)?", tot.Sent, tot.Finished, tot.Late, tot.Dropped, reasons, ss.Drops)
	}
	t.Logf("victim %s, then %s; totals %+v, drops %v", victim, ic.on("door"), tot, ss.Drops)
	for id, w := range ic.workers {
		if id != victim {
			w.stop(t)
		}
	}
	ic.coord.stop(t)
}
