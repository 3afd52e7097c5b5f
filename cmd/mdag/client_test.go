//go:build !lean

package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/mdag/mdag/coordinator/why"
)

// TestClientServe runs `mdag serve` (token required) and `mdag client` as
// separate processes: two WHIP streams of the test pattern, their results
// and summary; a wrong token and an unknown app get the server's reason.
// It checks behaviour, not speed: both streams run without error, the
// server ingests frames and answers most of them (results <= ingested <=
// sent), frames finish, most complete, none is dropped for want of a route
// (deadline drops only). The finish rate (>= 90% on an idle machine) and
// the share of frames answered are BenchmarkClientServe's figures.
func TestClientServe(t *testing.T) {
	if testing.Short() {
		t.Skip("builds mdag and streams for a few seconds")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "mdag")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	tokens := filepath.Join(dir, "tokens")
	if err := os.WriteFile(tokens, []byte("# camera tokens\nt0ken-1-abcdefghij\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := make(chan string, 1)
	re := regexp.MustCompile(`status=http://(\S+)/v1/status`)
	srv := start(t, bin, "serve", func(l string) {
		if m := re.FindStringSubmatch(l); m != nil {
			addr <- m[1]
		}
	}, "serve", "--example", "traffic", "--listen", "127.0.0.1:0", "--token-file", tokens,
		"--cpu-machine=false") // admission by this process's CPU only: other test packages may fill the machine
	var url string
	select {
	case a := <-addr:
		url = "http://" + a
	case <-time.After(20 * time.Second):
		t.Fatalf("serve did not start:\n%s", srv.stderr())
	}
	if !strings.Contains(srv.stderr(), "WHIP ingest requires a bearer token") {
		t.Errorf("serve did not say how ingest is secured:\n%s", srv.stderr())
	}
	client := func(env []string, args ...string) (string, string, int) {
		cmd := exec.Command(bin, append([]string{"client", "--server", url}, args...)...)
		cmd.Env = append(os.Environ(), env...)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return out.String(), errb.String(), code
	}

	out, _, code := client([]string{"MDAG_TOKEN=t0ken-1-abcdefghij"}, "--app", "traffic", "--clients", "2", "--fps", "10", "--size", "320x240", "--duration", "4s", "-o", "json")
	var sum struct {
		Clients []clientSummary `json:"clients"`
		Total   clientSummary   `json:"total"`
	}
	if err := json.Unmarshal([]byte(out), &sum); err != nil || code != 0 {
		t.Fatalf("client exit %d, output %q: %v", code, out, err)
	}
	tot := sum.Total
	t.Logf("total: sent %d, ingested %d, results %d (finished %d, late %d, dropped %d), finish rate %.3f, p50 %.1f ms",
		tot.Sent, tot.Ingested, tot.Results, tot.Finished, tot.Late, tot.Dropped, tot.FinishRate, tot.P50MS)
	if len(sum.Clients) != 2 || tot.Ingested == 0 || tot.Ingested > tot.Sent || uint64(tot.Results) > tot.Ingested || 2*uint64(tot.Results) < tot.Ingested ||
		tot.Finished == 0 || 2*(tot.Finished+tot.Late) < tot.Results || tot.P50MS <= 0 {
		t.Errorf("summary %+v: want frames ingested, most answered, some finished and most completed", sum)
	}
	if ss := getStatus(t, url).Sessions; len(ss) != 1 {
		t.Errorf("%d sessions in the status, want traffic's", len(ss))
	} else {
		checkRouted(t, "serve", ss[0].Drops)
	}
	for _, c := range sum.Clients {
		if c.Stream == "" || c.Error != "" {
			t.Errorf("client %+v", c)
		}
	}

	// The metrics saw the same streams (the clients have left: the
	// session's instances wait warm for the turn-off delay); thumbnails (camera pixels) need
	// the token, the dashboard page and its data do not.
	metrics := get(t, url+"/metrics", 200)
	for _, re := range []string{`mdag_ingest_frames_ingested_total\{app="traffic"\} [1-9]`, `mdag_session_frames_total\{app="traffic",outcome="finished"\} [1-9]`,
		`mdag_planner_triggers_total\{kind="join"\} 2`, `mdag_cluster_instances\{state="warm",type="\w+"\} [1-9]`, `go_goroutines `} {
		if !regexp.MustCompile(re).MatchString(metrics) {
			t.Errorf("/metrics lacks %s", re)
		}
	}
	get(t, url+"/", 200)
	get(t, url+"/v1/thumbs/"+sum.Clients[0].Stream, 401)
	get(t, url+"/v1/thumbs/"+sum.Clients[0].Stream+"?access_token=t0ken-1-abcdefghij", 200)

	// H.264 (x264 in the client, libavcodec in the server) the same way, a
	// clip encoded once (--encode-once, for load tests).
	out, _, code = client([]string{"MDAG_TOKEN=t0ken-1-abcdefghij"}, "--app", "traffic", "--codec", "h264", "--encode-once", "10", "--fps", "10", "--size", "320x240", "--duration", "3s", "-o", "json")
	var h264 struct {
		Total clientSummary `json:"total"`
	}
	if err := json.Unmarshal([]byte(out), &h264); err != nil || code != 0 || h264.Total.Finished == 0 {
		t.Errorf("H.264 client exit %d, output %q: %v; want frames finished", code, out, err)
	}
	out, _, code = client([]string{"MDAG_TOKEN=t0ken-1-abcdefghij"}, "--app", "traffic", "--codec", "vp9", "--duration", "1s")
	if code != exitInvalid {
		t.Errorf("--codec vp9: exit %d, want %d\n%s", code, exitInvalid, out)
	}
	out, _, code = client([]string{"MDAG_TOKEN=wrong"}, "--app", "traffic", "--duration", "1s")
	if code != exitFailure || !strings.Contains(out, "401 Unauthorized: unauthorized: a valid bearer token") {
		t.Errorf("wrong token: exit %d\n%s", code, out)
	}
	out, _, code = client([]string{"MDAG_TOKEN=t0ken-1-abcdefghij"}, "--app", "nope", "--duration", "1s")
	if code != exitFailure || !strings.Contains(out, `404 Not Found: unknown app "nope" (deployed: traffic)`) {
		t.Errorf("unknown app: exit %d\n%s", code, out)
	}
	_, errOut, code := client(nil, "--app", "traffic", "--source", "/no/such.avi")
	if code != exitInvalid || !strings.Contains(errOut, "--source") {
		t.Errorf("bad source: exit %d\n%s", code, errOut)
	}
	srv.stop(t)
}

// TestClientFlags: client reports every problem with its flags at once,
// counted, before it connects (exit 2).
func TestClientFlags(t *testing.T) {
	var out, errb bytes.Buffer
	code := run(strings.Fields("client --fps 0 --clients 0 -o yaml --codec vp9 --encode-once -1 --audio x.wav --audio-bitrate 3"), &out, &errb)
	want := "mdag client: --app is required\n" +
		"mdag client: --fps 0: want 0 < fps <= 120\n" +
		"mdag client: --clients 0: want >= 1\n" +
		"mdag client: -o \"yaml\": want table or json\n" +
		"mdag client: --codec \"vp9\": want vp8 or h264\n" +
		"mdag client: --encode-once -1: want >= 0\n" +
		"mdag client: --audio-bitrate 3: want 6..255 kbit/s per channel\n" +
		"7 problems found\nRun 'mdag client -h' for its flags.\n"
	if code != exitInvalid || errb.String() != want || out.Len() > 0 {
		t.Errorf("exit %d, stdout %q, stderr\n%s\nwant exit %d, stderr\n%s", code, out.String(), errb.String(), exitInvalid, want)
	}
	// the video source is checked with the rest
	out.Reset()
	errb.Reset()
	code = run(strings.Fields("client --app a --size x --encode-once -1"), &out, &errb)
	want = "mdag client: --encode-once -1: want >= 0\n" +
		"mdag client: --source: " // the pattern's size
	if code != exitInvalid || !strings.HasPrefix(errb.String(), want) || !strings.Contains(errb.String(), "2 problems found") {
		t.Errorf("exit %d, stderr\n%s\nwant exit %d, starting %q, 2 problems", code, errb.String(), exitInvalid, want)
	}
}

// TestServeOpenRefused: an open WHIP endpoint on a non-loopback address
// needs --open or a token file.
func TestServeOpenRefused(t *testing.T) {
	var out, errb bytes.Buffer
	code := run([]string{"serve", "--example", "traffic", "--listen", "0.0.0.0:0", "--duration", "1ms"}, &out, &errb)
	if code != exitInvalid || !strings.Contains(errb.String(), "not a loopback address and no --tokens or --token-file") {
		t.Errorf("exit %d: %s", code, errb.String())
	}
}

// checkRouted fails t for every drop ("module: reason") not a load drop.
func checkRouted(t *testing.T, where string, drops map[string]uint64) {
	t.Helper()
	for k, n := range drops {
		if _, reason, _ := strings.Cut(k, ": "); !why.Drop(reason).Load() {
			t.Errorf("%s: %d frames dropped %q: a routing drop, not a deadline one", where, n, k)
		}
	}
}

// TestServeEmulateObjects: a bad --emulate-objects is refused with the
// choices.
func TestServeEmulateObjects(t *testing.T) {
	var out, errb bytes.Buffer
	code := run([]string{"serve", "--example", "traffic", "--listen", "127.0.0.1:0", "--emulate-objects", "yolo", "--duration", "1ms"}, &out, &errb)
	if code != exitInvalid || !strings.Contains(errb.String(), `--emulate-objects "yolo": want motion or none`) {
		t.Errorf("exit %d: %s", code, errb.String())
	}
}
