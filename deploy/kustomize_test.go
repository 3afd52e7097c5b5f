package deploy

import (
	"bytes"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
)

// TestKustomizations: each kustomization names files that exist, lists
// every manifest of its directory (one left out would silently not be
// applied) and maps every image its Deployments use.
func TestKustomizations(t *testing.T) {
	for _, m := range loadDir(t, ".") {
		k, ok := m.obj.(*kustomization)
		if !ok {
			continue
		}
		dir := path.Dir(m.file)
		listed := map[string]bool{path.Base(m.file): true}
		for _, r := range k.Resources {
			p := filepath.Join(kubeDir, dir, r)
			fi, err := os.Stat(p)
			switch {
			case err != nil:
				t.Errorf("%s: resource %s: %v", m, r, err)
			case fi.IsDir():
				if _, err := os.Stat(filepath.Join(p, "kustomization.yaml")); err != nil {
					t.Errorf("%s: resource %s is a directory without a kustomization.yaml", m, r)
				}
			}
			listed[r] = true
		}
		for _, p := range k.Patches {
			if p.Path == "" {
				if p.Patch == "" || p.Target == nil {
					t.Errorf("%s: a patch with neither a file nor an inline patch and its target", m)
				}
				continue
			}
			if _, err := os.Stat(filepath.Join(kubeDir, dir, p.Path)); err != nil {
				t.Errorf("%s: patch %s: %v", m, p.Path, err)
			}
			listed[p.Path] = true
		}
		for _, pr := range kustomizationImageProblems(k) {
			t.Errorf("%s: %s", m, pr)
		}
		images := map[string]bool{}
		for _, im := range k.Images {
			images[im.Name] = true
		}
		for _, f := range yamlFiles(t, dir) {
			if path.Dir(f) != dir {
				continue // a directory of its own
			}
			if !listed[path.Base(f)] {
				t.Errorf("%s: %s is in its directory but neither a resource nor a patch: kubectl apply -k would leave it out", m, f)
			}
		}
		if len(k.Images) == 0 {
			continue
		}
		for _, r := range loadDir(t, dir) {
			d, ok := r.obj.(*appsv1.Deployment)
			if !ok || path.Dir(r.file) != dir {
				continue
			}
			for _, ct := range d.Spec.Template.Spec.Containers {
				if !images[ct.Image] {
					t.Errorf("%s: container %s's image %s has no images: entry in %s", r, ct.Name, ct.Image, m.file)
				}
			}
		}
	}
}

// render runs kubectl kustomize on a directory under deploy/kubernetes and
// decodes what it prints, strictly; once per directory and test binary (the
// objects are shared, read only).
func render(t *testing.T, kubectl, dir string) []manifest {
	t.Helper()
	renderedMu.Lock()
	defer renderedMu.Unlock()
	if ms, ok := rendered[dir]; ok {
		return ms
	}
	var stderr bytes.Buffer
	cmd := exec.Command(kubectl, "kustomize", filepath.Join(kubeDir, dir))
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kubectl kustomize %s: %v\n%s", dir, err, stderr.Bytes())
	}
	ms, errs := decodeFile("kubectl kustomize "+dir, out)
	for _, err := range errs {
		t.Error(err)
	}
	if len(errs) == 0 {
		rendered[dir] = slices.Clip(ms)
	}
	return slices.Clip(ms)
}

var (
	renderedMu sync.Mutex
	rendered   = map[string][]manifest{}
)

// TestRenderedKustomizations: what kustomize itself makes of the base
// (static mode), the provisioned overlay, the GKE overlay and the monitoring
// directory decodes strictly and passes the same checks with every image
// pinned; the static renderings have no Role and no token, the provisioned
// one has --provisioner kubernetes, its Role and the coordinator's token;
// the GKE overlay's GPU workers select GKE's accelerator label instead of
// mdag.io/gpu. Needs kubectl (kustomize is built in).
func TestRenderedKustomizations(t *testing.T) {
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Skip("kubectl is not installed: the kustomizations are not rendered (TestKustomizations and TestProvisionedOverlay check their files)")
	}
	monitoring := render(t, kubectl, "monitoring")
	for _, tc := range []struct {
		dir, gpuSel string
		provisioned bool
	}{
		{"base", gpuNodeLabel, false},
		{"provisioned", gpuNodeLabel, true},
		{"gke", "cloud.google.com/gke-accelerator", false},
	} {
		t.Run(tc.dir, func(t *testing.T) {
			c := loadCluster(t) // the CLIs and the documented Secrets
			c.objs = append(render(t, kubectl, tc.dir), monitoring...)
			c.gpuSel = tc.gpuSel
			c.rendered = true
			for _, s := range c.check() {
				t.Error(s)
			}
			checkMode(t, c, tc.provisioned)
			ws := c.workerDeployments()
			if len(ws) != 3 {
				t.Fatalf("%d worker Deployments rendered, want 3", len(ws))
			}
			for _, d := range ws {
				if _, ok := d.Spec.Template.Spec.NodeSelector[gpuNodeLabel]; ok && tc.gpuSel != gpuNodeLabel {
					t.Errorf("%s: still selects %s", d.Name, gpuNodeLabel)
				}
				for _, ct := range d.Spec.Template.Spec.Containers {
					if !strings.HasPrefix(ct.Image, "registry.example.com/") {
						t.Errorf("%s container %s: image %s, not mapped by the images: entries", d.Name, ct.Name, ct.Image)
					}
				}
			}
		})
	}
}

// checkMode: the coordinator runs the mode a rendering is for, with the RBAC
// objects that mode has (the checks then hold each mode to its rules).
func checkMode(t *testing.T, c *cluster, wantProvisioned bool) {
	t.Helper()
	d, _ := c.coordinator()
	if d == nil {
		t.Fatal("no coordinator Deployment")
	}
	if got := provisioned(d); got != wantProvisioned {
		t.Errorf("coordinator args %v: provisioned mode %v, want %v", d.Spec.Template.Spec.Containers[0].Args, got, wantProvisioned)
	}
	roles := 0
	each(c, func(_ manifest, _ *rbacv1.Role) { roles++ })
	each(c, func(_ manifest, _ *rbacv1.RoleBinding) { roles++ })
	if want := map[bool]int{false: 0, true: 2}[wantProvisioned]; roles != want {
		t.Errorf("%d Roles and RoleBindings, want %d", roles, want)
	}
	if got := c.mountsToken(d.Namespace, d.Spec.Template.Spec); got != wantProvisioned {
		t.Errorf("the coordinator's pod mounts a service account token: %v, want %v", got, wantProvisioned)
	}
	// Provisioned mode issues each worker pod a certificate of its own with
	// the CA of Secret mdag-worker-issuer, mounted in the coordinator's pod
	// alone, and so declares no worker certificate shared; static mode
	// shares mdag-worker-tls and has neither the key nor RBAC on Secrets.
	args := d.Spec.Template.Spec.Containers[0].Args
	issuerDir, issuer := flagValue(args, "provisioner-issuer")
	if issuer != wantProvisioned {
		t.Errorf("coordinator args %v: --provisioner-issuer %v, want %v", args, issuer, wantProvisioned)
	}
	for _, t2 := range c.podTemplates() {
		ps := t2.d.Spec.Template.Spec
		for _, v := range ps.Volumes {
			if v.Secret == nil || v.Secret.SecretName != issuerSecret {
				continue
			}
			if t2.d != d || !wantProvisioned {
				t.Errorf("Deployment %s mounts %s (the CA's key): want only the provisioning coordinator", t2.d.Name, issuerSecret)
				continue
			}
			mounted := slices.ContainsFunc(ps.Containers[0].VolumeMounts, func(vm corev1.VolumeMount) bool {
				return vm.Name == v.Name && vm.MountPath == issuerDir && vm.ReadOnly
			})
			if !mounted {
				t.Errorf("the coordinator does not mount %s read-only at --provisioner-issuer %s", issuerSecret, issuerDir)
			}
			issuer = false // found
		}
	}
	if wantProvisioned && issuer {
		t.Errorf("the coordinator mounts no Secret %s", issuerSecret)
	}
	shared := slices.Contains(args, "--shared-cert=worker/worker=*")
	if shared == wantProvisioned {
		t.Errorf("coordinator args %v: --shared-cert=worker/worker=* %v, want %v (static pods share mdag-worker-tls; provisioned ones have their own)", args, shared, !wantProvisioned)
	}
	secrets := false
	each(c, func(_ manifest, r *rbacv1.Role) {
		for _, rule := range r.Rules {
			secrets = secrets || slices.Contains(rule.Resources, "secrets")
		}
	})
	if secrets != wantProvisioned {
		t.Errorf("a Role grants on secrets: %v, want %v", secrets, wantProvisioned)
	}
}

// issuerSecret is the Secret of the provisioner's CA (docs/deploy.md).
const issuerSecret = "mdag-worker-issuer"

// TestProvisionedOverlay: the provisioned overlay, its inline patch applied
// here as kustomize applies it (no kubectl needed), is provisioned mode and
// passes the checks.
func TestProvisionedOverlay(t *testing.T) {
	c := loadProvisioned(t)
	if t.Failed() {
		return
	}
	for _, s := range c.check() {
		t.Error(s)
	}
	checkMode(t, c, true)
}

// TestImagePinned: an image names one build (a tag other than latest, or a
// digest), in a container and in a kustomization's images: entry.
func TestImagePinned(t *testing.T) {
	for image, want := range map[string]string{
		"registry.example.com/mdag:v0.1.0":             "",
		"registry.example.com:5000/mdag:v0.1.0":        "",
		"registry.example.com/mdag@sha256:0123abcd":    "",
		"registry.example.com/mdag:latest":             "tagged latest",
		"registry.example.com/mdag":                    "no tag or digest",
		"registry.example.com:5000/mdag":               "no tag or digest",
		"mdag":                                         "no tag or digest",
		"registry.example.com/mdag@md5:0123":           "want sha256",
		"registry.example.com/mdag:v1@sha256:0123abcd": "",
	} {
		err := imagePinned(image)
		switch {
		case want == "" && err != nil:
			t.Errorf("%s: %v, want no error", image, err)
		case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
			t.Errorf("%s: %v, want an error with %q", image, err, want)
		}
	}
	for _, tc := range []struct {
		im   kustomizeImage
		want string
	}{
		{kustomizeImage{Name: "mdag", NewName: "r/mdag", NewTag: "v0.1.0"}, ""},
		{kustomizeImage{Name: "mdag", Digest: "sha256:0123"}, ""},
		{kustomizeImage{Name: "mdag", NewName: "r/mdag", NewTag: "latest"}, "newTag latest"},
		{kustomizeImage{Name: "mdag", NewName: "r/mdag"}, "no newTag or digest"},
		{kustomizeImage{Name: "mdag", Digest: "0123"}, "want sha256"},
	} {
		got := strings.Join(kustomizationImageProblems(&kustomization{Images: []kustomizeImage{tc.im}}), "\n")
		if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
			t.Errorf("%+v: %q, want %q", tc.im, got, tc.want)
		}
	}
}
