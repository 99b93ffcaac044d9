package loader_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/internal/testkit/ckpttest"
	"github.com/ckptkit/ckptkit/loader"
	"github.com/ckptkit/ckptkit/saver"
	"github.com/ckptkit/ckptkit/statedict"
)

// withoutState is sd with no per-parameter optimizer state: what a save
// before the first optimizer step holds (the param groups, no state).
func withoutState(sd *statedict.StateDict) *statedict.StateDict {
	for k := range sd.Tensors {
		if strings.HasPrefix(k, statedict.StatePrefix(statedict.DefaultOptimizerPrefix)) {
			delete(sd.Tensors, k)
		}
	}
	return sd
}

// Issue 30: a checkpoint saved before the first optimizer step resumes
// with the optimizer, every parameter lazily absent (its state left as
// the target has it), the model loaded; a checkpoint whose optimizer state
// belongs to other parameters still is a layout mismatch.
func TestStepZeroNativeCheckpointResumesWithTheOptimizer(t *testing.T) {
	ctx := context.Background()
	st, err := backend.Open(ctx, "file://"+t.TempDir())
	require.NoError(t, err)
	saved := withoutState(groupedState())
	_, err = saver.SaveLocal(ctx, st, []*statedict.StateDict{saved}, saver.Options{})
	require.NoError(t, err)

	target := groupedTarget(savedGroups)
	rep, err := loader.Load(ctx, st, []*statedict.StateDict{target}, loader.Options{ParamGroups: savedGroups})
	require.NoError(t, err)
	assert.True(t, rep.OptimizerLoaded)
	assert.Equal(t, []string{"a", "b", "c"}, rep.LazyParams)
	for k, sh := range target.Tensors {
		if strings.HasPrefix(k, "model.") {
			assert.Equal(t, saved.Tensors[k].Data, sh.Data, k)
			continue
		}
		for _, b := range sh.Data {
			require.Equal(t, byte(0xab), b, "lazy state %s left as the target has it", k)
		}
	}

	// Contrast: state saved, but keyed by other names (a torch optimizer
	// state dict keyed by index: "0", "1", "2") than the target's
	// parameters: none matches, a layout mismatch, not a step-0 save.
	other := groupedStateOf("0", "1", "2")
	for k, v := range groupedState().Tensors {
		if strings.HasPrefix(k, "model.") {
			other.Tensors[k] = v
		}
	}
	for k := range other.Tensors {
		if strings.HasPrefix(k, "model.") && strings.ContainsAny(k[len("model."):], "012") {
			delete(other.Tensors, k)
		}
	}
	st2, err := backend.Open(ctx, "file://"+t.TempDir())
	require.NoError(t, err)
	_, err = saver.SaveLocal(ctx, st2, []*statedict.StateDict{other}, saver.Options{})
	require.NoError(t, err)
	_, err = loader.Load(ctx, st2, []*statedict.StateDict{groupedTarget(savedGroups)}, loader.Options{})
	require.ErrorIs(t, err, loader.ErrLayoutMismatch)
}

// groupedStateOf is groupedState's shape over other parameters, one group.
func groupedStateOf(fqns ...string) *statedict.StateDict {
	return ckpttest.GroupedState(4, fqns)
}
