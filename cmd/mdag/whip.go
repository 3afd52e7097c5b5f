//go:build !lean

package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/mdag/mdag/coordinator"
	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/egress/whep"
	"github.com/mdag/mdag/ingest/whip"
	"github.com/mdag/mdag/internal/auth"
	"github.com/mdag/mdag/media"
	"github.com/mdag/mdag/modules/cv"
	"github.com/mdag/mdag/observe/metrics"
)

// whipFlags are the WebRTC ingest flags of serve and coordinator.
type whipFlags struct {
	// delegate hands offers to ingest workers (the coordinator's;
	// delegating sets it)
	delegate   whip.Delegator
	tokenFile  *string
	open       *bool
	offerRate  *float64
	offerBurst *float64
	ipRate     *float64
	ipBurst    *float64
	maxStreams *int
	maxPending *int
	connect    *time.Duration
	cores      *float64
	ceiling    *float64
	streamCost *float64
	shedAfter  *time.Duration
	cpuMachine *bool
	maxRes     *string
	oversize   *string
	udpPorts   *string
	publicIP   *string
	objects    *string
	codecs     *string
	origins    *originList
	// WHEP (annotated video out)
	whepMax       *int
	whepPerStream *int
	whepBitrate   *int

	parsed whip.Config // what check read of the flags: codecs, sizes, ports, IPs
}

// originList is --allow-origin: repeated or comma-separated.
type originList []string

func (o *originList) String() string { return strings.Join(*o, ",") }

func (o *originList) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		if _, err := whip.NormalizeOrigin(s); err != nil {
			return err
		}
		*o = append(*o, s)
	}
	return nil
}

func addWhipFlags(fs *flag.FlagSet) *whipFlags {
	origins := &originList{}
	fs.Var(origins, "allow-origin", "web origin (scheme://host[:port]) whose pages may call WHIP and /v1/streams from a browser, "+
		"repeated or comma-separated; * allows any page; default: only this server's own pages")
	return &whipFlags{
		origins: origins,
		tokenFile: fs.String("token-file", "", "the simple form of --tokens: plaintext bearer tokens accepted for WHIP (every app) and results, one per line (# comments); "+
			"the API stays open; none and no --tokens: open, allowed only on a loopback --listen unless --open"),
		open:          fs.Bool("open", false, "accept WHIP streams without a token on a non-loopback --listen"),
		offerRate:     fs.Float64("offer-rate", 20, "WHIP offers (POST) per second accepted from all clients together; more get 429 with Retry-After (0: no limit)"),
		offerBurst:    fs.Float64("offer-burst", 100, "WHIP offers accepted at once before --offer-rate applies"),
		ipRate:        fs.Float64("offer-rate-ip", 2, "WHIP offers per second accepted from one client IP; more get 429 with Retry-After (0: no limit)"),
		ipBurst:       fs.Float64("offer-burst-ip", 20, "WHIP offers accepted at once from one client IP before --offer-rate-ip applies"),
		maxStreams:    fs.Int("max-streams", 64, "most admitted WHIP streams at once (a stream is admitted when its first frame decodes); more get 503 with Retry-After"),
		maxPending:    fs.Int("max-pending", 0, "most WHIP streams waiting for their first frame at once (default --max-streams); more get 503"),
		connect:       fs.Duration("connect-timeout", 10*time.Second, "end a WHIP stream whose first frame has not decoded this long after its offer"),
		cores:         fs.Float64("cpu-cores", 0, "CPU cores this process may use, for WHIP admission (default GOMAXPROCS)"),
		ceiling:       fs.Float64("cpu-ceiling", 0.7, "share of --cpu-cores WHIP admission fills with the measured CPU load; a stream that would not fit gets 503"),
		streamCost:    fs.Float64("stream-cost", 0.15, "predicted CPU load of a new WHIP stream in cores until one has been measured"),
		cpuMachine:    fs.Bool("cpu-machine", false, "WHIP admission also counts the machine's busy cores (other processes) when larger than this process's CPU, where the process may use every core (default: this process only, so a busy neighbour cannot shed streams)"),
		shedAfter:     fs.Duration("shed-after", 3*time.Second, "end the newest WHIP streams (reason overload; as many as the excess over the per-stream cost, never the last) when the CPU load stays above capacity this long (negative: never)"),
		maxRes:        fs.String("max-resolution", "1920x1080", "largest decoded frame WxH handed to the session"),
		oversize:      fs.String("oversize", string(whip.Downscale), "frames above --max-resolution: downscale or reject (ends the stream)"),
		udpPorts:      fs.String("udp-ports", "", "UDP port range for WebRTC media, MIN-MAX (default: ephemeral)"),
		publicIP:      fs.String("public-ip", "", "IP to announce in ICE candidates instead of local addresses (1:1 NAT, e.g. a node's external IP)"),
		whepMax:       fs.Int("whep-max-viewers", 32, "most WHEP viewers (annotated video out, /whep/{app}/{stream}) at once; more get 503"),
		whepPerStream: fs.Int("whep-max-per-stream", 8, "most WHEP viewers of one stream at once; more get 503 (a stream is encoded once for all its viewers)"),
		whepBitrate:   fs.Int("whep-bitrate", 1000, "target bitrate of a stream's WHEP (VP8) encoder, kbit/s"),
		codecs:        fs.String("codecs", strings.Join(whip.DefaultCodecs, ","), "video codecs WHIP accepts, in order of preference: a stream is answered with the first its offer has (vp8, h264)"),
		objects:       fs.String("emulate-objects", "motion", "what emulated GPU detectors report for WebRTC video, which has no ground truth: motion (moving regions, by background subtraction) or none"),
	}
}

// check reports every problem with the WHIP and WHEP flags (serve's and
// the coordinator's validate call it; server calls it again) and keeps
// what it parsed for server.
func (wf *whipFlags) check() []error {
	var errs []error
	bad := func(cond bool, format string, a ...any) {
		if cond {
			errs = append(errs, fmt.Errorf(format, a...))
		}
	}
	p := &wf.parsed
	var err error
	if p.Codecs, err = whip.ParseCodecs(*wf.codecs); err != nil {
		errs = append(errs, fmt.Errorf("--codecs: %w", err))
	}
	bad(*wf.objects != "motion" && *wf.objects != "none", "--emulate-objects %q: want motion or none", *wf.objects)
	bad(*wf.maxStreams <= 0, "--max-streams %d: want > 0", *wf.maxStreams)
	bad(*wf.maxPending < 0, "--max-pending %d: want >= 0 (0: --max-streams)", *wf.maxPending)
	bad(*wf.connect <= 0, "--connect-timeout %v: want > 0", *wf.connect)
	bad(*wf.cores < 0, "--cpu-cores %g: want >= 0 (0: GOMAXPROCS)", *wf.cores)
	bad(*wf.ceiling <= 0 || *wf.ceiling > 1, "--cpu-ceiling %g: want a share in (0, 1]", *wf.ceiling)
	bad(*wf.streamCost <= 0, "--stream-cost %g: want > 0 cores", *wf.streamCost)
	bad(*wf.shedAfter == 0, "--shed-after 0: want a duration (negative: never shed)")
	bad(*wf.offerRate < 0 || *wf.ipRate < 0, "--offer-rate %g, --offer-rate-ip %g: want >= 0 (0: no limit)", *wf.offerRate, *wf.ipRate)
	bad(*wf.offerBurst < 1 || *wf.ipBurst < 1, "--offer-burst %g, --offer-burst-ip %g: want >= 1", *wf.offerBurst, *wf.ipBurst)
	w, h, err := parseSize(*wf.maxRes)
	bad(err != nil || w <= 0 || h <= 0, "--max-resolution %q: want WxH, e.g. 1280x720", *wf.maxRes)
	p.MaxWidth, p.MaxHeight = w, h
	if *wf.udpPorts != "" {
		lo, hi, ok := strings.Cut(*wf.udpPorts, "-")
		a, err1 := strconv.ParseUint(lo, 10, 16)
		b, err2 := strconv.ParseUint(hi, 10, 16)
		bad(!ok || err1 != nil || err2 != nil || a == 0 || a > b, "--udp-ports %q: want MIN-MAX, e.g. 40000-40100", *wf.udpPorts)
		p.UDPPortMin, p.UDPPortMax = uint16(a), uint16(b)
	}
	if *wf.publicIP != "" {
		bad(net.ParseIP(*wf.publicIP) == nil, "--public-ip %q: not an IP address", *wf.publicIP)
		p.PublicIPs = []string{*wf.publicIP}
	}
	bad(*wf.whepMax < 1 || *wf.whepPerStream < 1 || *wf.whepBitrate < 50,
		"--whep-max-viewers and --whep-max-per-stream must be at least 1, --whep-bitrate at least 50 (kbit/s); got %d, %d, %d",
		*wf.whepMax, *wf.whepPerStream, *wf.whepBitrate)
	return errs
}

// motion reports whether emulated detectors see the objects motion
// estimates (--emulate-objects motion).
func (wf *whipFlags) motion() bool { return *wf.objects == "motion" }

// server builds the WHIP server for app on e, refusing an open server on a
// non-loopback address unless --open. It says at startup how it is secured.
func (wf *whipFlags) server(listen string, app *dag.App, sink whip.Sink, store *auth.Store, log *slog.Logger) (*whip.Server, error) {
	if errs := wf.check(); len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	cfg := wf.parsed
	cfg.Apps, cfg.Media = map[dag.AppID]float64{app.Name: app.FPS}, map[dag.AppID]dag.Media{app.Name: app.Media}
	cfg.Scale, cfg.MaxStreams, cfg.Auth = scaler, *wf.maxStreams, store
	cfg.OfferRates = auth.Rates{PerClient: *wf.ipRate, PerClientBurst: *wf.ipBurst, Global: *wf.offerRate, GlobalBurst: *wf.offerBurst}
	cfg.MaxPending, cfg.ConnectTimeout, cfg.CPUCores, cfg.CPUCeiling = *wf.maxPending, *wf.connect, *wf.cores, *wf.ceiling
	cfg.StreamCost, cfg.ShedAfter, cfg.MachineWide, cfg.Oversize = *wf.streamCost, *wf.shedAfter, *wf.cpuMachine, whip.Oversize(*wf.oversize)
	cfg.AllowOrigins, cfg.Log = *wf.origins, log
	if wf.delegate != nil {
		cfg.Delegate = wf.delegate
	}
	if *wf.objects == "motion" {
		cfg.Objects = motionObjects
	}
	if *wf.tokenFile != "" && store != nil {
		return nil, errors.New("--token-file and --tokens: give one (--token-file is the simple form: plaintext tokens for every app)")
	}
	if *wf.tokenFile != "" {
		toks, err := readTokens(*wf.tokenFile)
		if err != nil {
			return nil, fmt.Errorf("--token-file: %w", err)
		}
		cfg.Tokens = toks
	}
	if len(cfg.Tokens) == 0 && store == nil && !loopback(listen) && !*wf.open {
		return nil, fmt.Errorf("--listen %s is not a loopback address and no --tokens or --token-file is given: "+
			"anyone who can reach it could stream into the app; give --tokens FILE (mdag token new), or --open to accept that", listen)
	}
	srv, err := whip.New(cfg, sink)
	if err != nil {
		return nil, err
	}
	if slices.Contains(cfg.AllowOrigins, "*") {
		log.Warn("--allow-origin *: any web page a user of this server opens may call WHIP and /v1/streams (list, create and end streams with their token)")
	} else if len(cfg.AllowOrigins) > 0 {
		log.Info("WHIP and /v1/streams allow pages of other origins", "origins", cfg.AllowOrigins)
	}
	adm := srv.Admission()
	log.Info("WHIP admission", "max_streams", adm.MaxStreams, "max_pending", adm.MaxPending, "connect_timeout", *wf.connect,
		"cpu_capacity_cores", adm.CapacityCores, "stream_cost_cores", adm.StreamCost, "shed_after", *wf.shedAfter)
	switch {
	case srv.Open():
		log.Warn("WHIP ingest is open: no bearer token is required (give --tokens to require one)", "listen", listen)
	case store != nil:
		log.Info("WHIP ingest requires an ingest token for the app", "ingest_tokens", store.Count(auth.Ingest))
	default:
		log.Info("WHIP ingest requires a bearer token (--token-file: every app; the API is open)", "tokens", len(cfg.Tokens))
	}
	log.Info("WHIP offer rate limits", "per_ip_per_s", *wf.ipRate, "per_ip_burst", *wf.ipBurst, "global_per_s", *wf.offerRate, "global_burst", *wf.offerBurst)
	return srv, nil
}

// readTokens reads one token per line; blank lines and # comments are
// skipped. An empty file is an error (it would silently open the server).
func readTokens(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		t := strings.TrimSpace(sc.Text())
		if t == "" || strings.HasPrefix(t, "#") {
			continue
		}
		if strings.ContainsAny(t, " \t") {
			return nil, fmt.Errorf("%s:%d: a token cannot contain spaces", path, n)
		}
		if len(t) < auth.MinTokenLen {
			return nil, fmt.Errorf("%s:%d: a token of %d characters is too short to guard anything (want at least %d; mdag token new makes one)", path, n, len(t), auth.MinTokenLen)
		}
		out = append(out, t)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no tokens in the file", path)
	}
	return out, nil
}

// attach builds the WHIP server from the flags (server) and adds it to
// obs (setWhip); the func it returns closes the server.
func (wf *whipFlags) attach(listen string, app *dag.App, obs *observed, log *slog.Logger) (func(), error) {
	ws, err := wf.server(listen, app, obs.sink(), obs.auth, log)
	if err != nil {
		return nil, err
	}
	obs.setWhip(ws)
	// WHEP (annotated video out) on the same ICE settings as WHIP
	wcfg := whep.Config{Apps: []string{string(app.Name)}, FPS: max(1, int(app.FPS+0.5)), Log: log,
		MaxViewers: *wf.whepMax, MaxPerStream: min(*wf.whepPerStream, *wf.whepMax), BitrateKbps: *wf.whepBitrate}
	wcfg.UDPPortMin, wcfg.UDPPortMax = wf.parsed.UDPPortMin, wf.parsed.UDPPortMax // server checked them
	if *wf.publicIP != "" {
		wcfg.PublicIPs = []string{*wf.publicIP}
	}
	wv, err := whep.New(wcfg, obs.eg)
	if err != nil {
		ws.Close()
		return nil, fmt.Errorf("whep: %w", err)
	}
	obs.whep = wv.Handler()
	obs.whepSummary = func() string { return whepSummary(wv.Stats()) }
	obs.mx.SetEgress(func() []metrics.Egress { return egressMetrics(wv.Stats()) })
	log.Info("WHEP (annotated video out)", "endpoint", "/whep/"+string(app.Name)+"/{stream}", "max_viewers", wcfg.MaxViewers,
		"max_per_stream", wcfg.MaxPerStream, "bitrate_kbps", wcfg.BitrateKbps)
	return func() { wv.Close(); ws.Close() }, nil
}

// noWhepWhy says why GET /whep/player.js is a stub (no WHIP server).
const noWhepWhy = "it has no WebRTC server (WHIP ingest is off)"

// whepPlayerJS is what GET /whep/player.js serves when WHEP is on.
var whepPlayerJS = whep.PlayerJS

// whepSummary is serve's summary line for WHEP.
func whepSummary(st whep.Stats) string {
	var refused uint64
	var why []string
	for _, k := range slices.Sorted(maps.Keys(st.Refused)) {
		refused += st.Refused[k]
		why = append(why, fmt.Sprintf("%s %d", k, st.Refused[k]))
	}
	line := fmt.Sprintf("WHEP: %d viewers served (%d now, limits %d a stream, %d in all), %d frames encoded", st.Started, st.Viewers, st.MaxPerStream, st.MaxViewers, st.Totals.Encoded)
	if refused > 0 {
		line += fmt.Sprintf("; %d refused (%s)", refused, strings.Join(why, ", "))
	}
	if st.Totals.Errors > 0 {
		line += fmt.Sprintf("; %d ENCODER ERRORS", st.Totals.Errors)
	}
	if st.Totals.Evicted > 0 {
		line += fmt.Sprintf("; %d frames evicted before their result", st.Totals.Evicted)
	}
	return line
}

// egressMetrics are the WHEP server's figures for /metrics.
func egressMetrics(st whep.Stats) []metrics.Egress {
	out := make([]metrics.Egress, 0, len(st.Apps))
	for _, app := range st.Apps { // one app per server (serve, coordinator)
		out = append(out, metrics.Egress{App: app, Viewers: st.Viewers, Streams: len(st.Streams), Refused: st.Refused,
			Encoded: st.Totals.Encoded, EncodedBytes: st.Totals.EncodedBytes, Errors: st.Totals.Errors,
			Evicted: st.Totals.Evicted, Skipped: st.Totals.Skipped})
	}
	return out
}

// setWhip adds the WHIP server: its routes, its ingest counters, and the
// engine's results.
func (o *observed) setWhip(ws *whip.Server) {
	o.ws = ws
	o.mx.SetIngest(ws.IngestTotals)
	o.mx.SetIngestLoad(ws.CPULoad)
	o.rec.SetIngest(ws.Admission)
	publish := func(r coordinator.FrameResult) { ws.Publish(clientResult(r)) }
	o.results.publish.Store(&publish)
}

// IngestAudio makes tapSink a whip.AudioSink: an audio app's WHIP streams
// hand their PCM chunks to the engine (no thumbnail: there is no picture).
func (t tapSink) IngestAudio(id string, seq uint64, capture time.Time, a *media.Audio) error {
	return t.e.IngestAudio(id, seq, capture, a)
}

// motionObjects is a stream's motion estimator as WHIP's Objects.
func motionObjects() whip.Objects { return cv.NewMotion() }

// clientResult is the WHIP client's view of a frame's outcome.
func clientResult(r coordinator.FrameResult) whip.Result {
	out := whip.Result{Stream: r.Stream, Frame: r.Seq, Outcome: string(r.Outcome), LatencyMS: float64(r.Latency.Microseconds()) / 1000,
		Module: string(r.Module), Reason: string(r.Reason), Labels: r.Labels, Counts: r.Counts}
	for _, b := range r.Boxes {
		out.Boxes = append(out.Boxes, whipBox(b))
	}
	for _, t := range r.Tracks {
		out.Tracks = append(out.Tracks, whip.Track{ID: t.ID, Box: whipBox(t.Box), Age: t.Age, Missed: t.Missed})
	}
	for _, e := range r.Events {
		out.Events = append(out.Events, whip.Event{Kind: e.Kind, Rule: e.Rule, Track: e.Track, Detail: e.Detail})
	}
	return out
}

func whipBox(b media.Box) whip.Box {
	return whip.Box{X: b.X, Y: b.Y, W: b.W, H: b.H, Class: b.Class, Score: b.Score}
}
