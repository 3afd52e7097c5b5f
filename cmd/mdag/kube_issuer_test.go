//go:build !lean

package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mdag/mdag/coordinator/kube"
	"github.com/mdag/mdag/internal/pki"
)

// TestKubeDefaultCertValid: the help's default is the provisioner's.
func TestKubeDefaultCertValid(t *testing.T) {
	if defaultKubeCertValid != kube.DefaultCertValid {
		t.Errorf("defaultKubeCertValid %v, kube.DefaultCertValid %v", defaultKubeCertValid, kube.DefaultCertValid)
	}
}

// --provisioner-issuer is checked against the coordinator's TLS material
// before anything starts: the deployment's CA passes (the run goes on to the
// cluster, here a missing kubeconfig), another CA, a missing key or no TLS
// at all do not.
func TestProvisionerIssuerFlags(t *testing.T) {
	dir := t.TempDir()
	certs, other, nokey := filepath.Join(dir, "certs"), filepath.Join(dir, "other"), filepath.Join(dir, "nokey")
	for _, d := range []string{certs, other} {
		if _, err := pki.Init(d, pki.InitOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(nokey, 0o700); err != nil {
		t.Fatal(err)
	}
	ca, err := os.ReadFile(filepath.Join(certs, pki.CAFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(nokey, pki.CAFile), ca, 0o600); err != nil {
		t.Fatal(err)
	}
	kc := "--provisioner kubernetes --kubeconfig /nonexistent/kubeconfig"
	cases := []struct{ args, want string }{
		{"--provisioner-issuer " + certs, "--provisioner-issuer needs --provisioner kubernetes"},
		{kc + " --tls-dir " + certs + " --provisioner-issuer " + certs, `kubernetes client config (--kubeconfig "/nonexistent/kubeconfig")`},
		{kc + " --tls-dir " + certs + " --provisioner-issuer " + other, "a worker certificate it issues would be refused: it does not chain to the coordinator's CA"},
		{kc + " --tls-dir " + certs + " --provisioner-issuer " + nokey, "the issuer needs the CA's key"},
		{kc + " --provisioner-issuer " + certs, "per-pod certificates need the coordinator on mutual TLS"},
		{kc + " --tls-dir " + certs + " --provisioner-issuer " + certs + " --provisioner-cert-valid 0s", "--provisioner-cert-valid 0s: want > 0"},
	}
	for _, c := range cases {
		var out, errb bytes.Buffer
		args := append([]string{"coordinator", "--example", "traffic", "--listen", "127.0.0.1:0", "--grpc", "127.0.0.1:0"}, strings.Fields(c.args)...)
		code := run(args, &out, &errb)
		if code != exitInvalid || !strings.Contains(errb.String(), c.want) {
			t.Errorf("mdag %s: exit %d, stderr %q; want exit %d and %q", strings.Join(args, " "), code, errb.String(), exitInvalid, c.want)
		}
	}
}
