package loader

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestContiguous(t *testing.T) {
	for _, tc := range []struct {
		name                string
		offs, sizes, bo, bs []int64
		ok                  bool
		start, n            int64
	}{
		{"0-dim", nil, nil, nil, nil, true, 0, 1},
		{"whole", []int64{0, 0}, []int64{10, 4}, []int64{0, 0}, []int64{10, 4}, true, 0, 40},
		{"row block", []int64{0, 0}, []int64{10, 4}, []int64{3, 0}, []int64{2, 4}, true, 12, 8},
		{"row block of a shard", []int64{5, 0}, []int64{5, 4}, []int64{7, 0}, []int64{3, 4}, true, 8, 12},
		{"part of one row", []int64{0, 0}, []int64{10, 4}, []int64{3, 1}, []int64{1, 2}, true, 13, 2},
		{"column block", []int64{0, 0}, []int64{10, 4}, []int64{0, 1}, []int64{10, 2}, false, 0, 0},
		{"2x2 block", []int64{0, 0}, []int64{10, 4}, []int64{3, 1}, []int64{2, 2}, false, 0, 0},
		{"3-d slab", []int64{0, 0, 0}, []int64{4, 3, 2}, []int64{1, 0, 0}, []int64{2, 3, 2}, true, 6, 12},
		{"3-d rows in one plane", []int64{0, 0, 0}, []int64{4, 3, 2}, []int64{1, 1, 0}, []int64{1, 2, 2}, true, 8, 4},
		{"3-d across planes", []int64{0, 0, 0}, []int64{4, 3, 2}, []int64{1, 1, 0}, []int64{2, 2, 2}, false, 0, 0},
	} {
		start, n, ok := contiguous(tc.offs, tc.sizes, tc.bo, tc.bs)
		require.Equal(t, tc.ok, ok, tc.name)
		if ok {
			require.Equal(t, tc.start, start, tc.name)
			require.Equal(t, tc.n, n, tc.name)
		}
	}
}
