package loader_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/loader"
	"github.com/ckptkit/ckptkit/metadata"
	"github.com/ckptkit/ckptkit/progress"
)

// manyChunkCheckpoint writes a checkpoint of one float32 tensor of n
// elements saved as n one-element chunks, plus a tensor of one chunk, and
// returns its directory.
func manyChunkCheckpoint(t *testing.T, n int) string {
	t.Helper()
	dir := t.TempDir()
	const obj = "rank-00000-000.data"
	castagnoli := crc32.MakeTable(crc32.Castagnoli)
	data := make([]byte, 4*n+8)
	te := metadata.TensorEntry{Key: "model.w", DType: "float32", Shape: []int64{int64(n)}, Chunks: make([]metadata.Chunk, n)}
	for i := range n {
		binary.LittleEndian.PutUint32(data[4*i:], uint32(i))
		te.Chunks[i] = metadata.Chunk{Offsets: []int64{int64(i)}, Sizes: []int64{1}, Object: obj, Offset: 4 * int64(i), Length: 4,
			CRC32C: crc32.Checksum(data[4*i:4*i+4], castagnoli)}
	}
	small := metadata.TensorEntry{Key: "model.b", DType: "float32", Shape: []int64{2},
		Chunks: []metadata.Chunk{{Offsets: []int64{0}, Sizes: []int64{2}, Object: obj, Offset: 4 * int64(n), Length: 8, CRC32C: crc32.Checksum(data[4*n:], castagnoli)}}}
	md := &metadata.Checkpoint{WorldSize: 1, Training: metadata.TrainingState{Optimizer: metadata.OptimizerNone},
		Tensors: []metadata.TensorEntry{te, small}, Objects: []metadata.ObjectEntry{{Key: obj, Size: int64(len(data))}}}
	enc, err := metadata.Encode(md)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, obj), data, 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, metadata.ObjectKey), enc, 0o644))
	return dir
}

// Regression (issue 16, memory far above input): verify --deep planned the
// reads of every chunk at once, a load plan several times the metadata's
// size (4M chunks of one tensor: 2.1 GB RSS for 452 MiB of metadata). It
// now plans its own reads 64k chunks at a time, a tensor of more in
// several batches: every chunk is still read once and checked, and a bad
// one named.
func TestDeepVerifyOfManyChunksIsBatched(t *testing.T) {
	const n = 200_000 // three batches and a part of a fourth
	dir := manyChunkCheckpoint(t, n)
	ctx := context.Background()
	st, err := backend.Open(ctx, dir)
	require.NoError(t, err)
	defer st.Close()
	c, err := loader.Open(ctx, st)
	require.NoError(t, err)

	// The heap live while chunks are checked (measured at each progress
	// call, after a collection) holds the plan of one batch, not of all.
	var base runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&base)
	var last, total int64
	var maxLive uint64
	rep, err := c.Verify(ctx, loader.VerifyOptions{Deep: true, Concurrency: 1, Progress: func(u progress.Update) {
		last, total = u.Done, u.Total
		var m runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&m)
		maxLive = max(maxLive, m.HeapAlloc-min(m.HeapAlloc, base.HeapAlloc))
	}})
	require.NoError(t, err)
	require.True(t, rep.Resumable, "%v", rep.Problems)
	require.Equal(t, int64(4*n+8), rep.BytesChecked, "every chunk read once")
	require.Equal(t, total, last, "progress reaches its total")
	require.Equal(t, int64(4*n+8), total)
	t.Logf("deep verify of %d chunks (%d-byte metadata): at most %.1f MiB live above the open checkpoint", n, c.MetadataSize(), float64(maxLive)/(1<<20))
	require.Less(t, maxLive, uint64(c.MetadataSize()), "live memory while checking")

	// A bad chunk in the last batch of the big tensor is found and named.
	f, err := os.OpenFile(filepath.Join(dir, "rank-00000-000.data"), os.O_WRONLY, 0)
	require.NoError(t, err)
	bad := n - 10
	_, err = f.WriteAt([]byte{0xff}, int64(4*bad))
	require.NoError(t, err)
	require.NoError(t, f.Close())
	rep, err = c.Verify(ctx, loader.VerifyOptions{Deep: true})
	require.NoError(t, err)
	require.False(t, rep.Resumable)
	require.Len(t, rep.Problems, 1, "%v", rep.Problems)
	require.Equal(t, loader.RuleChecksum, rep.Problems[0].Rule)
	require.Contains(t, rep.Problems[0].Message, `key "model.w"`)
	require.Contains(t, rep.Problems[0].Message, fmt.Sprint("offset ", 4*bad))
}
