//go:build !lean

package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/mdag/mdag/coordinator"
	"github.com/mdag/mdag/coordinator/kube"
)

// newKubeProvisioner connects to the cluster (kubeconfig, else the
// in-cluster service account) and returns the kubernetes provisioner of
// namespace ns.
func newKubeProvisioner(o kubeOptions, log *slog.Logger) (kubeProvisioner, error) {
	var rc *rest.Config
	var err error
	if o.kubeconfig != "" {
		rc, err = clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	} else {
		rc, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("kubernetes client config (--kubeconfig %q): %w", o.kubeconfig, err)
	}
	cs, err := kube.NewClient(rc)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := kube.Config{Client: cs, Namespace: o.namespace, Limits: o.limits, Log: log, CertValid: o.certValid}
	if o.issuer != nil {
		cfg.Issuer = &kube.Issuer{CA: o.issuer, Trust: o.trust}
	}
	p, err := kube.New(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return kubeProv{p}, nil
}

// kubeProv is the provisioner with the engine as the receiver of its losses.
type kubeProv struct{ *kube.Provisioner }

func (k kubeProv) Watch(e *coordinator.Engine) { k.Provisioner.Watch(e) }
