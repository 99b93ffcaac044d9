package ckpterr_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Every exported error variable of the module is a classified sentinel made
// with ckpterr.New, and no two packages export a sentinel of the same name:
// one taxonomy, no look-alikes.
func TestEverySentinelIsClassifiedAndUniquelyNamed(t *testing.T) {
	fset := token.NewFileSet()
	where := map[string][]string{} // name -> packages
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "testdata", "python", "ckpterr":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		require.NoError(t, err)
		for _, decl := range f.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.VAR {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, name := range vs.Names {
					if !sentinelName.MatchString(name.Name) || i >= len(vs.Values) {
						continue
					}
					if reexport(vs.Values[i]) {
						// A package's name for another package's sentinel
						// (backend.ErrInvalidKey = keys.ErrInvalid): the
						// same error, not a look-alike.
						continue
					}
					pkg := filepath.Dir(path)
					where[name.Name] = append(where[name.Name], pkg)
					call, ok := vs.Values[i].(*ast.CallExpr)
					sel, ok2 := callee(call, ok)
					assert.True(t, ok2 && sel == "ckpterr.New", "%s: %s is not made with ckpterr.New", fset.Position(name.Pos()), name.Name)
				}
			}
		}
		return nil
	})
	require.NoError(t, err)
	require.NotEmpty(t, where, "the walk found the module's sentinels")
	for name, pkgs := range where {
		assert.Len(t, pkgs, 1, "sentinel %s is exported by several packages: %v", name, pkgs)
	}
}

var sentinelName = regexp.MustCompile(`^Err[A-Z]`)

// reexport reports whether v is another package's sentinel, pkg.ErrX.
func reexport(v ast.Expr) bool {
	sel, ok := v.(*ast.SelectorExpr)
	if !ok {
		return false
	}
	_, ok = sel.X.(*ast.Ident)
	return ok && sentinelName.MatchString(sel.Sel.Name)
}

func callee(call *ast.CallExpr, ok bool) (string, bool) {
	if !ok {
		return "", false
	}
	sel, ok := call.Fun.(*ast.SelectorExpr)
	if !ok {
		return "", false
	}
	x, ok := sel.X.(*ast.Ident)
	if !ok {
		return "", false
	}
	return x.Name + "." + sel.Sel.Name, true
}
