package deploy

import (
	"bytes"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
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
			if _, err := os.Stat(filepath.Join(kubeDir, dir, p.Path)); err != nil {
				t.Errorf("%s: patch %s: %v", m, p.Path, err)
			}
			listed[p.Path] = true
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
// decodes what it prints, strictly.
func render(t *testing.T, kubectl, dir string) []manifest {
	t.Helper()
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
	return ms
}

// TestRenderedKustomizations: what kustomize itself makes of the base, the
// GKE overlay and the monitoring directory decodes strictly and passes the
// same checks, the overlay's GPU workers selecting GKE's accelerator label
// instead of mdag.io/gpu. Needs kubectl (kustomize is built in).
func TestRenderedKustomizations(t *testing.T) {
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Skip("kubectl is not installed: the kustomizations are not rendered (TestKustomizations checks their files)")
	}
	monitoring := render(t, kubectl, "monitoring")
	for _, tc := range []struct{ dir, gpuSel string }{
		{"base", gpuNodeLabel},
		{"gke", "cloud.google.com/gke-accelerator"},
	} {
		t.Run(tc.dir, func(t *testing.T) {
			c := loadCluster(t) // the CLIs and the documented Secrets
			c.objs = append(render(t, kubectl, tc.dir), monitoring...)
			c.gpuSel = tc.gpuSel
			for _, s := range c.check() {
				t.Error(s)
			}
			ws := c.workerDeployments()
			if len(ws) != 3 {
				t.Fatalf("%d worker Deployments rendered, want 3", len(ws))
			}
			for _, d := range ws {
				if _, ok := d.Spec.Template.Spec.NodeSelector[gpuNodeLabel]; ok && tc.gpuSel != gpuNodeLabel {
					t.Errorf("%s: still selects %s", d.Name, gpuNodeLabel)
				}
				for _, ct := range d.Spec.Template.Spec.Containers {
					if !slices.Contains([]string{"registry.example.com/mdag:latest", "registry.example.com/mdag-torch-runner:latest"}, ct.Image) {
						t.Errorf("%s container %s: image %s, not mapped by the images: entries", d.Name, ct.Name, ct.Image)
					}
				}
			}
		})
	}
}
