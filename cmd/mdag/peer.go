package main

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/mdag/mdag/internal/pki"
	"github.com/mdag/mdag/internal/unixsock"
	"github.com/mdag/mdag/observe/dashboard"
	"github.com/mdag/mdag/remote/client"
)

// peerFlags are a worker's direct data plane flags (issue 25): where its
// Peer service listens, the address other workers reach it at, and how
// many frames it holds for them.
type peerFlags struct {
	listen, advertise             *string
	storeMiB, inline              *int
	ingestListen, ingestAdvertise *string
	whipUDP, whipIP               *string
	whipNet                       whipNet // parsed by check
}

// whipNet is where a worker's WHIP streams take their media: the UDP port
// range (0-0: ephemeral) and the IP announced instead of the local ones.
type whipNet struct {
	udpMin, udpMax uint16
	publicIP       string
}

func addPeerFlags(fs *flag.FlagSet) *peerFlags {
	return &peerFlags{
		listen: fs.String("peer-listen", "", "the direct data plane: `ADDR` where other workers fetch the frames this worker's modules make "+
			"(the coordinator routes references, not pixels); default 127.0.0.1:0 when --coordinator is loopback (not unix:, whose uid checks a loopback port would undo), otherwise none; "+
			"\"off\": none (this worker's outputs travel through the coordinator)"),
		advertise: fs.String("advertise", "", "the `IP:PORT` other workers reach --peer-listen at: the IP this worker connects to the coordinator from (the coordinator checks; "+
			"default: --peer-listen's address when it names an IP; on Kubernetes: $(POD_IP):PORT)"),
		storeMiB: fs.Int("peer-store", client.DefaultStoreBytes>>20, "MiB of frames held for other workers; past it the frame due to expire first goes "+
			"(a fetch of it fails and its frame is dropped peer-lost)"),
		inline: fs.Int("peer-inline", client.DefaultInlineBelow, "output frames of fewer `BYTES` of pixels (crops) travel inline through the coordinator: cheaper than a fetch; 0: every frame by reference"),
		ingestListen: fs.String("ingest-listen", "", "ingest on this worker: `ADDR` where the camera streams the coordinator routes here arrive (mdag source); "+
			"their frames stay in this worker's store and the coordinator gets each frame's identity only. Needs the direct data plane (--peer-listen); default none"),
		ingestAdvertise: fs.String("ingest-advertise", "", "the `IP:PORT` sources reach --ingest-listen at: the IP this worker connects to the coordinator from (the coordinator checks; "+
			"default: --ingest-listen's address when it names an IP)"),
		whipUDP: fs.String("udp-ports", "", "with --ingest-listen (the full build): the UDP port range `MIN-MAX` the WHIP streams the coordinator hands here take their media on (default: ephemeral)"),
		whipIP: fs.String("public-ip", "", "with --ingest-listen (the full build): the `IP` announced in the ICE candidates of the WHIP streams the coordinator hands here, "+
			"instead of the local addresses (1:1 NAT, e.g. a node's external IP: WHIP clients must reach it)"),
	}
}

// address is where the Peer service listens ("" for none): --peer-listen,
// or by default a loopback port beside a loopback --coordinator coord.
func (f *peerFlags) address(coord string) string {
	switch {
	case *f.listen == "off":
		return ""
	case *f.listen == "" && loopbackTarget(coord) && !unixsock.IsTarget(coord):
		// not beside a unix: coordinator: a loopback peer port is open to
		// every local user, what the Unix socket is there to avoid
		return "127.0.0.1:0"
	}
	return *f.listen
}

// check returns every problem with the flags, for a worker of coordinator
// coord, with mutual TLS or not.
func (f *peerFlags) check(coord string, tls bool) []error {
	var errs []error
	switch {
	case *f.listen == "" && *f.advertise != "":
		errs = append(errs, errors.New("--advertise without --peer-listen: give the address to listen at too"))
	case *f.listen == "off" && *f.advertise != "":
		errs = append(errs, errors.New("--advertise with --peer-listen off: there is no peer port to advertise"))
	}
	if *f.inline < 0 {
		errs = append(errs, fmt.Errorf("--peer-inline %d: want >= 0 bytes", *f.inline))
	}
	if *f.storeMiB <= 0 {
		errs = append(errs, fmt.Errorf("--peer-store %d: want > 0 MiB", *f.storeMiB))
	}
	if listen := f.address(coord); listen != "" && !tls && !loopback(listen) {
		errs = append(errs, fmt.Errorf("--peer-listen %s is not a loopback address, so the peer port needs mutual TLS: give --tls-dir (mdag certs init)", listen))
	}
	if adv := *f.advertise; adv != "" {
		if h, p, err := net.SplitHostPort(adv); err != nil || net.ParseIP(h) == nil || p == "" {
			errs = append(errs, fmt.Errorf("--advertise %q: want IP:PORT, the address other workers reach this one at (the coordinator checks it is the address this worker connects from)", adv))
		}
	}
	return append(errs, f.checkIngest(coord, tls)...)
}

// checkWhipNet parses --udp-ports and --public-ip into whipNet.
func (f *peerFlags) checkWhipNet() []error {
	var errs []error
	udp, ip := *f.whipUDP, *f.whipIP
	switch {
	case (udp != "" || ip != "") && *f.ingestListen == "":
		errs = append(errs, errors.New("--udp-ports and --public-ip are for the WHIP streams an ingest worker takes: give --ingest-listen"))
	case (udp != "" || ip != "") && !workerTakesWhip:
		errs = append(errs, errors.New("--udp-ports and --public-ip: the lean build takes no WHIP streams (the full build, bin/mdag, does)"))
	}
	if udp != "" {
		lo, hi, ok := strings.Cut(udp, "-")
		a, err1 := strconv.ParseUint(lo, 10, 16)
		b, err2 := strconv.ParseUint(hi, 10, 16)
		if !ok || err1 != nil || err2 != nil || a == 0 || a > b {
			errs = append(errs, fmt.Errorf("--udp-ports %q: want MIN-MAX, e.g. 40000-40100", udp))
		} else {
			f.whipNet.udpMin, f.whipNet.udpMax = uint16(a), uint16(b)
		}
	}
	if ip != "" {
		if net.ParseIP(ip) == nil {
			errs = append(errs, fmt.Errorf("--public-ip %q: not an IP address", ip))
		} else {
			f.whipNet.publicIP = ip
		}
	}
	return errs
}

// checkIngest returns every problem with the ingest flags.
func (f *peerFlags) checkIngest(coord string, tls bool) []error {
	var errs []error
	in, adv := *f.ingestListen, *f.ingestAdvertise
	switch {
	case in == "" && adv != "":
		errs = append(errs, errors.New("--ingest-advertise without --ingest-listen: give the address to listen at too"))
	case in != "" && f.address(coord) == "":
		errs = append(errs, fmt.Errorf("--ingest-listen %s without the direct data plane: the first module's worker fetches the frames from this one, so give --peer-listen too", in))
	case in != "" && !tls && !loopback(in):
		errs = append(errs, fmt.Errorf("--ingest-listen %s is not a loopback address, so the ingest port needs mutual TLS: give --tls-dir (mdag certs init)", in))
	}
	errs = append(errs, f.checkWhipNet()...)
	if adv != "" {
		if h, p, err := net.SplitHostPort(adv); err != nil || net.ParseIP(h) == nil || p == "" {
			errs = append(errs, fmt.Errorf("--ingest-advertise %q: want IP:PORT, the address sources reach this worker's ingest port at (the coordinator checks it is the address this worker connects from)", adv))
		}
	}
	return errs
}

// startIngest listens and serves the Ingest service on dp's worker, with
// mutual TLS when m is set; it returns how to stop it (nothing without
// --ingest-listen).
func (f *peerFlags) startIngest(dp *client.DataPlane, m *pki.Material, log *slog.Logger) (func(), error) {
	if *f.ingestListen == "" {
		return func() {}, nil
	}
	ln, err := net.Listen("tcp", *f.ingestListen)
	if err != nil {
		return nil, fmt.Errorf("--ingest-listen %s: %w", *f.ingestListen, err)
	}
	addr := *f.ingestAdvertise
	if a := ln.Addr().(*net.TCPAddr); addr == "" && a.IP.IsUnspecified() {
		ln.Close()
		return nil, fmt.Errorf("--ingest-listen %s listens on every interface: give --ingest-advertise IP:PORT, the address sources reach it at", *f.ingestListen)
	} else if addr == "" {
		addr = a.String()
	}
	// thumbnails for the coordinator's dashboard, while it is read
	// and the coordinator's cameras it assigns here (the full build)
	// and the WHIP streams it delegates here
	dp.Ingest = &client.IngestServer{Addr: addr, Thumb: thumbEncoder, ThumbWidth: dashboard.ThumbWidth, Cameras: workerCameras(log)}
	dp.Ingest.Whip = workerWhipFor(dp.Ingest, f.whipNet, log)
	var opts []grpc.ServerOption
	if m != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(m.IngestServerConfig())))
	}
	g := client.NewIngestGRPC(dp.Ingest, opts...)
	go func() { _ = g.Serve(ln) }()
	log.Info("ingest: camera streams the coordinator routes here keep their frames here", "ingest_listen", ln.Addr().String(), "advertise", addr)
	return g.Stop, nil
}

// start listens and serves the Peer service, with mutual TLS when m is
// set (plaintext on loopback only, as on the coordinator's port), and
// returns the worker's data plane and how to stop it. The flags are
// checked (check).
func (f *peerFlags) start(id, coord string, m *pki.Material, log *slog.Logger) (*client.DataPlane, func(), error) {
	dial := client.Dial
	if m != nil {
		dial = func(addr string) (*grpc.ClientConn, error) { return client.DialPeerTLS(addr, m) }
	}
	dp := &client.DataPlane{Dial: dial, InlineBelow: *f.inline}
	if *f.inline == 0 {
		dp.InlineBelow = -1
	}
	listen := f.address(coord)
	if listen == "" {
		log.Info("data plane: relay: this worker's outputs travel through the coordinator (give --peer-listen and --advertise for the direct data plane)")
		return dp, func() {}, nil
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, nil, fmt.Errorf("--peer-listen %s: %w", listen, err)
	}
	dp.Addr = *f.advertise
	if a := ln.Addr().(*net.TCPAddr); dp.Addr == "" && a.IP.IsUnspecified() {
		ln.Close()
		return nil, nil, fmt.Errorf("--peer-listen %s listens on every interface: give --advertise HOST:PORT, the address other workers reach it at", listen)
	} else if dp.Addr == "" {
		dp.Addr = a.String()
	}
	dp.Store = &client.Store{MaxBytes: int64(*f.storeMiB) << 20}
	var opts []grpc.ServerOption
	if m != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(m.PeerServerConfig())))
	}
	g := client.NewPeerGRPC(&client.PeerServer{ID: id, Store: dp.Store}, opts...)
	go func() { _ = g.Serve(ln) }()
	tlsMode := "mutual TLS"
	if m == nil {
		tlsMode = "plaintext, loopback"
	}
	log.Info("data plane: direct: frames this worker makes stay here for the next module's worker", "peer_listen", ln.Addr().String(), "advertise", dp.Addr, "tls", tlsMode, "store_mib", *f.storeMiB)
	stopIngest, err := f.startIngest(dp, m, log)
	if err != nil {
		g.Stop()
		return nil, nil, err
	}
	return dp, func() { stopIngest(); g.Stop() }, nil
}
