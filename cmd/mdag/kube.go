package main

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/mdag/mdag/coordinator"
	"github.com/mdag/mdag/internal/pki"
	"github.com/mdag/mdag/profile"
)

// kubeProvisioner is coordinator/kube's Provisioner as the coordinator
// command uses it (kube_full.go; the lean build has none: kube_lean.go).
type kubeProvisioner interface {
	coordinator.Provisioner
	Watch(*coordinator.Engine)
	Close()
}

// defaultKubeLimit is kube.DefaultLimit (TestKubeDefaultLimit), for the
// help of both builds.
const defaultKubeLimit = 4

// defaultKubeCertValid is kube.DefaultCertValid (TestKubeDefaultCertValid),
// for the help of both builds.
const defaultKubeCertValid = 30 * 24 * time.Hour

// kubeFlags are `mdag coordinator`'s provisioner flags.
type kubeFlags struct {
	fs           *flag.FlagSet // the TLS flags: the CA the issuer must agree with
	kind         *string
	namespace    *string
	kubeconfig   *string
	maxWorkers   *string
	startTimeout *time.Duration
	issuer       *string
	certValid    *time.Duration
}

// kubeOptions are what newKubeProvisioner needs.
type kubeOptions struct {
	namespace, kubeconfig string
	limits                map[profile.WorkerTypeID]int
	// issuer signs each pod's worker certificate (nil: the pods share the
	// template's); trust is each pod's ca.pem.
	issuer    *pki.CA
	trust     []byte
	certValid time.Duration
}

func addKubeFlags(fs *flag.FlagSet) *kubeFlags {
	return &kubeFlags{
		fs: fs,
		issuer: fs.String("provisioner-issuer", "", "with --provisioner kubernetes: a `DIR` holding ca.pem and ca-key.pem (the deployment's CA, mdag certs init): "+
			"each worker pod gets a certificate of its own, mdag://worker/<instance ID>, in a Secret the pod owns, and registers only as that ID "+
			"(default: none, the pods share their template's mdag-worker-tls certificate, which the coordinator must declare --shared-cert)"),
		certValid: fs.Duration("provisioner-cert-valid", defaultKubeCertValid, "with --provisioner-issuer: how long each pod's certificate is valid (renewed in its Secret after two thirds of it)"),
		kind: fs.String("provisioner", "", "who starts and stops workers: none (the default: the workers that connect are the instances) or kubernetes "+
			"(a worker pod per planned instance, from the type's worker Deployment; the turn-off delay deletes it)"),
		namespace:  fs.String("namespace", "", "with --provisioner kubernetes: the namespace of the worker Deployments and pods (default: the pod's own namespace in a cluster, else mdag)"),
		kubeconfig: fs.String("kubeconfig", "", "with --provisioner kubernetes: a kubeconfig file (default: the in-cluster service account)"),
		maxWorkers: fs.String("max-workers", "", fmt.Sprintf("with --provisioner kubernetes: the most pods per worker type, e.g. P100=8,CPU=4; a type not named gets none "+
			"(default: %d for each type with a worker Deployment in the namespace at start)", defaultKubeLimit)),
		startTimeout: fs.Duration("start-timeout", 3*time.Minute, "with --provisioner kubernetes: a pod whose worker has not registered this long after it was created is counted lost and re-planned"),
	}
}

// inClusterNamespace is where a pod's service account says it runs.
const inClusterNamespace = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// check reports every problem with the provisioner's flags alone (the
// coordinator's validate calls it; provisioner calls it again).
func (k *kubeFlags) check() []error {
	var errs []error
	switch *k.kind {
	case "", "none":
		for _, f := range []struct{ name, v string }{{"namespace", *k.namespace}, {"kubeconfig", *k.kubeconfig}, {"max-workers", *k.maxWorkers}, {"provisioner-issuer", *k.issuer}} {
			if f.v != "" {
				errs = append(errs, fmt.Errorf("--%s needs --provisioner kubernetes", f.name))
			}
		}
		return errs
	case "kubernetes":
	default:
		return []error{fmt.Errorf("--provisioner %q: want none or kubernetes", *k.kind)}
	}
	if *k.startTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--start-timeout %v: want > 0", *k.startTimeout))
	}
	if _, err := parseMaxWorkers(*k.maxWorkers); err != nil {
		errs = append(errs, fmt.Errorf("--max-workers %q: %w", *k.maxWorkers, err))
	}
	if *k.certValid <= 0 {
		errs = append(errs, fmt.Errorf("--provisioner-cert-valid %v: want > 0", *k.certValid))
	}
	return errs
}

// provisioner returns the kubernetes provisioner (nil for none) and sets
// cfg's; its watch starts with watch(e) once the engine exists.
func (k *kubeFlags) provisioner(cfg *coordinator.Config, log *slog.Logger) (kubeProvisioner, error) {
	if errs := k.check(); len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if *k.kind != "kubernetes" {
		return nil, nil
	}
	limits, _ := parseMaxWorkers(*k.maxWorkers) // check parsed it
	ns := *k.namespace
	if ns == "" {
		ns = "mdag"
		if b, err := os.ReadFile(inClusterNamespace); err == nil && strings.TrimSpace(string(b)) != "" {
			ns = strings.TrimSpace(string(b))
		}
	}
	opts := kubeOptions{namespace: ns, kubeconfig: *k.kubeconfig, limits: limits, certValid: *k.certValid}
	if *k.issuer != "" {
		var err error
		if opts.issuer, opts.trust, err = k.loadIssuer(*k.issuer, log); err != nil {
			return nil, err
		}
	}
	p, err := newKubeProvisioner(opts, log)
	if err != nil {
		return nil, err
	}
	cfg.Provisioner, cfg.StartTimeout = p, *k.startTimeout
	log.Info("kubernetes provisioner", "namespace", ns, "limits", p.Limits(), "start_timeout", *k.startTimeout, "per_pod_certificates", opts.issuer != nil)
	return p, nil
}

// loadIssuer reads --provisioner-issuer's CA (ca.pem, ca-key.pem) and
// checks it against the coordinator's own TLS material, so that a wrong
// Secret fails here rather than as every worker refused: a certificate it
// issues must chain to the CA the coordinator checks workers against
// (--ca, else --tls-dir's ca.pem), and the coordinator's certificate (--cert,
// else --tls-dir's coordinator.pem) to the ca.pem the pods get.
func (k *kubeFlags) loadIssuer(dir string, log *slog.Logger) (*pki.CA, []byte, error) {
	fail := func(format string, args ...any) (*pki.CA, []byte, error) {
		return nil, nil, fmt.Errorf("--provisioner-issuer %s: "+format, append([]any{dir}, args...)...)
	}
	caPath, keyPath := filepath.Join(dir, pki.CAFile), filepath.Join(dir, pki.CAKeyFile)
	caPEM, err := os.ReadFile(caPath)
	if err != nil {
		return fail("%v", err)
	}
	keyPEM, err := os.ReadFile(keyPath)
	if err != nil {
		return fail("%v (the issuer needs the CA's key: a Secret of ca.pem and ca-key.pem, docs/deploy.md)", err)
	}
	ca, err := pki.ParseCA(caPEM, keyPEM)
	if err != nil {
		return fail("%s and %s: %v", caPath, keyPath, err)
	}
	now := time.Now()
	if !now.Before(ca.Cert.NotAfter) {
		return fail("the CA expired on %s", ca.Cert.NotAfter.UTC().Format(time.RFC3339))
	}
	tlsFlag := func(name string) string {
		if f := k.fs.Lookup(name); f != nil {
			return f.Value.String()
		}
		return ""
	}
	tlsDir, coordCA, coordCert := tlsFlag("tls-dir"), tlsFlag("ca"), tlsFlag("cert")
	if coordCA == "" && tlsDir != "" {
		coordCA = filepath.Join(tlsDir, pki.CAFile)
	}
	if coordCert == "" && tlsDir != "" {
		coordCert = pki.DirFiles(tlsDir, pki.Coordinator).Cert
	}
	if coordCA == "" {
		return fail("per-pod certificates need the coordinator on mutual TLS (--tls-dir)")
	}
	probe, err := ca.Issue(pki.Request{Role: pki.Worker, Name: "issuer-check", Now: now, Valid: time.Hour})
	if err != nil {
		return fail("%v", err)
	}
	if err := verifyWith(coordCA, probe.Cert, x509.ExtKeyUsageClientAuth, now); err != nil {
		return fail("a worker certificate it issues would be refused: it does not chain to the coordinator's CA %s (%v): give the deployment's CA, the one mdag certs init made with the coordinator's certificate", coordCA, err)
	}
	if coordCert != "" {
		if b, err := os.ReadFile(coordCert); err == nil {
			if c, err := firstCert(b); err == nil {
				if err := verifyPool(caPEM, c, x509.ExtKeyUsageServerAuth, now); err != nil {
					return fail("the workers it certifies would refuse the coordinator: its certificate %s does not chain to %s (%v)", coordCert, caPath, err)
				}
			}
		}
	}
	if left := ca.Cert.NotAfter.Sub(now); left < *k.certValid {
		log.Warn("the provisioner's CA expires before a full certificate validity: the pods' certificates end with it; renew the CA (docs/deploy.md)",
			"ca_expires", ca.Cert.NotAfter.UTC().Format(time.RFC3339), "provisioner_cert_valid", *k.certValid)
	}
	return ca, caPEM, nil
}

// verifyWith checks that c chains, for usage, to the CAs of PEM file path.
func verifyWith(path string, c *x509.Certificate, usage x509.ExtKeyUsage, now time.Time) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	return verifyPool(b, c, usage, now)
}

func verifyPool(caPEM []byte, c *x509.Certificate, usage x509.ExtKeyUsage, now time.Time) error {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return errors.New("no PEM certificate in it")
	}
	_, err := c.Verify(x509.VerifyOptions{Roots: pool, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{usage}})
	return err
}

// firstCert is the first certificate of a PEM file.
func firstCert(b []byte) (*x509.Certificate, error) {
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			return nil, errors.New("no PEM certificate")
		}
		if blk.Type == "CERTIFICATE" {
			return x509.ParseCertificate(blk.Bytes)
		}
	}
}

// parseMaxWorkers reads TYPE=N,TYPE=N (nil for "").
func parseMaxWorkers(s string) (map[profile.WorkerTypeID]int, error) {
	if s == "" {
		return nil, nil
	}
	out := map[profile.WorkerTypeID]int{}
	for _, part := range strings.Split(s, ",") {
		t, n, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok || t == "" {
			return nil, fmt.Errorf("%q: want TYPE=N", part)
		}
		v, err := strconv.Atoi(n)
		if err != nil || v < 0 {
			return nil, fmt.Errorf("%q: want a count >= 0", part)
		}
		if _, dup := out[profile.WorkerTypeID(t)]; dup {
			return nil, fmt.Errorf("type %s named twice", t)
		}
		out[profile.WorkerTypeID(t)] = v
	}
	if len(out) == 0 {
		return nil, errors.New("no type")
	}
	return out, nil
}
