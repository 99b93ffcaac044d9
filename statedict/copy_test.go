package statedict

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// bruteCopy copies the box element by element, walking every global point
// of the box and computing each side's row-major index from scratch.
func bruteCopy(dst []byte, dOffs, dSizes []int64, src []byte, sOffs, sSizes []int64, bOffs, bSizes []int64, es int) {
	n := NumElements(bSizes)
	D := len(bSizes)
	p := make([]int64, D)
	for e := range n {
		rem := e
		for d := D - 1; d >= 0; d-- {
			p[d] = bOffs[d] + rem%bSizes[d]
			rem /= bSizes[d]
		}
		var si, di int64
		for d := range D {
			si = si*sSizes[d] + p[d] - sOffs[d]
			di = di*dSizes[d] + p[d] - dOffs[d]
		}
		copy(dst[di*int64(es):(di+1)*int64(es)], src[si*int64(es):(si+1)*int64(es)])
	}
}

// randBoxIn returns a random box inside [offs, offs+sizes).
func randBoxIn(rng *rand.Rand, offs, sizes []int64) (bo, bs []int64) {
	bo, bs = make([]int64, len(sizes)), make([]int64, len(sizes))
	for d := range sizes {
		lo := offs[d] + rng.Int64N(sizes[d]+1)
		hi := lo + rng.Int64N(offs[d]+sizes[d]-lo+1)
		bo[d], bs[d] = lo, hi-lo
	}
	return bo, bs
}

func TestCopyRegionMatchesBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	for iter := range 3000 {
		es := []int{1, 2, 4, 8}[rng.IntN(4)]
		D := 3
		if iter%10 == 0 {
			D = rng.IntN(3)
		}
		// A box, then src and dst chunks that contain it (sometimes
		// exactly, to exercise the contiguous fast paths).
		bo, bs := make([]int64, D), make([]int64, D)
		so, ss, do, ds := make([]int64, D), make([]int64, D), make([]int64, D), make([]int64, D)
		for d := range D {
			bo[d], bs[d] = rng.Int64N(5), 1+rng.Int64N(4)
			grow := func() (int64, int64) {
				if rng.IntN(2) == 0 {
					return bo[d], bs[d]
				}
				l := rng.Int64N(bo[d] + 1)
				return bo[d] - l, bs[d] + l + rng.Int64N(3)
			}
			so[d], ss[d] = grow()
			do[d], ds[d] = grow()
		}
		if iter%7 == 0 && D > 0 {
			bs[rng.IntN(D)] = 0 // empty box
		}
		src := make([]byte, NumElements(ss)*int64(es))
		for i := range src {
			src[i] = byte(rng.Uint32())
		}
		got := make([]byte, NumElements(ds)*int64(es))
		for i := range got {
			got[i] = byte(rng.Uint32())
		}
		want := append([]byte(nil), got...)
		bruteCopy(want, do, ds, src, so, ss, bo, bs, es)
		require.NoError(t, CopyRegion(got, do, ds, src, so, ss, bo, bs, es))
		require.Equal(t, want, got, "iter %d box %v %v src %v %v dst %v %v es %d", iter, bo, bs, so, ss, do, ds, es)

		// Random sub-boxes of the box as well.
		if D > 0 && NumElements(bs) > 0 {
			sbo, sbs := randBoxIn(rng, bo, bs)
			bruteCopy(want, do, ds, src, so, ss, sbo, sbs, es)
			require.NoError(t, CopyRegion(got, do, ds, src, so, ss, sbo, sbs, es))
			require.Equal(t, want, got)
		}
	}
}

func TestCopyRegionShardIntoFull(t *testing.T) {
	// Rows 2..3 of a [4, 3] int16 tensor land in the right place.
	src := []byte{1, 0, 2, 0, 3, 0, 4, 0, 5, 0, 6, 0}
	dst := make([]byte, 4*3*2)
	require.NoError(t, CopyRegion(dst, []int64{0, 0}, []int64{4, 3}, src, []int64{2, 0}, []int64{2, 3}, []int64{2, 0}, []int64{2, 3}, 2))
	require.Equal(t, append(make([]byte, 12), src...), dst)
	// A column of it.
	col := make([]byte, 4)
	require.NoError(t, CopyRegion(col, []int64{2, 1}, []int64{2, 1}, src, []int64{2, 0}, []int64{2, 3}, []int64{2, 1}, []int64{2, 1}, 2))
	require.Equal(t, []byte{2, 0, 5, 0}, col)
	// 0-dim.
	one := make([]byte, 4)
	require.NoError(t, CopyRegion(one, nil, nil, []byte{9, 8, 7, 6}, nil, nil, nil, nil, 4))
	require.Equal(t, []byte{9, 8, 7, 6}, one)
}

func TestCopyRegionErrors(t *testing.T) {
	buf := make([]byte, 16)
	s := []int64{4, 4}
	z := []int64{0, 0}
	tests := []struct {
		name string
		err  error
	}{
		{"box outside src", CopyRegion(buf, z, s, buf, []int64{1, 0}, []int64{3, 4}, z, []int64{1, 1}, 1)},
		{"box outside dst", CopyRegion(buf, z, s, buf, z, s, []int64{3, 3}, []int64{1, 2}, 1)},
		{"negative size", CopyRegion(buf, z, s, buf, z, s, []int64{1, 1}, []int64{-1, 1}, 1)},
		{"short src", CopyRegion(buf, z, s, buf[:15], z, s, z, []int64{1, 1}, 1)},
		{"wrong dst length for elem size", CopyRegion(buf, z, s, make([]byte, 32), z, s, z, []int64{1, 1}, 2)},
		{"rank", CopyRegion(buf, z, s, buf, z, s, []int64{0}, []int64{1}, 1)},
		{"elem size", CopyRegion(buf, z, s, buf, z, s, z, s, 0)},
	}
	for _, tc := range tests {
		require.ErrorIs(t, tc.err, ErrRegion, tc.name)
	}
}

func BenchmarkCopyRegion(b *testing.B) {
	// A [1024, 1024] float32 column block into a row block: 512 runs.
	src := make([]byte, 1024*512*4)
	dst := make([]byte, 512*1024*4)
	b.SetBytes(512 * 512 * 4)
	for b.Loop() {
		if err := CopyRegion(dst, []int64{0, 0}, []int64{512, 1024}, src, []int64{0, 512}, []int64{1024, 512}, []int64{0, 512}, []int64{512, 512}, 4); err != nil {
			b.Fatal(err)
		}
	}
}
