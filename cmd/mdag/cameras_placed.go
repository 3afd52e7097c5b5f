//go:build !lean

package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/ingest"
	"github.com/mdag/mdag/ingest/rtsp"
	"github.com/mdag/mdag/ingest/whip"
	"github.com/mdag/mdag/media"
	"github.com/mdag/mdag/remote"
	"github.com/mdag/mdag/remote/client"
	"github.com/mdag/mdag/remote/wire"
)

// The coordinator's cameras on the ingest workers (issue 41): `mdag
// coordinator --camera` hands its cameras to the gRPC server, which
// assigns each to an ingest worker that reads cameras (this build's
// `mdag worker --ingest-listen`) and moves it when that worker is lost;
// the coordinator reads a camera itself only while no such worker is
// connected (remote/cameras.go).

// place hands the flags' cameras to srv (nil when none is given). Those no
// worker takes are read here, into the ingest server of obs, once no
// worker that reads cameras has been connected for grace; motion: the
// readers estimate objects by motion for emulated detectors.
func (cf *cameraFlags) place(app *dag.App, obs *observed, srv *remote.Server, motion bool, grace time.Duration, log *slog.Logger) (*cameraRun, error) {
	cams, err := cf.list(string(app.Name))
	if err != nil || len(cams) == 0 {
		return nil, err
	}
	byName := map[string]rtsp.Camera{}
	rc := make([]remote.Camera, len(cams))
	for i, c := range cams {
		byName[c.Name] = c
		rc[i] = remote.Camera{Name: c.Name, App: c.App, URL: c.URL, Transport: c.Transport, FPS: c.FPS, Motion: motion}
	}
	var local func(remote.Camera) (remote.CameraReader, error)
	if feeds, ok := obs.ws.(ingest.Feeds); ok {
		local = func(c remote.Camera) (remote.CameraReader, error) {
			m, err := rtsp.Start(context.Background(), []rtsp.Camera{byName[c.Name]}, feeds, rtsp.Options{Log: log})
			if err != nil {
				return nil, err
			}
			return &rtspReader{m: m}, nil
		}
	}
	cf.logCameras(cams, log)
	run := &cameraRun{placed: srv, sources: map[string]string{}}
	for _, c := range cams {
		run.sources[c.Name] = c.Source()
	}
	run.stopPlaced = srv.StartCameras(rc, local, grace)
	run.observe(obs)
	return run, nil
}

// rtspReader is a camera read by an rtsp.Manager of its own.
type rtspReader struct {
	m    *rtsp.Manager
	once sync.Once
}

func (r *rtspReader) Stop() { r.once.Do(r.m.Close) }

func (r *rtspReader) Report() wire.CameraReport {
	st := r.m.Status()
	if len(st) == 0 {
		return wire.CameraReport{State: string(rtsp.Stopped)}
	}
	return reportOf(st[0])
}

// reportOf is a camera's status as the coordinator keeps it.
func reportOf(s rtsp.CameraStatus) wire.CameraReport {
	return wire.CameraReport{State: string(s.State), Codec: s.Codec, Transport: s.Transport, Frames: s.Frames, Lost: s.Lost,
		Reconnects: s.Reconnects, CameraLost: s.CameraLost, LastError: s.LastError, Down: s.Down, LastGap: s.LastGap}
}

// workerCameras reads the cameras the coordinator assigns this worker:
// each is read by an RTSP reader into an ingest server of its own (no
// HTTP listener) whose streams join through the worker's session
// (IngestServer.OpenLocal).
func workerCameras(log *slog.Logger) client.CameraReader {
	return func(a client.CameraAssignment, g *client.IngestServer) (client.CameraReading, error) {
		cam := rtsp.Camera{Name: a.Stream, URL: a.URL, App: a.App, FPS: a.FPS, Transport: a.Transport}
		if err := rtsp.Check([]rtsp.Camera{cam}, []string{a.App}); err != nil {
			return nil, err
		}
		// the coordinator placed the camera here: this worker's CPU
		// admission neither refuses nor sheds it (a worker busy with
		// modules would refuse it for ever)
		cfg := whip.Config{Apps: map[dag.AppID]float64{dag.AppID(a.App): a.FPS}, Scale: scaler, MaxWidth: a.MaxW, MaxHeight: a.MaxH, Log: log,
			CPUCeiling: 1, StreamCost: 0.001, ShedAfter: -1}
		if a.Motion {
			cfg.Objects = motionObjects
		}
		sink := &localSink{g: g, open: map[string]*client.LocalStream{}}
		srv, err := whip.New(cfg, sink)
		if err != nil {
			return nil, err
		}
		m, err := rtsp.Start(context.Background(), []rtsp.Camera{cam}, srv, rtsp.Options{Log: log})
		if err != nil {
			srv.Close()
			return nil, err
		}
		log.Info("camera", "name", cam.Name, "source", cam.Source(), "app", cam.App, "transport", orAuto(cam.Transport), "assigned_by", "coordinator")
		return &workerCamera{rtspReader: rtspReader{m: m}, srv: srv}, nil
	}
}

// workerCamera is a camera a worker reads: its reader, then its server.
type workerCamera struct {
	rtspReader
	srv *whip.Server
}

func (w *workerCamera) Stop() {
	w.rtspReader.Stop()
	w.srv.Close()
}

// localSink is a worker camera's ingest server's Sink: its stream joins
// through the worker's session and its frames stay in the worker's store.
type localSink struct {
	g    *client.IngestServer
	mu   sync.Mutex
	open map[string]*client.LocalStream
}

func (s *localSink) Join(app dag.AppID, stream string) error {
	ls, err := s.g.OpenLocal(string(app), stream)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if old := s.open[stream]; old != nil {
		old.Close()
	}
	s.open[stream] = ls
	return nil
}

func (s *localSink) Leave(stream string) error {
	s.mu.Lock()
	ls := s.open[stream]
	delete(s.open, stream)
	s.mu.Unlock()
	if ls == nil {
		return fmt.Errorf("stream %s is not open", stream)
	}
	ls.Close()
	return nil
}

func (s *localSink) Ingest(stream string, seq uint64, capture time.Time, f *media.Frame, truth []media.Box) error {
	s.mu.Lock()
	ls := s.open[stream]
	s.mu.Unlock()
	if ls == nil {
		return errors.New("stream " + stream + " is not open")
	}
	return ls.Frame(seq, capture, f, truth)
}
