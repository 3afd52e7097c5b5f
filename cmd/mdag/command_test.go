package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"testing"
)

// fakeCmd is a subcommand whose steps record that they ran.
type fakeCmd struct {
	n        int
	problems []error
	err      error
	ran      bool
}

func (c *fakeCmd) flags(fs *flag.FlagSet)         { fs.IntVar(&c.n, "n", 1, "a number") }
func (c *fakeCmd) validate(*flag.FlagSet) []error { return c.problems }
func (c *fakeCmd) run(*cmdEnv) error              { c.ran = true; return c.err }

func TestExecuteSteps(t *testing.T) {
	for _, tc := range []struct {
		name     string
		args     []string
		problems []error
		err      error
		code     int
		stderr   string
		ran      bool
	}{
		{"ok", []string{"-n", "2"}, nil, nil, exitOK, "", true},
		{"bad flag", []string{"-n", "x"}, nil, nil, exitInvalid, "invalid value", false},
		{"extra argument", []string{"x"}, nil, nil, exitInvalid, "mdag fake: unexpected arguments: x\n", false},
		{"help", []string{"-h"}, nil, nil, exitOK, "Usage: mdag fake [-n N]", false},
		{"one problem", nil, []error{errors.New("--n 0: want > 0")}, nil, exitInvalid,
			"mdag fake: --n 0: want > 0\nRun 'mdag fake -h' for its flags.\n", false},
		{"every problem", nil, []error{errors.New("a"), errors.Join(errors.New("b"), errors.New("c"))}, nil, exitInvalid,
			"mdag fake: a\nmdag fake: b\nmdag fake: c\n3 problems found\nRun 'mdag fake -h' for its flags.\n", false},
		{"failure", nil, nil, errors.New("disk full"), exitFailure, "mdag fake: disk full\n", true},
		{"invalid", nil, nil, invalidf("no %s", "app"), exitInvalid, "mdag fake: no app\n", true},
		{"wrapped", nil, nil, fmt.Errorf("load: %w", exitWith(exitInfeasible, errors.New("no plan"))), exitInfeasible, "mdag fake: load: no plan\n", true},
		{"located", nil, nil, invalid(errors.Join(errors.New("app.yaml:3: x"), errors.New("app.yaml:9:2: y"))), exitInvalid,
			"app.yaml:3: x\napp.yaml:9:2: y\n2 problems found\n", true},
		{"located, wrapped", nil, nil, fmt.Errorf("--tokens: %w", errors.Join(errors.New("t.yaml:3: x"), errors.New("t.yaml:9: y"))), exitFailure,
			"mdag fake: --tokens: t.yaml:3: x\nt.yaml:9: y\n2 problems found\n", true},
		{"several, not located", nil, nil, errors.Join(errors.New("a"), errors.New("b")), exitFailure, "mdag fake: a\nmdag fake: b\n2 problems found\n", true},
		{"continued", nil, nil, errors.New("refusing: x\n  --force replaces it"), exitFailure, "mdag fake: refusing: x\n  --force replaces it\n", true},
		{"reported", nil, nil, reported(exitInfeasible), exitInfeasible, "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &fakeCmd{problems: tc.problems, err: tc.err}
			var out, errb bytes.Buffer
			code := execute("fake", "[-n N]", c, tc.args, &out, &errb)
			if code != tc.code || c.ran != tc.ran || !bytes.Contains(errb.Bytes(), []byte(tc.stderr)) || tc.stderr == "" && errb.Len() > 0 {
				t.Errorf("exit %d, ran %v, stderr %q; want %d, %v, %q", code, c.ran, errb.String(), tc.code, tc.ran, tc.stderr)
			}
		})
	}
}
