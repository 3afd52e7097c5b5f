package deploy

import (
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
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
	cases := []struct {
		name string
		edit func(t *testing.T, c *cluster)
		want string
	}{
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
		{"Role without watch", func(t *testing.T, c *cluster) {
			each(c, func(_ manifest, r *rbacv1.Role) { r.Rules[0].Verbs = []string{"get", "list", "create", "delete"} })
		}, "no rule grants watch on pods"},
		{"RoleBinding to a missing ServiceAccount", func(t *testing.T, c *cluster) {
			each(c, func(_ manifest, rb *rbacv1.RoleBinding) { rb.Subjects[0].Name = "default" })
		}, "subject ServiceAccount mdag/default: no such ServiceAccount"},
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
	}
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
