package deploy

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// kubeDir is where the manifests are, from this package's directory.
const kubeDir = "kubernetes"

// kinds maps apiVersion/kind to a new object of its Go type: every document
// under deploy/kubernetes must be one of these. A kind not listed fails the
// test: add its type here when a manifest needs it.
var kinds = map[string]func() any{
	"v1/Namespace":                                  func() any { return &corev1.Namespace{} },
	"v1/ServiceAccount":                             func() any { return &corev1.ServiceAccount{} },
	"v1/ConfigMap":                                  func() any { return &corev1.ConfigMap{} },
	"v1/Secret":                                     func() any { return &corev1.Secret{} },
	"v1/Service":                                    func() any { return &corev1.Service{} },
	"v1/PersistentVolumeClaim":                      func() any { return &corev1.PersistentVolumeClaim{} },
	"apps/v1/Deployment":                            func() any { return &appsv1.Deployment{} },
	"rbac.authorization.k8s.io/v1/Role":             func() any { return &rbacv1.Role{} },
	"rbac.authorization.k8s.io/v1/RoleBinding":      func() any { return &rbacv1.RoleBinding{} },
	"networking.k8s.io/v1/NetworkPolicy":            func() any { return &networkingv1.NetworkPolicy{} },
	"monitoring.coreos.com/v1/ServiceMonitor":       func() any { return &monitoringv1.ServiceMonitor{} },
	"kustomize.config.k8s.io/v1beta1/Kustomization": func() any { return &kustomization{} },
}

// kustomization mirrors the fields of kustomize's Kustomization
// (sigs.k8s.io/kustomize/api/types) that these manifests use. The real type's
// module brings kustomize's whole API (kyaml, kube-openapi's schemas) into
// go.mod for one struct. Decoded strictly, a field the files use that is not
// mirrored here fails the test, so the mirror cannot fall behind the files
// unnoticed; where kubectl is installed, TestRenderedKustomizations has
// kustomize itself read them.
type kustomization struct {
	metav1.TypeMeta `json:",inline"`
	Resources       []string         `json:"resources,omitempty"`
	Images          []kustomizeImage `json:"images,omitempty"`
	Patches         []kustomizePatch `json:"patches,omitempty"`
}

type kustomizeImage struct {
	Name    string `json:"name"`
	NewName string `json:"newName,omitempty"`
	NewTag  string `json:"newTag,omitempty"`
	Digest  string `json:"digest,omitempty"`
}

// kustomizePatch is a patch file (path: a strategic merge patch) or an
// inline JSON patch (patch:, RFC 6902) applied to the objects target names.
type kustomizePatch struct {
	Path   string           `json:"path,omitempty"`
	Patch  string           `json:"patch,omitempty"`
	Target *kustomizeTarget `json:"target,omitempty"`
}

type kustomizeTarget struct {
	Group     string `json:"group,omitempty"`
	Version   string `json:"version,omitempty"`
	Kind      string `json:"kind,omitempty"`
	Name      string `json:"name,omitempty"`
	Namespace string `json:"namespace,omitempty"`
}

// manifest is one decoded document of a file.
type manifest struct {
	file  string // path under deploy/kubernetes
	index int    // the document's number in the file, from 1
	kind  string // apiVersion/kind
	obj   any    // a pointer to the kind's Go type
}

func (m manifest) String() string { return fmt.Sprintf("%s#%d (%s)", m.file, m.index, m.kind) }

// decodeStrict decodes one YAML document into the Go type its apiVersion and
// kind name, refusing unknown and duplicate fields and values of the wrong
// type.
func decodeStrict(doc []byte) (string, any, error) {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return "", nil, fmt.Errorf("not a Kubernetes object: %w", err)
	}
	if tm.APIVersion == "" || tm.Kind == "" {
		return "", nil, fmt.Errorf("no apiVersion or kind (apiVersion %q, kind %q)", tm.APIVersion, tm.Kind)
	}
	kind := tm.APIVersion + "/" + tm.Kind
	newObj, ok := kinds[kind]
	if !ok {
		return kind, nil, fmt.Errorf("unknown kind %s (known: %s)", kind, strings.Join(knownKinds(), ", "))
	}
	// YAML to JSON refusing duplicate keys, then JSON into the type as the
	// API server reads it: field names case-sensitive, every unknown and
	// duplicate field an error with its path
	j, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return kind, nil, fmt.Errorf("%s: %w", kind, err)
	}
	obj := newObj()
	strict, err := sigsjson.UnmarshalStrict(j, obj)
	if err != nil {
		return kind, nil, fmt.Errorf("%s: %w", kind, err)
	}
	if len(strict) > 0 {
		return kind, nil, fmt.Errorf("%s: %w", kind, errors.Join(strict...))
	}
	return kind, obj, nil
}

func knownKinds() []string {
	var ks []string
	for k := range kinds {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// splitDocuments splits a multi-document YAML file; documents that hold
// nothing (comments, blank) are left out.
func splitDocuments(data []byte) ([][]byte, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var docs [][]byte
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, err
		}
		var v any
		if err := yaml.Unmarshal(doc, &v); err != nil {
			return nil, fmt.Errorf("document %d: %w", len(docs)+1, err)
		}
		if v != nil {
			docs = append(docs, doc)
		}
	}
}

// decodeFile decodes every document of data, named file in errors.
func decodeFile(file string, data []byte) ([]manifest, []error) {
	docs, err := splitDocuments(data)
	if err != nil {
		return nil, []error{fmt.Errorf("%s: %w", file, err)}
	}
	if len(docs) == 0 {
		return nil, []error{fmt.Errorf("%s: no document", file)}
	}
	var ms []manifest
	var errs []error
	for i, doc := range docs {
		kind, obj, err := decodeStrict(doc)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s#%d: %w", file, i+1, err))
			continue
		}
		ms = append(ms, manifest{file: file, index: i + 1, kind: kind, obj: obj})
	}
	return ms, errs
}

// yamlFiles lists the YAML files under dir, relative to kubeDir.
func yamlFiles(t *testing.T, dir string) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(filepath.Join(kubeDir, dir), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && (strings.HasSuffix(p, ".yaml") || strings.HasSuffix(p, ".yml")) {
			rel, err := filepath.Rel(kubeDir, p)
			if err != nil {
				return err
			}
			files = append(files, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(files)
	return files
}

// loadDir decodes every YAML file under deploy/kubernetes/dir ("." for all),
// failing the test for each document that does not decode.
func loadDir(t *testing.T, dir string) []manifest {
	t.Helper()
	var all []manifest
	for _, f := range yamlFiles(t, dir) {
		data, err := os.ReadFile(filepath.Join(kubeDir, f))
		if err != nil {
			t.Fatal(err)
		}
		ms, errs := decodeFile(f, data)
		for _, err := range errs {
			t.Error(err)
		}
		all = append(all, ms...)
	}
	return all
}

// TestManifestsDecodeStrictly: every document of every YAML file under
// deploy/kubernetes decodes strictly into the Go type of its apiVersion and
// kind, and the directories hold what docs/deploy.md says they do.
func TestManifestsDecodeStrictly(t *testing.T) {
	all := loadDir(t, ".")
	if t.Failed() {
		return
	}
	got := map[string]int{}
	for _, m := range all {
		got[m.kind]++
	}
	// what the deployment is made of (a file that went missing, or a
	// directory walked wrongly, shows here)
	want := map[string]int{
		"v1/Namespace":                                  1,
		"v1/ServiceAccount":                             1,
		"v1/ConfigMap":                                  3, // the app, the models, the dashboard
		"v1/Service":                                    1,
		"v1/PersistentVolumeClaim":                      1,
		"apps/v1/Deployment":                            6, // coordinator, 3 worker types, 2 GKE patches
		"rbac.authorization.k8s.io/v1/Role":             1, // provisioned mode only
		"rbac.authorization.k8s.io/v1/RoleBinding":      1,
		"networking.k8s.io/v1/NetworkPolicy":            3, // default deny, the coordinator's, the workers'
		"monitoring.coreos.com/v1/ServiceMonitor":       1,
		"kustomize.config.k8s.io/v1beta1/Kustomization": 4, // base, provisioned, gke, monitoring
	}
	for k, n := range want {
		if got[k] != n {
			t.Errorf("%s: %d documents, want %d", k, got[k], n)
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("%s: not expected under deploy/kubernetes (add it to the test's list if meant)", k)
		}
	}
	for _, m := range all {
		if s, ok := m.obj.(*corev1.Secret); ok {
			t.Errorf("%s: Secret %s is committed: Secrets are made by the commands of docs/deploy.md, never kept in the repository", m, s.Name)
		}
	}
}

// TestStrictDecodeRefuses: a misspelt or misplaced field, a value of the
// wrong type, a duplicate key and an unknown kind or version each fail the
// decode, naming what.
func TestStrictDecodeRefuses(t *testing.T) {
	cases := []struct {
		name string
		doc  string
		want string // in the error
	}{
		{"misspelt top-level field", `
apiVersion: apps/v1
kind: Deployment
metadata: {name: x}
spce: {replicas: 1}
`, `unknown field "spce"`},
		{"misspelt field deep in a pod", `
apiVersion: apps/v1
kind: Deployment
metadata: {name: x}
spec:
  selector: {matchLabels: {a: b}}
  template:
    metadata: {labels: {a: b}}
    spec:
      containers:
        - name: worker
          image: mdag
          imagePullPolicyy: Always
`, `unknown field "spec.template.spec.containers[0].imagePullPolicyy"`},
		{"field of another kind", `
apiVersion: v1
kind: Service
metadata: {name: x}
spec:
  replicas: 1
`, `unknown field "spec.replicas"`},
		{"value of the wrong type", `
apiVersion: apps/v1
kind: Deployment
metadata: {name: x}
spec: {replicas: one}
`, `cannot unmarshal string into Go struct field DeploymentSpec.spec.replicas of type int32`},
		{"field name in the wrong case", `
apiVersion: apps/v1
kind: Deployment
metadata: {name: x}
spec: {Replicas: 1}
`, `unknown field "spec.Replicas"`},
		{"bad quantity", `
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: x}
spec: {resources: {requests: {storage: lots}}}
`, `quantities must match the regular expression`},
		{"duplicate key", `
apiVersion: v1
kind: ConfigMap
metadata: {name: x}
data: {a: "1", a: "2"}
`, `key "a" already set in map`},
		{"every problem at once", `
apiVersion: v1
kind: Service
metadata: {name: x, labelz: {}}
spec: {portz: []}
`, `unknown field "metadata.labelz"
unknown field "spec.portz"`},
		{"unknown kind", `
apiVersion: apps/v1
kind: Deploymnet
metadata: {name: x}
`, `unknown kind apps/v1/Deploymnet`},
		{"unknown version", `
apiVersion: apps/v2
kind: Deployment
metadata: {name: x}
`, `unknown kind apps/v2/Deployment`},
		{"no kind", `
apiVersion: v1
metadata: {name: x}
`, `no apiVersion or kind`},
		{"misspelt ServiceMonitor field", `
apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitor
metadata: {name: x}
spec:
  selector: {matchLabels: {a: b}}
  endpoint: [{port: metrics}]
`, `unknown field "spec.endpoint"`},
		{"misspelt ServiceMonitor endpoint field", `
apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitor
metadata: {name: x}
spec:
  selector: {matchLabels: {a: b}}
  endpoints: [{port: metrics, intervall: 15s}]
`, `unknown field "spec.endpoints[0].intervall"`},
		{"kustomization field not mirrored or misspelt", `
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resource: [a.yaml]
`, `unknown field "resource"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, _, err := decodeStrict([]byte(c.doc))
			if err == nil {
				t.Fatalf("decoded without an error; want one with %q", c.want)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %q; want it to contain %q", err, c.want)
			}
		})
	}
}

// TestSplitDocuments: a multi-document file is split at its --- lines, and
// a document of comments only is no document (a trailing --- is common).
func TestSplitDocuments(t *testing.T) {
	cases := []struct {
		name  string
		data  string
		kinds []string
		err   string
	}{
		{"one", "apiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n", []string{"v1/Namespace"}, ""},
		{"three with comments", "# head\napiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n---\n# only a comment\n---\napiVersion: v1\nkind: ServiceAccount\nmetadata: {name: b}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n---\n",
			[]string{"v1/Namespace", "v1/ServiceAccount", "v1/ConfigMap"}, ""},
		{"the second bad", "apiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n---\napiVersion: v1\nkind: Namespace\nmetadta: {name: b}\n",
			[]string{"v1/Namespace"}, `f.yaml#2: v1/Namespace: unknown field "metadta"`},
		{"empty", "# nothing\n", nil, "f.yaml: no document"},
		{"not YAML", "a: [b\n", nil, "f.yaml:"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ms, errs := decodeFile("f.yaml", []byte(c.data))
			var kinds []string
			for _, m := range ms {
				kinds = append(kinds, m.kind)
			}
			if strings.Join(kinds, " ") != strings.Join(c.kinds, " ") {
				t.Errorf("kinds %v, want %v", kinds, c.kinds)
			}
			switch {
			case c.err == "" && len(errs) > 0:
				t.Errorf("errors %v, want none", errs)
			case c.err != "" && (len(errs) != 1 || !strings.Contains(errs[0].Error(), c.err)):
				t.Errorf("errors %v, want one with %q", errs, c.err)
			}
		})
	}
}
