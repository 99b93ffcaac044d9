package loader_test

import (
	"context"
	"hash/crc32"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	_ "github.com/ckptkit/ckptkit/backend/fs"
	"github.com/ckptkit/ckptkit/ckpterr"
	"github.com/ckptkit/ckptkit/loader"
	"github.com/ckptkit/ckptkit/metadata"
	"github.com/ckptkit/ckptkit/saver"
	"github.com/ckptkit/ckptkit/statedict"
)

// Regression (issue 16): a bool tensor whose stored byte is 0x02, with a
// CRC32C that matches it, loaded as "true" instead of failing. docs/FORMAT.md
// allows only 0x00 and 0x01; every read of the chunk (load, ReadTensor,
// verify --deep) now refuses it as a bad checkpoint naming the key.
func TestBoolBytesOtherThanZeroOrOneAreRefused(t *testing.T) {
	ctx := context.Background()
	st, err := backend.Open(ctx, "file://"+t.TempDir())
	require.NoError(t, err)
	t.Cleanup(func() { _ = st.Close() })
	mask := statedict.NewTensor(statedict.Bool, 4)
	copy(mask.Data, []byte{0, 1, 1, 0})
	sd := statedict.New()
	sd.Tensors["model.mask"] = statedict.Whole(mask)
	_, err = saver.SaveLocal(ctx, st, []*statedict.StateDict{sd}, saver.Options{Iteration: 1})
	require.NoError(t, err)

	// A valid bool tensor loads.
	c, err := loader.Open(ctx, st)
	require.NoError(t, err)
	got, err := c.ReadTensor(ctx, "model.mask")
	require.NoError(t, err)
	require.Equal(t, mask.Data, got.Data)

	// Store 0x02 for element 2 and give the chunk the CRC32C of its new
	// bytes, so that only the bool rule can catch it.
	raw, err := st.ReadAll(ctx, metadata.ObjectKey, metadata.MaxSize)
	require.NoError(t, err)
	md, err := metadata.Decode(raw)
	require.NoError(t, err)
	ch := &md.Tensor("model.mask").Chunks[0]
	data, err := st.ReadAll(ctx, ch.Object, 0)
	require.NoError(t, err)
	data[ch.Offset+2] = 0x02
	ch.CRC32C = crc32.Checksum(data[ch.Offset:ch.Offset+ch.Length], crc32.MakeTable(crc32.Castagnoli))
	require.NoError(t, st.PutBytes(ctx, ch.Object, data, backend.PutOptions{}))
	enc, err := metadata.Encode(md)
	require.NoError(t, err)
	require.NoError(t, st.PutBytes(ctx, metadata.ObjectKey, enc, backend.PutOptions{}))

	c, err = loader.Open(ctx, st)
	require.NoError(t, err)
	_, err = c.ReadTensor(ctx, "model.mask")
	require.ErrorIs(t, err, loader.ErrInvalidBool)
	require.Equal(t, ckpterr.BadCheckpoint, ckpterr.ClassOf(err))
	require.Contains(t, err.Error(), `"model.mask"`)
	require.Contains(t, err.Error(), "element 2")

	target := statedict.New()
	target.Tensors["model.mask"] = statedict.Whole(statedict.NewTensor(statedict.Bool, 4))
	_, err = loader.Load(ctx, st, []*statedict.StateDict{target}, loader.Options{Logger: quiet()})
	require.ErrorIs(t, err, loader.ErrInvalidBool)

	rep, err := loader.Verify(ctx, st, loader.VerifyOptions{Deep: true})
	require.NoError(t, err)
	require.False(t, rep.Resumable)
	require.Len(t, rep.Problems, 1)
	require.Equal(t, "model.mask", rep.Problems[0].Key)
	require.Contains(t, rep.Problems[0].Message, "0x02")
}
