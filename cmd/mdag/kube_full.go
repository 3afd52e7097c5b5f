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
	"github.com/mdag/mdag/profile"
)

// newKubeProvisioner connects to the cluster (kubeconfig, else the
// in-cluster service account) and returns the kubernetes provisioner of
// namespace ns.
func newKubeProvisioner(ns, kubeconfig string, limits map[profile.WorkerTypeID]int, log *slog.Logger) (kubeProvisioner, error) {
	var rc *rest.Config
	var err error
	if kubeconfig != "" {
		rc, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else {
		rc, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("mdag coordinator: kubernetes client config (--kubeconfig %q): %w", kubeconfig, err)
	}
	cs, err := kube.NewClient(rc)
	if err != nil {
		return nil, fmt.Errorf("mdag coordinator: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := kube.New(ctx, kube.Config{Client: cs, Namespace: ns, Limits: limits, Log: log})
	if err != nil {
		return nil, fmt.Errorf("mdag coordinator: %w", err)
	}
	return kubeProv{p}, nil
}

// kubeProv is the provisioner with the engine as the receiver of its losses.
type kubeProv struct{ *kube.Provisioner }

func (k kubeProv) Watch(e *coordinator.Engine) { k.Provisioner.Watch(e) }
