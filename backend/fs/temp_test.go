package fs

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
)

// A Put removes the temporary files of its directory whose writer is
// provably gone (same pid space, pid no longer running) and leaves those
// of a live writer, of another pid space (another machine or container on
// a shared file system) and of older names alone.
func TestPutSweepsOnlyDeadWritersTempFiles(t *testing.T) {
	if runtime.GOOS != "linux" || processOwner() == "" {
		t.Skip("pid spaces are identified on Linux only")
	}
	dead := exec.Command("true")
	require.NoError(t, dead.Run())
	live := exec.Command("sleep", "60")
	require.NoError(t, live.Start())
	t.Cleanup(func() { _ = live.Process.Kill(); _ = live.Wait() })

	root := t.TempDir()
	dir := filepath.Join(root, "step-00000001")
	require.NoError(t, os.MkdirAll(dir, 0o755))
	name := func(owner string, pid int) string {
		return fmt.Sprintf("%s%s.%d.00112233445566778", TempPrefix, owner, pid)
	}
	deadFile := name(processOwner(), dead.Process.Pid)
	kept := []string{
		name(processOwner(), live.Process.Pid),
		name("0badcafe", dead.Process.Pid),
		TempPrefix + "0123456789abcdef01234567", // an older version's name
	}
	for _, n := range append([]string{deadFile}, kept...) {
		require.NoError(t, os.WriteFile(filepath.Join(dir, n), []byte("partial"), 0o644))
	}

	d, err := New(root)
	require.NoError(t, err)
	defer d.Close()
	st, err := backend.NewStore(d, "file://"+root, "")
	require.NoError(t, err)
	body := []byte("object")
	require.NoError(t, st.PutBytes(context.Background(), "step-00000001/rank-00000-000.data", body, backend.PutOptions{}))

	var left []string
	require.NoError(t, st.ListUploads(context.Background(), "", func(u backend.Upload) error {
		left = append(left, u.ID)
		require.Equal(t, "step-00000001/"+u.ID, u.Key)
		require.Equal(t, int64(len("partial")), u.Size)
		return nil
	}))
	require.ElementsMatch(t, kept, left)
	got, err := os.ReadFile(filepath.Join(dir, "rank-00000-000.data"))
	require.NoError(t, err)
	require.True(t, bytes.Equal(body, got))

	// gc's abort removes a temporary file, and only such a file.
	require.NoError(t, st.AbortUpload(context.Background(), "step-00000001/"+kept[0], kept[0]))
	require.ErrorIs(t, st.AbortUpload(context.Background(), "step-00000001/rank-00000-000.data", "rank-00000-000.data"), backend.ErrInvalidKey)
	_, err = os.Stat(filepath.Join(dir, kept[0]))
	require.ErrorIs(t, err, os.ErrNotExist)
}
