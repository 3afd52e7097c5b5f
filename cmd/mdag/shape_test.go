package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestEveryCommandHasTheShape holds every subcommand in the command table
// to the one shape (command.go): its run function is one return of execute
// (or of runGroup, whose subcommands are executed), nothing else, so
// every command declares its flags in one place, reports every bad flag at
// once and maps its errors to exit codes the same way. The lean build's
// stand-ins that refuse a feature it has not are exempt.
func TestEveryCommandHasTheShape(t *testing.T) {
	fset := token.NewFileSet()
	funcs := map[string]*ast.FuncDecl{}
	var table []string
	paths, _ := filepath.Glob("*.go")
	for _, p := range paths {
		if strings.HasSuffix(p, "_test.go") {
			continue
		}
		src, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(src), "//go:build lean") {
			continue
		}
		f, err := parser.ParseFile(fset, p, src, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.FuncDecl:
				if n.Recv == nil {
					funcs[n.Name.Name] = n
				}
			case *ast.CompositeLit:
				// []command{{name, summary, runXxx}, ...}
				if at, ok := n.Type.(*ast.ArrayType); ok {
					if id, ok := at.Elt.(*ast.Ident); ok && id.Name == "command" {
						for _, e := range n.Elts {
							if c, ok := e.(*ast.CompositeLit); ok && len(c.Elts) == 3 {
								if run, ok := c.Elts[2].(*ast.Ident); ok {
									table = append(table, run.Name)
								}
							}
						}
					}
				}
			}
			return true
		})
	}
	if len(table) < 20 {
		t.Fatalf("found %d commands in the table (%v): the test no longer reads it", len(table), table)
	}
	var shaped func(name string, depth int) bool
	shaped = func(name string, depth int) bool {
		fn := funcs[name]
		if fn == nil || depth > 2 || len(fn.Body.List) != 1 {
			return false
		}
		ret, ok := fn.Body.List[0].(*ast.ReturnStmt)
		if !ok || len(ret.Results) != 1 {
			return false
		}
		call, ok := ret.Results[0].(*ast.CallExpr)
		if !ok {
			return false
		}
		callee, ok := call.Fun.(*ast.Ident)
		if !ok {
			return false
		}
		return callee.Name == "execute" || callee.Name == "executeArgs" || callee.Name == "runGroup" || shaped(callee.Name, depth+1)
	}
	for _, name := range table {
		if !shaped(name, 0) {
			t.Errorf("%s: not in the shape: want its body to be `return execute(NAME, SYNOPSIS, new(xxxCmd), args, stdout, stderr)` (or runGroup)", name)
		}
	}
}
