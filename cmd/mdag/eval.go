package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/mdag/mdag/eval"
	"github.com/mdag/mdag/eval/alloccmp"
	"github.com/mdag/mdag/profile"
)

func runEval(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("eval", "[--short] [--duration 1000s] [--seed N] [--apps traffic,face,tracker] [--ablations] [--check] [--report FILE --figures DIR] [-o table|json]", stderr)
	short := fs.Bool("short", false, "the CI run: 120 s of virtual time, and --check")
	duration := fs.Duration("duration", 1000*time.Second, "virtual `time` of each run (Scrooge: 1000 s)")
	clients := fs.Int("clients", 12, "clients per app (Scrooge: 12)")
	seed := fs.Uint64("seed", 1, "`seed` of the workloads (the same seed gives the same results)")
	apps := fs.String("apps", "traffic,face,tracker", "comma-separated `apps` to compare (of traffic, face, tracker)")
	nexusGPUs := fs.String("nexus-gpus", "P100,V100", "comma-separated GPU `types` the Nexus-style system is tried on, one at a time")
	ablations := fs.Bool("ablations", false, "also run the ablations: spatial multiplexing off, turn-off delay 0/120 s, SLO 1000 ms, the objects-per-frame jump, MILP vs greedy vs brute force")
	check := fs.Bool("check", false, "exit 1 unless mdag finishes at least as many frames as every Nexus-style variant and costs no more than any that finishes comparably")
	report := fs.String("report", "", "write the results as Markdown to `file` (docs/evaluation.md)")
	figures := fs.String("figures", "", "write the SVG figures into `dir` (linked from --report relative to it)")
	out := fs.String("o", "table", "output `format`: table or json")
	parallel := fs.Int("parallel", 0, "runs at once (default: the cores); results do not depend on it")
	if code, ok := parseFlags(fs, args); !ok {
		return code
	}
	if *short {
		if !flagGiven(fs, "duration") {
			*duration = 120 * time.Second
		}
		*check = true
	}
	if *duration < 10*time.Second || *duration > 24*time.Hour || *clients < 1 || *clients > 1000 || *out != "table" && *out != "json" || *parallel < 0 {
		fmt.Fprintln(stderr, "mdag eval: --duration is 10s..24h, --clients 1..1000, -o table or json, --parallel >= 0")
		fs.Usage()
		return exitInvalid
	}
	cfg := eval.SuiteConfig{Duration: *duration, Clients: *clients, Seed: *seed, Ablations: *ablations, Parallel: *parallel,
		Progress: func(done, total int, r *eval.Result) {
			fmt.Fprintf(stderr, "eval: %d/%d %s %s: finished %.2f%%, $%.3f (%v)\n", done, total, r.App, r.System, 100*r.FinishRate, r.Cost, r.Wall.Round(time.Millisecond))
		}}
	for _, a := range splitList(*apps) {
		if _, err := eval.Setup(a); err != nil {
			fmt.Fprintln(stderr, "mdag eval: --apps:", err)
			return exitInvalid
		}
		cfg.Apps = append(cfg.Apps, a)
	}
	for _, g := range splitList(*nexusGPUs) {
		cfg.NexusGPUs = append(cfg.NexusGPUs, profile.WorkerTypeID(g))
	}
	if len(cfg.Apps) == 0 || len(cfg.NexusGPUs) == 0 {
		fmt.Fprintln(stderr, "mdag eval: --apps and --nexus-gpus need at least one entry each")
		return exitInvalid
	}
	s, err := eval.RunSuite(cfg)
	if err != nil {
		fmt.Fprintln(stderr, "mdag eval:", err)
		return exitFailure
	}
	var alloc *alloccmp.Result
	if *ablations {
		if alloc, err = alloccmp.Run(alloccmp.DefaultConfig()); err != nil {
			fmt.Fprintln(stderr, "mdag eval: allocator ablation:", err)
			return exitFailure
		}
	}
	if *figures != "" {
		if _, err := s.Figures(*figures); err != nil {
			fmt.Fprintln(stderr, "mdag eval: figures:", err)
			return exitFailure
		}
		if alloc != nil {
			if err := alloc.Plots(*figures); err != nil {
				fmt.Fprintln(stderr, "mdag eval: allocator figures:", err)
				return exitFailure
			}
		}
	}
	if *report != "" {
		figRel := ""
		if *figures != "" {
			if rel, err := filepath.Rel(filepath.Dir(*report), *figures); err == nil {
				figRel = filepath.ToSlash(rel)
			} else {
				figRel = *figures
			}
		}
		allocMD := ""
		if alloc != nil {
			allocMD = alloc.Markdown()
		}
		doc := eval.Document(s, allocMD, figRel, "mdag eval "+strings.Join(args, " "))
		if err := os.WriteFile(*report, []byte(doc), 0o644); err != nil {
			fmt.Fprintln(stderr, "mdag eval:", err)
			return exitFailure
		}
	}
	if *out == "json" {
		violations := s.Check()
		if violations == nil {
			violations = []string{} // [] in the JSON: checked, none
		}
		writeJSON(stdout, struct {
			*eval.Suite
			Allocators *alloccmp.Result `json:"allocators,omitempty"`
			Violations []string         `json:"violations"`
		}{s, alloc, violations}, true)
	} else {
		fmt.Fprint(stdout, s.Table())
		fmt.Fprintf(stdout, "%d runs of %v virtual in %v\n", s.Runs(), cfg.Duration, s.Wall.Round(time.Millisecond))
	}
	if *check {
		if v := s.Check(); len(v) > 0 {
			fmt.Fprintln(stderr, "mdag eval: the results contradict the direction Scrooge reports:")
			for _, x := range v {
				fmt.Fprintln(stderr, "  "+x)
			}
			return exitFailure
		}
		msg := "check: mdag finishes at least as many frames as every Nexus-style variant, and costs no more than any that finishes comparably"
		if *out == "json" {
			fmt.Fprintln(stderr, msg) // stdout is the JSON document alone
		} else {
			fmt.Fprintln(stdout, msg)
		}
	}
	return exitOK
}

// splitList splits a comma-separated flag, dropping empty entries.
func splitList(s string) []string {
	var out []string
	for _, x := range strings.Split(s, ",") {
		if x = strings.TrimSpace(x); x != "" {
			out = append(out, x)
		}
	}
	return out
}

// flagGiven says whether the command line set flag name.
func flagGiven(fs *flag.FlagSet, name string) bool {
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == name })
	return given
}
