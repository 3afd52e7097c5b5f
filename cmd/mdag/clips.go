package main

import (
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/mdag/mdag/clips"
	"github.com/mdag/mdag/coordinator"
	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/observe/dashboard"
	"github.com/mdag/mdag/observe/metrics"
)

// clipRecorder is the app's clips (its `clips:`) and the ticker that ends
// clips whose streams stopped.
type clipRecorder struct {
	*clips.Recorder
	app      string
	maxBytes dag.Bytes
	stop     chan struct{}
	wg       sync.WaitGroup
	once     sync.Once
}

// startClips starts the app's clips recorder, writing under the section's
// dir, else stateDir's clips/APP, else the user's cache directory's
// mdag/clips/APP. nil when the app has no clips section; an error in the
// lean build, which cannot encode them.
func startClips(app *dag.App, stateDir string, log *slog.Logger) (*clipRecorder, error) {
	if app.Clips == nil {
		return nil, nil
	}
	if err := clipsBuilt(app); err != nil {
		return nil, err
	}
	dir, err := clipsDir(app, stateDir)
	if err != nil {
		return nil, err
	}
	fps := int(math.Round(app.FPS))
	r, err := clips.New(clips.Config{App: string(app.Name), Clips: *app.Clips, Dir: dir, FPS: fps, SLO: app.SLO,
		NewEncoder: newClipEncoder, Clock: clock.Real{}, Log: log})
	if err != nil {
		return nil, fmt.Errorf("%s: clips: %w", app.File, err)
	}
	c := &clipRecorder{Recorder: r, app: string(app.Name), maxBytes: app.Clips.MaxBytes, stop: make(chan struct{})}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		t := time.NewTicker(time.Second)
		defer t.Stop()
		enforced := time.Now()
		for {
			select {
			case <-c.stop:
				return
			case now := <-t.C:
				r.Tick()
				if now.Sub(enforced) >= time.Minute { // max_age, when no clip is written
					r.Store().Enforce()
					enforced = now
				}
			}
		}
	}()
	c.Store().Enforce()
	log.Info("clips", "dir", dir, "pre", app.Clips.Pre, "post", app.Clips.Post, "on", app.Clips.On, "max_bytes", app.Clips.MaxBytes.String(), "max_age", app.Clips.MaxAge,
		"existing", len(c.Store().List()))
	return c, nil
}

// Close writes the clips being recorded and stops; the clips on disk are
// still listed and served. It may be called more than once.
func (c *clipRecorder) Close() {
	c.once.Do(func() {
		close(c.stop)
		c.wg.Wait()
		c.Recorder.Close()
	})
}

// metrics is the recorder's figures for /metrics.
func (c *clipRecorder) metrics() metrics.Clips {
	s := c.Stats()
	_, stored := c.Store().Usage()
	return metrics.Clips{App: c.app, Streams: s.Streams, Frames: s.Frames, FramesDropped: s.FramesDropped, EncodeErrors: s.EncodeErrors,
		Written: s.Clips, WrittenBytes: s.ClipBytes, WriteErrors: s.WriteErrors, Limited: s.Limited, Missed: s.Missed,
		RemovedForBytes: s.ForBytes, RemovedForAge: s.ForAge, RemovedBytes: s.RemovedBytes, RingDrops: s.RingDrops, StoredBytes: stored}
}

// status is the clips' state for the dashboard: the counters and the
// latest 10 clips.
func (c *clipRecorder) status() *dashboard.Clips {
	s := c.Stats()
	n, b := c.Store().Usage()
	d := &dashboard.Clips{Dir: c.Store().Dir(), Streams: s.Streams, Frames: s.Frames, FramesDropped: s.FramesDropped, EncodeErrors: s.EncodeErrors,
		Events: s.Events, Limited: s.Limited, Missed: s.Missed, Written: s.Clips, WriteErrors: s.WriteErrors, RingDrops: s.RingDrops,
		RemovedBytes: s.ForBytes, RemovedAge: s.ForAge, OnDisk: n, DiskBytes: b, MaxBytes: int64(c.maxBytes), Latest: []dashboard.ClipItem{}}
	list := c.Store().List()
	for _, i := range list[:min(len(list), 10)] {
		it := dashboard.ClipItem{Name: i.Name, Stream: i.Stream, Start: i.Start.UnixMilli(), Seconds: i.Seconds, Frames: i.Frames, FramesDropped: i.FramesDropped, Events: len(i.Events)}
		if len(i.Events) > 0 {
			it.Event = i.Events[0].Kind
			if i.Events[0].Rule != "" {
				it.Event += " " + i.Events[0].Rule
			}
		}
		d.Latest = append(d.Latest, it)
	}
	return d
}

// writeClipLine is serve's and the coordinator's summary of the event
// clips: what was written and is on disk, what retention removed, the
// events that made no clip and the video not recorded; DEGRADED, with
// why, when anything was lost.
func writeClipLine(w io.Writer, c *clipRecorder) {
	if c == nil {
		return
	}
	s := c.Stats()
	n, b := c.Store().Usage()
	var lost []string
	if s.FramesDropped > 0 {
		lost = append(lost, fmt.Sprintf("%d frames not recorded: the encoder behind", s.FramesDropped))
	}
	if s.EncodeErrors > 0 {
		lost = append(lost, fmt.Sprintf("%d frames not recorded: errors", s.EncodeErrors))
	}
	if s.WriteErrors > 0 {
		lost = append(lost, fmt.Sprintf("%d clips lost: write errors", s.WriteErrors))
	}
	if s.RingDrops > 0 {
		lost = append(lost, fmt.Sprintf("%d GOPs dropped from the rings: less pre-roll", s.RingDrops))
	}
	state := "ok"
	if len(lost) > 0 {
		state = "DEGRADED: " + strings.Join(lost, ", ")
	}
	fmt.Fprintf(w, "clips -> %s: %d written (%d bytes), %d on disk (%d bytes); %d removed by retention (%d for max_bytes, %d for max_age); %d events (%d skipped by the per-minute limit, %d with no video); %d frames recorded; %s\n",
		c.Store().Dir(), s.Clips, s.ClipBytes, n, b, s.Removed, s.ForBytes, s.ForAge, s.Events, s.Limited, s.Missed, s.Frames, state)
}

// onFrame hands a result's events to the recorder.
func (c *clipRecorder) onFrame(r coordinator.FrameResult) {
	for _, e := range r.Events {
		c.Event(r.Stream, r.Seq, time.Time{}, e)
	}
}

func clipsDir(app *dag.App, stateDir string) (string, error) {
	if app.Clips.Dir != "" {
		return appPath(app, app.Clips.Dir), nil
	}
	if stateDir != "" {
		return filepath.Join(stateDir, "clips", string(app.Name)), nil
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("clips: no clips.dir, no --state and %v", err)
	}
	return filepath.Join(cache, "mdag", "clips", string(app.Name)), nil
}

// clipJSON is one clip in GET /v1/clips.
type clipJSON struct {
	clips.Info
	URL  string `json:"url"`
	JSON string `json:"json_url"`
}

// clipsList is GET /v1/clips: the clips, newest first ([] when the app
// has none or no clips section).
func clipsList(c func() *clipRecorder) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		out := []clipJSON{}
		if rec := c(); rec != nil {
			for _, i := range rec.Store().List() {
				base := i.Name[:len(i.Name)-len(".mp4")]
				out = append(out, clipJSON{Info: i, URL: "/v1/clips/" + i.Name, JSON: "/v1/clips/" + base + ".json"})
			}
		}
		w.Header().Set("Content-Type", "application/json")
		writeJSON(w, out, true)
	})
}

// clipFile is GET /v1/clips/{name}: a clip's MP4 (with Range) or JSON.
func clipFile(c func() *clipRecorder) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := c()
		name := r.PathValue("name")
		if rec == nil {
			http.Error(w, "no clips: the app has no clips section", http.StatusNotFound)
			return
		}
		path, _, ok := rec.Store().Path(name)
		if !ok {
			http.Error(w, fmt.Sprintf("no clip %q (GET /v1/clips lists them)", name), http.StatusNotFound)
			return
		}
		f, err := os.Open(path)
		if err != nil { // removed by retention since
			http.Error(w, fmt.Sprintf("clip %q: %v", name, err), http.StatusNotFound)
			return
		}
		defer f.Close()
		st, err := f.Stat()
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		ct := "video/mp4"
		if filepath.Ext(name) == ".json" {
			ct = "application/json"
		}
		w.Header().Set("Content-Type", ct)
		w.Header().Set("Cache-Control", "private, max-age=3600")
		http.ServeContent(w, r, name, st.ModTime(), f)
	})
}
