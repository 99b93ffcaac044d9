package planner

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/metadata"
	"github.com/ckptkit/ckptkit/statedict"
)

// TestSaveLoadRoundTrip plans a save of a grid-sharded tensor, "writes"
// the objects in memory, plans a load into differently sharded targets,
// executes it with statedict.CopyRegion and compares with the original.
func TestSaveLoadRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	shape := ints(9, 10, 3)
	full := statedict.NewTensor(statedict.Int16, shape...)
	for i := range full.Data {
		full.Data[i] = byte(rng.Uint32())
	}
	es := full.DType.Size()
	saveChunks := gridChunks(shape, []int{3, 2, 1})
	// Each chunk is offered by two ranks (replicated), six ranks in all.
	var plans []LocalPlan
	shards := map[int][]*statedict.Shard{}
	for r := range 6 {
		var items []SaveItem
		for ci, c := range saveChunks {
			if ci%3 != r%3 {
				continue
			}
			sh := &statedict.Shard{DType: full.DType, GlobalShape: shape, Offsets: c.Offsets, Sizes: c.Sizes, Data: make([]byte, statedict.NumElements(c.Sizes)*int64(es))}
			require.NoError(t, statedict.CopyRegion(sh.Data, c.Offsets, c.Sizes, full.Data, make([]int64, 3), shape, c.Offsets, c.Sizes, es))
			shards[r] = append(shards[r], sh)
			items = append(items, tensorItem("w", "int16", shape, c.Offsets, c.Sizes))
		}
		plans = append(plans, LocalPlan{Rank: r, Items: items})
	}
	gp, err := PlanSave(plans, SaveOptions{MaxObjectBytes: 200})
	require.NoError(t, err)
	checkGlobalPlan(t, plans, gp)
	objects := map[string][]byte{}
	for _, w := range gp.Writes {
		buf := make([]byte, 0, w.Size)
		for _, it := range w.Items {
			buf = append(buf, shards[w.Rank][it.LocalIndex].Data...)
		}
		objects[w.Object] = buf
	}

	// Load as 4 column blocks on dimension 1, plus an odd box.
	var reqs []ReadRequest
	for _, c := range append(gridChunks(shape, []int{1, 4, 1}), box(ints(2, 3, 1), ints(5, 6, 2))) {
		reqs = append(reqs, ReadRequest{Key: "w", Kind: TensorItem, DType: "int16", Offsets: c.Offsets, Sizes: c.Sizes})
	}
	for _, gap := range []int64{0, 64, 1 << 20} {
		lp, err := PlanLoad(gp.Metadata, reqs, LoadOptions{MaxGapBytes: gap, MaxReadBytes: 256})
		require.NoError(t, err)
		checkLoadPlan(t, gp.Metadata, reqs, lp)
		dst := make([][]byte, len(reqs))
		for i, r := range reqs {
			dst[i] = make([]byte, statedict.NumElements(r.Sizes)*int64(es))
		}
		for _, op := range lp.Ops {
			data := objects[op.Object][op.Offset : op.Offset+op.Length]
			for _, cr := range op.Chunks {
				ch := gp.Metadata.Tensors[cr.Entry].Chunks[cr.Chunk]
				src := data[cr.Start : cr.Start+cr.Length]
				for _, c := range cr.Copies {
					r := reqs[c.Request]
					require.NoError(t, statedict.CopyRegion(dst[c.Request], r.Offsets, r.Sizes, src, ch.Offsets, ch.Sizes, c.Offsets, c.Sizes, es))
				}
			}
		}
		for i, r := range reqs {
			want := make([]byte, len(dst[i]))
			require.NoError(t, statedict.CopyRegion(want, r.Offsets, r.Sizes, full.Data, make([]int64, 3), shape, r.Offsets, r.Sizes, es))
			require.True(t, slices.Equal(want, dst[i]), "request %d (gap %d)", i, gap)
		}
	}
	require.Equal(t, metadata.FormatName, gp.Metadata.Format)
}
