//go:build !lean

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc"

	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/ingest"
	"github.com/mdag/mdag/ingest/rtsp"
	"github.com/mdag/mdag/ingest/whip"
	"github.com/mdag/mdag/media"
	"github.com/mdag/mdag/observe/metrics"
	"github.com/mdag/mdag/remote"
	"github.com/mdag/mdag/remote/source"
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
func (cf *cameraFlags) list(app string) ([]rtsp.Camera, error) {
	apps := []string{app}
	var cams []rtsp.Camera
	if *cf.file != "" {
		c, err := rtsp.ParseCameras(*cf.file, apps)
		if err != nil {
			return nil, err
		}
		cams = c
	}
	for _, v := range *cf.urls {
		c, err := rtsp.ParseFlag(v, app, 0)
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

// cameraRun is the cameras a command reads (m), or, on the coordinator,
// places on the ingest workers (placed); nil when it has none.
type cameraRun struct {
	m          *rtsp.Manager
	placed     *remote.Server
	stopPlaced func()
	sources    map[string]string // placed cameras' URLs without passwords
	once       sync.Once
}

// start reads the flags' cameras into the WHIP server of obs (the ingest
// server: every camera is a stream of app like a WHIP one). Call it after
// the server is up; Stop before the server closes.
func (cf *cameraFlags) start(app *dag.App, obs *observed, log *slog.Logger) (*cameraRun, error) {
	run, err := cf.startOn(string(app.Name), obs.ws, log)
	run.observe(obs)
	return run, err
}

// observe shows the cameras' states in the metrics and the ingest
// server's status (the dashboard).
func (r *cameraRun) observe(obs *observed) {
	if r == nil {
		return
	}
	obs.mx.SetCameras(func() []metrics.Camera {
		st := r.Status()
		out := make([]metrics.Camera, len(st))
		for i, c := range st {
			out[i] = metrics.Camera{App: c.App, State: string(c.State), Reconnects: c.Reconnects}
		}
		return out
	})
	if ws, ok := obs.ws.(*whip.Server); ok && r.placed != nil {
		ws.SetCameras(func() []ingest.Camera { return ingestCameras(r.Status()) })
	}
}

// startOn reads the flags' cameras into server, which must be an
// ingest.Feeds.
func (cf *cameraFlags) startOn(app string, server any, log *slog.Logger) (*cameraRun, error) {
	cams, err := cf.list(app)
	if err != nil {
		return nil, err // file:line or the camera's name says where
	}
	if len(cams) == 0 {
		return nil, nil
	}
	feeds, ok := server.(ingest.Feeds)
	if !ok {
		return nil, errors.New("--camera: this build's ingest server takes no camera feeds")
	}
	m, err := rtsp.Start(context.Background(), cams, feeds, rtsp.Options{Log: log})
	if err != nil {
		return nil, err
	}
	run := &cameraRun{m: m}
	if ws, ok := server.(*whip.Server); ok {
		ws.SetCameras(func() []ingest.Camera { return ingestCameras(run.Status()) })
	}
	cf.logCameras(cams, log)
	return run, nil
}

// logCameras says which cameras are read, and warns of a password on the
// command line.
func (cf *cameraFlags) logCameras(cams []rtsp.Camera, log *slog.Logger) {
	for _, c := range cams {
		log.Info("camera", "name", c.Name, "source", c.Source(), "app", c.App, "transport", orAuto(c.Transport))
	}
	for _, v := range *cf.urls {
		if rtsp.PasswordInline(v) {
			log.Warn("a --camera password is on the command line, where every user of this machine can read it (ps): give it as ${VAR} "+
				"from the environment ('rtsp://user:${CAM_PASSWORD}@host/path', quoted) or in a --cameras file", "camera", rtsp.Redact(v))
		}
	}
}

// runSource is `mdag source --camera/--cameras`, the distributed mode:
// the cameras are read and decoded here, by a local ingest server without
// an HTTP listener, sampled to fps, and their frames go to the coordinator
// over gRPC (source.Forwarder), one Ingest call per camera: to the
// ingest worker the coordinator routes each to when dialIngest is set
// (mdag source --ingest route, issue 41), else to the coordinator. It
// reports false when no camera flag was given, and the error it ended
// with.
func (cf *cameraFlags) runSource(ctx context.Context, app string, fps float64, cc *grpc.ClientConn, dialIngest func(string) (*grpc.ClientConn, error), prefix string, stdout, stderr io.Writer) (bool, error) {
	if len(*cf.urls) == 0 && *cf.file == "" {
		return false, nil
	}
	log := newLogger(stderr, false)
	fwd := source.NewRoutedForwarder(cc, dialIngest)
	srv, err := whip.New(whip.Config{Apps: map[dag.AppID]float64{dag.AppID(app): fps}, Scale: scaler, Log: log}, forwardSink{fwd, prefix})
	if err != nil {
		return true, invalid(err)
	}
	run, err := cf.startOn(app, srv, log)
	if err != nil {
		srv.Close()
		return true, invalid(err)
	}
	log.Info("reading cameras", "app", app, "fps", fps, "cameras", len(run.Status()))
	<-ctx.Done()
	run.Stop()
	srv.Close()
	if err := fwd.Close(); err != nil {
		log.Warn("forwarding ended with errors", "err", err)
	}
	writeCameraTable(stdout, run.Status())
	return true, nil
}

// forwardSink is the local ingest server's Sink in `mdag source`: its
// streams go to the coordinator, named prefix+camera (with TLS, the
// source certificate's "NAME/": the streams it may join).
type forwardSink struct {
	f      *source.Forwarder
	prefix string
}

func (s forwardSink) Join(app dag.AppID, stream string) error {
	return s.f.Join(string(app), s.prefix+stream)
}
func (s forwardSink) Leave(stream string) error { return s.f.Leave(s.prefix + stream) }
func (s forwardSink) Ingest(stream string, seq uint64, capture time.Time, f *media.Frame, truth []media.Box) error {
	return s.f.Ingest(s.prefix+stream, seq, capture, f, truth)
}

// ingestCameras is the cameras' status as the ingest server reports it.
func ingestCameras(st []cameraRow) []ingest.Camera {
	out := make([]ingest.Camera, len(st))
	for i, c := range st {
		out[i] = ingest.Camera{Name: c.Name, App: c.App, Source: c.Source, Codec: c.Codec, State: string(c.State),
			Reconnects: c.Reconnects, CameraLost: c.CameraLost, LastError: c.LastError, Down: c.Down, ReadBy: c.On}
	}
	return out
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
	r.once.Do(func() {
		if r.m != nil {
			r.m.Close()
		}
		if r.stopPlaced != nil {
			r.stopPlaced()
		}
	})
}

// cameraRow is a camera's status and, for the coordinator's, who reads
// it.
type cameraRow struct {
	rtsp.CameraStatus
	On string // a worker, "coordinator", or "" (waiting; or not placed)
}

// Status is every camera's status (nil: none).
func (r *cameraRun) Status() []cameraRow {
	switch {
	case r == nil:
		return nil
	case r.placed == nil:
		st := r.m.Status()
		out := make([]cameraRow, len(st))
		for i, c := range st {
			out[i] = cameraRow{CameraStatus: c}
		}
		return out
	}
	ps := r.placed.CameraPlaces()
	out := make([]cameraRow, len(ps))
	for i, p := range ps {
		out[i] = cameraRow{On: p.On, CameraStatus: rtsp.CameraStatus{Name: p.Name, App: p.App, Source: r.sources[p.Name], Codec: p.Codec,
			Transport: p.Transport, State: rtsp.State(p.State), Reconnects: p.Reconnects, CameraLost: p.CameraLost, Frames: p.Frames,
			Lost: p.Lost, LastError: p.LastError, LastGap: p.LastGap, Down: p.Down}}
		if p.On == "" {
			out[i].On = "-"
		}
	}
	return out
}

// writeCameraTable prints the cameras' status: state, frames, losses,
// reconnects, camera-lost events, the last gap and the last error.
func writeCameraTable(w io.Writer, cams []cameraRow) {
	if len(cams) == 0 {
		return
	}
	fmt.Fprintln(w, "cameras:")
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	placed := cams[0].On != ""
	head := "  CAMERA\tSTATE\tCODEC\tFRAMES\tLOST\tRECONNECTS\tCAMERA-LOST\tLAST GAP\tSOURCE\tLAST ERROR"
	if placed {
		head += "\tREAD BY"
	}
	fmt.Fprintln(tw, head)
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
		last := strings.TrimPrefix(c.LastError, "camera "+c.Name+": "+c.Source+": ")
		if placed {
			if last == "" {
				last = "-"
			}
			last += "\t" + c.On
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%d\t%d\t%d\t%d\t%s\t%s\t%s\n", c.Name, c.State, codec, c.Frames, c.Lost, c.Reconnects, c.CameraLost,
			gap, c.Source, last)
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
