package loader_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/loader"
	"github.com/ckptkit/ckptkit/saver"
	"github.com/ckptkit/ckptkit/statedict"
)

// modesState saves a 3-rank checkpoint of several row-sharded tensors large
// enough to need several read ops with a small MaxReadBytes.
func modesState(t *testing.T, name string) (*backend.Store, map[string]*statedict.Tensor) {
	t.Helper()
	ctx := context.Background()
	st, err := backend.Open(ctx, "mem://"+name+"/ck")
	require.NoError(t, err)
	full := map[string]*statedict.Tensor{}
	for i := 0; i < 6; i++ {
		tn := statedict.NewTensor(statedict.Float32, 64, 32)
		for j := range tn.Data {
			tn.Data[j] = byte(i*31 + j*7)
		}
		full[fmt.Sprintf("model.layer%d.weight", i)] = tn
	}
	ranks := make([]*statedict.StateDict, 3)
	for r := range ranks {
		ranks[r] = statedict.New()
		for k, tn := range full {
			ranks[r].Tensors[k] = statedict.RowShard(tn, r, 3)
		}
	}
	_, err = saver.SaveLocal(ctx, st, ranks, saver.Options{})
	require.NoError(t, err)
	return st, full
}

func modesTargets(full map[string]*statedict.Tensor, world int) []*statedict.StateDict {
	out := make([]*statedict.StateDict, world)
	for r := range out {
		out[r] = statedict.New()
		for k, tn := range full {
			out[r].Tensors[k] = statedict.RowShard(statedict.NewTensor(tn.DType, tn.Shape...), r, world)
		}
	}
	return out
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func TestLoadModesFillTheSameBytes(t *testing.T) {
	st, full := modesState(t, "modes")
	for _, tc := range []struct {
		name string
		opts loader.Options
		mode string
	}{
		{"staged", loader.Options{}, loader.ModeStaged},
		{"verify-then-copy", loader.Options{StagingLimit: 1, MaxReadBytes: 4096}, loader.ModeVerifyThenCopy},
		{"direct", loader.Options{Direct: true, MaxReadBytes: 4096}, loader.ModeDirect},
	} {
		t.Run(tc.name, func(t *testing.T) {
			targets := modesTargets(full, 2)
			tc.opts.Logger = quiet()
			rep, err := loader.Load(context.Background(), st, targets, tc.opts)
			require.NoError(t, err)
			require.Equal(t, tc.mode, rep.Mode)
			for r, sd := range targets {
				for k, s := range sd.Tensors {
					require.Equal(t, statedict.RowShard(full[k], r, 2).Data, s.Data, "rank %d %s", r, k)
				}
			}
			if tc.mode == loader.ModeVerifyThenCopy {
				require.Equal(t, 2*rep.BytesNeeded, rep.BytesRead, "two passes")
			}
		})
	}
}

// A checksum failure in the verify pass of a large (verify-then-copy) load
// leaves the targets untouched, like a staged load.
func TestVerifyThenCopyIsTransactional(t *testing.T) {
	ctx := context.Background()
	st, full := modesState(t, "modes-tx")
	c, err := loader.Open(ctx, st)
	require.NoError(t, err)
	last := c.Metadata().Tensors[len(c.Metadata().Tensors)-1]
	ch := last.Chunks[len(last.Chunks)-1]
	data, err := st.ReadAll(ctx, ch.Object, 0)
	require.NoError(t, err)
	data[ch.Offset+ch.Length-1] ^= 1
	require.NoError(t, st.PutBytes(ctx, ch.Object, data, backend.PutOptions{}))

	targets := modesTargets(full, 2)
	_, err = loader.Load(ctx, st, targets, loader.Options{StagingLimit: 1, MaxReadBytes: 4096, Concurrency: 1, Logger: quiet()})
	require.ErrorIs(t, err, loader.ErrChecksum)
	require.Contains(t, err.Error(), last.Key)
	for _, sd := range targets {
		for k, s := range sd.Tensors {
			require.Equal(t, make([]byte, len(s.Data)), s.Data, "%s modified by a failed load", k)
		}
	}
}
