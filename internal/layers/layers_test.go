package layers_test

import (
	"fmt"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/internal/layers"
)

const module = "github.com/ckptkit/ckptkit/"

// imports returns, for every package directory of the module (relative to
// the root), the module packages its non-test files import.
func imports(t *testing.T) map[string]map[string]bool {
	t.Helper()
	fset := token.NewFileSet()
	out := map[string]map[string]bool{}
	root := filepath.Join("..", "..")
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "testdata", "python", "node_modules":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		require.NoError(t, err)
		rel, err := filepath.Rel(root, filepath.Dir(path))
		require.NoError(t, err)
		pkg := filepath.ToSlash(rel)
		if out[pkg] == nil {
			out[pkg] = map[string]bool{}
		}
		for _, imp := range f.Imports {
			p, err := strconv.Unquote(imp.Path.Value)
			require.NoError(t, err)
			if strings.HasPrefix(p, module) {
				out[pkg][strings.TrimPrefix(p, module)] = true
			}
		}
		return nil
	})
	require.NoError(t, err)
	return out
}

// violations lists every package without a level and every import that
// runs back up (to a package of the same or a higher level).
func violations(all map[string]map[string]bool, levels map[string]layers.Level) []string {
	var out []string
	for p, imps := range all {
		lp, ok := levels[p]
		if !ok {
			out = append(out, fmt.Sprintf("package %s has no level: add it to layers.Levels (and to README's layout table)", p))
			continue
		}
		for imp := range imps {
			if li, ok := levels[imp]; ok && li >= lp {
				out = append(out, fmt.Sprintf("%s (level %d) imports %s (level %d): an import that runs back up", p, lp, imp, li))
			}
		}
	}
	sort.Strings(out)
	return out
}

// Every package has a level, and imports only packages of a lower level:
// no import runs back up the stack.
func TestNoImportRunsBackUp(t *testing.T) {
	all := imports(t)
	require.Contains(t, all, "backend", "the walk found the module's packages")
	assert.Empty(t, violations(all, layers.Levels))
	for p := range layers.Levels {
		assert.Contains(t, all, p, "layers.Levels names %s, which has no Go files", p)
	}
	assert.True(t, all["metadata"]["keys"], "metadata takes the key syntax from the leaf")
}

// The rule catches what it must: metadata importing backend (as it did
// before the key syntax became a leaf), a level-mate import and an
// unplaced package.
func TestAnUpwardImportIsCaught(t *testing.T) {
	all := imports(t)
	all["metadata"]["backend"] = true
	all["saver"]["loader"] = true
	all["newpkg"] = map[string]bool{"backend": true}
	got := violations(all, layers.Levels)
	assert.Subset(t, got, []string{
		"metadata (level 2) imports backend (level 2): an import that runs back up",
		"package newpkg has no level: add it to layers.Levels (and to README's layout table)",
		"saver (level 4) imports loader (level 4): an import that runs back up",
	})
}
