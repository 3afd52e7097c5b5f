//go:build !lean

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mdag/mdag/ingest"
)

// TestMultiProcessCameraOnWorkers: two RTSP cameras (GStreamer's RTSP
// server), one read by mdag source --camera, one the coordinator's own
// (mdag coordinator --camera), and a WHIP client (aiortc) posting to the
// coordinator, all three ingested on ingest workers, never on the
// coordinator: it takes in a few KiB a frame (the WHIP stream's media goes
// to the worker its offer was handed to; its results come to the client
// on the coordinator's event stream and, forwarded, on its DataChannel,
// which ends on the worker). The ingest worker reading the
// coordinator's camera is killed (SIGKILL), then the one taking the WHIP
// stream if another: the camera is assigned to another worker, the
// source's stream routes again, the WHIP stream ends and its client posts
// again, landing on a live worker; all go on. Once the cameras stop and
// the client deletes its stream, every frame the coordinator saw has
// ended finished, late or dropped with a reason.
func TestMultiProcessCameraOnWorkers(t *testing.T) {
	if testing.Short() {
		t.Skip("builds mdag and runs ~30 s of two live cameras and a WHIP client across processes")
	}
	if exec.Command("/usr/bin/python3", "-c", "import aiortc").Run() != nil {
		if os.Getenv("MDAG_REQUIRE_INTEROP") == "1" {
			t.Fatal("python3-aiortc is missing and MDAG_REQUIRE_INTEROP=1 (make deps installs it)")
		}
		t.Skip("python3-aiortc is missing")
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
	waitFor(t, "five workers", 20*time.Second, func() bool { return len(getStatus(t, ic.url).Instances) == 5 })
	src := start(t, bin, "source", nil, "source", "--coordinator", ic.grpc, "--app", "traffic", "--fps", "5", "--duration", "90s",
		"--camera", fmt.Sprintf("door=rtsp://127.0.0.1:%d/x", doorPort))
	const whipSecs = 28
	ctx, cancel := context.WithTimeout(context.Background(), (whipSecs+60)*time.Second)
	defer cancel()
	client := exec.CommandContext(ctx, "/usr/bin/python3", "tools/whip_aiortc.py", ic.url+"/whip/traffic", strconv.Itoa(whipSecs), "--repost")
	var clientOut, clientErr bytes.Buffer
	client.Stdout, client.Stderr = &clientOut, &clientErr
	if err := client.Start(); err != nil {
		t.Fatal(err)
	}
	clientDone := make(chan error, 1)
	go func() { clientDone <- client.Wait() }()
	// whipOn is the live WHIP stream and its worker ("" before it joined
	// there), from GET /v1/ingest
	whipOn := func() (string, string) {
		var adm ingest.Admission
		body := get(t, ic.url+"/v1/ingest", 200)
		if strings.Contains(body, "Secr3t-gate") {
			t.Fatalf("the password is in /v1/ingest: %s", body)
		}
		if err := json.Unmarshal([]byte(body), &adm); err != nil {
			t.Fatal(err)
		}
		for _, s := range adm.Streams {
			if s.ReadBy != "" && ic.on(s.ID) == s.ReadBy {
				return s.ID, s.ReadBy
			}
		}
		return "", ""
	}
	metrics := func() string { return get(t, ic.url+"/metrics", 200) }
	taken := func(m string) float64 { return metricValue(m, `mdag_grpc_worker_ingest_frames_total{outcome="taken"}`) }
	waitFor(t, "both cameras' and the WHIP stream's frames on ingest workers", 40*time.Second, func() bool {
		_, w := whipOn()
		return taken(metrics()) >= 30 && ic.on("door") != "" && ic.on("gate") != "" && w != ""
	})
	m := metrics()
	if perFrame := (metricValue(m, `mdag_grpc_received_bytes_total{from="workers"}`) + metricValue(m, `mdag_grpc_received_bytes_total{from="sources"}`)) / taken(m); perFrame > 8192 ||
		metricValue(m, `mdag_grpc_received_bytes_total{from="sources"}`) > 64<<10 {
		t.Errorf("the coordinator took in %.0f bytes a frame, %.0f from the source: want no pixels", perFrame, metricValue(m, `mdag_grpc_received_bytes_total{from="sources"}`))
	}
	killed := map[string]bool{}
	kill := func(victim string) {
		t.Helper()
		if err := ic.workers[victim].cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		killed[victim] = true
		before := taken(metrics())
		waitFor(t, "every stream on a live ingest worker after "+victim+" was killed, frames going on", 40*time.Second, func() bool {
			m := metrics()
			_, w := whipOn()
			return !killed[ic.on("gate")] && !killed[ic.on("door")] && w != "" && !killed[w] &&
				metricValue(m, "mdag_grpc_worker_ingest_streams") == 3 && taken(m) >= before+20
		})
	}
	firstWhip, whipWorker := whipOn()
	kill(ic.on("gate"))
	if !killed[whipWorker] {
		kill(whipWorker)
	}
	// GET /v1/ingest (status, the dashboard) says who reads the camera
	waitFor(t, "the camera gate streaming on its new worker in /v1/ingest", 20*time.Second, func() bool {
		var adm ingest.Admission
		if err := json.Unmarshal([]byte(get(t, ic.url+"/v1/ingest", 200)), &adm); err != nil {
			t.Fatal(err)
		}
		return len(adm.Cameras) == 1 && adm.Cameras[0].Name == "gate" && adm.Cameras[0].ReadBy == ic.on("gate") && adm.Cameras[0].State == "streaming"
	})
	src.stop(t)
	_ = gateCam.Kill() // its stream stays, waiting for the camera: no frame comes
	select {
	case err := <-clientDone:
		if err != nil {
			t.Fatalf("aiortc client: %v\n%s\n%s", err, clientOut.String(), clientErr.String())
		}
	case <-ctx.Done():
		t.Fatal("the aiortc client did not end")
	}
	var sum struct {
		Results int      `json:"results"`
		DC      int      `json:"dc_results"`
		Posts   int      `json:"posts"`
		Streams []string `json:"streams"`
		Ends    []string `json:"ends"`
	}
	if err := json.Unmarshal(clientOut.Bytes(), &sum); err != nil {
		t.Fatalf("aiortc summary %q: %v", clientOut.String(), err)
	}
	if sum.Posts < 2 || sum.Results == 0 || sum.DC == 0 || sum.Streams[0] != firstWhip {
		t.Errorf("the WHIP client: %+v; want it posted again after its worker was killed, and results (event stream and DataChannel)", sum)
	}
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
	t.Logf("killed %v; gate on %s, door on %s; WHIP client %+v; totals %+v, drops %v", killed, ic.on("gate"), ic.on("door"), sum, tot, ss.Drops)
	for id, w := range ic.workers {
		if !killed[id] {
			w.stop(t)
		}
	}
	ic.coord.stop(t)
	for id, p := range ic.workers {
		select {
		case <-p.done: // stdout is read once the process is done
		case <-time.After(15 * time.Second):
			t.Fatalf("%s did not end", id)
		}
		if all := p.stdout() + p.stderr(); strings.Contains(all, "Secr3t-gate") {
			t.Errorf("the password is in the output of %s:\n%s", id, all)
		}
	}
	<-ic.coord.done
	if all := ic.coord.stdout() + ic.coord.stderr(); strings.Contains(all, "Secr3t-gate") {
		t.Errorf("the password is in the coordinator's output:\n%s", all)
	}
}
