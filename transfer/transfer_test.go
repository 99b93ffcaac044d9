package transfer_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	_ "github.com/ckptkit/ckptkit/backend/fs"
	_ "github.com/ckptkit/ckptkit/backend/mem"
	"github.com/ckptkit/ckptkit/loader"
	"github.com/ckptkit/ckptkit/metadata"
	"github.com/ckptkit/ckptkit/progress"
	"github.com/ckptkit/ckptkit/saver"
	"github.com/ckptkit/ckptkit/statedict"
	"github.com/ckptkit/ckptkit/transfer"
)

var seq atomic.Int64

func memStore(t *testing.T) *backend.Store {
	t.Helper()
	st, err := backend.Open(context.Background(), fmt.Sprintf("mem://transfer-%d/ck", seq.Add(1)))
	require.NoError(t, err)
	return st
}

func fsStore(t *testing.T) *backend.Store {
	t.Helper()
	st, err := backend.Open(context.Background(), t.TempDir())
	require.NoError(t, err)
	return st
}

func saved(t *testing.T, st *backend.Store) *statedict.Tensor {
	t.Helper()
	w := statedict.NewTensor(statedict.Float32, 300, 64)
	for i := range w.Data {
		w.Data[i] = byte(i * 13)
	}
	sds := make([]*statedict.StateDict, 3)
	for r := range sds {
		sds[r] = statedict.New()
		sds[r].Tensors["model.w"] = statedict.RowShard(w, r, 3)
		sds[r].Bytes["scheduler.last_epoch"] = []byte("4")
	}
	_, err := saver.SaveLocal(context.Background(), st, sds, saver.Options{Iteration: 4})
	require.NoError(t, err)
	return w
}

func loadW(t *testing.T, st *backend.Store) []byte {
	t.Helper()
	target := statedict.New()
	target.Tensors["model.w"] = statedict.Whole(statedict.NewTensor(statedict.Float32, 300, 64))
	target.Bytes["scheduler.last_epoch"] = nil
	rep, err := loader.Load(context.Background(), st, []*statedict.StateDict{target}, loader.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	require.Equal(t, int64(4), rep.Iteration)
	return target.Tensors["model.w"].Data
}

func TestCopyBetweenBackends(t *testing.T) {
	for _, tc := range []struct {
		name     string
		src, dst func(*testing.T) *backend.Store
	}{{"fs-to-mem", fsStore, memStore}, {"mem-to-fs", memStore, fsStore}} {
		t.Run(tc.name, func(t *testing.T) {
			src, dst := tc.src(t), tc.dst(t)
			w := saved(t, src)
			var last atomic.Int64
			res, err := transfer.Copy(context.Background(), src, dst, transfer.Options{Parallel: 2, Progress: func(u progress.Update) { last.Store(u.Done) }})
			require.NoError(t, err)
			require.Equal(t, "ckptkit", res.Format)
			require.Equal(t, int64(len(w.Data))+1, last.Load(), "progress reaches the data total")
			require.Equal(t, w.Data, loadW(t, dst))

			// A second copy refuses to overwrite; --force replaces it.
			_, err = transfer.Copy(context.Background(), src, dst, transfer.Options{})
			require.ErrorIs(t, err, transfer.ErrDestinationCommitted)
			_, err = transfer.Copy(context.Background(), src, dst, transfer.Options{Force: true})
			require.NoError(t, err)
			require.Equal(t, w.Data, loadW(t, dst))
		})
	}
}

func TestCorruptSourceIsNotCommitted(t *testing.T) {
	ctx := context.Background()
	src, dst := fsStore(t), memStore(t)
	saved(t, src)
	c, err := loader.Open(ctx, src)
	require.NoError(t, err)
	ch := c.Metadata().Tensor("model.w").Chunks[1]
	data, err := src.ReadAll(ctx, ch.Object, 0)
	require.NoError(t, err)
	data[ch.Offset+ch.Length/2] ^= 0x10
	require.NoError(t, src.PutBytes(ctx, ch.Object, data, backend.PutOptions{}))

	_, err = transfer.Copy(ctx, src, dst, transfer.Options{})
	require.ErrorIs(t, err, loader.ErrChecksum)
	require.Contains(t, err.Error(), "model.w")
	ok, err := dst.Exists(ctx, metadata.ObjectKey)
	require.NoError(t, err)
	require.False(t, ok, "a failed copy must not commit the destination")
	ok, err = dst.Exists(ctx, ch.Object)
	require.NoError(t, err)
	require.False(t, ok, "the corrupt object must not be published")
}

func TestInterruptedCopyIsNotCommitted(t *testing.T) {
	src, dst := fsStore(t), fsStore(t)
	saved(t, src)
	ctx, cancel := context.WithCancel(context.Background())
	_, err := transfer.Copy(ctx, src, dst, transfer.Options{Progress: func(progress.Update) { cancel() }})
	require.True(t, errors.Is(err, context.Canceled), "got %v", err)
	_, err = loader.Open(context.Background(), dst)
	require.True(t, errors.Is(err, loader.ErrIncomplete) || errors.Is(err, loader.ErrNoCheckpoint), "got %v", err)
}

func TestUncommittedSourceIsRefused(t *testing.T) {
	ctx := context.Background()
	src, dst := fsStore(t), memStore(t)
	saved(t, src)
	require.NoError(t, src.Delete(ctx, metadata.ObjectKey))
	_, err := transfer.Copy(ctx, src, dst, transfer.Options{})
	require.ErrorIs(t, err, loader.ErrIncomplete)
}
