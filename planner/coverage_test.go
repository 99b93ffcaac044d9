package planner

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/metadata"
	"github.com/ckptkit/ckptkit/statedict"
)

func box(offs, sizes []int64) metadata.Chunk { return metadata.Chunk{Offsets: offs, Sizes: sizes} }

func entry(shape []int64, chunks ...metadata.Chunk) *metadata.TensorEntry {
	return &metadata.TensorEntry{Key: "t", DType: "uint8", Shape: shape, Chunks: chunks}
}

// gridChunks splits shape into a grid with the given number of blocks per
// dimension.
func gridChunks(shape []int64, blocks []int) []metadata.Chunk {
	out := []metadata.Chunk{{Offsets: []int64{}, Sizes: []int64{}}}
	for d, n := range blocks {
		var next []metadata.Chunk
		for _, c := range out {
			for b := range n {
				lo, hi := statedict.SplitRange(shape[d], b, n)
				next = append(next, box(append(slices.Clone(c.Offsets), lo), append(slices.Clone(c.Sizes), hi-lo)))
			}
		}
		out = next
	}
	return out
}

func TestCheckCoverage(t *testing.T) {
	tests := []struct {
		name   string
		t      *metadata.TensorEntry
		kind   string // "" for success
		offs   []int64
		sizes  []int64
		detail string
	}{
		{name: "row", t: entry(ints(8, 3), gridChunks(ints(8, 3), []int{4, 1})...)},
		{name: "column", t: entry(ints(3, 8), gridChunks(ints(3, 8), []int{1, 3})...)},
		{name: "grid", t: entry(ints(6, 9), gridChunks(ints(6, 9), []int{3, 4})...)},
		{name: "3-D grid", t: entry(ints(4, 5, 6), gridChunks(ints(4, 5, 6), []int{2, 3, 2})...)},
		{name: "unordered bricks", t: entry(ints(4, 4),
			box(ints(2, 1), ints(2, 3)), box(ints(0, 0), ints(2, 3)), box(ints(0, 3), ints(2, 1)), box(ints(2, 0), ints(2, 1)))},
		{name: "0-dim", t: entry(ints(), box(ints(), ints()))},
		{name: "zero-size dim, no chunks", t: entry(ints(0, 5))},
		{name: "zero-size dim, empty chunks", t: entry(ints(3, 0), box(ints(0, 0), ints(3, 0)), box(ints(0, 0), ints(3, 0)))},
		{name: "empty chunks ignored", t: entry(ints(4), box(ints(0), ints(4)), box(ints(2), ints(0)))},

		{name: "0-dim without chunk", t: entry(ints()), kind: CoverageGap, offs: nil, sizes: nil},
		{name: "0-dim twice", t: entry(ints(), box(ints(), ints()), box(ints(), ints())), kind: CoverageOverlap, offs: nil, sizes: nil},
		{name: "no chunks", t: entry(ints(2, 3)), kind: CoverageGap, offs: ints(0, 0), sizes: ints(2, 3)},
		{name: "row missing", t: entry(ints(8, 3), box(ints(0, 0), ints(2, 3)), box(ints(2, 0), ints(2, 3)), box(ints(6, 0), ints(2, 3))),
			kind: CoverageGap, offs: ints(4, 0), sizes: ints(2, 3)},
		{name: "gap at the end", t: entry(ints(10), box(ints(0), ints(9))), kind: CoverageGap, offs: ints(9), sizes: ints(1)},
		{name: "grid cell missing", t: entry(ints(6, 9), slices.Delete(gridChunks(ints(6, 9), []int{3, 3}), 4, 5)...),
			kind: CoverageGap, offs: ints(2, 3), sizes: ints(2, 3)},
		{name: "3-D hole in the middle", t: entry(ints(3, 3, 3), slices.Delete(gridChunks(ints(3, 3, 3), []int{3, 3, 3}), 13, 14)...),
			kind: CoverageGap, offs: ints(1, 1, 1), sizes: ints(1, 1, 1)},
		{name: "duplicate chunk", t: entry(ints(4, 2), box(ints(0, 0), ints(2, 2)), box(ints(2, 0), ints(2, 2)), box(ints(2, 0), ints(2, 2))),
			kind: CoverageOverlap, offs: ints(2, 0), sizes: ints(2, 2), detail: "chunks 1 "},
		{name: "partial overlap, gap elsewhere", t: entry(ints(10, 4), box(ints(0, 0), ints(6, 4)), box(ints(5, 1), ints(5, 3))),
			kind: CoverageOverlap, offs: ints(5, 1), sizes: ints(1, 3)},
		{name: "grid overlap", t: entry(ints(4, 4), box(ints(0, 0), ints(2, 2)), box(ints(0, 2), ints(2, 2)), box(ints(2, 0), ints(2, 3)), box(ints(2, 2), ints(2, 2))),
			kind: CoverageOverlap, offs: ints(2, 2), sizes: ints(2, 1)},
		{name: "out of bounds", t: entry(ints(4, 4), box(ints(0, 0), ints(4, 4)), box(ints(3, 3), ints(1, 2))),
			kind: CoverageOutOfBounds, offs: ints(3, 3), sizes: ints(1, 2), detail: "chunk 1"},
		{name: "negative offset", t: entry(ints(4), box(ints(-1), ints(2))), kind: CoverageOutOfBounds, offs: ints(-1), sizes: ints(2)},
		{name: "wrong rank", t: entry(ints(4), box(ints(0, 0), ints(4, 1))), kind: CoverageOutOfBounds, offs: ints(0, 0), sizes: ints(4, 1)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckCoverage(tc.t)
			if tc.kind == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, ErrCoverage)
			var ce *CoverageError
			require.ErrorAs(t, err, &ce)
			assert.Equal(t, "t", ce.Key)
			assert.Equal(t, tc.kind, ce.Kind)
			assert.Equal(t, tc.offs, ce.Offsets)
			assert.Equal(t, tc.sizes, ce.Sizes)
			assert.Contains(t, err.Error(), `tensor "t"`)
			assert.Contains(t, err.Error(), tc.kind)
			assert.Contains(t, err.Error(), fmt.Sprintf("offsets %v sizes %v", tc.offs, tc.sizes))
			assert.Contains(t, ce.Detail, tc.detail)
		})
	}
}

// countCover counts, element by element, how many chunks cover each
// element of a small tensor.
func countCover(shape []int64, chunks []metadata.Chunk) []int {
	n := statedict.NumElements(shape)
	cnt := make([]int, n)
	for _, c := range chunks {
		for e := range n {
			rem, in := e, true
			for d := len(shape) - 1; d >= 0; d-- {
				x := rem % shape[d]
				rem /= shape[d]
				if x < c.Offsets[d] || x >= c.Offsets[d]+c.Sizes[d] {
					in = false
				}
			}
			if in {
				cnt[e]++
			}
		}
	}
	return cnt
}

// boxCounts returns the cover counts of every element inside a box.
func boxCounts(shape []int64, cnt []int, offs, sizes []int64) []int {
	var out []int
	for e := range int64(len(cnt)) {
		rem, in := e, true
		for d := len(shape) - 1; d >= 0; d-- {
			x := rem % shape[d]
			rem /= shape[d]
			if x < offs[d] || x >= offs[d]+sizes[d] {
				in = false
			}
		}
		if in {
			out = append(out, cnt[e])
		}
	}
	return out
}

// TestCheckCoverageRandom damages random grid tilings and compares the
// verdict and the reported region with element-by-element counting.
func TestCheckCoverageRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for iter := range 2000 {
		D := 1 + rng.IntN(3)
		shape := make([]int64, D)
		blocks := make([]int, D)
		for d := range D {
			shape[d] = 1 + rng.Int64N(6)
			blocks[d] = 1 + rng.IntN(int(shape[d]))
		}
		chunks := gridChunks(shape, blocks)
		rng.Shuffle(len(chunks), func(i, j int) { chunks[i], chunks[j] = chunks[j], chunks[i] })
		switch rng.IntN(4) {
		case 0: // intact
		case 1: // drop one
			chunks = slices.Delete(chunks, 0, 1)
		case 2: // duplicate one
			chunks = append(chunks, chunks[rng.IntN(len(chunks))])
		case 3: // grow one by one on some dimension, staying in bounds
			c := &chunks[rng.IntN(len(chunks))]
			c.Sizes = slices.Clone(c.Sizes)
			d := rng.IntN(D)
			if c.Offsets[d]+c.Sizes[d] < shape[d] {
				c.Sizes[d]++
			}
		}
		cnt := countCover(shape, chunks)
		exact := !slices.ContainsFunc(cnt, func(n int) bool { return n != 1 })
		err := CheckCoverage(entry(shape, chunks...))
		name := fmt.Sprintf("iter %d shape %v chunks %v", iter, shape, chunks)
		if exact {
			require.NoError(t, err, name)
			continue
		}
		var ce *CoverageError
		require.ErrorAs(t, err, &ce, name)
		require.NotEqual(t, int64(0), statedict.NumElements(ce.Sizes), name)
		in := boxCounts(shape, cnt, ce.Offsets, ce.Sizes)
		switch ce.Kind {
		case CoverageGap:
			require.False(t, slices.ContainsFunc(in, func(n int) bool { return n != 0 }), "%s: gap region %v %v is covered: %v", name, ce.Offsets, ce.Sizes, in)
			require.False(t, slices.ContainsFunc(cnt, func(n int) bool { return n > 1 }), "%s: a gap reported while an overlap exists", name)
		case CoverageOverlap:
			require.False(t, slices.ContainsFunc(in, func(n int) bool { return n < 2 }), "%s: overlap region %v %v: %v", name, ce.Offsets, ce.Sizes, in)
		default:
			t.Fatalf("%s: unexpected kind %s", name, ce.Kind)
		}
	}
}
