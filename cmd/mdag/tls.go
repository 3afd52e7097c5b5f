package main

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"time"

	"google.golang.org/grpc"

	"github.com/mdag/mdag/internal/pki"
	"github.com/mdag/mdag/internal/unixsock"
	"github.com/mdag/mdag/remote"
	"github.com/mdag/mdag/remote/client"
)

// tlsFlags are the gRPC security flags of coordinator, worker and source
// (issue 22). The policy: mutual TLS with --tls-dir (or --ca, --cert,
// --key); plaintext only on a loopback address, where it is also the
// default, so that one machine runs coordinator, workers and sources with
// no setup (as the HTTP side is open on loopback); off loopback, TLS is
// required and --insecure is refused. On a Unix socket (unix:/PATH, issue
// 36) gRPC is plaintext and TLS is refused: both ends check the other's
// uid (internal/unixsock), which authenticates them where a loopback port
// does not (any local user may connect to it, or bind it first).
type tlsFlags struct {
	dir, ca, cert, key *string
	serverName         *string // clients only
	insecure           *bool
	plain              bool // dial chose plaintext
	// shared are the coordinator's --shared-cert (issue 36): certificates
	// several workers or sources share, and what each may claim.
	shared []remote.SharedCert
}

func addTLSFlags(fs *flag.FlagSet, client bool) *tlsFlags {
	f := &tlsFlags{
		dir:      fs.String("tls-dir", "", "mutual TLS on gRPC with the files in `DIR`: ca.pem, ROLE.pem, ROLE-key.pem (made by mdag certs init --dir DIR); re-read when they change. Not with a unix:/PATH gRPC address: there each end checks the other's uid instead"),
		ca:       fs.String("ca", "", "the CA certificate peers must chain to (PEM; default --tls-dir's ca.pem)"),
		cert:     fs.String("cert", "", "this peer's certificate (PEM; default --tls-dir's ROLE.pem)"),
		key:      fs.String("key", "", "this peer's private key (PEM; default --tls-dir's ROLE-key.pem)"),
		insecure: fs.Bool("insecure", false, "plaintext gRPC; refused unless the gRPC address is loopback or a unix:/PATH socket (plaintext is already the default there without --tls-dir)"),
	}
	if client {
		f.serverName = fs.String("server-name", "", "the name the coordinator's certificate must carry (default: the host of --coordinator)")
	} else {
		fs.Func("shared-cert", "with mutual TLS, a certificate several workers or sources share, as `ROLE/NAME=PREFIX[,PREFIX...]` (repeatable), e.g. worker/worker=mdag-worker-,P100-,V100-,CPU- "+
			"for one Kubernetes Secret in every worker pod: its holders may register worker IDs (join streams) starting with a PREFIX (* for any), and no other. "+
			"Any other certificate registers only as its own name (mdag://worker/NAME: --id NAME) and joins only stream NAME or NAME/...", func(s string) error {
			c, err := remote.ParseSharedCert(s)
			if err != nil {
				return err
			}
			for _, o := range f.shared {
				if o.Role == c.Role && o.Name == c.Name {
					return fmt.Errorf("%s/%s is given twice: list all its prefixes in one --shared-cert", c.Role, c.Name)
				}
			}
			f.shared = append(f.shared, c)
			return nil
		})
	}
	return f
}

// grpcMode is how a process's gRPC runs, by its TLS flags and address.
type grpcMode int

const (
	plainUnix     grpcMode = iota // a Unix socket: each end checks the other's uid
	plainLoopback                 // loopback, no TLS flags: plaintext, with a warning
	mutualTLS
)

// mode is how gRPC runs on addr (the value of the flag named flagName)
// with these flags, or what is wrong with them: a check of the flags
// alone, for validate; material loads what it chose.
func (f *tlsFlags) mode(flagName, addr string) (grpcMode, error) {
	given := *f.dir != "" || *f.ca != "" || *f.cert != "" || *f.key != ""
	local := loopbackTarget(addr)
	unix := unixsock.IsTarget(addr)
	howTo := "create certificates with `mdag certs init --dir certs --hosts HOST,IP` (HOST, IP: the coordinator's name and address) and give every process --tls-dir certs"
	switch {
	case *f.insecure && given:
		return 0, errors.New("--insecure with --tls-dir/--ca/--cert/--key: choose plaintext or TLS")
	case unix && (given || len(f.shared) > 0):
		what := "--tls-dir/--ca/--cert/--key"
		if !given {
			what = "--shared-cert"
		}
		return 0, fmt.Errorf("%s with %s %s: gRPC on a Unix socket is plaintext, its two ends authenticated by their uids "+
			"(only this user and root may use the socket, and each end checks the other's with SO_PEERCRED), so mutual TLS adds nothing there; "+
			"drop %s, or give a HOST:PORT for mutual TLS", what, flagName, addr, what)
	case unix:
		return plainUnix, nil
	case *f.insecure && !local:
		return 0, fmt.Errorf("--insecure with %s %s: plaintext gRPC is allowed only on a loopback address (127.0.0.1, ::1, localhost): "+
			"anyone who can reach it could register as a worker and receive camera frames, or send frames; %s", flagName, addr, howTo)
	case !given && !local:
		return 0, fmt.Errorf("%s %s is not a loopback address, so gRPC needs mutual TLS: %s (plaintext, --insecure, is allowed on loopback only)", flagName, addr, howTo)
	case !given && len(f.shared) > 0:
		return 0, errors.New("--shared-cert names certificates, but gRPC is plaintext: give --tls-dir too")
	case !given:
		return plainLoopback, nil
	}
	if *f.dir == "" {
		for _, o := range []struct{ flag, v string }{{"--ca", *f.ca}, {"--cert", *f.cert}, {"--key", *f.key}} {
			if o.v == "" {
				return 0, fmt.Errorf("%s is missing: give --tls-dir DIR, or all of --ca, --cert and --key", o.flag)
			}
		}
	}
	return mutualTLS, nil
}

// material loads role's TLS material, or returns nil for plaintext when
// that is allowed on addr (the value of the flag named flagName).
func (f *tlsFlags) material(role pki.Role, flagName, addr string, log *slog.Logger) (*pki.Material, error) {
	mode, err := f.mode(flagName, addr)
	switch {
	case err != nil:
		return nil, err
	case mode == plainUnix:
		log.Info("gRPC is plaintext on a Unix socket: only this user and root may use it, each end checking the other's uid (SO_PEERCRED)", strings.TrimPrefix(flagName, "--"), addr)
		return nil, nil
	case mode == plainLoopback:
		log.Warn("gRPC is plaintext, on loopback: any process on this machine may connect, and any local user may take the port first; "+
			"give --tls-dir for mutual TLS (mdag certs init), or use a Unix socket, authenticated by uid: --grpc unix:/PATH on the coordinator, --coordinator unix:/PATH on workers and sources",
			strings.TrimPrefix(flagName, "--"), addr)
		return nil, nil
	}
	for _, c := range f.shared {
		log.Warn("a shared certificate: any of its holders may claim any ID or stream of its prefixes", "shared_cert", c.String())
	}
	var files pki.Files
	if *f.dir != "" {
		files = pki.DirFiles(*f.dir, role)
	}
	for _, o := range []struct{ v, dst *string }{{f.ca, &files.CA}, {f.cert, &files.Cert}, {f.key, &files.Key}} {
		if *o.v != "" {
			*o.dst = *o.v
		}
	}
	m, err := pki.Load(files, role, log, nil)
	if err != nil {
		return nil, fmt.Errorf("TLS: %w", err)
	}
	c := m.Certificate()
	log.Info("gRPC mutual TLS", "cert", m.Name(), "ca", files.CA, "expires", c.NotAfter.UTC().Format(time.RFC3339))
	if left := time.Until(c.NotAfter); left < 30*24*time.Hour {
		log.Warn("the certificate expires soon: issue a new one (mdag certs issue --force); it is picked up without a restart", "cert", files.Cert, "in", left.Round(time.Hour))
	}
	return m, nil
}

// dial connects a worker or source to the coordinator at addr, with
// mutual TLS or, where allowed, in plaintext (on a Unix socket, only to a
// coordinator of this uid or root: client.Dial checks); it also returns
// the TLS material (nil: plaintext).
func (f *tlsFlags) dial(role pki.Role, addr string, log *slog.Logger) (*grpc.ClientConn, *pki.Material, error) {
	m, err := f.material(role, "--coordinator", addr, log)
	if err != nil {
		return nil, nil, err
	}
	var cc *grpc.ClientConn
	f.plain = m == nil
	if m == nil {
		cc, err = client.Dial(addr)
	} else {
		cc, err = client.DialTLS(addr, m, *f.serverName)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("--coordinator %s: %w", addr, err)
	}
	return cc, m, nil
}

// explain adds what a mismatch of TLS and plaintext between this client
// and the coordinator looks like to err, which gRPC reports in transport
// terms.
func (f *tlsFlags) explain(err error) error {
	switch {
	case err == nil:
		return nil
	case f.plain && strings.Contains(err.Error(), "server preface"):
		return fmt.Errorf("%w (the coordinator may require TLS: give this process --tls-dir too)", err)
	case !f.plain && strings.Contains(err.Error(), "first record does not look like a TLS handshake"):
		return fmt.Errorf("%w (the coordinator speaks plaintext: it runs without --tls-dir)", err)
	}
	return err
}

// loopback reports whether a listen address (host:port) is on this host
// only: localhost or a loopback IP.
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

// loopbackTarget reports whether a gRPC address (host:port, or a target
// such as dns:///host:port) names only this machine. A Unix socket is
// local too.
func loopbackTarget(addr string) bool {
	if strings.HasPrefix(addr, "unix:") || strings.HasPrefix(addr, "unix-abstract:") {
		return true
	}
	if strings.Contains(addr, "://") {
		u, err := url.Parse(addr)
		if err != nil {
			return false
		}
		addr = strings.TrimPrefix(u.Path, "/")
	}
	return loopback(addr)
}

// grpcPort is the coordinator's gRPC server: *grpc.Server in plaintext,
// *remote.TLSServer with mutual TLS.
type grpcPort interface {
	Serve(net.Listener) error
	Stop()
	GracefulStop()
}

func grpcServer(s *remote.Server, m *pki.Material) grpcPort {
	if m == nil {
		return remote.NewGRPC(s)
	}
	return remote.NewTLSGRPC(s, m)
}

// grpcSecurity says how the gRPC port at addr is protected, for the
// start-up log.
func grpcSecurity(m *pki.Material, addr string) string {
	switch {
	case m != nil:
		return "mutual TLS"
	case unixsock.IsTarget(addr):
		return "plaintext (Unix socket: this uid and root only, peers checked)"
	}
	return "plaintext (loopback)"
}
