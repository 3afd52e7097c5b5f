// Package pki is mdag's small certificate authority and the TLS material of
// its gRPC transport (issue 22): `mdag certs` creates a CA and per-role
// certificates with it, and the coordinator, workers and sources load them
// through a Material, which re-reads the files when they change so that
// certificates rotate without a restart.
//
// A certificate's role (coordinator, worker or source) and name are one URI
// subject alternative name, mdag://ROLE/NAME (mdag://worker/gpu-1). A SAN
// rather than an OU: the SAN is where X.509 puts identities (SPIFFE does
// the same with spiffe:// URIs), crypto/x509 parses it into a typed field
// (Certificate.URIs) instead of free text, a certificate carries exactly one
// such URI so there is no ambiguity, and a CA may restrict URIs with name
// constraints, which crypto/x509 enforces. The coordinator's certificate
// also carries the DNS names and IPs clients dial (server auth); workers'
// and sources' carry client auth only, so no client certificate can serve
// as the coordinator, and the coordinator's cannot dial it as a client.
//
// Standard library only: ECDSA P-256 keys, crypto/x509, PEM files. Pure Go.
package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"strings"
	"time"
)

// Role is what a certificate lets its holder do on the coordinator's gRPC
// port.
type Role string

// The roles. A worker may only Connect (register and serve tasks); a
// source may only Ingest (send frames); the coordinator serves.
const (
	Coordinator Role = "coordinator"
	Worker      Role = "worker"
	Source      Role = "source"
)

// Roles lists the roles in a fixed order.
var Roles = []Role{Coordinator, Worker, Source}

// Scheme is the URI scheme of the identity SAN: mdag://ROLE/NAME.
const Scheme = "mdag"

// ParseRole reads a role's name.
func ParseRole(s string) (Role, error) {
	for _, r := range Roles {
		if string(r) == s {
			return r, nil
		}
	}
	return "", fmt.Errorf("role %q: want coordinator, worker or source", s)
}

// client reports whether r authenticates as a TLS client.
func (r Role) client() bool { return r == Worker || r == Source }

// maxName bounds a certificate's name (it is also a file and log field).
const maxName = 64

// CheckName says what is wrong with a certificate name: 1 to 64 of
// A-Z a-z 0-9 . _ -, not starting with a dot or dash.
func CheckName(name string) error {
	if name == "" {
		return errors.New("name is empty")
	}
	if len(name) > maxName {
		return fmt.Errorf("name %.20q...: longer than %d characters", name, maxName)
	}
	for i, c := range name {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' ||
			(c == '.' || c == '-') && i > 0
		if !ok {
			return fmt.Errorf("name %q: character %q at %d: want A-Z a-z 0-9 . _ - (not first: . -)", name, c, i)
		}
	}
	return nil
}

// IdentityURI is the SAN of role's certificate named name.
func IdentityURI(role Role, name string) *url.URL {
	return &url.URL{Scheme: Scheme, Host: string(role), Path: "/" + name}
}

// ParseIdentity reads an mdag://ROLE/NAME URI.
func ParseIdentity(u *url.URL) (Role, string, error) {
	if u == nil || u.Scheme != Scheme {
		return "", "", errors.New("not an mdag:// identity")
	}
	if u.User != nil || u.Port() != "" || u.RawQuery != "" || u.Fragment != "" || u.Opaque != "" {
		return "", "", fmt.Errorf("identity %q: want mdag://ROLE/NAME and nothing else", u.Redacted())
	}
	role, err := ParseRole(u.Host)
	if err != nil {
		return "", "", fmt.Errorf("identity %q: %w", u.Redacted(), err)
	}
	name, ok := strings.CutPrefix(u.Path, "/")
	if !ok {
		return "", "", fmt.Errorf("identity %q: no name (want mdag://ROLE/NAME)", u.Redacted())
	}
	if err := CheckName(name); err != nil {
		return "", "", fmt.Errorf("identity %q: %w", u.Redacted(), err)
	}
	return role, name, nil
}

// RoleOf reads the role and name a certificate carries: exactly one
// mdag://ROLE/NAME URI SAN.
func RoleOf(c *x509.Certificate) (Role, string, error) {
	var role Role
	var name string
	n := 0
	for _, u := range c.URIs {
		if u.Scheme != Scheme {
			continue
		}
		n++
		r, nm, err := ParseIdentity(u)
		if err != nil {
			return "", "", fmt.Errorf("certificate %q: %w", c.Subject.CommonName, err)
		}
		role, name = r, nm
	}
	switch n {
	case 0:
		return "", "", fmt.Errorf("certificate %q carries no mdag role (no mdag://ROLE/NAME URI SAN): was it issued by mdag certs?", c.Subject.CommonName)
	case 1:
		return role, name, nil
	}
	return "", "", fmt.Errorf("certificate %q carries %d mdag identities: want exactly one", c.Subject.CommonName, n)
}

// ParseHosts reads the coordinator certificate's --hosts: comma-separated
// DNS names and IP addresses (no ports, no URLs).
func ParseHosts(s string) (dns []string, ips []net.IP, err error) {
	seen := map[string]bool{}
	for h := range strings.SplitSeq(s, ",") {
		h = strings.TrimSpace(h)
		if h == "" {
			return nil, nil, fmt.Errorf("hosts %q: an empty entry (want name,ip,...)", s)
		}
		if seen[h] {
			continue
		}
		seen[h] = true
		if ip := net.ParseIP(h); ip != nil {
			ips = append(ips, ip)
			continue
		}
		if err := checkDNS(h); err != nil {
			return nil, nil, fmt.Errorf("hosts: %w", err)
		}
		dns = append(dns, strings.ToLower(h))
	}
	return dns, ips, nil
}

// checkDNS accepts a DNS name of letters, digits and hyphens in labels of
// at most 63, at most 253 in all, optionally with a leading "*." wildcard.
func checkDNS(h string) error {
	name := strings.TrimPrefix(h, "*.")
	if len(name) > 253 {
		return fmt.Errorf("%.30q...: a DNS name is at most 253 characters", h)
	}
	for l := range strings.SplitSeq(name, ".") {
		if l == "" || len(l) > 63 {
			return fmt.Errorf("%q: not an IP address nor a DNS name (labels of 1 to 63 characters)", h)
		}
		for i, c := range l {
			ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' && i > 0 && i < len(l)-1
			if !ok {
				return fmt.Errorf("%q: not an IP address nor a DNS name (character %q; a port or URL is not a host)", h, c)
			}
		}
	}
	return nil
}

// DefaultHosts are the coordinator certificate's names when none are
// given: the loopback ones.
const DefaultHosts = "localhost,127.0.0.1,::1"

// CA is a certificate authority: its certificate and key.
type CA struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
}

// NewCA creates a self-signed CA valid from now (back-dated by Skew) for
// valid. It may sign only end-entity certificates (path length 0).
func NewCA(name string, now time.Time, valid time.Duration) (*CA, error) {
	if valid <= 0 {
		return nil, fmt.Errorf("CA validity %v: want > 0", valid)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("CA key: %w", err)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	tpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: name, Organization: []string{"mdag"}},
		NotBefore:             now.Add(-Skew),
		NotAfter:              now.Add(valid),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tpl, tpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("CA certificate: %w", err)
	}
	return &CA{Cert: cert, Key: key}, nil
}

// Skew back-dates NotBefore so that a peer whose clock is slightly behind
// accepts a fresh certificate.
const Skew = 5 * time.Minute

// Request is one certificate to issue.
type Request struct {
	Role Role
	Name string
	// Hosts: the coordinator's DNS names and IPs (ParseHosts); refused for
	// the client roles.
	DNS   []string
	IPs   []net.IP
	Now   time.Time
	Valid time.Duration
}

// Issued is a certificate and its key.
type Issued struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
}

// Issue signs a certificate for req. It never outlives the CA.
func (ca *CA) Issue(req Request) (*Issued, error) {
	if _, err := ParseRole(string(req.Role)); err != nil {
		return nil, err
	}
	if err := CheckName(req.Name); err != nil {
		return nil, err
	}
	if req.Valid <= 0 {
		return nil, fmt.Errorf("validity %v: want > 0", req.Valid)
	}
	if req.Role.client() && (len(req.DNS) > 0 || len(req.IPs) > 0) {
		return nil, fmt.Errorf("hosts are for the coordinator's certificate; a %s's certificate names no host", req.Role)
	}
	if req.Role == Coordinator && len(req.DNS) == 0 && len(req.IPs) == 0 {
		return nil, errors.New("the coordinator's certificate needs at least one host (a DNS name or IP clients dial)")
	}
	if !req.Now.Before(ca.Cert.NotAfter) {
		return nil, fmt.Errorf("the CA expired on %s: create a new one (mdag certs init --force)", ca.Cert.NotAfter.UTC().Format(time.RFC3339))
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("key: %w", err)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	eku := x509.ExtKeyUsageServerAuth
	if req.Role.client() {
		eku = x509.ExtKeyUsageClientAuth
	}
	tpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: req.Name, Organization: []string{"mdag"}},
		NotBefore:             req.Now.Add(-Skew),
		NotAfter:              minTime(req.Now.Add(req.Valid), ca.Cert.NotAfter),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{eku},
		BasicConstraintsValid: true,
		URIs:                  []*url.URL{IdentityURI(req.Role, req.Name)},
		DNSNames:              req.DNS,
		IPAddresses:           req.IPs,
	}
	der, err := x509.CreateCertificate(rand.Reader, tpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		return nil, fmt.Errorf("certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("certificate: %w", err)
	}
	return &Issued{Cert: cert, Key: key}, nil
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

func newSerial() (*big.Int, error) {
	s, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, fmt.Errorf("serial number: %w", err)
	}
	return s.Add(s, big.NewInt(1)), nil
}

// CertPEM encodes a certificate.
func CertPEM(c *x509.Certificate) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
}

// KeyPEM encodes a private key (PKCS #8).
func KeyPEM(k *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// ParseCA reads a CA from its PEM certificate and key.
func ParseCA(certPEM, keyPEM []byte) (*CA, error) {
	b, _ := pem.Decode(certPEM)
	if b == nil || b.Type != "CERTIFICATE" {
		return nil, errors.New("no PEM CERTIFICATE block")
	}
	cert, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		return nil, err
	}
	if !cert.IsCA {
		return nil, fmt.Errorf("certificate %q is not a CA", cert.Subject.CommonName)
	}
	kb, _ := pem.Decode(keyPEM)
	if kb == nil || kb.Type != "PRIVATE KEY" {
		return nil, errors.New("the key file holds no PEM PRIVATE KEY block")
	}
	k, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("key: %w", err)
	}
	key, ok := k.(*ecdsa.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("key: a %T, want ECDSA", k)
	}
	if !key.PublicKey.Equal(cert.PublicKey) {
		return nil, errors.New("the key does not match the CA certificate")
	}
	return &CA{Cert: cert, Key: key}, nil
}
