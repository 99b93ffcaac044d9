//go:build unix

package host_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/backend/instrument"
	"github.com/ckptkit/ckptkit/plugins/host"
)

// minor1Commit is the last commit whose plugin SDK speaks protocol minor 1
// (before the delimited List): plugins built from it ignore
// ListRequest.delimited.
const minor1Commit = "1d20b96"

// buildMinor1Plugin builds the memplugin example from minor1Commit's tree:
// a real plugin of the previous protocol minor. It skips when the commit
// is not in the clone (a shallow checkout) or git is missing.
func buildMinor1Plugin(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds a plugin from an older tree")
	}
	root, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Skipf("no git checkout: %v", err)
	}
	src := t.TempDir()
	archive := exec.Command("git", "-C", strings.TrimSpace(string(root)), "archive", minor1Commit)
	untar := exec.Command("tar", "-x", "-C", src)
	pipe, err := archive.StdoutPipe()
	require.NoError(t, err)
	untar.Stdin = pipe
	require.NoError(t, untar.Start())
	if err := archive.Run(); err != nil {
		_ = untar.Wait()
		t.Skipf("commit %s not in this clone: %v", minor1Commit, err)
	}
	require.NoError(t, untar.Wait())
	dir := t.TempDir()
	bin := filepath.Join(dir, "memplugin")
	build := exec.Command("go", "build", "-o", bin, "./plugins/examples/memplugin")
	build.Dir = src
	build.Env = append(os.Environ(), "GOFLAGS=-mod=mod")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "build the minor-1 memplugin: %s", out)
	return dir
}

// TestDelimitedListingWithMinor1Plugin: a plugin that predates the
// delimited List streams its whole listing; the host groups it into the
// same one-level answer a current plugin gives.
func TestDelimitedListingWithMinor1Plugin(t *testing.T) {
	ctx := context.Background()
	old := buildMinor1Plugin(t)
	ps := discover(t, host.Config{Dir: old})
	require.Len(t, ps, 1)
	require.Equal(t, uint32(1), ps[0].ProtocolMinor, "the plugin speaks the previous minor")

	st, err := backend.Open(ctx, "memplug://legacy/run")
	require.NoError(t, err)
	defer st.Close()
	for _, k := range []string{"a", "b-", "b/1", "b/2", "b/c/3", "c/4", "é/5", "z"} {
		require.NoError(t, st.PutBytes(ctx, k, []byte(k), backend.PutOptions{}))
	}
	counter := instrument.Wrap(st.Driver())
	cst := st.WithDriver(counter)
	var objects, prefixes []string
	require.NoError(t, cst.ListDelimited(ctx, "", func(o backend.ObjectInfo) error {
		if o.IsPrefix {
			prefixes = append(prefixes, o.Key)
		} else {
			objects = append(objects, o.Key)
			require.Equal(t, int64(len(o.Key)), o.Size, o.Key)
		}
		return nil
	}))
	sort.Strings(prefixes)
	require.Equal(t, []string{"a", "b-", "z"}, objects)
	require.Equal(t, []string{"b/", "c/", "é/"}, prefixes, "each common prefix once")
	require.Equal(t, int64(6), counter.Listed())

	prefixes = nil
	require.NoError(t, cst.ListDelimited(ctx, "b/", func(o backend.ObjectInfo) error {
		if o.IsPrefix {
			prefixes = append(prefixes, o.Key)
		}
		return nil
	}))
	require.Equal(t, []string{"b/c/"}, prefixes)
}
