package deploy

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// kustomizeBuild renders the kustomization in deploy/kubernetes/dir as
// kubectl kustomize does, for what these kustomizations use: resources
// (files and directories), inline JSON patches with a target
// (applyOverlayPatches), patch files that change maps only (a strategic
// merge patch without lists: maps merged key by key, null removing a key;
// a list in one fails, since kustomize merges lists by their merge keys)
// and images: entries for bare image names. It needs no kubectl;
// TestKustomizeBuild compares it with kubectl's where kubectl is installed.
// The renderings are shared (read only: appending to one copies it).
func kustomizeBuild(t *testing.T, dir string) []manifest {
	t.Helper()
	builtMu.Lock()
	defer builtMu.Unlock()
	if objs, ok := built[dir]; ok {
		return objs
	}
	objs, err := kustomizeBuildDir(dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	built[dir] = slices.Clip(objs)
	return built[dir]
}

var (
	builtMu sync.Mutex
	built   = map[string][]manifest{}
)

func kustomizeBuildDir(dir string) ([]manifest, error) {
	file := path.Join(dir, "kustomization.yaml")
	data, err := os.ReadFile(filepath.Join(kubeDir, file))
	if err != nil {
		return nil, err
	}
	_, obj, err := decodeStrict(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	k, ok := obj.(*kustomization)
	if !ok {
		return nil, fmt.Errorf("%s: not a Kustomization", file)
	}
	var objs []manifest
	for _, r := range k.Resources {
		p := path.Join(dir, r)
		fi, err := os.Stat(filepath.Join(kubeDir, p))
		if err != nil {
			return nil, fmt.Errorf("%s: resource %s: %w", file, r, err)
		}
		if fi.IsDir() {
			sub, err := kustomizeBuildDir(p)
			if err != nil {
				return nil, err
			}
			objs = append(objs, sub...)
			continue
		}
		data, err := os.ReadFile(filepath.Join(kubeDir, p))
		if err != nil {
			return nil, err
		}
		ms, errs := decodeFile(p, data)
		if len(errs) > 0 {
			return nil, fmt.Errorf("%s: %v", file, errs)
		}
		objs = append(objs, ms...)
	}
	c := &cluster{objs: objs}
	for _, pt := range k.Patches {
		if pt.Path == "" {
			if err := applyOverlayPatches(c, &kustomization{Patches: []kustomizePatch{pt}}); err != nil {
				return nil, fmt.Errorf("%s: %w", file, err)
			}
			continue
		}
		if err := applyPatchFile(c, path.Join(dir, pt.Path)); err != nil {
			return nil, fmt.Errorf("%s: patch %s: %w", file, pt.Path, err)
		}
	}
	for _, im := range k.Images {
		ref := im.Name
		if im.NewName != "" {
			ref = im.NewName
		}
		switch {
		case im.Digest != "":
			ref += "@" + im.Digest
		case im.NewTag != "":
			ref += ":" + im.NewTag
		}
		each(c, func(_ manifest, d *appsv1.Deployment) {
			ps := &d.Spec.Template.Spec
			for _, cts := range [][]corev1.Container{ps.InitContainers, ps.Containers} {
				for i := range cts {
					if cts[i].Image == im.Name {
						cts[i].Image = ref
					}
				}
			}
		})
	}
	return c.objs, nil
}

// applyPatchFile applies a patch file (a partial object naming its target
// by apiVersion, kind, name and namespace) to the object it names.
func applyPatchFile(c *cluster, file string) error {
	data, err := os.ReadFile(filepath.Join(kubeDir, file))
	if err != nil {
		return err
	}
	var patch map[string]any
	if err := yaml.UnmarshalStrict(data, &patch); err != nil {
		return err
	}
	var tm metav1.TypeMeta
	var meta struct {
		Metadata metav1.ObjectMeta `json:"metadata"`
	}
	if err := yaml.Unmarshal(data, &tm); err != nil {
		return err
	}
	if err := yaml.Unmarshal(data, &meta); err != nil {
		return err
	}
	kind := tm.APIVersion + "/" + tm.Kind
	n := 0
	for i, m := range c.objs {
		o, ok := m.obj.(metav1.Object)
		if !ok || m.kind != kind || o.GetName() != meta.Metadata.Name || o.GetNamespace() != meta.Metadata.Namespace {
			continue
		}
		j, err := json.Marshal(m.obj)
		if err != nil {
			return err
		}
		var doc map[string]any
		if err := json.Unmarshal(j, &doc); err != nil {
			return err
		}
		if err := mergeMaps(doc, patch, ""); err != nil {
			return err
		}
		if j, err = json.Marshal(doc); err != nil {
			return err
		}
		obj := reflect.New(reflect.TypeOf(m.obj).Elem()).Interface()
		if strict, err := sigsjson.UnmarshalStrict(j, obj); err != nil || len(strict) > 0 {
			return fmt.Errorf("the patched %s %s does not decode: %v %v", kind, o.GetName(), err, strict)
		}
		c.objs[i].obj = obj
		n++
	}
	if n != 1 {
		return fmt.Errorf("%s %s/%s: %d objects match, want 1", kind, meta.Metadata.Namespace, meta.Metadata.Name, n)
	}
	return nil
}

// mergeMaps merges patch into dst: maps key by key, null removes the key,
// a scalar replaces; a list is refused (strategic merge would merge it by
// its merge key, which this renderer does not know).
func mergeMaps(dst, patch map[string]any, at string) error {
	for k, v := range patch {
		p := strings.TrimPrefix(at+"."+k, ".")
		switch pv := v.(type) {
		case nil:
			delete(dst, k)
		case []any:
			return fmt.Errorf("%s: a list in a patch file (strategic merge of lists is not rendered here: use an inline JSON patch)", p)
		case map[string]any:
			dm, ok := dst[k].(map[string]any)
			if !ok {
				dm = map[string]any{}
				dst[k] = dm
			}
			if err := mergeMaps(dm, pv, p); err != nil {
				return err
			}
		default:
			dst[k] = v
		}
	}
	return nil
}

// TestKustomizeBuild: the in-repo renderer makes what kubectl kustomize
// makes of each kustomization, object by object (where kubectl is
// installed), and refuses what it does not render.
func TestKustomizeBuild(t *testing.T) {
	t.Run("refuses a list in a patch file", func(t *testing.T) {
		err := mergeMaps(map[string]any{}, map[string]any{"spec": map[string]any{"tolerations": []any{}}}, "")
		if err == nil || !strings.Contains(err.Error(), "spec.tolerations: a list in a patch file") {
			t.Errorf("error %v, want one naming spec.tolerations", err)
		}
	})
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Skip("kubectl is not installed: the in-repo renderer is not compared with kustomize's")
	}
	for _, dir := range []string{"base", "provisioned", "gke", "monitoring"} {
		t.Run(dir, func(t *testing.T) {
			compareObjects(t, "the in-repo renderer", kustomizeBuild(t, dir), "kubectl kustomize", render(t, kubectl, dir))
		})
	}
}
