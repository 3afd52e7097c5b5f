package remote

import (
	"context"
	"crypto/x509"
	"log/slog"
	"net"

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
func NewTLSGRPC(s *Server, m *pki.Material) *grpc.Server {
	s.defaults()
	creds := loggedCreds{TransportCredentials: credentials.NewTLS(m.ServerConfig()), log: s.Log}
	return newGRPC(s, grpc.Creds(creds), grpc.ChainStreamInterceptor(s.authorizeStream), grpc.ChainUnaryInterceptor(s.authorizeUnary))
}

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
