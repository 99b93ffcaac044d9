package loader_test

import (
	"context"
	"crypto/sha256"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/ckpterr"
	"github.com/ckptkit/ckptkit/internal/testkit/ckpttest"
	"github.com/ckptkit/ckptkit/loader"
	"github.com/ckptkit/ckptkit/metadata"
)

// sparseCheckpoint opens a ckpttest.SparseTensorCheckpoint of n bytes.
func sparseCheckpoint(t *testing.T, n int64) *backend.Store {
	t.Helper()
	dir := t.TempDir()
	ckpttest.SparseTensorCheckpoint(t, dir, n)
	st, err := backend.Open(context.Background(), dir)
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })
	return st
}

// Regression (issue 16): verify --deep allocated a read buffer of a whole
// chunk (a 3 GiB chunk cost 3.1 GB RSS; a 64 GiB sparse object died out of
// memory). A chunk larger than a read buffer is now streamed: a 1 GiB
// chunk is checked with a few MiB allocated.
func TestDeepVerifyOfAHugeChunkIsBoundedInMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("reads 1 GiB")
	}
	const n = 1 << 30
	st := sparseCheckpoint(t, n)
	ctx := context.Background()
	c, err := loader.Open(ctx, st)
	require.NoError(t, err)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	rep, err := c.Verify(ctx, loader.VerifyOptions{Deep: true})
	require.NoError(t, err)
	runtime.ReadMemStats(&after)
	require.True(t, rep.Resumable, "%v", rep.Problems)
	require.Equal(t, int64(n), rep.BytesChecked)
	allocated := after.TotalAlloc - before.TotalAlloc
	require.Less(t, allocated, uint64(64<<20), "bytes allocated to check a 1 GiB chunk")
	t.Logf("deep verify of a %d MiB chunk allocated %.1f MiB", n>>20, float64(allocated)/(1<<20))

	// A flipped byte is still found, and named.
	f, err := os.OpenFile(filepath.Join(st.String()[len("file://"):], "rank-00000-000.data"), os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteAt([]byte{1}, n-7)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	rep, err = c.Verify(ctx, loader.VerifyOptions{Deep: true})
	require.NoError(t, err)
	require.False(t, rep.Resumable)
	require.Equal(t, loader.RuleChecksum, rep.Problems[0].Rule)
	require.Contains(t, rep.Problems[0].Message, `key "model.big"`)
}

// Regression (issue 16): an 8 KB metadata object declaring a 64 GiB chunk
// made inspect --hash die out of memory: ReadTensor allocated the tensor
// before looking at the object, which holds a few bytes. It now checks the
// stored object first and refuses, naming it, without allocating.
func TestReadTensorChecksTheObjectBeforeAllocating(t *testing.T) {
	st := sparseCheckpoint(t, 16)
	ctx := context.Background()
	raw, err := st.ReadAll(ctx, metadata.ObjectKey, metadata.MaxSize)
	require.NoError(t, err)
	md, err := metadata.Decode(raw)
	require.NoError(t, err)
	const huge = 64 << 30
	md.Tensors[0].Shape, md.Tensors[0].Chunks[0].Sizes, md.Tensors[0].Chunks[0].Length = []int64{huge}, []int64{huge}, huge
	md.Objects[0].Size = huge
	enc, err := metadata.Encode(md)
	require.NoError(t, err)
	require.NoError(t, st.PutBytes(ctx, metadata.ObjectKey, enc, backend.PutOptions{}))
	c, err := loader.Open(ctx, st)
	require.NoError(t, err)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err = c.ReadTensor(ctx, "model.big")
	runtime.ReadMemStats(&after)
	require.ErrorIs(t, err, loader.ErrMissingObject)
	require.Contains(t, err.Error(), "rank-00000-000.data is past its end (16 bytes stored)")
	require.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(1<<20))
}

// Regression (issue 16): a 2 GiB metadata object cost 2.1 GB of memory
// before it was refused, and was refused as an internal error (exit 2).
// The size the response announces is checked before a byte is read: it is
// refused at once as invalid metadata (a bad checkpoint).
func TestOversizedMetadataIsRefusedUnread(t *testing.T) {
	dir := t.TempDir()
	f, err := os.Create(filepath.Join(dir, metadata.ObjectKey))
	require.NoError(t, err)
	require.NoError(t, f.Truncate(2<<30)) // sparse
	require.NoError(t, f.Close())
	st, err := backend.Open(context.Background(), dir)
	require.NoError(t, err)
	defer st.Close()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err = loader.Open(context.Background(), st)
	runtime.ReadMemStats(&after)
	require.ErrorIs(t, err, metadata.ErrInvalid)
	require.ErrorIs(t, err, backend.ErrObjectTooLarge)
	require.Equal(t, ckpterr.BadCheckpoint, ckpterr.ClassOf(err))
	require.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(1<<20), "nothing of it was read")
}

// Regression (issue 16, found by the campaign): every read buffer of a
// verify or load had the capacity of the 64 MiB read cap, whatever the
// checkpoint held: a deep verify of a 10 KB checkpoint allocated 64 MiB
// per concurrent read. Buffers are now the size of the plan's largest read.
func TestSmallCheckpointCostsSmallBuffers(t *testing.T) {
	run := ckpttest.OpenURL(t, "file://"+t.TempDir())
	s := ckpttest.NewState(9, 16)
	st := ckpttest.SaveStep(t, run, 1, s, 2)
	ctx := context.Background()
	c, err := loader.Open(ctx, st)
	require.NoError(t, err)
	targets := ckpttest.Targets(s.Shard(2))
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	rep, err := c.Verify(ctx, loader.VerifyOptions{Deep: true})
	require.NoError(t, err)
	require.True(t, rep.Resumable)
	_, err = c.Load(ctx, targets, loader.Options{})
	require.NoError(t, err)
	runtime.ReadMemStats(&after)
	require.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(4<<20), "bytes allocated to verify and load a %d-byte checkpoint", rep.BytesChecked)
}

// WriteTensor yields exactly ReadTensor's bytes, for row-sharded native
// tensors (streamed chunk by chunk) and DCP tensors (assembled in slabs).
func TestWriteTensorMatchesReadTensor(t *testing.T) {
	ctx := context.Background()
	run := ckpttest.OpenURL(t, "file://"+t.TempDir())
	native := ckpttest.SaveStep(t, run, 1, ckpttest.NewState(4, 9), 3)
	dcp, err := backend.Open(ctx, "../interop/torchdcp/testdata/dense")
	require.NoError(t, err)
	defer dcp.Close()
	for _, st := range []*backend.Store{native, dcp} {
		c, err := loader.Open(ctx, st)
		require.NoError(t, err)
		for _, te := range c.Metadata().Tensors {
			want, err := c.ReadTensor(ctx, te.Key)
			require.NoError(t, err, te.Key)
			h := sha256.New()
			require.NoError(t, c.WriteTensor(ctx, te.Key, h), te.Key)
			sum := sha256.Sum256(want.Data)
			require.Equal(t, sum[:], h.Sum(nil), "%s %s", st, te.Key)
		}
	}
}

// Regression (issue 16): inspect --hash held whole tensors (a 3 GiB chunk,
// 3 GiB of memory). WriteTensor streams a 1 GiB chunk into a hash with a
// few MiB allocated, and still refuses a flipped byte.
func TestWriteTensorOfAHugeChunkIsBoundedInMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("reads 1 GiB")
	}
	st := sparseCheckpoint(t, 1<<30)
	ctx := context.Background()
	c, err := loader.Open(ctx, st)
	require.NoError(t, err)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	h := sha256.New()
	require.NoError(t, c.WriteTensor(ctx, "model.big", h))
	runtime.ReadMemStats(&after)
	require.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(64<<20))
	path := filepath.Join(st.String()[len("file://"):], "rank-00000-000.data")
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteAt([]byte{1}, 12345)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	require.ErrorIs(t, c.WriteTensor(ctx, "model.big", sha256.New()), loader.ErrChecksum)
}

// An object cut short, here exactly at a streaming piece boundary, is a
// missing object named with its tensor, never a bare io.EOF.
func TestWriteTensorOfATruncatedObjectIsAMissingObject(t *testing.T) {
	const n = 16 << 20
	st := sparseCheckpoint(t, n)
	ctx := context.Background()
	c, err := loader.Open(ctx, st)
	require.NoError(t, err)
	path := filepath.Join(st.String()[len("file://"):], "rank-00000-000.data")
	require.NoError(t, os.Truncate(path, 8<<20))
	err = c.WriteTensor(ctx, "model.big", sha256.New())
	require.ErrorIs(t, err, loader.ErrMissingObject)
	require.Equal(t, ckpterr.BadCheckpoint, ckpterr.ClassOf(err))
	require.Contains(t, err.Error(), "model.big")
}
