package main

import (
	"errors"
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

const evalSynopsis = "[--short] [--duration 1000s] [--seed N] [--apps traffic,face,tracker] [--ablations] [--check] [--report FILE --figures DIR] [-o table|json]"

func runEval(args []string, stdout, stderr io.Writer) int {
	return execute("eval", evalSynopsis, new(evalCmd), args, stdout, stderr)
}

// evalCmd is mdag eval's options.
type evalCmd struct {
	short, ablations, check bool
	duration                time.Duration
	clients, parallel       int
	seed                    uint64
	apps, nexusGPUs         string
	report, figures, out    string
	suite                   eval.SuiteConfig // built by validate
}

func (c *evalCmd) flags(fs *flag.FlagSet) {
	fs.BoolVar(&c.short, "short", false, "the CI run: 120 s of virtual time, and --check")
	fs.DurationVar(&c.duration, "duration", 1000*time.Second, "virtual `time` of each run (Scrooge: 1000 s)")
	fs.IntVar(&c.clients, "clients", 12, "clients per app (Scrooge: 12)")
	fs.Uint64Var(&c.seed, "seed", 1, "`seed` of the workloads (the same seed gives the same results)")
	fs.StringVar(&c.apps, "apps", "traffic,face,tracker", "comma-separated `apps` to compare (of traffic, face, tracker)")
	fs.StringVar(&c.nexusGPUs, "nexus-gpus", "P100,V100", "comma-separated GPU `types` the Nexus-style system is tried on, one at a time")
	fs.BoolVar(&c.ablations, "ablations", false, "also run the ablations: spatial multiplexing off, turn-off delay 0/120 s, SLO 1000 ms, the objects-per-frame jump, MILP vs greedy vs brute force")
	fs.BoolVar(&c.check, "check", false, "exit 1 unless mdag finishes at least as many frames as every Nexus-style variant and costs no more than any that finishes comparably")
	fs.StringVar(&c.report, "report", "", "write the results as Markdown to `file` (docs/evaluation.md)")
	fs.StringVar(&c.figures, "figures", "", "write the SVG figures into `dir` (linked from --report relative to it)")
	fs.StringVar(&c.out, "o", "table", "output `format`: table or json")
	fs.IntVar(&c.parallel, "parallel", 0, "runs at once (default: the cores); results do not depend on it")
}

func (c *evalCmd) validate(fs *flag.FlagSet) []error {
	if c.short {
		if !flagGiven(fs, "duration") {
			c.duration = 120 * time.Second
		}
		c.check = true
	}
	var errs []error
	if c.duration < 10*time.Second || c.duration > 24*time.Hour {
		errs = append(errs, fmt.Errorf("--duration %v: want 10s..24h", c.duration))
	}
	if c.clients < 1 || c.clients > 1000 {
		errs = append(errs, fmt.Errorf("--clients %d: want 1..1000", c.clients))
	}
	if c.out != "table" && c.out != "json" {
		errs = append(errs, fmt.Errorf("-o %q: want table or json", c.out))
	}
	if c.parallel < 0 {
		errs = append(errs, fmt.Errorf("--parallel %d: want >= 0", c.parallel))
	}
	c.suite = eval.SuiteConfig{Duration: c.duration, Clients: c.clients, Seed: c.seed, Ablations: c.ablations, Parallel: c.parallel}
	for _, a := range splitList(c.apps) {
		if _, err := eval.Setup(a); err != nil {
			errs = append(errs, fmt.Errorf("--apps: %w", err))
			continue
		}
		c.suite.Apps = append(c.suite.Apps, a)
	}
	for _, g := range splitList(c.nexusGPUs) {
		c.suite.NexusGPUs = append(c.suite.NexusGPUs, profile.WorkerTypeID(g))
	}
	if len(splitList(c.apps)) == 0 {
		errs = append(errs, errors.New("--apps needs at least one entry"))
	}
	if len(c.suite.NexusGPUs) == 0 {
		errs = append(errs, errors.New("--nexus-gpus needs at least one entry"))
	}
	return errs
}

func (c *evalCmd) run(env *cmdEnv) error {
	c.suite.Progress = func(done, total int, r *eval.Result) {
		fmt.Fprintf(env.stderr, "eval: %d/%d %s %s: finished %.2f%%, $%.3f (%v)\n", done, total, r.App, r.System, 100*r.FinishRate, r.Cost, r.Wall.Round(time.Millisecond))
	}
	s, err := eval.RunSuite(c.suite)
	if err != nil {
		return err
	}
	var alloc *alloccmp.Result
	if c.ablations {
		if alloc, err = alloccmp.Run(alloccmp.DefaultConfig()); err != nil {
			return fmt.Errorf("allocator ablation: %w", err)
		}
	}
	if err := c.write(env, s, alloc); err != nil {
		return err
	}
	c.print(env.stdout, s, alloc)
	if c.check {
		return c.checkResults(env, s)
	}
	return nil
}

// write writes the figures (--figures) and the report (--report).
func (c *evalCmd) write(env *cmdEnv, s *eval.Suite, alloc *alloccmp.Result) error {
	if c.figures != "" {
		if _, err := s.Figures(c.figures); err != nil {
			return fmt.Errorf("figures: %w", err)
		}
		if alloc != nil {
			if err := alloc.Plots(c.figures); err != nil {
				return fmt.Errorf("allocator figures: %w", err)
			}
		}
	}
	if c.report == "" {
		return nil
	}
	figRel := ""
	if c.figures != "" {
		if rel, err := filepath.Rel(filepath.Dir(c.report), c.figures); err == nil {
			figRel = filepath.ToSlash(rel)
		} else {
			figRel = c.figures
		}
	}
	allocMD := ""
	if alloc != nil {
		allocMD = alloc.Markdown()
	}
	doc := eval.Document(s, allocMD, figRel, "mdag eval "+strings.Join(env.args, " "))
	return os.WriteFile(c.report, []byte(doc), 0o644)
}

// print writes the results: a table, or one JSON document (-o json).
func (c *evalCmd) print(w io.Writer, s *eval.Suite, alloc *alloccmp.Result) {
	if c.out != "json" {
		fmt.Fprint(w, s.Table())
		fmt.Fprintf(w, "%d runs of %v virtual in %v\n", s.Runs(), c.suite.Duration, s.Wall.Round(time.Millisecond))
		return
	}
	violations := s.Check()
	if violations == nil {
		violations = []string{} // [] in the JSON: checked, none
	}
	writeJSON(w, struct {
		*eval.Suite
		Allocators *alloccmp.Result `json:"allocators,omitempty"`
		Violations []string         `json:"violations"`
	}{s, alloc, violations}, true)
}

// checkResults holds the results to the direction Scrooge reports (--check).
func (c *evalCmd) checkResults(env *cmdEnv, s *eval.Suite) error {
	if v := s.Check(); len(v) > 0 {
		fmt.Fprintln(env.stderr, "mdag eval: the results contradict the direction Scrooge reports:")
		for _, x := range v {
			fmt.Fprintln(env.stderr, "  "+x)
		}
		return reported(exitFailure)
	}
	msg := "check: mdag finishes at least as many frames as every Nexus-style variant, and costs no more than any that finishes comparably"
	if c.out == "json" {
		fmt.Fprintln(env.stderr, msg) // stdout is the JSON document alone
	} else {
		fmt.Fprintln(env.stdout, msg)
	}
	return nil
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
