package pki

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io/fs"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var t0 = time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)

func TestCheckName(t *testing.T) {
	for _, c := range []struct {
		name, err string
	}{
		{"w1", ""},
		{"gpu-1.rack_2", ""},
		{strings.Repeat("a", 64), ""},
		{"", "empty"},
		{strings.Repeat("a", 65), "longer than 64"},
		{"-w", "character '-' at 0"},
		{".w", "character '.' at 0"},
		{"w/1", "character '/' at 1"},
		{"w 1", "character ' ' at 1"},
		{"wé", "character 'é'"},
	} {
		err := CheckName(c.name)
		if c.err == "" && err != nil || c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)) {
			t.Errorf("CheckName(%q) = %v, want %q", c.name, err, c.err)
		}
	}
}

func TestParseHosts(t *testing.T) {
	for _, c := range []struct {
		in       string
		dns, ips []string
		err      string
	}{
		{DefaultHosts, []string{"localhost"}, []string{"127.0.0.1", "::1"}, ""},
		{"coord.example.com, 10.0.0.5", []string{"coord.example.com"}, []string{"10.0.0.5"}, ""},
		{"A.example.COM,a.example.com", []string{"a.example.com", "a.example.com"}, nil, ""},
		{"*.mdag.internal", []string{"*.mdag.internal"}, nil, ""},
		{"x,x", []string{"x"}, nil, ""},
		{"", nil, nil, "an empty entry"},
		{"a,,b", nil, nil, "an empty entry"},
		{"coord:7070", nil, nil, "a port or URL is not a host"},
		{"https://coord", nil, nil, "not an IP address nor a DNS name"},
		{"-bad.example", nil, nil, "character '-'"},
		{"a..b", nil, nil, "labels of 1 to 63"},
		{strings.Repeat("a", 64) + ".com", nil, nil, "labels of 1 to 63"},
		{strings.Repeat("a.", 127) + "com", nil, nil, "at most 253"},
	} {
		dns, ips, err := ParseHosts(c.in)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("ParseHosts(%q) = %v, want an error with %q", c.in, err, c.err)
			}
			continue
		}
		var got []string
		for _, ip := range ips {
			got = append(got, ip.String())
		}
		if err != nil || !slices.Equal(dns, c.dns) || !slices.Equal(got, c.ips) {
			t.Errorf("ParseHosts(%q) = %v %v %v, want %v %v", c.in, dns, got, err, c.dns, c.ips)
		}
	}
}

// FuzzParseHosts: --hosts is outside input: never a panic, and whatever
// it accepts signs into a certificate whose names are exactly those.
func FuzzParseHosts(f *testing.F) {
	for _, s := range []string{DefaultHosts, "a.b,10.0.0.1", "*.x", "", ",", "a:1", "fe80::1%eth0", "\x00", "é.com"} {
		f.Add(s)
	}
	ca, err := NewCA("fuzz", t0, time.Hour)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, s string) {
		dns, ips, err := ParseHosts(s)
		if err != nil {
			return
		}
		c, err := ca.Issue(Request{Role: Coordinator, Name: "c", DNS: dns, IPs: ips, Now: t0, Valid: time.Hour})
		if err != nil {
			t.Fatalf("ParseHosts(%q) accepted %v %v, which do not sign: %v", s, dns, ips, err)
		}
		if !slices.Equal(c.Cert.DNSNames, dns) || len(c.Cert.IPAddresses) != len(ips) {
			t.Fatalf("ParseHosts(%q): certificate names %v %v, want %v %v", s, c.Cert.DNSNames, c.Cert.IPAddresses, dns, ips)
		}
	})
}

func TestParseIdentity(t *testing.T) {
	for _, c := range []struct {
		uri  string
		role Role
		name string
		err  string
	}{
		{"mdag://worker/gpu-1", Worker, "gpu-1", ""},
		{"mdag://source/cam.door", Source, "cam.door", ""},
		{"mdag://coordinator/coordinator", Coordinator, "coordinator", ""},
		{"spiffe://worker/w", "", "", "not an mdag:// identity"},
		{"mdag://admin/w", "", "", `role "admin"`},
		{"mdag://worker", "", "", "no name"},
		{"mdag://worker/", "", "", "name is empty"},
		{"mdag://worker/a/b", "", "", "character '/'"},
		{"mdag://worker:1/w", "", "", "nothing else"},
		{"mdag://u:p@worker/w", "", "", "nothing else"},
		{"mdag://worker/w?x=1", "", "", "nothing else"},
		{"mdag://worker/w#f", "", "", "nothing else"},
		{"mdag:worker", "", "", "nothing else"},
	} {
		u, err := url.Parse(c.uri)
		if err != nil {
			t.Fatal(err)
		}
		role, name, err := ParseIdentity(u)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("ParseIdentity(%s) = %v, want an error with %q", c.uri, err, c.err)
			}
			continue
		}
		if err != nil || role != c.role || name != c.name {
			t.Errorf("ParseIdentity(%s) = %s %s %v, want %s %s", c.uri, role, name, err, c.role, c.name)
		}
	}
}

// FuzzParseIdentity: identities come from certificates, outside input:
// never a panic, and what it accepts round-trips through IdentityURI.
func FuzzParseIdentity(f *testing.F) {
	for _, s := range []string{"mdag://worker/w1", "mdag://x/y", "mdag://worker/", "mdag:///", "mdag://worker/%2F", "mdag://[::1]/w"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		u, err := url.Parse(s)
		if err != nil {
			return
		}
		role, name, err := ParseIdentity(u)
		if err != nil {
			return
		}
		back, err := url.Parse(IdentityURI(role, name).String())
		if err != nil {
			t.Fatalf("%q: IdentityURI does not parse: %v", s, err)
		}
		r2, n2, err := ParseIdentity(back)
		if err != nil || r2 != role || n2 != name {
			t.Fatalf("%q -> %s %s -> %s -> %s %s %v", s, role, name, back, r2, n2, err)
		}
	})
}

func mustCA(t testing.TB) *CA {
	t.Helper()
	ca, err := NewCA("test CA", t0, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// TestIssue: each role's certificate carries its identity, the right key
// usage and, for the coordinator only, hosts; it never outlives the CA.
func TestIssue(t *testing.T) {
	ca := mustCA(t)
	dns, ips, _ := ParseHosts(DefaultHosts)
	for _, c := range []struct {
		name string
		req  Request
		eku  x509.ExtKeyUsage
		err  string
	}{
		{"coordinator", Request{Role: Coordinator, Name: "c1", DNS: dns, IPs: ips, Now: t0, Valid: time.Hour}, x509.ExtKeyUsageServerAuth, ""},
		{"worker", Request{Role: Worker, Name: "w1", Now: t0, Valid: time.Hour}, x509.ExtKeyUsageClientAuth, ""},
		{"source", Request{Role: Source, Name: "s1", Now: t0, Valid: time.Hour}, x509.ExtKeyUsageClientAuth, ""},
		{"capped at the CA's end", Request{Role: Worker, Name: "w1", Now: t0, Valid: 1000 * time.Hour}, x509.ExtKeyUsageClientAuth, ""},
		{"worker with hosts", Request{Role: Worker, Name: "w1", DNS: dns, Now: t0, Valid: time.Hour}, 0, "a worker's certificate names no host"},
		{"coordinator without hosts", Request{Role: Coordinator, Name: "c", Now: t0, Valid: time.Hour}, 0, "needs at least one host"},
		{"unknown role", Request{Role: "admin", Name: "a", Now: t0, Valid: time.Hour}, 0, `role "admin"`},
		{"bad name", Request{Role: Worker, Name: "a b", Now: t0, Valid: time.Hour}, 0, "character ' '"},
		{"no validity", Request{Role: Worker, Name: "w", Now: t0}, 0, "validity 0s"},
		{"CA expired", Request{Role: Worker, Name: "w", Now: t0.Add(25 * time.Hour), Valid: time.Hour}, 0, "the CA expired"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := ca.Issue(c.req)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("Issue = %v, want an error with %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			role, name, err := RoleOf(got.Cert)
			if err != nil || role != c.req.Role || name != c.req.Name {
				t.Errorf("RoleOf = %s %s %v, want %s %s", role, name, err, c.req.Role, c.req.Name)
			}
			if !slices.Equal(got.Cert.ExtKeyUsage, []x509.ExtKeyUsage{c.eku}) {
				t.Errorf("key usage %v, want %v", got.Cert.ExtKeyUsage, c.eku)
			}
			if got.Cert.NotAfter.After(ca.Cert.NotAfter) || !got.Cert.NotBefore.Equal(t0.Add(-Skew)) {
				t.Errorf("valid %v to %v; the CA ends %v", got.Cert.NotBefore, got.Cert.NotAfter, ca.Cert.NotAfter)
			}
			if len(got.Cert.DNSNames) != len(c.req.DNS) || len(got.Cert.IPAddresses) != len(c.req.IPs) {
				t.Errorf("hosts %v %v, want %v %v", got.Cert.DNSNames, got.Cert.IPAddresses, c.req.DNS, c.req.IPs)
			}
			pool := x509.NewCertPool()
			pool.AddCert(ca.Cert)
			if _, err := got.Cert.Verify(x509.VerifyOptions{Roots: pool, CurrentTime: t0, KeyUsages: []x509.ExtKeyUsage{c.eku}}); err != nil {
				t.Errorf("does not verify against its CA: %v", err)
			}
		})
	}
}

// TestRoleOf: a certificate must carry exactly one valid mdag identity;
// other URI SANs are ignored.
func TestRoleOf(t *testing.T) {
	ca := mustCA(t)
	mk := func(uris ...string) *x509.Certificate {
		c, err := ca.Issue(Request{Role: Worker, Name: "w", Now: t0, Valid: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		cp := *c.Cert
		cp.URIs = nil
		for _, s := range uris {
			u, _ := url.Parse(s)
			cp.URIs = append(cp.URIs, u)
		}
		return &cp
	}
	for _, c := range []struct {
		uris []string
		want Role
		err  string
	}{
		{[]string{"mdag://worker/w"}, Worker, ""},
		{[]string{"spiffe://example.org/x", "mdag://source/s"}, Source, ""},
		{nil, "", "carries no mdag role"},
		{[]string{"spiffe://example.org/x"}, "", "carries no mdag role"},
		{[]string{"mdag://worker/a", "mdag://source/b"}, "", "carries 2 mdag identities"},
		{[]string{"mdag://root/a"}, "", `role "root"`},
	} {
		role, _, err := RoleOf(mk(c.uris...))
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("RoleOf(%v) = %s %v, want an error with %q", c.uris, role, err, c.err)
			}
		} else if err != nil || role != c.want {
			t.Errorf("RoleOf(%v) = %s %v, want %s", c.uris, role, err, c.want)
		}
	}
}

func perm(t *testing.T, p string) fs.FileMode {
	t.Helper()
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode().Perm()
}

// TestInit: one command makes the CA and a certificate per role, keys
// 0600 in a 0700 directory; it refuses to overwrite without Force and then
// writes nothing.
func TestInit(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	wrote, err := Init(dir, InitOptions{Now: t0})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"ca.pem", "ca-key.pem", "coordinator.pem", "coordinator-key.pem", "worker.pem", "worker-key.pem", "source.pem", "source-key.pem"}
	if len(wrote) != len(want) {
		t.Fatalf("wrote %v, want %v", wrote, want)
	}
	for i, w := range want {
		if wrote[i] != filepath.Join(dir, w) {
			t.Errorf("wrote[%d] = %s, want %s", i, wrote[i], w)
		}
		p := fs.FileMode(0o644)
		if strings.HasSuffix(w, "-key.pem") {
			p = 0o600
		}
		if got := perm(t, filepath.Join(dir, w)); got != p {
			t.Errorf("%s: mode %v, want %v", w, got, p)
		}
	}
	if got := perm(t, dir); got != 0o700 {
		t.Errorf("directory mode %v, want 0700", got)
	}
	for _, r := range Roles {
		if _, err := Load(DirFiles(dir, r), r, nil, func() time.Time { return t0 }); err != nil {
			t.Errorf("Load %s: %v", r, err)
		}
	}
	before, _ := os.ReadFile(filepath.Join(dir, "ca.pem"))
	if _, err := Init(dir, InitOptions{Now: t0}); err == nil || !strings.Contains(err.Error(), "refusing to overwrite") || !strings.Contains(err.Error(), "--force") {
		t.Errorf("second Init = %v, want a refusal naming --force", err)
	}
	if after, _ := os.ReadFile(filepath.Join(dir, "ca.pem")); !bytes.Equal(before, after) {
		t.Error("a refused Init changed ca.pem")
	}
	if _, err := Init(dir, InitOptions{Now: t0, Force: true}); err != nil {
		t.Fatal(err)
	}
	if after, _ := os.ReadFile(filepath.Join(dir, "ca.pem")); bytes.Equal(before, after) {
		t.Error("Init with Force kept the old CA")
	}
	if _, err := Init(t.TempDir(), InitOptions{Now: t0, Hosts: "coord:7070"}); err == nil || !strings.Contains(err.Error(), "not a host") {
		t.Errorf("Init with a bad host = %v", err)
	}
}

// TestIssueFiles: certificates from an existing CA, into its directory or
// another (which then gets ca.pem too), with the refusals.
func TestIssueFiles(t *testing.T) {
	dir := t.TempDir()
	if _, err := Init(dir, InitOptions{Now: t0}); err != nil {
		t.Fatal(err)
	}
	other := t.TempDir()
	if _, err := Init(other, InitOptions{Now: t0}); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "w1")
	for _, c := range []struct {
		name  string
		dir   string
		o     IssueOptions
		files []string // written, relative to the out directory
		err   string
	}{
		{"worker elsewhere", dir, IssueOptions{Role: Worker, Name: "w1", Out: out}, []string{"worker.pem", "worker-key.pem", "ca.pem"}, ""},
		{"source beside it, same ca.pem", dir, IssueOptions{Role: Source, Name: "s1", Out: out}, []string{"source.pem", "source-key.pem"}, ""},
		{"again", dir, IssueOptions{Role: Worker, Name: "w2", Out: out}, nil, "refusing to overwrite " + filepath.Join(out, "worker.pem") + ", " + filepath.Join(out, "worker-key.pem")},
		{"again, forced", dir, IssueOptions{Role: Worker, Name: "w2", Out: out, Force: true}, []string{"worker.pem", "worker-key.pem"}, ""},
		{"another CA's ca.pem there", other, IssueOptions{Role: Coordinator, Out: out}, nil, "refusing to overwrite " + filepath.Join(out, "ca.pem")},
		{"coordinator for a host", dir, IssueOptions{Role: Coordinator, Hosts: "coord.lan,10.1.2.3", Force: true}, []string{"coordinator.pem", "coordinator-key.pem"}, ""},
		{"hosts for a source", dir, IssueOptions{Role: Source, Hosts: "x", Out: t.TempDir()}, nil, "a source's certificate names no host"},
		{"no CA", t.TempDir(), IssueOptions{Role: Worker}, nil, "mdag certs init --dir"},
		{"bad role", dir, IssueOptions{Role: "root"}, nil, `role "root"`},
		{"bad name", dir, IssueOptions{Role: Worker, Name: "../x", Out: t.TempDir()}, nil, "character '.' at 0"},
	} {
		t.Run(c.name, func(t *testing.T) {
			// Issued at t0 and loaded at t0: never held against the real clock.
			c.o.Now = t0
			wrote, err := IssueFiles(c.dir, c.o)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("IssueFiles = %v %v, want an error with %q", wrote, err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			o := c.o.Out
			if o == "" {
				o = c.dir
			}
			var want []string
			for _, f := range c.files {
				want = append(want, filepath.Join(o, f))
			}
			if !slices.Equal(wrote, want) {
				t.Errorf("wrote %v, want %v", wrote, want)
			}
			m, err := Load(DirFiles(o, c.o.Role), c.o.Role, nil, func() time.Time { return t0 })
			if err != nil {
				t.Fatal(err)
			}
			name := c.o.Name
			if name == "" {
				name = string(c.o.Role)
			}
			if m.Name() != "mdag://"+string(c.o.Role)+"/"+name {
				t.Errorf("issued %s, want %s", m.Name(), name)
			}
		})
	}
	m, err := Load(DirFiles(dir, Coordinator), Coordinator, nil, func() time.Time { return t0 })
	if err != nil {
		t.Fatal(err)
	}
	if got := m.Certificate(); !slices.Equal(got.DNSNames, []string{"coord.lan"}) || len(got.IPAddresses) != 1 || got.IPAddresses[0].String() != "10.1.2.3" {
		t.Errorf("coordinator hosts %v %v", got.DNSNames, got.IPAddresses)
	}
}

// TestLoad: what does not make a usable peer is refused at start, naming
// the file and what is wrong.
func TestLoad(t *testing.T) {
	dir := t.TempDir()
	if _, err := Init(dir, InitOptions{Now: t0}); err != nil {
		t.Fatal(err)
	}
	other := t.TempDir()
	if _, err := Init(other, InitOptions{Now: t0}); err != nil {
		t.Fatal(err)
	}
	at := func(d time.Time) func() time.Time { return func() time.Time { return d } }
	wf := DirFiles(dir, Worker)
	for _, c := range []struct {
		name  string
		files Files
		role  Role
		now   func() time.Time
		err   string
	}{
		{"ok", wf, Worker, at(t0), ""},
		{"a source's certificate as the worker", DirFiles(dir, Source), Worker, at(t0), "is a source's certificate (mdag://source/source); a worker needs a worker's"},
		{"another CA", Files{CA: filepath.Join(other, CAFile), Cert: wf.Cert, Key: wf.Key}, Worker, at(t0), "does not verify against the CA in " + filepath.Join(other, CAFile)},
		{"the key of another", Files{CA: wf.CA, Cert: wf.Cert, Key: DirFiles(dir, Source).Key}, Worker, at(t0), "private key does not match public key"},
		{"expired", wf, Worker, at(t0.Add(DefaultCertValid + time.Hour)), "expired"},
		{"not yet valid", wf, Worker, at(t0.Add(-time.Hour)), "not yet valid"},
		{"no CA file", Files{CA: filepath.Join(dir, "nope.pem"), Cert: wf.Cert, Key: wf.Key}, Worker, at(t0), "nope.pem: no such file"},
		{"a CA file without certificates", Files{CA: wf.Key, Cert: wf.Cert, Key: wf.Key}, Worker, at(t0), "no PEM certificate"},
		{"bad role", wf, "root", at(t0), `role "root"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := Load(c.files, c.role, nil, c.now)
			if c.err == "" && err != nil || c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)) {
				t.Errorf("Load = %v, want %q", err, c.err)
			}
		})
	}
}

// handshake runs one TLS handshake over loopback TCP between a server with
// srv's configuration and a client with cli's; it returns what each side
// saw of the other, or both sides' errors.
func handshake(t *testing.T, srv, cli *tls.Config) (clientCert, serverCert *x509.Certificate, err error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type res struct {
		c   *x509.Certificate
		err error
	}
	done := make(chan res, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			done <- res{nil, err}
			return
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(20 * time.Second))
		s := tls.Server(c, srv)
		if err := s.Handshake(); err != nil {
			done <- res{nil, err}
			return
		}
		done <- res{s.ConnectionState().PeerCertificates[0], nil}
		_, _ = s.Write([]byte{1}) // the client reads this: the server accepted it
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	cl := tls.Client(c, cli)
	cerr := cl.Handshake()
	if cerr == nil {
		_, cerr = cl.Read(make([]byte, 1))
	}
	if cerr != nil {
		c.Close() // the server is not left waiting
	}
	r := <-done
	if r.err != nil || cerr != nil {
		return nil, nil, errors.Join(r.err, cerr)
	}
	return r.c, cl.ConnectionState().PeerCertificates[0], nil
}

func mustLoad(t *testing.T, dir string, r Role, log *slog.Logger) *Material {
	t.Helper()
	m, err := Load(DirFiles(dir, r), r, log, nil)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestHandshake: the coordinator accepts a client certificate from its CA
// only, and the client accepts only a coordinator's certificate for the
// name it dials.
func TestHandshake(t *testing.T) {
	now := time.Now()
	dir, other := t.TempDir(), t.TempDir()
	for _, d := range []string{dir, other} {
		if _, err := Init(d, InitOptions{Now: now}); err != nil {
			t.Fatal(err)
		}
	}
	coord := mustLoad(t, dir, Coordinator, nil)
	worker := mustLoad(t, dir, Worker, nil)
	foreign := mustLoad(t, other, Worker, nil)
	for _, c := range []struct {
		name string
		cli  *tls.Config
		err  string
	}{
		{"worker", worker.ClientConfig("127.0.0.1"), ""},
		{"localhost", worker.ClientConfig("localhost"), ""},
		{"a name not in the certificate", worker.ClientConfig("coord.example.com"), "not coord.example.com"},
		{"no client certificate", &tls.Config{RootCAs: worker.ClientConfig("").RootCAs, ServerName: "127.0.0.1", NextProtos: h2}, "client didn't provide a certificate"},
		{"another CA's worker", func() *tls.Config {
			c := foreign.ClientConfig("127.0.0.1")
			c.RootCAs = worker.ClientConfig("").RootCAs
			return c
		}(), "certificate signed by unknown authority"},
		{"the client trusts another CA", foreign.ClientConfig("127.0.0.1"), "certificate signed by unknown authority"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, srvCert, err := handshake(t, coord.ServerConfig(), c.cli)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("handshake = %v, want an error with %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if r, n, _ := RoleOf(got); r != Worker || n != "worker" {
				t.Errorf("the server saw %s/%s", r, n)
			}
			if r, _, _ := RoleOf(srvCert); r != Coordinator {
				t.Errorf("the client saw %s", r)
			}
		})
	}
}

// TestRotation: replacing the files takes effect at the next handshake on
// both sides, without a new Material; a replacement that does not load
// (a certificate without its key yet, a wrong role) keeps the previous
// material, logged once, until the files change again; replacing the CA
// refuses the old CA's clients.
func TestRotation(t *testing.T) {
	now := time.Now()
	dir := t.TempDir()
	if _, err := Init(dir, InitOptions{Now: now}); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	coord := mustLoad(t, dir, Coordinator, log)
	worker := mustLoad(t, dir, Worker, log)
	serial := func(c *x509.Certificate) string { return c.SerialNumber.String() }
	w0, s0, err := handshake(t, coord.ServerConfig(), worker.ClientConfig("127.0.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	srvCfg := coord.ServerConfig() // one configuration across rotations, as a server keeps it

	// New certificates from the same CA, both sides.
	for _, r := range []Role{Coordinator, Worker} {
		if _, err := IssueFiles(dir, IssueOptions{Role: r, Now: now, Force: true}); err != nil {
			t.Fatal(err)
		}
	}
	w1, s1, err := handshake(t, srvCfg, worker.ClientConfig("127.0.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	if serial(w1) == serial(w0) || serial(s1) == serial(s0) {
		t.Errorf("after rotation the peers still present the old certificates (worker %s, coordinator %s)", serial(w1), serial(s1))
	}
	if !strings.Contains(logs.String(), "certificate reloaded") {
		t.Errorf("no reload logged:\n%s", logs.String())
	}

	// Half a replacement: a new worker certificate whose key is not there
	// yet. The old pair stays in use, and the error is logged once.
	side := t.TempDir()
	if _, err := IssueFiles(dir, IssueOptions{Role: Worker, Name: "w2", Out: side}); err != nil {
		t.Fatal(err)
	}
	newCert, _ := os.ReadFile(filepath.Join(side, "worker.pem"))
	if err := writeAtomic(filepath.Join(dir, "worker.pem"), newCert, 0o644); err != nil {
		t.Fatal(err)
	}
	logs.Reset()
	for range 2 {
		w, _, err := handshake(t, srvCfg, worker.ClientConfig("127.0.0.1"))
		if err != nil {
			t.Fatalf("a half-replaced worker could not connect with its previous certificate: %v", err)
		}
		if serial(w) != serial(w1) {
			t.Errorf("the worker presented %s, want its previous %s", serial(w), serial(w1))
		}
	}
	if n := strings.Count(logs.String(), "do not load"); n != 1 {
		t.Errorf("the failed reload was logged %d times, want once:\n%s", n, logs.String())
	}
	newKey, _ := os.ReadFile(filepath.Join(side, "worker-key.pem"))
	if err := writeAtomic(filepath.Join(dir, "worker-key.pem"), newKey, 0o600); err != nil {
		t.Fatal(err)
	}
	if w, _, err := handshake(t, srvCfg, worker.ClientConfig("127.0.0.1")); err != nil || worker.Name() != "mdag://worker/w2" {
		t.Fatalf("after the key arrived: %v, presenting %s (%v)", err, worker.Name(), w)
	}

	// A new CA for everyone but a client that kept its old files: refused.
	old := t.TempDir()
	for _, f := range []string{CAFile, "worker.pem", "worker-key.pem"} {
		b, _ := os.ReadFile(filepath.Join(dir, f))
		if err := os.WriteFile(filepath.Join(old, f), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	stale := mustLoad(t, old, Worker, nil)
	if _, err := Init(dir, InitOptions{Now: now, Force: true}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := handshake(t, srvCfg, worker.ClientConfig("127.0.0.1")); err != nil {
		t.Fatalf("with the new CA on both sides: %v", err)
	}
	_, _, err = handshake(t, srvCfg, stale.ClientConfig("127.0.0.1"))
	var uae x509.UnknownAuthorityError
	if err == nil || (!errors.As(err, &uae) && !strings.Contains(err.Error(), "unknown authority")) {
		t.Errorf("a client of the replaced CA: %v, want unknown authority", err)
	}
}
