//go:build !lean

package main

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mdag/mdag/ingest"
)

// TestMultiProcessCameraOnWorkers: two RTSP cameras (GStreamer's RTSP
// server), one read by mdag source --camera, one the coordinator's own
// (mdag coordinator --camera), both decoded on ingest workers, never on
// the coordinator: the coordinator takes in a few KiB a frame and reads
// no camera itself. The ingest worker reading the coordinator's camera is
// killed (SIGKILL): the coordinator assigns the camera to another, the
// source's stream routes again if it was there too, and both go on; once
// the cameras stop, every frame the coordinator saw has ended finished,
// late or dropped with a reason.
func TestMultiProcessCameraOnWorkers(t *testing.T) {
	if testing.Short() {
		t.Skip("builds mdag and runs ~15 s of two live cameras across processes")
	}
	bin := filepath.Join(t.TempDir(), "mdag")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	t.Chdir("../..")
	doorPort, _ := startRTSPCameraProc(t)
	// the coordinator's camera asks for a password, which travels to the
	// worker reading it and is never shown
	gatePort, gateCam := startRTSPCameraProc(t, "--user", "admin", "--password", "Secr3t-gate")
	ic := startIngestCluster(t, bin, "--camera", fmt.Sprintf("gate=rtsp://admin:Secr3t-gate@127.0.0.1:%d/x", gatePort))
	ic.workers["cpu-3"] = start(t, bin, "cpu-3", nil, "worker", "--coordinator", ic.grpc, "--id", "cpu-3", "--type", "CPU", "--ingest-listen", "127.0.0.1:0")
	src := start(t, bin, "source", nil, "source", "--coordinator", ic.grpc, "--app", "traffic", "--fps", "5", "--duration", "90s",
		"--camera", fmt.Sprintf("door=rtsp://127.0.0.1:%d/x", doorPort))
	metrics := func() string { return get(t, ic.url+"/metrics", 200) }
	taken := func(m string) float64 { return metricValue(m, `mdag_grpc_worker_ingest_frames_total{outcome="taken"}`) }
	waitFor(t, "both cameras' frames on ingest workers", 40*time.Second, func() bool {
		return taken(metrics()) >= 20 && ic.on("door") != "" && ic.on("gate") != ""
	})
	m := metrics()
	if perFrame := (metricValue(m, `mdag_grpc_received_bytes_total{from="workers"}`) + metricValue(m, `mdag_grpc_received_bytes_total{from="sources"}`)) / taken(m); perFrame > 8192 ||
		metricValue(m, `mdag_grpc_received_bytes_total{from="sources"}`) > 64<<10 {
		t.Errorf("the coordinator took in %.0f bytes a frame, %.0f from the source: want no pixels", perFrame, metricValue(m, `mdag_grpc_received_bytes_total{from="sources"}`))
	}
	if got := ic.coord.stderr(); strings.Contains(got, "the coordinator reads it") {
		t.Errorf("the coordinator read its camera itself:\n%s", got)
	}
	victim := ic.on("gate")
	if err := ic.workers[victim].cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	before := taken(m)
	waitFor(t, "both cameras on the other ingest workers, frames going on", 40*time.Second, func() bool {
		m := metrics()
		return ic.on("gate") != victim && ic.on("door") != victim && metricValue(m, "mdag_grpc_worker_ingest_streams") == 2 && taken(m) >= before+20
	})
	// GET /v1/ingest (status, the dashboard) says who reads it, and the
	// camera streams there
	waitFor(t, "the camera gate streaming on its new worker in /v1/ingest", 20*time.Second, func() bool {
		var adm ingest.Admission
		body := get(t, ic.url+"/v1/ingest", 200)
		if strings.Contains(body, "Secr3t-gate") {
			t.Fatalf("the password is in /v1/ingest: %s", body)
		}
		if err := json.Unmarshal([]byte(body), &adm); err != nil {
			t.Fatal(err)
		}
		return len(adm.Cameras) == 1 && adm.Cameras[0].Name == "gate" && adm.Cameras[0].ReadBy == ic.on("gate") && adm.Cameras[0].State == "streaming"
	})
	src.stop(t)
	_ = gateCam.Kill() // its stream stays, waiting for the camera: no frame comes
	waitFor(t, "every frame to end", 20*time.Second, func() bool {
		ss := getStatus(t, ic.url).Sessions[0]
		return ss.Open == 0 && ss.Streams == 1
	})
	ss := getStatus(t, ic.url).Sessions[0]
	tot := ss.Total
	var reasons uint64
	for _, n := range ss.Drops {
		reasons += n
	}
	if tot.Sent == 0 || tot.Finished+tot.Late+tot.Dropped != tot.Sent || reasons != tot.Dropped {
		t.Errorf("accounting: sent %d = finished %d + late %d + dropped %d (%d with a reason: %v)?", tot.Sent, tot.Finished, tot.Late, tot.Dropped, reasons, ss.Drops)
	}
	t.Logf("victim %s, then gate on %s, door on %s; totals %+v, drops %v", victim, ic.on("gate"), ic.on("door"), tot, ss.Drops)
	for id, w := range ic.workers {
		if id != victim {
			w.stop(t)
		}
	}
	ic.coord.stop(t)
	for id, p := range map[string]*proc{"coordinator": ic.coord, ic.on("gate"): ic.workers[ic.on("gate")], victim: ic.workers[victim]} {
		if all := p.stdout() + p.stderr(); strings.Contains(all, "Secr3t-gate") {
			t.Errorf("the password is in the output of %s:\n%s", id, all)
		}
	}
}
