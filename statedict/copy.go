package statedict

import (
	"fmt"

	"github.com/ckptkit/ckptkit/ckpterr"
)

// ErrRegion reports a CopyRegion call whose geometry is inconsistent: ranks
// differ, a box lies outside a chunk, or a buffer has the wrong length.
var ErrRegion = ckpterr.New(ckpterr.Usage, "invalid copy region")

// CopyRegion copies the box (boxOffsets, boxSizes, in global element
// coordinates) from src, a dense row-major chunk placed at srcOffsets with
// extent srcSizes, into dst, a dense row-major chunk placed at dstOffsets
// with extent dstSizes. elemSize is the element size in bytes.
//
// The box must lie inside both chunks and both buffers must hold exactly
// their chunk's elements; otherwise the error matches ErrRegion and nothing
// is copied. The copy moves contiguous runs (the innermost dimensions the
// box spans fully in both chunks) with one copy() each; when the whole box
// is one run it is a single copy. 0-dim chunks (empty slices) hold one
// element. An empty box copies nothing.
func CopyRegion(dst []byte, dstOffsets, dstSizes []int64, src []byte, srcOffsets, srcSizes []int64, boxOffsets, boxSizes []int64, elemSize int) error {
	D := len(boxSizes)
	if elemSize <= 0 {
		return fmt.Errorf("%w: element size %d", ErrRegion, elemSize)
	}
	if len(boxOffsets) != D || len(srcOffsets) != D || len(srcSizes) != D || len(dstOffsets) != D || len(dstSizes) != D {
		return fmt.Errorf("%w: ranks differ: box %v/%v, src %v/%v, dst %v/%v", ErrRegion, boxOffsets, boxSizes, srcOffsets, srcSizes, dstOffsets, dstSizes)
	}
	es := int64(elemSize)
	for _, c := range []struct {
		name       string
		buf        []byte
		offs, size []int64
	}{{"src", src, srcOffsets, srcSizes}, {"dst", dst, dstOffsets, dstSizes}} {
		n := NumElements(c.size)
		if n < 0 || int64(len(c.buf)) != n*es {
			return fmt.Errorf("%w: %s chunk sizes %v needs %d bytes of %d-byte elements, has %d", ErrRegion, c.name, c.size, n*es, es, len(c.buf))
		}
		for d := range D {
			if boxSizes[d] < 0 || boxOffsets[d] < c.offs[d] || boxOffsets[d]+boxSizes[d] > c.offs[d]+c.size[d] {
				return fmt.Errorf("%w: box offsets %v sizes %v is not inside the %s chunk at offsets %v sizes %v", ErrRegion, boxOffsets, boxSizes, c.name, c.offs, c.size)
			}
		}
	}
	if NumElements(boxSizes) == 0 {
		return nil
	}
	// Innermost dimensions the box spans fully in both chunks form, with
	// the next one out, a contiguous run.
	k := D // dims [k, D) are fully spanned
	for k > 0 && boxSizes[k-1] == srcSizes[k-1] && boxSizes[k-1] == dstSizes[k-1] {
		k--
	}
	outer := k - 1 // dims [0, outer) are iterated; dim outer (if any) is part of the run
	run := es
	for d := max(outer, 0); d < D; d++ {
		run *= boxSizes[d]
	}
	if outer <= 0 {
		s := linear(srcOffsets, srcSizes, boxOffsets) * es
		t := linear(dstOffsets, dstSizes, boxOffsets) * es
		copy(dst[t:t+run], src[s:s+run])
		return nil
	}
	// Strides in bytes for the iterated dimensions.
	sStride, dStride := make([]int64, D), make([]int64, D)
	ss, ds := es, es
	for d := D - 1; d >= 0; d-- {
		sStride[d], dStride[d] = ss, ds
		ss *= srcSizes[d]
		ds *= dstSizes[d]
	}
	s0 := linear(srcOffsets, srcSizes, boxOffsets) * es
	t0 := linear(dstOffsets, dstSizes, boxOffsets) * es
	idx := make([]int64, outer)
	for {
		copy(dst[t0:t0+run], src[s0:s0+run])
		d := outer - 1
		for ; d >= 0; d-- {
			idx[d]++
			s0 += sStride[d]
			t0 += dStride[d]
			if idx[d] < boxSizes[d] {
				break
			}
			s0 -= sStride[d] * boxSizes[d]
			t0 -= dStride[d] * boxSizes[d]
			idx[d] = 0
		}
		if d < 0 {
			return nil
		}
	}
}

// linear returns the row-major element index, inside a chunk at offs with
// extent sizes, of the global point p.
func linear(offs, sizes, p []int64) int64 {
	var i int64
	for d := range sizes {
		i = i*sizes[d] + (p[d] - offs[d])
	}
	return i
}
