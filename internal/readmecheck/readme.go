// Package readmecheck reads README.md's command blocks the way its tests
// walk them (issue 43): every fenced block without a language, or marked
// sh, carries an annotation in an HTML comment on the line before its
// fence, which the rendered page does not show:
//
//	<!-- readme: run -->               run its commands, in order, as a reader would
//	<!-- readme: run lines=1,2 -->     only those lines (the others need what a test has not: a camera, a GPU)
//	<!-- readme: run each -->          each line on its own: alternatives (a server is stopped before the next line)
//	<!-- readme: output -->            what the previous run block printed
//	<!-- readme: output run="CMD" -->  what CMD prints (a command the prose names)
//	<!-- readme: synopsis -->          a command's usage: its --flags must be the binary's
//	<!-- readme: skip REASON -->       not run, and why
//
// A run block may name a server the reader is assumed to have running
// with with="CMD" (started before its lines, stopped after). The walk
// itself is the package's test (TestREADMECommands); this file is the
// parsing and matching it uses, tested on its own.
package readmecheck

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// Block is one fenced block of a Markdown file.
type Block struct {
	Line  int      // the opening fence's line (1-based)
	Info  string   // the fence's info string ("yaml", "" ...)
	Body  []string // its lines
	Annot Annot    // from the comment before the fence; Mode "" when none
}

// Annot is a block's annotation.
type Annot struct {
	Mode  string // run, output, synopsis, skip
	Lines []int  // run: the lines to run (1-based, after joining continuations); nil: all
	With  string // run: a server started first
	Each  bool   // run: each line on its own (alternatives: a server stopped before the next line)
	Run   string // output: the command whose output it is
	Why   string // skip: the reason
}

// Checked reports whether a block must carry an annotation: a shell block
// (no language, sh, bash, console).
func (b Block) Checked() bool {
	switch b.Info {
	case "", "sh", "bash", "console", "shell":
		return true
	}
	return false
}

var annotRE = regexp.MustCompile(`^<!--\s*readme:\s*(.*?)\s*-->$`)

// Parse splits a Markdown text into its fenced blocks with their
// annotations; a malformed annotation is an error naming its line.
func Parse(text string) ([]Block, error) {
	lines := strings.Split(text, "\n")
	var out []Block
	var errs []string
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		if !strings.HasPrefix(l, "```") {
			continue
		}
		b := Block{Line: i + 1, Info: strings.TrimSpace(strings.TrimPrefix(l, "```"))}
		if j := prevNonEmpty(lines, i); j >= 0 {
			if m := annotRE.FindStringSubmatch(strings.TrimSpace(lines[j])); m != nil {
				a, err := parseAnnot(m[1])
				if err != nil {
					errs = append(errs, fmt.Sprintf("README.md:%d: %v", j+1, err))
				}
				b.Annot = a
			}
		}
		for i++; i < len(lines) && !strings.HasPrefix(lines[i], "```"); i++ {
			b.Body = append(b.Body, lines[i])
		}
		out = append(out, b)
	}
	if len(errs) > 0 {
		return out, fmt.Errorf("%s", strings.Join(errs, "\n"))
	}
	return out, nil
}

func prevNonEmpty(lines []string, i int) int {
	for j := i - 1; j >= 0; j-- {
		if strings.TrimSpace(lines[j]) != "" {
			return j
		}
	}
	return -1
}

// parseAnnot reads "MODE [key=value | key="value with spaces"]..." (skip:
// the rest is the reason).
func parseAnnot(s string) (Annot, error) {
	mode, rest, _ := strings.Cut(s, " ")
	a := Annot{Mode: mode}
	switch mode {
	case "skip":
		a.Why = strings.TrimSpace(rest)
		if a.Why == "" {
			return a, fmt.Errorf("readme: skip needs a reason")
		}
		return a, nil
	case "run", "output", "synopsis":
	default:
		return a, fmt.Errorf("readme: unknown mode %q (run, output, synopsis, skip REASON)", mode)
	}
	kv, err := splitKV(rest)
	if err != nil {
		return a, err
	}
	for k, v := range kv {
		switch {
		case k == "lines" && mode == "run":
			for f := range strings.SplitSeq(v, ",") {
				n, err := strconv.Atoi(f)
				if err != nil || n < 1 {
					return a, fmt.Errorf("readme: lines=%s: want 1-based line numbers, e.g. lines=1,2", v)
				}
				a.Lines = append(a.Lines, n)
			}
		case k == "each" && mode == "run" && v == "":
			a.Each = true
		case k == "with" && mode == "run":
			a.With = v
		case k == "run" && mode == "output":
			a.Run = v
		default:
			return a, fmt.Errorf("readme: %s takes no %s=", mode, k)
		}
	}
	return a, nil
}

func splitKV(s string) (map[string]string, error) {
	out := map[string]string{}
	s = strings.TrimSpace(s)
	for s != "" {
		if w, rest, _ := strings.Cut(s, " "); !strings.Contains(w, "=") && w != "" { // a bare word
			out[w] = ""
			s = strings.TrimSpace(rest)
			continue
		}
		k, rest, ok := strings.Cut(s, "=")
		if !ok || k == "" || strings.ContainsAny(k, " \"") {
			return nil, fmt.Errorf("readme: %q: want key=value", s)
		}
		var v string
		if strings.HasPrefix(rest, `"`) {
			end := strings.Index(rest[1:], `"`)
			if end < 0 {
				return nil, fmt.Errorf("readme: %s=: unterminated quote", k)
			}
			v, rest = rest[1:1+end], rest[2+end:]
		} else {
			v, rest, _ = strings.Cut(rest, " ")
		}
		out[k] = v
		s = strings.TrimSpace(rest)
	}
	return out, nil
}

// Commands joins a block's lines into commands: a line ending in a
// backslash continues on the next; blank lines and lines that are only a
// comment are not commands.
func Commands(body []string) []string {
	var out []string
	cur := ""
	for _, l := range body {
		t := strings.TrimSpace(l)
		if cur == "" && (t == "" || strings.HasPrefix(t, "#")) {
			continue
		}
		if strings.HasSuffix(t, `\`) {
			cur += strings.TrimSpace(strings.TrimSuffix(t, `\`)) + " "
			continue
		}
		out = append(out, strings.TrimSpace(cur+t))
		cur = ""
	}
	if cur != "" {
		out = append(out, strings.TrimSpace(cur))
	}
	return out
}

var numRE = regexp.MustCompile(`\d+(\.\d+)?`)

// norm is a line's shape: numbers become #, runs of spaces one space.
func norm(l string) string {
	return strings.Join(strings.Fields(numRE.ReplaceAllString(l, "#")), " ")
}

// lineRE is an expected line's pattern: its shape, with "..." matching
// anything.
func lineRE(expected string) *regexp.Regexp {
	parts := strings.Split(norm(expected), "...")
	for i, p := range parts {
		parts[i] = regexp.QuoteMeta(p)
	}
	return regexp.MustCompile(`^` + strings.Join(parts, `.*`) + `$`)
}

// Match checks that got (a command's output) shows what a README output
// block says: each of the block's lines, numbers aside, in order, among
// got's lines (other lines may come between: logs); a line "..." stands
// for any lines, "..." within a line for any text. It returns the first
// expected line not found, with the nearest candidates, or "".
func Match(expected []string, got string) string {
	gl := strings.Split(got, "\n")
	at := 0
	for _, e := range expected {
		if strings.TrimSpace(e) == "" || strings.TrimSpace(e) == "..." {
			continue
		}
		re := lineRE(e)
		found := false
		for ; at < len(gl); at++ {
			if re.MatchString(norm(gl[at])) {
				found = true
				at++
				break
			}
		}
		if !found {
			return fmt.Sprintf("the README's line\n\t%s\nis not in the output (in order; numbers aside); the output's lines of that shape's first word:\n%s", e, near(e, gl))
		}
	}
	return ""
}

// near lists got's lines that start with expected's first word.
func near(expected string, got []string) string {
	f := strings.Fields(expected)
	var out []string
	for _, g := range got {
		if len(f) > 0 && strings.HasPrefix(strings.TrimSpace(g), f[0]) {
			out = append(out, "\t"+g)
		}
	}
	if len(out) == 0 {
		return "\t(none)"
	}
	return strings.Join(out, "\n")
}

// Flags are the --flags a synopsis or command line names.
func Flags(cmd string) []string {
	var out []string
	seen := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?:^|[\s\[(|])(--[a-z][a-z0-9-]*)`).FindAllStringSubmatch(cmd, -1) {
		if !seen[m[1]] {
			seen[m[1]] = true
			out = append(out, m[1])
		}
	}
	return out
}
