package client

import (
	"context"
	"errors"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"

	"github.com/mdag/mdag/internal/pki"
	"github.com/mdag/mdag/internal/unixsock"
	"github.com/mdag/mdag/remote/wire"
)

// DialTLS connects to a coordinator with mutual TLS (issue 22): it presents
// m's certificate (a worker's or a source's) and accepts only a
// coordinator's certificate from m's CA for serverName (empty: the host in
// addr). m is read at each handshake, so replaced files take effect on the
// next connection (a reconnect) with no restart.
func DialTLS(addr string, m *pki.Material, serverName string) (*grpc.ClientConn, error) {
	return dial(addr, &tlsCreds{m: m, serverName: serverName})
}

// DialPeerTLS connects to another worker's peer port with mutual TLS (the
// direct data plane, issue 25): it presents m's worker certificate and
// accepts only a worker's certificate from m's CA (pki.PeerClientConfig),
// read afresh at each handshake.
func DialPeerTLS(addr string, m *pki.Material) (*grpc.ClientConn, error) {
	return dial(addr, &tlsCreds{m: m, peer: true})
}

// DialIngestTLS connects a source to a worker's ingest port with mutual TLS
// (issue 41): it presents m's source certificate and accepts only a
// worker's certificate from m's CA (pki.PeerClientConfig; the worker's
// port takes only sources' certificates: pki.IngestServerConfig).
func DialIngestTLS(addr string, m *pki.Material) (*grpc.ClientConn, error) {
	return dial(addr, &tlsCreds{m: m, peer: true})
}

// reconnect is the channel's backoff between connection attempts: gRPC's
// default (1 s growing to 2 min) would keep workers and sources away from
// a coordinator that restarted long after it is back; this retries from
// 100 ms up to 2 s.
var reconnect = grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 2 * time.Second},
	MinConnectTimeout: 5 * time.Second}

// dial makes the channel. A Unix socket target (unix:/PATH) is dialed by
// unixsock.Dial: a socket served by another uid than this process's or
// root's is refused (issue 36: another local user may have bound the path
// first), and nothing is sent there.
//
// While a call is open, a connection that reads nothing for KeepaliveTime
// is pinged, and closed when no answer comes within KeepaliveTimeout: a
// worker whose coordinator went silent (a half-open connection: a network
// cut, not a crash) ends its session in seconds, stops reading the cameras
// the coordinator has given to others meanwhile, and reconnects; without
// it, TCP would keep the connection for about a quarter of an hour. Every
// mdag gRPC server permits these pings (KeepaliveEnforcement).
func dial(addr string, creds credentials.TransportCredentials) (*grpc.ClientConn, error) {
	opts := []grpc.DialOption{grpc.WithTransportCredentials(creds), grpc.WithConnectParams(reconnect),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(wire.MaxMessage), grpc.MaxCallSendMsgSize(wire.MaxMessage)),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: KeepaliveTime, Timeout: KeepaliveTimeout})}
	if unixsock.IsTarget(addr) {
		opts = append(opts, grpc.WithContextDialer(unixsock.Dial))
	}
	return grpc.NewClient(addr, opts...)
}

// Keepalive of the connections this package dials (dial).
const (
	KeepaliveTime    = 15 * time.Second
	KeepaliveTimeout = 10 * time.Second
)

// KeepaliveEnforcement lets clients ping as dial's do (gRPC's default
// answers a ping more often than every 5 minutes on a connection that
// sends nothing with GOAWAY, "too many pings").
func KeepaliveEnforcement() grpc.ServerOption {
	return grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: KeepaliveTime / 2, PermitWithoutStream: true})
}

// tlsCreds builds a fresh TLS configuration from the material for every
// handshake (crypto/tls reads RootCAs from the configuration, so a CA that
// changes needs a new one).
type tlsCreds struct {
	m          *pki.Material
	serverName string
	peer       bool // another worker's peer port, not the coordinator
}

func (c *tlsCreds) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	cfg := c.m.ClientConfig(c.serverName)
	if c.peer {
		cfg = c.m.PeerClientConfig()
	}
	return credentials.NewTLS(cfg).ClientHandshake(ctx, authority, raw)
}

func (c *tlsCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("mdag's client credentials cannot serve")
}

func (c *tlsCreds) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "tls", SecurityVersion: "1.3", ServerName: c.serverName}
}

func (c *tlsCreds) Clone() credentials.TransportCredentials {
	cp := *c
	return &cp
}

// OverrideServerName implements credentials.TransportCredentials.
//
// Deprecated: in gRPC too; use DialTLS's serverName.
func (c *tlsCreds) OverrideServerName(name string) error {
	c.serverName = name
	return nil
}
