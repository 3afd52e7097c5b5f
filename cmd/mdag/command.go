package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
)

// Every subcommand has one shape, after kube-scheduler's
// NewSchedulerCommand -> Setup -> Run:
//
//	options   a struct of the command's settings, filled by its flags
//	flags     binds the options to the flag set: the one place they are declared
//	validate  after parsing: fills what depends on other flags, then reports
//	          every problem with the options at once (not the first)
//	run       builds the components from the options, then runs them
//
// execute drives the four steps; a command is its options type, which
// implements subcommand. Failures travel as errors: a plain error is an
// internal failure (exit 1), one made by invalid (2), infeasible (3) or
// exitWith carries its own code, and reported (the command has already said
// why on stderr) only sets the code.
type subcommand interface {
	flags(fs *flag.FlagSet)
	validate(fs *flag.FlagSet) []error
	run(env *cmdEnv) error
}

// cmdEnv is what a command's run step gets besides its options.
type cmdEnv struct {
	name           string        // the subcommand: "serve"
	args           []string      // its command line, for reports that quote it
	fs             *flag.FlagSet // parsed; for flagGiven
	stdout, stderr io.Writer
	ctx            context.Context // cancelled on SIGINT/SIGTERM by commands that run until told to stop
}

// execute runs a subcommand through its steps and returns the exit code.
func execute(name, synopsis string, c subcommand, args []string, stdout, stderr io.Writer) int {
	fs := newFlags(name, synopsis, stderr)
	c.flags(fs)
	if code, ok := parseFlags(fs, args); !ok {
		return code
	}
	if errs := c.validate(fs); len(errs) > 0 {
		reportInvalid(stderr, name, errs)
		return exitInvalid
	}
	env := &cmdEnv{name: name, args: args, fs: fs, stdout: stdout, stderr: stderr, ctx: context.Background()}
	return exitCode(stderr, name, c.run(env))
}

// reportInvalid writes every validation problem, one per line, with a count
// when there are several and where to find the flags.
func reportInvalid(w io.Writer, name string, errs []error) {
	n := 0
	for _, err := range errs {
		for _, l := range strings.Split(err.Error(), "\n") {
			fmt.Fprintf(w, "mdag %s: %s\n", name, l)
			n++
		}
	}
	if n > 1 {
		fmt.Fprintf(w, "%d problems found\n", n)
	}
	fmt.Fprintf(w, "Run 'mdag help %s' for its flags.\n", name)
}

// exitError is an error with the exit code it ends its command with.
type exitError struct {
	code int
	err  error // nil: already reported
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit %d", e.code)
	}
	return e.err.Error()
}

func (e *exitError) Unwrap() error { return e.err }

// exitWith ends the command with code, reporting err (when not nil).
func exitWith(code int, err error) error { return &exitError{code, err} }

// invalid is bad input found after validation (a file that does not parse,
// a model that is not there): exit 2.
func invalid(err error) error { return &exitError{exitInvalid, err} }

// invalidf is invalid with a formatted error.
func invalidf(format string, a ...any) error { return invalid(fmt.Errorf(format, a...)) }

// infeasible is valid input that cannot meet its SLO: exit 3.
func infeasible(err error) error { return &exitError{exitInfeasible, err} }

// reported ends the command with code; it has said why already.
func reported(code int) error { return &exitError{code, nil} }

// exitCode reports err on stderr, prefixed with the command (one line per
// line of the error), and returns its exit code.
func exitCode(stderr io.Writer, name string, err error) int {
	if err == nil {
		return exitOK
	}
	code := exitFailure
	var ee *exitError
	if errors.As(err, &ee) {
		code = ee.code
		if ee.err == nil {
			return code
		}
	}
	for _, l := range strings.Split(err.Error(), "\n") {
		fmt.Fprintf(stderr, "mdag %s: %s\n", name, l)
	}
	return code
}
