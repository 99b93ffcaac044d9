package planner

import (
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/metadata"
	"github.com/ckptkit/ckptkit/statedict"
)

func ints(v ...int64) []int64 { return v }

func tensorItem(key, dtype string, shape, offs, sizes []int64) SaveItem {
	return SaveItem{Key: key, Kind: TensorItem, DType: dtype, GlobalShape: shape, Offsets: offs, Sizes: sizes,
		Length: statedict.NumElements(sizes) * metadata.ElementSize(dtype)}
}

func bytesItem(key string, n int64) SaveItem { return SaveItem{Key: key, Kind: BytesItem, Length: n} }

// rowItem is rank's row shard of a tensor split over world ranks.
func rowItem(key, dtype string, shape []int64, rank, world int) SaveItem {
	lo, hi := statedict.SplitRange(shape[0], rank, world)
	offs := make([]int64, len(shape))
	offs[0] = lo
	sizes := slices.Clone(shape)
	sizes[0] = hi - lo
	return tensorItem(key, dtype, shape, offs, sizes)
}

// wholeItem is the whole tensor (a replicated item when offered by many).
func wholeItem(key, dtype string, shape []int64) SaveItem {
	return tensorItem(key, dtype, shape, make([]int64, len(shape)), slices.Clone(shape))
}

// checkGlobalPlan verifies the plan's invariants against the metadata it
// built: every entry written exactly once, packed back to back, pointing
// at the item it came from.
func checkGlobalPlan(t testing.TB, plans []LocalPlan, gp *GlobalPlan) {
	t.Helper()
	md := gp.Metadata
	require.NoError(t, md.Validate())
	require.Equal(t, metadata.FormatName, md.Format)
	require.Equal(t, metadata.VersionString(), md.Version)
	require.Equal(t, len(plans), md.WorldSize)
	require.Equal(t, metadata.OptimizerNone, md.Training.Optimizer)
	byRank := map[int]LocalPlan{}
	for _, p := range plans {
		byRank[p.Rank] = p
	}
	written := map[string]int{}
	require.Len(t, md.Objects, len(gp.Writes))
	for wi, w := range gp.Writes {
		require.Equal(t, md.Objects[wi], metadata.ObjectEntry{Key: w.Object, Size: w.Size})
		if wi > 0 {
			require.Less(t, gp.Writes[wi-1].Object, w.Object)
		}
		var off int64
		for _, it := range w.Items {
			src := byRank[w.Rank].Items[it.LocalIndex]
			require.Equal(t, src.Key, it.Key)
			require.Equal(t, src.Length, it.Length)
			require.Equal(t, w.Object, it.Object)
			require.Equal(t, off, it.Offset, "items are packed back to back")
			off += it.Length
			if src.Kind == BytesItem {
				require.Equal(t, -1, it.Chunk)
				b := md.Bytes[it.Entry]
				require.Equal(t, metadata.BytesEntry{Key: it.Key, Object: w.Object, Offset: it.Offset, Length: it.Length}, b)
				written["b:"+it.Key]++
			} else {
				te := md.Tensors[it.Entry]
				require.Equal(t, it.Key, te.Key)
				c := te.Chunks[it.Chunk]
				require.True(t, slices.Equal(src.Offsets, c.Offsets), "offsets %v vs %v", src.Offsets, c.Offsets)
				require.True(t, slices.Equal(src.Sizes, c.Sizes), "sizes %v vs %v", src.Sizes, c.Sizes)
				require.Equal(t, w.Object, c.Object)
				require.Equal(t, it.Offset, c.Offset)
				require.Equal(t, it.Length, c.Length)
				written[fmt.Sprint("t:", it.Key, c.Offsets)]++
			}
		}
		require.Equal(t, off, w.Size)
	}
	n := len(md.Bytes)
	for _, te := range md.Tensors {
		n += len(te.Chunks)
		for j := 1; j < len(te.Chunks); j++ {
			require.Negative(t, slices.Compare(te.Chunks[j-1].Offsets, te.Chunks[j].Offsets), "chunks sorted by offsets")
		}
		require.NoError(t, CheckCoverage(&te))
	}
	require.Len(t, written, n, "every entry written")
	for k, c := range written {
		require.Equal(t, 1, c, "%s written once", k)
	}
}

// rankBytes sums the bytes each rank writes.
func rankBytes(gp *GlobalPlan) map[int]int64 {
	out := map[int]int64{}
	for _, w := range gp.Writes {
		out[w.Rank] += w.Size
	}
	return out
}
