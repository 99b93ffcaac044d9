package planner

import (
	"fmt"
	"runtime"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/metadata"
	"github.com/ckptkit/ckptkit/statedict"
)

// savedMetadata plans a save of items produced per rank and returns its
// metadata.
func savedMetadata(t testing.TB, world int, items func(rank int) []SaveItem) *metadata.Checkpoint {
	t.Helper()
	var plans []LocalPlan
	for r := range world {
		plans = append(plans, LocalPlan{Rank: r, Items: items(r)})
	}
	gp, err := PlanSave(plans, SaveOptions{})
	require.NoError(t, err)
	return gp.Metadata
}

func rowRequest(key, dtype string, shape []int64, rank, world int) ReadRequest {
	it := rowItem(key, dtype, shape, rank, world)
	return ReadRequest{Key: key, Kind: TensorItem, DType: dtype, Offsets: it.Offsets, Sizes: it.Sizes}
}

// checkLoadPlan verifies structural invariants: ops sorted and
// non-overlapping, chunks inside their op at their stored offset, every
// saved chunk read at most once, and every request's copies tiling exactly
// the request's box (element counts and containment).
func checkLoadPlan(t testing.TB, md *metadata.Checkpoint, reqs []ReadRequest, lp *LoadPlan) {
	t.Helper()
	seen := map[[2]int]bool{}
	covered := make([]int64, len(reqs))
	var read int64
	for i, op := range lp.Ops {
		read += op.Length
		if i > 0 {
			prev := lp.Ops[i-1]
			require.True(t, prev.Object < op.Object || (prev.Object == op.Object && prev.Offset+prev.Length <= op.Offset), "ops sorted and disjoint")
		}
		for _, cr := range op.Chunks {
			id := [2]int{cr.Entry, cr.Chunk}
			if cr.Chunk < 0 {
				id[0] = -1 - cr.Entry
			}
			require.False(t, seen[id], "chunk %v read once", id)
			seen[id] = true
			require.NotEmpty(t, cr.Copies)
			require.LessOrEqual(t, cr.Start+cr.Length, op.Length)
			if cr.Chunk < 0 {
				b := md.Bytes[cr.Entry]
				require.Equal(t, b.Key, cr.Key)
				require.Equal(t, b.Object, op.Object)
				require.Equal(t, b.Offset, op.Offset+cr.Start)
				for _, c := range cr.Copies {
					require.Equal(t, b.Key, reqs[c.Request].Key)
					covered[c.Request] += b.Length
				}
				continue
			}
			te := md.Tensors[cr.Entry]
			ch := te.Chunks[cr.Chunk]
			require.Equal(t, te.Key, cr.Key)
			require.Equal(t, ch.Object, op.Object)
			require.Equal(t, ch.Offset, op.Offset+cr.Start)
			require.Equal(t, ch.Length, cr.Length)
			for _, c := range cr.Copies {
				r := reqs[c.Request]
				require.Equal(t, te.Key, r.Key)
				for d := range c.Offsets {
					require.GreaterOrEqual(t, c.Offsets[d], max(r.Offsets[d], ch.Offsets[d]))
					require.LessOrEqual(t, c.Offsets[d]+c.Sizes[d], min(r.Offsets[d]+r.Sizes[d], ch.Offsets[d]+ch.Sizes[d]))
				}
				covered[c.Request] += statedict.NumElements(c.Sizes) * metadata.ElementSize(te.DType)
			}
		}
	}
	require.Equal(t, read, lp.BytesRead)
	var needed int64
	for i, r := range reqs {
		want := metadata.ElementSize(r.DType) * statedict.NumElements(r.Sizes)
		if r.Kind == BytesItem {
			want = md.BytesValue(r.Key).Length
		}
		require.Equal(t, want, covered[i], "request %d (%s %v %v) filled exactly", i, r.Key, r.Offsets, r.Sizes)
		needed += want
	}
	require.Equal(t, needed, lp.BytesNeeded)
}

func TestPlanLoadReshardRows(t *testing.T) {
	shape := ints(12, 8)
	md := savedMetadata(t, 4, func(r int) []SaveItem {
		return []SaveItem{rowItem("model.w", "float32", shape, r, 4), wholeItem("model.b", "float32", ints(8))}
	})
	for _, world := range []int{1, 2, 3, 4, 5} {
		var reqs []ReadRequest
		for r := range world {
			reqs = append(reqs, rowRequest("model.w", "float32", shape, r, world), rowRequest("model.b", "float32", ints(8), 0, 1))
		}
		lp, err := PlanLoad(md, reqs, LoadOptions{})
		require.NoError(t, err, "world %d", world)
		checkLoadPlan(t, md, reqs, lp)
		// Every saved chunk of model.w is read once; model.b once for all.
		assert.Equal(t, int64(12*8*4+8*4), lp.BytesRead, "world %d", world)
		assert.Equal(t, int64(12*8*4+world*8*4), lp.BytesNeeded, "world %d", world)
		// Without the replicated bias, row resharding reads exactly what
		// it needs: amplification 1.0.
		var rows []ReadRequest
		for _, r := range reqs {
			if r.Key == "model.w" {
				rows = append(rows, r)
			}
		}
		lp, err = PlanLoad(md, rows, LoadOptions{})
		require.NoError(t, err)
		assert.Equal(t, lp.BytesNeeded, lp.BytesRead, "world %d: amplification 1.0", world)
	}
}

func TestPlanLoadSingleRankOfThree(t *testing.T) {
	// Saved as 4 row shards of 3 rows (each its own object); rank 0 of 3
	// wants rows [0,4): chunk 0 whole and row 3 of chunk 1.
	shape := ints(12, 2)
	md := savedMetadata(t, 4, func(r int) []SaveItem { return []SaveItem{rowItem("w", "int64", shape, r, 4)} })
	reqs := []ReadRequest{rowRequest("w", "int64", shape, 0, 3)}
	lp, err := PlanLoad(md, reqs, LoadOptions{})
	require.NoError(t, err)
	checkLoadPlan(t, md, reqs, lp)
	require.Len(t, lp.Ops, 2)
	assert.Equal(t, "rank-00000-000.data", lp.Ops[0].Object)
	assert.Equal(t, "rank-00001-000.data", lp.Ops[1].Object)
	assert.Equal(t, []Copy{{Request: 0, Offsets: ints(3, 0), Sizes: ints(1, 2)}}, lp.Ops[1].Chunks[0].Copies)
	assert.Equal(t, int64(4*2*8), lp.BytesNeeded)
	assert.Equal(t, int64(6*2*8), lp.BytesRead)
}

func TestPlanLoadColumnToRowsAndGrid(t *testing.T) {
	shape := ints(6, 6)
	md := savedMetadata(t, 3, func(r int) []SaveItem {
		return []SaveItem{tensorItem("c", "float16", shape, ints(0, int64(2*r)), ints(6, 2))}
	})
	reqs := []ReadRequest{
		rowRequest("c", "float16", shape, 0, 2),
		rowRequest("c", "float16", shape, 1, 2),
		{Key: "c", Kind: TensorItem, DType: "float16", Offsets: ints(1, 1), Sizes: ints(4, 4)}, // a grid block
	}
	lp, err := PlanLoad(md, reqs, LoadOptions{})
	require.NoError(t, err)
	checkLoadPlan(t, md, reqs, lp)
	require.Len(t, lp.Ops, 3, "each column chunk read once")
	for _, op := range lp.Ops {
		require.Len(t, op.Chunks, 1)
		assert.Len(t, op.Chunks[0].Copies, 3, "read once, copied to three requests")
	}
	assert.Equal(t, []Copy{
		{Request: 0, Offsets: ints(0, 2), Sizes: ints(3, 2)},
		{Request: 1, Offsets: ints(3, 2), Sizes: ints(3, 2)},
		{Request: 2, Offsets: ints(1, 2), Sizes: ints(4, 2)},
	}, lp.Ops[1].Chunks[0].Copies)
}

func TestPlanLoadBytesAndScalars(t *testing.T) {
	md := savedMetadata(t, 2, func(r int) []SaveItem {
		return []SaveItem{bytesItem("iteration", 4), tensorItem("step", "float32", ints(), ints(), ints())}
	})
	reqs := []ReadRequest{
		{Key: "iteration", Kind: BytesItem},
		{Key: "step", Kind: TensorItem, DType: "float32", Offsets: ints(), Sizes: ints()},
		{Key: "iteration", Kind: BytesItem},
	}
	lp, err := PlanLoad(md, reqs, LoadOptions{})
	require.NoError(t, err)
	checkLoadPlan(t, md, reqs, lp)
	var bytesReads []ChunkRead
	for _, op := range lp.Ops {
		for _, cr := range op.Chunks {
			if cr.Chunk < 0 {
				bytesReads = append(bytesReads, cr)
			}
		}
	}
	require.Len(t, bytesReads, 1)
	assert.Equal(t, []Copy{{Request: 0}, {Request: 2}}, bytesReads[0].Copies)
	assert.Equal(t, int64(4+4+4), lp.BytesNeeded)
	assert.Equal(t, int64(8), lp.BytesRead)
}

// coalesceMetadata is a [4, 100] uint8 tensor whose row chunks sit in one
// object at offsets 0, 100, 250 and 400 (holes of 0, 50 and 50 bytes),
// plus a 1000-byte tensor in a second object.
func coalesceMetadata(t testing.TB) *metadata.Checkpoint {
	md := &metadata.Checkpoint{
		Format: metadata.FormatName, Version: metadata.VersionString(), Training: metadata.TrainingState{Optimizer: metadata.OptimizerNone},
		Objects: []metadata.ObjectEntry{{Key: "a", Size: 500}, {Key: "b", Size: 1000}},
		Tensors: []metadata.TensorEntry{
			{Key: "big", DType: "uint8", Shape: ints(1000), Chunks: []metadata.Chunk{{Offsets: ints(0), Sizes: ints(1000), Object: "b", Length: 1000}}},
			{Key: "t", DType: "uint8", Shape: ints(4, 100)},
		},
	}
	for i, off := range []int64{0, 100, 250, 400} {
		md.Tensors[1].Chunks = append(md.Tensors[1].Chunks, metadata.Chunk{Offsets: ints(int64(i), 0), Sizes: ints(1, 100), Object: "a", Offset: off, Length: 100})
	}
	require.NoError(t, md.Validate())
	return md
}

func TestPlanLoadCoalescing(t *testing.T) {
	md := coalesceMetadata(t)
	all := []ReadRequest{
		{Key: "t", Kind: TensorItem, DType: "uint8", Offsets: ints(0, 0), Sizes: ints(4, 100)},
		{Key: "big", Kind: TensorItem, DType: "uint8", Offsets: ints(0), Sizes: ints(1000)},
	}
	type span struct {
		obj    string
		off, n int64
		starts []int64
	}
	tests := []struct {
		name string
		reqs []ReadRequest
		opts LoadOptions
		want []span
		read int64
	}{
		{"adjacent only", all, LoadOptions{}, []span{{"a", 0, 200, ints(0, 100)}, {"a", 250, 100, ints(0)}, {"a", 400, 100, ints(0)}, {"b", 0, 1000, ints(0)}}, 1400},
		{"read through holes", all, LoadOptions{MaxGapBytes: 50}, []span{{"a", 0, 500, ints(0, 100, 250, 400)}, {"b", 0, 1000, ints(0)}}, 1500},
		{"hole too big", all, LoadOptions{MaxGapBytes: 49}, []span{{"a", 0, 200, ints(0, 100)}, {"a", 250, 100, ints(0)}, {"a", 400, 100, ints(0)}, {"b", 0, 1000, ints(0)}}, 1400},
		{"capped", all, LoadOptions{MaxGapBytes: 50, MaxReadBytes: 300}, []span{{"a", 0, 200, ints(0, 100)}, {"a", 250, 250, ints(0, 150)}, {"b", 0, 1000, ints(0)}}, 1450},
		{"requested in reverse order", []ReadRequest{
			{Key: "t", Kind: TensorItem, DType: "uint8", Offsets: ints(3, 0), Sizes: ints(1, 100)},
			{Key: "t", Kind: TensorItem, DType: "uint8", Offsets: ints(2, 0), Sizes: ints(1, 100)},
			{Key: "t", Kind: TensorItem, DType: "uint8", Offsets: ints(0, 0), Sizes: ints(2, 100)},
		}, LoadOptions{}, []span{{"a", 0, 200, ints(0, 100)}, {"a", 250, 100, ints(0)}, {"a", 400, 100, ints(0)}}, 400},
		{"needed chunks only, hole too big", []ReadRequest{{Key: "t", Kind: TensorItem, DType: "uint8", Offsets: ints(0, 10), Sizes: ints(1, 5)}, {Key: "t", Kind: TensorItem, DType: "uint8", Offsets: ints(2, 0), Sizes: ints(1, 100)}},
			LoadOptions{MaxGapBytes: 149}, []span{{"a", 0, 100, ints(0)}, {"a", 250, 100, ints(0)}}, 200},
		{"needed chunks only", []ReadRequest{{Key: "t", Kind: TensorItem, DType: "uint8", Offsets: ints(0, 10), Sizes: ints(1, 5)}, {Key: "t", Kind: TensorItem, DType: "uint8", Offsets: ints(2, 0), Sizes: ints(1, 100)}},
			LoadOptions{MaxGapBytes: 150}, []span{{"a", 0, 350, ints(0, 250)}}, 350},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			lp, err := PlanLoad(md, tc.reqs, tc.opts)
			require.NoError(t, err)
			checkLoadPlan(t, md, tc.reqs, lp)
			var got []span
			for _, op := range lp.Ops {
				s := span{obj: op.Object, off: op.Offset, n: op.Length}
				for _, cr := range op.Chunks {
					s.starts = append(s.starts, cr.Start)
				}
				got = append(got, s)
			}
			assert.Equal(t, tc.want, got)
			assert.Equal(t, tc.read, lp.BytesRead)
		})
	}
}

func TestPlanLoadErrors(t *testing.T) {
	md := savedMetadata(t, 2, func(r int) []SaveItem {
		return []SaveItem{rowItem("model.w", "float32", ints(4, 4), r, 2), bytesItem("sched", 2)}
	})
	tests := []struct {
		name     string
		req      ReadRequest
		sentinel error
		contains []string
	}{
		{"missing tensor", ReadRequest{Key: "model.x", Kind: TensorItem, DType: "float32", Offsets: ints(0), Sizes: ints(1)}, ErrKeyNotFound, []string{`"model.x"`}},
		{"missing bytes", ReadRequest{Key: "iteration", Kind: BytesItem}, ErrKeyNotFound, []string{`"iteration"`}},
		{"dtype", ReadRequest{Key: "model.w", Kind: TensorItem, DType: "bfloat16", Offsets: ints(0, 0), Sizes: ints(4, 4)}, ErrPlanMismatch, []string{`"model.w"`, "bfloat16", "float32"}},
		{"box outside", ReadRequest{Key: "model.w", Kind: TensorItem, DType: "float32", Offsets: ints(2, 0), Sizes: ints(4, 4)}, ErrPlanMismatch, []string{`"model.w"`, "[2 0]", "[4 4]"}},
		{"rank differs", ReadRequest{Key: "model.w", Kind: TensorItem, DType: "float32", Offsets: ints(0), Sizes: ints(16)}, ErrPlanMismatch, []string{`"model.w"`, "[16]", "[4 4]"}},
		{"tensor as bytes", ReadRequest{Key: "model.w", Kind: BytesItem}, ErrPlanMismatch, []string{`"model.w"`, "bytes", "tensor"}},
		{"bytes as tensor", ReadRequest{Key: "sched", Kind: TensorItem, DType: "uint8", Offsets: ints(0), Sizes: ints(2)}, ErrPlanMismatch, []string{`"sched"`, "bytes", "tensor"}},
		{"bad kind", ReadRequest{Key: "sched", Kind: ItemKind(9)}, ErrInvalidPlan, []string{`"sched"`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := PlanLoad(md, []ReadRequest{tc.req}, LoadOptions{})
			require.ErrorIs(t, err, tc.sentinel)
			for _, s := range tc.contains {
				assert.Contains(t, err.Error(), s)
			}
		})
	}
	_, err := PlanLoad(nil, nil, LoadOptions{})
	require.ErrorIs(t, err, ErrInvalidPlan)
}

func TestPlanLoadEmptyRequest(t *testing.T) {
	md := savedMetadata(t, 1, func(int) []SaveItem { return []SaveItem{wholeItem("w", "int8", ints(3, 3))} })
	reqs := []ReadRequest{{Key: "w", Kind: TensorItem, DType: "int8", Offsets: ints(3, 0), Sizes: ints(0, 3)}}
	lp, err := PlanLoad(md, reqs, LoadOptions{})
	require.NoError(t, err)
	assert.Empty(t, lp.Ops)
	assert.Zero(t, lp.BytesNeeded)
}

// Regression (issue 16): planning a few tensors of a large checkpoint
// cost memory for every tensor of it (a per-tensor state slice), which a
// deep verify, planning 64k chunks at a time, paid once per batch: 4M
// tensors cost 2.8 GB. It now costs what the requests need.
func TestPlanLoadOfFewTensorsCostsWhatTheyNeed(t *testing.T) {
	md := benchLoadMetadata(200_000) // 200 tensors of 1000 chunks
	many := &metadata.Checkpoint{Format: md.Format, Version: md.Version, Training: md.Training, Objects: md.Objects}
	for i := range 200_000 {
		te := md.Tensors[i%len(md.Tensors)]
		te.Key = fmt.Sprintf("model.t%07d", i)
		te.Chunks = te.Chunks[:1:1]
		te.Shape = slices.Clone(te.Shape)
		te.Shape[0] = te.Chunks[0].Sizes[0]
		many.Tensors = append(many.Tensors, te)
	}
	reqs := []ReadRequest{rowRequest("model.t0000007", "float32", many.Tensors[7].Shape, 0, 1)}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	lp, err := PlanLoad(many, reqs, LoadOptions{})
	runtime.ReadMemStats(&after)
	require.NoError(t, err)
	require.Len(t, lp.Ops, 1)
	// About 3 MB: the first blocks of the plan's lists, whatever the
	// metadata holds (the per-tensor slice alone was 17.6 MB here).
	require.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(6<<20), "bytes allocated to plan one tensor of 200k")
}
