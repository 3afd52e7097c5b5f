package coordinator

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/mdag/mdag/scheduler"
	"github.com/mdag/mdag/worker"
)

// TestReasonVocabulary: the reasons the coordinator takes from others
// are in its vocabulary (coordinator/why) under their own strings (every
// worker outcome but Done, every scheduler drop reason), and the
// coordinator's code names its own only by why's constants (no string
// converted on the way: the metrics' label values are exactly why's
// lists).
func TestReasonVocabulary(t *testing.T) {
	for o := worker.Outcome(0); o.Valid(); o++ {
		if o == worker.Done {
			continue
		}
		if d := outcomeDrop(o); !d.Known() {
			t.Errorf("worker outcome %s drops as %q, which coordinator/why does not list", o, d)
		}
	}
	for _, r := range declared(t, "../scheduler/scheduler.go", "DropReason") {
		if d := schedulerDrop(scheduler.DropReason(r)); !d.Known() {
			t.Errorf("scheduler drop reason %q is not in coordinator/why", r)
		}
	}
	// Conversions into the vocabulary appear only where it maps the
	// others' (outcomeDrop, schedulerDrop) and where accounting's
	// "module: reason" keys are read back (adapt.go).
	allowed := map[string]int{"engine.go": 2, "adapt.go": 1}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		n := strings.Count(string(src), "why.Drop(") + strings.Count(string(src), "why.Trigger(")
		if n != allowed[f] {
			t.Errorf("%s converts into why.Drop or why.Trigger %d times, want %d: name a constant of coordinator/why (add one there for a new reason)", f, n, allowed[f])
		}
	}
}

// declared returns the string values of the constants of type typ in a Go
// file.
func declared(t *testing.T, file, typ string) []string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), file, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, sp := range g.Specs {
			vs := sp.(*ast.ValueSpec)
			if id, ok := vs.Type.(*ast.Ident); !ok || id.Name != typ {
				continue
			}
			for _, v := range vs.Values {
				if lit, ok := v.(*ast.BasicLit); ok && lit.Kind == token.STRING {
					s, _ := strconv.Unquote(lit.Value)
					out = append(out, s)
				}
			}
		}
	}
	if len(out) == 0 {
		t.Fatalf("%s declares no constant of type %s", file, typ)
	}
	return out
}
