//go:build lean

package main

import (
	"errors"
	"log/slog"
)

// newKubeProvisioner: the lean build carries no Kubernetes client (it is
// what a GPU machine runs, and client-go would double its size).
func newKubeProvisioner(kubeOptions, *slog.Logger) (kubeProvisioner, error) {
	return nil, errors.New("--provisioner kubernetes is in the full build (bin/mdag: make build); the lean build (bin/mdag-lean) has no Kubernetes client")
}
