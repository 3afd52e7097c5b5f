package deploy

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"testing"
)

// pendingFlags are flags the manifests use that this branch's mdag does not
// have yet, with who adds them: they parse as string flags until then.
// TestPendingFlags fails once the CLI has one, so the entry goes.
var pendingFlags = map[string]map[string]string{}

// cliFlags are one mdag command's flags as its -h lists them.
type cliFlags struct {
	cmd     string
	flags   map[string]bool // name -> a bool flag (takes no value)
	refused []string        // listed as refused by this (lean) build
	pending map[string]string
}

// parse parses args as the command would, returning the value of each flag
// given ("true" for a bool flag; the last of a repeated one).
func (f cliFlags) parse(args []string) (map[string]string, error) {
	fs := flag.NewFlagSet(f.cmd, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	for name, isBool := range f.flags {
		if isBool {
			fs.Bool(name, false, "")
		} else {
			fs.String(name, "", "")
		}
	}
	for name := range f.pending {
		if _, ok := f.flags[name]; !ok {
			fs.String(name, "", "")
		}
	}
	if err := fs.Parse(args); err != nil {
		for _, r := range f.refused {
			if strings.Contains(err.Error(), "defined: -"+r) {
				return nil, fmt.Errorf("%w (the lean build refuses --%s: an image of the full build is needed)", err, r)
			}
		}
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	vals := map[string]string{}
	fs.Visit(func(fl *flag.Flag) { vals[fl.Name] = fl.Value.String() })
	return vals, nil
}

// flagLine is a flag's first line in Go's flag usage: "  -name", then its
// value's name after a space unless it is a bool flag, then a tab or the
// end of the line.
var flagLine = regexp.MustCompile(`^  -([A-Za-z0-9][A-Za-z0-9._-]*)(?: ([^\t]+))?(?:\t|$)`)

// parseHelp reads the flags from the output of mdag CMD -h.
func parseHelp(cmd, help string) (cliFlags, error) {
	f := cliFlags{cmd: cmd, flags: map[string]bool{}, pending: pendingFlags[cmd]}
	for _, line := range strings.Split(help, "\n") {
		if m := flagLine.FindStringSubmatch(line); m != nil {
			f.flags[m[1]] = m[2] == ""
			continue
		}
		// the lean build: "WHIP ingest is not in the lean build (...); refused flags: -a -b"
		if _, list, ok := strings.Cut(line, "refused flags: "); ok && !strings.HasPrefix(line, " ") {
			for _, r := range strings.Fields(list) {
				f.refused = append(f.refused, strings.TrimPrefix(r, "-"))
			}
		}
	}
	if len(f.flags) == 0 {
		return f, fmt.Errorf("mdag %s -h lists no flags:\n%s", cmd, help)
	}
	return f, nil
}

var (
	cliOnce sync.Once
	cliDir  string
	cliSets map[string]cliFlags
	cliErr  error
)

// mdagCommands are the commands the manifests run.
var mdagCommands = []string{"coordinator", "worker", "source"}

// mdagFlags builds the lean mdag (the build the images need at least) and
// reads each command's flags from its -h, once per test binary.
func mdagFlags(t *testing.T) map[string]cliFlags {
	t.Helper()
	cliOnce.Do(func() {
		cliDir, cliErr = os.MkdirTemp("", "mdag-deploy-test-")
		if cliErr != nil {
			return
		}
		bin := filepath.Join(cliDir, "mdag")
		goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
		build := exec.Command(goBin, "build", "-tags", "lean", "-o", bin, "./cmd/mdag")
		build.Dir = ".."
		if out, err := build.CombinedOutput(); err != nil {
			cliErr = fmt.Errorf("go build -tags lean ./cmd/mdag: %v\n%s", err, out)
			return
		}
		cliSets = map[string]cliFlags{}
		for _, cmd := range mdagCommands {
			out, err := exec.Command(bin, cmd, "-h").CombinedOutput()
			if err != nil {
				cliErr = fmt.Errorf("mdag %s -h: %v\n%s", cmd, err, out)
				return
			}
			if cliSets[cmd], cliErr = parseHelp(cmd, string(out)); cliErr != nil {
				return
			}
		}
	})
	if cliErr != nil {
		t.Fatal(cliErr)
	}
	return cliSets
}

func TestMain(m *testing.M) {
	flag.Parse()
	code := m.Run()
	if cliDir != "" {
		os.RemoveAll(cliDir)
	}
	os.Exit(code)
}

// runnerFlags are the flags runners/torch/runner.py's argparse defines.
func runnerFlags(t *testing.T) map[string]bool {
	t.Helper()
	src, err := os.ReadFile("../runners/torch/runner.py")
	if err != nil {
		t.Fatal(err)
	}
	flags := map[string]bool{}
	for _, m := range regexp.MustCompile(`add_argument\(\s*"--([a-z0-9-]+)"`).FindAllStringSubmatch(string(src), -1) {
		flags[m[1]] = true
	}
	if len(flags) < 5 || !flags["listen"] || !flags["model"] {
		t.Fatalf("runners/torch/runner.py: found flags %v; has its argparse changed shape?", mapKeys(flags))
	}
	return flags
}

// TestParseHelp: flags, bool flags and the lean build's refused flags are
// read from usage as Go's flag package prints it, and the parse that
// follows refuses what the command would.
func TestParseHelp(t *testing.T) {
	help := "Usage: mdag worker --type TYPE [flags]\n\nFlags:\n" +
		"  -coordinator string\n    \tthe coordinator (default \"127.0.0.1:7070\")\n" +
		"  -insecure\n    \tplaintext\n" +
		"  -state DIR\n    \tdirectory\n" +
		"  -v\tlog debug events\n" +
		"  -x value\n    \tvalue flag, repeatable\n" +
		"\nWHIP ingest is not in the lean build (the full build has it: bin/mdag (make build)); refused flags: -open -udp-ports\n"
	f, err := parseHelp("worker", help)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"coordinator": false, "insecure": true, "state": false, "v": true, "x": false}
	if !maps.Equal(f.flags, want) {
		t.Fatalf("flags %v, want %v", f.flags, want)
	}
	if strings.Join(f.refused, " ") != "open udp-ports" {
		t.Fatalf("refused %v", f.refused)
	}
	f.pending = map[string]string{"peer-listen": "a flag another change adds"}
	cases := []struct {
		args []string
		want map[string]string
		err  string
	}{
		{[]string{"--coordinator=a:1", "-v", "--state", "/s", "--x=1", "--x=2"}, map[string]string{"coordinator": "a:1", "v": "true", "state": "/s", "x": "2"}, ""},
		{[]string{"--coordinatr=a:1"}, nil, "flag provided but not defined: -coordinatr"},
		{[]string{"--state"}, nil, "flag needs an argument: -state"},
		{[]string{"--insecure=maybe"}, nil, "invalid boolean value"},
		{[]string{"-v", "extra"}, nil, "unexpected arguments: extra"},
		{[]string{"--open"}, nil, "the lean build refuses --open"},
		{[]string{"--peer-listen=:7071"}, map[string]string{"peer-listen": ":7071"}, ""}, // pending (set above)
	}
	for _, c := range cases {
		got, err := f.parse(c.args)
		switch {
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("%v: error %v, want one with %q", c.args, err, c.err)
		case c.err == "" && err != nil:
			t.Errorf("%v: %v", c.args, err)
		case c.err == "" && !maps.Equal(got, c.want):
			t.Errorf("%v: %v, want %v", c.args, got, c.want)
		}
	}
	if _, err := parseHelp("x", "Usage: mdag x\n"); err == nil {
		t.Error("usage without flags parsed")
	}
}

// TestPendingFlags: a pending flag the CLI now has must leave pendingFlags
// (its own definition, bool or not, then rules the parse).
func TestPendingFlags(t *testing.T) {
	sets := mdagFlags(t)
	var errs []error
	for cmd, pending := range pendingFlags {
		for name, why := range pending {
			if _, ok := sets[cmd].flags[name]; ok {
				errs = append(errs, fmt.Errorf("mdag %s has --%s now (%s): remove it from pendingFlags in deploy/cli_test.go", cmd, name, why))
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}

// TestCLIFlagsRead: the flags read from the built binary include ones every
// manifest relies on (a -h whose shape changed would read as none).
func TestCLIFlagsRead(t *testing.T) {
	sets := mdagFlags(t)
	for cmd, want := range map[string][]string{
		"coordinator": {"f", "p", "grpc", "listen", "metrics-listen", "tls-dir", "tokens", "state", "insecure", "v"},
		"worker":      {"type", "id", "coordinator", "tls-dir", "executor", "models", "emulate", "slots"},
	} {
		for _, name := range want {
			if _, ok := sets[cmd].flags[name]; !ok {
				t.Errorf("mdag %s -h: no --%s among %v", cmd, name, mapKeys(sets[cmd].flags))
			}
		}
	}
	if !sets["coordinator"].flags["insecure"] || sets["coordinator"].flags["grpc"] {
		t.Errorf("coordinator: --insecure should read as a bool flag and --grpc as one with a value")
	}
}
