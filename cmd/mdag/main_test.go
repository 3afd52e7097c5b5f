package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// solveTimeRE masks measured solve times, the only nondeterministic output.
var solveTimeRE = regexp.MustCompile(`"solve_ms":[0-9.e+-]+`)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

type cliCase struct {
	name string
	args string
}

var validateCases = []cliCase{
	{"scrooge-example", "validate -f examples/scrooge-example/app.yaml --profiles examples/scrooge-example/profiles.yaml"},
	{"scrooge-example-json", "validate -f examples/scrooge-example/app.yaml --profiles examples/scrooge-example/profiles.yaml -o json"},
	{"traffic-no-profiles", "validate -f examples/traffic/app.yaml --rate 20"},
	{"traffic-slow-stream-infeasible", "validate -f examples/traffic/app.yaml --profiles examples/traffic/profiles.yaml --rate 5"},
	{"traffic-one-stream", "validate -f examples/traffic/app.yaml --profiles examples/traffic/profiles.yaml"},
	{"cyclic", "validate -f cmd/mdag/testdata/cyclic.yaml"},
	{"broken", "validate -f cmd/mdag/testdata/broken.yaml"},
	{"bad-params", "validate -f cmd/mdag/testdata/bad-params.yaml"},
	{"bad-profiles", "validate -f examples/traffic/app.yaml --profiles cmd/mdag/testdata/bad-profiles.yaml"},
	{"missing-file", "validate -f nowhere.yaml"},
	{"no-flags", "validate"},
	{"bad-streams", "validate -f examples/traffic/app.yaml --streams 0"},
	{"unknown-command", "frobnicate"},
	{"help", "help"},
	{"allocate-scrooge", "allocate -f examples/scrooge-example/app.yaml --profiles examples/scrooge-example/profiles.yaml"},
	{"allocate-scrooge-json", "allocate -f examples/scrooge-example/app.yaml --profiles examples/scrooge-example/profiles.yaml -o json"},
	{"allocate-scrooge-even", "allocate -f examples/scrooge-example/app.yaml --profiles examples/scrooge-example/profiles.yaml --method even"},
	{"allocate-scrooge-no-y", "allocate -f examples/scrooge-example/app.yaml --profiles examples/scrooge-example/profiles.yaml --exclude-worker Y"},
	{"allocate-traffic", "allocate -f examples/traffic/app.yaml --profiles examples/traffic/profiles.yaml --streams 12"},
	{"allocate-traffic-scaled-ballooned", "allocate -f examples/traffic/app.yaml --profiles examples/traffic/profiles.yaml --rate 120 --scale crop-vehicles=8 --balloon detect=1.5"},
	{"allocate-actdet-nexus-dp", "allocate -f examples/actdet/app.yaml --profiles examples/actdet/profiles.yaml --streams 12 --method nexus-dp"},
	{"allocate-infeasible-json", "allocate -f examples/traffic/app.yaml --profiles examples/traffic/profiles.yaml --rate 5 -o json"},
	{"allocate-bad-scale", "allocate -f examples/traffic/app.yaml --profiles examples/traffic/profiles.yaml --scale detector=2"},
	{"allocate-bad-flag", "allocate -f examples/traffic/app.yaml --profiles examples/traffic/profiles.yaml --scale detect"},
	{"allocate-bad-method", "allocate -f examples/traffic/app.yaml --profiles examples/traffic/profiles.yaml --method simplex"},
	{"allocate-no-profiles", "allocate -f examples/traffic/app.yaml"},
	{"place-scrooge", "place -f examples/scrooge-example/app.yaml --profiles examples/scrooge-example/profiles.yaml"},
	{"place-scrooge-cluster", "place -f examples/scrooge-example/app.yaml --profiles examples/scrooge-example/profiles.yaml --cluster examples/placement/cluster.yaml"},
	{"place-scrooge-short", "place -f examples/scrooge-example/app.yaml --profiles examples/scrooge-example/profiles.yaml --cluster examples/placement/cluster-short.yaml"},
	{"place-traffic-json", "place -f examples/traffic/app.yaml --profiles examples/traffic/profiles.yaml --streams 12 -o json"},
	{"place-bad-cluster", "place -f examples/scrooge-example/app.yaml --profiles examples/scrooge-example/profiles.yaml --cluster cmd/mdag/testdata/bad-cluster.yaml"},
	{"pack-nexus-table2", "pack -f examples/placement/nexus-table2.yaml"},
	{"pack-nexus-table2-json", "pack -f examples/placement/nexus-table2.yaml -o json"},
	{"pack-symphony-zoo", "pack -f examples/placement/symphony-zoo.yaml"},
	{"pack-bad-sessions", "pack -f cmd/mdag/testdata/bad-sessions.yaml"},
	{"serve-no-app", "serve"},
	{"serve-broken-app", "serve -f cmd/mdag/testdata/broken.yaml -p examples/traffic/profiles.yaml"},
	{"coordinator-broken-app", "coordinator -f cmd/mdag/testdata/broken.yaml -p examples/traffic/profiles.yaml"},
	{"serve-both", "serve --example traffic -f examples/traffic/app.yaml"},
	{"serve-unknown-example", "serve --example nope"},
	{"serve-bad-workers", "serve --example traffic --workers A100=2"},
	{"serve-bad-policy", "serve --example traffic --policy fifo"},
	// No serve-unimplemented-op case: since issue 23 the full build implements
	// every declared op (the lean build's refusal of OpenCV's is in
	// edges_lean_test.go).
	{"status-bad-output", "status -o yaml"},
	{"partition-symphony", "partition -f examples/placement/symphony-models.yaml --subclusters 3"},
	{"partition-symphony-json", "partition -f examples/placement/symphony-models.yaml --subclusters 2 -o json"},
	{"partition-bad-models", "partition -f cmd/mdag/testdata/bad-models.yaml --subclusters 2"},
	{"sim-resnet50", "sim -f examples/sim/resnet50-8gpu.yaml --rate 4000"},
	{"sim-resnet50-nexus-json", "sim -f examples/sim/resnet50-8gpu.yaml --policy nexus --rate 4000 -o json"},
	{"sim-mixed", "sim -f examples/sim/mixed.yaml --policy clockwork"},
	{"sim-bad-policy", "sim -f examples/sim/resnet50-8gpu.yaml --policy fifo"},
	{"sim-hindsight-mixed", "sim -f examples/sim/mixed.yaml --policy hindsight"},
}

func init() {
	for _, ex := range []string{"traffic", "face", "tracker", "pose", "caption", "audio", "actdet", "nexus-traffic", "nexus-game"} {
		validateCases = append(validateCases, cliCase{"example-" + ex,
			fmt.Sprintf("validate -f examples/%s/app.yaml --profiles examples/%s/profiles.yaml --streams 12", ex, ex)})
	}
	// The real models' registry checks the files `make models` builds: with
	// them (or in make test, which builds them first) only.
	if _, err := os.Stat("../../build/models/blazeface-front-128.onnx"); err == nil || os.Getenv("MDAG_REQUIRE_MODELS") != "" {
		validateCases = append(validateCases,
			cliCase{"models-examples", "validate --models examples/models.yaml"},
			cliCase{"example-face-live", "validate -f examples/face-live/app.yaml --profiles examples/face-live/profiles.yaml --models examples/models.yaml --streams 12"})
	}
}

// TestCLIGolden runs each command line in-process from the repository root
// and compares exit code, stdout and stderr with testdata/validate/NAME.golden.
func TestCLIGolden(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	golden, _ := filepath.Abs("testdata/validate")
	t.Chdir(root)
	for _, tc := range validateCases {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(strings.Fields(tc.args), &stdout, &stderr)
			out := solveTimeRE.ReplaceAllString(stdout.String(), `"solve_ms":X`)
			stdout.Reset()
			stdout.WriteString(out)
			got := fmt.Sprintf("$ mdag %s\nexit %d\n--- stdout\n%s--- stderr\n%s", tc.args, code, stdout.String(), stderr.String())
			path := filepath.Join(golden, tc.name+".golden")
			if *update {
				if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run go test ./cmd/mdag -update and review the diff)", err)
			}
			if diff := cmp.Diff(string(want), got); diff != "" {
				t.Errorf("output differs from %s (-want +got):\n%s", path, diff)
			}
		})
	}
}

// TestExitCodes pins the exit-code contract independently of the goldens.
func TestExitCodes(t *testing.T) {
	t.Chdir("../..")
	for args, want := range map[string]int{
		"validate -f examples/face/app.yaml --profiles examples/face/profiles.yaml --streams 12":   exitOK,
		"validate -f examples/traffic/app.yaml --profiles examples/traffic/profiles.yaml --rate 5": exitInfeasible,
		"validate -f cmd/mdag/testdata/cyclic.yaml":                                                exitInvalid,
		"validate -f examples/face/app.yaml -o yaml":                                               exitInvalid,
		"version": exitOK,
	} {
		var out bytes.Buffer
		if got := run(strings.Fields(args), &out, &out); got != want {
			t.Errorf("mdag %s: exit %d, want %d\n%s", args, got, want, out.String())
		}
	}
}
