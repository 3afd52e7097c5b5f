package remote

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/mdag/mdag/allocator/milp"
	"github.com/mdag/mdag/api"
	"github.com/mdag/mdag/coordinator"
	"github.com/mdag/mdag/ingest/synth"
	"github.com/mdag/mdag/internal/pki"
	"github.com/mdag/mdag/remote/client"
	src "github.com/mdag/mdag/remote/source"
)

// logBuf is a log sink safe for the server's goroutines.
type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

type tlsCoordinator struct {
	e    *coordinator.Engine
	srv  *Server
	addr string
	log  *logBuf
}

// startTLS serves the traffic app over mutual TLS with the coordinator's
// material in dir.
func startTLS(t *testing.T, dir string) *tlsCoordinator { t.Helper(); return startTLSWith(t, dir, nil) }

// startTLSWith is startTLS with tune changing the Server before it serves.
func startTLSWith(t *testing.T, dir string, tune func(*Server)) *tlsCoordinator {
	t.Helper()
	m, err := pki.Load(pki.DirFiles(dir, pki.Coordinator), pki.Coordinator, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	e := newEngine(t, coordinator.Config{MILPSolver: milp.Solver{}})
	e.Start()
	app, prof := loadExample(t, "traffic")
	if err := e.Deploy(app, prof); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	lb := &logBuf{}
	srv := &Server{Engine: e, Heartbeat: 200 * time.Millisecond, Log: slog.New(slog.NewTextHandler(lb, nil))}
	if tune != nil {
		tune(srv)
	}
	g := NewTLSGRPC(srv, m)
	go func() { _ = g.Serve(ln) }()
	t.Cleanup(func() {
		e.Close()
		g.Stop()
	})
	return &tlsCoordinator{e: e, srv: srv, addr: ln.Addr().String(), log: lb}
}

func material(t *testing.T, files pki.Files, role pki.Role) *pki.Material {
	t.Helper()
	m, err := pki.Load(files, role, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// dialCreds dials with any credentials (the tests' impostors).
func dialCreds(t *testing.T, addr string, creds credentials.TransportCredentials) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

func dialTLS(t *testing.T, addr string, m *pki.Material) *grpc.ClientConn {
	t.Helper()
	cc, err := client.DialTLS(addr, m, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// runWorker runs RunWorker until it returns or the test ends; the returned
// channel gets its error.
func runWorker(t *testing.T, cc *grpc.ClientConn, id string) <-chan error {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		done <- client.RunWorker(ctx, cc, client.WorkerConfig{ID: id, Type: "CPU"})
	}()
	t.Cleanup(func() {
		cancel()
		<-finished
	})
	return done
}

func (c *tlsCoordinator) registered(id string) bool {
	for _, w := range c.srv.Workers() {
		if w == id {
			return true
		}
	}
	return false
}

// TestMutualTLS (issue 22): on the coordinator's TLS port only a worker's
// certificate from its CA registers and only a source's sends frames; no
// certificate, another CA's, or the other role's is refused before the
// handler runs (no registration, no join), with an error that says why,
// and the coordinator logs each refusal.
func TestMutualTLS(t *testing.T) {
	dir, other := t.TempDir(), t.TempDir()
	for _, d := range []string{dir, other} {
		if _, err := pki.Init(d, pki.InitOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	c := startTLS(t, dir)
	worker := material(t, pki.DirFiles(dir, pki.Worker), pki.Worker)
	source := material(t, pki.DirFiles(dir, pki.Source), pki.Source)
	roots := worker.ClientConfig("").RootCAs
	foreign := material(t, pki.DirFiles(other, pki.Worker), pki.Worker).ClientConfig("127.0.0.1")
	foreign.RootCAs = roots // it trusts the coordinator; the coordinator does not trust it
	// A source's material presented as a worker: same CA, wrong role.
	asWorker := source.ClientConfig("127.0.0.1")

	t.Run("worker registers", func(t *testing.T) {
		// under mutual TLS a worker registers as its certificate's name
		done := runWorker(t, dialTLS(t, c.addr, worker), "worker")
		waitFor(t, "the worker to register", 10*time.Second, func() bool { return c.registered("worker") })
		select {
		case err := <-done:
			t.Fatalf("the worker stopped: %v", err)
		default:
		}
		// the log line may come just after the registration the engine sees
		waitFor(t, "the coordinator to log the worker's certificate", 10*time.Second, func() bool {
			return strings.Contains(c.log.String(), "cert=mdag://worker/worker")
		})
	})
	for _, tc := range []struct {
		name  string
		creds credentials.TransportCredentials
		code  codes.Code
		want  string // in the worker's error
		log   string // in the coordinator's log
	}{
		// A refused handshake reaches the client as a TLS alert or, when
		// it was still writing, a broken connection: the coordinator's log
		// says why.
		{"no certificate", credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS13, RootCAs: roots, ServerName: "127.0.0.1"}), codes.Unavailable,
			"", "client didn't provide a certificate"},
		{"another CA's certificate", credentials.NewTLS(foreign), codes.Unavailable,
			"", "certificate signed by unknown authority"},
		{"a source's certificate", credentials.NewTLS(asWorker), codes.PermissionDenied,
			"the certificate mdag://source/source has role source; this call needs role worker", "gRPC call refused"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := "w-" + strings.ReplaceAll(tc.name, " ", "-")
			id = strings.ReplaceAll(id, "'", "")
			var err error
			select {
			case err = <-runWorker(t, dialCreds(t, c.addr, tc.creds), id):
			case <-time.After(20 * time.Second):
				t.Fatal("the worker was neither refused nor stopped")
			}
			if got := status.Code(errors.Unwrap(err)); got != tc.code || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("worker: %v (code %v), want %v with %q", err, got, tc.code, tc.want)
			}
			if c.registered(id) {
				t.Errorf("%s registered", id)
			}
			for _, in := range c.e.Status().Instances {
				if in.ID == id {
					t.Errorf("%s became an instance", id)
				}
			}
			waitFor(t, "the refusal in the coordinator's log", 10*time.Second, func() bool { return strings.Contains(c.log.String(), tc.log) })
		})
	}

	pat, err := synth.NewPattern(64, 48, 1)
	if err != nil {
		t.Fatal(err)
	}
	stream := func(cc *grpc.ClientConn, name string) (accepted uint64, err error) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		r, err := src.Stream(ctx, cc, "traffic", name, pat, 0, 100, 3)
		if err != nil {
			return 0, err
		}
		return r.Accepted, nil
	}
	t.Run("source sends frames", func(t *testing.T) {
		n, err := stream(dialTLS(t, c.addr, source), "source/cam-ok") // a stream of the certificate's name
		if err != nil || n != 3 {
			t.Fatalf("source: %d accepted, %v; want 3", n, err)
		}
	})
	t.Run("a worker's certificate cannot ingest", func(t *testing.T) {
		n, err := stream(dialCreds(t, c.addr, credentials.NewTLS(worker.ClientConfig("127.0.0.1"))), "cam-by-worker")
		if status.Code(errors.Unwrap(err)) != codes.PermissionDenied || !strings.Contains(err.Error(), "has role worker; this call needs role source") {
			t.Fatalf("ingest with a worker's certificate: %d accepted, %v; want PermissionDenied", n, err)
		}
		if strings.Contains(c.log.String(), "stream=cam-by-worker") {
			t.Errorf("the refused stream joined:\n%s", c.log.String())
		}
	})
	t.Run("no certificate cannot ingest", func(t *testing.T) {
		_, err := stream(dialCreds(t, c.addr, credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS13, RootCAs: roots, ServerName: "127.0.0.1"})), "cam-anon")
		if status.Code(errors.Unwrap(err)) != codes.Unavailable {
			t.Fatalf("ingest without a certificate: %v; want Unavailable", err)
		}
	})
}

// TestTLSRotation: the coordinator and a worker keep their Material while
// the files under them are replaced: a new connection presents the new
// worker certificate and is served with the new coordinator certificate
// (both reload), with no restart;
// after the CA is replaced on the coordinator, a worker still holding the
// old CA's files is refused (and refuses the coordinator's new certificate).
func TestTLSRotation(t *testing.T) {
	dir := t.TempDir()
	if _, err := pki.Init(dir, pki.InitOptions{}); err != nil {
		t.Fatal(err)
	}
	coordDir := filepath.Join(t.TempDir(), "coordinator")
	if _, err := pki.IssueFiles(dir, pki.IssueOptions{Role: pki.Coordinator, Out: coordDir}); err != nil {
		t.Fatal(err)
	}
	c := startTLS(t, coordDir)
	worker := material(t, pki.DirFiles(dir, pki.Worker), pki.Worker)
	before := worker.Certificate().SerialNumber

	runWorker(t, dialTLS(t, c.addr, worker), "worker") // its certificate's name
	waitFor(t, "the worker to register", 10*time.Second, func() bool { return c.registered("worker") })

	// New certificates for the worker (another name) and the coordinator.
	if _, err := pki.IssueFiles(dir, pki.IssueOptions{Role: pki.Worker, Name: "w2", Force: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := pki.IssueFiles(dir, pki.IssueOptions{Role: pki.Coordinator, Out: coordDir, Force: true}); err != nil {
		t.Fatal(err)
	}
	runWorker(t, dialTLS(t, c.addr, worker), "w2")
	waitFor(t, "w2 to register", 10*time.Second, func() bool { return c.registered("w2") })
	// the log line may come just after the registration the engine sees
	waitFor(t, "the coordinator to log w2's new certificate", 10*time.Second, func() bool {
		return strings.Contains(c.log.String(), "cert=mdag://worker/w2")
	})
	if worker.Certificate().SerialNumber.Cmp(before) == 0 {
		t.Error("the worker's material did not reload")
	}
	// The coordinator serves its new certificate to the new connections.
	want := material(t, pki.DirFiles(coordDir, pki.Coordinator), pki.Coordinator).Certificate()
	conn, err := tls.Dial("tcp", c.addr, worker.ClientConfig("127.0.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	got := conn.ConnectionState().PeerCertificates[0]
	conn.Close()
	if !got.Equal(want) {
		t.Errorf("the coordinator served serial %x, want the new %x", got.SerialNumber, want.SerialNumber)
	}

	// A new CA on the coordinator: the worker's old-CA certificate is
	// refused on its next connection.
	newCA := t.TempDir()
	if _, err := pki.Init(newCA, pki.InitOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := pki.IssueFiles(newCA, pki.IssueOptions{Role: pki.Coordinator, Out: coordDir, Force: true}); err != nil {
		t.Fatal(err)
	}
	select {
	case err = <-runWorker(t, dialTLS(t, c.addr, worker), "w3"):
	case <-time.After(20 * time.Second):
		t.Fatal("a worker of the replaced CA was not refused")
	}
	if status.Code(errors.Unwrap(err)) != codes.Unavailable || c.registered("w3") {
		t.Errorf("a worker of the replaced CA: %v (registered %v); want refused", err, c.registered("w3"))
	}
}

// TestCheckRole: the per-call rule on its own: each method's role, a
// method no role may call, a certificate without an mdag identity, and a
// call with no verified certificate.
func TestCheckRole(t *testing.T) {
	ca, err := pki.NewCA("test", time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cert := func(r pki.Role) *x509.Certificate {
		req := pki.Request{Role: r, Name: "n1", Now: time.Now(), Valid: time.Hour}
		if r == pki.Coordinator {
			req.DNS = []string{"localhost"}
		}
		c, err := ca.Issue(req)
		if err != nil {
			t.Fatal(err)
		}
		return c.Cert
	}
	anon := *cert(pki.Worker)
	anon.URIs = nil
	ctxWith := func(c *x509.Certificate) context.Context {
		ti := credentials.TLSInfo{}
		if c != nil {
			ti.State.VerifiedChains = [][]*x509.Certificate{{c}}
		}
		return peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1}, AuthInfo: ti})
	}
	connect, ingest := api.Coordinator_Connect_FullMethodName, api.Coordinator_Ingest_FullMethodName
	for _, c := range []struct {
		name   string
		ctx    context.Context
		method string
		code   codes.Code
		msg    string
	}{
		{"worker connects", ctxWith(cert(pki.Worker)), connect, codes.OK, ""},
		{"source ingests", ctxWith(cert(pki.Source)), ingest, codes.OK, ""},
		{"source connects", ctxWith(cert(pki.Source)), connect, codes.PermissionDenied, "mdag://source/n1 has role source; this call needs role worker"},
		{"worker ingests", ctxWith(cert(pki.Worker)), ingest, codes.PermissionDenied, "has role worker; this call needs role source"},
		{"coordinator connects", ctxWith(cert(pki.Coordinator)), connect, codes.PermissionDenied, "has role coordinator; this call needs role worker"},
		{"an unknown method", ctxWith(cert(pki.Worker)), "/mdag.v1.Coordinator/Admin", codes.PermissionDenied, "no role may call this method"},
		{"no mdag identity", ctxWith(&anon), connect, codes.PermissionDenied, "carries no mdag role"},
		{"no verified certificate", ctxWith(nil), connect, codes.Unauthenticated, "no verified client certificate"},
		{"no peer", context.Background(), ingest, codes.Unauthenticated, "no verified client certificate"},
	} {
		t.Run(c.name, func(t *testing.T) {
			lb := &logBuf{}
			s := &Server{Log: slog.New(slog.NewTextHandler(lb, nil))}
			err := s.authorize(c.ctx, c.method)
			if status.Code(err) != c.code || (c.msg != "" && !strings.Contains(err.Error(), c.msg)) {
				t.Fatalf("authorize = %v, want %v with %q", err, c.code, c.msg)
			}
			if logged := strings.Contains(lb.String(), "gRPC call refused"); logged != (c.code != codes.OK) {
				t.Errorf("refusal logged %v, want %v:\n%s", logged, c.code != codes.OK, lb.String())
			}
		})
	}
}
