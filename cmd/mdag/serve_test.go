package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/mdag/mdag/allocator/milp"
	"github.com/mdag/mdag/coordinator"
	"github.com/mdag/mdag/ingest"
)

// TestServeSynthetic runs the embedded server with synthetic streams for
// two seconds: every frame is accounted for in the summary it prints.
func TestServeSynthetic(t *testing.T) {
	if testing.Short() {
		t.Skip("runs 2 s of live streams")
	}
	var out, errb bytes.Buffer
	code := run(strings.Fields("serve --example traffic --synthetic 2 --duration 2s --listen 127.0.0.1:0"), &out, &errb)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	for _, want := range []string{"app traffic: 2 streams", "frames sent", "detect", "INSTANCE", "last re-plans"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("summary lacks %q:\n%s", want, out.String())
		}
	}
	if !strings.Contains(out.String(), "open 0;") {
		t.Errorf("frames left open at exit:\n%s", out.String())
	}
}

func TestStatusCommand(t *testing.T) {
	e := coordinator.MustNew(coordinator.Config{MILPSolver: milp.Solver{}})
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
	e := coordinator.MustNew(coordinator.Config{MILPSolver: milp.Solver{}})
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
			"  stream door: traffic, admitted, h265, 1280x720, rtsp://cam.local/door, camera lost 2 times; CAMERA LOST: EOF; RECONNECTING",
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
								CameraLost: 2, Waiting: "camera lost: EOF; reconnecting"}},
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
