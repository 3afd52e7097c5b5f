package main

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mdag/mdag/allocator/milp"
	"github.com/mdag/mdag/coordinator"
	"github.com/mdag/mdag/examples"
	"github.com/mdag/mdag/ingest"
)

// TestServeSynthetic serves each of Scrooge's seven apps (six video, one
// audio) with two
// synthetic cameras for 2 s on the real clock (`mdag serve --example X
// --synthetic 2 --duration 2s`): it exits 0, its summary accounts for
// every frame (none left open), and each stateful module has its state
// line holding both streams. Finish rates are not asserted here (two
// loaded cores under -race); docs/benchmarks.md has them measured.
func TestServeSynthetic(t *testing.T) {
	if testing.Short() {
		t.Skip("runs 2 s of live streams per app")
	}
	cases := []struct {
		app      string
		modules  []string // every module of the app, in its table
		stateful []string
	}{
		{"traffic", []string{"detect", "crop-vehicles", "crop-people", "classify", "face", "count"}, nil},
		{"face", []string{"detect", "crop", "keypoints"}, nil},
		{"tracker", []string{"detect", "crop", "reid", "track"}, []string{"track"}},
		{"pose", []string{"keypoints", "window", "action"}, []string{"window"}},
		{"caption", []string{"features", "order", "caption"}, []string{"order"}},
		{"actdet", []string{"detect", "crop", "track", "reid", "activity"}, []string{"track", "activity"}},
		// the synthetic source of an audio app sends chirps (48 kHz PCM)
		// through IngestAudio; segment cuts them into 40 ms chunks
		{"audio", []string{"segment", "asr", "translate", "synthesize"}, []string{"segment"}},
	}
	sent := regexp.MustCompile(`frames sent (\d+), finished (\d+), late (\d+), dropped (\d+), open 0;`)
	for _, c := range cases {
		t.Run(c.app, func(t *testing.T) {
			var out, errb bytes.Buffer
			code := run(strings.Fields("serve --example "+c.app+" --synthetic 2 --duration 2s --listen 127.0.0.1:0"), &out, &errb)
			if code != exitOK {
				t.Fatalf("exit %d: %s", code, errb.String())
			}
			s := out.String()
			for _, want := range []string{"app " + c.app + ": 2 streams", "INSTANCE", "last re-plans"} {
				if !strings.Contains(s, want) {
					t.Errorf("summary lacks %q:\n%s", want, s)
				}
			}
			m := sent.FindStringSubmatch(s)
			if m == nil {
				t.Fatalf("no frame line with every frame ended (open 0):\n%s", s)
			}
			n := make([]int, 4)
			for i := range n {
				n[i], _ = strconv.Atoi(m[i+1])
			}
			if n[0] == 0 || n[1]+n[2]+n[3] != n[0] {
				t.Errorf("frames sent %d, finished %d + late %d + dropped %d: not every frame accounted for:\n%s", n[0], n[1], n[2], n[3], s)
			}
			for _, mod := range c.modules {
				if !regexp.MustCompile(`(?m)^  ` + regexp.QuoteMeta(mod) + ` +(cpu|gpu) `).MatchString(s) {
					t.Errorf("module %s not in the table:\n%s", mod, s)
				}
			}
			for _, mod := range c.stateful {
				if want := "  state of " + mod + ": 2 streams, migrations 0 "; !strings.Contains(s, want) {
					t.Errorf("summary lacks %q:\n%s", want, s)
				}
			}
			if n := strings.Count(s, "  state of "); n != len(c.stateful) {
				t.Errorf("%d state lines, want %d (the stateful modules %v):\n%s", n, len(c.stateful), c.stateful, s)
			}
			t.Logf("%s: %s", c.app, m[0])
		})
	}
}

// TestServeFlags: serve and status report every problem with their flags
// at once, counted, before anything starts (exit 2).
func TestServeFlags(t *testing.T) {
	for _, tc := range []struct{ args, want string }{
		{"serve --example traffic -f app.yaml --headroom 0.5 --executor onnx --variance exact --slots 2 --workers V100 --policy fifo --objects x --objects-every 0s --size 10x",
			"mdag serve: give --example or -f/-p, not both\n" +
				"mdag serve: --headroom 0.5: want a number >= 1\n" +
				"mdag serve: --variance changes the emulated executor's times; --executor onnx runs real ones\n" +
				"mdag serve: --slots need --executor kserve\n" +
				"mdag serve: --workers: \"V100\": want TYPE=N with N >= 0\n" +
				"mdag serve: --policy \"fifo\": want symphony, clockwork or lazy\n" +
				"mdag serve: --objects \"x\": want a count >= 0 or a comma-separated list of them\n" +
				"mdag serve: --objects-every 0s: want > 0\n" +
				"mdag serve: --size: \"10x\": want WxH, e.g. 640x480\n" +
				"9 problems found\nRun 'mdag serve -h' for its flags.\n"},
		{"serve --executor foo --scene trees",
			"mdag serve: need -f app.yaml and -p profiles.yaml, or --example NAME\n" +
				"mdag serve: --executor \"foo\": want emulated, onnx or kserve\n" +
				"mdag serve: --scene \"trees\": want shapes or people\n" +
				"3 problems found\nRun 'mdag serve -h' for its flags.\n"},
		{"status -o yaml --server ftp://x",
			"mdag status: -o \"yaml\": want table or json\n" +
				"mdag status: --server \"ftp://x\": scheme \"ftp\": want host:port (http:// is assumed) or an http:// or https:// URL, e.g. 127.0.0.1:8080\n" +
				"2 problems found\nRun 'mdag status -h' for its flags.\n"},
	} {
		var out, errb bytes.Buffer
		if code := run(strings.Fields(tc.args), &out, &errb); code != exitInvalid || errb.String() != tc.want || out.Len() > 0 {
			t.Errorf("%s: exit %d, stdout %q, stderr\n%s\nwant exit %d, stderr\n%s", tc.args, code, out.String(), errb.String(), exitInvalid, tc.want)
		}
	}
}

func TestStatusCommand(t *testing.T) {
	e := newEngine(t, coordinator.Config{MILPSolver: milp.Solver{}})
	e.Start()
	defer e.Close()
	srv := httptest.NewServer(statusHandler(e))
	defer srv.Close()
	var out, errb bytes.Buffer
	if code := run([]string{"status", "--server", srv.URL, "-o", "json"}, &out, &errb); code != exitOK {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var st coordinator.Status
	if err := json.Unmarshal(out.Bytes(), &st); err != nil {
		t.Fatalf("json: %v\n%s", err, out.String())
	}
	if st.Policy != string(coordinator.DefaultPolicy) {
		t.Errorf("policy %q", st.Policy)
	}
	out.Reset()
	if code := run([]string{"status", "--server", srv.URL}, &out, &errb); code != exitOK || !strings.Contains(out.String(), "INSTANCE") {
		t.Fatalf("table: exit %d:\n%s", code, out.String())
	}
	if code := run([]string{"status", "--server", srv.URL + "/nothing-here"}, &out, &errb); code != exitFailure ||
		!strings.Contains(errb.String(), "404") {
		t.Errorf("a wrong URL: exit %d, %q", code, errb.String())
	}
}

// TestStatusIngest: `mdag status` adds the WHIP admission state when the
// server has one (GET /v1/ingest), and goes without it when not.
func TestStatusIngest(t *testing.T) {
	e := newEngine(t, coordinator.Config{MILPSolver: milp.Solver{}})
	e.Start()
	defer e.Close()
	cases := []struct {
		name   string
		ingest bool
		want   []string
	}{
		{"with ingest", true, []string{"ingest: 3 streams admitted (max 64), 1 pending (max 64); CPU load 1.20 of 1.40 cores admission fills, a new stream ~0.15; OVERLOADED for 4s",
			"streams refused: capacity=5 recvonly=1", "streams ended: client=2 connect-timeout=7 overload=1",
			"  stream 3f2a: traffic, admitted, h264, 640x480, whip",
			"  stream 9c1e: traffic, admitted, vp8, 320x180, layer q 320x180 of q 320x180, h 640x360, f (1 down: decoding behind or overloaded), whip",
			// what happened loud, the camera's URL as it is (issue 43: it was uppercased)
			"  stream door: traffic, admitted, h265, 1280x720, rtsp://cam.local/door, camera lost 2 times; CAMERA LOST: camera door: rtsp://cam.local/Door: connection lost: EOF; reconnecting",
			"  camera gate: traffic, rtsp://10.0.0.9/live, reconnecting, 3 reconnects, lost 0 times; DOWN 1m35s: camera gate: rtsp://10.0.0.9/live: 401 Unauthorized"}},
		{"without", false, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			mux := http.NewServeMux()
			mux.Handle("/v1/status", statusHandler(e))
			if c.ingest {
				mux.HandleFunc("/v1/ingest", func(w http.ResponseWriter, r *http.Request) {
					writeJSON(w, ingest.Admission{Admitted: 3, Pending: 1, MaxStreams: 64, MaxPending: 64, LoadCores: 1.2, CapacityCores: 1.4,
						StreamCost: 0.15, OverloadedFor: 4 * time.Second, Refused: map[string]uint64{"recvonly": 1, "capacity": 5},
						Ended: map[string]uint64{"overload": 1, "client": 2, "connect-timeout": 7},
						Streams: []ingest.Stream{{ID: "3f2a", App: "traffic", State: "admitted", Codec: "h264", Source: "whip", Width: 640, Height: 480},
							{ID: "9c1e", App: "traffic", State: "admitted", Codec: "vp8", Source: "whip", Width: 320, Height: 180,
								Layer: "q 320x180", Layers: []string{"q 320x180", "h 640x360", "f"}, LayerDown: 1},
							{ID: "door", App: "traffic", State: "admitted", Codec: "h265", Source: "rtsp://cam.local/door", Width: 1280, Height: 720,
								CameraLost: 2, Waiting: "camera lost: camera door: rtsp://cam.local/Door: connection lost: EOF; reconnecting"}},
						Cameras: []ingest.Camera{{Name: "gate", App: "traffic", Source: "rtsp://10.0.0.9/live", State: "reconnecting", Reconnects: 3,
							LastError: "camera gate: rtsp://10.0.0.9/live: 401 Unauthorized: wrong user or password in the URL", Down: 95 * time.Second}}}, false)
				})
			}
			srv := httptest.NewServer(mux)
			defer srv.Close()
			var out, errb bytes.Buffer
			if code := run([]string{"status", "--server", srv.URL}, &out, &errb); code != exitOK {
				t.Fatalf("exit %d: %s", code, errb.String())
			}
			for _, w := range c.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("no %q in\n%s", w, out.String())
				}
			}
			if !c.ingest && strings.Contains(out.String(), "ingest:") {
				t.Errorf("an ingest line without ingest:\n%s", out.String())
			}
		})
	}
}

// TestStatusServerAddress: --server takes host:port, as workers and
// sources do (http:// assumed; issue 43: it failed with Go's "first path
// segment in URL cannot contain colon"), or an http(s):// URL; anything
// else is a clear error.
func TestStatusServerAddress(t *testing.T) {
	cases := []struct{ in, want, wantErr string }{
		{"127.0.0.1:8080", "http://127.0.0.1:8080", ""},
		{"localhost:8080", "http://localhost:8080", ""},
		{"[::1]:8080", "http://[::1]:8080", ""},
		{"mdag.example.com", "http://mdag.example.com", ""},
		{" 127.0.0.1:8080/ ", "http://127.0.0.1:8080", ""},
		{"http://127.0.0.1:8080", "http://127.0.0.1:8080", ""},
		{"https://mdag.example.com:8443/", "https://mdag.example.com:8443", ""},
		{"http://10.0.0.5:8080/mdag/", "http://10.0.0.5:8080/mdag", ""},
		{"", "", "empty: want host:port (http:// is assumed) or an http:// or https:// URL"},
		{"ftp://127.0.0.1:8080", "", `scheme "ftp": want host:port`},
		{"127.0.0.1:80a", "", "not an address: want host:port"},
		{"not an address", "", "not an address: want host:port"},
		{"127.0.0.1:70000", "", `port "70000": want 1..65535`},
		{"http://", "", "no host: want host:port"},
		{":8080", "", "no host: want host:port"},
		{"http://u:p@127.0.0.1:8080", "", "user information, a query or a fragment"},
		{"127.0.0.1:8080?x=1", "", "user information, a query or a fragment"},
	}
	for _, c := range cases {
		t.Run(c.in, func(t *testing.T) {
			got, err := serverBase(c.in)
			switch {
			case c.wantErr == "" && (err != nil || got != c.want):
				t.Fatalf("serverBase(%q) = %q, %v; want %q", c.in, got, err, c.want)
			case c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr)):
				t.Fatalf("serverBase(%q) = %q, %v; want an error with %q", c.in, got, err, c.wantErr)
			}
		})
	}
	e := newEngine(t, coordinator.Config{MILPSolver: milp.Solver{}})
	e.Start()
	defer e.Close()
	srv := httptest.NewServer(statusHandler(e))
	defer srv.Close()
	for _, server := range []string{srv.Listener.Addr().String(), srv.URL, srv.URL + "/"} {
		var out, errb bytes.Buffer
		if code := run([]string{"status", "--server", server}, &out, &errb); code != exitOK || !strings.Contains(out.String(), "INSTANCE") {
			t.Errorf("--server %s: exit %d: %s%s", server, code, errb.String(), out.String())
		}
	}
	var out, errb bytes.Buffer
	if code := run([]string{"status", "--server", "127.0.0.1:80a"}, &out, &errb); code != exitInvalid ||
		!strings.Contains(errb.String(), `mdag status: --server "127.0.0.1:80a": not an address: want host:port`) {
		t.Errorf("a bad --server: exit %d: %s", code, errb.String())
	}
}

// TestServeSummaryFinal: serve's summary (finalStatus) is taken after the
// re-plan the last stream's leave set off is applied and logged (issue 43:
// it was printed while that re-plan ran, showing the instances still
// active at $2.90/h after every stream had left, its table interleaved
// with the re-plan's log line).
func TestServeSummaryFinal(t *testing.T) {
	app, prof, err := examples.Parse("traffic")
	if err != nil {
		t.Fatal(err)
	}
	limits, err := parseLimits("", prof)
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{}
	obs, err := startObserved(coordinator.Config{Log: slog.New(slog.NewTextHandler(logs, nil))}, limits, app, prof)
	if err != nil {
		t.Fatal(err)
	}
	defer obs.Close()
	e := obs.e
	if err := e.Join(app.Name, "cam-1"); err != nil {
		t.Fatal(err)
	}
	st, _ := finalStatus(e, time.Minute)
	if active := activeInstances(st); active == 0 || st.Sessions[0].CostWhole == 0 {
		t.Fatalf("with a stream: %d active instances, $%.2f/h: want some", active, st.Sessions[0].CostWhole)
	}
	if err := e.Leave("cam-1"); err != nil {
		t.Fatal(err)
	}
	st, replans := finalStatus(e, time.Minute)
	logged := strings.Count(logs.String(), "msg=replanned")
	if active := activeInstances(st); active != 0 || st.Sessions[0].CostWhole != 0 || st.Sessions[0].Streams != 0 {
		t.Errorf("after the last stream left: %d active instances, $%.2f/h, %d streams; want none, $0.00/h",
			active, st.Sessions[0].CostWhole, st.Sessions[0].Streams)
	}
	if n := len(replans); n == 0 || st.ReplansTotal != n || logged != n || !slices.Contains(replans[n-1].Kinds, "leave") {
		t.Errorf("re-plans: %d in status, %d listed, %d logged, the last %+v; want the leave's re-plan last, applied and logged",
			st.ReplansTotal, n, logged, replans[max(0, n-1):])
	}
}

func activeInstances(st coordinator.Status) int {
	n := 0
	for _, in := range st.Instances {
		if in.State != "warm" {
			n++
		}
	}
	return n
}

// syncBuffer is a bytes.Buffer safe for a logger's writes from the
// engine's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// newEngine is coordinator.New for a test's fixed config: an error ends
// the test.
func newEngine(tb testing.TB, cfg coordinator.Config) *coordinator.Engine {
	tb.Helper()
	e, err := coordinator.New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	return e
}
