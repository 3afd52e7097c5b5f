package dag_test

import (
	"strings"
	"testing"
	"time"

	"github.com/mdag/mdag/dag"
)

const activityApp = `app: t
slo: 400ms
modules:
  - name: detect
    kind: gpu
    model: ssd
    inputs: [source]
  - name: act
    kind: cpu
    op: activity
    inputs: [detect]
    params:
      rules: ["line door 1,2,3,4", "zone desk 0,0,10,10 dwell 2s"]
`

// TestClipsDefaults: a clips section with nothing in it gets the
// documented defaults; no section, no clips.
func TestClipsDefaults(t *testing.T) {
	app, err := dag.Parse("app.yaml", []byte(activityApp+"clips: {}\n"))
	if err != nil {
		t.Fatal(err)
	}
	c := app.Clips
	if c.Pre != 5*time.Second || c.Post != 5*time.Second || c.MaxLength != time.Minute || c.MaxBytes != 1<<30 ||
		c.MaxAge != 168*time.Hour || c.PerMinute != 6 || c.BitrateKbps != 1000 || len(c.On) != 0 || c.Dir != "" {
		t.Errorf("defaults: %+v", *c)
	}
	if !c.ClipOn("loiter", "x") {
		t.Error("no on: every event should clip")
	}
	app, err = dag.Parse("app.yaml", []byte(activityApp+"clips: {pre: 2s, post: 0s, on: [door, dwell], max_bytes: 10MiB, max_age: 1h, max_clips_per_stream_per_minute: 2}\n"))
	if err != nil {
		t.Fatal(err)
	}
	c = app.Clips
	if c.Pre != 2*time.Second || c.Post != 0 || c.MaxBytes != 10<<20 || c.MaxAge != time.Hour || c.PerMinute != 2 {
		t.Errorf("given: %+v", *c)
	}
	if !c.ClipOn("line-cross", "door") || !c.ClipOn("dwell", "desk") || c.ClipOn("line-cross", "gate") {
		t.Error("ClipOn: want kinds and rules named in on")
	}
	if app, err := dag.Parse("app.yaml", []byte(activityApp)); err != nil || app.Clips != nil {
		t.Errorf("no clips section: %v %v", app, err)
	}
}

// TestClipsErrors: each problem of a clips section is reported with its
// line and field path.
func TestClipsErrors(t *testing.T) {
	for _, c := range []struct {
		yaml string
		want string
	}{
		{`{pre: -1s}`, "app.yaml:14: clips.pre: -1s: want 0 to 1m0s"},
		{`{post: 2m}`, "clips.post: 2m0s: want 0 to 1m0s"},
		{`{max_length: 5s}`, "clips.max_length: 5s: want pre+post (10s) to 10m0s"},
		{`{max_bytes: 1KiB}`, "clips.max_bytes: 1KiB: want 1MiB to 1TiB"},
		{`{max_bytes: lots}`, `clips.max_bytes: "lots": want bytes`},
		{`{max_age: 10s}`, "clips.max_age: 10s: want at least 1m"},
		{`{max_clips_per_stream_per_minute: 100}`, "clips.max_clips_per_stream_per_minute: 100: want 1 to 60"},
		{`{bitrate_kbps: 5}`, "clips.bitrate_kbps: 5: want 100 to 50000"},
		{`{on: [line-cros]}`, `clips.on[0]: "line-cros": not an event kind (line-cross, dwell, loiter) nor a rule of the app's activity modules (did you mean "line-cross"?)`},
		{`{on: [dor]}`, `(did you mean "door"?)`},
		{`{on: [dwell, dwell]}`, `clips.on[1]: "dwell" given twice`},
		{`{on: ["a b"]}`, `clips.on[0]: "a b": want an event kind or a rule name`},
		{`{size: 1}`, "clips.size"},
	} {
		_, err := dag.Parse("app.yaml", []byte(activityApp+"clips: "+c.yaml+"\n"))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("clips: %s\n got %v\nwant %q", c.yaml, err, c.want)
		}
	}
	_, err := dag.Parse("app.yaml", []byte(strings.Replace(activityApp, "slo: 400ms", "slo: 400ms\nmedia: audio", 1)+"clips: {}\n"))
	if err == nil || !strings.Contains(err.Error(), "clips: clips are video") {
		t.Errorf("audio app: %v", err)
	}
}

// TestClipsRollDefaults: pre and post default each on its own; an
// explicit 0s is kept.
func TestClipsRollDefaults(t *testing.T) {
	for _, c := range []struct {
		yaml      string
		pre, post time.Duration
	}{
		{`{pre: 2s}`, 2 * time.Second, 5 * time.Second},
		{`{post: 3s}`, 5 * time.Second, 3 * time.Second},
		{`{pre: 0s}`, 0, 5 * time.Second},
		{`{post: 0s}`, 5 * time.Second, 0},
		{`{pre: 0s, post: 0s}`, 0, 0},
		{`{}`, 5 * time.Second, 5 * time.Second},
	} {
		app, err := dag.Parse("app.yaml", []byte(activityApp+"clips: "+c.yaml+"\n"))
		if err != nil {
			t.Fatalf("%s: %v", c.yaml, err)
		}
		if app.Clips.Pre != c.pre || app.Clips.Post != c.post {
			t.Errorf("%s: pre %v post %v, want %v %v", c.yaml, app.Clips.Pre, app.Clips.Post, c.pre, c.post)
		}
	}
}
