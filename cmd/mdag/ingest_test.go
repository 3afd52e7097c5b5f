package main

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// metricValue is the value of the sample line that starts with name (a
// metric and its labels) in a Prometheus exposition, or -1.
func metricValue(exposition, name string) float64 {
	for _, l := range strings.Split(exposition, "\n") {
		if rest, ok := strings.CutPrefix(l, name+" "); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			if err == nil {
				return v
			}
		}
	}
	return -1
}

// TestMultiProcessIngestOnWorkers is issue 41's acceptance test for mdag
// source: a coordinator with --data-plane metadata, two GPU workers and two
// CPU workers that ingest (--ingest-listen), and a source of two streams,
// each its own process. The source routes its streams to the ingest
// workers, so the coordinator takes in each frame's identity and results'
// metadata only: a few KiB a frame, never the 230,400 bytes of its
// pixels. Then an ingest worker is killed (SIGKILL): its stream routes
// again and goes on through the other, and every frame the coordinator saw
// ends finished, late or dropped with a reason.
func TestMultiProcessIngestOnWorkers(t *testing.T) {
	if testing.Short() {
		t.Skip("builds mdag and runs ~10 s of live streams across processes")
	}
	bin := filepath.Join(t.TempDir(), "mdag")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	ic := startIngestCluster(t, bin)
	coord, workers, grpcAddr, url := ic.coord, ic.workers, ic.grpc, ic.url
	src := start(t, bin, "source", nil, "source", "--coordinator", grpcAddr, "--app", "traffic", "--streams", "2", "--fps", "10", "--duration", "60s")
	metrics := func() string { return get(t, url+"/metrics", 200) }
	received := func(m string) float64 {
		return metricValue(m, `mdag_grpc_received_bytes_total{from="workers"}`) + metricValue(m, `mdag_grpc_received_bytes_total{from="sources"}`) +
			metricValue(m, `mdag_grpc_received_bytes_total{from="other"}`)
	}
	sent := func(m string) float64 { return metricValue(m, `mdag_session_frames_sent_total{app="traffic"}`) }
	// frames ended, not finished: a loaded machine may drop most of them
	// (cannot-finish), which is not what this test is of
	waitFor(t, "both streams on ingest workers, frames ended", 30*time.Second, func() bool {
		m := metrics()
		ended := 0.0
		for _, o := range []string{"finished", "late", "dropped"} {
			ended += metricValue(m, `mdag_session_frames_total{app="traffic",outcome="`+o+`"}`)
		}
		return metricValue(m, "mdag_grpc_worker_ingest_streams") == 2 && ended > 20
	})
	// What the coordinator takes in a frame, over the next 40 frames.
	m0 := metrics()
	waitFor(t, "40 more frames", 20*time.Second, func() bool { return sent(metrics()) >= sent(m0)+40 })
	m1 := metrics()
	perFrame := (received(m1) - received(m0)) / (sent(m1) - sent(m0))
	if perFrame > 4096 || metricValue(m1, `mdag_grpc_received_bytes_total{from="sources"}`) > 64<<10 {
		t.Errorf("the coordinator took in %.0f bytes a frame (want a few KiB: no pixels); from sources %.0f bytes in all (routes only)",
			perFrame, metricValue(m1, `mdag_grpc_received_bytes_total{from="sources"}`))
	}
	t.Logf("the coordinator took in %.0f bytes a frame", perFrame)

	taken := metricValue(m1, `mdag_grpc_worker_ingest_frames_total{outcome="taken"}`)
	if err := workers["cpu-1"].cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "both streams ingested again after the kill, frames going on", 30*time.Second, func() bool {
		m := metrics()
		return metricValue(m, `mdag_planner_triggers_total{kind="worker-lost"}`) == 1 && metricValue(m, "mdag_grpc_worker_ingest_streams") == 2 &&
			metricValue(m, `mdag_grpc_worker_ingest_frames_total{outcome="taken"}`) > taken+40
	})
	src.stop(t)
	var accepted, unconfirmed uint64
	conns := 0
	for _, m := range regexp.MustCompile(`(\d+) frames accepted, \d+ rejected \(produced \d+, unconfirmed (\d+), skipped \d+, connections (\d+)\)`).FindAllStringSubmatch(src.out.String(), -1) {
		var a, u uint64
		var c int
		fmt.Sscan(m[1], &a)
		fmt.Sscan(m[2], &u)
		fmt.Sscan(m[3], &c)
		accepted, unconfirmed, conns = accepted+a, unconfirmed+u, conns+c
	}
	if conns != 3 {
		t.Errorf("the source's streams made %d connections; want 3 (one stream joined again after the kill):\n%s", conns, src.out.String())
	}
	waitFor(t, "every frame to end", 10*time.Second, func() bool { return getStatus(t, url).Sessions[0].Open == 0 })
	ss := getStatus(t, url).Sessions[0]
	tot := ss.Total
	if tot.Sent < accepted || tot.Sent > accepted+unconfirmed || tot.Finished+tot.Late+tot.Dropped != tot.Sent {
		t.Errorf("accounting: the source: %d accepted, %d unconfirmed; the coordinator: sent %d = finished %d + late %d + dropped %d?\n%s",
			accepted, unconfirmed, tot.Sent, tot.Finished, tot.Late, tot.Dropped, src.out.String())
	}
	var reasons uint64
	for _, n := range ss.Drops {
		reasons += n
	}
	if reasons != tot.Dropped {
		t.Errorf("%d frames dropped, %d with a reason: %v", tot.Dropped, reasons, ss.Drops)
	}
	t.Logf("totals %+v, drops %v", tot, ss.Drops)
	for id, w := range workers {
		if id != "cpu-1" {
			w.stop(t)
		}
	}
	coord.stop(t)
}

// ingestCluster is a coordinator with --data-plane metadata, two GPU
// workers and two CPU workers that ingest, each its own process.
type ingestCluster struct {
	coord     *proc
	workers   map[string]*proc
	grpc, url string
	mu        sync.Mutex
	joinedOn  map[string]string // stream -> the ingest worker it joined on last (the coordinator's log)
}

func startIngestCluster(t *testing.T, bin string, coordArgs ...string) *ingestCluster {
	t.Helper()
	ic := &ingestCluster{workers: map[string]*proc{}, joinedOn: map[string]string{}}
	addrs := make(chan [2]string, 1)
	re := regexp.MustCompile(`grpc=(\S+) status=http://(\S+)/v1/status`)
	joined := regexp.MustCompile(`msg="camera joined" app=\S+ stream=(\S+) ingest_worker=(\S+)`)
	ic.coord = start(t, bin, "coordinator", func(l string) {
		if m := re.FindStringSubmatch(l); m != nil {
			addrs <- [2]string{m[1], m[2]}
		}
		if m := joined.FindStringSubmatch(l); m != nil {
			ic.mu.Lock()
			ic.joinedOn[m[1]] = m[2]
			ic.mu.Unlock()
		}
	}, append([]string{"coordinator", "--example", "traffic", "--grpc", "127.0.0.1:0", "--listen", "127.0.0.1:0", "--heartbeat", "200ms", "--data-plane", "metadata"}, coordArgs...)...)
	select {
	case a := <-addrs:
		ic.grpc, ic.url = a[0], "http://"+a[1]
	case <-time.After(20 * time.Second):
		t.Fatalf("coordinator did not start:\n%s", ic.coord.stderr())
	}
	for _, w := range []struct{ id, typ, ingest string }{{"gpu-1", "V100", ""}, {"gpu-2", "V100", ""}, {"cpu-1", "CPU", "127.0.0.1:0"}, {"cpu-2", "CPU", "127.0.0.1:0"}} {
		args := []string{"worker", "--coordinator", ic.grpc, "--id", w.id, "--type", w.typ}
		if w.ingest != "" {
			args = append(args, "--ingest-listen", w.ingest)
		}
		ic.workers[w.id] = start(t, bin, w.id, nil, args...)
	}
	waitFor(t, "four workers", 20*time.Second, func() bool { return len(getStatus(t, ic.url).Instances) == 4 })
	return ic
}

// on is the ingest worker stream joined on last ("" before it joined).
func (ic *ingestCluster) on(stream string) string {
	ic.mu.Lock()
	defer ic.mu.Unlock()
	return ic.joinedOn[stream]
}
