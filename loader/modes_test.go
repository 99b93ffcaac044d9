package loader_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/backend/instrument"
	"github.com/ckptkit/ckptkit/ckpterr"
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
		{"default", loader.Options{}, loader.ModeDirect},
		{"default, small reads", loader.Options{MaxReadBytes: 4096}, loader.ModeDirect},
		{"staged", loader.Options{Transactional: true}, loader.ModeStaged},
		{"verify-then-copy", loader.Options{Transactional: true, StagingLimit: 1, MaxReadBytes: 4096}, loader.ModeVerifyThenCopy},
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
			} else {
				require.Equal(t, rep.BytesNeeded, rep.BytesRead, "read amplification 1.00")
			}
		})
	}
}

// A checksum failure in the verify pass of a large (verify-then-copy) load
// leaves the targets untouched, like a staged load.
func TestVerifyThenCopyIsTransactional(t *testing.T) {
	ctx := context.Background()
	st, full := modesState(t, "modes-tx")
	key, _, _ := flipLastByte(t, st)

	targets := modesTargets(full, 2)
	_, err := loader.Load(ctx, st, targets, loader.Options{Transactional: true, StagingLimit: 1, MaxReadBytes: 4096, Concurrency: 1, Logger: quiet()})
	require.ErrorIs(t, err, loader.ErrChecksum)
	require.Contains(t, err.Error(), key)
	for _, sd := range targets {
		for k, s := range sd.Tensors {
			require.Equal(t, make([]byte, len(s.Data)), s.Data, "%s modified by a failed load", k)
		}
	}
}

// flipLastByte flips the last byte of the last chunk of the last tensor of
// the checkpoint at st and returns that tensor's key, the chunk's object
// and the chunk's offset in it.
func flipLastByte(t *testing.T, st *backend.Store) (key, object string, offset int64) {
	t.Helper()
	ctx := context.Background()
	c, err := loader.Open(ctx, st)
	require.NoError(t, err)
	last := c.Metadata().Tensors[len(c.Metadata().Tensors)-1]
	ch := last.Chunks[len(last.Chunks)-1]
	data, err := st.ReadAll(ctx, ch.Object, 0)
	require.NoError(t, err)
	data[ch.Offset+ch.Length-1] ^= 1
	require.NoError(t, st.PutBytes(ctx, ch.Object, data, backend.PutOptions{}))
	return last.Key, ch.Object, ch.Offset
}

// The default one-pass load computes each chunk's CRC32C while reading it:
// a corrupt chunk, read straight into a contiguous target (whole chunks) or
// through a buffer (4 KiB reads coalescing nothing, resharded 3 -> 2), fails
// naming key, object and offset, with ErrTargetsPartlyFilled and
// ErrChecksum, classified as a bad checkpoint.
func TestDefaultLoadNamesCorruptChunk(t *testing.T) {
	st, full := modesState(t, "onepass-corrupt")
	key, object, offset := flipLastByte(t, st)
	for _, tc := range []struct {
		name  string
		world int
		opts  loader.Options
	}{
		{"into contiguous targets", 3, loader.Options{MaxReadBytes: 4096, Concurrency: 1}},
		{"resharded, small reads", 2, loader.Options{MaxReadBytes: 4096, Concurrency: 1}},
		{"resharded, coalesced", 2, loader.Options{MaxReadBytes: 1 << 20, Concurrency: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.opts.Logger = quiet()
			_, err := loader.Load(context.Background(), st, modesTargets(full, tc.world), tc.opts)
			require.ErrorIs(t, err, loader.ErrChecksum)
			require.ErrorIs(t, err, loader.ErrTargetsPartlyFilled)
			require.Equal(t, ckpterr.BadCheckpoint, ckpterr.ClassOf(err))
			msg := err.Error()
			require.Contains(t, msg, fmt.Sprintf("key %q", key))
			require.Contains(t, msg, st.URL(object))
			require.Contains(t, msg, fmt.Sprintf("at offset %d", offset))
		})
	}
}

// A failure before any target byte was written (the first read, of a
// coalesced op read through a buffer, fails) is not reported as partly
// filled.
func TestDefaultLoadFailingFirstReadLeavesTargets(t *testing.T) {
	st, full := modesState(t, "onepass-first-read")
	failing := &failReadsAfter{Driver: st.Driver(), after: 1} // the metadata read succeeds
	targets := modesTargets(full, 2)
	_, err := loader.Load(context.Background(), st.WithDriver(failing).WithRetry(backend.RetryPolicy{Attempts: 1}), targets,
		loader.Options{Concurrency: 1, MaxReadBytes: 1 << 20, Logger: quiet()})
	require.Error(t, err)
	require.NotErrorIs(t, err, loader.ErrTargetsPartlyFilled)
	for _, sd := range targets {
		for k, s := range sd.Tensors {
			require.Equal(t, make([]byte, len(s.Data)), s.Data, "%s modified", k)
		}
	}
}

// Reads whose every chunk lands in place need no buffer, so the default
// load merges consecutive ones of an object up to InPlaceReadBytes: one
// request per object here, however small MaxReadBytes is, and the bytes
// are the same. Report.ReadRequests counts the requests made.
func TestDefaultLoadMergesInPlaceReads(t *testing.T) {
	st, full := modesState(t, "onepass-merge")
	for _, tc := range []struct {
		name    string
		inPlace int64
		merged  bool
	}{{"merged", 1 << 20, true}, {"capped", 1, false}} {
		t.Run(tc.name, func(t *testing.T) {
			counter := instrument.Wrap(st.Driver())
			targets := modesTargets(full, 3)
			rep, err := loader.Load(context.Background(), st.WithDriver(counter), targets,
				loader.Options{MaxReadBytes: 4096, InPlaceReadBytes: tc.inPlace, Logger: quiet()})
			require.NoError(t, err)
			for r, sd := range targets {
				for k, s := range sd.Tensors {
					require.Equal(t, statedict.RowShard(full[k], r, 3).Data, s.Data, "rank %d %s", r, k)
				}
			}
			data := int(counter.Count(instrument.OpRead) - 1) // the metadata read
			require.Equal(t, data, rep.ReadRequests)
			if tc.merged {
				require.Equal(t, 3, data, "one read per data object")
			} else {
				require.Greater(t, data, 3)
			}
			require.Equal(t, rep.BytesNeeded, rep.BytesRead)
		})
	}
}
