package fs_test

import (
	"io/fs"
	"net/url"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	ckptfs "github.com/ckptkit/ckptkit/backend/fs"
	"github.com/ckptkit/ckptkit/conformance"
	"github.com/ckptkit/ckptkit/internal/testkit/storetest"
)

// TestMain prints this backend's conformance rows after the tests.
func TestMain(m *testing.M) { conformance.Main(m) }

// TestConformance runs the whole suite on a fresh directory per case,
// opened by plain path, and checks that no case leaves a temporary file.
func TestConformance(t *testing.T) {
	conformance.Run(t, conformance.Harness{
		Name:      "fs",
		NewStore:  func(t conformance.T) *backend.Store { return storetest.Open(t, t.TempDir()+"/root") },
		Leftovers: noTempFiles,
	})
}

// noTempFiles fails when a temporary file of a Put is left below st.
func noTempFiles(t conformance.T, st *backend.Store) {
	u, err := url.Parse(st.URL(""))
	require.NoError(t, err)
	var left []string
	_ = filepath.WalkDir(u.Path, func(p string, d fs.DirEntry, err error) error {
		if err == nil && strings.HasPrefix(d.Name(), ckptfs.TempPrefix) {
			left = append(left, p)
		}
		return nil
	})
	require.Empty(t, left, "temporary files left behind")
}
