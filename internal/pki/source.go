package pki

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"
)

// Material is one peer's TLS material, re-read when its files change: every
// handshake stats the three files (a cheap check, no timer, no
// goroutine) and reloads them when one was replaced or rewritten (another
// inode, modification time or size). A change that does not load (a
// key that does not match its certificate while the files are being
// replaced one by one, a certificate of the wrong role or from another
// CA) is logged once and the previous material stays in use until the
// files change again; connections already open are not affected.
//
// To rotate the CA without refusing anyone meanwhile, put both CA
// certificates in ca.pem (every peer trusts both), reissue every peer's
// certificate with the new CA, then remove the old CA from ca.pem.
type Material struct {
	role  Role
	files Files
	log   *slog.Logger
	now   func() time.Time

	mu      sync.Mutex
	cur     *material
	seen    [3]os.FileInfo // the files cur was read from
	bad     [3]os.FileInfo // the last files that did not load
	lastErr string
}

type material struct {
	cert tls.Certificate
	pool *x509.CertPool
	name string
}

// Load reads role's material from files; it fails, saying which file and
// what is wrong, when they do not load, the certificate is not role's,
// does not chain to the CA or has expired. log receives reloads (nil:
// discarded); now is the clock certificates are checked against (nil:
// time.Now).
func Load(files Files, role Role, log *slog.Logger, now func() time.Time) (*Material, error) {
	if _, err := ParseRole(string(role)); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if now == nil {
		now = time.Now
	}
	s := &Material{role: role, files: files, log: log, now: now}
	st, err := s.stat()
	if err != nil {
		return nil, err
	}
	m, err := s.load()
	if err != nil {
		return nil, err
	}
	s.cur, s.seen = m, st
	return s, nil
}

// Name is the current certificate's name (mdag://ROLE/NAME).
func (s *Material) Name() string { return s.material().name }

// Certificate is the current certificate (a reload happens first if the
// files changed).
func (s *Material) Certificate() *x509.Certificate { return s.material().cert.Leaf }

func (s *Material) stat() ([3]os.FileInfo, error) {
	var st [3]os.FileInfo
	for i, p := range []string{s.files.CA, s.files.Cert, s.files.Key} {
		fi, err := os.Stat(p)
		if err != nil {
			return st, err
		}
		st[i] = fi
	}
	return st, nil
}

func same(a, b [3]os.FileInfo) bool {
	for i := range a {
		if a[i] == nil || b[i] == nil || !os.SameFile(a[i], b[i]) || !a[i].ModTime().Equal(b[i].ModTime()) || a[i].Size() != b[i].Size() {
			return false
		}
	}
	return true
}

// material is the current material, reloaded first when the files changed.
func (s *Material) material() *material {
	s.mu.Lock()
	defer s.mu.Unlock()
	st, err := s.stat()
	if err == nil && (same(st, s.seen) || same(st, s.bad)) {
		return s.cur
	}
	var m *material
	if err == nil {
		m, err = s.load()
	}
	if err != nil {
		s.bad = st
		if err.Error() != s.lastErr {
			s.lastErr = err.Error()
			s.log.Error("tls: the changed certificate files do not load; still using the previous certificate", "role", s.role, "using", s.cur.name, "err", err)
		}
		return s.cur
	}
	s.cur, s.seen, s.lastErr = m, st, ""
	s.log.Info("tls: certificate reloaded", "role", s.role, "name", m.name, "serial", fmt.Sprintf("%x", m.cert.Leaf.SerialNumber), "expires", m.cert.Leaf.NotAfter.UTC().Format(time.RFC3339))
	return m
}

func (s *Material) load() (*material, error) {
	caPEM, err := os.ReadFile(s.files.CA)
	if err != nil {
		return nil, fmt.Errorf("CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("CA %s: no PEM certificate in it", s.files.CA)
	}
	pair, err := tls.LoadX509KeyPair(s.files.Cert, s.files.Key)
	if err != nil {
		return nil, fmt.Errorf("certificate %s with key %s: %w", s.files.Cert, s.files.Key, err)
	}
	leaf := pair.Leaf
	if leaf == nil {
		if leaf, err = x509.ParseCertificate(pair.Certificate[0]); err != nil {
			return nil, fmt.Errorf("certificate %s: %w", s.files.Cert, err)
		}
		pair.Leaf = leaf
	}
	role, name, err := RoleOf(leaf)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", s.files.Cert, err)
	}
	if role != s.role {
		return nil, fmt.Errorf("%s is a %s's certificate (mdag://%s/%s); a %s needs a %s's: mdag certs issue --role %s", s.files.Cert, role, role, name, s.role, s.role, s.role)
	}
	usage := x509.ExtKeyUsageServerAuth
	if role.client() {
		usage = x509.ExtKeyUsageClientAuth
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, CurrentTime: s.now(), KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
		return nil, fmt.Errorf("%s does not verify against the CA in %s: %w", s.files.Cert, s.files.CA, err)
	}
	return &material{cert: pair, pool: pool, name: fmt.Sprintf("mdag://%s/%s", role, name)}, nil
}

// h2 is the ALPN protocol gRPC requires.
var h2 = []string{"h2"}

// ServerConfig is the coordinator's TLS configuration: its current
// certificate, and client certificates required and verified against the
// current CA (the role is checked per RPC, by the server). Each handshake
// takes the material as it is then.
func (s *Material) ServerConfig() *tls.Config { return s.serverConfig(nil) }

// serverConfig is a server's TLS configuration with this material: client
// certificates required and verified against the current CA, then checked
// by verify (nil: no more).
func (s *Material) serverConfig(verify func(tls.ConnectionState) error) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		NextProtos: h2,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			m := s.material()
			return &tls.Config{
				MinVersion:       tls.VersionTLS13,
				NextProtos:       h2,
				Certificates:     []tls.Certificate{m.cert},
				ClientAuth:       tls.RequireAndVerifyClientCert,
				ClientCAs:        m.pool,
				Time:             s.now,
				VerifyConnection: verify,
			}, nil
		},
	}
}

// ClientConfig is a worker's or source's TLS configuration for one
// handshake: the coordinator's certificate must chain to the current CA,
// name serverName (empty: the host dialled) and carry the coordinator's
// role; the current certificate is presented.
func (s *Material) ClientConfig(serverName string) *tls.Config {
	m := s.material()
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		NextProtos: h2,
		ServerName: serverName,
		RootCAs:    m.pool,
		Time:       s.now,
		// Always present the certificate, even when the coordinator asks
		// for another CA's: it then refuses it and says why in its log.
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &m.cert, nil },
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("the coordinator presented no certificate")
			}
			role, name, err := RoleOf(cs.PeerCertificates[0])
			if err != nil {
				return fmt.Errorf("the coordinator's certificate: %w", err)
			}
			if role != Coordinator {
				return fmt.Errorf("the server's certificate is a %s's (mdag://%s/%s), not a coordinator's", role, role, name)
			}
			return nil
		},
	}
}

// PeerServerConfig is a worker's TLS configuration for its peer port (the
// direct data plane, issue 25): it presents its worker certificate and
// requires a worker's certificate from the current CA (a coordinator's or
// a source's is refused in the handshake). Each handshake takes the
// material as it is then.
func (s *Material) PeerServerConfig() *tls.Config {
	return s.serverConfig(func(cs tls.ConnectionState) error { return peerIsWorker(cs, "client") })
}

// PeerClientConfig is a worker's TLS configuration for fetching frames from
// another worker's peer port: it presents its certificate and accepts only
// a worker's certificate from the current CA. The server's host name is
// not checked: workers come and go at addresses no certificate can name
// (pod IPs); what a peer is comes from its certificate's role, as on the
// coordinator's port.
func (s *Material) PeerClientConfig() *tls.Config {
	m := s.material()
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		NextProtos: h2,
		// The chain is verified below, against the CA, without the host
		// name (and for a worker's key usage, client authentication: a
		// worker's certificate serves both ends of the peer port).
		InsecureSkipVerify:   true,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &m.cert, nil },
		VerifyConnection: func(cs tls.ConnectionState) error {
			if err := peerIsWorker(cs, "server"); err != nil {
				return err
			}
			inter := x509.NewCertPool()
			for _, c := range cs.PeerCertificates[1:] {
				inter.AddCert(c)
			}
			if _, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: m.pool, Intermediates: inter, CurrentTime: s.now(),
				KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
				return fmt.Errorf("the peer server's certificate: %w", err)
			}
			return nil
		},
	}
}

// IngestServerConfig is a worker's TLS configuration for its ingest port
// (issue 41: the camera streams the coordinator routes to it): it presents
// its worker certificate and requires a source's certificate from the
// current CA. A source dials it with PeerClientConfig (its own
// certificate; a worker's expected back).
func (s *Material) IngestServerConfig() *tls.Config {
	return s.serverConfig(func(cs tls.ConnectionState) error {
		return peerHasRole(cs, "client", Source, "only sources send cameras to a worker's ingest port")
	})
}

// peerIsWorker checks that the other end of a peer connection is a worker.
func peerIsWorker(cs tls.ConnectionState, side string) error {
	return peerHasRole(cs, side, Worker, "only workers talk on the peer port")
}

// peerHasRole checks that the other end of a connection has role; only
// says who may, in the refusal.
func peerHasRole(cs tls.ConnectionState, side string, want Role, only string) error {
	if len(cs.PeerCertificates) == 0 {
		return fmt.Errorf("the peer %s presented no certificate", side)
	}
	role, name, err := RoleOf(cs.PeerCertificates[0])
	if err != nil {
		return fmt.Errorf("the peer %s's certificate: %w", side, err)
	}
	if role != want {
		return fmt.Errorf("the peer %s's certificate is a %s's (mdag://%s/%s); %s", side, role, role, name, only)
	}
	return nil
}
