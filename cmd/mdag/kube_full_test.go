//go:build !lean

package main

import (
	"testing"

	"github.com/mdag/mdag/coordinator/kube"
)

// TestKubeDefaultLimit: the help's default is the provisioner's.
func TestKubeDefaultLimit(t *testing.T) {
	if defaultKubeLimit != kube.DefaultLimit {
		t.Errorf("defaultKubeLimit %d, kube.DefaultLimit %d", defaultKubeLimit, kube.DefaultLimit)
	}
}
