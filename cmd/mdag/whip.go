package main

import (
	"bufio"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/ingest"
	"github.com/mdag/mdag/ingest/whip"
	"github.com/mdag/mdag/internal/engine"
)

// whipFlags are the WebRTC ingest flags of serve and coordinator.
type whipFlags struct {
	tokenFile  *string
	open       *bool
	maxStreams *int
	maxRes     *string
	oversize   *string
	udpPorts   *string
	publicIP   *string
	objects    *string
	origins    *originList
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
		origins:    origins,
		tokenFile:  fs.String("token-file", "", "bearer tokens accepted for WHIP and results, one per line (# comments); none: open, allowed only on a loopback --listen unless --open"),
		open:       fs.Bool("open", false, "accept WHIP streams without a token on a non-loopback --listen"),
		maxStreams: fs.Int("max-streams", 64, "most WHIP streams at once; more get 503 with Retry-After"),
		maxRes:     fs.String("max-resolution", "1920x1080", "largest decoded frame WxH handed to the session"),
		oversize:   fs.String("oversize", string(whip.Downscale), "frames above --max-resolution: downscale or reject (ends the stream)"),
		udpPorts:   fs.String("udp-ports", "", "UDP port range for WebRTC media, MIN-MAX (default: ephemeral)"),
		publicIP:   fs.String("public-ip", "", "IP to announce in ICE candidates instead of local addresses (1:1 NAT, e.g. a node's external IP)"),
		objects:    fs.String("emulate-objects", "motion", "what emulated GPU detectors report for WebRTC video, which has no ground truth: motion (moving regions, by background subtraction) or none"),
	}
}

// server builds the WHIP server for app on e, refusing an open server on a
// non-loopback address unless --open. It says at startup how it is secured.
func (wf *whipFlags) server(cmd, listen string, app *dag.App, sink whip.Sink, log *slog.Logger) (*whip.Server, error) {
	cfg := whip.Config{Apps: map[dag.AppID]float64{app.Name: app.FPS}, MaxStreams: *wf.maxStreams,
		Oversize: whip.Oversize(*wf.oversize), AllowOrigins: *wf.origins, Log: log}
	switch *wf.objects {
	case "motion":
		cfg.Objects = motionObjects
	case "none":
	default:
		return nil, fmt.Errorf("mdag %s: --emulate-objects %q: want motion or none", cmd, *wf.objects)
	}
	if *wf.maxStreams <= 0 {
		return nil, fmt.Errorf("mdag %s: --max-streams %d: want > 0", cmd, *wf.maxStreams)
	}
	w, h, err := parseSize(*wf.maxRes)
	if err != nil || w <= 0 || h <= 0 {
		return nil, fmt.Errorf("mdag %s: --max-resolution %q: want WxH, e.g. 1280x720", cmd, *wf.maxRes)
	}
	cfg.MaxWidth, cfg.MaxHeight = w, h
	if *wf.udpPorts != "" {
		lo, hi, ok := strings.Cut(*wf.udpPorts, "-")
		a, err1 := strconv.ParseUint(lo, 10, 16)
		b, err2 := strconv.ParseUint(hi, 10, 16)
		if !ok || err1 != nil || err2 != nil || a == 0 || a > b {
			return nil, fmt.Errorf("mdag %s: --udp-ports %q: want MIN-MAX, e.g. 40000-40100", cmd, *wf.udpPorts)
		}
		cfg.UDPPortMin, cfg.UDPPortMax = uint16(a), uint16(b)
	}
	if *wf.publicIP != "" {
		if net.ParseIP(*wf.publicIP) == nil {
			return nil, fmt.Errorf("mdag %s: --public-ip %q: not an IP address", cmd, *wf.publicIP)
		}
		cfg.PublicIPs = []string{*wf.publicIP}
	}
	if *wf.tokenFile != "" {
		toks, err := readTokens(*wf.tokenFile)
		if err != nil {
			return nil, fmt.Errorf("mdag %s: --token-file: %w", cmd, err)
		}
		cfg.Tokens = toks
	}
	if len(cfg.Tokens) == 0 && !loopback(listen) && !*wf.open {
		return nil, fmt.Errorf("mdag %s: --listen %s is not a loopback address and no --token-file is given: "+
			"anyone who can reach it could stream into the app; give --token-file FILE, or --open to accept that", cmd, listen)
	}
	srv, err := whip.New(cfg, sink)
	if err != nil {
		return nil, fmt.Errorf("mdag %s: %w", cmd, err)
	}
	if slices.Contains(cfg.AllowOrigins, "*") {
		log.Warn("--allow-origin *: any web page a user of this server opens may call WHIP and /v1/streams (list, create and end streams with their token)")
	} else if len(cfg.AllowOrigins) > 0 {
		log.Info("WHIP and /v1/streams allow pages of other origins", "origins", cfg.AllowOrigins)
	}
	if srv.Open() {
		log.Warn("WHIP ingest is open: no bearer token is required (give --token-file to require one)", "listen", listen)
	} else {
		log.Info("WHIP ingest requires a bearer token", "tokens", len(cfg.Tokens))
	}
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

func loopback(listen string) bool {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// frameSink is an engine OnFrame that forwards results to a WHIP server
// set after the engine is built.
type frameSink struct{ srv atomic.Pointer[whip.Server] }

func (f *frameSink) onFrame(r engine.FrameResult) {
	s := f.srv.Load()
	if s == nil {
		return
	}
	s.Publish(whip.FromEngine(r))
}

// motionObjects is a stream's motion estimator as WHIP's Objects.
func motionObjects() whip.Objects { return ingest.NewMotion() }
