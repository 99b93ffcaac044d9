package torchdcp_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/ckpterr"
	"github.com/ckptkit/ckptkit/internal/testkit/ckpttest"
	"github.com/ckptkit/ckptkit/interop/torchdcp"
	"github.com/ckptkit/ckptkit/loader"
)

// Regression (issue 16): a DCP item read for the training state whose
// pickle names a forbidden global was taken for an opaque value: for the
// optimizer's parameter list (FillParams) the checkpoint opened with the set
// silently unknown. Opening a real fixture with such an item planted now
// fails, naming the item and the global; nothing is evaluated.
func TestForbiddenGlobalInATrainingItemIsReported(t *testing.T) {
	for _, key := range []string{"optimizer.param_groups.0.params", "step"} {
		t.Run(key, func(t *testing.T) {
			dir := copyCase(t, "dense")
			ckpttest.PlantForbiddenGlobal(t, dir, key)
			_, err := loader.Open(context.Background(), openStore(t, dir))
			require.ErrorIs(t, err, torchdcp.ErrForbiddenGlobal)
			assert.NotErrorIs(t, err, torchdcp.ErrOpaque)
			assert.Equal(t, ckpterr.BadCheckpoint, ckpterr.ClassOf(err))
			var fg *torchdcp.ForbiddenGlobalError
			require.ErrorAs(t, err, &fg)
			assert.Equal(t, "posix", fg.Module)
			assert.Equal(t, "system", fg.Name)
			assert.Contains(t, err.Error(), `"`+key+`"`)
		})
	}
}

// Issue 29: a forbidden global in ANY bytes item (here the learning rate,
// which no training-state field is read from) is a bad checkpoint: the
// open refuses it, naming key and global, and a load, ReadBytes or a deep
// verify of a checkpoint opened before the item was replaced refuses it
// too (the bytes decoder never hands such an item over raw).
func TestForbiddenGlobalInAnyBytesItemIsRefused(t *testing.T) {
	const key = "optimizer.param_groups.0.lr"
	check := func(t *testing.T, err error) {
		t.Helper()
		require.ErrorIs(t, err, torchdcp.ErrForbiddenGlobal)
		assert.Equal(t, ckpterr.BadCheckpoint, ckpterr.ClassOf(err))
		var fg *torchdcp.ForbiddenGlobalError
		require.ErrorAs(t, err, &fg)
		assert.Equal(t, "posix.system", fg.Module+"."+fg.Name)
		assert.Contains(t, err.Error(), `"`+key+`"`)
	}
	dir := copyCase(t, "dense")
	c, err := loader.Open(context.Background(), openStore(t, dir)) // opened while the item is benign
	require.NoError(t, err)
	ckpttest.PlantForbiddenGlobal(t, dir, key)

	_, err = loader.Open(context.Background(), openStore(t, dir))
	check(t, err)
	_, err = c.ReadBytes(context.Background(), key)
	check(t, err)
	rep, err := c.Verify(context.Background(), loader.VerifyOptions{Deep: true})
	require.NoError(t, err)
	require.False(t, rep.Resumable)
	require.NotEmpty(t, rep.Problems)
	assert.Contains(t, rep.Problems[0].Message, key)
	assert.Contains(t, rep.Problems[0].Message, "posix.system")
}
