package safetensors

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/metadata"
)

func rowChunk(lo, n, cols int64) metadata.Chunk {
	return metadata.Chunk{Offsets: []int64{lo, 0}, Sizes: []int64{n, cols}, Length: n * cols * 4}
}

func TestSlabs(t *testing.T) {
	rows := &metadata.TensorEntry{Key: "w", DType: "float32", Shape: []int64{8, 2},
		Chunks: []metadata.Chunk{rowChunk(0, 2, 2), rowChunk(2, 2, 2), rowChunk(4, 4, 2)}}
	// Each chunk costs 2x its 16 or 32 bytes.
	r, err := slabs(rows, 0)
	require.NoError(t, err)
	assert.Equal(t, []*[2]int64{nil}, r)
	r, err = slabs(rows, 64)
	require.NoError(t, err)
	assert.Equal(t, []*[2]int64{{0, 4}, {4, 8}}, r)
	r, err = slabs(rows, 1000)
	require.NoError(t, err)
	assert.Equal(t, []*[2]int64{{0, 8}}, r)
	_, err = slabs(rows, 63)
	require.ErrorIs(t, err, ErrTensorTooLarge)

	// Column shards: every row range touches both chunks, so the smallest
	// slab holds them whole.
	cols := &metadata.TensorEntry{Key: "c", DType: "float32", Shape: []int64{4, 4}, Chunks: []metadata.Chunk{
		{Offsets: []int64{0, 0}, Sizes: []int64{4, 2}, Length: 32}, {Offsets: []int64{0, 2}, Sizes: []int64{4, 2}, Length: 32}}}
	r, err = slabs(cols, 128)
	require.NoError(t, err)
	assert.Equal(t, []*[2]int64{{0, 4}}, r)
	_, err = slabs(cols, 127)
	require.ErrorIs(t, err, ErrTensorTooLarge)

	scalar := &metadata.TensorEntry{Key: "s", DType: "float64", Chunks: []metadata.Chunk{{Length: 8}}}
	r, err = slabs(scalar, 16)
	require.NoError(t, err)
	assert.Equal(t, []*[2]int64{nil}, r)
	_, err = slabs(scalar, 15)
	require.ErrorIs(t, err, ErrTensorTooLarge)
}
