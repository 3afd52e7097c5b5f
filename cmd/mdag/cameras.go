//go:build !lean

package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/ingest"
	"github.com/mdag/mdag/ingest/rtsp"
)

// cameraFlags are serve's and coordinator's RTSP camera flags: --camera
// (repeatable) and --cameras FILE.
type cameraFlags struct {
	urls *cameraList
	file *string
}

// cameraList is --camera: one [NAME=]URL per use. It keeps the values as
// given (they hold passwords) and shows none of them: Set never fails,
// because the flag package would quote the value, password and all, in its
// error; list checks them and says what is wrong without it.
type cameraList []string

func (c *cameraList) String() string { return "" }

func (c *cameraList) Set(v string) error {
	*c = append(*c, v)
	return nil
}

func addCameraFlags(fs *flag.FlagSet) *cameraFlags {
	cf := &cameraFlags{urls: &cameraList{}}
	fs.Var(cf.urls, "camera", "an RTSP camera to read into the app: rtsp://[user:password@]host[:port]/path or NAME=URL, repeatable "+
		"(H.264 or H.265; named after host and path unless NAME= is given; reconnects when it goes away)")
	cf.file = fs.String("cameras", "", "a cameras YAML `file` (cameras: [{name, url, app, fps, transport}]); see the README's Cameras section")
	return cf
}

// list is every camera of the flags, each checked, for app.
func (cf *cameraFlags) list(app *dag.App) ([]rtsp.Camera, error) {
	apps := []string{string(app.Name)}
	var cams []rtsp.Camera
	if *cf.file != "" {
		c, err := rtsp.ParseCameras(*cf.file, apps)
		if err != nil {
			return nil, err
		}
		cams = c
	}
	for _, v := range *cf.urls {
		c, err := rtsp.ParseFlag(v, string(app.Name), 0)
		if err != nil {
			return nil, err
		}
		cams = append(cams, c)
	}
	if err := rtsp.Check(cams, apps); err != nil {
		return nil, err
	}
	return cams, nil
}

// cameraRun is the cameras a command reads; nil when it has none.
type cameraRun struct {
	m    *rtsp.Manager
	once sync.Once
}

// start reads the flags' cameras into the WHIP server of obs (the ingest
// server: every camera is a stream of app like a WHIP one). Call it after
// the server is up; Stop before the server closes.
func (cf *cameraFlags) start(cmd string, app *dag.App, obs *observed, log *slog.Logger) (*cameraRun, error) {
	cams, err := cf.list(app)
	if err != nil {
		return nil, err // file:line or the camera's name says where
	}
	if len(cams) == 0 {
		return nil, nil
	}
	feeds, ok := obs.ws.(ingest.Feeds)
	if !ok {
		return nil, fmt.Errorf("mdag %s: --camera: this build's ingest server takes no camera feeds", cmd)
	}
	m, err := rtsp.Start(context.Background(), cams, feeds, rtsp.Options{Log: log})
	if err != nil {
		return nil, fmt.Errorf("mdag %s: %w", cmd, err)
	}
	for _, c := range cams {
		log.Info("camera", "name", c.Name, "source", c.Source(), "app", c.App, "transport", orAuto(c.Transport))
	}
	return &cameraRun{m: m}, nil
}

func orAuto(t string) string {
	if t == "" {
		return "auto"
	}
	return t
}

// Stop closes every camera (their feeds end with kind shutdown); it is safe
// on nil and more than once.
func (r *cameraRun) Stop() {
	if r == nil {
		return
	}
	r.once.Do(r.m.Close)
}

// Status is every camera's status (nil: none).
func (r *cameraRun) Status() []rtsp.CameraStatus {
	if r == nil {
		return nil
	}
	return r.m.Status()
}

// writeCameraTable prints the cameras' status: state, frames, losses,
// reconnects, camera-lost events, the last gap and the last error.
func writeCameraTable(w io.Writer, cams []rtsp.CameraStatus) {
	if len(cams) == 0 {
		return
	}
	fmt.Fprintln(w, "cameras:")
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  CAMERA\tSTATE\tCODEC\tFRAMES\tLOST\tRECONNECTS\tCAMERA-LOST\tLAST GAP\tSOURCE\tLAST ERROR")
	for _, c := range cams {
		gap := "-"
		if c.LastGap > 0 {
			gap = c.LastGap.Round(time.Millisecond).String()
		}
		codec := c.Codec
		if codec == "" {
			codec = "-"
		} else if c.Transport != "" {
			codec += "/" + c.Transport
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%d\t%d\t%d\t%d\t%s\t%s\t%s\n", c.Name, c.State, codec, c.Frames, c.Lost, c.Reconnects, c.CameraLost,
			gap, c.Source, strings.TrimPrefix(c.LastError, "camera "+c.Name+": "+c.Source+": "))
	}
	tw.Flush()
}

// checkCamerasFile is `mdag validate --cameras FILE`: the file against
// the apps of -f.
func checkCamerasFile(path string, apps []string) (string, error) {
	cams, err := rtsp.ParseCameras(path, apps)
	if err != nil {
		return "", err
	}
	names := make([]string, len(cams))
	for i, c := range cams {
		names[i] = c.Name
	}
	return fmt.Sprintf("%s: %d cameras valid (%s)", path, len(cams), strings.Join(names, ", ")), nil
}
