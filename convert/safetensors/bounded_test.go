package safetensors_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/convert/safetensors"
	"github.com/ckptkit/ckptkit/internal/testkit/ckpttest"
	"github.com/ckptkit/ckptkit/loader"
)

func openDir(t *testing.T, dir string) *backend.Store { return ckpttest.OpenURL(t, dir) }

// Regression (issue 16): convert read each tensor whole without a cap
// (ReadTensor: a 256 MiB tensor, 256 MiB allocated) and, with one, refused
// a tensor saved as a chunk larger than a quarter of the cap. A 256 MiB
// single-chunk tensor now converts with a few MiB allocated, with and
// without a 16 MiB cap, and its last element arrives.
func TestConvertOfAHugeTensorIsBoundedInMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 512 MiB")
	}
	const n = 256 << 20
	srcDir := t.TempDir()
	ckpttest.SparseTensorCheckpointEndingIn(t, srcDir, n, 3)
	ctx := context.Background()
	src, err := loader.Open(ctx, openDir(t, srcDir))
	require.NoError(t, err)
	for _, capBytes := range []int64{0, 16 << 20} {
		outDir := t.TempDir()
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		res, err := safetensors.Convert(ctx, src, openDir(t, outDir), safetensors.Options{MaxMemory: capBytes})
		runtime.ReadMemStats(&after)
		require.NoError(t, err, "cap %d", capBytes)
		allocated := after.TotalAlloc - before.TotalAlloc
		t.Logf("convert of a %d MiB tensor, cap %d: %.1f MiB allocated", n>>20, capBytes, float64(allocated)/(1<<20))
		assert.Less(t, allocated, uint64(48<<20), "cap %d", capBytes)
		require.Len(t, res.Files, 1)

		// The data section: n-1 zero bytes, then 3.
		f, err := os.Open(filepath.Join(outDir, safetensors.SingleFile))
		require.NoError(t, err)
		r := bufio.NewReaderSize(f, 1<<20)
		var hlen [8]byte
		_, err = io.ReadFull(r, hlen[:])
		require.NoError(t, err)
		_, err = r.Discard(int(binary.LittleEndian.Uint64(hlen[:])))
		require.NoError(t, err)
		buf := make([]byte, 1<<20)
		var got int64
		for {
			k, err := r.Read(buf)
			for i, c := range buf[:k] {
				want := byte(0)
				if got+int64(i) == n-1 {
					want = 3
				}
				if c != want {
					require.Failf(t, "wrong data", "byte %d is %d, want %d", got+int64(i), c, want)
				}
			}
			got += int64(k)
			if err == io.EOF {
				break
			}
			require.NoError(t, err)
		}
		require.NoError(t, f.Close())
		assert.Equal(t, int64(n), got)
	}
}

// The streamed output is bit-identical to what whole-tensor reads
// (ReadTensor, the path convert took before it streamed) give, and to the
// capped slab path, for native checkpoints saved over 1 and 3 ranks and
// for DCP checkpoints (torch.save items, a 2-rank one sharded on dim 1).
func TestConvertOutputIsTheSameOnEveryPath(t *testing.T) {
	ctx := context.Background()
	run := ckpttest.Backends(t)[1].Open(t)
	s := ckpttest.NewState(5, 33)
	ckpttest.SaveStep(t, run, 1, s, 1)
	ckpttest.SaveStep(t, run, 3, s, 3)
	sources := map[string]*loader.Checkpoint{"native 1 rank": openStep(t, run, 1), "native 3 ranks": openStep(t, run, 3)}
	for _, name := range []string{"dense", "sharded_2rank", "frozen"} {
		c, err := loader.Open(ctx, openDir(t, filepath.Join("../../interop/torchdcp/testdata", name)))
		require.NoError(t, err)
		sources["dcp "+name] = c
	}
	for name, src := range sources {
		t.Run(name, func(t *testing.T) {
			var outputs [][]byte
			for _, capBytes := range []int64{0, 64 << 10} {
				out := openDir(t, t.TempDir())
				_, err := safetensors.Convert(ctx, src, out, safetensors.Options{MaxMemory: capBytes})
				require.NoError(t, err, "cap %d", capBytes)
				raw, err := out.ReadAll(ctx, safetensors.SingleFile, 0)
				require.NoError(t, err)
				outputs = append(outputs, raw)

				got, _ := readSafetensors(t, out, safetensors.SingleFile)
				require.Len(t, got, len(src.Metadata().Tensors))
				for _, te := range src.Metadata().Tensors {
					whole, err := src.ReadTensor(ctx, te.Key)
					require.NoError(t, err)
					require.True(t, bytes.Equal(whole.Data, got[te.Key].Data), "%s (cap %d)", te.Key, capBytes)
				}
			}
			require.True(t, bytes.Equal(outputs[0], outputs[1]), "the streamed and the slab outputs differ")
		})
	}
}
