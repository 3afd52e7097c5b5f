package main

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/mdag/mdag/coordinator"
	"github.com/mdag/mdag/coordinator/store"
	"github.com/mdag/mdag/coordinator/why"
)

// freePort is a loopback address no one listens on now (the restarted
// coordinator must come back on the address the workers and the source
// dial).
func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestMultiProcessRestart is issue 22's restart acceptance test: a
// coordinator with --state, two workers and a source of two cameras, each
// its own process. The coordinator is killed (SIGKILL) mid-run and started
// again on the same state and address: the workers register again, the
// cameras rejoin under their IDs, the session's counters continue from
// what was saved, frames finish again (>= 95% of a second's frames within
// a loose bound; the figure is logged, docs/benchmarks.md has it) and every
// frame the cameras produced is accounted: finished, late, dropped (the
// ones in flight at the kill or sent while the coordinator was away as
// lost, coordinator-restart), or refused.
func TestMultiProcessRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("builds mdag and runs ~20 s of live streams across processes, killing the coordinator")
	}
	bin := filepath.Join(t.TempDir(), "mdag")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	state := t.TempDir()
	grpcAddr := freePort(t)
	re := regexp.MustCompile(`status=http://(\S+)/v1/status`)
	startCoordinator := func(name string) (*proc, string) {
		urls := make(chan string, 1)
		p := start(t, bin, name, func(l string) {
			if m := re.FindStringSubmatch(l); m != nil {
				urls <- "http://" + m[1]
			}
		}, "coordinator", "--example", "traffic", "--grpc", grpcAddr, "--listen", "127.0.0.1:0", "--heartbeat", "200ms", "--state", state)
		select {
		case u := <-urls:
			return p, u
		case <-time.After(30 * time.Second):
			t.Fatalf("%s did not start:\n%s", name, p.stderr())
		}
		return nil, ""
	}
	coord, url := startCoordinator("coordinator")
	for _, w := range []struct{ id, typ string }{{"gpu-1", "V100"}, {"cpu-1", "CPU"}} {
		start(t, bin, w.id, nil, "worker", "--coordinator", grpcAddr, "--id", w.id, "--type", w.typ)
	}
	waitFor(t, "two workers", 20*time.Second, func() bool { return len(getStatus(t, url).Instances) == 2 })
	src := start(t, bin, "source", nil, "source", "--coordinator", grpcAddr, "--app", "traffic", "--streams", "2", "--fps", "10", "--duration", "120s")
	waitFor(t, "three complete windows", 20*time.Second, func() bool {
		ss := getStatus(t, url).Sessions
		return len(ss) > 0 && len(ss[0].Windows) >= 3
	})
	// What the coordinator said before the kill, once a save covers it.
	pre := getStatus(t, url)
	waitFor(t, "a save after the status", 5*time.Second, func() bool {
		p := getStatus(t, url).Persist
		return p != nil && p.LastSaved.After(pre.At)
	})
	if err := coord.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-coord.done
	killed := time.Now()
	coord2, url2 := startCoordinator("coordinator-restarted")
	started := time.Since(killed)
	restored := getStatus(t, url2)
	rs := restored.Sessions[0]
	if p := restored.Persist; p == nil || p.Restarts != 1 {
		t.Fatalf("restarted coordinator's persist status %+v; want 1 restart", p)
	}
	for _, c := range []struct {
		name     string
		pre, got uint64
	}{{"sent", pre.Sessions[0].Total.Sent, rs.Total.Sent}, {"finished", pre.Sessions[0].Total.Finished, rs.Total.Finished},
		{"late", pre.Sessions[0].Total.Late, rs.Total.Late}, {"dropped", pre.Sessions[0].Total.Dropped, rs.Total.Dropped}} {
		if c.got < c.pre {
			t.Errorf("%s went back over the restart: %d before the kill, %d after", c.name, c.pre, c.got)
		}
	}
	if rs.Open != 0 {
		t.Errorf("%d frames open on the restarted coordinator before any stream is back; the ones in flight at the kill are lost", rs.Open)
	}
	waitFor(t, "the workers to register again and the cameras to rejoin", 20*time.Second, func() bool {
		st := getStatus(t, url2)
		return len(st.Instances) == 2 && len(st.Sessions[0].StreamIDs) == 2
	})
	back := time.Since(killed)
	// The first complete second that finishes >= 95% of its frames after
	// the restart: the recovery time, from the kill to that second's end.
	var recovered time.Duration
	waitFor(t, "a second finishing >= 95% after the restart", 30*time.Second, func() bool {
		for _, w := range getStatus(t, url2).Sessions[0].Windows {
			if w.Start.After(killed) && w.Sent > 0 && w.FinishRate >= 0.95 {
				recovered = w.Start.Add(time.Second).Sub(killed)
				return true
			}
		}
		return false
	})
	t.Logf("killed; restarted in %v, workers and cameras back %v after the kill, finish rate >= 95%% again %v after it",
		started.Round(time.Millisecond), back.Round(time.Millisecond), recovered.Round(time.Millisecond))
	// Issue 22's bound is 10 s; this one holds on a loaded 2-core machine
	// under -race (the build and the processes' start included).
	if recovered > 25*time.Second {
		t.Errorf("finish rate back to 95%% %v after the kill; want within 25 s here (10 s in the benchmark)", recovered)
	}
	// The session stays served: three more complete seconds, each
	// finishing frames, none dropped for want of a route.
	waitFor(t, "three complete seconds after the recovery", 20*time.Second, func() bool {
		n := 0
		for _, w := range getStatus(t, url2).Sessions[0].Windows {
			if !w.Start.Before(killed.Add(recovered)) {
				n++
			}
		}
		return n >= 3
	})
	for _, w := range getStatus(t, url2).Sessions[0].Windows {
		t.Logf("window %s (+%v after the kill): sent %d finished %d late %d dropped %d %v", w.Start.Format("05"),
			w.Start.Sub(killed).Round(time.Millisecond), w.Sent, w.Finished, w.Late, w.Dropped, w.Drops)
		if w.Start.Before(killed.Add(recovered)) {
			continue
		}
		if w.Finished == 0 {
			t.Errorf("window %s after the recovery finished nothing", w.Start.Format("05"))
		}
		for k, n := range w.Drops {
			if strings.HasSuffix(k, ": no-instance") || strings.HasSuffix(k, ": no-plan") {
				t.Errorf("window %s: %d frames dropped %q after the recovery", w.Start.Format("05"), n, k)
			}
		}
	}
	src.stop(t)
	var produced, accepted, rejected uint64
	for _, m := range regexp.MustCompile(`(\d+) frames accepted, (\d+) rejected \(produced (\d+),`).FindAllStringSubmatch(src.stdout(), -1) {
		var a, r, p uint64
		fmt.Sscan(m[1], &a)
		fmt.Sscan(m[2], &r)
		fmt.Sscan(m[3], &p)
		accepted, rejected, produced = accepted+a, rejected+r, produced+p
	}
	waitFor(t, "every frame to end", 10*time.Second, func() bool { return getStatus(t, url2).Sessions[0].Open == 0 })
	final := getStatus(t, url2)
	fs := final.Sessions[0]
	lost := fs.Drops["-: "+string(why.CoordinatorRestart)]
	t.Logf("cameras: %d produced, %d accepted after the restart, %d refused; coordinator: %+v, %d lost to the restart\n%s",
		produced, accepted, rejected, fs.Total, lost, src.stdout())
	if produced == 0 || fs.Total.Sent+rejected != produced || fs.Total.Finished+fs.Total.Late+fs.Total.Dropped != fs.Total.Sent {
		t.Errorf("accounting: cameras produced %d, %d refused; coordinator sent %d = finished %d + late %d + dropped %d?",
			produced, rejected, fs.Total.Sent, fs.Total.Finished, fs.Total.Late, fs.Total.Dropped)
	}
	if lost == 0 || final.Persist.LostFrames != lost {
		t.Errorf("%d frames lost to the restart in the drops, %d in the persist status; want the same, > 0", lost, final.Persist.LostFrames)
	}
	coord2.stop(t)
	_ = os.Remove(bin)
}

// TestStateRefused: a coordinator whose --state it cannot read (not a
// database, or held by another coordinator) exits 1 with the path and
// what to do; it does not start with empty state.
func TestStateRefused(t *testing.T) {
	garbage := t.TempDir()
	if err := os.WriteFile(filepath.Join(garbage, "state.db"), []byte(strings.Repeat("garbage ", 4096)), 0o600); err != nil {
		t.Fatal(err)
	}
	future := t.TempDir()
	fs, err := store.Open(future)
	if err != nil {
		t.Fatal(err)
	}
	if err := fs.Save(&coordinator.Snapshot{Version: coordinator.SnapshotVersion + 1}); err != nil {
		t.Fatal(err)
	}
	fs.Close()
	held := t.TempDir()
	hs, err := store.Open(held)
	if err != nil {
		t.Fatal(err)
	}
	defer hs.Close()
	for _, tc := range []struct {
		name, dir string
		want      []string
	}{
		{"not a database", garbage, []string{filepath.Join(garbage, "state.db"), "mv "}},
		{"a future version", future, []string{filepath.Join(future, "state.db"), "unsupported state version 2", "mv "}},
		{"held by another coordinator", held, []string{filepath.Join(held, "state.db"), "another process holds it"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb strings.Builder
			code := run([]string{"coordinator", "--example", "traffic", "--grpc", "127.0.0.1:0", "--listen", "127.0.0.1:0", "--state", tc.dir, "--duration", "1ms"}, &out, &errb)
			if code != exitFailure {
				t.Errorf("exit %d, want %d:\n%s", code, exitFailure, errb.String())
			}
			for _, w := range tc.want {
				if !strings.Contains(errb.String(), w) {
					t.Errorf("stderr lacks %q:\n%s", w, errb.String())
				}
			}
		})
	}
}

// TestServeStateContinues: `mdag serve --state` run twice on one state
// directory: the second run's session counters continue from the first's
// (a clean stop: nothing in flight, nothing counted lost).
func TestServeStateContinues(t *testing.T) {
	dir := t.TempDir()
	re := regexp.MustCompile(`frames sent (\d+), finished (\d+), late (\d+), dropped (\d+), open (\d+)`)
	var prev [5]uint64
	for i := range 2 {
		var out, errb strings.Builder
		if code := run([]string{"serve", "--example", "traffic", "--synthetic", "1", "--duration", "1500ms", "--listen", "127.0.0.1:0", "--state", dir}, &out, &errb); code != exitOK {
			t.Fatalf("run %d: exit %d:\n%s", i, code, errb.String())
		}
		m := re.FindStringSubmatch(out.String())
		if m == nil {
			t.Fatalf("run %d: no summary:\n%s", i, out.String())
		}
		var cur [5]uint64
		for j := range cur {
			fmt.Sscan(m[j+1], &cur[j])
		}
		t.Logf("run %d: sent %d finished %d late %d dropped %d open %d", i, cur[0], cur[1], cur[2], cur[3], cur[4])
		if cur[0] <= prev[0] || cur[1] < prev[1] || cur[2] < prev[2] || cur[3] < prev[3] {
			t.Errorf("run %d: counters %v after %v: they must continue (sent growing, none going back)", i, cur, prev)
		}
		if i == 1 && strings.Contains(out.String(), restartDrop) {
			t.Errorf("a clean stop counted frames lost to the restart:\n%s", out.String())
		}
		if i == 0 && strings.Contains(errb.String(), "state restored") || i == 1 && !strings.Contains(errb.String(), "state restored") {
			t.Errorf("run %d: the log says %q about a restore", i, lastLines(errb.String(), 40))
		}
		prev = cur
	}
}

// restartDrop is how the status table shows frames lost to a restart.
const restartDrop = "-: " + string(why.CoordinatorRestart)
