package layering

import (
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"testing"
)

const module = "github.com/mdag/mdag/"

// pure packages reach none of the native edges, through any path.
var pure = []string{
	"media", "modules", "dag", "profile", "allocator", "placement", "placement/squishy",
	"scheduler", "scheduler/sim", "gpu", "gpu/decode", "gpu/registry", "gpu/prep", "gpu/queue", "gpu/kserve", "worker", "coordinator",
	// beyond the list: what the lean worker and the observers need
	"ingest", "ingest/synth", "ingest/audiofile", "remote/wire", "remote/client", "remote/source", "internal/pki", "observe/metrics",
	"profile/serf", "profile/measure", "coordinator/store", "coordinator/why", "coordinator/kube", "eval/plot",
	"egress",
	"clips",
}

// native are the import paths (prefixes) that link native code at the edges.
// (onnxruntime_go links no library, it dlopens ONNX Runtime, but it is cgo
// and an edge all the same: only gpu/onnx and the binary reach it.)
var native = []string{"gocv.io/x/gocv", "github.com/draffensperger/golp", "github.com/pion/", module + "ingest/vpx", module + "ingest/avc", module + "ingest/opus", module + "internal/lpsolve",
	"github.com/yalue/onnxruntime_go", module + "gpu/onnx"}

// allowed lists, per package, the mdag packages it may import (tests
// excluded). The floor (media, internal/clock, internal/yamlx) imports
// nothing of mdag's; each line above it names what lies below it.
var allowed = map[string][]string{
	"api":                   {},
	"media":                 {},
	"internal/clock":        {},
	"internal/clocktest":    {"internal/clock"},
	"internal/yamlx":        {},
	"internal/defaults":     {},
	"internal/lpsolve":      {},
	"internal/browsertest":  {},
	"internal/layering":     {},
	"internal/pki":          {},
	"internal/auth":         {"internal/clock", "internal/yamlx"},
	"internal/unixsock":     {},
	"internal/h2test":       {},
	"internal/testproc":     {},
	"internal/readmecheck":  {},
	"internal/brokertest":   {},
	"ingest":                {},
	"ingest/audiofile":      {"media"},
	"modules":               {"media"},
	"dag":                   {"modules", "internal/yamlx"},
	"profile":               {"dag", "internal/yamlx"},
	"profile/serf":          {"profile"},
	"profile/measure":       {"gpu", "media", "profile", "profile/serf"},
	"examples":              {"dag", "profile"},
	"examples/internal/zoo": {"dag", "modules"},
	"allocator":             {"dag", "profile"},
	"allocator/milp":        {"allocator", "internal/lpsolve"},
	"placement":             {"allocator", "dag", "modules", "profile"},
	"placement/squishy":     {"profile"},
	"placement/partition":   {"profile"},
	"placement/spec":        {"dag", "internal/yamlx", "placement", "placement/partition", "placement/squishy", "profile"},
	"scheduler":             {"placement/squishy"},
	"scheduler/sim":         {"internal/yamlx", "profile", "scheduler"},
	"gpu":                   {"internal/clock", "media"},
	"gpu/decode":            {"media"},
	"gpu/registry":          {"gpu/decode", "internal/yamlx"},
	"gpu/prep":              {"gpu/registry", "media"},
	"gpu/kserve":            {"api/kserve", "gpu", "gpu/decode", "gpu/prep", "gpu/queue", "gpu/registry", "internal/clock", "internal/unixsock", "media"},
	"gpu/queue":             {},
	"api/kserve":            {},
	"runners/torch":         {},
	"deploy":                {},
	// make images: the image builder (go-containerregistry), none of mdag's packages
	"tools/mkimage": {},
	// the coordinator's load generator (tools/coordinator-capacity.sh): the wire, as a worker speaks it
	"tools/coordload":   {"api", "remote/client", "remote/wire"},
	"worker":            {"dag", "gpu", "gpu/queue", "internal/clock", "media", "modules"},
	"coordinator":       {"allocator", "coordinator/why", "dag", "gpu", "internal/defaults", "internal/clock", "media", "modules", "placement", "profile", "scheduler", "worker"},
	"coordinator/store": {"coordinator"},
	"coordinator/kube":  {"coordinator", "internal/clock", "internal/defaults", "internal/pki", "profile", "worker"},
	"remote/wire":       {"api", "dag", "media", "worker"},
	"remote":            {"api", "coordinator", "dag", "internal/auth", "internal/clock", "internal/defaults", "internal/pki", "profile", "remote/wire", "worker"},
	"remote/client":     {"api", "gpu", "internal/clock", "internal/defaults", "internal/pki", "internal/unixsock", "media", "modules", "remote/wire", "worker"},
	"remote/source":     {"api", "ingest/synth", "internal/clock", "internal/defaults", "media", "remote/wire"},
	"ingest/synth":      {"internal/clock", "media"},
	"observe/metrics":   {"coordinator/why", "ingest"},
	"coordinator/why":   {},
	"internal/testapps": {"dag", "profile"},
	"observe/dashboard": {"coordinator", "ingest", "internal/auth", "internal/clock", "media", "outputs"},
	"eval/plot":         {},
	"outputs":           {"internal/clock", "media", "outputs/spool"},
	"outputs/spool":     {},
	// annotated video out: the pure ring and drawing, and its WHEP edge
	"egress": {"internal/clock", "media"},
	// event clips: the encoder is handed in (ingest/avc's, by the binary)
	"clips": {"dag", "internal/clock", "media", "outputs"},
	// the allocator ablation links lp_solve through allocator/milp
	"eval/alloccmp": {"allocator", "allocator/milp", "dag", "eval/plot", "examples", "profile"},
	// mdag eval: the coordinator in virtual time (links lp_solve through allocator/milp)
	"eval": {"allocator", "allocator/milp", "coordinator", "coordinator/why", "dag", "eval/plot", "examples", "gpu", "internal/clock", "media", "modules", "profile", "scheduler", "worker"},
	// the native edges
	"modules/cv":  {"media", "modules"},
	"gpu/opencv":  {"gpu", "gpu/decode", "media", "modules/cv"},
	"gpu/onnx":    {"gpu/decode", "gpu/prep", "gpu/queue", "gpu/registry", "media"},
	"gpu/nvml":    {},
	"ingest/vpx":  {"media"},
	"ingest/avc":  {"media"},
	"ingest/opus": {"media"},
	"ingest/whip": {"dag", "ingest", "ingest/avc", "ingest/opus", "ingest/vpx", "internal/auth", "internal/clock", "internal/defaults", "media"},
	"egress/whep": {"egress", "ingest/vpx", "internal/clock", "media"},
	"ingest/rtsp": {"ingest", "internal/clock", "internal/yamlx"},
	// output transports (the runner, in outputs, drives them)
	"outputs/mqtt":    {"outputs"},
	"outputs/nats":    {"outputs"},
	"outputs/webhook": {"outputs"},
	// the binary wires everything
	"cmd/mdag": nil,
}

type pkg struct {
	ImportPath string
	Imports    []string
	Deps       []string
}

// list runs `go list -json` with args from the module root.
func list(t *testing.T, args ...string) []pkg {
	t.Helper()
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	cmd := exec.Command(goBin, append([]string{"list", "-json"}, args...)...)
	cmd.Dir = "../.."
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("go list %v: %v\n%s", args, err, ee.Stderr)
		}
		t.Fatalf("go list %v: %v", args, err)
	}
	var pkgs []pkg
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p pkg
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

// TestPureReachNoNative: no pure package reaches gocv, golp, pion,
// ingest/vpx, ingest/avc or internal/lpsolve, in the full build and in the lean one.
func TestPureReachNoNative(t *testing.T) {
	if testing.Short() {
		t.Skip("go list over the module")
	}
	for _, tags := range []string{"", "lean"} {
		args := []string{"-deps=false", "-tags", tags}
		for _, p := range pure {
			args = append(args, "./"+p)
		}
		for _, p := range list(t, args...) {
			for _, d := range p.Deps {
				for _, n := range native {
					if strings.HasPrefix(d, n) {
						t.Errorf("%s (tags %q) reaches %s: the pure layers must not link native code (docs/ARCHITECTURE.md)", strings.TrimPrefix(p.ImportPath, module), tags, d)
					}
				}
			}
		}
	}
}

// TestAllowedEdges: every import between mdag's packages is in the table,
// and every package has a line.
func TestAllowedEdges(t *testing.T) {
	if testing.Short() {
		t.Skip("go list over the module")
	}
	seen := map[string]bool{}
	for _, p := range list(t, "./...") {
		name := strings.TrimPrefix(p.ImportPath, module)
		seen[name] = true
		ok, listed := allowed[name]
		if !listed {
			t.Errorf("%s has no line in the allowed-edge table (internal/layering): add one naming what it may import", name)
			continue
		}
		if ok == nil { // the binary
			continue
		}
		for _, imp := range p.Imports {
			if !strings.HasPrefix(imp, module) {
				continue
			}
			dep := strings.TrimPrefix(imp, module)
			if !slices.Contains(ok, dep) {
				t.Errorf("%s imports %s: not an allowed edge (allowed: %s); a lower layer must not reach up", name, dep, strings.Join(ok, ", "))
			}
		}
	}
	var stale []string
	for name := range allowed {
		if !seen[name] {
			stale = append(stale, name)
		}
	}
	sort.Strings(stale)
	if len(stale) > 0 {
		t.Errorf("the table lists packages that do not exist: %v", stale)
	}
}
