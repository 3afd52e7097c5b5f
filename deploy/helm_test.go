package deploy

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/strvals"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// The Helm chart (deploy/helm/mdag) is rendered here with Helm's own
// packages (helm.sh/helm/v3: the chart loader, chartutil's values and
// values.schema.json validation, the template engine in strict mode), as
// helm install and helm template render it, without a cluster.

// chartDir is the chart, from this package's directory.
const chartDir = "helm/mdag"

// chartFiles are the chart's copies of files of the repository (a chart
// reads nothing outside its directory): the source of truth is the file
// named; -update writes the copy again and TestChartFiles fails while they
// differ.
var chartFiles = []struct {
	copy string // under chartDir
	src  func() ([]byte, error)
	from string // what src reads, for messages
}{
	{"files/app.yaml", readFile("../examples/traffic/app.yaml"), "examples/traffic/app.yaml"},
	{"files/profiles.yaml", readFile("../examples/traffic/profiles.yaml"), "examples/traffic/profiles.yaml"},
	{"files/mdag.json", readFile("grafana/mdag.json"), "deploy/grafana/mdag.json"},
	{"files/models.yaml", configMapKey("base/models.yaml", "models.yaml"), "deploy/kubernetes/base/models.yaml's models.yaml"},
}

func readFile(p string) func() ([]byte, error) {
	return func() ([]byte, error) { return os.ReadFile(p) }
}

// configMapKey reads key of the ConfigMap in file (under deploy/kubernetes).
func configMapKey(file, key string) func() ([]byte, error) {
	return func() ([]byte, error) {
		data, err := os.ReadFile(filepath.Join(kubeDir, file))
		if err != nil {
			return nil, err
		}
		ms, errs := decodeFile(file, data)
		if len(errs) > 0 {
			return nil, errors.Join(errs...)
		}
		for _, m := range ms {
			if cm, ok := m.obj.(*corev1.ConfigMap); ok {
				if v, ok := cm.Data[key]; ok {
					return []byte(v), nil
				}
			}
		}
		return nil, fmt.Errorf("%s: no ConfigMap with key %s", file, key)
	}
}

// TestChartFiles: the chart's copies hold their sources byte for byte
// (go test ./deploy -update writes them again).
func TestChartFiles(t *testing.T) {
	for _, f := range chartFiles {
		want, err := f.src()
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(chartDir, f.copy)
		if *update {
			if err := os.WriteFile(p, want, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		got, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(want) {
			t.Errorf("deploy/%s differs from %s (go test ./deploy -update writes it again)", p, f.from)
		}
	}
}

// The chart, loaded once per test binary (rendering does not change it).
var (
	chartOnce sync.Once
	chartObj  *chart.Chart
	chartErr  error
)

func loadChart(t *testing.T) *chart.Chart {
	t.Helper()
	chartOnce.Do(func() { chartObj, chartErr = loader.Load(chartDir) })
	if chartErr != nil {
		t.Fatalf("loading the chart %s: %v", chartDir, chartErr)
	}
	return chartObj
}

// chartValues are a helm install's values: -f files in order, then --set
// strings, merged as helm merges them.
type chartValues struct {
	files []string // under chartDir
	set   []string
}

func (v chartValues) String() string {
	var s []string
	for _, f := range v.files {
		s = append(s, "-f "+f)
	}
	for _, x := range v.set {
		s = append(s, "--set "+x)
	}
	return strings.Join(s, " ")
}

func (v chartValues) values() (map[string]any, error) {
	vals := map[string]any{}
	for _, f := range v.files {
		data, err := os.ReadFile(filepath.Join(chartDir, f))
		if err != nil {
			return nil, err
		}
		var fv map[string]any
		if err := yaml.Unmarshal(data, &fv); err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		vals = mergeValues(vals, fv)
	}
	for _, s := range v.set {
		if err := strvals.ParseInto(s, vals); err != nil {
			return nil, fmt.Errorf("--set %s: %w", s, err)
		}
	}
	return vals, nil
}

// mergeValues merges b into a as helm merges -f files: maps key by key, the
// rest replaced.
func mergeValues(a, b map[string]any) map[string]any {
	out := maps.Clone(a)
	for k, v := range b {
		if bm, ok := v.(map[string]any); ok {
			if am, ok := out[k].(map[string]any); ok {
				out[k] = mergeValues(am, bm)
				continue
			}
		}
		out[k] = v
	}
	return out
}

// errSchema marks a rendering refused by values.schema.json (not by a
// template).
var errSchema = errors.New("values refused by the chart's schema")

// renderValues renders the chart with values (the chart's defaults below
// them) as release mdag in namespace mdag: every template's output by file
// name, NOTES.txt among them.
func renderValues(t *testing.T, vals map[string]any) (map[string]string, error) {
	t.Helper()
	ch := loadChart(t)
	rv, err := chartutil.ToRenderValues(ch, vals, chartutil.ReleaseOptions{Name: "mdag", Namespace: namespace, Revision: 1, IsInstall: true}, nil)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errSchema, err)
	}
	return engine.Engine{Strict: true}.Render(ch, rv)
}

// chartRendering is one rendering of the chart: its files and its objects,
// decoded strictly.
type chartRendering struct {
	files map[string]string
	objs  []manifest
	notes string
}

// renderings are shared by the tests (each set of values rendered once).
var (
	renderMu   sync.Mutex
	renderings = map[string]*chartRendering{}
)

// renderChart renders the chart with v and decodes every object strictly,
// failing the test on an error.
func renderChart(t *testing.T, v chartValues) *chartRendering {
	t.Helper()
	renderMu.Lock()
	defer renderMu.Unlock()
	if r, ok := renderings[v.String()]; ok {
		return r
	}
	vals, err := v.values()
	if err != nil {
		t.Fatal(err)
	}
	files, err := renderValues(t, vals)
	if err != nil {
		t.Fatalf("helm template %s: %v", v, err)
	}
	r := &chartRendering{files: files}
	for _, name := range slices.Sorted(maps.Keys(files)) {
		out := files[name]
		if path.Base(name) == "NOTES.txt" {
			r.notes = out
			continue
		}
		if strings.TrimSpace(out) == "" {
			continue
		}
		docs, err := splitDocuments([]byte(out))
		if err != nil {
			t.Fatalf("helm template %s: %s: %v", v, name, err)
		}
		if len(docs) == 0 {
			continue // only comments: a disabled template
		}
		ms, errs := decodeFile("helm template "+v.String()+": "+name, []byte(out))
		for _, err := range errs {
			t.Error(err)
		}
		r.objs = append(r.objs, ms...)
	}
	renderings[v.String()] = r
	return r
}

// The chart's renderings and the kustomizations they must equal.
var chartCases = []struct {
	name        string
	values      chartValues
	kustomize   []string // directories under deploy/kubernetes, rendered together
	gpuSel      string
	provisioned bool
}{
	{"base", chartValues{set: []string{"namespace.create=true"}}, []string{"base"}, gpuNodeLabel, false},
	{"gke", chartValues{files: []string{"values-gke.yaml"}, set: []string{"namespace.create=true"}}, []string{"gke"}, "cloud.google.com/gke-accelerator", false},
	{"provisioned", chartValues{set: []string{"namespace.create=true", "provisioner.enabled=true"}}, []string{"provisioned"}, gpuNodeLabel, true},
	{"monitoring", chartValues{set: []string{"namespace.create=true", "monitoring.enabled=true"}}, []string{"base", "monitoring"}, gpuNodeLabel, false},
}

// kustomizeImageValues are --set values that give the chart the images the
// base's kustomization names (images: entries for mdag and
// mdag-torch-runner), so that the comparison holds whichever build each
// names: make images writes digests into the chart's values.yaml, not
// into the kustomization. TestChartEqualsKustomize/images requires the same
// repositories.
func kustomizeImageValues(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(kubeDir, "base/kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	_, obj, err := decodeStrict(data)
	if err != nil {
		t.Fatalf("base/kustomization.yaml: %v", err)
	}
	keys := map[string]string{mdagImage: "mdag", runnerImage: "torchRunner"}
	var set []string
	for _, im := range obj.(*kustomization).Images {
		key, ok := keys[im.Name]
		if !ok {
			t.Fatalf("base/kustomization.yaml: image %s has no key under the chart's images", im.Name)
		}
		delete(keys, im.Name)
		set = append(set, "images."+key+".repository="+im.NewName, "images."+key+".tag="+im.NewTag, "images."+key+".digest="+im.Digest)
	}
	if len(keys) > 0 {
		t.Fatalf("base/kustomization.yaml: no images: entry for %v", slices.Sorted(maps.Keys(keys)))
	}
	return set
}

// withImages is v with the kustomization's images set last.
func withImages(t *testing.T, v chartValues) chartValues {
	return chartValues{files: v.files, set: append(slices.Clone(v.set), kustomizeImageValues(t)...)}
}

// objectKey names an object: kind, namespace, name.
func objectKey(m manifest) string {
	o, ok := m.obj.(metav1.Object)
	if !ok {
		return m.kind
	}
	return m.kind + " " + o.GetNamespace() + "/" + o.GetName()
}

// comparable is an object as its JSON (quantities, omitted empty fields and
// field order normalised by the Go type it decoded into).
func comparable(t *testing.T, obj any) map[string]any {
	t.Helper()
	j, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	var out map[string]any
	if err := json.Unmarshal(j, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// compareObjects: a and b have the same objects (by kind, namespace and
// name), each equal field by field; no field is left out of the comparison
// (the chart adds no Helm-only labels or annotations).
func compareObjects(t *testing.T, aName string, a []manifest, bName string, b []manifest) {
	t.Helper()
	index := func(ms []manifest) map[string]manifest {
		out := map[string]manifest{}
		for _, m := range ms {
			k := objectKey(m)
			if prev, ok := out[k]; ok {
				t.Errorf("%s twice: %s and %s", k, prev, m)
			}
			out[k] = m
		}
		return out
	}
	ai, bi := index(a), index(b)
	for _, k := range slices.Sorted(maps.Keys(ai)) {
		bm, ok := bi[k]
		if !ok {
			t.Errorf("%s: in %s, not in %s", k, aName, bName)
			continue
		}
		if d := cmp.Diff(comparable(t, bm.obj), comparable(t, ai[k].obj)); d != "" {
			t.Errorf("%s differs (-%s +%s):\n%s", k, bName, aName, d)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(bi)) {
		if _, ok := ai[k]; !ok {
			t.Errorf("%s: in %s, not in %s", k, bName, aName)
		}
	}
}

// TestChartEqualsKustomize: the chart makes exactly the objects of the
// kustomize base and overlays (rendered by kustomizeBuild, the in-repo
// renderer), each equal field by field: the defaults (with namespace.create)
// the base, values-gke.yaml the gke overlay, provisioner.enabled the
// provisioned overlay, monitoring.enabled the base and monitoring.
func TestChartEqualsKustomize(t *testing.T) {
	t.Run("images", func(t *testing.T) {
		// the chart's defaults name the base's repositories (the tag or
		// digest of each may differ: make images writes the chart's)
		vals, err := chartValues{}.values()
		if err != nil {
			t.Fatal(err)
		}
		rv, err := chartutil.ToRenderValues(loadChart(t), vals, chartutil.ReleaseOptions{Name: "mdag", Namespace: namespace}, nil)
		if err != nil {
			t.Fatal(err)
		}
		set := kustomizeImageValues(t)
		for _, s := range set {
			k, v, _ := strings.Cut(s, "=")
			if !strings.HasSuffix(k, ".repository") {
				continue
			}
			got, err := rv.PathValue("Values." + k)
			if err != nil || got != v {
				t.Errorf("values.yaml %s: %v (%v), want %s as in base/kustomization.yaml", k, got, err, v)
			}
		}
	})
	for _, tc := range chartCases {
		t.Run(tc.name, func(t *testing.T) {
			r := renderChart(t, withImages(t, tc.values))
			var want []manifest
			for _, d := range tc.kustomize {
				want = append(want, kustomizeBuild(t, d)...)
			}
			compareObjects(t, "helm template "+tc.values.String(), r.objs, "kustomize "+strings.Join(tc.kustomize, "+"), want)
		})
	}
	// The defaults leave the Namespace to the user (helm install -n needs it
	// first): the base's objects but that one.
	t.Run("defaults", func(t *testing.T) {
		r := renderChart(t, withImages(t, chartValues{}))
		var want []manifest
		for _, m := range kustomizeBuild(t, "base") {
			if _, ok := m.obj.(*corev1.Namespace); !ok {
				want = append(want, m)
			}
		}
		compareObjects(t, "helm template (defaults)", r.objs, "kustomize base without its Namespace", want)
	})
}

// TestChartChecks: every rendering passes the checks the manifests pass
// (consistency with the profiles and the CLIs, the guards, pinned images)
// in its mode; workers on the lean image and images by digest too.
func TestChartChecks(t *testing.T) {
	digest := "sha256:" + strings.Repeat("0123456789abcdef", 4)
	cases := []struct {
		name        string
		values      chartValues
		gpuSel      string
		provisioned bool
		images      map[string]string // Deployment/container -> image
	}{
		{"lean GPU workers, digests", chartValues{set: []string{
			"namespace.create=true", "workers.p100.image=lean", "images.lean.digest=" + digest, "images.mdag.tag=latest", "images.mdag.digest=" + digest,
		}}, gpuNodeLabel, false, map[string]string{
			"mdag-worker-p100/worker":       "registry.example.com/mdag-lean@" + digest,
			"mdag-worker-v100/worker":       "registry.example.com/mdag@" + digest,
			"mdag-worker-v100/torch-runner": chartImage(t, "torchRunner"),
			"mdag-coordinator/coordinator":  "registry.example.com/mdag@" + digest,
		}},
	}
	for _, tc := range chartCases {
		cases = append(cases, struct {
			name        string
			values      chartValues
			gpuSel      string
			provisioned bool
			images      map[string]string
		}{tc.name, tc.values, tc.gpuSel, tc.provisioned, map[string]string{
			"mdag-worker-p100/worker":       chartImage(t, "mdag"),
			"mdag-worker-p100/torch-runner": chartImage(t, "torchRunner"),
			"mdag-worker-cpu/worker":        chartImage(t, "mdag"),
		}})
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := renderChart(t, tc.values)
			c := loadCluster(t) // the CLIs and the documented Secrets
			c.objs = r.objs
			c.gpuSel = tc.gpuSel
			c.rendered = true
			for _, s := range c.check() {
				t.Error(s)
			}
			checkMode(t, c, tc.provisioned)
			for _, pt := range c.podTemplates() {
				for _, ct := range pt.d.Spec.Template.Spec.Containers {
					want, ok := tc.images[pt.d.Name+"/"+ct.Name]
					if ok && ct.Image != want {
						t.Errorf("Deployment %s container %s: image %s, want %s", pt.d.Name, ct.Name, ct.Image, want)
					}
				}
			}
			if !strings.Contains(r.notes, "rollout status deployment/mdag-coordinator") || !strings.Contains(r.notes, "/healthz") {
				t.Errorf("NOTES.txt does not say how to check the install:\n%s", r.notes)
			}
		})
	}
}

// TestChartRefuses: values a user could get wrong fail helm install with a
// message that names the value (its path in the schema's error, or the
// chart's fail).
func TestChartRefuses(t *testing.T) {
	cases := []struct {
		name   string
		set    []string
		schema bool     // refused by values.schema.json, not by a template
		want   []string // in the error
	}{
		{"misspelt key", []string{"workers.p100.replica=1"}, true, []string{"/workers/p100", "additional properties 'replica' not allowed"}},
		{"misspelt top-level key", []string{"monitoring.enable=true"}, true, []string{"/monitoring", "'enable' not allowed"}},
		{"wrong type", []string{"workers.cpu.replicas=two"}, true, []string{"/workers/cpu/replicas", "want integer"}},
		{"wrong type of a switch", []string{"provisioner.enabled=yes"}, true, []string{"/provisioner/enabled", "want boolean"}},
		{"negative replicas", []string{"workers.v100.replicas=-1"}, true, []string{"/workers/v100/replicas", "minimum"}},
		{"unknown worker image", []string{"workers.p100.image=full"}, true, []string{"/workers/p100/image", "'mdag', 'lean'"}},
		{"digest not sha256", []string{"images.mdag.digest=md5:0123"}, true, []string{"/images/mdag/digest"}},
		{"worker key not a name", []string{"workers.P100_x.type=P100"}, true, []string{"/workers", "P100_x"}},
		{"tag latest", []string{"images.mdag.digest=", "images.mdag.tag=latest"}, false, []string{"images.mdag.tag is latest"}},
		{"no tag, no digest", []string{"images.torchRunner.digest=", "images.torchRunner.tag="}, false, []string{"images.torchRunner: no tag and no digest"}},
		{"tag latest of the lean image, used", []string{"workers.cpu.image=lean", "images.lean.digest=", "images.lean.tag=latest"}, false, []string{"images.lean.tag is latest"}},
		{"GPU model without a node label value", []string{"workers.p100.gpu=A100"}, false, []string{"workers.p100.gpu", "A100", "gpuNodePools.labelValues"}},
		{"type not the key", []string{"workers.p100.type=V100"}, false, []string{"workers.p100.type", "V100"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			vals, err := chartValues{set: tc.set}.values()
			if err != nil {
				t.Fatal(err)
			}
			_, err = renderValues(t, vals)
			if err == nil {
				t.Fatalf("--set %v rendered; want an error with %q", tc.set, tc.want)
			}
			if got := errors.Is(err, errSchema); got != tc.schema {
				t.Errorf("refused by the schema: %v, want %v: %v", got, tc.schema, err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q\nwant it to contain %q", err, w)
				}
			}
		})
	}
	// the lean image's tag is not checked where no worker uses it
	vals, err := chartValues{set: []string{"images.lean.tag=latest"}}.values()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := renderValues(t, vals); err != nil {
		t.Errorf("images.lean.tag=latest with no lean worker: %v, want no error", err)
	}
}

// TestChartTemplatesRender: every template of the chart makes an object in
// some rendering above (none is dead), and NOTES.txt renders in each,
// warning about Pod Security where the chart does not make the namespace.
func TestChartTemplatesRender(t *testing.T) {
	made := map[string]bool{}
	for _, tc := range chartCases {
		r := renderChart(t, tc.values)
		for name, out := range r.files {
			if strings.Contains(out, "\nkind: ") || strings.HasPrefix(out, "kind: ") {
				made[path.Base(name)] = true
			}
		}
		if strings.TrimSpace(r.notes) == "" {
			t.Errorf("%s: NOTES.txt renders empty", tc.values)
		}
	}
	// Without the Namespace, the notes warn that its Pod Security labels are
	// the user's (lookup finds no namespace here, as in a dry run).
	const psa = "Pod Security: namespace mdag does not say it enforces the restricted profile"
	if n := renderChart(t, chartValues{}).notes; !strings.Contains(n, psa) {
		t.Errorf("defaults: NOTES.txt does not warn %q:\n%s", psa, n)
	}
	if n := renderChart(t, chartCases[0].values).notes; strings.Contains(n, psa) {
		t.Errorf("%s: NOTES.txt warns %q, but the chart makes the namespace:\n%s", chartCases[0].values, psa, n)
	}
	// Chart.yaml's kubeVersion: Pod Security Admission is in 1.25 and later
	kv := loadChart(t).Metadata.KubeVersion
	for v, want := range map[string]bool{"v1.25.0": true, "v1.30.2": true, "v1.37.0": true, "v1.24.9": false} {
		if got := chartutil.IsCompatibleRange(kv, v); got != want {
			t.Errorf("Chart.yaml kubeVersion %q admits %s: %v, want %v", kv, v, got, want)
		}
	}
	entries, err := os.ReadDir(filepath.Join(chartDir, "templates"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		n := e.Name()
		if strings.HasPrefix(n, "_") || n == "NOTES.txt" {
			continue
		}
		if !made[n] {
			t.Errorf("templates/%s makes no object in any rendering (%d renderings)", n, len(chartCases))
		}
	}
}

// TestChartValuesUsed: every value of values.yaml changes what the chart
// renders (or makes it fail) when changed: none is dead. Each leaf (a
// scalar, a list, an empty map) is changed in turn, with every optional part
// on so that its values are rendered (the CPU workers on the lean image).
func TestChartValuesUsed(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var defaults map[string]any
	if err := yaml.Unmarshal(data, &defaults); err != nil {
		t.Fatal(err)
	}
	base := deepCopy(defaults).(map[string]any)
	// The images by tag: with the digests make images pins, the tags are
	// unused (a digest wins), and the digests are checked below.
	for _, s := range []string{"namespace.create=true", "provisioner.enabled=true", "monitoring.enabled=true", "workers.cpu.image=lean",
		"images.mdag.digest=", "images.lean.digest=", "images.torchRunner.digest="} {
		if err := strvals.ParseInto(s, base); err != nil {
			t.Fatal(err)
		}
	}
	want, err := renderValues(t, base)
	if err != nil {
		t.Fatal(err)
	}
	// changes where appending x would not pass the schema
	special := map[string]any{
		"images.mdag.digest":                      "sha256:" + strings.Repeat("0", 64),
		"images.lean.digest":                      "sha256:" + strings.Repeat("0", 64),
		"images.torchRunner.digest":               "sha256:" + strings.Repeat("0", 64),
		"workers.p100.image":                      "lean",
		"workers.v100.image":                      "lean",
		"workers.cpu.image":                       "mdag",
		"workers.cpu.gpu":                         "P100",
		"monitoring.serviceMonitor.interval":      "30s",
		"monitoring.serviceMonitor.scrapeTimeout": "5s",
	}
	var leaves [][]string
	var walk func(p []string, v any)
	walk = func(p []string, v any) {
		if m, ok := v.(map[string]any); ok && len(m) > 0 {
			for _, k := range slices.Sorted(maps.Keys(m)) {
				walk(append(slices.Clone(p), k), m[k])
			}
			return
		}
		leaves = append(leaves, p)
	}
	walk(nil, defaults)
	sort.Slice(leaves, func(i, j int) bool { return strings.Join(leaves[i], ".") < strings.Join(leaves[j], ".") })
	// the renderings run side by side (a few ms each, many more with -race)
	type result struct {
		name         string
		old, changed any
		got          map[string]string
		err          error
	}
	results := make([]result, len(leaves))
	sem := make(chan struct{}, runtime.GOMAXPROCS(0))
	var wg sync.WaitGroup
	for i, p := range leaves {
		name := strings.Join(p, ".")
		vals := deepCopy(base).(map[string]any)
		parent := vals
		for _, k := range p[:len(p)-1] {
			parent = parent[k].(map[string]any)
		}
		old := lookupPath(base, p)
		var changed any
		switch v := old.(type) {
		case bool:
			changed = !v
		case string:
			changed = v + "x"
			if v == "" {
				changed = "x"
			}
		case float64:
			changed = v + 1
		case int64:
			changed = v + 1
		case []any:
			changed = append(slices.Clone(v), "--x")
		case map[string]any: // empty
			changed = map[string]any{"x": "y"}
		default:
			t.Errorf("%s: a %T: no change known", name, old)
			continue
		}
		if s, ok := special[name]; ok {
			changed = s
		}
		parent[p[len(p)-1]] = changed
		results[i] = result{name: name, old: old, changed: changed}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			results[i].got, results[i].err = renderValues(t, vals)
		}()
	}
	wg.Wait()
	for _, r := range results {
		switch {
		case r.name == "":
			// no change known: said above
		case errors.Is(r.err, errSchema):
			t.Errorf("%s: changed to %v, refused by the schema (give the test a change that passes it): %v", r.name, r.changed, r.err)
		case r.err != nil:
			// a template read it and refused it: used
		case maps.Equal(r.got, want):
			t.Errorf("%s: changing it from %v to %v changes nothing the chart renders: a dead value", r.name, r.old, r.changed)
		}
	}
	if len(leaves) < 40 {
		t.Errorf("only %d values found in values.yaml: is the walk broken?", len(leaves))
	}
}

func lookupPath(m map[string]any, p []string) any {
	var v any = m
	for _, k := range p {
		v = v.(map[string]any)[k]
	}
	return v
}

func deepCopy(v any) any {
	switch x := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = deepCopy(e)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = deepCopy(e)
		}
		return out
	}
	return v
}

// chartImage is the image the chart's values.yaml names for key (mdag,
// lean, torchRunner): repository@digest when make images pinned a digest,
// else repository:tag.
func chartImage(t *testing.T, key string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		Images map[string]struct{ Repository, Tag, Digest string }
	}
	if err := yaml.Unmarshal(data, &v); err != nil {
		t.Fatal(err)
	}
	im, ok := v.Images[key]
	if !ok {
		t.Fatalf("values.yaml: no images.%s", key)
	}
	if im.Digest != "" {
		return im.Repository + "@" + im.Digest
	}
	return im.Repository + ":" + im.Tag
}

// TestPinnedImagesAgree: the kustomize base and the chart's values name
// the same build of each image (make images pins both): one pinned by hand
// or by a partial pin in one place only fails here.
func TestPinnedImagesAgree(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(kubeDir, "base", "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var k kustomization
	if err := yaml.UnmarshalStrict(b, &k); err != nil {
		t.Fatal(err)
	}
	keys := map[string]string{"mdag": "mdag", "mdag-torch-runner": "torchRunner"}
	for _, im := range k.Images {
		key, ok := keys[im.Name]
		if !ok {
			t.Errorf("kustomization image %s: not an image the chart names", im.Name)
			continue
		}
		want := im.NewName + ":" + im.NewTag
		if im.Digest != "" {
			want = im.NewName + "@" + im.Digest
		}
		if got := chartImage(t, key); got != want {
			t.Errorf("image %s: the chart's values name %s, the kustomize base %s: pin both (make images)", im.Name, got, want)
		}
	}
}
