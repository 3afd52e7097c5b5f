package coordinator

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// TestShape holds the package to the shape coordinator/README.md
// describes: the engine's state grouped by responsibility (under 20
// fields), no function in coordinator/ over 100 lines (a long one is split
// into its named steps), no test fixture in the exported API, and every
// file named in the README's map.
func TestShape(t *testing.T) {
	if n := reflect.TypeFor[Engine]().NumField(); n >= 20 {
		t.Errorf("Engine has %d fields: group new state in the type of its responsibility (loop, registry, gpuPath, planDriver, persist)", n)
	}
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	err = filepath.WalkDir(".", func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		fs := token.NewFileSet()
		f, err := parser.ParseFile(fs, path, nil, 0)
		if err != nil {
			return err
		}
		if !strings.Contains(path, "/") && !strings.Contains(string(readme), "`"+path+"`") {
			t.Errorf("%s is not in coordinator/README.md's map of the files", path)
		}
		for _, decl := range f.Decls {
			fd, ok := decl.(*ast.FuncDecl)
			if !ok {
				continue
			}
			if n := fs.Position(fd.End()).Line - fs.Position(fd.Pos()).Line + 1; n > 100 {
				t.Errorf("%s: %s is %d lines: split it into its named steps (at most 100)", path, fd.Name.Name, n)
			}
			if name := fd.Name.Name; fd.Recv == nil && (strings.HasPrefix(name, "Must") || strings.Contains(name, "Noop") || strings.Contains(name, "Fake")) {
				t.Errorf("%s: %s looks like a test fixture in the exported API: tests keep theirs in _test.go files or internal/testapps", path, name)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
