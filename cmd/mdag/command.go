package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"regexp"
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
// internal failure (exit 1), one made by invalid (2) or exitWith carries
// its own code (3: infeasible), and reported (the command has already said
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
	env := &cmdEnv{name: name, args: args, fs: fs, stdout: stdout, stderr: stderr}
	return exitCode(stderr, name, c.run(env))
}

// reportInvalid writes every validation problem, one per line, with a count
// when there are several and where to find the flags.
func reportInvalid(w io.Writer, name string, errs []error) {
	n := 0
	for _, err := range errs {
		n += printPrefixed(w, name, err)
	}
	if n > 1 {
		fmt.Fprintf(w, "%d problems found\n", n)
	}
	fmt.Fprintf(w, "Run 'mdag %s -h' for its flags.\n", name)
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
func exitWith(code int, err error) error { return &exitError{code: code, err: err} }

// invalid is bad input found after validation (a file that does not parse,
// a model that is not there): exit 2.
func invalid(err error) error { return &exitError{code: exitInvalid, err: err} }

// invalidf is invalid with a formatted error.
func invalidf(format string, a ...any) error { return invalid(fmt.Errorf(format, a...)) }

// reported ends the command with code; it has said why already.
func reported(code int) error { return &exitError{code: code} }

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
	if n := printPrefixed(stderr, name, err); n > 1 {
		fmt.Fprintf(stderr, "%d problems found\n", n)
	}
	return code
}

// printPrefixed writes err one problem a line (the lines of an
// errors.Join), "mdag NAME: " before each that does not say where it is
// itself: a problem of a file (app.yaml:12: ...) is written as it is, as
// mdag validate writes them. An indented line continues the one above. It
// returns the number of problems.
func printPrefixed(w io.Writer, name string, err error) int {
	n := 0
	for _, l := range strings.Split(err.Error(), "\n") {
		switch {
		case strings.HasPrefix(l, " ") || strings.HasPrefix(l, "\t"):
			fmt.Fprintln(w, l)
			continue
		case located.MatchString(l):
			fmt.Fprintln(w, l)
		default:
			fmt.Fprintf(w, "mdag %s: %s\n", name, l)
		}
		n++
	}
	return n
}

// located matches a problem that says where it is: FILE:LINE: ...
var located = regexp.MustCompile(`^[^\s:]+:\d+(:\d+)?: `)

// subcmd is one subcommand of a group (mdag certs init).
type subcmd struct {
	name, synopsis string
	new            func() subcommand
}

// runGroup runs a command made of subcommands (mdag certs init|issue): the
// first argument names the one to execute; none, or help, prints usage.
func runGroup(group string, usage func(io.Writer), subs []subcmd, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return exitInvalid
	}
	for _, s := range subs {
		if s.name != args[0] {
			continue
		}
		if _, ok := s.new().(positional); ok {
			return executeArgs(group+" "+s.name, s.synopsis, func() positional { return s.new().(positional) }, args[1:], stdout, stderr)
		}
		return execute(group+" "+s.name, s.synopsis, s.new(), args[1:], stdout, stderr)
	}
	if args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stdout)
		return exitOK
	}
	names := make([]string, len(subs))
	for i, s := range subs {
		names[i] = s.name
	}
	fmt.Fprintf(stderr, "mdag %s: unknown subcommand %q: want %s\n", group, args[0], strings.Join(names, " or "))
	usage(stderr)
	return exitInvalid
}

// positional is a subcommand with positional arguments besides its flags
// (mdag try FILE, mdag models inspect FILE.onnx).
type positional interface {
	subcommand
	setArgs(args []string)
}

// executeArgs is execute for a command with positional arguments, which
// may come before, between or after its flags (FILE --name x as well as
// --name x FILE): execute refuses them (unexpected arguments), so they are
// taken out of args (by a scratch command of newC's, so that a flag that
// accumulates is not filled twice) and handed to the command, and execute
// gets the flags.
func executeArgs(name, synopsis string, newC func() positional, args []string, stdout, stderr io.Writer) int {
	flags, pos := splitArgs(newC(), args)
	c := newC()
	c.setArgs(pos)
	return execute(name, synopsis, c, flags, stdout, stderr)
}

// splitArgs separates args into flags and positional arguments by parsing
// them with c's flags on a scratch set, so that a flag's value is not
// taken for an argument. On a parse error (or -h) it stops there: the rest
// goes with the flags, and execute's parse fails (or helps) the same way.
func splitArgs(c subcommand, args []string) (flags, pos []string) {
	fs := flag.NewFlagSet("", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	c.flags(fs)
	for {
		if fs.Parse(args) != nil {
			return append(flags, args...), pos
		}
		rest := fs.Args()
		used := args[:len(args)-len(rest)]
		if n := len(used); n > 0 && used[n-1] == "--" && fs.Parse(used[:n-1]) == nil {
			used = used[:n-1] // "--" ended the flags (it is no flag's value): execute would take the flags after it for arguments
		}
		flags = append(flags, used...)
		if len(rest) == 0 {
			return flags, pos
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// problem is one of a validate step's checks (try, profile, models
// inspect): when bad, msg says what is wrong.
type problem struct {
	bad bool
	msg string
}

// failed are the failing checks' messages as errors, in order.
func failed(checks ...problem) []error {
	var errs []error
	for _, p := range checks {
		if p.bad {
			errs = append(errs, errors.New(p.msg))
		}
	}
	return errs
}
