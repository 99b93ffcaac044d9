package native_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/catalog"
	"github.com/ckptkit/ckptkit/convert/native"
	"github.com/ckptkit/ckptkit/internal/testkit/ckpttest"
	"github.com/ckptkit/ckptkit/loader"
	"github.com/ckptkit/ckptkit/metadata"
	"github.com/ckptkit/ckptkit/ops/diff"
)

func TestConvertToNative(t *testing.T) {
	for _, b := range ckpttest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			run := b.Open(t)
			s := ckpttest.NewState(3, 7)
			srcSt := ckpttest.SaveStep(t, run, 3, s, 3)
			src, err := loader.Open(ctx, srcSt)
			require.NoError(t, err)

			dst, err := run.Sub("converted")
			require.NoError(t, err)
			res, err := native.Convert(ctx, src, dst, native.Options{MaxMemory: 1 << 20})
			require.NoError(t, err)
			assert.Equal(t, 1, res.Metadata.WorldSize)
			assert.Equal(t, int64(3), res.Metadata.Training.Iteration)
			ckpttest.RequireLoads(t, dst, s)
			out, err := loader.Open(ctx, dst)
			require.NoError(t, err)
			rep, err := diff.Compare(ctx, src, out, diff.Options{})
			require.NoError(t, err)
			assert.True(t, rep.Identical)

			mo, err := run.Sub("model-only")
			require.NoError(t, err)
			res, err = native.Convert(ctx, src, mo, native.Options{ModelOnly: true})
			require.NoError(t, err)
			assert.Equal(t, metadata.OptimizerOmitted, res.Metadata.Training.Optimizer)
			for _, te := range res.Metadata.Tensors {
				assert.True(t, strings.HasPrefix(te.Key, "model."), te.Key)
			}
			assert.Empty(t, res.Metadata.Bytes)

			tooSmall, err := run.Sub(catalog.StepName(99))
			require.NoError(t, err)
			_, err = native.Convert(ctx, src, tooSmall, native.Options{MaxMemory: 100})
			require.ErrorIs(t, err, native.ErrCheckpointTooLarge)
		})
	}
}
