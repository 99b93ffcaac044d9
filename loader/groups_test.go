package loader_test

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	_ "github.com/ckptkit/ckptkit/backend/fs"
	"github.com/ckptkit/ckptkit/ckpterr"
	"github.com/ckptkit/ckptkit/internal/testkit/ckpttest"
	_ "github.com/ckptkit/ckptkit/interop/torchdcp"
	"github.com/ckptkit/ckptkit/loader"
	"github.com/ckptkit/ckptkit/saver"
	"github.com/ckptkit/ckptkit/statedict"
)

// savedGroups are the param groups of the checkpoints saved here.
var savedGroups = [][]string{{"a", "b"}, {"c"}}

// groupedState is a model of parameters a, b and c with AdamW state, in
// two param groups, {a, b} and {c}, each with its lr.
func groupedState() *statedict.StateDict {
	sd := ckpttest.GroupedState(4, savedGroups...)
	sd.Bytes[statedict.ParamGroupKey("optimizer", 0, "lr")] = []byte(`0.01`)
	sd.Bytes[statedict.ParamGroupKey("optimizer", 1, "lr")] = []byte(`0.005`)
	return sd
}

// groupedTarget is the load target of an optimizer with groups: every
// tensor filled with 0xab, every bytes value (each group's params and lr)
// "untouched".
func groupedTarget(groups [][]string) *statedict.StateDict {
	sd := ckpttest.GroupedState(4, groups...)
	for _, sh := range sd.Tensors {
		for i := range sh.Data {
			sh.Data[i] = 0xab
		}
	}
	for i := range groups {
		sd.Bytes[statedict.ParamGroupKey("optimizer", i, statedict.ParamsField)] = []byte("untouched")
		sd.Bytes[statedict.ParamGroupKey("optimizer", i, "lr")] = []byte("untouched")
	}
	return sd
}

// unchanged asserts every tensor byte of sd is still 0xab and every bytes
// value still "untouched".
func unchanged(t *testing.T, sd *statedict.StateDict) {
	t.Helper()
	for k, sh := range sd.Tensors {
		assert.Equal(t, bytes.Repeat([]byte{0xab}, len(sh.Data)), sh.Data, "tensor %s was written", k)
	}
	for k, v := range sd.Bytes {
		assert.Equal(t, "untouched", string(v), "bytes %s was written", k)
	}
}

// TestOtherParamGroupsFailBeforeAnyTargetByte: a target whose optimizer
// has other param groups than the checkpoint's (another count, or a
// parameter moved between groups) fails with ErrLayoutMismatch naming the
// group and the fqn, and every target byte is as it was, in the default
// one-pass load and the transactional one, on a real file store.
func TestOtherParamGroupsFailBeforeAnyTargetByte(t *testing.T) {
	ctx := context.Background()
	st, err := backend.Open(ctx, "file://"+t.TempDir())
	require.NoError(t, err)
	_, err = saver.SaveLocal(ctx, st, []*statedict.StateDict{groupedState()}, saver.Options{})
	require.NoError(t, err)

	cases := map[string]struct {
		groups [][]string
		says   []string
	}{
		"moved": {[][]string{{"a"}, {"b", "c"}}, []string{"param group 0", "b is in the checkpoint's group but in the target's group 1", "param group 1"}},
		"fewer": {[][]string{{"a", "b", "c"}}, []string{"the checkpoint has 2 optimizer param group(s)", "the target's optimizer has 1"}},
		// The target asks for group 2's keys too: without the rule this
		// was ErrMissingKeys, not the layout it is.
		"more":    {[][]string{{"a"}, {"b"}, {"c"}}, []string{"the checkpoint has 2 optimizer param group(s)", "the target's optimizer has 3"}},
		"swapped": {[][]string{{"c"}, {"a", "b"}}, []string{"param group 0", "c is in the target's group but in the checkpoint's group 1"}},
	}
	for name, tc := range cases {
		for mode, transactional := range map[string]bool{"one-pass": false, "transactional": true} {
			t.Run(name+"/"+mode, func(t *testing.T) {
				target := groupedTarget(tc.groups)
				_, err := loader.Load(ctx, st, []*statedict.StateDict{target}, loader.Options{ParamGroups: tc.groups, Transactional: transactional})
				require.ErrorIs(t, err, loader.ErrLayoutMismatch)
				assert.ErrorIs(t, err, ckpterr.ErrBadCheckpoint)
				assert.NotErrorIs(t, err, loader.ErrTargetsPartlyFilled)
				for _, s := range tc.says {
					assert.Contains(t, err.Error(), s)
				}
				unchanged(t, target)
			})
		}
	}
}

// TestSameParamGroupsLoad: the same groups, their members in another
// order, load; the group values themselves land in the targets; without
// ParamGroups (the Go API's zero value) nothing is compared.
func TestSameParamGroupsLoad(t *testing.T) {
	ctx := context.Background()
	st, err := backend.Open(ctx, "file://"+t.TempDir())
	require.NoError(t, err)
	want := groupedState()
	_, err = saver.SaveLocal(ctx, st, []*statedict.StateDict{groupedState()}, saver.Options{})
	require.NoError(t, err)

	for name, groups := range map[string][][]string{"reordered": {{"b", "a"}, {"c"}}, "unchecked": nil} {
		t.Run(name, func(t *testing.T) {
			target := groupedTarget(savedGroups)
			rep, err := loader.Load(ctx, st, []*statedict.StateDict{target}, loader.Options{ParamGroups: groups})
			require.NoError(t, err)
			assert.True(t, rep.OptimizerLoaded)
			for k, sh := range target.Tensors {
				assert.Equal(t, want.Tensors[k].Data, sh.Data, k)
			}
			assert.Equal(t, groupedState().Bytes, target.Bytes)
		})
	}
}

// TestParamGroupsOfATorchWrittenCheckpoint: the rule reads the groups of
// a DCP checkpoint torch 2 wrote (pickled lists of fqns).
func TestParamGroupsOfATorchWrittenCheckpoint(t *testing.T) {
	ctx := context.Background()
	st, err := backend.Open(ctx, "../interop/torchdcp/testdata/torch2.6/lazy_moe2")
	require.NoError(t, err)
	all := []string{"embed.weight", "embed.bias", "router.weight", "router.bias",
		"experts.0.w_in.weight", "experts.0.w_in.bias", "experts.0.w_out.weight", "experts.0.w_out.bias",
		"experts.1.w_in.weight", "experts.1.w_in.bias", "experts.1.w_out.weight", "experts.1.w_out.bias",
		"head.weight", "head.bias"}
	lr := statedict.ParamGroupKey("optimizer", 0, "lr")
	target := func() *statedict.StateDict {
		sd := statedict.New()
		sd.Bytes[lr] = []byte("untouched")
		return sd
	}

	ok := target()
	_, err = loader.Load(ctx, st, []*statedict.StateDict{ok}, loader.Options{ParamGroups: [][]string{all}})
	require.NoError(t, err)
	assert.Equal(t, "0.0005", string(ok.Bytes[lr]))

	bad := target()
	_, err = loader.Load(ctx, st, []*statedict.StateDict{bad}, loader.Options{ParamGroups: [][]string{all[1:]}})
	require.ErrorIs(t, err, loader.ErrLayoutMismatch)
	assert.Contains(t, err.Error(), "embed.weight is in the checkpoint's group but in the target's no group")
	assert.Equal(t, "untouched", string(bad.Bytes[lr]))
}

// Regression (review): "param_groups.00.params" next to
// "param_groups.0.params" names group 0 twice; one of them used to be
// dropped silently and the group count compared against the wrong number.
// Such a checkpoint is refused, before any target byte is written.
func TestNonCanonicalParamGroupIndexIsRefused(t *testing.T) {
	ctx := context.Background()
	st, err := backend.Open(ctx, "file://"+t.TempDir())
	require.NoError(t, err)
	sd := groupedState()
	sd.Bytes["optimizer.param_groups.00.params"] = []byte(`["c"]`)
	_, err = saver.SaveLocal(ctx, st, []*statedict.StateDict{sd}, saver.Options{})
	require.NoError(t, err)

	target := groupedTarget(savedGroups)
	_, err = loader.Load(ctx, st, []*statedict.StateDict{target}, loader.Options{ParamGroups: savedGroups})
	require.ErrorIs(t, err, loader.ErrLayoutMismatch)
	assert.Contains(t, err.Error(), "param_groups.00.params")
	unchanged(t, target)
}
