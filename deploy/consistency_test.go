package deploy

import (
	"fmt"
	"maps"
	"os"
	"path"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/gpu/registry"
	"github.com/mdag/mdag/profile"
)

// The conventions the kubernetes provisioner and the docs rely on.
const (
	namespace       = "mdag"
	coordinatorName = "mdag-coordinator"
	workerApp       = "mdag-worker"
	labelName       = "app.kubernetes.io/name"
	labelType       = "mdag.io/worker-type"
	labelPool       = "mdag.io/pool"
	gpuResource     = corev1.ResourceName("nvidia.com/gpu")
	gpuNodeLabel    = "mdag.io/gpu"
	mdagImage       = "mdag"
	leanImage       = "mdag-lean" // the lean build (the chart's image: lean)
	runnerImage     = "mdag-torch-runner"
	runnerScript    = "/opt/mdag/runners/torch/runner.py" // runners/torch/runner.py in the runner image
	appConfigMap    = "mdag-app"
	modelsConfigMap = "mdag-models"
)

// cluster is a set of decoded manifests and what they are checked against.
type cluster struct {
	objs    []manifest
	secrets map[string][]string // Secrets made by docs/deploy.md's commands: name -> keys
	cli     map[string]cliFlags // mdag subcommand -> its flags (nil: the args are not checked)
	runner  map[string]bool     // the torch runner's flags (nil: not checked)
	gpuSel  string              // the node label GPU workers select their GPU by
	// rendered: the objects are what kustomize made (images must be
	// pinned); else the files, whose bare image names the kustomization maps
	rendered bool
}

// each visits the manifests of one Go type.
func each[T any](c *cluster, f func(manifest, T)) {
	for _, m := range c.objs {
		if o, ok := m.obj.(T); ok {
			f(m, o)
		}
	}
}

func (c *cluster) configMap(ns, name string) *corev1.ConfigMap {
	var found *corev1.ConfigMap
	each(c, func(_ manifest, cm *corev1.ConfigMap) {
		if cm.Namespace == ns && cm.Name == name {
			found = cm
		}
	})
	return found
}

// keys are the keys of a ConfigMap or Secret the pod's volume names, or
// false when there is none.
func (c *cluster) keys(ns string, v corev1.Volume) ([]string, bool) {
	switch {
	case v.ConfigMap != nil:
		cm := c.configMap(ns, v.ConfigMap.Name)
		if cm == nil {
			return nil, false
		}
		var ks []string
		for k := range cm.Data {
			ks = append(ks, k)
		}
		for k := range cm.BinaryData {
			ks = append(ks, k)
		}
		return ks, true
	case v.Secret != nil:
		ks, ok := c.secrets[v.Secret.SecretName]
		return ks, ok
	}
	return nil, false
}

// deployed parses the app and profiles the coordinator runs (the mdag-app
// ConfigMap).
func (c *cluster) deployed() (*dag.App, *profile.File, error) {
	cm := c.configMap(namespace, appConfigMap)
	if cm == nil {
		return nil, nil, fmt.Errorf("no ConfigMap %s/%s (the deployed app and profiles)", namespace, appConfigMap)
	}
	app, err := dag.Parse("ConfigMap "+appConfigMap+" app.yaml", []byte(cm.Data["app.yaml"]))
	if err != nil {
		return nil, nil, err
	}
	pf, err := profile.Parse("ConfigMap "+appConfigMap+" profiles.yaml", []byte(cm.Data["profiles.yaml"]))
	return app, pf, err
}

// problems collects what check finds.
type problems []string

func (p *problems) add(where fmt.Stringer, format string, args ...any) {
	*p = append(*p, where.String()+": "+fmt.Sprintf(format, args...))
}

// check runs every consistency check and returns the problems found.
func (c *cluster) check() problems {
	var p problems
	c.checkNamespaces(&p)
	c.checkNames(&p)
	c.checkPods(&p)
	c.checkWorkers(&p)
	c.checkCoordinator(&p)
	c.checkRBAC(&p)
	c.checkIssuer(&p)
	c.checkServices(&p)
	c.checkServiceMonitors(&p)
	c.checkModels(&p)
	// security_test.go
	c.checkPodSecurity(&p)
	c.checkNetworkPolicies(&p)
	c.checkImages(&p)
	return p
}

// checkNamespaces: every namespaced object is in mdag, and the Namespace
// itself is among the manifests.
func (c *cluster) checkNamespaces(p *problems) {
	hasNS := false
	for _, m := range c.objs {
		switch o := m.obj.(type) {
		case *corev1.Namespace:
			hasNS = hasNS || o.Name == namespace
		case *kustomization:
		case metav1.Object:
			if o.GetNamespace() != namespace {
				p.add(m, "%s is in namespace %q, want %q", o.GetName(), o.GetNamespace(), namespace)
			}
		}
	}
	if !hasNS {
		*p = append(*p, "no Namespace "+namespace)
	}
}

// checkNames: names, labels, ports and env names are what the API server
// accepts (strict decoding checks the fields, not these values): object
// names DNS-1123 subdomains (a Service's or Namespace's a label), label keys
// qualified names and values label values, container, volume and port names
// DNS-1123 labels (ports at most 15 characters), env names C identifiers.
func (c *cluster) checkNames(p *problems) {
	bad := func(m manifest, what, v string, errs []string) {
		if len(errs) > 0 {
			p.add(m, "%s %q: %s", what, v, strings.Join(errs, "; "))
		}
	}
	labelMap := func(m manifest, what string, l map[string]string) {
		for k, v := range l {
			bad(m, what+" key", k, validation.IsQualifiedName(k))
			bad(m, what+" value", v, validation.IsValidLabelValue(v))
		}
	}
	for _, m := range c.objs {
		o, ok := m.obj.(metav1.Object)
		if !ok {
			continue
		}
		switch m.obj.(type) {
		case *corev1.Service, *corev1.Namespace:
			bad(m, "name", o.GetName(), validation.IsDNS1123Label(o.GetName()))
		default:
			bad(m, "name", o.GetName(), validation.IsDNS1123Subdomain(o.GetName()))
		}
		labelMap(m, "label", o.GetLabels())
		switch o := m.obj.(type) {
		case *corev1.Service:
			labelMap(m, "selector", o.Spec.Selector)
			for _, sp := range o.Spec.Ports {
				bad(m, "port name", sp.Name, validation.IsValidPortName(sp.Name))
				bad(m, "port", fmt.Sprint(sp.Port), validation.IsValidPortNum(int(sp.Port)))
			}
		case *appsv1.Deployment:
			if o.Spec.Selector != nil {
				labelMap(m, "selector", o.Spec.Selector.MatchLabels)
			}
			ps := o.Spec.Template.Spec
			labelMap(m, "pod label", o.Spec.Template.Labels)
			labelMap(m, "nodeSelector", ps.NodeSelector)
			for _, v := range ps.Volumes {
				bad(m, "volume name", v.Name, validation.IsDNS1123Label(v.Name))
			}
			for _, ct := range ps.Containers {
				bad(m, "container name", ct.Name, validation.IsDNS1123Label(ct.Name))
				for _, cp := range ct.Ports {
					bad(m, "container port name", cp.Name, validation.IsValidPortName(cp.Name))
					bad(m, "container port", fmt.Sprint(cp.ContainerPort), validation.IsValidPortNum(int(cp.ContainerPort)))
				}
				for _, e := range ct.Env {
					bad(m, "env name", e.Name, validation.IsEnvVarName(e.Name))
				}
			}
		}
	}
}

// podTemplates are the Deployments' pod templates.
func (c *cluster) podTemplates() []struct {
	m manifest
	d *appsv1.Deployment
} {
	var ts []struct {
		m manifest
		d *appsv1.Deployment
	}
	each(c, func(m manifest, d *appsv1.Deployment) {
		ts = append(ts, struct {
			m manifest
			d *appsv1.Deployment
		}{m, d})
	})
	return ts
}

var envRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// checkPods: every Deployment's selector matches its pod labels; volumes
// name ConfigMaps, Secrets and PVCs that exist; mounts name volumes;
// $(VAR) in a command or args is defined in the container's env (else
// Kubernetes passes it on unexpanded); mdag containers' args parse with
// the CLI's flags, files they name are keys of the mounted volume, and the
// runner's flags are its own.
func (c *cluster) checkPods(p *problems) {
	pvcs := map[string]bool{}
	each(c, func(_ manifest, pvc *corev1.PersistentVolumeClaim) { pvcs[pvc.Namespace+"/"+pvc.Name] = true })
	for _, t := range c.podTemplates() {
		m, d := t.m, t.d
		sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
		switch {
		case err != nil:
			p.add(m, "selector: %v", err)
		case d.Spec.Selector == nil || sel.Empty():
			p.add(m, "Deployment %s has no selector", d.Name)
		case !sel.Matches(labels.Set(d.Spec.Template.Labels)):
			p.add(m, "Deployment %s: selector %s does not match its pod labels %v", d.Name, sel, d.Spec.Template.Labels)
		}
		ps := d.Spec.Template.Spec
		vols := map[string]corev1.Volume{}
		for _, v := range ps.Volumes {
			vols[v.Name] = v
			switch {
			case v.ConfigMap != nil, v.Secret != nil:
				ks, ok := c.keys(d.Namespace, v)
				if !ok {
					what, name := "ConfigMap", ""
					if v.ConfigMap != nil {
						name = v.ConfigMap.Name
					} else {
						what, name = "Secret", v.Secret.SecretName
					}
					p.add(m, "volume %s: %s %s is neither among the manifests nor made by docs/deploy.md", v.Name, what, name)
				}
				var items []corev1.KeyToPath
				if v.ConfigMap != nil {
					items = v.ConfigMap.Items
				} else {
					items = v.Secret.Items
				}
				for _, it := range items {
					if ok && !slices.Contains(ks, it.Key) {
						p.add(m, "volume %s: item %s is not a key of it (keys %v)", v.Name, it.Key, ks)
					}
				}
			case v.PersistentVolumeClaim != nil:
				if !pvcs[d.Namespace+"/"+v.PersistentVolumeClaim.ClaimName] {
					p.add(m, "volume %s: no PersistentVolumeClaim %s", v.Name, v.PersistentVolumeClaim.ClaimName)
				}
			}
		}
		if ps.ServiceAccountName != "" && !c.hasServiceAccount(d.Namespace, ps.ServiceAccountName) {
			p.add(m, "serviceAccountName %s: no such ServiceAccount", ps.ServiceAccountName)
		}
		for _, ct := range ps.Containers {
			where := stringer(fmt.Sprintf("%s container %s", m, ct.Name))
			mounts := map[string]corev1.Volume{} // mount path -> volume
			for _, vm := range ct.VolumeMounts {
				v, ok := vols[vm.Name]
				if !ok {
					p.add(where, "mounts volume %s, which the pod does not have", vm.Name)
					continue
				}
				mounts[vm.MountPath] = v
			}
			env := map[string]bool{}
			for _, e := range ct.Env {
				env[e.Name] = true
			}
			for _, a := range append(slices.Clone(ct.Command), ct.Args...) {
				for _, r := range envRef.FindAllStringSubmatch(a, -1) {
					if !env[r[1]] {
						p.add(where, "%q refers to $(%s), which is not in its env", a, r[1])
					}
				}
			}
			switch imageName(ct.Image) {
			case mdagImage, leanImage:
				c.checkMdagArgs(p, where, d, ct, mounts)
			case runnerImage:
				c.checkRunnerArgs(p, where, ct)
			default:
				p.add(where, "image %s: neither %s nor %s", ct.Image, mdagImage, runnerImage)
			}
		}
	}
}

func (c *cluster) hasServiceAccount(ns, name string) bool {
	found := false
	each(c, func(_ manifest, sa *corev1.ServiceAccount) { found = found || (sa.Namespace == ns && sa.Name == name) })
	return found
}

type stringer string

func (s stringer) String() string { return string(s) }

// imageName is the image without registry path, tag or digest: the name
// the kustomizations' images entries replace (the base's mdag; a rendered
// REGISTRY/mdag:TAG).
func imageName(image string) string {
	if i := strings.Index(image, "@"); i >= 0 {
		image = image[:i]
	}
	name := path.Base(image)
	if i := strings.Index(name, ":"); i >= 0 {
		name = name[:i]
	}
	return name
}

// checkMdagArgs: args[0] is an mdag command; the rest parse with its flags;
// a file flag's path lies in a mounted volume that has it (--tls-dir: the
// role's three files).
func (c *cluster) checkMdagArgs(p *problems, where fmt.Stringer, d *appsv1.Deployment, ct corev1.Container, mounts map[string]corev1.Volume) {
	if len(ct.Command) > 0 {
		p.add(where, "command %v replaces the image's entrypoint (mdag): give the command in args", ct.Command)
	}
	if len(ct.Args) == 0 {
		p.add(where, "no args: want an mdag command first")
		return
	}
	cmd := ct.Args[0]
	if c.cli == nil {
		return
	}
	flags, ok := c.cli[cmd]
	if !ok {
		p.add(where, "args[0] %q is not an mdag command this test knows (%v)", cmd, mapKeys(c.cli))
		return
	}
	vals, err := flags.parse(ct.Args[1:])
	if err != nil {
		p.add(where, "mdag %s %s: %v", cmd, strings.Join(ct.Args[1:], " "), err)
		return
	}
	// files the flags name must be in a mounted volume that holds them
	file := func(flag, p2 string, wantKeys ...string) {
		dir := p2
		if len(wantKeys) == 0 {
			dir = path.Dir(p2)
			wantKeys = []string{path.Base(p2)}
		}
		v, ok := mounts[dir]
		if !ok {
			p.add(where, "--%s %s: no volume is mounted at %s", flag, p2, dir)
			return
		}
		if v.PersistentVolumeClaim != nil {
			return
		}
		ks, ok := c.keys(d.Namespace, v)
		if !ok {
			return // said above
		}
		for _, k := range wantKeys {
			if !slices.Contains(ks, k) {
				p.add(where, "--%s %s: the volume %s mounted at %s has no %s (keys %v)", flag, p2, v.Name, dir, k, ks)
			}
		}
	}
	for _, f := range []string{"f", "p", "models", "tokens", "cameras"} {
		if v, ok := vals[f]; ok {
			file(f, v)
		}
	}
	if dir, ok := vals["tls-dir"]; ok {
		role := map[string]string{"coordinator": "coordinator", "worker": "worker", "source": "source"}[cmd]
		file("tls-dir", dir, "ca.pem", role+".pem", role+"-key.pem")
	}
	if dir, ok := vals["provisioner-issuer"]; ok {
		file("provisioner-issuer", dir, "ca.pem", "ca-key.pem")
	}
	if dir, ok := vals["state"]; ok {
		if v, ok := mounts[dir]; !ok || v.PersistentVolumeClaim == nil {
			p.add(where, "--state %s: want a PersistentVolumeClaim mounted there (the store must survive the pod)", dir)
		}
	}
}

func mapKeys[V any](m map[string]V) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// checkRunnerArgs: the runner runs runner.py, and each --flag is one of
// runner.py's.
func (c *cluster) checkRunnerArgs(p *problems, where fmt.Stringer, ct corev1.Container) {
	if !slices.Equal(ct.Command, []string{"python3", runnerScript}) {
		p.add(where, "command %v, want [python3 %s]", ct.Command, runnerScript)
	}
	if c.runner == nil {
		return
	}
	for _, a := range ct.Args {
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "--") || !c.runner[name] {
			p.add(where, "arg %q: not a flag of runners/torch/runner.py (%v)", a, mapKeys(c.runner))
		}
	}
}

// workerDeployments are the Deployments labelled as mdag workers.
func (c *cluster) workerDeployments() map[string]*appsv1.Deployment {
	ws := map[string]*appsv1.Deployment{}
	each(c, func(_ manifest, d *appsv1.Deployment) {
		if d.Labels[labelName] == workerApp {
			ws[d.Name] = d
		}
	})
	return ws
}

// checkWorkers: one worker Deployment per worker type of the deployed
// profiles, each following the conventions the provisioner reads.
func (c *cluster) checkWorkers(p *problems) {
	_, pf, err := c.deployed()
	if err != nil {
		*p = append(*p, "the deployed app: "+err.Error())
		return
	}
	types := map[string]profile.WorkerType{}
	for _, w := range pf.Workers {
		types[string(w.Type)] = w
	}
	seen := map[string]string{}
	for _, t := range c.podTemplates() {
		m, d := t.m, t.d
		if d.Labels[labelName] != workerApp {
			continue
		}
		typ := d.Labels[labelType]
		wt, ok := types[typ]
		if !ok {
			p.add(m, "label %s=%q: not a worker type of the deployed profiles (%v)", labelType, typ, mapKeys(types))
			continue
		}
		if prev, dup := seen[typ]; dup {
			p.add(m, "a second Deployment for worker type %s (%s has it)", typ, prev)
		}
		seen[typ] = d.Name
		if want := "mdag-worker-" + strings.ToLower(typ); d.Name != want {
			p.add(m, "named %s, want %s", d.Name, want)
		}
		if d.Spec.Replicas == nil || *d.Spec.Replicas != 0 {
			p.add(m, "replicas %v, want 0 (scaled by hand in static mode; provisioned mode creates bare pods)", ptrString(d.Spec.Replicas))
		}
		wantSel := map[string]string{labelName: workerApp, labelType: typ, labelPool: "static"}
		if d.Spec.Selector == nil || !maps.Equal(d.Spec.Selector.MatchLabels, wantSel) || len(d.Spec.Selector.MatchExpressions) > 0 {
			p.add(m, "selector %v, want matchLabels %v", d.Spec.Selector, wantSel)
		}
		for k, v := range wantSel {
			if d.Spec.Template.Labels[k] != v {
				p.add(m, "pod label %s=%q, want %q", k, d.Spec.Template.Labels[k], v)
			}
		}
		// the provisioner's pods (pool provisioned) must not be the Deployment's
		prov := labels.Set{}
		for k, v := range d.Spec.Template.Labels {
			prov[k] = v
		}
		prov[labelPool] = "provisioned"
		if sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector); err == nil && sel.Matches(prov) {
			p.add(m, "selector %s also matches the provisioner's pods (%s=provisioned): the Deployment would adopt or delete them", sel, labelPool)
		}
		c.checkWorkerPod(p, m, d, wt)
	}
	for _, typ := range mapKeys(types) {
		if _, ok := seen[typ]; !ok {
			*p = append(*p, fmt.Sprintf("worker type %s of the deployed profiles has no Deployment (want mdag-worker-%s)", typ, strings.ToLower(typ)))
		}
	}
}

func ptrString(r *int32) string {
	if r == nil {
		return "unset (1)"
	}
	return fmt.Sprint(*r)
}

// checkWorkerPod: the worker container's args and env per the conventions,
// its CPUs those of the worker type, and GPU types get their GPU, its node
// pool and the GPU taint's toleration (CPU types none of it).
func (c *cluster) checkWorkerPod(p *problems, m manifest, d *appsv1.Deployment, wt profile.WorkerType) {
	ps := d.Spec.Template.Spec
	var worker *corev1.Container
	for i := range ps.Containers {
		if ps.Containers[i].Name == "worker" {
			worker = &ps.Containers[i]
		}
	}
	if worker == nil {
		p.add(m, "no container named worker (the provisioner sets MDAG_WORKER_ID on it)")
		return
	}
	env := map[string]corev1.EnvVar{}
	for _, e := range worker.Env {
		env[e.Name] = e
	}
	for name, field := range map[string]string{"MDAG_WORKER_ID": "metadata.name", "POD_IP": "status.podIP"} {
		e, ok := env[name]
		if !ok || e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != field {
			p.add(m, "container worker: env %s must come from the downward API's %s", name, field)
		}
	}
	if len(worker.Args) == 0 || worker.Args[0] != "worker" {
		p.add(m, "container worker: args %v, want mdag worker ...", worker.Args)
	} else if c.cli != nil {
		vals, err := c.cli["worker"].parse(worker.Args[1:])
		if err == nil {
			want := map[string]string{
				"type": string(wt.Type), "id": "$(MDAG_WORKER_ID)", "coordinator": coordinatorName + ":7070",
				"tls-dir": "/etc/mdag/tls", "peer-listen": ":7071", "advertise": "$(POD_IP):7071",
				"ingest-listen": ":7072", "ingest-advertise": "$(POD_IP):7072",
			}
			for _, k := range mapKeys(want) {
				if vals[k] != want[k] {
					p.add(m, "container worker: --%s=%q, want %q", k, vals[k], want[k])
				}
			}
		}
	}
	if q, ok := worker.Resources.Requests[corev1.ResourceCPU]; !ok || q.Cmp(*resource.NewQuantity(int64(wt.CPUs), resource.DecimalSI)) != 0 {
		p.add(m, "container worker: requests cpu %v, want %d (the worker type's cpus: the planner runs that many CPU tasks at once on it)", q.String(), wt.CPUs)
	}
	gpus := int64(0)
	for _, ct := range ps.Containers {
		if q, ok := ct.Resources.Limits[gpuResource]; ok {
			gpus += q.Value()
		}
		if q, ok := ct.Resources.Requests[gpuResource]; ok && q.Cmp(ct.Resources.Limits[gpuResource]) != 0 {
			p.add(m, "container %s: nvidia.com/gpu requested %v but limited to %v (extended resources want them equal)", ct.Name, q.String(), ptrQ(ct.Resources.Limits[gpuResource]))
		}
	}
	if gpus != int64(wt.GPUs) {
		p.add(m, "the pod's containers are given %d nvidia.com/gpu, want %d (worker type %s has gpus: %d)", gpus, wt.GPUs, wt.Type, wt.GPUs)
	}
	tolerates := slices.ContainsFunc(ps.Tolerations, func(t corev1.Toleration) bool {
		return t.Key == string(gpuResource) && (t.Operator == corev1.TolerationOpExists) && (t.Effect == "" || t.Effect == corev1.TaintEffectNoSchedule)
	})
	sel, hasSel := ps.NodeSelector[c.gpuSel]
	if wt.GPUs > 0 {
		if !tolerates {
			p.add(m, "a GPU worker type without a toleration of the %s:NoSchedule taint (operator Exists)", gpuResource)
		}
		if !hasSel {
			p.add(m, "a GPU worker type without a nodeSelector %s", c.gpuSel)
		} else if want := gpuLabelValue(c.gpuSel, wt.GPU); sel != want {
			p.add(m, "nodeSelector %s=%s, want %s (the worker type's gpu: %s)", c.gpuSel, sel, want, wt.GPU)
		}
	} else {
		if tolerates {
			p.add(m, "a CPU worker type tolerates the GPU taint: it could take a GPU node's CPUs")
		}
		if hasSel {
			p.add(m, "a CPU worker type selects GPU nodes (%s=%s)", c.gpuSel, sel)
		}
	}
}

func ptrQ(q resource.Quantity) string { return q.String() }

// gpuLabelValue is the node label value of a GPU model under key: mdag.io/gpu
// is the model lowercased (p100); GKE's accelerator label names it
// nvidia-tesla-p100.
func gpuLabelValue(key, gpu string) string {
	if key == "cloud.google.com/gke-accelerator" {
		return "nvidia-tesla-" + strings.ToLower(gpu)
	}
	return strings.ToLower(gpu)
}

// checkCoordinator: one replica, Recreate (one process holds the store's
// lock), its Service's gRPC port is the one workers dial, probes on
// /healthz of its --listen port.
func (c *cluster) checkCoordinator(p *problems) {
	var d *appsv1.Deployment
	var m manifest
	each(c, func(mm manifest, dd *appsv1.Deployment) {
		if dd.Name == coordinatorName {
			d, m = dd, mm
		}
	})
	if d == nil {
		*p = append(*p, "no Deployment "+coordinatorName)
		return
	}
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 1 {
		p.add(m, "replicas %s, want 1 (one coordinator per app)", ptrString(d.Spec.Replicas))
	}
	if d.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType {
		p.add(m, "strategy %q, want Recreate: the store is one bbolt file that one process locks", d.Spec.Strategy.Type)
	}
	if d.Spec.Template.Spec.ServiceAccountName != coordinatorName {
		p.add(m, "serviceAccountName %q, want %s (the provisioner's RBAC)", d.Spec.Template.Spec.ServiceAccountName, coordinatorName)
	}
	if len(d.Spec.Template.Spec.Containers) != 1 {
		p.add(m, "%d containers, want 1", len(d.Spec.Template.Spec.Containers))
		return
	}
	ct := d.Spec.Template.Spec.Containers[0]
	if len(ct.Args) == 0 || ct.Args[0] != "coordinator" || c.cli == nil {
		if len(ct.Args) == 0 || ct.Args[0] != "coordinator" {
			p.add(m, "args %v, want mdag coordinator ...", ct.Args)
		}
		return
	}
	vals, err := c.cli["coordinator"].parse(ct.Args[1:])
	if err != nil {
		return // said by checkPods
	}
	ports := map[string]int32{}
	for _, cp := range ct.Ports {
		ports[cp.Name] = cp.ContainerPort
	}
	for flag, name := range map[string]string{"grpc": "grpc", "listen": "http", "metrics-listen": "metrics"} {
		want := fmt.Sprintf(":%d", ports[name])
		if vals[flag] != want {
			p.add(m, "--%s=%q, want %q (the container port named %s)", flag, vals[flag], want, name)
		}
	}
	if vals["state"] == "" {
		p.add(m, "no --state: a restart would lose every session")
	}
	if vals["tls-dir"] == "" {
		p.add(m, "no --tls-dir: gRPC off loopback needs mutual TLS")
	}
	for _, pr := range []struct {
		name string
		pr   *corev1.Probe
	}{{"readiness", ct.ReadinessProbe}, {"liveness", ct.LivenessProbe}} {
		if pr.pr == nil || pr.pr.HTTPGet == nil || pr.pr.HTTPGet.Path != "/healthz" || pr.pr.HTTPGet.Port.String() != "http" {
			p.add(m, "%s probe: want GET /healthz on port http", pr.name)
		}
	}
	if !c.hasServicePort(coordinatorName, "grpc", 7070) {
		p.add(m, "no Service %s with port grpc 7070 (workers dial %s:7070)", coordinatorName, coordinatorName)
	}
}

func (c *cluster) hasServicePort(svc, name string, port int32) bool {
	found := false
	each(c, func(_ manifest, s *corev1.Service) {
		if s.Name != svc {
			return
		}
		for _, sp := range s.Spec.Ports {
			found = found || (sp.Name == name && sp.Port == port)
		}
	})
	return found
}

// checkServices: each Service selects the pods of a Deployment in its
// namespace, and each target port is a port of theirs.
func (c *cluster) checkServices(p *problems) {
	each(c, func(m manifest, s *corev1.Service) {
		if len(s.Spec.Selector) == 0 {
			p.add(m, "Service %s has no selector", s.Name)
			return
		}
		sel := labels.SelectorFromSet(s.Spec.Selector)
		var pods []corev1.PodSpec
		for _, t := range c.podTemplates() {
			if t.d.Namespace == s.Namespace && sel.Matches(labels.Set(t.d.Spec.Template.Labels)) {
				pods = append(pods, t.d.Spec.Template.Spec)
			}
		}
		if len(pods) == 0 {
			p.add(m, "Service %s: selector %s matches no pod template", s.Name, sel)
			return
		}
		for _, sp := range s.Spec.Ports {
			for _, ps := range pods {
				if !podHasPort(ps, sp) {
					p.add(m, "Service %s port %s: target port %s is not a container port of the pods it selects", s.Name, sp.Name, sp.TargetPort.String())
				}
			}
		}
	})
}

func podHasPort(ps corev1.PodSpec, sp corev1.ServicePort) bool {
	for _, ct := range ps.Containers {
		for _, cp := range ct.Ports {
			if sp.TargetPort.String() == cp.Name || (sp.TargetPort.IntValue() != 0 && int32(sp.TargetPort.IntValue()) == cp.ContainerPort) ||
				(sp.TargetPort.String() == "0" && sp.Port == cp.ContainerPort) {
				return true
			}
		}
	}
	return false
}

// checkServiceMonitors: each selects a Service in a namespace it watches,
// and scrapes ports that Service has.
func (c *cluster) checkServiceMonitors(p *problems) {
	each(c, func(m manifest, sm *monitoringv1.ServiceMonitor) {
		sel, err := metav1.LabelSelectorAsSelector(&sm.Spec.Selector)
		if err != nil || sel.Empty() {
			p.add(m, "selector %v: %v (empty selects every Service)", sm.Spec.Selector, err)
			return
		}
		var svcs []*corev1.Service
		each(c, func(_ manifest, s *corev1.Service) {
			inNS := s.Namespace == sm.Namespace || sm.Spec.NamespaceSelector.Any || slices.Contains(sm.Spec.NamespaceSelector.MatchNames, s.Namespace)
			if inNS && sel.Matches(labels.Set(s.Labels)) {
				svcs = append(svcs, s)
			}
		})
		if len(svcs) == 0 {
			p.add(m, "ServiceMonitor %s: selector %s matches no Service", sm.Name, sel)
			return
		}
		if len(sm.Spec.Endpoints) == 0 {
			p.add(m, "ServiceMonitor %s: no endpoints", sm.Name)
		}
		for _, e := range sm.Spec.Endpoints {
			for _, s := range svcs {
				if e.Port == "" || !slices.ContainsFunc(s.Spec.Ports, func(sp corev1.ServicePort) bool { return sp.Name == e.Port }) {
					p.add(m, "ServiceMonitor %s: endpoint port %q is not a named port of Service %s", sm.Name, e.Port, s.Name)
				}
			}
		}
	})
}

// checkModels: every GPU module of the deployed app runs somewhere on each
// kserve worker: in its registry or emulated; every registry entry is
// served by the runner beside it, as the runner serves it (input layout,
// size, batch).
func (c *cluster) checkModels(p *problems) {
	app, _, err := c.deployed()
	if err != nil {
		return // said by checkWorkers
	}
	for _, t := range c.podTemplates() {
		m, d := t.m, t.d
		var worker, runner *corev1.Container
		for i, ct := range d.Spec.Template.Spec.Containers {
			switch imageName(ct.Image) {
			case mdagImage, leanImage:
				if ct.Name == "worker" {
					worker = &d.Spec.Template.Spec.Containers[i]
				}
			case runnerImage:
				runner = &d.Spec.Template.Spec.Containers[i]
			}
		}
		if worker == nil || c.cli == nil || len(worker.Args) == 0 {
			continue
		}
		vals, err := c.cli["worker"].parse(worker.Args[1:])
		if err != nil {
			continue // said by checkPods
		}
		if vals["executor"] != "kserve" {
			if runner != nil {
				p.add(m, "a torch runner beside a worker whose executor is %q, not kserve", vals["executor"])
			}
			continue
		}
		if runner == nil {
			p.add(m, "--executor kserve without a runner in the pod")
			continue
		}
		reg, err := c.registry(d, worker, vals["models"])
		if err != nil {
			p.add(m, "--models: %v", err)
			continue
		}
		emulated := strings.Split(vals["emulate"], ",")
		for _, mod := range app.Modules {
			if mod.Kind == dag.GPU && reg.Models[mod.Model] == nil && !slices.Contains(emulated, mod.Model) {
				p.add(m, "GPU module %s's model %s is neither in the registry nor --emulate'd", mod.Name, mod.Model)
			}
		}
		rv := runnerValues(runner.Args)
		served := map[string]bool{}
		for _, spec := range rv["model"] {
			name, _, _ := strings.Cut(spec, "=")
			served[name] = true
		}
		listen := last(rv["listen"])
		for _, name := range mapKeys(reg.Models) {
			e := reg.Models[name]
			if e.Format != "kserve" || e.KServe == nil {
				p.add(m, "registry entry %s: format %q, want kserve (the runner serves it)", name, e.Format)
				continue
			}
			if e.KServe.Endpoint != listen {
				p.add(m, "registry entry %s: endpoint %s, but the runner listens on %s", name, e.KServe.Endpoint, listen)
			}
			if !served[e.KServe.Model] {
				p.add(m, "registry entry %s: model %s is not one the runner loads (--model %v)", name, e.KServe.Model, rv["model"])
			}
			size := last(rv["size"])
			if size == "" {
				size = "224"
			}
			if fmt.Sprint(e.Input.Width) != size || fmt.Sprint(e.Input.Height) != size {
				p.add(m, "registry entry %s: input %dx%d, the runner's --size %s", name, e.Input.Width, e.Input.Height, size)
			}
			in := last(rv["input"])
			if in == "" {
				in = "uint8-nhwc"
			}
			if want := strings.ToLower(e.Input.DType + "-" + e.Input.Layout); want != in {
				p.add(m, "registry entry %s: input %s, the runner's --input %s", name, want, in)
			}
			mb := 32 // the runner's default
			if s := last(rv["max-batch"]); s != "" {
				if mb, err = strconv.Atoi(s); err != nil {
					p.add(m, "the runner's --max-batch %q: %v", s, err)
				}
			}
			if e.MaxBatch > mb {
				p.add(m, "registry entry %s: max_batch %d above the runner's --max-batch %d", name, e.MaxBatch, mb)
			}
		}
	}
}

func last(s []string) string {
	if len(s) == 0 {
		return ""
	}
	return s[len(s)-1]
}

// runnerValues are the runner's --flag=value args by flag.
func runnerValues(args []string) map[string][]string {
	v := map[string][]string{}
	for _, a := range args {
		name, val, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		v[name] = append(v[name], val)
	}
	return v
}

// registry parses the model registry a worker's --models names, from the
// ConfigMap mounted there.
func (c *cluster) registry(d *appsv1.Deployment, ct *corev1.Container, file string) (*registry.Registry, error) {
	for _, vm := range ct.VolumeMounts {
		if vm.MountPath != path.Dir(file) {
			continue
		}
		for _, v := range d.Spec.Template.Spec.Volumes {
			if v.Name == vm.Name && v.ConfigMap != nil {
				cm := c.configMap(d.Namespace, v.ConfigMap.Name)
				if cm == nil {
					return nil, fmt.Errorf("no ConfigMap %s", v.ConfigMap.Name)
				}
				data, ok := cm.Data[path.Base(file)]
				if !ok {
					return nil, fmt.Errorf("ConfigMap %s has no %s", cm.Name, path.Base(file))
				}
				return registry.Parse("ConfigMap "+cm.Name+" "+path.Base(file), []byte(data))
			}
		}
	}
	return nil, fmt.Errorf("%s is not in a ConfigMap mounted in the container", file)
}

// docSecrets are the Secrets docs/deploy.md makes: each `kubectl create
// secret generic NAME` command and the keys its --from-file=KEY=PATH (or
// --from-file=PATH: the file's name) give.
func docSecrets(doc string) map[string][]string {
	// a command may continue over lines ending in a backslash
	doc = strings.ReplaceAll(doc, "\\\n", " ")
	re := regexp.MustCompile(`kubectl(?: -n \S+| --namespace[ =]\S+)* create secret generic (\S+)([^\n]*)`)
	out := map[string][]string{}
	for _, m := range re.FindAllStringSubmatch(doc, -1) {
		var keys []string
		for _, f := range strings.Fields(m[2]) {
			v, ok := strings.CutPrefix(f, "--from-file=")
			if !ok {
				continue
			}
			if k, _, ok := strings.Cut(v, "="); ok {
				keys = append(keys, k)
			} else {
				keys = append(keys, path.Base(v))
			}
		}
		// a Secret mentioned again (its rotation) keeps the keys it was made with
		out[m[1]] = append(out[m[1]], keys...)
	}
	return out
}

// loadCluster decodes the manifests of dirs (base and monitoring: what
// kubectl apply -k applies) with what they are checked against.
func loadCluster(t *testing.T, dirs ...string) *cluster {
	t.Helper()
	c := &cluster{gpuSel: gpuNodeLabel}
	for _, d := range dirs {
		for _, m := range loadDir(t, d) {
			if _, ok := m.obj.(*kustomization); !ok {
				c.objs = append(c.objs, m)
			}
		}
	}
	doc, err := os.ReadFile("../docs/deploy.md")
	if err != nil {
		t.Fatal(err)
	}
	c.secrets = docSecrets(string(doc))
	c.cli = mdagFlags(t)
	c.runner = runnerFlags(t)
	return c
}

// TestConventions: the manifests that kubectl apply -k applies (the base
// and monitoring) agree with each other, with the deployed profiles and
// with the CLIs (checks above).
func TestConventions(t *testing.T) {
	c := loadCluster(t, "base", "monitoring")
	if t.Failed() {
		return
	}
	for _, s := range c.check() {
		t.Error(s)
	}
	if len(c.workerDeployments()) != 3 {
		t.Errorf("%d worker Deployments, want 3 (P100, V100, CPU)", len(c.workerDeployments()))
	}
}
