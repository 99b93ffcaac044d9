package run_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/catalog"
	"github.com/ckptkit/ckptkit/internal/testkit/ckpttest"
	"github.com/ckptkit/ckptkit/loader"
	"github.com/ckptkit/ckptkit/ops/gc"
	"github.com/ckptkit/ckptkit/run"
	"github.com/ckptkit/ckptkit/saver"
	"github.com/ckptkit/ckptkit/statedict"
)

func names(t *testing.T, st *backend.Store) []string {
	t.Helper()
	es, err := catalog.List(context.Background(), st)
	require.NoError(t, err)
	out := []string{}
	for _, e := range es {
		if e.Committed {
			out = append(out, e.Name)
		}
	}
	return out
}

// A synchronous and an asynchronous save land under the run's step names,
// with the step as their iteration, and resume loads the newer.
func TestSaveSyncAndAsync(t *testing.T) {
	for _, b := range ckpttest.BackendsWithGCS(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			st := b.Open(t)
			r := run.New(st)
			s3, s6 := ckpttest.NewState(3, 6), ckpttest.NewState(6, 6)
			_, err := r.SaveLocal(ctx, 3, s3.Shard(2), saver.Options{})
			require.NoError(t, err)
			sv, err := saver.NewSaver(saver.AsyncOptions{})
			require.NoError(t, err)
			defer sv.Close(ctx)
			h, err := r.SaveLocalAsync(ctx, sv, 6, s6.Shard(2), saver.Options{})
			require.NoError(t, err)
			_, err = h.Wait(ctx)
			require.NoError(t, err)
			assert.Equal(t, []string{"step-00000003", "step-00000006"}, names(t, st))

			var got []*statedict.StateDict
			res, err := r.Resume(ctx, run.ResumeOptions{Load: run.Into(func() []*statedict.StateDict {
				got = ckpttest.Targets(s6.Shard(2))
				return got
			}, loader.Options{})})
			require.NoError(t, err)
			assert.Equal(t, int64(6), res.Report.Iteration)
			assert.Equal(t, r.StepURL(6), res.Checkpoint.URL())
			for rank := range 2 {
				requireShard(t, s6, rank, 2, got[rank:rank+1])
			}

			_, err = r.SaveLocal(ctx, -1, s3.Shard(1), saver.Options{})
			require.ErrorIs(t, err, run.ErrInvalidArgument)
		})
	}
}

// Retain runs gc's whole sequence: the checkpoints the policy does not
// keep are deleted, and so is an orphan data object under a kept one.
func TestRetain(t *testing.T) {
	for _, b := range ckpttest.BackendsWithGCS(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			st := b.Open(t)
			r := run.New(st)
			saveSteps(t, st, 1, 10, 20, 30)
			s30, err := r.Step(30)
			require.NoError(t, err)
			require.NoError(t, s30.PutBytes(ctx, "rank-00000-000.0123456789abcdef.data", []byte("lost attempt"), backend.PutOptions{}))

			plan, res, err := r.Retain(ctx, gc.Policy{KeepLast: 1}, gc.Options{})
			require.NoError(t, err)
			assert.Equal(t, "step-00000030", plan.NewestValid)
			assert.Equal(t, 2, plan.Deletions)
			assert.Len(t, res.Deleted, 2)
			assert.Equal(t, 1, res.OrphansDeleted)
			assert.Equal(t, []string{"step-00000030"}, names(t, st))
			ok, err := s30.Exists(ctx, "rank-00000-000.0123456789abcdef.data")
			require.NoError(t, err)
			assert.False(t, ok, "the orphan is gone")
		})
	}
}
