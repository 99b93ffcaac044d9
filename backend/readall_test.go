package backend_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
)

// Regression (issue 16, memory far above input): ReadAll grew its buffer
// by copies (io.ReadAll) and kept up to a quarter more capacity than the
// object: the metadata object, read whole, cost ~1.25x its size for as
// long as it was kept and more while it was read. An object whose size is
// announced is now read into one buffer of that size.
func TestReadAllOfAnAnnouncedSizeAllocatesItOnce(t *testing.T) {
	const n = 24 << 20
	dir := t.TempDir()
	want := bytes.Repeat([]byte("0123456789abcdef"), n/16)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "obj"), want, 0o644))
	ctx := context.Background()
	st, err := backend.Open(ctx, dir)
	require.NoError(t, err)
	defer st.Close()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	got, err := st.ReadAll(ctx, "obj", 1<<30)
	runtime.ReadMemStats(&after)
	require.NoError(t, err)
	require.Equal(t, want, got)
	require.LessOrEqual(t, cap(got), n+1, "capacity")
	require.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(n+2<<20), "bytes allocated to read %d bytes", n)

	// Over the limit: refused, as before.
	_, err = st.ReadAll(ctx, "obj", n-1)
	require.ErrorIs(t, err, backend.ErrObjectTooLarge)
}
