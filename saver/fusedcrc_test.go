package saver_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/loader"
	"github.com/ckptkit/ckptkit/saver"
	"github.com/ckptkit/ckptkit/statedict"
)

var errHalfway = errors.New("connection reset halfway")

// halfwayPut fails the first Put of every object after reading part of
// its bytes, transiently, so the Store rewinds the source and retries.
type halfwayPut struct {
	backend.Driver
	failed   sync.Map // key -> true once its first Put failed
	attempts atomic.Int64
}

func (h *halfwayPut) Put(ctx context.Context, key string, size int64, r io.Reader, opts backend.PutOptions) error {
	h.attempts.Add(1)
	if _, done := h.failed.LoadOrStore(key, true); !done && size > 1000 {
		if _, err := io.CopyN(io.Discard, r, size/2+7); err != nil {
			return err
		}
		return errHalfway
	}
	return h.Driver.Put(ctx, key, size, r, opts)
}

func (h *halfwayPut) ErrorCode(err error) backend.Code {
	if errors.Is(err, errHalfway) {
		return backend.CodeTransient
	}
	return h.Driver.ErrorCode(err)
}

// On a backend without server-side CRC32C the saver computes the item CRCs
// while the upload copies the bytes. A transient failure halfway through an
// object rewinds the source and retries it: the CRCs in the metadata are
// still those of the bytes, so a load (which checks every one) and a deep
// verify pass, for a sync save and for an async one (staged pages, not
// the items' slices, are uploaded).
func TestItemCRCsSurviveARewoundUpload(t *testing.T) {
	for _, async := range []bool{false, true} {
		name := "sync"
		if async {
			name = "async, staged pages"
		}
		t.Run(name, func(t *testing.T) { rewoundUpload(t, async) })
	}
}

func rewoundUpload(t *testing.T, async bool) {
	ctx := context.Background()
	st := store(t)
	src := make([]*statedict.StateDict, 2)
	full := statedict.NewTensor(statedict.Float32, 512, 300) // > 256 KiB per rank
	for i := range full.Data {
		full.Data[i] = byte(i*7 + i/1000)
	}
	for r := range src {
		src[r] = statedict.New()
		src[r].Tensors["model.big"] = statedict.RowShard(full, r, 2)
		src[r].Tensors["model.small"] = statedict.RowShard(statedict.NewTensor(statedict.Float32, 4, 3), r, 2)
		src[r].Bytes["scheduler.last_epoch"] = []byte("3")
	}
	flaky := &halfwayPut{Driver: st.Driver()}
	if async {
		sv, err := saver.NewSaver(saver.AsyncOptions{StagingBytes: saver.MinStagingBytes})
		require.NoError(t, err)
		h, err := sv.SaveLocalAsync(ctx, st.WithDriver(flaky), src, saver.Options{})
		require.NoError(t, err)
		_, err = h.Wait(ctx)
		require.NoError(t, err)
	} else {
		_, err := saver.SaveLocal(ctx, st.WithDriver(flaky), src, saver.Options{})
		require.NoError(t, err)
	}
	require.Greater(t, flaky.attempts.Load(), int64(3), "the data objects were retried")

	vr, err := loader.Verify(ctx, st, loader.VerifyOptions{Deep: true})
	require.NoError(t, err)
	require.True(t, vr.Resumable, "%+v", vr.Problems)
	targets := []*statedict.StateDict{statedict.New()}
	targets[0].Tensors["model.big"] = statedict.Whole(statedict.NewTensor(statedict.Float32, 512, 300))
	targets[0].Tensors["model.small"] = statedict.Whole(statedict.NewTensor(statedict.Float32, 4, 3))
	targets[0].Bytes["scheduler.last_epoch"] = nil
	_, err = loader.Load(ctx, st, targets, loader.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	require.Equal(t, full.Data, targets[0].Tensors["model.big"].Data)
}
