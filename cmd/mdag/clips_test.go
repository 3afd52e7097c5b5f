//go:build !lean

package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/mdag/mdag/clips"
	"github.com/mdag/mdag/coordinator"
	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/media"
)

// TestClipsAPI: a clip made from a result's event is listed by GET
// /v1/clips and served by GET /v1/clips/{name} (video/mp4, ranges), its
// JSON beside it; unknown names are 404s.
func TestClipsAPI(t *testing.T) {
	app, err := dag.Parse("app.yaml", []byte(`app: t
slo: 400ms
fps: 10
modules:
  - {name: detect, kind: gpu, model: ssd, inputs: [source]}
clips: {pre: 1s, post: 1s}
`))
	if err != nil {
		t.Fatal(err)
	}
	app.File = filepath.Join(t.TempDir(), "app.yaml")
	app.Clips.Dir = "clips"
	c, err := startClips(app, "", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	for i := range 40 {
		f := &media.Frame{W: 64, H: 48, Pix: make([]byte, 64*48*3)}
		for j := range f.Pix {
			f.Pix[j] = byte(i + j)
		}
		c.Frame("cam", uint64(i), t0.Add(time.Duration(i)*100*time.Millisecond), f)
		c.Sync() // encoded before the next (Frame only queues it)
		if i == 20 {
			c.onFrame(coordinator.FrameResult{Stream: "cam", Seq: 20, Events: []media.Event{{Kind: "dwell", Rule: "desk", Track: 1}}})
		}
	}
	c.Sync()
	var current *clipRecorder = c
	get := func() *clipRecorder { return current }
	srv := httptest.NewServer(func() http.Handler {
		mux := http.NewServeMux()
		mux.Handle("GET /v1/clips", clipsList(get))
		mux.Handle("GET /v1/clips/{name}", clipFile(get))
		return mux
	}())
	defer srv.Close()
	defer c.Close()
	resp, err := http.Get(srv.URL + "/v1/clips")
	if err != nil {
		t.Fatal(err)
	}
	var list []struct {
		clips.Info
		URL  string `json:"url"`
		JSON string `json:"json_url"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if len(list) != 1 || list[0].Stream != "cam" || list[0].Frames != 21 || len(list[0].Events) != 1 || list[0].Events[0].Rule != "desk" {
		t.Fatalf("list: %+v", list)
	}
	req, _ := http.NewRequest("GET", srv.URL+list[0].URL, nil)
	req.Header.Set("Range", "bytes=4-11")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusPartialContent || resp.Header.Get("Content-Type") != "video/mp4" || string(b) != "ftypisom" && string(b[:4]) != "ftyp" {
		t.Errorf("range: %d %s %q", resp.StatusCode, resp.Header.Get("Content-Type"), b)
	}
	for path, want := range map[string]int{list[0].JSON: 200, "/v1/clips/nope.mp4": 404, "/v1/clips/..%2Fapp.yaml": 404} {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("GET %s: %d, want %d", path, resp.StatusCode, want)
		}
	}
	// the dashboard's, /metrics' and the summary's figures
	d := c.status()
	if d.Written != 1 || d.OnDisk != 1 || d.Frames != 40 || d.Events != 1 || len(d.Latest) != 1 || d.Latest[0].Name != list[0].Name || d.Latest[0].Event != "dwell desk" || d.MaxBytes != 1<<30 {
		t.Errorf("dashboard: %+v", d)
	}
	if m := c.metrics(); m.App != "t" || m.Written != 1 || m.WrittenBytes != list[0].Bytes || m.StoredBytes != list[0].Bytes || m.Streams != 1 {
		t.Errorf("metrics: %+v", m)
	}
	var sum strings.Builder
	writeClipLine(&sum, c)
	if want := fmt.Sprintf("1 written (%d bytes), 1 on disk", list[0].Bytes); !strings.Contains(sum.String(), want) || !strings.HasSuffix(sum.String(), "40 frames recorded; ok\n") {
		t.Errorf("summary %q, want %q ... ok", sum.String(), want)
	}
	current = nil
	resp, _ = http.Get(srv.URL + "/v1/clips")
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "[]\n" && string(b) != "[]" {
		t.Errorf("no clips: %q", b)
	}
}

// TestServeClips: serve with the actdet example's activity rules and a
// clips section, on a synthetic people scene (emulated GPUs), writes a
// clip around a real line-cross event: the summary says so, the JSON is
// the event's, and ffprobe reads the MP4 (when installed). About 2.3 s.
func TestServeClips(t *testing.T) {
	if testing.Short() {
		t.Skip("runs 1 s of a live stream")
	}
	dir := t.TempDir()
	app, err := os.ReadFile("../../examples/actdet/app.yaml")
	if err != nil {
		t.Fatal(err)
	}
	app = append(app, "clips: {dir: clips, pre: 1s, post: 1s, on: [line-cross, dwell]}\n"...)
	if err := os.WriteFile(filepath.Join(dir, "app.yaml"), app, 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	code := run([]string{"serve", "-f", filepath.Join(dir, "app.yaml"), "-p", "../../examples/actdet/profiles.yaml", "--synthetic", "1", "--scene", "people", "--objects", "8",
		"--duration", "1s", "--listen", "127.0.0.1:0"}, &out, &errb)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	// at least one clip written; not necessarily "ok": on a loaded machine
	// (-race, 2 cores) the encoder may fall behind and drop frames
	line := regexp.MustCompile(`(?m)^clips -> .*: ([1-9][0-9]*) written .* frames recorded; .*$`).FindString(out.String())
	if line == "" {
		t.Fatalf("no clips line with a clip written:\n%s\n%s", out.String(), errb.String())
	}
	mp4s, _ := filepath.Glob(filepath.Join(dir, "clips", "*.mp4"))
	if len(mp4s) == 0 {
		t.Fatalf("no MP4 in %s (%s)", filepath.Join(dir, "clips"), line)
	}
	var sc clips.Sidecar
	b, err := os.ReadFile(strings.TrimSuffix(mp4s[0], ".mp4") + ".json")
	if err == nil {
		err = json.Unmarshal(b, &sc)
	}
	if err != nil || sc.App != "actdet" || sc.Kind != "event" || sc.Event == nil || (sc.Event.Kind != "line-cross" && sc.Event.Kind != "dwell") || sc.Clip.Frames == 0 {
		t.Fatalf("sidecar: %v\n%s", err, b)
	}
	probe, err := exec.LookPath("ffprobe")
	if err != nil {
		if os.Getenv("MDAG_REQUIRE_FFMPEG") != "" {
			t.Fatal("ffprobe not found and MDAG_REQUIRE_FFMPEG is set")
		}
		t.Skip("ffprobe not found")
	}
	p, err := exec.Command(probe, "-v", "error", "-count_frames", "-show_entries", "stream=nb_read_frames,codec_name,width,height", "-of", "csv=p=0", mp4s[0]).CombinedOutput()
	if want := fmt.Sprintf("h264,320,240,%d", sc.Clip.Frames); err != nil || strings.TrimSpace(string(p)) != want {
		t.Errorf("ffprobe: %v %q, want %q", err, p, want)
	}
	t.Logf("%s; ffprobe %s; frames_dropped %d", line, strings.TrimSpace(string(p)), sc.Clip.FramesDropped)
}
