package safetensors_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/catalog"
	"github.com/ckptkit/ckptkit/convert/safetensors"
	"github.com/ckptkit/ckptkit/internal/testkit/ckpttest"
	"github.com/ckptkit/ckptkit/loader"
	"github.com/ckptkit/ckptkit/progress"
	"github.com/ckptkit/ckptkit/statedict"
)

func openStep(t testing.TB, run *backend.Store, step int64) *loader.Checkpoint {
	st, err := run.Sub(catalog.StepName(step))
	require.NoError(t, err)
	c, err := loader.Open(context.Background(), st)
	require.NoError(t, err)
	return c
}

func sub(t testing.TB, st *backend.Store, p string) *backend.Store {
	s, err := st.Sub(p)
	require.NoError(t, err)
	return s
}

// requireMatches checks that got holds exactly the tensors of s (names
// mapped by name), bit for bit.
func requireMatches(t *testing.T, s *ckpttest.State, got map[string]stTensor, name func(string) (string, bool)) {
	t.Helper()
	n := 0
	for k, want := range s.Tensors {
		nm, ok := name(k)
		if !ok {
			continue
		}
		n++
		g, ok := got[nm]
		require.True(t, ok, "missing %s", nm)
		dt, _ := safetensors.DTypeName(want.DType)
		assert.Equal(t, dt, g.DType, nm)
		assert.Equal(t, fmt.Sprint(want.Shape), fmt.Sprint(g.Shape), nm)
		require.Equal(t, want.Data, g.Data, nm)
	}
	assert.Len(t, got, n)
}

func same(k string) (string, bool) { return k, true }

func TestConvertSingleFile(t *testing.T) {
	for _, b := range ckpttest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			run := b.Open(t)
			s := ckpttest.NewState(7, 9)
			ckpttest.SaveStep(t, run, 7, s, 3)
			out := sub(t, run, "export")
			var prog []progress.Update
			res, err := safetensors.Convert(context.Background(), openStep(t, run, 7), out, safetensors.Options{ShardSize: 1 << 30, Progress: func(p progress.Update) { prog = append(prog, p) }})
			require.NoError(t, err)
			require.Len(t, res.Files, 1)
			assert.Equal(t, safetensors.SingleFile, res.Files[0].Name)
			assert.Empty(t, res.Index)
			assert.Equal(t, len(s.Tensors), res.Tensors)
			assert.ElementsMatch(t, []string{"optimizer.param_groups.0.lr", "scheduler.last_epoch"}, res.Skipped)
			require.Len(t, prog, len(s.Tensors))
			last := prog[len(prog)-1]
			assert.Equal(t, res.TotalSize, last.Done)
			assert.Equal(t, res.TotalSize, last.Total)
			assert.Equal(t, progress.Bytes, last.Unit)
			assert.Contains(t, s.Tensors, last.Item, "Item names the tensor written")

			got, meta := readSafetensors(t, out, safetensors.SingleFile)
			requireMatches(t, s, got, same)
			assert.Equal(t, "pt", meta["format"])
			assert.Equal(t, "7", meta["ckptkit.iteration"])
			attrs, err := out.Stat(context.Background(), safetensors.SingleFile)
			require.NoError(t, err)
			assert.Equal(t, res.Files[0].Size, attrs.Size)
			ok, err := out.Exists(context.Background(), safetensors.IndexFile)
			require.NoError(t, err)
			assert.False(t, ok)
		})
	}
}

func TestConvertShardedModelOnlyWithMemoryCap(t *testing.T) {
	for _, b := range ckpttest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			run := b.Open(t)
			s := ckpttest.NewState(8, 40)
			ckpttest.SaveStep(t, run, 8, s, 4)
			out := sub(t, run, "hf")
			// Leave a stale index behind: it must not survive.
			require.NoError(t, out.PutBytes(ctx, safetensors.IndexFile, []byte(`{"stale":true}`), backend.PutOptions{}))
			require.NoError(t, out.PutBytes(ctx, safetensors.SingleFile, []byte(`stale`), backend.PutOptions{}))
			res, err := safetensors.Convert(ctx, openStep(t, run, 8), out, safetensors.Options{ShardSize: 1000, ModelOnly: true, MaxMemory: 4 * 700})
			require.NoError(t, err)
			require.Greater(t, len(res.Files), 2)
			assert.Equal(t, safetensors.IndexFile, res.Index)
			stale, err := out.Exists(ctx, safetensors.SingleFile)
			require.NoError(t, err)
			assert.False(t, stale, "a stale single file would shadow the shards")
			for _, k := range res.Skipped {
				assert.False(t, strings.HasPrefix(k, "model."), k)
			}

			idxRaw, err := out.ReadAll(ctx, safetensors.IndexFile, 0)
			require.NoError(t, err)
			var idx struct {
				Metadata  map[string]int64  `json:"metadata"`
				WeightMap map[string]string `json:"weight_map"`
			}
			require.NoError(t, json.Unmarshal(idxRaw, &idx))
			assert.Equal(t, res.TotalSize, idx.Metadata["total_size"])

			all := map[string]stTensor{}
			var total int64
			for i, f := range res.Files {
				assert.Equal(t, fmt.Sprintf("model-%05d-of-%05d.safetensors", i+1, len(res.Files)), f.Name)
				got, _ := readSafetensors(t, out, f.Name)
				assert.Len(t, got, f.Tensors)
				for k, v := range got {
					assert.Equal(t, f.Name, idx.WeightMap[k], k)
					all[k] = v
					total += int64(len(v.Data))
				}
			}
			assert.Equal(t, res.TotalSize, total)
			assert.Len(t, idx.WeightMap, len(all))
			requireMatches(t, s, all, func(k string) (string, bool) {
				r, ok := strings.CutPrefix(k, "model.")
				return r, ok
			})
		})
	}
}

func TestConvertRefusesTensorOverMemoryCap(t *testing.T) {
	// A DCP tensor item is decoded whole (torch.save archive), so a cap
	// below an item's size cannot be met: refused before writing.
	src, err := backend.Open(context.Background(), "../../interop/torchdcp/testdata/dense")
	require.NoError(t, err)
	t.Cleanup(func() { src.Close() })
	c, err := loader.Open(context.Background(), src)
	require.NoError(t, err)
	out := sub(t, ckpttest.Backends(t)[1].Open(t), "hf")
	_, err = safetensors.Convert(context.Background(), c, out, safetensors.Options{MaxMemory: 1000})
	require.ErrorIs(t, err, safetensors.ErrTensorTooLarge)
	assert.Contains(t, err.Error(), "raise --max-memory")
	ok, err := out.Exists(context.Background(), safetensors.SingleFile)
	require.NoError(t, err)
	assert.False(t, ok, "nothing written")

	// A native tensor saved as one chunk larger than the cap streams.
	run := ckpttest.Backends(t)[1].Open(t)
	s := ckpttest.NewState(9, 40)
	ckpttest.SaveStep(t, run, 9, s, 1) // one rank: each tensor is one chunk
	out = sub(t, run, "hf")
	_, err = safetensors.Convert(context.Background(), openStep(t, run, 9), out, safetensors.Options{MaxMemory: 1000})
	require.NoError(t, err)
	got, _ := readSafetensors(t, out, safetensors.SingleFile)
	requireMatches(t, s, got, same)
}

func TestConvertModelOnlyWithoutModelKeys(t *testing.T) {
	run := ckpttest.Backends(t)[1].Open(t)
	s := &ckpttest.State{Tensors: map[string]*statedict.Tensor{"other.x": statedict.NewTensor(statedict.Float32, 2)}, Bytes: map[string][]byte{}}
	ckpttest.SaveStep(t, run, 1, s, 1)
	_, err := safetensors.Convert(context.Background(), openStep(t, run, 1), sub(t, run, "hf"), safetensors.Options{ModelOnly: true})
	require.ErrorIs(t, err, safetensors.ErrNoTensors)
}

// Regression (issue 16, found by FuzzHeader): a tensor whose name is the
// header's reserved "__metadata__" (here "model.__metadata__" with
// --model-only) was overwritten in the header by the metadata, so the file
// described one tensor fewer than its data held. It is refused, naming the
// key, before anything is written. (A name of invalid UTF-8, which JSON
// turned into U+FFFD, is refused the same way; saves no longer accept such
// keys, FuzzHeader covers it.)
func TestConvertRefusesANameTheHeaderCannotHold(t *testing.T) {
	run := ckpttest.Backends(t)[1].Open(t)
	s := &ckpttest.State{Tensors: map[string]*statedict.Tensor{
		"model.__metadata__": statedict.NewTensor(statedict.Float32, 2),
		"model.w":            statedict.NewTensor(statedict.Float32, 3),
	}, Bytes: map[string][]byte{}}
	ckpttest.SaveStep(t, run, 1, s, 1)
	out := sub(t, run, "hf")
	_, err := safetensors.Convert(context.Background(), openStep(t, run, 1), out, safetensors.Options{ModelOnly: true})
	require.ErrorIs(t, err, safetensors.ErrNameNotRepresentable)
	assert.Contains(t, err.Error(), `"model.__metadata__"`)
	ok, err := out.Exists(context.Background(), safetensors.SingleFile)
	require.NoError(t, err)
	assert.False(t, ok, "nothing written")

	// Without --model-only the name keeps its prefix and converts.
	_, err = safetensors.Convert(context.Background(), openStep(t, run, 1), out, safetensors.Options{})
	require.NoError(t, err)
	got, _ := readSafetensors(t, out, safetensors.SingleFile)
	requireMatches(t, s, got, same)
}
