// Package brokertest runs real message brokers (Debian's mosquitto and
// nats-server) for tests: each on a free loopback port, with its
// configuration and data in the test's temporary directory, stoppable and
// restartable on the same port with the same data (to test reconnection
// and persistence), killed when the test ends. A test skips when the
// broker's binary is missing, unless MDAG_REQUIRE_BROKERS is set (CI),
// where it fails instead (`make deps` installs the brokers).
package brokertest

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"
)

// RequireEnv, when set (to anything), turns a missing broker binary from a
// skip into a failure.
const RequireEnv = "MDAG_REQUIRE_BROKERS"

// startTimeout bounds how long a broker may take to accept connections.
const startTimeout = 10 * time.Second

// stopTimeout bounds how long a broker may take to exit after SIGTERM
// before it is killed.
const stopTimeout = 10 * time.Second

// Broker is a broker process: Stop and Start it again on the same port,
// configuration and data.
type Broker struct {
	t       testing.TB
	name    string // "mosquitto", "nats-server"
	bin     string
	args    []string
	dir     string
	logPath string
	scheme  string // "mqtt", "nats"
	port    int
	tlsPort int // 0: no TLS listener
	tlsURL  string

	// CA is the test CA that signed the broker's TLS certificate (nil
	// without TLS); CAPEM is its PEM file and CAPool a pool holding it
	// (for tls.Config.RootCAs).
	CA     *x509.Certificate
	CAPEM  string
	CAPool *x509.CertPool

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd has exited
}

// MosquittoOptions configures StartMosquitto.
type MosquittoOptions struct {
	// Users, when not empty, turns anonymous access off: only these
	// user names with these passwords may connect.
	Users map[string]string
	// TLS adds a TLS listener (a server certificate for 127.0.0.1 and
	// localhost, signed by a CA made for the test: Broker.CAPool).
	TLS bool
	// MessageSizeLimit, when positive, is mosquitto's message_size_limit:
	// a larger payload is refused (MQTT 5: PUBACK 0x95 packet too large).
	MessageSizeLimit int
	// Extra lines for mosquitto.conf.
	Extra []string
}

// NATSOptions configures StartNATS.
type NATSOptions struct {
	// JetStream enables JetStream, its storage in the test's directory
	// (kept across Stop and Start).
	JetStream bool
	// User and Password, when set, are required of clients.
	User, Password string
	// Token, when set, is required of clients (instead of a user).
	Token string
	// TLS makes the client port TLS-only (a certificate for 127.0.0.1 and
	// localhost, signed by a CA made for the test: Broker.CAPool).
	TLS bool
}

// lookBin finds the broker's binary, or skips (or fails, with
// MDAG_REQUIRE_BROKERS set) the test.
func lookBin(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		for _, dir := range []string{"/usr/sbin", "/usr/local/sbin", "/sbin"} {
			if _, serr := os.Stat(filepath.Join(dir, name)); serr == nil {
				return filepath.Join(dir, name)
			}
		}
		if os.Getenv(RequireEnv) != "" {
			t.Fatalf("%s not found (%v) and %s is set: `make deps` installs it (Debian package %s)", name, err, RequireEnv, debPackage(name))
		}
		t.Skipf("%s not installed (`make deps` installs it; set %s to fail instead)", name, RequireEnv)
	}
	return p
}

func debPackage(bin string) string {
	if bin == "mosquitto_passwd" {
		return "mosquitto"
	}
	return bin
}

// StartMosquitto starts mosquitto with persistence in the test's
// directory (sessions and queued QoS 1 messages survive Stop and Start).
func StartMosquitto(t testing.TB, opts MosquittoOptions) *Broker {
	t.Helper()
	bin := lookBin(t, "mosquitto")
	dir := t.TempDir()
	b := &Broker{t: t, name: "mosquitto", bin: bin, dir: dir, scheme: "mqtt", port: freePort(t)}
	data := filepath.Join(dir, "data")
	if err := os.Mkdir(data, 0o700); err != nil {
		t.Fatal(err)
	}
	var conf bytes.Buffer
	fmt.Fprintf(&conf, "listener %d 127.0.0.1\n", b.port)
	if opts.TLS {
		b.tlsPort = freePort(t)
		cert, key := b.makeCerts(t)
		fmt.Fprintf(&conf, "listener %d 127.0.0.1\ncertfile %s\nkeyfile %s\n", b.tlsPort, cert, key)
		b.tlsURL = fmt.Sprintf("mqtts://127.0.0.1:%d", b.tlsPort)
	}
	fmt.Fprintf(&conf, "persistence true\npersistence_location %s/\n", data)
	if os.Geteuid() == 0 {
		// as root, mosquitto drops to the user "mosquitto", which cannot
		// read the test's directory
		conf.WriteString("user root\n")
	}
	if len(opts.Users) == 0 {
		conf.WriteString("allow_anonymous true\n")
	} else {
		pw := filepath.Join(dir, "passwd")
		passwdBin := lookBin(t, "mosquitto_passwd")
		first := true
		for u, p := range opts.Users {
			args := []string{"-b", pw, u, p}
			if first {
				args = []string{"-c", "-b", pw, u, p}
				first = false
			}
			if out, err := exec.Command(passwdBin, args...).CombinedOutput(); err != nil {
				t.Fatalf("mosquitto_passwd: %v\n%s", err, out)
			}
		}
		fmt.Fprintf(&conf, "allow_anonymous false\npassword_file %s\n", pw)
	}
	if opts.MessageSizeLimit > 0 {
		fmt.Fprintf(&conf, "message_size_limit %d\n", opts.MessageSizeLimit)
	}
	for _, l := range opts.Extra {
		conf.WriteString(l + "\n")
	}
	confPath := filepath.Join(dir, "mosquitto.conf")
	if err := os.WriteFile(confPath, conf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	b.args = []string{"-c", confPath}
	b.launch()
	return b
}

// StartNATS starts nats-server (with JetStream storing in the test's
// directory when asked: streams survive Stop and Start).
func StartNATS(t testing.TB, opts NATSOptions) *Broker {
	t.Helper()
	bin := lookBin(t, "nats-server")
	dir := t.TempDir()
	b := &Broker{t: t, name: "nats-server", bin: bin, dir: dir, scheme: "nats", port: freePort(t)}
	b.args = []string{"-a", "127.0.0.1", "-p", strconv.Itoa(b.port)}
	if opts.JetStream {
		store := filepath.Join(dir, "jetstream")
		if err := os.Mkdir(store, 0o700); err != nil {
			t.Fatal(err)
		}
		b.args = append(b.args, "-js", "-sd", store)
	}
	if opts.User != "" {
		b.args = append(b.args, "--user", opts.User, "--pass", opts.Password)
	}
	if opts.Token != "" {
		b.args = append(b.args, "--auth", opts.Token)
	}
	if opts.TLS {
		cert, key := b.makeCerts(t)
		b.args = append(b.args, "--tls", "--tlscert", cert, "--tlskey", key)
		b.scheme = "tls"
	}
	b.launch()
	return b
}

// URL is the broker's (plain) client URL: mqtt://127.0.0.1:PORT or
// nats://127.0.0.1:PORT (tls://127.0.0.1:PORT for a TLS NATS).
func (b *Broker) URL() string { return fmt.Sprintf("%s://%s", b.scheme, b.Addr()) }

// TLSURL is mosquitto's TLS listener, mqtts://127.0.0.1:PORT ("" without
// TLS).
func (b *Broker) TLSURL() string { return b.tlsURL }

// Addr is the client port's host:port.
func (b *Broker) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(b.port)) }

// Dir is the broker's directory (configuration, data, log).
func (b *Broker) Dir() string { return b.dir }

// TLSConfig returns a client configuration trusting the test CA.
func (b *Broker) TLSConfig() *tls.Config {
	return &tls.Config{RootCAs: b.CAPool, MinVersion: tls.VersionTLS12}
}

// Start starts the broker again after Stop, on the same port with the same
// configuration and data, and waits until it accepts connections.
func (b *Broker) Start() {
	b.t.Helper()
	b.mu.Lock()
	running := b.cmd != nil
	b.mu.Unlock()
	if running {
		b.t.Fatalf("%s: Start while running", b.name)
	}
	b.launch()
}

// Stop stops the broker with SIGTERM (mosquitto saves its persistence
// file then) and waits for it to exit (killing it after 10 s).
func (b *Broker) Stop() {
	b.t.Helper()
	if err := b.stop(); err != nil {
		b.t.Fatal(err)
	}
}

func (b *Broker) stop() error {
	b.mu.Lock()
	cmd, exited := b.cmd, b.exited
	b.cmd = nil
	b.mu.Unlock()
	if cmd == nil {
		return nil
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
		return nil
	case <-time.After(stopTimeout):
		_ = cmd.Process.Kill()
		<-exited
		return fmt.Errorf("%s did not exit within %v of SIGTERM; killed\n%s", b.name, stopTimeout, b.logTail())
	}
}

// launch starts the process and waits for the port (both ports with TLS)
// to accept.
func (b *Broker) launch() {
	t := b.t
	t.Helper()
	if b.logPath == "" {
		b.logPath = filepath.Join(b.dir, b.name+".log")
		t.Cleanup(func() {
			err := b.stop()
			if err != nil || t.Failed() {
				t.Logf("%s log (%s), last lines:\n%s", b.name, b.logPath, b.logTail())
			}
			if err != nil {
				t.Error(err)
			}
		})
	}
	logf, err := os.OpenFile(b.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(b.bin, b.args...)
	cmd.Dir = b.dir
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		t.Fatalf("start %s: %v", b.name, err)
	}
	logf.Close() // the child holds its own descriptor
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	b.mu.Lock()
	b.cmd, b.exited = cmd, exited
	b.mu.Unlock()
	ports := []int{b.port}
	if b.tlsPort != 0 {
		ports = append(ports, b.tlsPort)
	}
	for _, p := range ports {
		if err := waitPort(p, exited); err != nil {
			t.Fatalf("%s %v: %v\n%s", b.name, b.args, err, b.logTail())
		}
	}
}

// waitPort dials 127.0.0.1:port until it accepts, with a short growing
// backoff, for at most startTimeout.
func waitPort(port int, exited <-chan struct{}) error {
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	deadline := time.Now().Add(startTimeout)
	backoff := 2 * time.Millisecond
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("port %d not accepting after %v: %v", port, startTimeout, err)
		}
		select {
		case <-exited:
			return errors.New("exited before accepting connections")
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 100*time.Millisecond)
	}
}

// logTail is the last 4 KiB of the broker's log.
func (b *Broker) logTail() string {
	data, err := os.ReadFile(b.logPath)
	if err != nil {
		return fmt.Sprintf("(log: %v)", err)
	}
	if len(data) > 4096 {
		data = data[len(data)-4096:]
	}
	return string(data)
}

// freePort returns a loopback TCP port free now (kept for the broker's
// life: brokers set SO_REUSEADDR, so a restart binds it again).
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// makeCerts makes a CA and a server certificate (ECDSA P-256) for
// 127.0.0.1 and localhost in b.dir, sets b.CA, b.CAPEM and b.CAPool and
// returns the server's certificate and key files.
func (b *Broker) makeCerts(t testing.TB) (certFile, keyFile string) {
	t.Helper()
	ca, caKey, caPEM := NewCA(t, "mdag brokertest CA")
	b.CA = ca
	b.CAPEM = filepath.Join(b.dir, "ca.pem")
	b.CAPool = x509.NewCertPool()
	b.CAPool.AddCert(ca)
	if err := os.WriteFile(b.CAPEM, caPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "127.0.0.1"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		DNSNames:     []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile = filepath.Join(b.dir, "server.pem")
	keyFile = filepath.Join(b.dir, "server.key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

// NewCA makes a self-signed ECDSA P-256 CA certificate (for a broker's
// certificate, or for a test's "wrong CA"), its key and its PEM.
func NewCA(t testing.TB, name string) (*x509.Certificate, *ecdsa.PrivateKey, []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert, key, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}
