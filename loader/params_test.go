package loader_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/loader"
	"github.com/ckptkit/ckptkit/saver"
	"github.com/ckptkit/ckptkit/statedict"
)

// moeState is a model with a registered buffer (norm.running_mean, never
// optimizer state), a trained parameter (embed.weight, with AdamW state)
// and an unrouted expert (expert.weight, no state yet).
func moeState() *statedict.StateDict {
	sd := statedict.New()
	sd.Tensors["model.embed.weight"] = tensor(2)
	sd.Tensors["model.expert.weight"] = tensor(3)
	sd.Tensors["model.norm.running_mean"] = tensor(2)
	sd.Tensors[statedict.StateKey("optimizer", "embed.weight", statedict.SlotStep)] = tensor()
	sd.Tensors[statedict.StateKey("optimizer", "embed.weight", statedict.SlotExpAvg)] = tensor(2)
	sd.Tensors[statedict.StateKey("optimizer", "embed.weight", statedict.SlotExpAvgSq)] = tensor(2)
	return sd
}

var moeParams = []string{"expert.weight", "embed.weight"}

// TestVerifyLazyParamsFromRecordedParameterSet: the saver records the
// parameter set (from Options.Params, or from the param groups' params
// values) and verify reports only parameters of it without state, never
// the buffer; a checkpoint without the record falls back to every model
// key, buffer included (the documented behaviour of older checkpoints).
func TestVerifyLazyParamsFromRecordedParameterSet(t *testing.T) {
	ctx := context.Background()
	explicit := saveOne(t, "params-explicit", moeState(), saver.Options{Params: moeParams})

	fromGroups := moeState()
	fromGroups.Bytes[statedict.ParamGroupKey("optimizer", 0, statedict.ParamsField)] = []byte(`["expert.weight","embed.weight"]`)
	derived := saveOne(t, "params-derived", fromGroups, saver.Options{})

	for name, st := range map[string]*backend.Store{"explicit": explicit, "param groups": derived} {
		t.Run(name, func(t *testing.T) {
			c, err := loader.Open(ctx, st)
			require.NoError(t, err)
			assert.Equal(t, []string{"embed.weight", "expert.weight"}, c.Metadata().Training.Params, "recorded, sorted")
			rep, err := c.Verify(ctx, loader.VerifyOptions{})
			require.NoError(t, err)
			assert.True(t, rep.Resumable, "%+v", rep.Problems)
			assert.Equal(t, []string{"expert.weight"}, rep.LazyParams, "the buffer norm.running_mean is no parameter")
		})
	}

	legacy := saveOne(t, "params-none", moeState(), saver.Options{})
	rep, err := loader.Verify(ctx, legacy, loader.VerifyOptions{})
	require.NoError(t, err)
	assert.Equal(t, []string{"expert.weight", "norm.running_mean"}, rep.LazyParams, "without a record every model key counts as a parameter")
}

// TestLayoutGuardUsesRecordedParameterSet: with the parameter set
// recorded, a target whose optimizer state is all absent is a layout
// mismatch unless its parameters are the checkpoint's (renamed
// flattening: "module.<fqn>"), even though the checkpoint's saved state
// matches its own model keys; a target of only unrouted experts that are
// in the set loads as lazily absent.
func TestLayoutGuardUsesRecordedParameterSet(t *testing.T) {
	ctx := context.Background()
	st := saveOne(t, "layout-recorded", moeState(), saver.Options{Params: moeParams})

	renamed := statedict.New()
	renamed.Tensors["model.embed.weight"] = zeros(2)
	adamTarget(renamed, "optimizer", "module.embed.weight", 2)
	_, err := loader.Load(ctx, st, []*statedict.StateDict{renamed}, loader.Options{Logger: quiet()})
	require.ErrorIs(t, err, loader.ErrLayoutMismatch)

	experts := statedict.New()
	experts.Tensors["model.expert.weight"] = zeros(3)
	adamTarget(experts, "optimizer", "expert.weight", 3)
	rep, err := loader.Load(ctx, st, []*statedict.StateDict{experts}, loader.Options{Logger: quiet()})
	require.NoError(t, err)
	assert.Equal(t, []string{"expert.weight"}, rep.LazyParams)
	assert.Equal(t, tensor(3).Data, experts.Tensors["model.expert.weight"].Data)
}
