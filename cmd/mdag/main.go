// Command mdag serves media DAGs over live video and plans their resources.
//
// Subcommands are listed by `mdag help`. Exit codes: 0 success, 1 internal
// failure, 2 invalid input or usage, 3 valid input that cannot meet its SLO.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"sort"
	"strings"

	"github.com/mdag/mdag/gpu/onnx"
)

// Exit codes shared by every subcommand.
const (
	exitOK         = 0
	exitFailure    = 1
	exitInvalid    = 2
	exitInfeasible = 3
)

type command struct {
	name    string
	summary string
	run     func(args []string, stdout, stderr io.Writer) int
}

// commands are every build's commands and this build's edge commands
// (edgeCommands: demo and client, which need WebRTC and VP8, and trace,
// which needs OpenCV).
func commands() []command {
	return append([]command{
		{"validate", "check an app (and its profiles) and summarise its graph and feasibility", runValidate},
		{"allocate", "choose worker types, configurations and capacity per module at least cost (Scrooge MILP)", runAllocate},
		{"place", "allocate, then place onto instances: full and partial, best fit, warm reuse, fewest moves", runPlace},
		{"models", "inspect an ONNX model: its inputs, outputs, opset and metadata, and a proposed registry entry", runModels},
		{"try", "run one registry model on an image or a video's first frames: what it found as JSON, drawn on a PNG", runTry},
		{"profile", "measure a model on an executor (batch x concurrency, or SERF for CPU workers) and write its profile", runProfile},
		{"pack", "pack model sessions onto GPUs with Nexus's squishy bin packing", runPack},
		{"partition", "split models over sub-clusters balancing rate and memory (Symphony MILP)", runPartition},
		{"serve", "run apps live in one process: coordinator, GPU scheduler, in-process workers (emulated GPUs)", runServe},
		{"coordinator", "run the coordinator alone: workers (mdag worker) and sources (mdag source) connect over gRPC", runCoordinator},
		{"infer-server", "serve the Open Inference Protocol (KServe v2 / Triton gRPC) over the onnx or the emulated executor", runInferServer},
		{"worker", "run a worker that connects to a coordinator and executes the modules it is given", runWorker},
		{"source", "stream synthetic cameras (moving shapes) into a coordinator over gRPC", runSource},
		{"certs", "create the CA and the certificates of mutual TLS on gRPC (coordinator, workers, sources)", runCerts},
		{"token", "make a bearer token for WHIP ingest or the HTTP API and its --tokens file entry (stored hashed)", runToken},
		{"status", "show a running server's sessions, finish rate, modules, instances and re-plans", runStatus},
		{"sim", "simulate the batch scheduler on emulated GPUs: goodput, bad rate, latency, batches", runSim},
		{"eval", "reproduce Scrooge's evaluation in virtual time: mdag against a Nexus-style system, ablations, plots", runEval},
		{"version", "print the version and the build (full or lean)", runVersion},
	}, edgeCommands()...)
}

var version = "dev"

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		if len(args) > 1 {
			return run([]string{args[1], "-h"}, stdout, stderr)
		}
		usage(stdout)
		if len(args) == 0 {
			return exitInvalid
		}
		return exitOK
	}
	for _, c := range commands() {
		if c.name == args[0] {
			return c.run(args[1:], stdout, stderr)
		}
	}
	fmt.Fprintf(stderr, "mdag: unknown command %q\n\n", args[0])
	usage(stderr)
	return exitInvalid
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "mdag serves media DAGs over live video at the lowest cost that meets their SLO.")
	fmt.Fprintln(w, "\nUsage: mdag <command> [flags]\n\nCommands:")
	cmds := commands()
	sort.Slice(cmds, func(i, j int) bool { return cmds[i].name < cmds[j].name })
	for _, c := range cmds {
		fmt.Fprintf(w, "  %-10s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w, "\nRun 'mdag help <command>' for its flags.")
}

func runVersion(args []string, stdout, stderr io.Writer) int {
	return execute("version", "", new(versionCmd), args, stdout, stderr)
}

// versionCmd is mdag version: no options.
type versionCmd struct{}

func (versionCmd) flags(*flag.FlagSet)            {}
func (versionCmd) validate(*flag.FlagSet) []error { return nil }
func (versionCmd) run(env *cmdEnv) error          { writeVersion(env.stdout, readBuildInfo()); return nil }

// feature is one line of mdag version: what the binary has of a kind.
type feature struct{ name, has string }

// versionInfo is what the Go toolchain recorded of the build, and the
// source stamp the image build sets.
type versionInfo struct {
	goVersion, platform, tags, revision string
	modified                            bool
	source                              string // buildSource
}

// buildSource names the sources an image's binary was built from, set by
// the linker (make images: -ldflags "-X main.buildSource=src-HASH[+dirty]"):
// a hash of the tracked files that go into the binary (git ls-files -s
// without deploy/, docs/, the top-level *.md and *_test.go), so that a commit that
// only pins image digests in deploy/ builds the same binary. Images are
// built with -buildvcs=false, so this is their only stamp.
var buildSource string

func readBuildInfo() versionInfo {
	v := versionInfo{goVersion: runtime.Version(), platform: runtime.GOOS + "/" + runtime.GOARCH, source: buildSource}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return v
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "-tags":
			v.tags = s.Value
		case "vcs.revision":
			v.revision = s.Value
		case "vcs.modified":
			v.modified = s.Value == "true"
		}
	}
	return v
}

// writeVersion prints the version, the build and what this binary has:
// every line read from what is compiled in (the build's edges, the
// executors, the CPU ops), so it cannot go stale.
func writeVersion(w io.Writer, v versionInfo) {
	build := v.goVersion + " " + v.platform
	if v.tags != "" {
		build += ", tags " + v.tags
	}
	if v.revision != "" {
		rev := v.revision[:min(12, len(v.revision))]
		if v.modified {
			rev += " (modified)"
		}
		build += ", commit " + rev
	}
	if v.source != "" {
		build += ", source " + v.source
	}
	fmt.Fprintf(w, "mdag %s (%s build: %s)\n", version, buildName, build)
	lines := append(edgeFeatures(),
		feature{"executors", commaList(append([]string{"emulated", "onnx (ONNX Runtime, opened at run time: " + ortLib() + ")", "kserve (Open Inference Protocol over gRPC)"}, executors...))},
		feature{"cpu ops", commaList(ops().Implemented())},
		feature{"sources", "mdag source (gRPC), serve --synthetic"})
	for _, f := range lines {
		fmt.Fprintf(w, "  %-10s %s\n", f.name, f.has)
	}
}

// ortLib is the ONNX Runtime library the onnx executor opens by default
// and whether it is there.
func ortLib() string {
	p := onnx.DefaultLib()
	if _, err := os.Stat(p); err != nil {
		return p + ", not found; make deps installs it"
	}
	return p
}

func commaList(s []string) string { return strings.Join(s, ", ") }

// newFlags makes a flag set that writes usage to stderr and whose errors the
// caller turns into exit codes.
func newFlags(name, synopsis string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: mdag %s %s\n\nFlags:\n", name, synopsis)
		printDefaults(fs)
	}
	return fs
}

// notInBuild is a flag value that refuses every value because its feature
// is not in this build (the lean build's WHIP flags); it says which.
type notInBuild interface{ notInBuild() string }

// printDefaults is fs.PrintDefaults, except that flags this build refuses
// (notInBuild) are named on one line after the others.
func printDefaults(fs *flag.FlagSet) {
	var refused []string
	var why string
	fs.VisitAll(func(f *flag.Flag) {
		if n, ok := f.Value.(notInBuild); ok {
			refused, why = append(refused, "-"+f.Name), n.notInBuild()
		}
	})
	if len(refused) == 0 {
		fs.PrintDefaults()
		return
	}
	shown := flag.NewFlagSet(fs.Name(), flag.ContinueOnError)
	shown.SetOutput(fs.Output())
	fs.VisitAll(func(f *flag.Flag) {
		if _, ok := f.Value.(notInBuild); !ok {
			shown.Var(f.Value, f.Name, f.Usage)
			shown.Lookup(f.Name).DefValue = f.DefValue
		}
	})
	shown.PrintDefaults()
	fmt.Fprintf(fs.Output(), "\n%s: %s\n", why, strings.Join(refused, " "))
}

// parseFlags parses args; it returns an exit code and false when the caller
// should stop (help asked for, or a usage error).
func parseFlags(fs *flag.FlagSet, args []string) (int, bool) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK, false
		}
		return exitInvalid, false
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(fs.Output(), "mdag %s: unexpected arguments: %s\n", fs.Name(), strings.Join(fs.Args(), " "))
		fs.Usage()
		return exitInvalid, false
	}
	return exitOK, true
}

// writeJSON writes v as one JSON document (indented when asked), without
// HTML escaping: paths read source->a->b, not source-\u003ea.
func writeJSON(w io.Writer, v any, indent bool) {
	enc := json.NewEncoder(w)
	if indent {
		enc.SetIndent("", "  ")
	}
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}
