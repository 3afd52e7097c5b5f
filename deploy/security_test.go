package deploy

import (
	"encoding/json"
	"fmt"
	"net"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// The guards of docs/deploy.md ("Security"): who may call the API server,
// which pods the namespace admits, who may connect to which port, and which
// images run.
const (
	sourceApp           = "mdag-source" // app.kubernetes.io/name of mdag source pods (docs/deploy.md)
	monitoringNamespace = "monitoring"  // where Prometheus runs (docs/deploy.md)
	psaPrefix           = "pod-security.kubernetes.io/"
)

// coordinator is the coordinator's Deployment (nil when there is none:
// checkCoordinator says so).
func (c *cluster) coordinator() (*appsv1.Deployment, manifest) {
	var d *appsv1.Deployment
	var m manifest
	each(c, func(mm manifest, dd *appsv1.Deployment) {
		if dd.Name == coordinatorName {
			d, m = dd, mm
		}
	})
	return d, m
}

// flagValue is the last value args give flag name (-name=v, --name=v,
// -name v or --name v), and whether they give it at all.
func flagValue(args []string, name string) (string, bool) {
	v, found := "", false
	for i, a := range args {
		f := strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-")
		if f == a {
			continue
		}
		switch {
		case strings.HasPrefix(f, name+"="):
			v, found = strings.TrimPrefix(f, name+"="), true
		case f == name && i+1 < len(args):
			v, found = args[i+1], true
		}
	}
	return v, found
}

// provisioned says whether the coordinator runs --provisioner kubernetes
// (provisioned mode), the only mode that calls the API server.
func provisioned(d *appsv1.Deployment) bool {
	for _, ct := range d.Spec.Template.Spec.Containers {
		if v, _ := flagValue(ct.Args, "provisioner"); v == "kubernetes" {
			return true
		}
	}
	return false
}

// mountsToken says whether a pod gets its service account's token: the
// pod's automountServiceAccountToken, else its ServiceAccount's, else yes.
func (c *cluster) mountsToken(ns string, ps corev1.PodSpec) bool {
	if ps.AutomountServiceAccountToken != nil {
		return *ps.AutomountServiceAccountToken
	}
	sa := ps.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	mounts := true
	each(c, func(_ manifest, s *corev1.ServiceAccount) {
		if s.Namespace == ns && s.Name == sa && s.AutomountServiceAccountToken != nil {
			mounts = *s.AutomountServiceAccountToken
		}
	})
	return mounts
}

// checkRBAC: API access only where the provisioner runs. Static mode (no
// --provisioner kubernetes) has no Role or RoleBinding and mounts no token
// in any pod; provisioned mode mounts the token in the coordinator's pod,
// whose ServiceAccount is bound to a Role granting what the provisioner does.
// Every RoleBinding binds an existing Role to an existing ServiceAccount.
func (c *cluster) checkRBAC(p *problems) {
	roles := map[string]*rbacv1.Role{}
	each(c, func(_ manifest, r *rbacv1.Role) { roles[r.Namespace+"/"+r.Name] = r })
	bound := false
	each(c, func(m manifest, rb *rbacv1.RoleBinding) {
		if rb.RoleRef.Kind != "Role" || roles[rb.Namespace+"/"+rb.RoleRef.Name] == nil {
			p.add(m, "roleRef %s %s: no such Role", rb.RoleRef.Kind, rb.RoleRef.Name)
		}
		for _, s := range rb.Subjects {
			if s.Kind != rbacv1.ServiceAccountKind || !c.hasServiceAccount(s.Namespace, s.Name) {
				p.add(m, "subject %s %s/%s: no such ServiceAccount", s.Kind, s.Namespace, s.Name)
			}
			if s.Kind == rbacv1.ServiceAccountKind && s.Namespace == namespace && s.Name == coordinatorName &&
				rb.RoleRef.Kind == "Role" && rb.RoleRef.Name == coordinatorName {
				bound = true
			}
		}
	})
	d, cm := c.coordinator()
	if d == nil {
		return // said by checkCoordinator
	}
	for _, t := range c.podTemplates() {
		if t.d != d && c.mountsToken(t.d.Namespace, t.d.Spec.Template.Spec) {
			p.add(t.m, "Deployment %s mounts a service account token: only the provisioning coordinator calls the API server (automountServiceAccountToken: false)", t.d.Name)
		}
	}
	if !provisioned(d) {
		each(c, func(m manifest, r *rbacv1.Role) {
			p.add(m, "Role %s in static mode (the coordinator has no --provisioner kubernetes and calls no API): grant it in deploy/kubernetes/provisioned only", r.Name)
		})
		each(c, func(m manifest, rb *rbacv1.RoleBinding) {
			p.add(m, "RoleBinding %s in static mode (the coordinator has no --provisioner kubernetes and calls no API): bind it in deploy/kubernetes/provisioned only", rb.Name)
		})
		if c.mountsToken(d.Namespace, d.Spec.Template.Spec) {
			p.add(cm, "Deployment %s mounts a service account token in static mode: automountServiceAccountToken: false (a compromised coordinator would hold API credentials it never uses)", d.Name)
		}
		return
	}
	if !c.mountsToken(d.Namespace, d.Spec.Template.Spec) {
		p.add(cm, "--provisioner kubernetes without a service account token in the pod: the in-cluster client cannot authenticate (automountServiceAccountToken: true on the pod)")
	}
	r := roles[namespace+"/"+coordinatorName]
	if r == nil {
		*p = append(*p, "--provisioner kubernetes but no Role "+coordinatorName+": the coordinator may not create worker pods")
		return
	}
	if !bound {
		*p = append(*p, fmt.Sprintf("--provisioner kubernetes but no RoleBinding of Role %s to ServiceAccount %s/%s", coordinatorName, namespace, coordinatorName))
	}
	need := []struct{ group, resource, verb string }{
		{"", "pods", "get"}, {"", "pods", "list"}, {"", "pods", "watch"}, {"", "pods", "create"}, {"", "pods", "delete"},
		{"apps", "deployments", "get"}, {"apps", "deployments", "list"},
	}
	if _, ok := flagValue(d.Spec.Template.Spec.Containers[0].Args, "provisioner-issuer"); ok {
		// each pod's certificate Secret: made, renewed, deleted with the
		// pod, and a previous coordinator's found and deleted at start
		need = append(need, []struct{ group, resource, verb string }{
			{"", "secrets", "get"}, {"", "secrets", "list"}, {"", "secrets", "create"}, {"", "secrets", "update"}, {"", "secrets", "delete"},
		}...)
	}
	for _, n := range need {
		ok := slices.ContainsFunc(r.Rules, func(rule rbacv1.PolicyRule) bool {
			return slices.Contains(rule.APIGroups, n.group) && slices.Contains(rule.Resources, n.resource) && slices.Contains(rule.Verbs, n.verb)
		})
		if !ok {
			*p = append(*p, fmt.Sprintf("Role %s: no rule grants %s on %s (group %q)", coordinatorName, n.verb, n.resource, n.group))
		}
	}
}

// checkIssuer: a CA's key (a Secret docs/deploy.md makes with ca-key.pem)
// is mounted only in the provisioning coordinator's pod, which gives it as
// --provisioner-issuer (checkMdagArgs: mounted there, with ca.pem and
// ca-key.pem) to issue each worker pod a certificate of its own; with
// that, no worker certificate is declared shared with every worker ID
// (it would let its holders claim the provisioned pods' IDs again).
func (c *cluster) checkIssuer(p *problems) {
	d, cm := c.coordinator()
	issuer := false
	if d != nil && len(d.Spec.Template.Spec.Containers) > 0 {
		_, issuer = flagValue(d.Spec.Template.Spec.Containers[0].Args, "provisioner-issuer")
	}
	for _, t := range c.podTemplates() {
		for _, v := range t.d.Spec.Template.Spec.Volumes {
			if v.Secret == nil {
				continue
			}
			if ks, _ := c.keys(t.d.Namespace, v); !slices.Contains(ks, "ca-key.pem") {
				continue
			}
			switch {
			case t.d != d:
				p.add(t.m, "Deployment %s volume %s: Secret %s holds the CA's key (ca-key.pem): only the provisioning coordinator may mount it (--provisioner-issuer)", t.d.Name, v.Name, v.Secret.SecretName)
			case !issuer || !provisioned(d):
				p.add(t.m, "Deployment %s volume %s: Secret %s holds the CA's key (ca-key.pem) but the coordinator does not issue with it (--provisioner kubernetes --provisioner-issuer): keep the key off the cluster", t.d.Name, v.Name, v.Secret.SecretName)
			}
		}
	}
	if !issuer {
		return
	}
	if !provisioned(d) {
		p.add(cm, "--provisioner-issuer without --provisioner kubernetes")
	}
	args := d.Spec.Template.Spec.Containers[0].Args
	for i, a := range args {
		f := strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-")
		v, ok := strings.CutPrefix(f, "shared-cert=")
		if !ok && f == "shared-cert" && f != a && i+1 < len(args) {
			v, ok = args[i+1], true
		}
		if !ok || !strings.HasPrefix(v, "worker/") {
			continue
		}
		_, prefixes, _ := strings.Cut(v, "=")
		if slices.Contains(strings.Split(prefixes, ","), "*") {
			p.add(cm, "--shared-cert=%s beside --provisioner-issuer: that certificate's holders may claim any worker ID, the provisioned pods' included, which their own certificates bind (drop it)", v)
		}
	}
}

// checkPodSecurity: the namespace enforces Pod Security Admission's
// restricted profile (and audits and warns with it), and every pod template
// satisfies that profile, so no pod, the provisioner's copies included, is
// refused at admission.
func (c *cluster) checkPodSecurity(p *problems) {
	each(c, func(m manifest, ns *corev1.Namespace) {
		if ns.Name != namespace {
			return
		}
		for _, mode := range []string{"enforce", "audit", "warn"} {
			if v := ns.Labels[psaPrefix+mode]; v != "restricted" {
				p.add(m, "Namespace %s: label %s%s=%q, want \"restricted\"", ns.Name, psaPrefix, mode, v)
			}
			v, ok := ns.Labels[psaPrefix+mode+"-version"]
			if ok && v != "latest" && !regexp.MustCompile(`^v1\.[0-9]+$`).MatchString(v) {
				p.add(m, "Namespace %s: label %s%s-version=%q, want latest or v1.N", ns.Name, psaPrefix, mode, v)
			}
		}
	})
	for _, t := range c.podTemplates() {
		for _, s := range restrictedViolations(t.d.Spec.Template.Spec) {
			p.add(t.m, "Deployment %s: pod security (restricted): %s", t.d.Name, s)
		}
	}
}

// The restricted profile's allowed values (Kubernetes' Pod Security
// Standards).
var (
	restrictedVolumes = []string{"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret"}
	safeSysctls       = []string{"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start", "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports", "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes"}
	seLinuxTypes      = []string{"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
)

// restrictedViolations lists what of a pod spec the restricted profile
// refuses (baseline's controls included), one line each.
func restrictedViolations(ps corev1.PodSpec) []string {
	var v []string
	add := func(format string, args ...any) { v = append(v, fmt.Sprintf(format, args...)) }
	if ps.HostNetwork || ps.HostPID || ps.HostIPC {
		add("hostNetwork %v, hostPID %v, hostIPC %v: want none", ps.HostNetwork, ps.HostPID, ps.HostIPC)
	}
	for _, vol := range ps.Volumes {
		if vol.HostPath != nil {
			add("volume %s: hostPath", vol.Name)
			continue
		}
		if k := volumeKind(vol); !slices.Contains(restrictedVolumes, k) {
			add("volume %s: type %s, want one of %v", vol.Name, k, restrictedVolumes)
		}
	}
	psc := ps.SecurityContext
	if psc == nil {
		psc = &corev1.PodSecurityContext{}
	}
	for _, s := range psc.Sysctls {
		if !slices.Contains(safeSysctls, s.Name) {
			add("sysctl %s: not a safe sysctl", s.Name)
		}
	}
	if psc.RunAsUser != nil && *psc.RunAsUser == 0 {
		add("pod runAsUser 0")
	}
	seLinux := func(where string, o *corev1.SELinuxOptions) {
		if o != nil && (!slices.Contains(seLinuxTypes, o.Type) || o.User != "" || o.Role != "") {
			add("%s seLinuxOptions %+v: a type other than container_t's, or a user or role", where, *o)
		}
	}
	seLinux("pod", psc.SELinuxOptions)
	unconfined := func(where string, sp *corev1.SeccompProfile, ap *corev1.AppArmorProfile) {
		if sp != nil && sp.Type != corev1.SeccompProfileTypeRuntimeDefault && sp.Type != corev1.SeccompProfileTypeLocalhost {
			add("%s seccompProfile %s: want RuntimeDefault or Localhost", where, sp.Type)
		}
		if ap != nil && ap.Type == corev1.AppArmorProfileTypeUnconfined {
			add("%s appArmorProfile Unconfined", where)
		}
	}
	unconfined("pod", psc.SeccompProfile, psc.AppArmorProfile)
	var cts []corev1.Container
	cts = append(cts, ps.InitContainers...)
	cts = append(cts, ps.Containers...)
	for _, e := range ps.EphemeralContainers {
		cts = append(cts, corev1.Container(e.EphemeralContainerCommon))
	}
	for _, ct := range cts {
		where := "container " + ct.Name
		sc := ct.SecurityContext
		if sc == nil {
			sc = &corev1.SecurityContext{}
		}
		if sc.Privileged != nil && *sc.Privileged {
			add("%s: privileged", where)
		}
		if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			add("%s: allowPrivilegeEscalation must be false", where)
		}
		if sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") {
			add("%s: capabilities.drop must include ALL", where)
		}
		if sc.Capabilities != nil {
			for _, cp := range sc.Capabilities.Add {
				if cp != "NET_BIND_SERVICE" {
					add("%s: capabilities.add %s (only NET_BIND_SERVICE is allowed)", where, cp)
				}
			}
		}
		switch {
		case sc.RunAsNonRoot != nil && !*sc.RunAsNonRoot:
			add("%s: runAsNonRoot false", where)
		case sc.RunAsNonRoot == nil && (psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot):
			add("%s: runAsNonRoot not true (neither on it nor on the pod)", where)
		}
		if sc.RunAsUser != nil && *sc.RunAsUser == 0 {
			add("%s: runAsUser 0", where)
		}
		if sc.SeccompProfile == nil && psc.SeccompProfile == nil {
			add("%s: no seccompProfile (neither on it nor on the pod): want RuntimeDefault", where)
		}
		unconfined(where, sc.SeccompProfile, sc.AppArmorProfile)
		seLinux(where, sc.SELinuxOptions)
		if sc.ProcMount != nil && *sc.ProcMount != corev1.DefaultProcMount {
			add("%s: procMount %s", where, *sc.ProcMount)
		}
		for _, port := range ct.Ports {
			if port.HostPort != 0 {
				add("%s: hostPort %d", where, port.HostPort)
			}
		}
	}
	return v
}

// volumeKind is the JSON name of a volume's source ("configMap", ...).
func volumeKind(vol corev1.Volume) string {
	j, err := json.Marshal(vol.VolumeSource)
	if err != nil {
		return "unknown"
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(j, &m); err != nil || len(m) != 1 {
		return "unknown"
	}
	for k := range m {
		return k
	}
	return "unknown"
}

// checkImages: every image is pinned to a tag other than latest, or to a
// digest. In the unrendered manifests the bare names mdag and
// mdag-torch-runner stand for what the kustomization's images: entries make
// of them (TestKustomizations checks those entries).
func (c *cluster) checkImages(p *problems) {
	for _, t := range c.podTemplates() {
		ps := t.d.Spec.Template.Spec
		for _, ct := range append(slices.Clone(ps.InitContainers), ps.Containers...) {
			if !c.rendered && (ct.Image == mdagImage || ct.Image == runnerImage) {
				continue
			}
			if err := imagePinned(ct.Image); err != nil {
				p.add(t.m, "Deployment %s container %s: %v", t.d.Name, ct.Name, err)
			}
		}
	}
}

// imagePinned says why an image reference does not name one build: no tag
// or digest (Kubernetes pulls latest), or the tag latest.
func imagePinned(image string) error {
	if _, digest, ok := strings.Cut(image, "@"); ok {
		if !strings.HasPrefix(digest, "sha256:") {
			return fmt.Errorf("image %s: digest %q, want sha256:...", image, digest)
		}
		return nil
	}
	_, tag, ok := strings.Cut(image[strings.LastIndex(image, "/")+1:], ":")
	switch {
	case !ok || tag == "":
		return fmt.Errorf("image %s: no tag or digest (Kubernetes pulls latest): pin your build's tag or digest", image)
	case tag == "latest":
		return fmt.Errorf("image %s: tagged latest (which build runs changes under the pods): pin your build's tag or digest", image)
	}
	return nil
}

// kustomizationImageProblems: each images: entry sets a tag other than
// latest, or a digest.
func kustomizationImageProblems(k *kustomization) []string {
	var out []string
	for _, im := range k.Images {
		switch {
		case im.Digest != "":
			if !strings.HasPrefix(im.Digest, "sha256:") {
				out = append(out, fmt.Sprintf("images: %s: digest %q, want sha256:...", im.Name, im.Digest))
			}
		case im.NewTag == "":
			out = append(out, fmt.Sprintf("images: %s: no newTag or digest (Kubernetes would pull latest): set your build's tag or digest", im.Name))
		case im.NewTag == "latest":
			out = append(out, fmt.Sprintf("images: %s: newTag latest: set your build's tag or digest", im.Name))
		}
	}
	return out
}

// peer is a source of connections the NetworkPolicies are checked against:
// a pod (namespace, its labels) or an address outside every pod.
type peer struct {
	name     string
	ns       string // "" for an address outside the pods
	nsLabels map[string]string
	labels   map[string]string
	ip       string // for an outside address
}

// who may reach each named container port of a pod (by its
// app.kubernetes.io/name): workers, sources, monitoring, everyone.
var reach = map[string]map[string][]string{
	coordinatorName: {"grpc": {"workers", "sources"}, "http": {"everyone"}, "metrics": {"monitoring"}},
	workerApp:       {"peer": {"workers"}, "ingest": {"sources"}},
}

// peers are the pods and addresses the policies are checked against, each
// with the groups of reach it belongs to: every worker template (and its
// provisioned copy), the coordinator, an mdag source, Prometheus in the
// monitoring namespace, strangers in the namespace and beside it (one
// labelled as a worker), a node (kubelet probes) and an outside client.
func (c *cluster) peers() map[*peer][]string {
	nsLabels := map[string]string{"kubernetes.io/metadata.name": namespace}
	each(c, func(_ manifest, ns *corev1.Namespace) {
		if ns.Name == namespace {
			for k, v := range ns.Labels {
				nsLabels[k] = v
			}
		}
	})
	out := map[*peer][]string{}
	for _, t := range c.podTemplates() {
		l := t.d.Spec.Template.Labels
		switch l[labelName] {
		case workerApp:
			out[&peer{name: "worker pod of " + t.d.Name, ns: namespace, nsLabels: nsLabels, labels: l}] = []string{"workers"}
			prov := labels.Merge(l, labels.Set{labelPool: "provisioned", "mdag.io/instance": "i-1"})
			out[&peer{name: "provisioned worker pod of " + t.d.Name, ns: namespace, nsLabels: nsLabels, labels: prov}] = []string{"workers"}
		default:
			out[&peer{name: "pod of " + t.d.Name, ns: namespace, nsLabels: nsLabels, labels: l}] = nil
		}
	}
	out[&peer{name: "mdag source pod", ns: namespace, nsLabels: nsLabels, labels: map[string]string{labelName: sourceApp}}] = []string{"sources"}
	out[&peer{name: "Prometheus in namespace " + monitoringNamespace, ns: monitoringNamespace,
		nsLabels: map[string]string{"kubernetes.io/metadata.name": monitoringNamespace}, labels: map[string]string{labelName: "prometheus"}}] = []string{"monitoring"}
	out[&peer{name: "another pod of namespace " + namespace, ns: namespace, nsLabels: nsLabels, labels: map[string]string{labelName: "debug"}}] = nil
	out[&peer{name: "a pod labelled as a worker in namespace default", ns: "default",
		nsLabels: map[string]string{"kubernetes.io/metadata.name": "default"}, labels: map[string]string{labelName: workerApp}}] = nil
	out[&peer{name: "a node (the kubelet's probes)", ip: "10.128.0.2"}] = nil
	out[&peer{name: "a client outside the cluster", ip: "203.0.113.7"}] = nil
	return out
}

// checkNetworkPolicies: a default deny of ingress; every other policy
// selects pod templates that have the ports it names; its pod peers are pods
// of the manifests or mdag sources; and who may connect to each container
// port is what reach says, no more and no less, probes' ports from anywhere
// and ServiceMonitors' ports from the monitoring namespace.
func (c *cluster) checkNetworkPolicies(p *problems) {
	deny := false
	each(c, func(m manifest, np *networkingv1.NetworkPolicy) {
		sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
		if err != nil {
			p.add(m, "NetworkPolicy %s: podSelector: %v", np.Name, err)
			return
		}
		if sel.Empty() {
			deny = deny || (ingressPolicy(np) && len(np.Spec.Ingress) == 0)
			return
		}
		var pods []corev1.PodSpec
		for _, t := range c.podTemplates() {
			if t.d.Namespace == np.Namespace && sel.Matches(labels.Set(t.d.Spec.Template.Labels)) {
				pods = append(pods, t.d.Spec.Template.Spec)
			}
		}
		if len(pods) == 0 {
			p.add(m, "NetworkPolicy %s: podSelector %s selects no pod template", np.Name, sel)
		}
		for _, rule := range np.Spec.Ingress {
			for _, pp := range rule.Ports {
				if pp.Port == nil {
					continue
				}
				for _, ps := range pods {
					if !podHasPolicyPort(ps, pp) {
						p.add(m, "NetworkPolicy %s: port %s is not a container port of the pods it selects", np.Name, pp.Port.String())
					}
				}
			}
			for _, from := range rule.From {
				if from.PodSelector == nil || from.NamespaceSelector != nil {
					continue
				}
				fs, err := metav1.LabelSelectorAsSelector(from.PodSelector)
				if err != nil {
					p.add(m, "NetworkPolicy %s: from podSelector: %v", np.Name, err)
					continue
				}
				known := fs.Matches(labels.Set{labelName: sourceApp})
				for _, t := range c.podTemplates() {
					known = known || (t.d.Namespace == np.Namespace && fs.Matches(labels.Set(t.d.Spec.Template.Labels)))
				}
				if !known {
					p.add(m, "NetworkPolicy %s: from podSelector %s matches no pod template and no mdag source (%s=%s)", np.Name, fs, labelName, sourceApp)
				}
			}
		}
	})
	if !deny {
		*p = append(*p, "no default-deny ingress NetworkPolicy (podSelector {}, policyTypes [Ingress], no rules): a pod no policy selects takes connections from anywhere")
	}
	peers := c.peers()
	order := make([]*peer, 0, len(peers))
	for pe := range peers {
		order = append(order, pe)
	}
	slices.SortFunc(order, func(a, b *peer) int { return strings.Compare(a.name, b.name) })
	for _, t := range c.podTemplates() {
		app := t.d.Spec.Template.Labels[labelName]
		for _, ct := range t.d.Spec.Template.Spec.Containers {
			for _, cp := range ct.Ports {
				who, ok := reach[app][cp.Name]
				if !ok {
					p.add(t.m, "container %s port %s (%d): the policy check does not know who may reach it (add it to reach)", ct.Name, cp.Name, cp.ContainerPort)
					continue
				}
				for _, pe := range order {
					want := slices.Contains(who, "everyone") || slices.ContainsFunc(peers[pe], func(g string) bool { return slices.Contains(who, g) })
					got := c.admits(t.d.Namespace, t.d.Spec.Template.Labels, cp, pe)
					switch {
					case got && !want:
						p.add(t.m, "the NetworkPolicies admit %s to %s port %s (%d), which only %s may reach", pe.name, t.d.Name, cp.Name, cp.ContainerPort, strings.Join(who, " and "))
					case !got && want:
						p.add(t.m, "the NetworkPolicies refuse %s to %s port %s (%d), which %s must reach", pe.name, t.d.Name, cp.Name, cp.ContainerPort, strings.Join(who, " and "))
					}
				}
			}
			node := &peer{name: "a node", ip: "10.128.0.2"}
			for _, pr := range []*corev1.Probe{ct.ReadinessProbe, ct.LivenessProbe, ct.StartupProbe} {
				if cp, ok := probePort(ct, pr); ok && !c.admits(t.d.Namespace, t.d.Spec.Template.Labels, cp, node) {
					p.add(t.m, "container %s: a probe on port %s (%d) that the NetworkPolicies do not open to every address: the kubelet probes from the node", ct.Name, cp.Name, cp.ContainerPort)
				}
			}
		}
	}
	c.checkScrapeAllowed(p)
}

// checkScrapeAllowed: each ServiceMonitor's endpoints reach the pods behind
// its Services from Prometheus in the monitoring namespace.
func (c *cluster) checkScrapeAllowed(p *problems) {
	prom := &peer{name: "Prometheus", ns: monitoringNamespace,
		nsLabels: map[string]string{"kubernetes.io/metadata.name": monitoringNamespace}, labels: map[string]string{labelName: "prometheus"}}
	each(c, func(m manifest, sm *monitoringv1.ServiceMonitor) {
		sel, err := metav1.LabelSelectorAsSelector(&sm.Spec.Selector)
		if err != nil {
			return // said by checkServiceMonitors
		}
		each(c, func(_ manifest, s *corev1.Service) {
			if !sel.Matches(labels.Set(s.Labels)) {
				return
			}
			for _, e := range sm.Spec.Endpoints {
				for _, sp := range s.Spec.Ports {
					if sp.Name != e.Port {
						continue
					}
					for _, t := range c.podTemplates() {
						if t.d.Namespace != s.Namespace || !labels.SelectorFromSet(s.Spec.Selector).Matches(labels.Set(t.d.Spec.Template.Labels)) {
							continue
						}
						for _, ct := range t.d.Spec.Template.Spec.Containers {
							for _, cp := range ct.Ports {
								if (sp.TargetPort.String() == cp.Name || int32(sp.TargetPort.IntValue()) == cp.ContainerPort) &&
									!c.admits(t.d.Namespace, t.d.Spec.Template.Labels, cp, prom) {
									p.add(m, "ServiceMonitor %s endpoint %s: the NetworkPolicies refuse Prometheus in namespace %s on %s port %d: it could not scrape",
										sm.Name, e.Port, monitoringNamespace, t.d.Name, cp.ContainerPort)
								}
							}
						}
					}
				}
			}
		})
	})
}

// probePort is the container port a probe connects to.
func probePort(ct corev1.Container, pr *corev1.Probe) (corev1.ContainerPort, bool) {
	if pr == nil {
		return corev1.ContainerPort{}, false
	}
	var port string
	switch {
	case pr.HTTPGet != nil:
		port = pr.HTTPGet.Port.String()
	case pr.TCPSocket != nil:
		port = pr.TCPSocket.Port.String()
	case pr.GRPC != nil:
		port = strconv.Itoa(int(pr.GRPC.Port))
	default:
		return corev1.ContainerPort{}, false
	}
	for _, cp := range ct.Ports {
		if cp.Name == port || strconv.Itoa(int(cp.ContainerPort)) == port {
			return cp, true
		}
	}
	n, err := strconv.Atoi(port)
	return corev1.ContainerPort{ContainerPort: int32(n)}, err == nil
}

func ingressPolicy(np *networkingv1.NetworkPolicy) bool {
	return len(np.Spec.PolicyTypes) == 0 || slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress)
}

func podHasPolicyPort(ps corev1.PodSpec, pp networkingv1.NetworkPolicyPort) bool {
	for _, ct := range ps.Containers {
		for _, cp := range ct.Ports {
			if policyPortMatches(pp, cp) {
				return true
			}
		}
	}
	return false
}

// policyPortMatches: a policy's port (protocol TCP unless it says,
// a number, a range with endPort or a container port's name) covers cp.
func policyPortMatches(pp networkingv1.NetworkPolicyPort, cp corev1.ContainerPort) bool {
	proto, cproto := corev1.ProtocolTCP, corev1.ProtocolTCP
	if pp.Protocol != nil {
		proto = *pp.Protocol
	}
	if cp.Protocol != "" {
		cproto = cp.Protocol
	}
	if proto != cproto {
		return false
	}
	if pp.Port == nil {
		return true
	}
	if n := int32(pp.Port.IntValue()); n != 0 && pp.Port.Type == 0 {
		end := n
		if pp.EndPort != nil {
			end = *pp.EndPort
		}
		return cp.ContainerPort >= n && cp.ContainerPort <= end
	}
	return pp.Port.String() == cp.Name
}

// admits evaluates the NetworkPolicies as Kubernetes defines them: a pod
// that no ingress policy selects takes every connection; one that some
// select takes those that a rule of one of them allows (ports and peer).
func (c *cluster) admits(ns string, podLabels map[string]string, cp corev1.ContainerPort, pe *peer) bool {
	selected, allowed := false, false
	each(c, func(_ manifest, np *networkingv1.NetworkPolicy) {
		sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
		if err != nil || np.Namespace != ns || !ingressPolicy(np) || !sel.Matches(labels.Set(podLabels)) {
			return
		}
		selected = true
		for _, rule := range np.Spec.Ingress {
			portOK := len(rule.Ports) == 0 || slices.ContainsFunc(rule.Ports, func(pp networkingv1.NetworkPolicyPort) bool { return policyPortMatches(pp, cp) })
			if portOK && (len(rule.From) == 0 || slices.ContainsFunc(rule.From, func(f networkingv1.NetworkPolicyPeer) bool { return peerMatches(f, np.Namespace, pe) })) {
				allowed = true
			}
		}
	})
	return !selected || allowed
}

func peerMatches(f networkingv1.NetworkPolicyPeer, policyNS string, pe *peer) bool {
	if f.IPBlock != nil {
		_, cidr, err := net.ParseCIDR(f.IPBlock.CIDR)
		ip := net.ParseIP(pe.ip)
		if err != nil || ip == nil || !cidr.Contains(ip) {
			return false
		}
		for _, e := range f.IPBlock.Except {
			if _, ex, err := net.ParseCIDR(e); err == nil && ex.Contains(ip) {
				return false
			}
		}
		return true
	}
	if pe.ns == "" {
		return false // a selector picks pods, not outside addresses
	}
	if f.NamespaceSelector == nil {
		if pe.ns != policyNS {
			return false
		}
	} else if s, err := metav1.LabelSelectorAsSelector(f.NamespaceSelector); err != nil || !s.Matches(labels.Set(pe.nsLabels)) {
		return false
	}
	if f.PodSelector == nil {
		return true
	}
	s, err := metav1.LabelSelectorAsSelector(f.PodSelector)
	return err == nil && s.Matches(labels.Set(pe.labels))
}

// patchOp is one operation of an RFC 6902 JSON patch.
type patchOp struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value"`
}

// applyOverlayPatches applies a kustomization's inline JSON patches to the
// objects their targets name, as kustomize does (add, replace, remove and
// test; patch files are not handled here: TestRenderedKustomizations has
// kubectl render those).
func applyOverlayPatches(c *cluster, k *kustomization) error {
	for _, pt := range k.Patches {
		if pt.Patch == "" || pt.Target == nil {
			return fmt.Errorf("patch %q: only inline JSON patches with a target are applied without kubectl", pt.Path)
		}
		var ops []patchOp
		if err := yaml.UnmarshalStrict([]byte(pt.Patch), &ops); err != nil {
			return fmt.Errorf("patch of %s %s: %w", pt.Target.Kind, pt.Target.Name, err)
		}
		n := 0
		for i, m := range c.objs {
			o, ok := m.obj.(metav1.Object)
			kind := m.kind[strings.LastIndex(m.kind, "/")+1:]
			if !ok || kind != pt.Target.Kind || o.GetName() != pt.Target.Name {
				continue
			}
			j, err := json.Marshal(m.obj)
			if err != nil {
				return err
			}
			var doc any
			if err := json.Unmarshal(j, &doc); err != nil {
				return err
			}
			for _, op := range ops {
				if doc, err = applyOp(doc, strings.Split(op.Path, "/")[1:], op); err != nil {
					return fmt.Errorf("patch of %s %s: %s %s: %w", kind, o.GetName(), op.Op, op.Path, err)
				}
			}
			if j, err = json.Marshal(doc); err != nil {
				return err
			}
			obj := reflect.New(reflect.TypeOf(m.obj).Elem()).Interface()
			if strict, err := sigsjson.UnmarshalStrict(j, obj); err != nil || len(strict) > 0 {
				return fmt.Errorf("patch of %s %s: the result does not decode: %v %v", kind, o.GetName(), err, strict)
			}
			c.objs[i].obj = obj
			n++
		}
		if n == 0 {
			return fmt.Errorf("patch target %s %s matches no object", pt.Target.Kind, pt.Target.Name)
		}
	}
	return nil
}

// applyOp applies op at the JSON pointer tokens below node and returns the
// new node.
func applyOp(node any, tokens []string, op patchOp) (any, error) {
	tok := strings.ReplaceAll(strings.ReplaceAll(tokens[0], "~1", "/"), "~0", "~")
	last := len(tokens) == 1
	switch n := node.(type) {
	case map[string]any:
		if !last {
			child, ok := n[tok]
			if !ok {
				return nil, fmt.Errorf("no member %q", tok)
			}
			v, err := applyOp(child, tokens[1:], op)
			n[tok] = v
			return n, err
		}
		switch op.Op {
		case "add", "replace":
			if _, ok := n[tok]; !ok && op.Op == "replace" {
				return nil, fmt.Errorf("no member %q to replace", tok)
			}
			n[tok] = op.Value
		case "remove":
			delete(n, tok)
		case "test":
			if !reflect.DeepEqual(n[tok], op.Value) {
				return nil, fmt.Errorf("test failed: %v, want %v", n[tok], op.Value)
			}
		default:
			return nil, fmt.Errorf("op %q not handled", op.Op)
		}
		return n, nil
	case []any:
		i := len(n)
		if tok != "-" {
			var err error
			if i, err = strconv.Atoi(tok); err != nil || i < 0 || i > len(n) || (i == len(n) && (!last || op.Op != "add")) {
				return nil, fmt.Errorf("index %q out of range (%d items)", tok, len(n))
			}
		}
		if !last {
			v, err := applyOp(n[i], tokens[1:], op)
			n[i] = v
			return n, err
		}
		switch op.Op {
		case "add":
			return slices.Insert(n, i, op.Value), nil
		case "replace":
			n[i] = op.Value
		case "remove":
			return slices.Delete(n, i, i+1), nil
		case "test":
			if !reflect.DeepEqual(n[i], op.Value) {
				return nil, fmt.Errorf("test failed: %v, want %v", n[i], op.Value)
			}
		default:
			return nil, fmt.Errorf("op %q not handled", op.Op)
		}
		return n, nil
	}
	return nil, fmt.Errorf("%q: not an object or array", tok)
}

// loadProvisioned is the provisioned overlay as kustomize makes it: the base
// and monitoring, the overlay's own manifests (its Role and RoleBinding) and
// its inline patches applied.
func loadProvisioned(t *testing.T) *cluster {
	t.Helper()
	c := loadCluster(t, "base", "monitoring", "provisioned")
	for _, m := range loadDir(t, "provisioned") {
		if k, ok := m.obj.(*kustomization); ok {
			if err := applyOverlayPatches(c, k); err != nil {
				t.Fatalf("%s: %v", m, err)
			}
		}
	}
	return c
}
