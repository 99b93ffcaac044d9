package torchdcp_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/ckpterr"
	"github.com/ckptkit/ckptkit/internal/ckpttest"
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
