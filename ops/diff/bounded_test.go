package diff_test

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/internal/testkit/ckpttest"
	"github.com/ckptkit/ckptkit/loader"
	"github.com/ckptkit/ckptkit/ops/diff"
)

// hugeN is the size of the tensors of the bounded-memory tests: far more
// than the pieces they are compared in.
const hugeN = 256 << 20

// sparseSide commits a ckpttest.SparseTensorCheckpointEndingIn of hugeN
// bytes under a fresh directory and opens it.
func sparseSide(t *testing.T, last byte) (*loader.Checkpoint, string) {
	t.Helper()
	dir := t.TempDir()
	ckpttest.SparseTensorCheckpointEndingIn(t, dir, hugeN, last)
	c, err := loader.Open(context.Background(), ckpttest.OpenURL(t, dir))
	require.NoError(t, err)
	return c, dir
}

// allocatedBy returns the bytes allocated while f ran.
func allocatedBy(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// Regression (issue 16): diff held one whole tensor per side (ReadTensor),
// so two 256 MiB tensors cost 512 MiB. Both comparisons now stream, and
// still find the one element that differs, the very last one.
func TestDiffOfHugeTensorsIsBoundedInMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("reads 1 GiB")
	}
	ctx := context.Background()
	a, _ := sparseSide(t, 0)
	b, _ := sparseSide(t, 3)
	const limit = 48 << 20

	var rep *diff.Report
	var err error
	n := allocatedBy(func() { rep, err = diff.Compare(ctx, a, b, diff.Options{}) })
	require.NoError(t, err)
	t.Logf("exact diff of two %d MiB tensors allocated %.1f MiB", hugeN>>20, float64(n)/(1<<20))
	assert.Less(t, n, uint64(limit))
	assert.Equal(t, int64(2*hugeN), rep.BytesCompared)
	require.Len(t, rep.Differences, 1)
	assert.Equal(t, diff.KindContent, rep.Differences[0].Kind)
	assert.NotEqual(t, rep.Differences[0].SHA256A, rep.Differences[0].SHA256B)

	n = allocatedBy(func() { rep, err = diff.Compare(ctx, a, b, diff.Options{UseTolerance: true, Tolerance: 2.9}) })
	require.NoError(t, err)
	t.Logf("tolerance diff of two %d MiB tensors allocated %.1f MiB", hugeN>>20, float64(n)/(1<<20))
	assert.Less(t, n, uint64(limit))
	assert.Equal(t, int64(2*hugeN), rep.BytesCompared)
	require.Len(t, rep.Differences, 1)
	d := rep.Differences[0]
	require.NotNil(t, d.MaxAbsDiff)
	assert.Equal(t, 3.0, *d.MaxAbsDiff)
	assert.Equal(t, int64(1), d.Elements)

}

// A side whose stored bytes fail their checksum fails the streamed
// comparison (the CRC32C is only known at the end of the chunk, after the
// bytes were compared), and neither side's reader outlives it.
func TestStreamedDiffReportsAChecksumMismatchAndLeaksNothing(t *testing.T) {
	ctx := context.Background()
	const n = 8 << 20
	dirs := [2]string{t.TempDir(), t.TempDir()}
	var sides [2]*loader.Checkpoint
	for i, dir := range dirs {
		ckpttest.SparseTensorCheckpointEndingIn(t, dir, n, 0)
		var err error
		sides[i], err = loader.Open(ctx, ckpttest.OpenURL(t, dir))
		require.NoError(t, err)
	}
	f, err := os.OpenFile(filepath.Join(dirs[1], "rank-00000-000.data"), os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteAt([]byte{1}, 12345)
	require.NoError(t, err)
	require.NoError(t, f.Close())

	before := runtime.NumGoroutine()
	for _, opts := range []diff.Options{{}, {UseTolerance: true, Tolerance: 5}} {
		_, err = diff.Compare(ctx, sides[0], sides[1], opts)
		require.ErrorIs(t, err, loader.ErrChecksum, "%+v", opts)
		_, err = diff.Compare(ctx, sides[1], sides[0], opts)
		require.ErrorIs(t, err, loader.ErrChecksum, "%+v", opts)
	}
	// (Polled here: assert.Eventually runs its condition on a goroutine of its own.)
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := runtime.NumGoroutine(); got > before {
		buf := make([]byte, 1<<20)
		t.Fatalf("%d goroutines before, %d after:\n%s", before, got, buf[:runtime.Stack(buf, true)])
	}

	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err = diff.Compare(cctx, sides[0], sides[0], diff.Options{UseTolerance: true})
	require.ErrorIs(t, err, context.Canceled)
}
