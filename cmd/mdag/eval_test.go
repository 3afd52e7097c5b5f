package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestEvalFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--duration", "1s"}, "mdag eval: --duration 1s: want 10s..24h"},
		{[]string{"--clients", "0"}, "--clients 0: want 1..1000"},
		{[]string{"-o", "yaml"}, `-o "yaml": want table or json`},
		// every problem at once, counted, not the first
		{[]string{"--duration", "1s", "--clients", "0", "--apps", "pose", "--nexus-gpus", ""},
			"mdag eval: --duration 1s: want 10s..24h\nmdag eval: --clients 0: want 1..1000\nmdag eval: --apps: eval: no setup for app \"pose\"" +
				" (have traffic, face, tracker)\nmdag eval: --nexus-gpus needs at least one entry\n4 problems found\nRun 'mdag eval -h' for its flags.\n"},
		{[]string{"--apps", "pose"}, `no setup for app "pose"`},
		{[]string{"--apps", ","}, "at least one entry"},
	} {
		var out, errb bytes.Buffer
		if code := run(append([]string{"eval"}, tc.args...), &out, &errb); code != exitInvalid || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("eval %v: exit %d, stderr %q; want %d and %q", tc.args, code, errb.String(), exitInvalid, tc.want)
		}
	}
}

// A small comparison end to end: the table, the check, the JSON, the
// report and its figures.
func TestEvalSmall(t *testing.T) {
	dir := t.TempDir()
	args := []string{"eval", "--duration", "20s", "--clients", "3", "--apps", "traffic", "--nexus-gpus", "P100",
		"--report", filepath.Join(dir, "evaluation.md"), "--figures", filepath.Join(dir, "fig")}
	var out, errb bytes.Buffer
	if code := run(args, &out, &errb); code != exitOK {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errb.String())
	}
	for _, want := range []string{"traffic  mdag", "nexus-P100-1f", "nexus-P100-6f", "nexus-P100-1f-x2", "6 runs of 20s virtual"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("stdout lacks %q:\n%s", want, out.String())
		}
	}
	if !strings.Contains(errb.String(), "eval: 6/6 ") {
		t.Errorf("no progress on stderr: %q", errb.String())
	}
	doc, err := os.ReadFile(filepath.Join(dir, "evaluation.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"# Evaluation", "| traffic | mdag |", "(held against)", "](fig/eval-traffic.svg)", "## Reproduce"} {
		if !strings.Contains(string(doc), want) {
			t.Errorf("report lacks %q", want)
		}
	}
	for _, f := range []string{"eval-traffic.svg", "eval-cost.svg", "eval-finish.svg"} {
		if st, err := os.Stat(filepath.Join(dir, "fig", f)); err != nil || st.Size() < 1000 {
			t.Errorf("figure %s: %v", f, err)
		}
	}
	out.Reset()
	// --check's verdict goes to stderr: stdout stays one JSON document
	// (the verdict itself depends on this tiny run; either exit is fine).
	code := run([]string{"eval", "--duration", "20s", "--clients", "3", "--apps", "traffic", "--nexus-gpus", "P100", "--check", "-o", "json"}, &out, &errb)
	if code != exitOK && code != exitFailure {
		t.Fatalf("json: exit %d", code)
	}
	var got struct {
		Comparisons []struct {
			Mdag  struct{ Digest string }
			Nexus []struct{ System string }
		}
		Violations []string `json:"violations"`
	}
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Comparisons) != 1 || len(got.Comparisons[0].Nexus) != 5 || got.Comparisons[0].Mdag.Digest == "" || got.Violations == nil {
		t.Fatalf("json: %s", out.String())
	}
}

// --headroom is checked before anything starts (serve and coordinator).
func TestHeadroomFlag(t *testing.T) {
	for _, cmd := range []string{"serve", "coordinator"} {
		for _, h := range []string{"0.5", "NaN", "+Inf"} {
			var out, errb bytes.Buffer
			args := []string{cmd, "--headroom", h}
			if cmd == "serve" {
				args = append(args, "--example", "traffic")
			} else {
				args = append(args, "--example", "traffic", "--insecure")
			}
			if code := run(args, &out, &errb); code != exitInvalid || !strings.Contains(errb.String(), "--headroom "+h+": want a number >= 1") {
				t.Errorf("%v: exit %d, stderr %q", args, code, errb.String())
			}
		}
	}
}
