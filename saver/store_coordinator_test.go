package saver_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/coordinator"
	"github.com/ckptkit/ckptkit/loader"
	"github.com/ckptkit/ckptkit/planner"
	"github.com/ckptkit/ckptkit/saver"
	"github.com/ckptkit/ckptkit/statedict"
)

var fastPoll = coordinator.StoreOptions{PollInterval: time.Millisecond, MaxPollInterval: 20 * time.Millisecond}

// saveRank is what one machine does: open its own stores, save its rank
// with a store coordinator, close the coordinator.
func saveRank(ctx context.Context, root string, rank, world int, sd *statedict.StateDict) (*saver.Result, error) {
	ckpt, err := backend.Open(ctx, filepath.Join(root, "run", "step-00000012"))
	if err != nil {
		return nil, err
	}
	cst, err := backend.Open(ctx, filepath.Join(root, "run", "_coord"))
	if err != nil {
		return nil, err
	}
	c, err := coordinator.NewStore(cst, "step-00000012-attempt-1", rank, world, fastPoll)
	if err != nil {
		return nil, err
	}
	res, err := saver.Save(ctx, ckpt, c, sd, saver.Options{Iteration: 12})
	if cerr := c.Close(ctx); cerr != nil && err == nil {
		err = cerr
	}
	return res, err
}

// saveRanks runs every rank as a goroutine that shares nothing with the
// others but the file-system directory root.
func saveRanks(t *testing.T, root string, sds []*statedict.StateDict) ([]*saver.Result, []error) {
	t.Helper()
	results := make([]*saver.Result, len(sds))
	errs := make([]error, len(sds))
	var wg sync.WaitGroup
	for r := range sds {
		wg.Go(func() { results[r], errs[r] = saveRank(context.Background(), root, r, len(sds), sds[r]) })
	}
	wg.Wait()
	return results, errs
}

// checkLoad loads the checkpoint under root and compares it with ranks(3).
func checkLoad(t *testing.T, root string) {
	t.Helper()
	ctx := context.Background()
	st, err := backend.Open(ctx, filepath.Join(root, "run", "step-00000012"))
	require.NoError(t, err)
	target := statedict.New()
	target.Tensors["model.w"] = statedict.Whole(statedict.NewTensor(statedict.Float32, 8, 4))
	target.Bytes["scheduler.last_epoch"] = nil
	_, err = loader.Load(ctx, st, []*statedict.StateDict{target}, loader.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	want := make([]byte, 8*4*4)
	for i := range want {
		want[i] = byte(i)
	}
	require.True(t, bytes.Equal(want, target.Tensors["model.w"].Data))
	require.Equal(t, []byte("3"), target.Bytes["scheduler.last_epoch"])
	coord, err := backend.Open(ctx, filepath.Join(root, "run", "_coord"))
	require.NoError(t, err)
	require.NoError(t, coord.List(ctx, "", func(o backend.ObjectInfo) error {
		return fmt.Errorf("coordinator object %s left behind", o.Key)
	}))
}

func TestSaveWithStoreCoordinator(t *testing.T) {
	root := t.TempDir()
	results, errs := saveRanks(t, root, ranks(3))
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
		require.Equal(t, results[0].BytesWritten, results[r].BytesWritten)
		require.Equal(t, 3, results[r].Metadata.WorldSize)
	}
	checkLoad(t, root)
}

func TestStoreCoordinatorMismatchFailsEveryRank(t *testing.T) {
	root := t.TempDir()
	sds := ranks(3)
	sds[1].Tensors["model.w"].DType = statedict.Int32
	_, errs := saveRanks(t, root, sds)
	for r, err := range errs {
		require.Error(t, err, "rank %d", r)
		require.ErrorContains(t, err, "model.w", "rank %d", r)
		require.ErrorIs(t, err, planner.ErrPlanMismatch, "rank %d: the class crosses the store", r)
	}
	st, err := backend.Open(context.Background(), filepath.Join(root, "run", "step-00000012"))
	require.NoError(t, err)
	require.False(t, committed(t, st))
}

const childRankEnv = "CKPTKIT_TEST_STORE_COORD_RANK"

// TestSaveAcrossProcesses runs rank 0 here and ranks 1 and 2 as re-executed
// test binaries sharing only a temporary directory.
func TestSaveAcrossProcesses(t *testing.T) {
	if r := os.Getenv(childRankEnv); r != "" {
		rank, err := strconv.Atoi(r)
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, err = saveRank(ctx, os.Getenv(childRankEnv+"_ROOT"), rank, 3, ranks(3)[rank])
		require.NoError(t, err)
		return
	}
	if testing.Short() {
		t.Skip("spawns processes")
	}
	root := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var cmds []*exec.Cmd
	var outs []*bytes.Buffer
	for r := 1; r < 3; r++ {
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestSaveAcrossProcesses$", "-test.count=1")
		cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d", childRankEnv, r), childRankEnv+"_ROOT="+root)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		require.NoError(t, cmd.Start())
		cmds, outs = append(cmds, cmd), append(outs, &out)
	}
	_, err := saveRank(ctx, root, 0, 3, ranks(3)[0])
	for i, cmd := range cmds {
		require.NoError(t, cmd.Wait(), "rank %d:\n%s", i+1, outs[i])
	}
	require.NoError(t, err)
	checkLoad(t, root)
}
