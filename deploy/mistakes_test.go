package deploy

import (
	"slices"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// clone is a deep copy of the cluster's objects (the rest is shared, read
// only).
func (c *cluster) clone() *cluster {
	n := *c
	n.objs = nil
	for _, m := range c.objs {
		m.obj = m.obj.(runtime.Object).DeepCopyObject()
		n.objs = append(n.objs, m)
	}
	return &n
}

func (c *cluster) deployment(t *testing.T, name string) *appsv1.Deployment {
	t.Helper()
	var found *appsv1.Deployment
	each(c, func(_ manifest, d *appsv1.Deployment) {
		if d.Name == name {
			found = d
		}
	})
	if found == nil {
		t.Fatalf("no Deployment %s", name)
	}
	return found
}

func container(t *testing.T, d *appsv1.Deployment, name string) *corev1.Container {
	t.Helper()
	for i := range d.Spec.Template.Spec.Containers {
		if d.Spec.Template.Spec.Containers[i].Name == name {
			return &d.Spec.Template.Spec.Containers[i]
		}
	}
	t.Fatalf("%s: no container %s", d.Name, name)
	return nil
}

// setArg replaces the arg that starts with prefix by arg ("" drops it).
func setArg(t *testing.T, ct *corev1.Container, prefix, arg string) {
	t.Helper()
	for i, a := range ct.Args {
		if strings.HasPrefix(a, prefix) {
			if arg == "" {
				ct.Args = append(ct.Args[:i], ct.Args[i+1:]...)
			} else {
				ct.Args[i] = arg
			}
			return
		}
	}
	t.Fatalf("container %s: no arg %s...", ct.Name, prefix)
}

func volume(t *testing.T, d *appsv1.Deployment, name string) *corev1.Volume {
	t.Helper()
	for i := range d.Spec.Template.Spec.Volumes {
		if d.Spec.Template.Spec.Volumes[i].Name == name {
			return &d.Spec.Template.Spec.Volumes[i]
		}
	}
	t.Fatalf("%s: no volume %s", d.Name, name)
	return nil
}

// TestChecksCatchMistakes: each mistake, made on a copy of the real
// manifests, is reported by the checks, saying what. (The unchanged
// manifests pass: TestConventions.)
func TestChecksCatchMistakes(t *testing.T) {
	base := loadCluster(t, "base", "monitoring")
	if t.Failed() {
		return
	}
	cases := []mistake{
		{"worker selector without the pool", func(t *testing.T, c *cluster) {
			delete(c.deployment(t, "mdag-worker-p100").Spec.Selector.MatchLabels, labelPool)
		}, "also matches the provisioner's pods"},
		{"selector not matching the pods", func(t *testing.T, c *cluster) {
			c.deployment(t, "mdag-coordinator").Spec.Template.Labels[labelName] = "coordinator"
		}, "selector app.kubernetes.io/name=mdag-coordinator does not match its pod labels"},
		{"GPU type without its GPU", func(t *testing.T, c *cluster) {
			delete(container(t, c.deployment(t, "mdag-worker-v100"), "torch-runner").Resources.Limits, gpuResource)
		}, "worker-v100.yaml ... given 0 nvidia.com/gpu, want 1"},
		{"CPU type given a GPU", func(t *testing.T, c *cluster) {
			container(t, c.deployment(t, "mdag-worker-cpu"), "worker").Resources.Limits[gpuResource] = resource.MustParse("1")
		}, "given 1 nvidia.com/gpu, want 0"},
		{"type not in the profiles", func(t *testing.T, c *cluster) {
			c.deployment(t, "mdag-worker-p100").Labels[labelType] = "T4"
		}, `label mdag.io/worker-type="T4": not a worker type of the deployed profiles`},
		{"a type without a Deployment", func(t *testing.T, c *cluster) {
			c.deployment(t, "mdag-worker-p100").Labels[labelType] = "T4"
		}, "worker type P100 of the deployed profiles has no Deployment"},
		{"misnamed worker Deployment", func(t *testing.T, c *cluster) {
			c.deployment(t, "mdag-worker-p100").Name = "mdag-worker-gpu"
		}, "named mdag-worker-gpu, want mdag-worker-p100"},
		{"workers started by the Deployment", func(t *testing.T, c *cluster) {
			two := int32(2)
			c.deployment(t, "mdag-worker-cpu").Spec.Replicas = &two
		}, "replicas 2, want 0"},
		{"worker container renamed", func(t *testing.T, c *cluster) {
			container(t, c.deployment(t, "mdag-worker-cpu"), "worker").Name = "main"
		}, "no container named worker"},
		{"worker ID not the pod's name", func(t *testing.T, c *cluster) {
			ct := container(t, c.deployment(t, "mdag-worker-cpu"), "worker")
			ct.Env[0] = corev1.EnvVar{Name: "MDAG_WORKER_ID", Value: "w"}
		}, "env MDAG_WORKER_ID must come from the downward API's metadata.name"},
		{"undefined env reference", func(t *testing.T, c *cluster) {
			setArg(t, container(t, c.deployment(t, "mdag-worker-cpu"), "worker"), "--advertise=", "--advertise=$(POD_ADDR):7071")
		}, `refers to $(POD_ADDR), which is not in its env`},
		{"misspelt coordinator flag", func(t *testing.T, c *cluster) {
			setArg(t, container(t, c.deployment(t, "mdag-coordinator"), "coordinator"), "--grpc=", "--grcp=:7070")
		}, "flag provided but not defined: -grcp"},
		{"flag without its value", func(t *testing.T, c *cluster) {
			ct := container(t, c.deployment(t, "mdag-worker-cpu"), "worker")
			ct.Args = append(ct.Args, "--type")
		}, "flag needs an argument: -type"},
		{"stray argument", func(t *testing.T, c *cluster) {
			ct := container(t, c.deployment(t, "mdag-worker-cpu"), "worker")
			ct.Args = append(ct.Args, "CPU")
		}, "unexpected arguments: CPU"},
		{"worker type flag differs from the label", func(t *testing.T, c *cluster) {
			setArg(t, container(t, c.deployment(t, "mdag-worker-v100"), "worker"), "--type=", "--type=P100")
		}, `--type="P100", want "V100"`},
		{"worker dials another address", func(t *testing.T, c *cluster) {
			setArg(t, container(t, c.deployment(t, "mdag-worker-cpu"), "worker"), "--coordinator=", "--coordinator=coordinator:7070")
		}, `--coordinator="coordinator:7070", want "mdag-coordinator:7070"`},
		{"Service selecting nothing", func(t *testing.T, c *cluster) {
			each(c, func(_ manifest, s *corev1.Service) { s.Spec.Selector[labelName] = "mdag-coordinatr" })
		}, "selector app.kubernetes.io/name=mdag-coordinatr matches no pod template"},
		{"Service port not on the pods", func(t *testing.T, c *cluster) {
			each(c, func(_ manifest, s *corev1.Service) { s.Spec.Ports[0].TargetPort = intstr.FromString("grpcs") })
		}, "target port grpcs is not a container port"},
		{"volume of a missing ConfigMap", func(t *testing.T, c *cluster) {
			volume(t, c.deployment(t, "mdag-worker-p100"), "models").ConfigMap.Name = "mdag-modelz"
		}, "ConfigMap mdag-modelz is neither among the manifests nor made by docs/deploy.md"},
		{"volume of an undocumented Secret", func(t *testing.T, c *cluster) {
			volume(t, c.deployment(t, "mdag-worker-cpu"), "tls").Secret.SecretName = "mdag-worker-certs"
		}, "Secret mdag-worker-certs is neither"},
		{"volume of a missing PVC", func(t *testing.T, c *cluster) {
			volume(t, c.deployment(t, "mdag-coordinator"), "state").PersistentVolumeClaim.ClaimName = "state"
		}, "no PersistentVolumeClaim state"},
		{"app file not in the ConfigMap", func(t *testing.T, c *cluster) {
			setArg(t, container(t, c.deployment(t, "mdag-coordinator"), "coordinator"), "-f=", "-f=/etc/mdag/app/traffic.yaml")
		}, "has no traffic.yaml"},
		{"TLS directory not mounted", func(t *testing.T, c *cluster) {
			setArg(t, container(t, c.deployment(t, "mdag-worker-cpu"), "worker"), "--tls-dir=", "--tls-dir=/etc/tls")
		}, "--tls-dir /etc/tls: no volume is mounted at /etc/tls"},
		{"TLS Secret of another role", func(t *testing.T, c *cluster) {
			volume(t, c.deployment(t, "mdag-worker-cpu"), "tls").Secret.SecretName = "mdag-coordinator-tls"
		}, "has no worker.pem"},
		{"state not on the PVC", func(t *testing.T, c *cluster) {
			setArg(t, container(t, c.deployment(t, "mdag-coordinator"), "coordinator"), "--state=", "--state=/tmp/state")
		}, "--state /tmp/state: want a PersistentVolumeClaim mounted there"},
		{"coordinator rolling update", func(t *testing.T, c *cluster) {
			c.deployment(t, "mdag-coordinator").Spec.Strategy.Type = appsv1.RollingUpdateDeploymentStrategyType
		}, "want Recreate"},
		{"gRPC flag off the container port", func(t *testing.T, c *cluster) {
			setArg(t, container(t, c.deployment(t, "mdag-coordinator"), "coordinator"), "--grpc=", "--grpc=:7000")
		}, `--grpc=":7000", want ":7070"`},
		{"probe on the wrong path", func(t *testing.T, c *cluster) {
			container(t, c.deployment(t, "mdag-coordinator"), "coordinator").LivenessProbe.HTTPGet.Path = "/health"
		}, "liveness probe: want GET /healthz on port http"},
		{"ServiceMonitor on a missing port", func(t *testing.T, c *cluster) {
			each(c, func(_ manifest, sm *monitoringv1.ServiceMonitor) { sm.Spec.Endpoints[0].Port = "metric" })
		}, `endpoint port "metric" is not a named port of Service mdag-coordinator`},
		{"ServiceMonitor selecting nothing", func(t *testing.T, c *cluster) {
			each(c, func(_ manifest, sm *monitoringv1.ServiceMonitor) { sm.Spec.Selector.MatchLabels[labelName] = "mdag" })
		}, "matches no Service"},
		{"GPU model neither served nor emulated", func(t *testing.T, c *cluster) {
			setArg(t, container(t, c.deployment(t, "mdag-worker-p100"), "worker"), "--emulate=", "--emulate=detector")
		}, "GPU module detect's model ssd-inception is neither in the registry nor --emulate'd"},
		{"registry model the runner does not load", func(t *testing.T, c *cluster) {
			setArg(t, container(t, c.deployment(t, "mdag-worker-p100"), "torch-runner"), "--model=vgg-face=", "")
		}, "model vgg-face is not one the runner loads"},
		{"runner on another port", func(t *testing.T, c *cluster) {
			setArg(t, container(t, c.deployment(t, "mdag-worker-v100"), "torch-runner"), "--listen=", "--listen=127.0.0.1:8002")
		}, "endpoint 127.0.0.1:8001, but the runner listens on 127.0.0.1:8002"},
		{"runner input other than the registry's", func(t *testing.T, c *cluster) {
			setArg(t, container(t, c.deployment(t, "mdag-worker-v100"), "torch-runner"), "--input=", "--input=fp16-nchw")
		}, "input uint8-nhwc, the runner's --input fp16-nchw"},
		{"misspelt runner flag", func(t *testing.T, c *cluster) {
			setArg(t, container(t, c.deployment(t, "mdag-worker-v100"), "torch-runner"), "--max-batch=", "--max_batch=32")
		}, `arg "--max_batch=32": not a flag of runners/torch/runner.py`},
		{"GPU worker without the taint's toleration", func(t *testing.T, c *cluster) {
			c.deployment(t, "mdag-worker-p100").Spec.Template.Spec.Tolerations = nil
		}, "without a toleration of the nvidia.com/gpu:NoSchedule taint"},
		{"GPU worker on the other GPU's nodes", func(t *testing.T, c *cluster) {
			c.deployment(t, "mdag-worker-p100").Spec.Template.Spec.NodeSelector[gpuNodeLabel] = "v100"
		}, "nodeSelector mdag.io/gpu=v100, want p100"},
		{"worker CPUs other than the type's", func(t *testing.T, c *cluster) {
			container(t, c.deployment(t, "mdag-worker-p100"), "worker").Resources.Requests[corev1.ResourceCPU] = resource.MustParse("4")
		}, "requests cpu 4, want 6"},
		{"object in another namespace", func(t *testing.T, c *cluster) {
			c.deployment(t, "mdag-worker-cpu").Namespace = "default"
		}, `mdag-worker-cpu is in namespace "default", want "mdag"`},
		{"label value the API refuses", func(t *testing.T, c *cluster) {
			c.deployment(t, "mdag-worker-cpu").Spec.Template.Labels["mdag.io/instance"] = "gpu 1"
		}, `pod label value "gpu 1": a valid label must be`},
		{"port name over 15 characters", func(t *testing.T, c *cluster) {
			container(t, c.deployment(t, "mdag-coordinator"), "coordinator").Ports[2].Name = "prometheus-metrics"
		}, `container port name "prometheus-metrics": must be no more than 15 characters`},
		{"container name with capitals", func(t *testing.T, c *cluster) {
			container(t, c.deployment(t, "mdag-worker-v100"), "torch-runner").Name = "torchRunner"
		}, `container name "torchRunner": a lowercase RFC 1123 label`},
		{"an image of neither kind", func(t *testing.T, c *cluster) {
			container(t, c.deployment(t, "mdag-worker-cpu"), "worker").Image = "busybox"
		}, "image busybox: neither mdag nor mdag-torch-runner"},
		// RBAC in static mode (provisioned mode: TestProvisionedChecksCatchMistakes)
		{"Role in static mode", func(t *testing.T, c *cluster) {
			c.objs = append(c.objs, manifest{file: "base/rbac.yaml", index: 1, kind: "rbac.authorization.k8s.io/v1/Role",
				obj: &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: coordinatorName, Namespace: namespace}}})
		}, "Role mdag-coordinator in static mode"},
		{"RoleBinding in static mode", func(t *testing.T, c *cluster) {
			c.objs = append(c.objs, manifest{file: "base/rbac.yaml", index: 2, kind: "rbac.authorization.k8s.io/v1/RoleBinding",
				obj: &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "view", Namespace: namespace}, RoleRef: rbacv1.RoleRef{Kind: "ClusterRole", Name: "view"}}})
		}, "RoleBinding view in static mode"},
		{"CA key in the static coordinator", func(t *testing.T, c *cluster) {
			ps := &c.deployment(t, "mdag-coordinator").Spec.Template.Spec
			ps.Volumes = append(ps.Volumes, corev1.Volume{Name: "issuer", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "mdag-worker-issuer"}}})
		}, "Secret mdag-worker-issuer holds the CA's key (ca-key.pem) but the coordinator does not issue with it"},
		{"static coordinator with a token", func(t *testing.T, c *cluster) {
			c.deployment(t, "mdag-coordinator").Spec.Template.Spec.AutomountServiceAccountToken = ptr(true)
		}, "mdag-coordinator mounts a service account token in static mode"},
		{"static coordinator with its ServiceAccount's default token", func(t *testing.T, c *cluster) {
			c.deployment(t, "mdag-coordinator").Spec.Template.Spec.AutomountServiceAccountToken = nil
			each(c, func(_ manifest, sa *corev1.ServiceAccount) { sa.AutomountServiceAccountToken = nil })
		}, "mdag-coordinator mounts a service account token in static mode"},
		{"worker with a token", func(t *testing.T, c *cluster) {
			c.deployment(t, "mdag-worker-cpu").Spec.Template.Spec.AutomountServiceAccountToken = nil
		}, "Deployment mdag-worker-cpu mounts a service account token"},
		// Pod Security Admission
		{"namespace not enforcing", func(t *testing.T, c *cluster) {
			each(c, func(_ manifest, ns *corev1.Namespace) { delete(ns.Labels, psaPrefix+"enforce") })
		}, `label pod-security.kubernetes.io/enforce="", want "restricted"`},
		{"namespace enforcing baseline", func(t *testing.T, c *cluster) {
			each(c, func(_ manifest, ns *corev1.Namespace) { ns.Labels[psaPrefix+"enforce"] = "baseline" })
		}, `label pod-security.kubernetes.io/enforce="baseline", want "restricted"`},
		{"warn at a version that is none", func(t *testing.T, c *cluster) {
			each(c, func(_ manifest, ns *corev1.Namespace) { ns.Labels[psaPrefix+"warn-version"] = "1.30" })
		}, `pod-security.kubernetes.io/warn-version="1.30", want latest or v1.N`},
		{"GPU worker pod may run as root", func(t *testing.T, c *cluster) {
			c.deployment(t, "mdag-worker-p100").Spec.Template.Spec.SecurityContext.RunAsNonRoot = nil
		}, "mdag-worker-p100: pod security (restricted): container worker: runAsNonRoot not true"},
		{"coordinator as uid 0", func(t *testing.T, c *cluster) {
			c.deployment(t, "mdag-coordinator").Spec.Template.Spec.SecurityContext.RunAsUser = ptr(int64(0))
		}, "pod runAsUser 0"},
		{"torch runner may escalate", func(t *testing.T, c *cluster) {
			container(t, c.deployment(t, "mdag-worker-v100"), "torch-runner").SecurityContext.AllowPrivilegeEscalation = nil
		}, "mdag-worker-v100: pod security (restricted): container torch-runner: allowPrivilegeEscalation must be false"},
		{"torch runner keeps its capabilities", func(t *testing.T, c *cluster) {
			container(t, c.deployment(t, "mdag-worker-p100"), "torch-runner").SecurityContext.Capabilities.Drop = nil
		}, "container torch-runner: capabilities.drop must include ALL"},
		{"worker adds a capability", func(t *testing.T, c *cluster) {
			container(t, c.deployment(t, "mdag-worker-cpu"), "worker").SecurityContext.Capabilities.Add = []corev1.Capability{"NET_ADMIN"}
		}, "container worker: capabilities.add NET_ADMIN"},
		{"privileged torch runner", func(t *testing.T, c *cluster) {
			container(t, c.deployment(t, "mdag-worker-p100"), "torch-runner").SecurityContext.Privileged = ptr(true)
		}, "container torch-runner: privileged"},
		{"no seccomp profile", func(t *testing.T, c *cluster) {
			c.deployment(t, "mdag-worker-v100").Spec.Template.Spec.SecurityContext.SeccompProfile = nil
		}, "container torch-runner: no seccompProfile"},
		{"seccomp unconfined", func(t *testing.T, c *cluster) {
			c.deployment(t, "mdag-coordinator").Spec.Template.Spec.SecurityContext.SeccompProfile.Type = corev1.SeccompProfileTypeUnconfined
		}, "pod seccompProfile Unconfined: want RuntimeDefault"},
		{"hostPath volume", func(t *testing.T, c *cluster) {
			d := c.deployment(t, "mdag-worker-v100")
			d.Spec.Template.Spec.Volumes = append(d.Spec.Template.Spec.Volumes, corev1.Volume{Name: "dev",
				VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/dev"}}})
		}, "volume dev: hostPath"},
		{"host network", func(t *testing.T, c *cluster) {
			c.deployment(t, "mdag-worker-cpu").Spec.Template.Spec.HostNetwork = true
		}, "hostNetwork true"},
		{"host port", func(t *testing.T, c *cluster) {
			container(t, c.deployment(t, "mdag-worker-cpu"), "worker").Ports[0].HostPort = 7071
		}, "container worker: hostPort 7071"},
		// NetworkPolicies
		{"no default deny", func(t *testing.T, c *cluster) {
			c.objs = slices.DeleteFunc(c.objs, func(m manifest) bool {
				np, ok := m.obj.(*networkingv1.NetworkPolicy)
				return ok && np.Name == "mdag-default-deny-ingress"
			})
		}, "no default-deny ingress NetworkPolicy"},
		{"metrics open to every pod", func(t *testing.T, c *cluster) {
			policy(t, c, "mdag-coordinator").Spec.Ingress[1].From = nil
		}, "admit another pod of namespace mdag to mdag-coordinator port metrics (9090), which only monitoring may reach"},
		{"metrics from every namespace", func(t *testing.T, c *cluster) {
			policy(t, c, "mdag-coordinator").Spec.Ingress[1].From[0].NamespaceSelector = &metav1.LabelSelector{}
		}, "admit a pod labelled as a worker in namespace default to mdag-coordinator port metrics"},
		{"monitoring namespace misnamed", func(t *testing.T, c *cluster) {
			policy(t, c, "mdag-coordinator").Spec.Ingress[1].From[0].NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"] = "prometheus"
		}, "ServiceMonitor mdag-coordinator endpoint metrics: the NetworkPolicies refuse Prometheus in namespace monitoring"},
		{"gRPC closed to the workers", func(t *testing.T, c *cluster) {
			rule := &policy(t, c, "mdag-coordinator").Spec.Ingress[0]
			rule.From = rule.From[1:]
		}, "refuse worker pod of mdag-worker-cpu to mdag-coordinator port grpc (7070)"},
		{"gRPC closed to the sources", func(t *testing.T, c *cluster) {
			rule := &policy(t, c, "mdag-coordinator").Spec.Ingress[0]
			rule.From = rule.From[:1]
		}, "refuse mdag source pod to mdag-coordinator port grpc (7070)"},
		{"gRPC from worker-labelled pods of every namespace", func(t *testing.T, c *cluster) {
			policy(t, c, "mdag-coordinator").Spec.Ingress[0].From[0].NamespaceSelector = &metav1.LabelSelector{}
		}, "admit a pod labelled as a worker in namespace default to mdag-coordinator port grpc"},
		{"gRPC from outside", func(t *testing.T, c *cluster) {
			rule := &policy(t, c, "mdag-coordinator").Spec.Ingress[0]
			rule.From = append(rule.From, networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: "0.0.0.0/0"}})
		}, "admit a client outside the cluster to mdag-coordinator port grpc"},
		{"peer port open to the namespace", func(t *testing.T, c *cluster) {
			policy(t, c, "mdag-worker").Spec.Ingress[0].From[0].PodSelector = &metav1.LabelSelector{}
		}, "admit pod of mdag-coordinator to mdag-worker-cpu port peer (7071), which only workers may reach"},
		{"peer port closed to provisioned workers", func(t *testing.T, c *cluster) {
			policy(t, c, "mdag-worker").Spec.Ingress[0].From[0].PodSelector.MatchLabels[labelPool] = "static"
		}, "refuse provisioned worker pod of mdag-worker-p100 to mdag-worker-p100 port peer"},
		{"HTTP closed: the probes fail", func(t *testing.T, c *cluster) {
			np := policy(t, c, "mdag-coordinator")
			np.Spec.Ingress = np.Spec.Ingress[:2]
		}, "container coordinator: a probe on port http (8080) that the NetworkPolicies do not open"},
		{"policy on a port the pods lack", func(t *testing.T, c *cluster) {
			policy(t, c, "mdag-worker").Spec.Ingress[0].Ports[0].Port = ptr(intstr.FromString("peers"))
		}, "NetworkPolicy mdag-worker: port peers is not a container port of the pods it selects"},
		{"policy on a port number the pods lack", func(t *testing.T, c *cluster) {
			policy(t, c, "mdag-coordinator").Spec.Ingress[0].Ports[0].Port = ptr(intstr.FromInt32(7000))
		}, "NetworkPolicy mdag-coordinator: port 7000 is not a container port"},
		{"policy selecting no pod", func(t *testing.T, c *cluster) {
			policy(t, c, "mdag-worker").Spec.PodSelector.MatchLabels[labelName] = "mdag-workers"
		}, "NetworkPolicy mdag-worker: podSelector app.kubernetes.io/name=mdag-workers selects no pod template"},
		{"policy peer selecting nothing", func(t *testing.T, c *cluster) {
			policy(t, c, "mdag-coordinator").Spec.Ingress[0].From[1].PodSelector.MatchLabels[labelName] = "mdag-sources"
		}, "from podSelector app.kubernetes.io/name=mdag-sources matches no pod template and no mdag source"},
		{"a port nobody decided on", func(t *testing.T, c *cluster) {
			ct := container(t, c.deployment(t, "mdag-worker-p100"), "torch-runner")
			ct.Ports = append(ct.Ports, corev1.ContainerPort{Name: "infer", ContainerPort: 8001})
		}, "container torch-runner port infer (8001): the policy check does not know who may reach it"},
		// images
		{"image by latest", func(t *testing.T, c *cluster) {
			container(t, c.deployment(t, "mdag-worker-p100"), "torch-runner").Image = "registry.example.com/mdag-torch-runner:latest"
		}, "container torch-runner: image registry.example.com/mdag-torch-runner:latest: tagged latest"},
		{"untagged image", func(t *testing.T, c *cluster) {
			container(t, c.deployment(t, "mdag-coordinator"), "coordinator").Image = "registry.example.com/mdag"
		}, "container coordinator: image registry.example.com/mdag: no tag or digest"},
	}
	runMistakes(t, base, cases)
}

type mistake struct {
	name string
	edit func(t *testing.T, c *cluster)
	want string
}

// runMistakes makes each mistake on a copy of base and wants the checks to
// report it; base itself must stay clean.
func runMistakes(t *testing.T, base *cluster, cases []mistake) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := base.clone()
			tc.edit(t, c)
			got := c.check()
			// "A ... B" in want: both parts in one problem, in that order
			parts := strings.Split(tc.want, " ... ")
			for _, pr := range got {
				rest, ok := pr, true
				for _, part := range parts {
					i := strings.Index(rest, part)
					if i < 0 {
						ok = false
						break
					}
					rest = rest[i+len(part):]
				}
				if ok {
					return
				}
			}
			t.Errorf("no problem says %q; the checks said:\n%s", tc.want, strings.Join(got, "\n"))
		})
	}
	if len(base.check()) != 0 {
		t.Errorf("the edits reached the original manifests: %v", base.check())
	}
}

// TestProvisionedChecksCatchMistakes: the same for provisioned mode (the
// provisioned overlay applied to the base).
func TestProvisionedChecksCatchMistakes(t *testing.T) {
	base := loadProvisioned(t)
	if t.Failed() {
		return
	}
	runMistakes(t, base, []mistake{
		{"Role without watch", func(t *testing.T, c *cluster) {
			each(c, func(_ manifest, r *rbacv1.Role) { r.Rules[0].Verbs = []string{"get", "list", "create", "delete"} })
		}, "no rule grants watch on pods"},
		{"RoleBinding to a missing ServiceAccount", func(t *testing.T, c *cluster) {
			each(c, func(_ manifest, rb *rbacv1.RoleBinding) { rb.Subjects[0].Name = "default" })
		}, "subject ServiceAccount mdag/default: no such ServiceAccount"},
		{"provisioner without its Role", func(t *testing.T, c *cluster) {
			c.objs = slices.DeleteFunc(c.objs, func(m manifest) bool { _, ok := m.obj.(*rbacv1.Role); return ok })
		}, "--provisioner kubernetes but no Role mdag-coordinator"},
		{"provisioner without its RoleBinding", func(t *testing.T, c *cluster) {
			c.objs = slices.DeleteFunc(c.objs, func(m manifest) bool { _, ok := m.obj.(*rbacv1.RoleBinding); return ok })
		}, "--provisioner kubernetes but no RoleBinding of Role mdag-coordinator to ServiceAccount mdag/mdag-coordinator"},
		{"provisioner without a token", func(t *testing.T, c *cluster) {
			c.deployment(t, "mdag-coordinator").Spec.Template.Spec.AutomountServiceAccountToken = nil
		}, "--provisioner kubernetes without a service account token in the pod"},
		{"workers given the token too", func(t *testing.T, c *cluster) {
			c.deployment(t, "mdag-worker-p100").Spec.Template.Spec.AutomountServiceAccountToken = ptr(true)
		}, "Deployment mdag-worker-p100 mounts a service account token"},
		{"Role without Secrets for the per-pod certificates", func(t *testing.T, c *cluster) {
			each(c, func(_ manifest, r *rbacv1.Role) {
				r.Rules = slices.DeleteFunc(r.Rules, func(rule rbacv1.PolicyRule) bool { return slices.Contains(rule.Resources, "secrets") })
			})
		}, "no rule grants create on secrets"},
		{"Role that cannot renew", func(t *testing.T, c *cluster) {
			each(c, func(_ manifest, r *rbacv1.Role) {
				for i := range r.Rules {
					r.Rules[i].Verbs = slices.DeleteFunc(r.Rules[i].Verbs, func(v string) bool { return v == "update" })
				}
			})
		}, "no rule grants update on secrets"},
		{"issuer not mounted", func(t *testing.T, c *cluster) {
			setArg(t, container(t, c.deployment(t, "mdag-coordinator"), "coordinator"), "--provisioner-issuer=", "--provisioner-issuer=/etc/issuer")
		}, "--provisioner-issuer /etc/issuer: no volume is mounted at /etc/issuer"},
		{"issuer Secret without the key", func(t *testing.T, c *cluster) {
			volume(t, c.deployment(t, "mdag-coordinator"), "issuer").Secret.SecretName = "mdag-coordinator-tls"
		}, "--provisioner-issuer /etc/mdag/issuer: the volume issuer mounted at /etc/mdag/issuer has no ca-key.pem"},
		{"CA key mounted in a worker", func(t *testing.T, c *cluster) {
			volume(t, c.deployment(t, "mdag-worker-cpu"), "tls").Secret.SecretName = "mdag-worker-issuer"
		}, "Deployment mdag-worker-cpu volume tls: Secret mdag-worker-issuer holds the CA's key (ca-key.pem): only the provisioning coordinator may mount it"},
		{"CA key mounted without the issuer flag", func(t *testing.T, c *cluster) {
			ct := container(t, c.deployment(t, "mdag-coordinator"), "coordinator")
			ct.Args = slices.DeleteFunc(ct.Args, func(a string) bool { return strings.HasPrefix(a, "--provisioner-issuer=") })
		}, "Secret mdag-worker-issuer holds the CA's key (ca-key.pem) but the coordinator does not issue with it"},
		{"shared worker certificate beside the issuer", func(t *testing.T, c *cluster) {
			ct := container(t, c.deployment(t, "mdag-coordinator"), "coordinator")
			ct.Args = append(ct.Args, "--shared-cert=worker/worker=*")
		}, "--shared-cert=worker/worker=* beside --provisioner-issuer"},
	})
}

func ptr[T any](v T) *T { return &v }

func policy(t *testing.T, c *cluster, name string) *networkingv1.NetworkPolicy {
	t.Helper()
	var found *networkingv1.NetworkPolicy
	each(c, func(_ manifest, np *networkingv1.NetworkPolicy) {
		if np.Name == name {
			found = np
		}
	})
	if found == nil {
		t.Fatalf("no NetworkPolicy %s", name)
	}
	return found
}

// TestDocSecrets: the Secrets docs/deploy.md's commands make, with their
// keys, across continued lines and mentions that repeat a name.
func TestDocSecrets(t *testing.T) {
	doc := "```\nkubectl -n mdag create secret generic a-tls --from-file=ca.pem=certs/ca.pem \\\n  --from-file=certs/worker.pem\n" +
		"kubectl create secret generic tokens --from-file=tokens.yaml=x/t.yaml --dry-run=client\n" +
		"kubectl -n mdag create secret generic a-tls --dry-run=client -o yaml | kubectl apply -f -\n```\n"
	got := docSecrets(doc)
	want := map[string]string{"a-tls": "ca.pem worker.pem", "tokens": "tokens.yaml"}
	if len(got) != len(want) {
		t.Fatalf("%v, want %v", got, want)
	}
	for k, v := range want {
		if strings.Join(got[k], " ") != v {
			t.Errorf("%s: keys %v, want %s", k, got[k], v)
		}
	}
}
