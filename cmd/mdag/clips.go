package main

import (
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/mdag/mdag/clips"
	"github.com/mdag/mdag/coordinator"
	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/internal/clock"
)

// clipRecorder is the app's clips (its `clips:`) and the ticker that ends
// clips whose streams stopped.
type clipRecorder struct {
	*clips.Recorder
	stop chan struct{}
	wg   sync.WaitGroup
}

// startClips starts the app's clips recorder, writing under the section's
// dir, else stateDir's clips/APP, else the user's cache directory's
// mdag/clips/APP. nil when the app has no clips section.
func startClips(app *dag.App, stateDir string, log *slog.Logger) (*clipRecorder, error) {
	if app.Clips == nil {
		return nil, nil
	}
	dir, err := clipsDir(app, stateDir)
	if err != nil {
		return nil, err
	}
	fps := int(math.Round(app.FPS))
	r, err := clips.New(clips.Config{App: string(app.Name), Clips: *app.Clips, Dir: dir, FPS: fps, NewEncoder: newClipEncoder, Clock: clock.Real{}, Log: log})
	if err != nil {
		return nil, fmt.Errorf("%s: clips: %w", app.File, err)
	}
	c := &clipRecorder{Recorder: r, stop: make(chan struct{})}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-c.stop:
				return
			case <-t.C:
				r.Tick()
			}
		}
	}()
	c.Store().Enforce()
	log.Info("clips", "dir", dir, "pre", app.Clips.Pre, "post", app.Clips.Post, "on", app.Clips.On, "max_bytes", app.Clips.MaxBytes.String(), "max_age", app.Clips.MaxAge,
		"existing", len(c.Store().List()))
	return c, nil
}

// Close writes the clips being recorded and stops.
func (c *clipRecorder) Close() {
	close(c.stop)
	c.wg.Wait()
	c.Recorder.Close()
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
