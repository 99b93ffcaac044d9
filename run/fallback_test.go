package run_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/internal/testkit/ckpttest"
	"github.com/ckptkit/ckptkit/internal/testkit/damage"
	"github.com/ckptkit/ckptkit/loader"
	"github.com/ckptkit/ckptkit/run"
	"github.com/ckptkit/ckptkit/saver"
	"github.com/ckptkit/ckptkit/statedict"
)

// damagedNewest saves two checkpoints of a run, step 3 with the param
// groups older and step 6 with newer, flips a data byte of step 6 (its
// metadata still verifies) and returns the run and the newest checkpoint
// found.
func damagedNewest(t *testing.T, older, newer [][]string) (*backend.Store, *run.Found) {
	t.Helper()
	ctx := context.Background()
	st := ckpttest.OpenURL(t, "file://"+t.TempDir())
	r := run.New(st)
	for step, saved := range map[int64][][]string{3: older, 6: newer} {
		_, err := r.SaveLocal(ctx, step, []*statedict.StateDict{ckpttest.GroupedState(256, saved...)}, saver.Options{})
		require.NoError(t, err)
	}
	newest, err := r.Step(6)
	require.NoError(t, err)
	damage.FlipRankData(t, newest, 0)
	found, _, err := r.Latest(ctx, run.LatestOptions{})
	require.NoError(t, err)
	require.Equal(t, "step-00000006", found.Name, "the damage is in the data: the metadata verifies")
	return st, found
}

// TestFallbackToOtherParamGroupsSaysTheTargetsWerePartlyFilled: the
// newest checkpoint is damaged, so the one-pass load falls back; the older
// one was saved with other optimizer param groups and is refused before
// anything more is written. The error is the layout mismatch, and says
// (errors.Is, message) that the damaged attempt partly filled the targets.
func TestFallbackToOtherParamGroupsSaysTheTargetsWerePartlyFilled(t *testing.T) {
	ctx := context.Background()
	groups := [][]string{{"a"}, {"b", "c"}}
	r, found := damagedNewest(t, [][]string{{"a", "b", "c"}}, groups)
	_, err := run.New(r).Load(ctx, found, run.Into(func() []*statedict.StateDict {
		return []*statedict.StateDict{ckpttest.GroupedState(256, groups...)}
	}, loader.Options{ParamGroups: groups}), t.Logf)
	require.ErrorIs(t, err, loader.ErrLayoutMismatch)
	assert.NotErrorIs(t, err, loader.ErrChecksum, "the refusal is the error; the damage is only named")
	assert.ErrorIs(t, err, loader.ErrTargetsPartlyFilled)
	assert.Contains(t, err.Error(), "CRC32C")
	assert.Contains(t, err.Error(), "step-00000003")
	assert.Contains(t, err.Error(), "the checkpoint has 1 optimizer param group(s)")
	assert.Contains(t, err.Error(), "after falling back from a damaged one")
	assert.Contains(t, err.Error(), "step-00000006")
}

// Regression (review): when the older checkpoint is refused for a missing
// key, the error is the missing key (its rule and class, as the C ABI maps
// it to a Python exception), not the damage of the newer one it fell back
// from, and it is not taken for damaged data.
func TestFallbackRefusedForAMissingKeyIsAMissingKey(t *testing.T) {
	ctx := context.Background()
	full := [][]string{{"a", "b", "c"}}
	r, found := damagedNewest(t, [][]string{{"a", "b"}}, full)
	_, err := run.New(r).Load(ctx, found, run.Into(func() []*statedict.StateDict {
		return []*statedict.StateDict{ckpttest.GroupedState(256, full...)}
	}, loader.Options{}), t.Logf)
	require.ErrorIs(t, err, loader.ErrMissingKeys)
	assert.NotErrorIs(t, err, loader.ErrChecksum)
	assert.False(t, run.DataDamaged(err))
	assert.Contains(t, err.Error(), "step-00000006")
}
