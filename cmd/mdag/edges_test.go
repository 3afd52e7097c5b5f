package main

import (
	"bytes"
	"errors"
	"flag"
	"slices"
	"strings"
	"testing"
)

// TestWhipFlagNames: whipFlagNames and whipBoolFlags are exactly the flags
// addWhipFlags adds, so the lean build refuses every WHIP flag of the full
// one by name (in the lean build the test checks its own refusals).
func TestWhipFlagNames(t *testing.T) {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	addWhipFlags(fs)
	var names, bools []string
	fs.VisitAll(func(f *flag.Flag) {
		names = append(names, f.Name)
		if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
			bools = append(bools, f.Name)
		}
	})
	for _, c := range []struct {
		what      string
		got, want []string
	}{{"whipFlagNames", names, whipFlagNames}, {"whipBoolFlags", bools, whipBoolFlags}} {
		want := slices.Sorted(slices.Values(c.want))
		if !slices.Equal(c.got, want) {
			t.Errorf("%s is %v; addWhipFlags adds %v", c.what, want, c.got)
		}
	}
}

// refusedTestFlag is a notInBuild flag.
type refusedTestFlag struct{}

func (refusedTestFlag) String() string     { return "" }
func (refusedTestFlag) Set(string) error   { return errors.New("not here") }
func (refusedTestFlag) notInBuild() string { return "not in this build" }

// TestPrintDefaults: printDefaults is flag's PrintDefaults (defaults as
// registered, whatever was parsed) with the notInBuild flags named on one
// line at the end.
func TestPrintDefaults(t *testing.T) {
	const shown = "  -n int\n    \tcount (default 3)\n  -s string\n    \tname (default \"a\")\n  -v\tverbose\n"
	for _, tc := range []struct {
		name    string
		refused []string
		args    []string
		want    string
	}{
		{"none refused", nil, nil, shown},
		{"none refused, parsed", nil, []string{"-n", "5", "-s", "b"}, shown},
		{"refused", []string{"z", "open"}, nil, shown + "\nnot in this build: -open -z\n"},
		{"refused, parsed", []string{"z"}, []string{"-n", "5", "-v"}, shown + "\nnot in this build: -z\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := flag.NewFlagSet("x", flag.ContinueOnError)
			var out bytes.Buffer
			fs.SetOutput(&out)
			fs.Int("n", 3, "count")
			fs.String("s", "a", "name")
			fs.Bool("v", false, "verbose")
			for _, r := range tc.refused {
				fs.Var(refusedTestFlag{}, r, "refused")
			}
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			printDefaults(fs)
			if out.String() != tc.want {
				t.Errorf("got\n%s\nwant\n%s", out.String(), tc.want)
			}
		})
	}
}

// TestVersion: mdag version names the build.
func TestVersion(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"version"}, &out, &errb); code != exitOK || !strings.Contains(out.String(), "("+buildName+" build: ") {
		t.Errorf("mdag version: exit %d, %q %q: want the %s build named", code, out.String(), errb.String(), buildName)
	}
}
