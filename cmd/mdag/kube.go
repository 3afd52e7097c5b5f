package main

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/mdag/mdag/coordinator"
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

// kubeFlags are `mdag coordinator`'s provisioner flags.
type kubeFlags struct {
	kind         *string
	namespace    *string
	kubeconfig   *string
	maxWorkers   *string
	startTimeout *time.Duration
}

func addKubeFlags(fs *flag.FlagSet) *kubeFlags {
	return &kubeFlags{
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

// provisioner returns the kubernetes provisioner (nil for none) and sets
// cfg's; its watch starts with watch(e) once the engine exists.
func (k *kubeFlags) provisioner(cfg *coordinator.Config, log *slog.Logger) (kubeProvisioner, error) {
	switch *k.kind {
	case "", "none":
		for _, f := range []struct{ name, v string }{{"namespace", *k.namespace}, {"kubeconfig", *k.kubeconfig}, {"max-workers", *k.maxWorkers}} {
			if f.v != "" {
				return nil, fmt.Errorf("mdag coordinator: --%s needs --provisioner kubernetes", f.name)
			}
		}
		return nil, nil
	case "kubernetes":
	default:
		return nil, fmt.Errorf("mdag coordinator: --provisioner %q: want none or kubernetes", *k.kind)
	}
	if *k.startTimeout <= 0 {
		return nil, fmt.Errorf("mdag coordinator: --start-timeout %v: want > 0", *k.startTimeout)
	}
	limits, err := parseMaxWorkers(*k.maxWorkers)
	if err != nil {
		return nil, fmt.Errorf("mdag coordinator: --max-workers %q: %w", *k.maxWorkers, err)
	}
	ns := *k.namespace
	if ns == "" {
		ns = "mdag"
		if b, err := os.ReadFile(inClusterNamespace); err == nil && strings.TrimSpace(string(b)) != "" {
			ns = strings.TrimSpace(string(b))
		}
	}
	p, err := newKubeProvisioner(ns, *k.kubeconfig, limits, log)
	if err != nil {
		return nil, err
	}
	cfg.Provisioner, cfg.StartTimeout = p, *k.startTimeout
	log.Info("kubernetes provisioner", "namespace", ns, "limits", p.Limits(), "start_timeout", *k.startTimeout)
	return p, nil
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
