package remote

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/mdag/mdag/api"
	"github.com/mdag/mdag/internal/pki"
)

// methodRoles is the role each RPC needs: workers Connect, sources
// Ingest. A method not listed is open to no one.
var methodRoles = map[string]pki.Role{
	api.Coordinator_Connect_FullMethodName: pki.Worker,
	api.Coordinator_Ingest_FullMethodName:  pki.Source,
}

// NewTLSGRPC is NewGRPC with mutual TLS (issue 22): a peer must present a
// certificate from m's CA (refused in the handshake otherwise, logged), and
// each call is checked against the role the certificate carries (Connect:
// worker, Ingest: source; PermissionDenied otherwise, before the handler
// runs, so a refused peer never registers or sends a frame). m is read at
// each handshake, so replaced files take effect for new connections.
//
// The handshake happens before gRPC sees the connection, so that each
// connection goes to a gRPC server with its role's receive limit: workers'
// messages up to Limits.MaxMessage (a result carries its output frames),
// everyone else's up to Limits.SourceMessage, refused by gRPC from the
// length prefix, unread. (gRPC-go has one receive limit per server.)
func NewTLSGRPC(s *Server, m *pki.Material) *TLSServer {
	s.defaults()
	auth := []grpc.ServerOption{grpc.Creds(doneCreds{}), grpc.ChainStreamInterceptor(s.authorizeStream), grpc.ChainUnaryInterceptor(s.authorizeUnary)}
	return &TLSServer{
		s:       s,
		creds:   loggedCreds{TransportCredentials: credentials.NewTLS(m.ServerConfig()), log: s.Log},
		workers: newGRPC(s, auth...),
		others:  newGRPC(s, append(auth, grpc.MaxRecvMsgSize(s.limits.SourceMessage()))...),
		done:    make(chan struct{}),
	}
}

// handshakeTimeout bounds a TLS handshake on the coordinator's port.
const handshakeTimeout = 10 * time.Second

// TLSServer is the coordinator's gRPC port with mutual TLS: it completes
// each connection's handshake and hands it to the gRPC server for the role
// its certificate carries.
type TLSServer struct {
	s               *Server
	creds           credentials.TransportCredentials
	workers, others *grpc.Server

	mu      sync.Mutex
	stopped bool
	pending map[net.Conn]struct{} // in their handshake
	done    chan struct{}
	wg      sync.WaitGroup
}

// track registers a goroutine (and, with c, a connection in its
// handshake) unless the server stopped.
func (t *TLSServer) track(c net.Conn) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped {
		return false
	}
	t.wg.Add(1)
	if c != nil {
		if t.pending == nil {
			t.pending = map[net.Conn]struct{}{}
		}
		t.pending[c] = struct{}{}
	}
	return true
}

// MaxHandshakes bounds the TLS handshakes in progress at once; a
// connection beyond is closed at once (counted `handshakes`).
const MaxHandshakes = 256

// handshaking is the number of connections in their handshake.
func (t *TLSServer) handshaking() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.pending)
}

// Serve accepts connections on ln until Stop or GracefulStop.
func (t *TLSServer) Serve(ln net.Listener) error {
	wl, ol := newConnListener(ln.Addr(), t.done), newConnListener(ln.Addr(), t.done)
	if !t.track(nil) || !t.track(nil) {
		ln.Close()
		return grpc.ErrServerStopped
	}
	go func() { defer t.wg.Done(); _ = t.workers.Serve(wl) }()
	go func() { defer t.wg.Done(); _ = t.others.Serve(ol) }()
	stopped := make(chan struct{})
	defer close(stopped)
	go func() {
		select {
		case <-t.done:
		case <-stopped:
		}
		ln.Close()
	}()
	for {
		raw, err := ln.Accept()
		if err != nil {
			select {
			case <-t.done:
				return nil
			default:
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			t.stop(func(g *grpc.Server) { g.Stop() })
			return err
		}
		if n := t.handshaking(); n >= MaxHandshakes {
			// peers that open connections and never finish their
			// handshake (each held up to handshakeTimeout) hold no more
			// than MaxHandshakes goroutines and descriptors
			raw.Close()
			_ = t.s.refuse(RefusedHandshakes, fmt.Errorf("%d TLS handshakes in progress", n), "peer", raw.RemoteAddr().String())
			continue
		}
		if !t.track(raw) {
			raw.Close()
			return nil
		}
		go func() {
			defer t.wg.Done()
			t.handshake(raw, wl, ol)
		}()
	}
}

// handshake runs the TLS handshake (refusals are logged by loggedCreds)
// and queues the connection for its role's server.
func (t *TLSServer) handshake(raw net.Conn, wl, ol *connListener) {
	_ = raw.SetDeadline(time.Now().Add(handshakeTimeout))
	conn, ai, err := t.creds.ServerHandshake(raw)
	t.mu.Lock()
	delete(t.pending, raw)
	t.mu.Unlock()
	if err != nil {
		raw.Close()
		return
	}
	_ = raw.SetDeadline(time.Time{})
	to := ol
	if ti, ok := ai.(credentials.TLSInfo); ok && len(ti.State.VerifiedChains) > 0 && len(ti.State.VerifiedChains[0]) > 0 {
		if role, _, err := pki.RoleOf(ti.State.VerifiedChains[0][0]); err == nil && role == pki.Worker {
			to = wl
		}
	}
	select {
	case to.ch <- &authedConn{Conn: conn, ai: ai}:
	case <-t.done:
		conn.Close()
	}
}

// Stop closes the listener and every connection at once.
func (t *TLSServer) Stop() { t.stop(func(g *grpc.Server) { g.Stop() }) }

// GracefulStop closes the listener and waits for the calls in progress.
func (t *TLSServer) GracefulStop() { t.stop(func(g *grpc.Server) { g.GracefulStop() }) }

func (t *TLSServer) stop(how func(*grpc.Server)) {
	t.mu.Lock()
	if !t.stopped {
		t.stopped = true
		close(t.done)
	}
	for c := range t.pending {
		c.Close() // ends its handshake now
	}
	t.mu.Unlock()
	var wg sync.WaitGroup
	for _, g := range []*grpc.Server{t.workers, t.others} {
		wg.Add(1)
		go func() { defer wg.Done(); how(g) }()
	}
	wg.Wait()
	t.wg.Wait()
}

// connListener is a net.Listener fed with connections already through
// their handshake.
type connListener struct {
	addr net.Addr
	ch   chan net.Conn
	done <-chan struct{}
}

func newConnListener(addr net.Addr, done <-chan struct{}) *connListener {
	return &connListener{addr: addr, ch: make(chan net.Conn), done: done}
}

func (l *connListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *connListener) Close() error   { return nil }
func (l *connListener) Addr() net.Addr { return l.addr }

// authedConn is a connection whose TLS handshake is done, with its result.
type authedConn struct {
	net.Conn
	ai credentials.AuthInfo
}

// doneCreds are the role servers' credentials: the handshake is already
// done (TLSServer.handshake); they hand gRPC its result.
type doneCreds struct{}

func (doneCreds) ServerHandshake(c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	ac, ok := c.(*authedConn)
	if !ok {
		return nil, nil, fmt.Errorf("remote: a connection without a TLS handshake reached the TLS server")
	}
	return ac, ac.ai, nil
}

func (doneCreds) ClientHandshake(context.Context, string, net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("remote: server-side credentials only")
}

func (doneCreds) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "tls", SecurityVersion: "1.3"}
}
func (doneCreds) Clone() credentials.TransportCredentials { return doneCreds{} }
func (doneCreds) OverrideServerName(string) error         { return nil }

func (s *Server) authorizeStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if err := s.authorize(ss.Context(), info.FullMethod); err != nil {
		return err
	}
	return handler(srv, ss)
}

func (s *Server) authorizeUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if err := s.authorize(ctx, info.FullMethod); err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

// authorize checks that the caller's verified certificate carries the role
// method needs.
func (s *Server) authorize(ctx context.Context, method string) error {
	err := checkRole(ctx, method)
	if err != nil {
		from := "unknown"
		if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
			from = p.Addr.String()
		}
		s.Log.Warn("gRPC call refused", "peer", from, "err", status.Convert(err).Message())
	}
	return err
}

func checkRole(ctx context.Context, method string) error {
	leaf := verifiedLeaf(ctx)
	if leaf == nil {
		return status.Errorf(codes.Unauthenticated, "%s: no verified client certificate (give the client --tls-dir with a certificate from mdag certs)", method)
	}
	role, name, err := pki.RoleOf(leaf)
	if err != nil {
		return status.Errorf(codes.PermissionDenied, "%s: %v", method, err)
	}
	need, ok := methodRoles[method]
	if !ok {
		return status.Errorf(codes.PermissionDenied, "%s: no role may call this method", method)
	}
	if role != need {
		return status.Errorf(codes.PermissionDenied, "%s: the certificate mdag://%s/%s has role %s; this call needs role %s", method, role, name, role, need)
	}
	return nil
}

// verifiedLeaf is the caller's certificate as the handshake verified it,
// or nil (plaintext, no certificate).
func verifiedLeaf(ctx context.Context) *x509.Certificate {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(ti.State.VerifiedChains) == 0 || len(ti.State.VerifiedChains[0]) == 0 {
		return nil
	}
	return ti.State.VerifiedChains[0][0]
}

// certName is the mdag://ROLE/NAME of the caller's certificate, or "" on a
// plaintext connection.
func certName(ctx context.Context) string {
	leaf := verifiedLeaf(ctx)
	if leaf == nil {
		return ""
	}
	role, name, err := pki.RoleOf(leaf)
	if err != nil {
		return ""
	}
	return pki.IdentityURI(role, name).String()
}

// loggedCreds logs the handshakes it refuses (no certificate, another CA's,
// an expired one, plaintext on the TLS port) with the peer's address.
type loggedCreds struct {
	credentials.TransportCredentials
	log *slog.Logger
}

func (c loggedCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, ai, err := c.TransportCredentials.ServerHandshake(raw)
	if err != nil {
		c.log.Warn("gRPC TLS handshake refused", "peer", raw.RemoteAddr().String(), "err", err)
	}
	return conn, ai, err
}

func (c loggedCreds) Clone() credentials.TransportCredentials {
	return loggedCreds{TransportCredentials: c.TransportCredentials.Clone(), log: c.log}
}
