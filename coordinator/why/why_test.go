package why

import (
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite docs/reasons.md from why.go")

// label is what a Prometheus label value of ours looks like: lower-case
// words joined by hyphens.
var label = regexp.MustCompile(`^[a-z]+(-[a-z]+)*$`)

func TestVocabulary(t *testing.T) {
	seen := map[string]bool{}
	for _, d := range Drops() {
		if !label.MatchString(string(d)) || seen[string(d)] {
			t.Errorf("drop reason %q: not a lower-case hyphenated label, or listed twice", d)
		}
		seen[string(d)] = true
		if !d.Known() {
			t.Errorf("%q listed but not Known", d)
		}
	}
	seen = map[string]bool{}
	for _, k := range Triggers() {
		if !label.MatchString(string(k)) || seen[string(k)] {
			t.Errorf("trigger kind %q: not a lower-case hyphenated label, or listed twice", k)
		}
		seen[string(k)] = true
		if !k.Known() {
			t.Errorf("%q listed but not Known", k)
		}
	}
	if Drop("deadline").Known() || Trigger("sometimes").Known() {
		t.Error("an unlisted value is Known")
	}
	// Every constant of the file is listed: one declared but left out of
	// Drops or Triggers would be missing from the docs and the tests.
	for _, c := range constants(t) {
		switch c.typ {
		case "Drop":
			if !Drop(c.value).Known() {
				t.Errorf("%s = %q is not in Drops()", c.name, c.value)
			}
		case "Trigger":
			if !Trigger(c.value).Known() {
				t.Errorf("%s = %q is not in Triggers()", c.name, c.value)
			}
		}
	}
	if Drops()[0] = "x"; Drops()[0] == "x" {
		t.Error("Drops returns the package's own slice")
	}
}

func TestClasses(t *testing.T) {
	for _, tc := range []struct {
		d              Drop
		load, capacity bool
	}{
		{CannotFinish, true, true},
		{ActionRejected, true, true},
		{EarlyDrop, true, true},
		{QueueFull, true, true},
		{NoInstance, false, true},
		{NoGPUForModel, false, true},
		{NoPlan, false, false},
		{WorkerLost, false, false},
		{Shed, false, false},
		{Lost, false, false},
		{CoordinatorRestart, false, false},
		{ModuleError, false, false},
		{PeerLost, false, false},
		{Drop("unknown"), false, false},
	} {
		if tc.d.Load() != tc.load || tc.d.Capacity() != tc.capacity {
			t.Errorf("%s: Load %v Capacity %v; want %v %v", tc.d, tc.d.Load(), tc.d.Capacity(), tc.load, tc.capacity)
		}
	}
	for _, k := range Triggers() {
		if want := k == OnEpoch || k == OnTurnOff; k.Routine() != want {
			t.Errorf("%s: Routine %v, want %v", k, k.Routine(), want)
		}
	}
}

// TestDocs: docs/reasons.md is the table of every reason and trigger kind
// with its comment in why.go (go test ./coordinator/why -update rewrites
// it), so the operator's reference cannot fall behind the code.
func TestDocs(t *testing.T) {
	var b strings.Builder
	b.WriteString("# Drop reasons and re-plan triggers\n\n")
	b.WriteString("<!-- Written by `go test ./coordinator/why -update` from coordinator/why/why.go: edit the comments there. -->\n\n")
	b.WriteString("Every dropped frame carries one of these reasons: in `mdag_session_frames_dropped_total{reason}`,\n")
	b.WriteString("the frame results (`reason`), the status JSON and the logs. `load` marks the reasons a slow or busy\n")
	b.WriteString("machine causes; `capacity` those more capacity fixes (the finish-rate re-plan counts only these).\n\n")
	b.WriteString("| reason | group | load | capacity | meaning |\n|---|---|---|---|---|\n")
	cs := constants(t)
	for _, c := range cs {
		if c.typ != "Drop" {
			continue
		}
		d := Drop(c.value)
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s | %s |\n", d, c.group, yes(d.Load()), yes(d.Capacity()), c.doc)
	}
	b.WriteString("\nEvery re-plan carries the kinds of event that asked for it: `mdag_planner_triggers_total{kind}`,\n")
	b.WriteString("`kinds` of each re-plan in `/v1/status` and the logs. A routine kind alone (epoch, turn-off) is\n")
	b.WriteString("recorded only when its plan changes something.\n\n")
	b.WriteString("| kind | routine | meaning |\n|---|---|---|\n")
	for _, c := range cs {
		if c.typ != "Trigger" {
			continue
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s |\n", c.value, yes(Trigger(c.value).Routine()), c.doc)
	}
	const path = "../../docs/reasons.md"
	if *update {
		if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (go test ./coordinator/why -update writes it)", err)
	}
	if string(got) != b.String() {
		t.Errorf("%s is not what why.go says: run go test ./coordinator/why -update", path)
	}
}

func yes(b bool) string {
	if b {
		return "yes"
	}
	return ""
}

type constant struct{ name, typ, value, doc, group string }

// constants reads why.go's typed constants with their line comments and
// the comment of their const block (the group).
func constants(t *testing.T) []constant {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "why.go", nil, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	var out []constant
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		group, _, _ := strings.Cut(strings.TrimSpace(g.Doc.Text()), ":")
		group = strings.ToLower(group)
		for _, sp := range g.Specs {
			vs := sp.(*ast.ValueSpec)
			id, ok := vs.Type.(*ast.Ident)
			if !ok || len(vs.Values) != 1 {
				t.Fatalf("const %s: want a typed constant with one value", vs.Names[0].Name)
			}
			lit, ok := vs.Values[0].(*ast.BasicLit)
			if !ok {
				t.Fatalf("const %s: want a string literal", vs.Names[0].Name)
			}
			v, err := strconv.Unquote(lit.Value)
			if err != nil {
				t.Fatal(err)
			}
			doc := strings.TrimSpace(vs.Comment.Text())
			if doc == "" {
				t.Errorf("const %s has no comment: it is the operator's reference (docs/reasons.md)", vs.Names[0].Name)
			}
			out = append(out, constant{name: vs.Names[0].Name, typ: id.Name, value: v, doc: doc, group: group})
		}
	}
	return out
}

// TestREADME: the README's metrics table names every trigger kind in the
// row of mdag_planner_triggers_total and points at docs/reasons.md.
func TestREADME(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	var row string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "| `mdag_planner_triggers_total`") {
			row = l
		}
	}
	if row == "" {
		t.Fatal("README.md has no metrics table row for mdag_planner_triggers_total")
	}
	for _, k := range Triggers() {
		if !regexp.MustCompile(`[ (]` + regexp.QuoteMeta(string(k)) + `[,;) ]`).MatchString(row) {
			t.Errorf("README.md's mdag_planner_triggers_total row does not name kind %q", k)
		}
	}
	if !strings.Contains(row, "docs/reasons.md") {
		t.Error("README.md's mdag_planner_triggers_total row does not point at docs/reasons.md")
	}
}
