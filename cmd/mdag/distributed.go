package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/mdag/mdag/coordinator"
	"github.com/mdag/mdag/gpu"
	"github.com/mdag/mdag/gpu/nvml"
	"github.com/mdag/mdag/gpu/onnx"
	"github.com/mdag/mdag/ingest/synth"
	"github.com/mdag/mdag/internal/pki"
	"github.com/mdag/mdag/internal/unixsock"
	"github.com/mdag/mdag/observe/metrics"
	"github.com/mdag/mdag/remote"
	"github.com/mdag/mdag/remote/client"
	"github.com/mdag/mdag/remote/source"
	"github.com/mdag/mdag/remote/wire"
	"github.com/mdag/mdag/scheduler"
)

// runContext ends on SIGINT/SIGTERM or after d (0: never).
func runContext(d time.Duration) (context.Context, context.CancelFunc) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	if d <= 0 {
		return ctx, stop
	}
	ctx, cancel := context.WithTimeout(ctx, d)
	return ctx, func() { cancel(); stop() }
}

// sceneHelp is the --scene flag's help.
const sceneHelp = "synthetic scene: shapes (cars, people, trucks and buses circling; their paths cross) or people (people only, drawn upright, walking back and forth in their own lanes: stable tracks for track, window and activity)"

// newPattern is the synthetic source of --size WxH, --objects and --scene.
func newPattern(size string, objects int, scene string) (*synth.Pattern, error) {
	w, h, err := parseSize(size)
	if err != nil {
		return nil, fmt.Errorf("--size: %w", err)
	}
	p, err := synth.NewPattern(w, h, objects)
	if err != nil {
		return nil, err
	}
	switch scene {
	case "shapes":
	case "people":
		p.Classes, p.Motion, p.Upright = []string{"person"}, synth.Lanes, true
	default:
		return nil, fmt.Errorf("--scene %q: want shapes or people", scene)
	}
	return p, nil
}

func newLogger(w io.Writer, verbose bool) *slog.Logger {
	level := slog.LevelInfo
	if verbose {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level}))
}

func runCoordinator(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("coordinator", "(-f app.yaml -p profiles.yaml | --example NAME) [flags]", stderr)
	file := fs.String("f", "", "app YAML file")
	profiles := fs.String("p", "", "profiles YAML file (with -f)")
	example := fs.String("example", "", "deploy an embedded example app instead of -f/-p (e.g. traffic)")
	listen := fs.String("listen", "127.0.0.1:8080", "HTTP address for /v1/status and /healthz")
	grpcFlag := fs.String("grpc", "127.0.0.1:7070", "the gRPC address workers and sources connect to: HOST:PORT, or unix:/PATH, a Unix socket (mode 0600, in a directory only its owner may write; "+
		"the path at most 107 bytes) that only this uid and root may use: the coordinator checks each connection's uid (SO_PEERCRED) and workers and sources check the coordinator's, "+
		"so it is the authenticated choice on one machine (plaintext; --tls-dir is for HOST:PORT)")
	policy := fs.String("policy", string(coordinator.DefaultPolicy), "GPU batching policy: symphony, clockwork or lazy")
	plane := fs.String("data-plane", "direct", "how frames go between modules on different workers: direct (a worker with a peer address keeps the frames its modules make; "+
		"the next module's worker fetches them from it, and the coordinator routes references) or relay (every frame through the coordinator)")
	headroom := fs.Float64("headroom", 1.25, headroomHelp)
	warmup := fs.Bool("warmup", true, warmupHelp)
	checkpoint := fs.Duration("checkpoint", 2*time.Second, "copy each stream's state at a stateful module (track, window...) to the coordinator this often, to restore it when its worker is lost; 0: never (a lost worker's streams start fresh)")
	heartbeat := fs.Duration("heartbeat", wire.DefaultHeartbeat, "heartbeat interval workers are told to keep; 4 missed = worker lost")
	duration := fs.Duration("duration", 0, "stop after this long (0: run until interrupted)")
	verbose := fs.Bool("v", false, "log debug events (every drop with its reason)")
	lf := addGRPCLimitFlags(fs)
	wf := addWhipFlags(fs)
	af := addAuthFlags(fs)
	cf := addCameraFlags(fs)
	tf := addTLSFlags(fs, false)
	stateDir := addStateFlag(fs)
	kf := addKubeFlags(fs)
	if code, ok := parseFlags(fs, args); !ok {
		return code
	}
	app, prof, err := serveInputs("coordinator", *file, *profiles, *example)
	if err != nil {
		printErrors(stderr, err)
		return exitInvalid
	}
	if !validPolicy(*policy) {
		fmt.Fprintf(stderr, "mdag coordinator: --policy %q: want symphony, clockwork or lazy\n", *policy)
		return exitInvalid
	}
	if *heartbeat <= 0 {
		fmt.Fprintf(stderr, "mdag coordinator: --heartbeat %v: want > 0\n", *heartbeat)
		return exitInvalid
	}
	if *plane != "direct" && *plane != "relay" {
		fmt.Fprintf(stderr, "mdag coordinator: --data-plane %q: want direct or relay\n", *plane)
		return exitInvalid
	}
	if !validHeadroom(*headroom) {
		fmt.Fprintf(stderr, "mdag coordinator: --headroom %v: want a number >= 1\n", *headroom)
		return exitInvalid
	}
	limits, err := lf.limits()
	if err == nil {
		err = limits.Check() // the flags' checks above are the user's words; this is remote's own
	}
	if err != nil {
		fmt.Fprintf(stderr, "mdag coordinator: %v\n", err)
		return exitInvalid
	}
	if strings.HasPrefix(*grpcFlag, "unix-abstract:") {
		fmt.Fprintf(stderr, "mdag coordinator: --grpc %s: an abstract socket has no file permissions (any local user could connect): give unix:/PATH\n", *grpcFlag)
		return exitInvalid
	}
	log := newLogger(stderr, *verbose)
	tm, err := tf.material("coordinator", pki.Coordinator, "--grpc", *grpcFlag, log)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return exitInvalid
	}
	// No provisioner (the default): the instances are the workers that
	// connect. --provisioner kubernetes: a pod per planned instance.
	cfg := coordinator.Config{Policy: scheduler.Policy(*policy), Log: log, Headroom: *headroom}
	cfg.Warmup = *warmup
	cfg.Checkpoint = checkpointFlag(*checkpoint)
	kp, err := kf.provisioner(&cfg, log)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return exitInvalid
	}
	closeState, err := openState("coordinator", *stateDir, &cfg, log)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return exitFailure
	}
	defer closeState() // after the engine's last save
	obs, err := startObserved(cfg, nil, app, prof)
	if err != nil {
		printErrors(stderr, err)
		return exitInvalid
	}
	defer obs.Close()
	if err := obs.startOutputs(app, *stateDir); err != nil {
		fmt.Fprintf(stderr, "mdag coordinator: %v\n", err)
		return exitFailure
	}
	if err := obs.startClips(app, *stateDir); err != nil {
		fmt.Fprintf(stderr, "mdag coordinator: %v\n", err)
		return exitFailure
	}
	warnNoState(*stateDir, log)
	e := obs.e
	if kp != nil {
		kp.Watch(e)
		defer kp.Close()
	}
	obs.hosts = af.hosts()
	if obs.auth, err = af.load("coordinator", log); err != nil {
		fmt.Fprintln(stderr, err)
		return exitInvalid
	}
	closeWhip, err := wf.attach("coordinator", *listen, app, obs, log)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return exitInvalid
	}
	defer closeWhip()
	if err := guardListen("coordinator", *listen, obs.auth, log); err != nil {
		fmt.Fprintln(stderr, err)
		return exitInvalid
	}
	metricsAddr, ms, err := obs.serveMetrics(*af.metricsListen)
	if err != nil {
		fmt.Fprintf(stderr, "mdag coordinator: %v\n", err)
		return exitFailure
	}
	if ms != nil {
		defer ms.Close()
		log.Info("serving /metrics without a token", "metrics_listen", "http://"+metricsAddr+"/metrics")
	}
	var gl net.Listener
	if path, ok := unixsock.Path(*grpcFlag); ok {
		// removed when the gRPC server stops (it closes the listener)
		gl, err = unixsock.Listen(path, log)
	} else {
		gl, err = net.Listen("tcp", *grpcFlag)
	}
	if err != nil {
		fmt.Fprintf(stderr, "mdag coordinator: listen %s: %v\n", *grpcFlag, err)
		return exitFailure
	}
	hl, err := net.Listen("tcp", *listen)
	if err != nil {
		gl.Close()
		fmt.Fprintf(stderr, "mdag coordinator: listen %s: %v\n", *listen, err)
		return exitFailure
	}
	srv := &remote.Server{Engine: e, Log: log, Heartbeat: *heartbeat, Limits: limits, Relay: *plane == "relay", Shared: tf.shared}
	obs.mx.SetGRPC(func() metrics.GRPC {
		p := srv.Plane()
		return metrics.GRPC{Refused: srv.Refused(), RelayedFrames: p.RelayedFrames, RelayedBytes: p.RelayedBytes, RefFrames: p.RefFrames,
			Hops: p.Hops, HopBuckets: p.HopBuckets, HopSum: p.HopSum}
	})
	g := grpcServer(srv, tm)
	go func() { _ = g.Serve(gl) }()
	hs := newHTTPServer(obs.handler(), hl, obs.hosts)
	go func() { _ = hs.Serve(hl) }()
	base := "http://" + hl.Addr().String()
	where := []any{"app", app.Name, "grpc", grpcAddr(gl), "status", base + "/v1/status"}
	if obs.ws != nil {
		where = append(where, "whip", base+"/whip/"+string(app.Name))
	}
	log.Info("coordinating", append(where, "policy", *policy, "dashboard", base+"/", "metrics", base+"/metrics", "grpc_security", grpcSecurity(tm, *grpcFlag))...)
	cams, err := cf.start("coordinator", app, obs, log)
	if err != nil {
		hs.Close()
		g.Stop()
		printErrors(stderr, err)
		return exitInvalid
	}
	defer cams.Stop() // before the WHIP server closes
	ctx, cancel := runContext(*duration)
	defer cancel()
	<-ctx.Done()
	cams.Stop()
	hs.Close()
	final := e.Status()
	e.Close() // ends every worker stream, so GracefulStop does not wait on them
	stopped := make(chan struct{})
	go func() { g.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(3 * time.Second):
		g.Stop()
	}
	writeStatusTable(stdout, final)
	obs.flushOutputs(5 * time.Second)
	writeOutputLines(stdout, obs.outs)
	writeClipLine(stdout, obs.closeClips())
	writeCameraTable(stdout, cams.Status())
	p := srv.Plane()
	fmt.Fprintf(stdout, "data plane %s: %d result frames by reference, %d relayed (%d bytes); %d hops, p50 %.3f ms, p99 %.3f ms\n",
		*plane, p.RefFrames, p.RelayedFrames, p.RelayedBytes, p.Hops, float64(p.HopP50.Microseconds())/1000, float64(p.HopP99.Microseconds())/1000)
	return exitOK
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

func (f *grpcLimitFlags) limits() (remote.Limits, error) {
	w, h, err := remote.ParseFrameSize(*f.frame)
	if err != nil {
		return remote.Limits{}, fmt.Errorf("--max-frame: %w", err)
	}
	for _, v := range []struct {
		name string
		n    float64
	}{{"--max-message", float64(*f.messageMiB)}, {"--max-boxes", float64(*f.boxes)}, {"--max-result-items", float64(*f.items)}, {"--max-source-streams", float64(*f.streams)}, {"--max-audio", float64(*f.audioKiB)},
		{"--register-rate", *f.rate}, {"--register-burst", *f.burst}, {"--register-global-rate", *f.grate}, {"--register-global-burst", *f.gburst}} {
		if v.n <= 0 {
			return remote.Limits{}, fmt.Errorf("%s %g: want > 0", v.name, v.n)
		}
	}
	if *f.messageMiB > 2047 {
		return remote.Limits{}, fmt.Errorf("--max-message %d: at most 2047 MiB (gRPC's limit)", *f.messageMiB)
	}
	l := remote.Limits{MaxMessage: *f.messageMiB << 20, MaxFrameW: w, MaxFrameH: h, MaxBoxes: *f.boxes, MaxResultItems: *f.items, MaxSourceStreams: *f.streams,
		MaxAudioBytes: *f.audioKiB << 10, PeerRate: *f.rate, PeerBurst: *f.burst, GlobalRate: *f.grate, GlobalBurst: *f.gburst}
	if room := l.SourceMessage() - 64<<10; l.MaxAudioBytes > room {
		// A source's message holds one frame or one audio chunk: the
		// default audio cap shrinks to a small --max-frame; one asked for
		// that does not fit is an error.
		explicit := false
		f.fs.Visit(func(fl *flag.Flag) { explicit = explicit || fl.Name == "max-audio" })
		if explicit {
			return remote.Limits{}, fmt.Errorf("--max-audio %d KiB does not fit a source's message (one --max-frame %s frame with --max-boxes %d: %d KiB): raise --max-frame or lower --max-audio", *f.audioKiB, *f.frame, *f.boxes, room>>10)
		}
		l.MaxAudioBytes = room
	}
	if src := l.SourceMessage(); src > l.MaxMessage {
		return remote.Limits{}, fmt.Errorf("--max-message %d MiB is smaller than one --max-frame %s frame with --max-boxes %d (%d bytes)", *f.messageMiB, *f.frame, *f.boxes, src)
	}
	return l, nil
}

func runWorker(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("worker", "--type TYPE [flags]", stderr)
	coord := fs.String("coordinator", "127.0.0.1:7070", "the coordinator's gRPC address: HOST:PORT, or unix:/PATH (the coordinator's Unix socket: it is talked to only when the coordinator runs as this uid or root)")
	typ := fs.String("type", "", "this worker's type, one of the deployed profiles' worker types (required)")
	host, _ := os.Hostname()
	id := fs.String("id", fmt.Sprintf("%s-%d", host, os.Getpid()), "instance ID, unique among connected workers "+
		"(with TLS: the certificate's name by default, the only ID the coordinator accepts from it unless it is declared --shared-cert)")
	executor := fs.String("executor", "emulated", executorHelp)
	decs := strings.Join(decoders(), ", ")
	if decs == "" {
		decs = "none in the " + buildName + " build"
	}
	var models []gpu.ModelFile
	fs.Func("model", "with --executor opencv: a model as NAME=DECODER:PATH (repeatable), NAME being the app's `model:`; decoders: "+decs, func(s string) error {
		m, err := gpu.ParseModelFile(s)
		if err == nil {
			models = append(models, m)
		}
		return err
	})
	ox := addONNXFlags(fs)
	kx := addKServeFlags(fs)
	slowdown := fs.Float64("slowdown", 1, "multiply the emulated executor's times (inject ballooning)")
	variance := addVarianceFlag(fs)
	emulate := fs.String("emulate", "", "with --executor onnx or kserve: `MODELS` (comma-separated) that run on the emulated executor instead "+
		"(profiled times; detections echo the synthetic sources' objects), e.g. the detector in front of a real classifier")
	duration := fs.Duration("duration", 0, "stop after this long (0: run until interrupted)")
	verbose := fs.Bool("v", false, "log debug events")
	pf := addPeerFlags(fs)
	tf := addTLSFlags(fs, true)
	if code, ok := parseFlags(fs, args); !ok {
		return code
	}
	if *typ == "" {
		fmt.Fprintln(stderr, "mdag worker: --type is required")
		return exitInvalid
	}
	var emulated []string
	for m := range strings.SplitSeq(*emulate, ",") {
		if m = strings.TrimSpace(m); m != "" {
			emulated = append(emulated, m)
		}
	}
	if len(emulated) > 0 && *executor != "onnx" && *executor != "kserve" {
		fmt.Fprintf(stderr, "mdag worker: --emulate routes some models of a real executor to the emulated one: it needs --executor onnx or kserve, not %s\n", *executor)
		return exitInvalid
	}
	if *executor != "emulated" && len(emulated) == 0 {
		if err := variance.only("worker", "--executor "+*executor+" (without --emulate)"); err != nil {
			fmt.Fprintln(stderr, err)
			return exitInvalid
		}
	}
	bx, err := buildExecutor(*executor, fs, ox, kx, models, true)
	if err != nil {
		printErrors(stderr, fmt.Errorf("mdag worker: %w", err))
		return exitInvalid
	}
	defer bx.close()
	exec, kserveX := bx.exec, bx.kserve
	if *slowdown <= 0 {
		fmt.Fprintf(stderr, "mdag worker: --slowdown %g: want > 0\n", *slowdown)
		return exitInvalid
	}
	log := newLogger(stderr, *verbose).With("worker", *id)
	if x, ok := exec.(*onnx.Executor); ok {
		log.Info("onnx executor", "runs", x.Describe())
	}
	if kserveX != nil {
		// the servers may come up after the worker: RunWorker probes them
		// before registering and while connected
		if err := checkServers(kserveX); err != nil {
			log.Warn("kserve executor: not serving yet", "err", err)
		}
		log.Info("kserve executor", "runs", kserveX.Describe())
	}
	cc, mat, err := tf.dialMaterial("worker", pki.Worker, *coord, log)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return exitInvalid
	}
	defer cc.Close()
	if mat != nil && !flagGiven(fs, "id") {
		// the coordinator binds a worker's ID to its certificate's name
		if _, name, err := pki.RoleOf(mat.Certificate()); err == nil {
			*id = name
			log = newLogger(stderr, *verbose).With("worker", *id)
		}
	}
	dp, stopPeer, err := pf.start(*id, *coord, mat, log)
	if err != nil {
		fmt.Fprintf(stderr, "mdag worker: %v\n", err)
		return exitInvalid
	}
	defer stopPeer()
	ctx, cancel := runContext(*duration)
	defer cancel()
	// Serve; reconnect with backoff when the stream breaks, give up on
	// what retrying cannot fix.
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		start := time.Now()
		err := client.RunWorker(ctx, cc, client.WorkerConfig{ID: *id, Type: *typ, Exec: exec, Ops: ops(), GPU: nvml.Telemetry().Summary(), Log: log, Slowdown: *slowdown, Variance: variance.v, Emulate: emulated, Data: dp})
		if ctx.Err() != nil {
			break
		}
		if c := status.Code(errors.Unwrap(err)); c == codes.InvalidArgument || c == codes.AlreadyExists || c == codes.PermissionDenied || status.Code(err) == codes.InvalidArgument {
			fmt.Fprintf(stderr, "mdag worker: %v\n", err)
			return exitInvalid
		}
		if time.Since(start) > 10*time.Second {
			backoff = 100 * time.Millisecond
		}
		if strings.HasPrefix(err.Error(), "not registering: ") {
			log.Warn("executor not serving; retrying", "err", err, "in", backoff)
		} else {
			log.Warn("disconnected; reconnecting", "err", tf.explain(err), "in", backoff)
		}
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
		}
		backoff = min(2*backoff, 2*time.Second) // a restarted coordinator is found within 2 s of being back
	}
	fmt.Fprintf(stdout, "worker %s stopped\n", *id)
	return exitOK
}

func runSource(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("source", "--app NAME [flags]", stderr)
	coord := fs.String("coordinator", "127.0.0.1:7070", "the coordinator's gRPC address: HOST:PORT, or unix:/PATH (the coordinator's Unix socket: it is talked to only when the coordinator runs as this uid or root)")
	app := fs.String("app", "", "the deployed app to stream into (required)")
	streams := fs.Int("streams", 1, "synthetic cameras to run")
	prefix := fs.String("prefix", "synthetic", "stream IDs are PREFIX-0, PREFIX-1, ... (with TLS: NAME/synthetic by default, NAME the certificate's: "+
		"a source certificate joins only streams NAME or NAME/...)")
	fps := fs.Float64("fps", 10, "frames per second per camera (synthetic; with --camera: the rate frames are sampled at)")
	objects := fs.Int("objects", 3, "objects per frame")
	size := fs.String("size", "320x240", "frame size WxH")
	scene := fs.String("scene", "shapes", sceneHelp)
	count := fs.Uint64("count", 0, "frames per camera (0: until --duration or interrupted)")
	audio := fs.Bool("audio", false, "send synthetic audio (chirps with silence between them, 48 kHz mono, chunks of 1/fps) instead of frames: for an app with media: audio")
	duration := fs.Duration("duration", 0, "stop after this long (0: run until interrupted or --count)")
	cf := addCameraFlags(fs)
	tf := addTLSFlags(fs, true)
	if code, ok := parseFlags(fs, args); !ok {
		return code
	}
	if *app == "" || *streams < 1 || *fps <= 0 {
		fmt.Fprintln(stderr, "mdag source: need --app, --streams >= 1 and --fps > 0")
		return exitInvalid
	}
	pat, err := newPattern(*size, *objects, *scene)
	if err != nil {
		fmt.Fprintf(stderr, "mdag source: %v\n", err)
		return exitInvalid
	}
	log := newLogger(stderr, false)
	cc, mat, err := tf.dialMaterial("source", pki.Source, *coord, log)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return exitInvalid
	}
	defer cc.Close()
	// with TLS a source certificate joins only streams NAME or NAME/...:
	// its cameras are sent as NAME/CAMERA, its synthetic streams as
	// NAME/synthetic-N unless --prefix says otherwise
	camPrefix := ""
	if mat != nil {
		if _, name, err := pki.RoleOf(mat.Certificate()); err == nil {
			camPrefix = name + "/"
			if !flagGiven(fs, "prefix") {
				*prefix = camPrefix + *prefix
			}
		}
	}
	ctx, cancel := runContext(*duration)
	defer cancel()
	if code, ok := cf.runSource(ctx, *app, *fps, cc, camPrefix, stdout, stderr); ok {
		return code // RTSP cameras instead of synthetic streams
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	code := exitOK
	for i := range *streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprintf("%s-%d", *prefix, i)
			// rejoins under the same ID when the stream breaks (a
			// coordinator restart), numbering on
			var r *source.StreamResult
			var err error
			if *audio {
				r, err = source.StreamAudioReconnecting(ctx, cc, *app, id, synth.NewTone(), i, *fps, *count, source.Reconnect{Log: log})
			} else {
				r, err = source.StreamReconnecting(ctx, cc, *app, id, pat, i, *fps, *count, source.Reconnect{Log: log})
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				fmt.Fprintf(stderr, "mdag source: %v\n", tf.explain(err))
				code = exitFailure
				return
			}
			fmt.Fprintf(stdout, "stream %s: %d frames accepted, %d rejected (produced %d, unconfirmed %d, skipped %d, connections %d)",
				id, r.Accepted, r.Rejected, r.Generated, r.Unconfirmed, r.Skipped, r.Connections)
			if r.LastError != "" {
				fmt.Fprintf(stdout, " (last: %s)", r.LastError)
			}
			fmt.Fprintln(stdout)
		}()
	}
	wg.Wait()
	return code
}
