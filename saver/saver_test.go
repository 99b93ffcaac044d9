package saver_test

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	_ "github.com/ckptkit/ckptkit/backend/fs"
	"github.com/ckptkit/ckptkit/ckpterr"
	"github.com/ckptkit/ckptkit/coordinator"
	"github.com/ckptkit/ckptkit/metadata"
	"github.com/ckptkit/ckptkit/planner"
	"github.com/ckptkit/ckptkit/saver"
	"github.com/ckptkit/ckptkit/statedict"
)

func store(t *testing.T) *backend.Store {
	t.Helper()
	st, err := backend.Open(context.Background(), t.TempDir())
	require.NoError(t, err)
	return st
}

func ranks(world int) []*statedict.StateDict {
	w := statedict.NewTensor(statedict.Float32, 8, 4)
	for i := range w.Data {
		w.Data[i] = byte(i)
	}
	out := make([]*statedict.StateDict, world)
	for r := range out {
		out[r] = statedict.New()
		out[r].Tensors["model.w"] = statedict.RowShard(w, r, world)
		out[r].Bytes["scheduler.last_epoch"] = []byte("3")
	}
	return out
}

func committed(t *testing.T, st *backend.Store) bool {
	t.Helper()
	ok, err := st.Exists(context.Background(), metadata.ObjectKey)
	require.NoError(t, err)
	return ok
}

func TestDisagreeingRanksCommitNothing(t *testing.T) {
	st := store(t)
	sds := ranks(2)
	sds[1].Tensors["model.w"].DType = statedict.Int32 // same bytes, other dtype
	_, err := saver.SaveLocal(context.Background(), st, sds, saver.Options{})
	require.ErrorIs(t, err, planner.ErrPlanMismatch)
	require.Contains(t, err.Error(), "model.w")
	require.False(t, committed(t, st))
}

func TestMissingShardIsRefusedAtSave(t *testing.T) {
	st := store(t)
	sds := ranks(3)
	delete(sds[2].Tensors, "model.w") // one rank's shard never arrives
	_, err := saver.SaveLocal(context.Background(), st, sds, saver.Options{})
	require.ErrorIs(t, err, planner.ErrCoverage)
	require.False(t, committed(t, st))
}

func TestInvalidStateDictFailsEveryRank(t *testing.T) {
	st := store(t)
	sds := ranks(2)
	sds[0].Tensors["model.w"].Data = sds[0].Tensors["model.w"].Data[:3]
	_, err := saver.SaveLocal(context.Background(), st, sds, saver.Options{})
	require.Error(t, err)
	require.Contains(t, err.Error(), "rank 0")
	require.False(t, committed(t, st))
}

func TestCommittedCheckpointIsNotOverwritten(t *testing.T) {
	st := store(t)
	_, err := saver.SaveLocal(context.Background(), st, ranks(2), saver.Options{Iteration: 1})
	require.NoError(t, err)
	_, err = saver.SaveLocal(context.Background(), st, ranks(2), saver.Options{Iteration: 2})
	require.ErrorIs(t, err, saver.ErrCommitted)
	res, err := saver.SaveLocal(context.Background(), st, ranks(3), saver.Options{Iteration: 3, Overwrite: true})
	require.NoError(t, err)
	require.Equal(t, int64(3), res.Metadata.Training.Iteration)
	require.Equal(t, 3, res.Metadata.WorldSize)
}

// failingPut fails every data object write of one rank.
type failingPut struct {
	backend.Driver
	rank string
}

func (f failingPut) Put(ctx context.Context, key string, size int64, r io.Reader, opts backend.PutOptions) error {
	if strings.Contains(key, f.rank) {
		return errors.New("disk on fire")
	}
	return f.Driver.Put(ctx, key, size, r, opts)
}

func TestFailedRankWriteCommitsNothing(t *testing.T) {
	st := store(t)
	bad := st.WithDriver(failingPut{Driver: st.Driver(), rank: "rank-00001"})
	_, err := saver.SaveLocal(context.Background(), bad, ranks(2), saver.Options{})
	require.Error(t, err)
	require.Contains(t, err.Error(), "disk on fire")
	require.Contains(t, err.Error(), "not committed")
	require.False(t, committed(t, st))
}

// A rank that never shows up must not hang the others forever: its peers
// return when their context ends, and the group is aborted for everyone.
func TestCoordinatorDoesNotHangOnAMissingRank(t *testing.T) {
	coords := coordinator.NewLocal(3)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	errs := make(chan error, 2)
	for r := 0; r < 2; r++ {
		go func(r int) {
			_, err := coords[r].AllGather(ctx, r)
			errs <- err
		}(r)
	}
	for i := 0; i < 2; i++ {
		select {
		case err := <-errs:
			require.Error(t, err)
		case <-time.After(5 * time.Second):
			t.Fatal("AllGather hung")
		}
	}
	_, err := coords[2].AllGather(context.Background(), 2)
	require.ErrorIs(t, err, coordinator.ErrAborted)
}

func TestSaveOptionsRecordPrefixesAndSlots(t *testing.T) {
	st := store(t)
	sds := ranks(1)
	sds[0].Tensors["optim.state.w.m"] = statedict.Whole(statedict.NewTensor(statedict.Float32, 2))
	res, err := saver.SaveLocal(context.Background(), st, sds, saver.Options{OptimizerPrefix: "optim", OptimizerSlots: []string{"m"}})
	require.NoError(t, err)
	tr := res.Metadata.Training
	require.Equal(t, metadata.OptimizerSaved, tr.Optimizer)
	require.Equal(t, "optim", tr.OptimizerPrefix)
	require.Equal(t, []string{"m"}, tr.OptimizerSlots)
	require.Equal(t, 1, tr.OptimizerStateEntries)
	require.Equal(t, "scheduler", tr.SchedulerPrefix)
}

// Regression (review): an overwrite whose planning failed had already
// uncommitted the checkpoint it was to replace.
func TestFailedOverwriteKeepsTheOldCheckpoint(t *testing.T) {
	st := store(t)
	_, err := saver.SaveLocal(context.Background(), st, ranks(2), saver.Options{Iteration: 1})
	require.NoError(t, err)
	bad := ranks(2)
	bad[1].Tensors["model.w"].DType = statedict.Int32
	_, err = saver.SaveLocal(context.Background(), st, bad, saver.Options{Iteration: 2, Overwrite: true})
	require.ErrorIs(t, err, planner.ErrPlanMismatch)
	require.True(t, committed(t, st), "the old checkpoint must stay committed")
}

// cancelAfterCommit cancels a context once the metadata object is written.
type cancelAfterCommit struct {
	backend.Driver
	cancel context.CancelFunc
}

func (c cancelAfterCommit) Put(ctx context.Context, key string, size int64, r io.Reader, opts backend.PutOptions) error {
	err := c.Driver.Put(ctx, key, size, r, opts)
	if err == nil && strings.HasSuffix(key, metadata.ObjectKey) {
		c.cancel()
	}
	return err
}

// Regression (review): a rank whose context ended after rank 0 committed
// reported the committed save as failed.
func TestRankCancelledAfterCommitStillSeesTheCommit(t *testing.T) {
	st := store(t)
	ctx1, cancel := context.WithCancel(context.Background())
	defer cancel()
	wrapped := st.WithDriver(cancelAfterCommit{Driver: st.Driver(), cancel: cancel})
	coords := coordinator.NewLocal(2)
	sds := ranks(2)
	errs := make(chan error, 2)
	go func() {
		_, err := saver.Save(context.Background(), wrapped, coords[0], sds[0], saver.Options{})
		errs <- err
	}()
	go func() { _, err := saver.Save(ctx1, wrapped, coords[1], sds[1], saver.Options{}); errs <- err }()
	for i := 0; i < 2; i++ {
		require.NoError(t, <-errs)
	}
	require.True(t, committed(t, st))
}

// Regression (issue 16): keys with NUL or invalid UTF-8 were saved (and
// passed verify). A save refuses them before writing anything, naming the
// key, as a usage error.
func TestSaveRefusesKeysWithNULOrInvalidUTF8(t *testing.T) {
	for name, key := range map[string]string{"nul": "model.w\x00x", "invalid utf-8": "model.\xff", "empty": ""} {
		t.Run(name, func(t *testing.T) {
			st := store(t)
			sds := ranks(1)
			sds[0].Bytes[key] = []byte("x")
			_, err := saver.SaveLocal(context.Background(), st, sds, saver.Options{})
			require.ErrorIs(t, err, statedict.ErrBadKey)
			require.Equal(t, ckpterr.Usage, ckpterr.ClassOf(err))
			require.False(t, committed(t, st))
			n := 0
			require.NoError(t, st.List(context.Background(), "", func(backend.ObjectInfo) error { n++; return nil }))
			require.Zero(t, n, "nothing written")
		})
	}
}
