//go:build !lean

package main

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
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
