package planner

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/metadata"
)

func TestPlanSaveReplicatedWrittenOnceAndBalanced(t *testing.T) {
	const world = 4
	var plans []LocalPlan
	for r := range world {
		items := []SaveItem{
			rowItem("model.w", "float32", ints(8, 32), r, world), // 256 B per rank
			wholeItem("model.a", "float32", ints(100)),           // 400 B, replicated
			wholeItem("model.b", "float32", ints(100)),
			wholeItem("model.c", "float32", ints(50)), // 200 B
			wholeItem("model.d", "float32", ints(50)),
			bytesItem("iteration", 3),
		}
		plans = append(plans, LocalPlan{Rank: r, Items: items})
	}
	gp, err := PlanSave(plans, SaveOptions{})
	require.NoError(t, err)
	checkGlobalPlan(t, plans, gp)

	md := gp.Metadata
	require.Len(t, md.Tensors, 5)
	require.Len(t, md.Tensors[0].Chunks, 1, "replicated model.a has one chunk")
	require.Equal(t, "model.w", md.Tensors[4].Key)
	require.Len(t, md.Tensors[4].Chunks, world)
	require.Len(t, md.Bytes, 1)
	require.Len(t, gp.Writes, world)

	// Greedy, largest first: a -> 0, b -> 1, c -> 2, d -> 3, iteration -> 2
	// (ties broken by lowest rank among the least loaded).
	owner := map[string]int{}
	for _, w := range gp.Writes {
		for _, it := range w.Items {
			owner[it.Key] = w.Rank
		}
	}
	assert.Equal(t, map[string]int{"model.a": 0, "model.b": 1, "model.c": 2, "model.d": 3, "iteration": 2, "model.w": 3}, owner)
	sizes := rankBytes(gp)
	assert.Equal(t, map[int]int64{0: 656, 1: 656, 2: 459, 3: 456}, sizes)
	// Items are packed by key: rank 2 writes iteration, model.c, model.w.
	var keys []string
	for _, it := range gp.Writes[2].Items {
		keys = append(keys, it.Key)
	}
	assert.Equal(t, []string{"iteration", "model.c", "model.w"}, keys)
}

func TestPlanSaveBalancesAroundForcedLoad(t *testing.T) {
	// Rank 0 owns a big unshared tensor; the replicated items must all go
	// to rank 1.
	plans := []LocalPlan{
		{Rank: 0, Items: []SaveItem{wholeItem("big", "float64", ints(1000)), wholeItem("r1", "uint8", ints(10)), wholeItem("r2", "uint8", ints(20))}},
		{Rank: 1, Items: []SaveItem{wholeItem("r2", "uint8", ints(20)), wholeItem("r1", "uint8", ints(10))}},
	}
	gp, err := PlanSave(plans, SaveOptions{})
	require.NoError(t, err)
	checkGlobalPlan(t, plans, gp)
	require.Len(t, gp.Writes, 2)
	assert.Equal(t, map[int]int64{0: 8000, 1: 30}, rankBytes(gp))
	// LocalIndex refers to rank 1's own item order.
	for _, it := range gp.Writes[1].Items {
		assert.Equal(t, map[string]int{"r1": 1, "r2": 0}[it.Key], it.LocalIndex)
	}
}

func TestPlanSaveDeterministic(t *testing.T) {
	mk := func() []LocalPlan {
		var plans []LocalPlan
		for r := range 3 {
			plans = append(plans, LocalPlan{Rank: r, Items: []SaveItem{
				rowItem("x", "bfloat16", ints(7, 3), r, 3), wholeItem("y", "int8", ints(5)), wholeItem("z", "int8", ints(5)),
			}})
		}
		return plans
	}
	a, err := PlanSave(mk(), SaveOptions{})
	require.NoError(t, err)
	b, err := PlanSave(mk(), SaveOptions{})
	require.NoError(t, err)
	assert.Equal(t, a, b)
}

func TestPlanSaveErrors(t *testing.T) {
	two := func(a, b SaveItem) []LocalPlan {
		return []LocalPlan{{Rank: 0, Items: []SaveItem{a}}, {Rank: 1, Items: []SaveItem{b}}}
	}
	tests := []struct {
		name     string
		plans    []LocalPlan
		opts     SaveOptions
		sentinel error
		contains []string
	}{
		{"dtype disagrees", two(rowItem("w", "float32", ints(4, 2), 0, 2), rowItem("w", "float16", ints(4, 2), 1, 2)),
			SaveOptions{}, ErrPlanMismatch, []string{`"w"`, "rank 0", "float32", "rank 1", "float16"}},
		{"global shape disagrees", two(rowItem("w", "float32", ints(4, 2), 0, 2), rowItem("w", "float32", ints(4, 3), 1, 2)),
			SaveOptions{}, ErrPlanMismatch, []string{`"w"`, "rank 0", "[4 2]", "rank 1", "[4 3]"}},
		{"kind disagrees", two(wholeItem("k", "int8", ints(2)), bytesItem("k", 2)),
			SaveOptions{}, ErrPlanMismatch, []string{`"k"`, "rank 0", "tensor", "rank 1", "bytes"}},
		{"bytes length disagrees", two(bytesItem("s", 2), bytesItem("s", 3)),
			SaveOptions{}, ErrPlanMismatch, []string{`"s"`, "rank 0", "rank 1"}},
		{"overlap", two(tensorItem("w", "int8", ints(4, 2), ints(0, 0), ints(3, 2)), tensorItem("w", "int8", ints(4, 2), ints(2, 0), ints(2, 2))),
			SaveOptions{}, ErrCoverage, []string{`"w"`, "overlap", "offsets [2 0] sizes [1 2]"}},
		{"gap", two(tensorItem("w", "int8", ints(6, 2), ints(0, 0), ints(2, 2)), tensorItem("w", "int8", ints(6, 2), ints(4, 0), ints(2, 2))),
			SaveOptions{}, ErrCoverage, []string{`"w"`, "gap", "offsets [2 0] sizes [2 2]"}},
		{"out of bounds", two(tensorItem("w", "int8", ints(4), ints(0), ints(2)), tensorItem("w", "int8", ints(4), ints(2), ints(3))),
			SaveOptions{}, ErrCoverage, []string{`"w"`, "out-of-bounds", "rank 1"}},
		{"unknown dtype", two(wholeItem("w", "float8", ints(2)), wholeItem("w", "float8", ints(2))),
			SaveOptions{}, ErrInvalidPlan, []string{`"w"`, "float8"}},
		{"wrong length", two(SaveItem{Key: "w", DType: "int32", GlobalShape: ints(2), Offsets: ints(0), Sizes: ints(2), Length: 7}, wholeItem("w", "int32", ints(2))),
			SaveOptions{}, ErrInvalidPlan, []string{`"w"`, "length 7, want 8"}},
		{"rank mismatch of offsets", two(SaveItem{Key: "w", DType: "int8", GlobalShape: ints(2, 2), Offsets: ints(0), Sizes: ints(2, 2), Length: 4}, wholeItem("w", "int8", ints(2, 2))),
			SaveOptions{}, ErrInvalidPlan, []string{`"w"`}},
		{"empty key", two(bytesItem("", 1), bytesItem("x", 1)), SaveOptions{}, ErrInvalidPlan, []string{"empty key"}},
		{"duplicate rank", []LocalPlan{{Rank: 3}, {Rank: 3}}, SaveOptions{}, ErrInvalidPlan, []string{"rank 3"}},
		{"same chunk twice on one rank", []LocalPlan{{Rank: 0, Items: []SaveItem{wholeItem("w", "int8", ints(2)), wholeItem("w", "int8", ints(2))}}},
			SaveOptions{}, ErrInvalidPlan, []string{`"w"`, "twice"}},
		{"same bytes twice on one rank", []LocalPlan{{Rank: 0, Items: []SaveItem{bytesItem("b", 1), bytesItem("b", 1)}}},
			SaveOptions{}, ErrInvalidPlan, []string{`"b"`, "twice"}},
		{"object names collide", two(bytesItem("a", 1), bytesItem("b", 1)),
			SaveOptions{ObjectName: func(int, int) string { return "same" }}, ErrInvalidPlan, []string{`"same"`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := PlanSave(tc.plans, tc.opts)
			require.Error(t, err)
			require.ErrorIs(t, err, tc.sentinel)
			for _, s := range tc.contains {
				assert.Contains(t, err.Error(), s)
			}
		})
	}
}

func TestPlanSaveGapReportsRegion(t *testing.T) {
	// Rank 2 of 4 lost its shard: the gap is exactly its rows.
	var plans []LocalPlan
	for _, r := range []int{0, 1, 3} {
		plans = append(plans, LocalPlan{Rank: r, Items: []SaveItem{rowItem("model.w", "float32", ints(8, 5), r, 4)}})
	}
	_, err := PlanSave(plans, SaveOptions{})
	var ce *CoverageError
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, "model.w", ce.Key)
	assert.Equal(t, CoverageGap, ce.Kind)
	assert.Equal(t, ints(4, 0), ce.Offsets)
	assert.Equal(t, ints(2, 5), ce.Sizes)
}

func TestPlanSaveShardings(t *testing.T) {
	col := func(r int) SaveItem { // [4, 6] split in 3 column blocks
		return tensorItem("col", "int16", ints(4, 6), ints(0, int64(2*r)), ints(4, 2))
	}
	grid := func(r int) SaveItem { // [4, 6] in a 2x3 grid of 2x2 blocks
		return tensorItem("grid", "int16", ints(4, 6), ints(int64(2*(r/3)), int64(2*(r%3))), ints(2, 2))
	}
	var plans []LocalPlan
	for r := range 6 {
		items := []SaveItem{grid(r), tensorItem("scalar", "float32", ints(), ints(), ints())}
		if r < 3 {
			items = append(items, col(r))
		}
		plans = append(plans, LocalPlan{Rank: r, Items: items})
	}
	gp, err := PlanSave(plans, SaveOptions{})
	require.NoError(t, err)
	checkGlobalPlan(t, plans, gp)
	md := gp.Metadata
	require.Equal(t, []string{"col", "grid", "scalar"}, []string{md.Tensors[0].Key, md.Tensors[1].Key, md.Tensors[2].Key})
	assert.Len(t, md.Tensors[0].Chunks, 3)
	assert.Len(t, md.Tensors[1].Chunks, 6)
	require.Len(t, md.Tensors[2].Chunks, 1, "0-dim replicated on 6 ranks is written once")
	assert.Equal(t, int64(4), md.Tensors[2].Chunks[0].Length)
	assert.Empty(t, md.Tensors[2].Chunks[0].Offsets)
}

func TestPlanSaveDropsEmptyChunks(t *testing.T) {
	// [2, 3] over 4 ranks: ranks 2 and 3 hold zero rows. [0, 4] has no
	// elements at all.
	var plans []LocalPlan
	for r := range 4 {
		plans = append(plans, LocalPlan{Rank: r, Items: []SaveItem{
			rowItem("w", "float32", ints(2, 3), r, 4),
			rowItem("empty", "float32", ints(0, 4), r, 4),
		}})
	}
	gp, err := PlanSave(plans, SaveOptions{})
	require.NoError(t, err)
	checkGlobalPlan(t, plans, gp)
	md := gp.Metadata
	require.Len(t, md.Tensors, 2)
	assert.Equal(t, "empty", md.Tensors[0].Key)
	assert.Empty(t, md.Tensors[0].Chunks)
	assert.Equal(t, ints(0, 4), md.Tensors[0].Shape)
	assert.Len(t, md.Tensors[1].Chunks, 2)
	require.Len(t, gp.Writes, 2, "ranks that write nothing get no object")
	assert.Equal(t, "rank-00000-000.data", gp.Writes[0].Object)
	assert.Equal(t, "rank-00001-000.data", gp.Writes[1].Object)
}

func TestPlanSaveMaxObjectBytes(t *testing.T) {
	items := []SaveItem{
		wholeItem("a", "uint8", ints(100)), wholeItem("b", "uint8", ints(100)), wholeItem("c", "uint8", ints(100)),
		wholeItem("d", "uint8", ints(400)), wholeItem("e", "uint8", ints(50)), bytesItem("f", 0),
	}
	plans := []LocalPlan{{Rank: 7, Items: items}}
	gp, err := PlanSave(plans, SaveOptions{MaxObjectBytes: 250})
	require.NoError(t, err)
	checkGlobalPlan(t, plans, gp)
	var got []string
	for _, w := range gp.Writes {
		var keys string
		for _, it := range w.Items {
			keys += it.Key
		}
		got = append(got, fmt.Sprintf("%s=%d:%s", w.Object, w.Size, keys))
	}
	assert.Equal(t, []string{
		"rank-00007-000.data=200:ab",
		"rank-00007-001.data=100:c",
		"rank-00007-002.data=400:d", // bigger than the cap: alone
		"rank-00007-003.data=50:ef",
	}, got)

	named, err := PlanSave(plans, SaveOptions{MaxObjectBytes: 250, ObjectName: func(r, n int) string { return fmt.Sprintf("r%d/%d", r, n) }})
	require.NoError(t, err)
	assert.Equal(t, "r7/3", named.Writes[3].Object)
}

func TestPlanSaveEmpty(t *testing.T) {
	gp, err := PlanSave([]LocalPlan{{Rank: 0}, {Rank: 1}}, SaveOptions{})
	require.NoError(t, err)
	assert.Empty(t, gp.Writes)
	assert.Equal(t, 2, gp.Metadata.WorldSize)
	require.NoError(t, gp.Metadata.Validate())
	_, err = metadata.Encode(gp.Metadata)
	require.NoError(t, err)
}

// PlanSave groups offers by merging the plans in key order: the plan (and
// so the metadata) does not depend on the order of each rank's items,
// sorted, reversed or mixed, nor on ranks offering different key sets.
func TestPlanSaveIndependentOfItemOrder(t *testing.T) {
	const world = 3
	build := func(order func(r int, items []SaveItem)) []LocalPlan {
		var plans []LocalPlan
		for r := range world {
			items := []SaveItem{bytesItem("iteration", 3), wholeItem("model.a", "float32", ints(10))}
			for k := range 20 {
				items = append(items, rowItem(fmt.Sprintf("model.l%02d.w", k), "float32", ints(6, 4), r, world))
			}
			if r == 1 {
				items = append(items, wholeItem("model.only1", "float32", ints(3)))
			}
			order(r, items)
			plans = append(plans, LocalPlan{Rank: r, Items: items})
		}
		return plans
	}
	sorted := build(func(_ int, items []SaveItem) {
		slices.SortFunc(items, func(a, b SaveItem) int { return strings.Compare(a.Key, b.Key) })
	})
	want, err := PlanSave(sorted, SaveOptions{})
	require.NoError(t, err)
	checkGlobalPlan(t, sorted, want)
	mixed := build(func(r int, items []SaveItem) {
		if r != 1 {
			slices.Reverse(items)
		}
	})
	got, err := PlanSave(mixed, SaveOptions{})
	require.NoError(t, err)
	checkGlobalPlan(t, mixed, got)
	require.Equal(t, want.Metadata, got.Metadata)
}
