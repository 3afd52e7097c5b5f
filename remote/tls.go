package remote

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/mdag/mdag/api"
	"github.com/mdag/mdag/internal/auth"
	"github.com/mdag/mdag/internal/pki"
)

// methodRoles is the role each RPC needs: workers Connect, sources
// Ingest. A method not listed is open to no one.
var methodRoles = map[string]pki.Role{
	api.Coordinator_Connect_FullMethodName: pki.Worker,
	api.Coordinator_Ingest_FullMethodName:  pki.Source,
	api.Coordinator_Route_FullMethodName:   pki.Source,
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
		s:                s,
		creds:            loggedCreds{TransportCredentials: credentials.NewTLS(m.ServerConfig()), log: newLogLimiter(s.Clock, s.Log, s.limits.LogEvery), refused: s.refused},
		workers:          newGRPC(s, auth...),
		others:           newGRPC(s, append(auth, grpc.MaxRecvMsgSize(s.limits.SourceMessage()))...),
		done:             make(chan struct{}),
		firstByteTimeout: FirstByteTimeout,
		handshakeTimeout: HandshakeTimeout,
	}
}

// HandshakeTimeout bounds a TLS handshake on the coordinator's port.
const HandshakeTimeout = 10 * time.Second

// FirstByteTimeout is how long a connection may stay silent before its
// first byte (a ClientHello's): a peer that opens a connection and sends
// nothing is closed after it (counted `tls-handshake`), rather than
// holding a handshake slot for all of HandshakeTimeout.
const FirstByteTimeout = 2 * time.Second

// TLSServer is the coordinator's gRPC port with mutual TLS: it completes
// each connection's handshake and hands it to the gRPC server for the role
// its certificate carries.
type TLSServer struct {
	s               *Server
	creds           loggedCreds
	workers, others *grpc.Server

	// firstByteTimeout and handshakeTimeout are FirstByteTimeout and
	// HandshakeTimeout; tests change them before Serve.
	firstByteTimeout, handshakeTimeout time.Duration

	mu      sync.Mutex
	stopped bool
	pending map[net.Conn]string // in their handshake: the peer's IP address
	perIP   map[string]int      // handshakes in progress by the peer's IP address
	done    chan struct{}
	wg      sync.WaitGroup
}

// track registers a goroutine unless the server stopped.
func (t *TLSServer) track() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped {
		return false
	}
	t.wg.Add(1)
	return true
}

// MaxHandshakes bounds the TLS handshakes in progress at once; a
// connection beyond is closed at once (counted `handshakes`).
const MaxHandshakes = 256

// MaxHandshakesPerIP bounds the TLS handshakes in progress from one IP
// address, so that one host's idle connections cannot take every one of
// MaxHandshakes and lock the workers out; a connection beyond is closed at
// once (counted `handshakes-ip`).
const MaxHandshakesPerIP = 16

// admit starts tracking c's handshake (and its goroutine), or says why
// not: stopped, or the refusal reason with the count that reached its
// bound.
func (t *TLSServer) admit(c net.Conn, ip string) (stopped bool, reason string, n int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case t.stopped:
		return true, "", 0
	case len(t.pending) >= MaxHandshakes:
		return false, RefusedHandshakes, len(t.pending)
	case t.perIP[ip] >= MaxHandshakesPerIP:
		return false, RefusedHandshakesIP, t.perIP[ip]
	}
	if t.pending == nil {
		t.pending, t.perIP = map[net.Conn]string{}, map[string]int{}
	}
	t.pending[c] = ip
	t.perIP[ip]++
	t.wg.Add(1)
	return false, "", 0
}

// handshaken stops tracking c's handshake.
func (t *TLSServer) handshaken(c net.Conn) {
	t.mu.Lock()
	defer t.mu.Unlock()
	ip, ok := t.pending[c]
	if !ok {
		return
	}
	delete(t.pending, c)
	if t.perIP[ip]--; t.perIP[ip] <= 0 {
		delete(t.perIP, ip)
	}
}

// hostOf is the handshake bound's key for addr: its IP address (its whole
// string when it has no port), an IPv6 one by its /64.
func hostOf(addr net.Addr) string {
	if addr == nil {
		return "unknown"
	}
	host := addr.String()
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	// an IPv6 peer counts by its /64: one host usually holds a whole /64,
	// and counting each address would let it take every handshake slot
	return auth.AddrKey(host)
}

// handshaking is the number of connections in their handshake.
func (t *TLSServer) handshaking() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.pending)
}

// Serve accepts connections on ln until Stop or GracefulStop.
func (t *TLSServer) Serve(ln net.Listener) error {
	wl, ol := newConnListener(ln.Addr(), t.done), newConnListener(ln.Addr(), t.done)
	if !t.track() || !t.track() {
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
		// Peers that open connections and never finish their handshake
		// (each held up to handshakeTimeout, or firstByteTimeout when
		// they send nothing) hold no more than MaxHandshakes goroutines
		// and descriptors, and one IP address no more than
		// MaxHandshakesPerIP of them.
		ip := hostOf(raw.RemoteAddr())
		halted, reason, n := t.admit(raw, ip)
		switch {
		case halted:
			raw.Close()
			return nil
		case reason == RefusedHandshakes:
			raw.Close()
			_ = t.s.refuse(reason, status.Errorf(codes.ResourceExhausted, "TLS port: %d handshakes in progress, the limit (remote.MaxHandshakes)", n), "peer", raw.RemoteAddr().String())
			continue
		case reason == RefusedHandshakesIP:
			raw.Close()
			_ = t.s.refuse(reason, status.Errorf(codes.ResourceExhausted, "TLS port: %d handshakes in progress from %s, the limit for one address (remote.MaxHandshakesPerIP)", n, ip), "peer", raw.RemoteAddr().String())
			continue
		}
		go func() {
			defer t.wg.Done()
			t.handshake(raw, wl, ol)
		}()
	}
}

// handshake waits up to firstByteTimeout for the peer's first byte, runs
// the TLS handshake within handshakeTimeout (refusals are counted and
// logged, throttled, by loggedCreds) and queues the connection for its
// role's server.
func (t *TLSServer) handshake(raw net.Conn, wl, ol *connListener) {
	start := time.Now()
	_ = raw.SetDeadline(start.Add(t.handshakeTimeout))
	_ = raw.SetReadDeadline(start.Add(min(t.firstByteTimeout, t.handshakeTimeout)))
	var first [1]byte
	if _, err := io.ReadFull(raw, first[:]); err != nil {
		t.handshaken(raw)
		select {
		case <-t.done: // cut by Stop: no refusal
			raw.Close()
			return
		default:
		}
		why := err.Error()
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			why = fmt.Sprintf("no ClientHello within %v of connecting (remote.FirstByteTimeout)", t.firstByteTimeout)
		}
		t.creds.refusedHandshake(raw.RemoteAddr(), errors.New(why))
		raw.Close() // after the count: the peer sees its refusal counted
		return
	}
	_ = raw.SetReadDeadline(start.Add(t.handshakeTimeout))
	fc := &firstByteConn{Conn: raw, first: first[0], has: true}
	fc.holdClose.Store(true) // a refused handshake is counted before the peer sees it closed
	conn, ai, err := t.creds.ServerHandshake(fc)
	fc.holdClose.Store(false)
	t.handshaken(raw)
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
// A refusal is counted (`role`) and logged, throttled like refused
// handshakes.
func (s *Server) authorize(ctx context.Context, method string) error {
	s.defaults()
	err := checkRole(ctx, method)
	if err != nil {
		from := "unknown"
		if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
			from = p.Addr.String()
		}
		s.refused.count(RefusedRole)
		s.callLog.warn("gRPC call refused", "peer", from, "err", status.Convert(err).Message())
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

// firstByteConn is a connection whose first byte was read already (to
// see that the peer speaks before its handshake's deadline).
type firstByteConn struct {
	net.Conn
	first byte
	has   bool
	// holdClose makes Close a no-op during the handshake: TLSServer
	// closes the connection itself once it has counted a refusal.
	holdClose atomic.Bool
}

// SyscallConn passes the socket through, as the connection would without
// the wrapper (gRPC's TLS credentials look for it).
func (c *firstByteConn) SyscallConn() (syscall.RawConn, error) {
	if sc, ok := c.Conn.(syscall.Conn); ok {
		return sc.SyscallConn()
	}
	return nil, errors.New("remote: the connection has no socket")
}

func (c *firstByteConn) Close() error {
	if c.holdClose.Load() {
		return nil
	}
	return c.Conn.Close()
}

func (c *firstByteConn) Read(p []byte) (int, error) {
	if c.has && len(p) > 0 {
		p[0], c.has = c.first, false
		return 1, nil
	}
	return c.Conn.Read(p)
}

// loggedCreds counts the handshakes it refuses (no certificate, another
// CA's, an expired one, plaintext on the TLS port, silence: reason
// `tls-handshake`) and logs them with the peer's address, throttled (a
// few lines, then one per Limits.LogEvery saying how many were refused
// since), so a flood of bad connections cannot flood the log.
type loggedCreds struct {
	credentials.TransportCredentials
	log     *logLimiter
	refused *refusals
}

func (c loggedCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, ai, err := c.TransportCredentials.ServerHandshake(raw)
	if err != nil {
		c.refusedHandshake(raw.RemoteAddr(), err)
	}
	return conn, ai, err
}

// refusedHandshake counts and logs (throttled) one refused handshake.
func (c loggedCreds) refusedHandshake(from net.Addr, err error) {
	c.refused.count(RefusedTLS)
	peerAddr := "unknown"
	if from != nil {
		peerAddr = from.String()
	}
	c.log.warn("gRPC TLS handshake refused", "peer", peerAddr, "err", err)
}

func (c loggedCreds) Clone() credentials.TransportCredentials {
	return loggedCreds{TransportCredentials: c.TransportCredentials.Clone(), log: c.log, refused: c.refused}
}

// SharedCert declares a certificate that several workers (or sources)
// share, such as one Kubernetes Secret mounted in every worker pod (issue
// 36): under mutual TLS its holders may claim any worker ID (or stream)
// that starts with one of Prefixes, and no other; "*" alone is any. Every
// other certificate claims only its own name (CheckClaim). A holder of a
// shared certificate can take any ID of its prefixes, so a registration
// under one is logged as shared.
type SharedCert struct {
	Role     pki.Role
	Name     string
	Prefixes []string
}

// ParseSharedCert reads ROLE/NAME=PREFIX[,PREFIX...], as --shared-cert
// takes it, e.g. worker/k8s=mdag-worker-,P100-,V100-,CPU- or worker/lab=*.
func ParseSharedCert(s string) (SharedCert, error) {
	who, list, ok := strings.Cut(s, "=")
	roleName, name, ok2 := strings.Cut(who, "/")
	if !ok || !ok2 || list == "" {
		return SharedCert{}, fmt.Errorf("shared certificate %q: want ROLE/NAME=PREFIX[,PREFIX...] (e.g. worker/k8s=mdag-worker-,P100- or worker/lab=*)", s)
	}
	role, err := pki.ParseRole(roleName)
	if err != nil || role == pki.Coordinator {
		return SharedCert{}, fmt.Errorf("shared certificate %q: role %q: want worker or source", s, roleName)
	}
	if err := pki.CheckName(name); err != nil {
		return SharedCert{}, fmt.Errorf("shared certificate %q: %w", s, err)
	}
	c := SharedCert{Role: role, Name: name}
	for p := range strings.SplitSeq(list, ",") {
		if p == "" || len(p) > maxField || !printable(p, false) {
			return SharedCert{}, fmt.Errorf("shared certificate %q: prefix %q: want 1 to %d printable ASCII characters without spaces (or * for any)", s, p, maxField)
		}
		c.Prefixes = append(c.Prefixes, p)
	}
	return c, nil
}

func (c SharedCert) String() string {
	return fmt.Sprintf("%s/%s=%s", c.Role, c.Name, strings.Join(c.Prefixes, ","))
}

func (c SharedCert) allows(claim string) bool {
	for _, p := range c.Prefixes {
		if p == "*" || strings.HasPrefix(claim, p) {
			return true
		}
	}
	return false
}

// checkClaim checks, under mutual TLS, that the caller's certificate may
// claim a worker ID (role worker) or a stream (role source): a worker's
// certificate mdag://worker/NAME registers only ID NAME; a source's
// mdag://source/NAME joins only stream NAME or NAME/...; a certificate in
// Server.Shared only the IDs or streams of its prefixes (shared reports
// that). In plaintext (loopback) there is no certificate and nothing to
// check. A refusal is PermissionDenied naming both, counted `identity`.
func (s *Server) checkClaim(ctx context.Context, call, claim string) (shared bool, err error) {
	leaf := verifiedLeaf(ctx)
	if leaf == nil {
		return false, nil
	}
	role, name, err := pki.RoleOf(leaf)
	if err != nil {
		return false, status.Errorf(codes.PermissionDenied, "%s: %v", call, err)
	}
	cert := pki.IdentityURI(role, name).String()
	what, own := "worker ID", claim == name
	hint := fmt.Sprintf("give the worker --id %s, or a certificate of its own: mdag certs issue --role worker --name %s", name, claim)
	if role == pki.Source {
		what, own = "stream", claim == name || strings.HasPrefix(claim, name+"/")
		hint = fmt.Sprintf("it may join only stream %s or %s/...: mdag source --prefix %s/cam (its default with TLS: %s/synthetic), or a certificate of its own: mdag certs issue --role source --name NAME", name, name, name, name)
	}
	for _, c := range s.Shared {
		if c.Role != role || c.Name != name {
			continue
		}
		if c.allows(claim) {
			return true, nil
		}
		return false, s.refuse(RefusedIdentity, status.Errorf(codes.PermissionDenied, "%s: %s %q is not the certificate's: %s is shared (--shared-cert %s) and may claim only those starting with %s",
			call, what, claim, cert, c, strings.Join(c.Prefixes, " or ")), "cert", cert, "claim", claim)
	}
	if own {
		return false, nil
	}
	return false, s.refuse(RefusedIdentity, status.Errorf(codes.PermissionDenied, "%s: %s %q is not the certificate's: %s (%s)", call, what, claim, cert, hint), "cert", cert, "claim", claim)
}
