//go:build !lean

package main

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/ingest/whip"
	"github.com/mdag/mdag/remote"
	"github.com/mdag/mdag/remote/client"
)

// WHIP on the ingest workers (issue 41): the coordinator's WHIP endpoint
// keeps the signalling and hands each video offer to an ingest worker
// (remote.Server.OfferWhip), whose answer carries the worker's ICE
// candidates: the media goes to the worker, never through the
// coordinator, and a client needs no redirect support. With no such worker
// connected, the coordinator takes the stream itself, as before.

// whipDelegator is the coordinator's whip.Delegator: its gRPC server once
// it serves (before that, streams are taken here).
type whipDelegator struct {
	srv    atomic.Pointer[remote.Server]
	motion bool
}

func (d *whipDelegator) Delegate(ctx context.Context, app dag.AppID, id string, offer []byte, caps whip.DelegateCaps) ([]byte, string, error) {
	s := d.srv.Load()
	if s == nil {
		return nil, "", whip.ErrNotDelegated
	}
	answer, worker, err := s.OfferWhip(ctx, remote.WhipOffer{App: string(app), Stream: id, SDP: offer, FPS: caps.FPS, MaxW: caps.MaxW, MaxH: caps.MaxH, Motion: d.motion})
	var se *remote.StatusError
	switch {
	case errors.Is(err, remote.ErrNoWhipWorker):
		return nil, "", whip.ErrNotDelegated
	case errors.As(err, &se):
		return nil, "", &whip.StatusError{Code: se.Code, Msg: se.Msg}
	}
	return answer, worker, err
}

func (d *whipDelegator) Result(id string, r whip.Result) {
	if s := d.srv.Load(); s != nil {
		b, err := json.Marshal(r)
		if err == nil {
			s.WhipResult(id, b)
		}
	}
}

func (d *whipDelegator) End(id string) {
	if s := d.srv.Load(); s != nil {
		s.EndWhip(id)
	}
}

// delegating makes the WHIP server this flag set builds hand its offers to
// ingest workers (the coordinator); the func binds the gRPC server once it
// is made, and ends a delegated stream when its worker says it ended.
func (wf *whipFlags) delegating() func(*remote.Server, *observed) {
	d := &whipDelegator{motion: wf.motion()}
	wf.delegate = d
	return func(srv *remote.Server, obs *observed) {
		ws, _ := obs.ws.(*whip.Server)
		srv.OnWhipEnded = func(stream, kind, why string) {
			if ws != nil {
				ws.EndDelegated(stream, endKindOf(kind), why)
			}
		}
		d.srv.Store(srv)
	}
}

// endKinds are the end kinds a worker may report of a delegated stream;
// any other (or none: the worker was lost) is whip.EndWorker.
var endKinds = []string{whip.EndClient, whip.EndIdle, whip.EndConnectTimeout, whip.EndICEFailed, whip.EndJoinFailed,
	whip.EndStreamLimit, whip.EndCapacity, whip.EndOverload, whip.EndError, whip.EndSetupFailed, whip.EndShutdown}

func endKindOf(kind string) string {
	if slices.Contains(endKinds, kind) {
		return kind
	}
	return whip.EndWorker
}

// workerWhip is an ingest worker's client.WhipIngest: a WHIP server
// without an HTTP listener for each app (and object estimate) whose
// streams join through the worker's session (localSink).
type workerWhip struct {
	g   *client.IngestServer
	log *slog.Logger
	net whipNet

	mu      sync.Mutex
	servers map[whipKey]*whip.Server
	streams map[string]*whip.Server
	early   map[string]bool // ended by the coordinator while being answered
}

type whipKey struct {
	app    string
	motion bool
}

func newWorkerWhip(g *client.IngestServer, log *slog.Logger) *workerWhip {
	return &workerWhip{g: g, log: log, servers: map[whipKey]*whip.Server{}, streams: map[string]*whip.Server{}, early: map[string]bool{}}
}

func (w *workerWhip) server(o client.WhipDelegated) (*whip.Server, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	k := whipKey{o.App, o.Motion}
	if srv := w.servers[k]; srv != nil {
		return srv, nil
	}
	cfg := whip.Config{Apps: map[dag.AppID]float64{dag.AppID(o.App): o.FPS}, Scale: scaler, Log: w.log, OnEnded: w.ended,
		UDPPortMin: w.net.udpMin, UDPPortMax: w.net.udpMax}
	if w.net.publicIP != "" {
		cfg.PublicIPs = []string{w.net.publicIP}
	}
	if o.Motion {
		cfg.Objects = motionObjects
	}
	srv, err := whip.New(cfg, &localSink{g: w.g, open: map[string]*client.LocalStream{}})
	if err != nil {
		return nil, err
	}
	w.servers[k] = srv
	return srv, nil
}

func (w *workerWhip) Accept(o client.WhipDelegated) (string, int, error) {
	srv, err := w.server(o)
	if err != nil {
		return "", 500, err
	}
	w.mu.Lock()
	w.streams[o.Stream] = srv
	w.mu.Unlock()
	answer, code, err := srv.Accept(dag.AppID(o.App), o.Stream, o.SDP, whip.DelegateCaps{FPS: o.FPS, MaxW: o.MaxW, MaxH: o.MaxH})
	w.mu.Lock()
	ended := w.early[o.Stream]
	delete(w.early, o.Stream)
	if err != nil {
		delete(w.streams, o.Stream)
	}
	w.mu.Unlock()
	if err == nil && ended {
		srv.End(o.Stream) // the coordinator ended it while it was answered
	}
	return answer, code, err
}

// ended tells the coordinator a delegated stream ended here.
func (w *workerWhip) ended(id, kind, why string) {
	w.mu.Lock()
	_, ok := w.streams[id]
	delete(w.streams, id)
	w.mu.Unlock()
	if ok {
		w.g.WhipEnded(id, kind, why)
	}
}

// Result hands a result the coordinator forwarded to its stream's
// DataChannel here; one that does not parse, or of no stream here, is
// dropped.
func (w *workerWhip) Result(id string, b []byte) {
	w.mu.Lock()
	srv := w.streams[id]
	w.mu.Unlock()
	var r whip.Result
	if srv == nil || json.Unmarshal(b, &r) != nil || r.Stream != id {
		return
	}
	srv.Deliver(r)
}

func (w *workerWhip) End(id string) {
	w.mu.Lock()
	srv := w.streams[id]
	w.mu.Unlock()
	if srv != nil && !srv.End(id) {
		// still being answered (Accept gathers its candidates): ended
		// once it is
		w.mu.Lock()
		if w.streams[id] == srv {
			w.early[id] = true
		}
		w.mu.Unlock()
	}
}

func (w *workerWhip) EndAll() {
	w.mu.Lock()
	ids := make(map[string]*whip.Server, len(w.streams))
	for id, srv := range w.streams {
		ids[id] = srv
	}
	w.mu.Unlock()
	var wg sync.WaitGroup
	for id, srv := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			srv.End(id)
		}()
	}
	wg.Wait()
}

// workerWhipFor is the WHIP streams a worker takes, their media on net.
func workerWhipFor(g *client.IngestServer, net whipNet, log *slog.Logger) client.WhipIngest {
	w := newWorkerWhip(g, log)
	w.net = net
	return w
}

// workerTakesWhip: this build's worker takes WHIP streams.
const workerTakesWhip = true
