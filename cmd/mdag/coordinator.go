package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/mdag/mdag/coordinator"
	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/internal/pki"
	"github.com/mdag/mdag/internal/unixsock"
	"github.com/mdag/mdag/observe/metrics"
	"github.com/mdag/mdag/profile"
	"github.com/mdag/mdag/remote"
	"github.com/mdag/mdag/remote/wire"
	"github.com/mdag/mdag/scheduler"
)

// `mdag coordinator` is the engine of serve without in-process workers:
// the instances are the workers that register over gRPC (or the pods of
// --provisioner kubernetes), and sources stream into it over gRPC as well
// as through its WHIP server and cameras.

const coordinatorSynopsis = "(-f app.yaml -p profiles.yaml | --example NAME) [flags]"

func runCoordinator(args []string, stdout, stderr io.Writer) int {
	return execute("coordinator", coordinatorSynopsis, new(coordinatorCmd), args, stdout, stderr)
}

// coordinatorCmd is mdag coordinator's options.
type coordinatorCmd struct {
	in                    appInputs // -f, -p, --example
	grpc                  string
	policy, plane         string
	headroom              float64
	warmup, verbose       bool
	checkpoint, heartbeat time.Duration
	duration              time.Duration
	api                   apiFlags // --listen, WHIP, tokens, cameras, --state
	grpcLimits            *grpcLimitFlags
	tls                   *tlsFlags
	kube                  *kubeFlags
	limits                remote.Limits // built by validate
}

func (c *coordinatorCmd) flags(fs *flag.FlagSet) {
	c.in.flags(fs, "deploy")
	fs.StringVar(&c.grpc, "grpc", "127.0.0.1:7070", "the gRPC address workers and sources connect to: HOST:PORT, or unix:/PATH, a Unix socket (mode 0600, in a directory only its owner may write; "+
		"the path at most 107 bytes) that only this uid and root may use: the coordinator checks each connection's uid (SO_PEERCRED) and workers and sources check the coordinator's, "+
		"so it is the authenticated choice on one machine (plaintext; --tls-dir is for HOST:PORT)")
	fs.StringVar(&c.policy, "policy", string(coordinator.DefaultPolicy), "GPU batching policy: symphony, clockwork or lazy")
	fs.StringVar(&c.plane, "data-plane", "direct", "how frames go between modules on different workers: direct (a worker with a peer address keeps the frames its modules make; "+
		"the next module's worker fetches them from it, and the coordinator routes references; frames under a worker's --peer-inline go through the coordinator), "+
		"metadata (direct, every frame by reference however small: with workers that ingest the cameras, mdag worker --ingest-listen, no pixel reaches the coordinator) "+
		"or relay (every frame through the coordinator)")
	fs.Float64Var(&c.headroom, "headroom", 1.25, headroomHelp)
	fs.BoolVar(&c.warmup, "warmup", true, warmupHelp)
	fs.DurationVar(&c.checkpoint, "checkpoint", 2*time.Second, "copy each stream's state at a stateful module (track, window...) to the coordinator this often, to restore it when its worker is lost; 0: never (a lost worker's streams start fresh)")
	fs.DurationVar(&c.heartbeat, "heartbeat", wire.DefaultHeartbeat, "heartbeat interval workers are told to keep; 4 missed = worker lost")
	fs.DurationVar(&c.duration, "duration", 0, "stop after this long (0: run until interrupted)")
	fs.BoolVar(&c.verbose, "v", false, "log debug events (every drop with its reason)")
	c.api.flags(fs)
	c.grpcLimits = addGRPCLimitFlags(fs)
	c.tls = addTLSFlags(fs, false)
	c.kube = addKubeFlags(fs)
}

func (c *coordinatorCmd) validate(*flag.FlagSet) []error {
	var errs []error
	if err := c.in.problem(); err != nil {
		errs = append(errs, err)
	}
	if !validPolicy(c.policy) {
		errs = append(errs, fmt.Errorf("--policy %q: want symphony, clockwork or lazy", c.policy))
	}
	if c.heartbeat <= 0 {
		errs = append(errs, fmt.Errorf("--heartbeat %v: want > 0", c.heartbeat))
	}
	if c.plane != "direct" && c.plane != "relay" && c.plane != "metadata" {
		errs = append(errs, fmt.Errorf("--data-plane %q: want direct, metadata or relay", c.plane))
	}
	if !validHeadroom(c.headroom) {
		errs = append(errs, fmt.Errorf("--headroom %v: want a number >= 1", c.headroom))
	}
	var err error
	if c.limits, err = c.grpcLimits.limits(); err == nil {
		err = c.limits.Check() // the flags' checks are the user's words; this is remote's own
	}
	if err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, c.api.check()...)
	errs = append(errs, c.kube.check()...)
	if strings.HasPrefix(c.grpc, "unix-abstract:") {
		errs = append(errs, fmt.Errorf("--grpc %s: an abstract socket has no file permissions (any local user could connect): give unix:/PATH", c.grpc))
	} else if _, err := c.tls.mode("--grpc", c.grpc); err != nil {
		errs = append(errs, err)
	}
	return errs
}

// cameraGrace is how long, with --data-plane metadata, the coordinator's
// cameras wait for an ingest worker that reads cameras (at the start, or
// after the last was lost) before the coordinator reads them itself.
const cameraGrace = 10 * time.Second

// coordination is a coordinator's parts, as its build starts them.
type coordination struct {
	log    *slog.Logger
	app    *dag.App
	tm     *pki.Material // nil: plaintext gRPC
	obs    *observed
	srv    *remote.Server
	g      grpcPort
	hs     *http.Server
	cams   *cameraRun
	gl, hl net.Listener
	// bindWhip hands the WHIP server's offers to srv's ingest workers
	bindWhip func(*remote.Server, *observed)
}

func (c *coordinatorCmd) run(env *cmdEnv) error {
	var td teardown
	defer td.run()
	co, err := c.build(env, &td)
	if err != nil {
		return err
	}
	ctx, cancel := runContext(c.duration)
	defer cancel()
	<-ctx.Done()
	final := co.stop()
	c.summary(env.stdout, co, final)
	return nil
}

// build starts the coordinator: the engine with its app, the HTTP side,
// the gRPC port and the cameras. td stops them.
func (c *coordinatorCmd) build(env *cmdEnv, td *teardown) (*coordination, error) {
	co := &coordination{log: newLogger(env.stderr, c.verbose)}
	app, prof, err := c.in.load()
	if err != nil {
		return nil, invalid(err)
	}
	co.app = app
	if co.tm, err = c.tls.material(pki.Coordinator, "--grpc", c.grpc, co.log); err != nil {
		return nil, invalid(err)
	}
	if err := c.startEngine(co, prof, td); err != nil {
		return nil, err
	}
	// WHIP offers go to the ingest workers that take WHIP streams
	co.bindWhip = c.api.wf.delegating()
	if err := c.api.start(co.obs, co.app, co.log, td); err != nil {
		return nil, err
	}
	if err := c.serve(co, td); err != nil {
		return nil, err
	}
	// the cameras go to the ingest workers that read cameras; the
	// coordinator reads those no worker takes, at once, or with
	// --data-plane metadata (no pixel here) once none has been connected
	// for cameraGrace
	grace := time.Duration(0)
	if c.plane == "metadata" {
		grace = cameraGrace
	}
	if co.cams, err = c.api.cf.place(app, co.obs, co.srv, c.api.wf.motion(), grace, co.log); err != nil {
		return nil, invalid(err)
	}
	td.add(co.cams.Stop) // before the WHIP server closes
	return co, nil
}

// startEngine starts the engine with the app deployed: its provisioner
// (none: the instances are the workers that connect; --provisioner
// kubernetes: a pod per planned instance) and its state store.
func (c *coordinatorCmd) startEngine(co *coordination, prof *profile.File, td *teardown) error {
	cfg := coordinator.Config{Policy: scheduler.Policy(c.policy), Log: co.log, Headroom: c.headroom,
		Warmup: c.warmup, Checkpoint: checkpointFlag(c.checkpoint)}
	kp, err := c.kube.provisioner(&cfg, co.log)
	if err != nil {
		return invalid(err)
	}
	closeState, err := openState(*c.api.stateDir, &cfg, co.log)
	if err != nil {
		return err
	}
	td.add(closeState) // after the engine's last save
	if co.obs, err = startObserved(cfg, nil, co.app, prof); err != nil {
		return invalid(err)
	}
	td.add(co.obs.Close)
	if kp != nil {
		kp.Watch(co.obs.e)
		td.add(kp.Close)
	}
	return nil
}

// serve listens on --grpc and --listen and serves them.
func (c *coordinatorCmd) serve(co *coordination, td *teardown) error {
	var err error
	if path, ok := unixsock.Path(c.grpc); ok {
		// removed when the gRPC server stops (it closes the listener)
		co.gl, err = unixsock.Listen(path, co.log)
	} else {
		co.gl, err = net.Listen("tcp", c.grpc)
	}
	if err != nil {
		return fmt.Errorf("listen %s: %w", c.grpc, err)
	}
	if co.hl, err = net.Listen("tcp", c.api.listen); err != nil {
		co.gl.Close()
		return fmt.Errorf("listen %s: %w", c.api.listen, err)
	}
	co.srv = &remote.Server{Engine: co.obs.e, Log: co.log, Heartbeat: c.heartbeat, Limits: c.limits, Relay: c.plane == "relay", ByReference: c.plane == "metadata", Shared: c.tls.shared,
		Thumbs: co.obs.rec.Thumbs().Put}
	co.bindWhip(co.srv, co.obs)
	// the thumbnails of streams ingested on workers come from them, while
	// the dashboard is read
	co.obs.rec.Thumbs().SetWatch(co.srv.WantThumbs)
	co.obs.mx.SetGRPC(func() metrics.GRPC {
		p, r, in := co.srv.Plane(), co.srv.Received(), co.srv.Ingested()
		return metrics.GRPC{Refused: co.srv.Refused(), RelayedFrames: p.RelayedFrames, RelayedBytes: p.RelayedBytes, RefFrames: p.RefFrames,
			Hops: p.Hops, HopBuckets: p.HopBuckets, HopSum: p.HopSum,
			Received:      map[string]uint64{"workers": r.Workers, "sources": r.Sources, "other": r.Other},
			IngestStreams: in.Streams, IngestFrames: in.Frames, IngestRejected: in.Rejected}
	})
	co.g = grpcServer(co.srv, co.tm)
	go func() { _ = co.g.Serve(co.gl) }()
	td.add(co.g.Stop)
	co.hs = newHTTPServer(co.obs.handler(), co.hl, co.obs.hosts)
	go func() { _ = co.hs.Serve(co.hl) }()
	td.add(func() { co.hs.Close() })
	c.announce(co)
	return nil
}

// announce logs where the coordinator serves what.
func (c *coordinatorCmd) announce(co *coordination) {
	base := "http://" + co.hl.Addr().String()
	where := []any{"app", co.app.Name, "grpc", grpcAddr(co.gl), "status", base + "/v1/status"}
	if co.obs.ws != nil {
		where = append(where, "whip", base+"/whip/"+string(co.app.Name))
	}
	co.log.Info("coordinating", append(where, "policy", c.policy, "dashboard", base+"/", "metrics", base+"/metrics", "grpc_security", grpcSecurity(co.tm, c.grpc))...)
}

// stop ends the coordinator: the cameras, the HTTP side, the engine (it
// ends every worker stream, so GracefulStop does not wait on them), then
// the gRPC port (3 s at most). It returns the engine's last status.
func (co *coordination) stop() coordinator.Status {
	co.cams.Stop()
	co.hs.Close()
	final := co.obs.e.Status()
	co.obs.e.Close()
	stopped := make(chan struct{})
	go func() { co.g.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(3 * time.Second):
		co.g.Stop()
	}
	return final
}

// summary writes what the coordinator did: the sessions, outputs, clips,
// cameras and the data plane.
func (c *coordinatorCmd) summary(w io.Writer, co *coordination, final coordinator.Status) {
	writeStatusTable(w, final)
	co.obs.flushOutputs(5 * time.Second)
	writeOutputLines(w, co.obs.outs)
	writeClipLine(w, co.obs.closeClips())
	writeCameraTable(w, co.cams.Status())
	p, r := co.srv.Plane(), co.srv.Received()
	fmt.Fprintf(w, "data plane %s: %d result frames by reference, %d relayed (%d bytes); %d hops, p50 %.3f ms, p99 %.3f ms\n",
		c.plane, p.RefFrames, p.RelayedFrames, p.RelayedBytes, p.Hops, float64(p.HopP50.Microseconds())/1000, float64(p.HopP99.Microseconds())/1000)
	fmt.Fprintf(w, "received on gRPC: %d bytes from workers, %d from sources (%s a frame sent)\n", r.Workers, r.Sources, perFrame(r.Workers+r.Sources, final))
}

// grpcLimitFlags are the coordinator's limits on its gRPC port (issue 22,
// docs/security.md).
type grpcLimitFlags struct {
	fs                         *flag.FlagSet
	frame                      *string
	messageMiB, boxes, items   *int
	audioKiB                   *int
	streams                    *int
	rate, burst, grate, gburst *float64
}

func addGRPCLimitFlags(fs *flag.FlagSet) *grpcLimitFlags {
	d := remote.DefaultLimits
	return &grpcLimitFlags{
		fs:         fs,
		frame:      fs.String("max-frame", fmt.Sprintf("%dx%d", d.MaxFrameW, d.MaxFrameH), "largest frame (WxH) a source or a worker's result may carry; a source's messages are capped at its BGR size plus room for its boxes"),
		messageMiB: fs.Int("max-message", d.MaxMessage>>20, "largest gRPC message in MiB from anyone (a worker's result carries its output frames); gRPC refuses larger ones unread"),
		boxes:      fs.Int("max-boxes", d.MaxBoxes, "most boxes (detections or ground truth) on one frame"),
		items:      fs.Int("max-result-items", d.MaxResultItems, "most output items in one result"),
		audioKiB:   fs.Int("max-audio", d.MaxAudioBytes>>10, "largest audio chunk (PCM, KiB) a source may send into an app with media: audio; a larger one ends its stream"),
		streams:    fs.Int("max-source-streams", d.MaxSourceStreams, "most Ingest streams (cameras) one source has open at once (a source: its certificate's name, or its IP address in plaintext)"),
		rate:       fs.Float64("register-rate", d.PeerRate, "worker registrations a second per peer (certificate name, or IP address in plaintext); more get ResourceExhausted"),
		burst:      fs.Float64("register-burst", d.PeerBurst, "registrations a peer may make at once before --register-rate applies"),
		grate:      fs.Float64("register-global-rate", d.GlobalRate, "worker registrations a second from everyone together"),
		gburst:     fs.Float64("register-global-burst", d.GlobalBurst, "registrations everyone together may make at once"),
	}
}

// limits are the flags' limits, or every problem with the flags; then
// whether a frame and an audio chunk fit a message.
func (f *grpcLimitFlags) limits() (remote.Limits, error) {
	var errs []error
	w, h, err := remote.ParseFrameSize(*f.frame)
	if err != nil {
		errs = append(errs, fmt.Errorf("--max-frame: %w", err))
	}
	for _, v := range []struct {
		name string
		n    float64
	}{{"--max-message", float64(*f.messageMiB)}, {"--max-boxes", float64(*f.boxes)}, {"--max-result-items", float64(*f.items)}, {"--max-source-streams", float64(*f.streams)}, {"--max-audio", float64(*f.audioKiB)},
		{"--register-rate", *f.rate}, {"--register-burst", *f.burst}, {"--register-global-rate", *f.grate}, {"--register-global-burst", *f.gburst}} {
		if v.n <= 0 {
			errs = append(errs, fmt.Errorf("%s %g: want > 0", v.name, v.n))
		}
	}
	if *f.messageMiB > 2047 {
		errs = append(errs, fmt.Errorf("--max-message %d: at most 2047 MiB (gRPC's limit)", *f.messageMiB))
	}
	if len(errs) > 0 {
		return remote.Limits{}, errors.Join(errs...)
	}
	l := remote.Limits{MaxMessage: *f.messageMiB << 20, MaxFrameW: w, MaxFrameH: h, MaxBoxes: *f.boxes, MaxResultItems: *f.items, MaxSourceStreams: *f.streams,
		MaxAudioBytes: *f.audioKiB << 10, PeerRate: *f.rate, PeerBurst: *f.burst, GlobalRate: *f.grate, GlobalBurst: *f.gburst}
	if room := l.SourceMessage() - 64<<10; l.MaxAudioBytes > room {
		// A source's message holds one frame or one audio chunk: the
		// default audio cap shrinks to a small --max-frame; one asked for
		// that does not fit is an error.
		if flagGiven(f.fs, "max-audio") {
			return remote.Limits{}, fmt.Errorf("--max-audio %d KiB does not fit a source's message (one --max-frame %s frame with --max-boxes %d: %d KiB): raise --max-frame or lower --max-audio", *f.audioKiB, *f.frame, *f.boxes, room>>10)
		}
		l.MaxAudioBytes = room
	}
	if src := l.SourceMessage(); src > l.MaxMessage {
		return remote.Limits{}, fmt.Errorf("--max-message %d MiB is smaller than one --max-frame %s frame with --max-boxes %d (%d bytes)", *f.messageMiB, *f.frame, *f.boxes, src)
	}
	return l, nil
}

// perFrame is bytes over the frames final's sessions were sent, said.
func perFrame(bytes uint64, final coordinator.Status) string {
	var sent uint64
	for _, s := range final.Sessions {
		sent += s.Total.Sent
	}
	if sent == 0 {
		return "no frames"
	}
	return fmt.Sprintf("%d bytes", bytes/sent)
}
