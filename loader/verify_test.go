package loader_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/loader"
	"github.com/ckptkit/ckptkit/progress"
	"github.com/ckptkit/ckptkit/saver"
	"github.com/ckptkit/ckptkit/statedict"
)

func verifyRules(t *testing.T, st *backend.Store, deep bool) []string {
	t.Helper()
	rep, err := loader.Verify(context.Background(), st, loader.VerifyOptions{Deep: deep})
	require.NoError(t, err)
	var rules []string
	for _, p := range rep.Problems {
		rules = append(rules, p.Rule)
	}
	require.Equal(t, len(rules) == 0, rep.Resumable)
	return rules
}

func TestVerifyMissingAndResizedObjects(t *testing.T) {
	ctx := context.Background()
	st, _ := modesState(t, "verify-objects")
	require.Empty(t, verifyRules(t, st, true))
	c, err := loader.Open(ctx, st)
	require.NoError(t, err)
	objs := c.Metadata().Objects
	require.GreaterOrEqual(t, len(objs), 2)

	// One object shorter than the metadata says.
	data, err := st.ReadAll(ctx, objs[0].Key, 0)
	require.NoError(t, err)
	require.NoError(t, st.PutBytes(ctx, objs[0].Key, data[:len(data)-1], backend.PutOptions{}))
	// Another one gone (a rank's file never arrived).
	require.NoError(t, st.Delete(ctx, objs[1].Key))

	require.ElementsMatch(t, []string{loader.RuleObjectSize, loader.RuleMissingObject}, verifyRules(t, st, false))
	// A deep verify does not read objects already known to be damaged.
	require.ElementsMatch(t, []string{loader.RuleObjectSize, loader.RuleMissingObject}, verifyRules(t, st, true))
}

// A run prefix (checkpoints below it) is not reported as an incomplete
// checkpoint: it says what it is and how to name a checkpoint.
func TestRunPrefixIsNotAnIncompleteCheckpoint(t *testing.T) {
	ctx := context.Background()
	run, err := backend.Open(ctx, "mem://run-prefix/run")
	require.NoError(t, err)
	sub, err := run.Sub("step-00000003")
	require.NoError(t, err)
	sd := statedict.New()
	sd.Tensors["model.w"] = tensor(4)
	_, err = saver.SaveLocal(ctx, sub, []*statedict.StateDict{sd}, saver.Options{})
	require.NoError(t, err)

	_, err = loader.Open(ctx, run)
	require.ErrorIs(t, err, loader.ErrNoCheckpoint)
	require.NotErrorIs(t, err, loader.ErrIncomplete)
	require.Contains(t, err.Error(), "step-00000003")
}

func TestDeepVerifyReportsProgress(t *testing.T) {
	st, _ := modesState(t, "verify-progress")
	var last, total atomic.Int64
	rep, err := loader.Verify(context.Background(), st, loader.VerifyOptions{Deep: true, Progress: func(u progress.Update) {
		if u.Done > last.Load() {
			last.Store(u.Done)
		}
		total.Store(u.Total)
	}})
	require.NoError(t, err)
	require.True(t, rep.Resumable)
	require.Equal(t, rep.BytesChecked, total.Load())
	require.Equal(t, total.Load(), last.Load(), "progress reaches the total")
}
