package statedict

import (
	"fmt"
	"slices"
)

// Tensor is a dense tensor: dtype, shape and its elements as little-endian,
// row-major, contiguous bytes (bool one byte 0/1, bfloat16 its raw 16 bits).
type Tensor struct {
	DType DType
	Shape []int64
	Data  []byte
}

// NewTensor allocates a zeroed tensor.
func NewTensor(dt DType, shape ...int64) *Tensor {
	n := NumElements(shape)
	return &Tensor{DType: dt, Shape: slices.Clone(shape), Data: make([]byte, n*int64(dt.Size()))}
}

// Check verifies that Data holds exactly numel(Shape) elements of DType.
func (t *Tensor) Check() error {
	if !t.DType.Valid() {
		return fmt.Errorf("unknown dtype %q", t.DType)
	}
	n := NumElements(t.Shape)
	if n < 0 {
		return fmt.Errorf("invalid shape %v", t.Shape)
	}
	if want := n * int64(t.DType.Size()); int64(len(t.Data)) != want {
		return fmt.Errorf("%s%v needs %d bytes, has %d", t.DType, t.Shape, want, len(t.Data))
	}
	return nil
}

// Shard is one rank's chunk of a (possibly) sharded tensor: the box of the
// global tensor starting at Offsets with extent Sizes, stored densely in
// Data (row-major over Sizes). A replicated or unsharded tensor is a Shard
// whose Offsets are all 0 and Sizes equal GlobalShape. A 0-dim tensor has
// empty Offsets, Sizes and GlobalShape.
type Shard struct {
	DType       DType
	GlobalShape []int64
	Offsets     []int64
	Sizes       []int64
	Data        []byte
}

// Whole returns the Shard covering all of t (sharing t's bytes).
func Whole(t *Tensor) *Shard {
	return &Shard{DType: t.DType, GlobalShape: slices.Clone(t.Shape), Offsets: make([]int64, len(t.Shape)), Sizes: slices.Clone(t.Shape), Data: t.Data}
}

// RowShard returns rank's part of t when its first dimension is split over
// world ranks as evenly as possible (the first n%world ranks get one more
// row). A 0-dim tensor is returned whole. The Data shares t's bytes. The
// returned shard may be empty (zero rows) when t has fewer rows than ranks.
func RowShard(t *Tensor, rank, world int) *Shard {
	if len(t.Shape) == 0 {
		return Whole(t)
	}
	rows := t.Shape[0]
	lo, hi := SplitRange(rows, rank, world)
	rowBytes := int64(t.DType.Size())
	for _, d := range t.Shape[1:] {
		rowBytes *= d
	}
	sizes := slices.Clone(t.Shape)
	sizes[0] = hi - lo
	offsets := make([]int64, len(t.Shape))
	offsets[0] = lo
	return &Shard{DType: t.DType, GlobalShape: slices.Clone(t.Shape), Offsets: offsets, Sizes: sizes, Data: t.Data[lo*rowBytes : hi*rowBytes]}
}

// SplitRange returns [lo, hi) of rank's part when n items are split over
// world ranks as evenly as possible.
func SplitRange(n int64, rank, world int) (lo, hi int64) {
	w, r := int64(world), int64(rank)
	base, extra := n/w, n%w
	lo = r*base + min(r, extra)
	hi = lo + base
	if r < extra {
		hi++
	}
	return lo, hi
}

// NumElements is the number of elements in the shard.
func (s *Shard) NumElements() int64 { return NumElements(s.Sizes) }

// Check verifies the shard's geometry and byte length.
func (s *Shard) Check() error {
	if !s.DType.Valid() {
		return fmt.Errorf("unknown dtype %q", s.DType)
	}
	if len(s.Offsets) != len(s.GlobalShape) || len(s.Sizes) != len(s.GlobalShape) {
		return fmt.Errorf("chunk rank %d/%d does not match global shape %v", len(s.Offsets), len(s.Sizes), s.GlobalShape)
	}
	for i := range s.GlobalShape {
		if s.Offsets[i] < 0 || s.Sizes[i] < 0 || s.Offsets[i]+s.Sizes[i] > s.GlobalShape[i] {
			return fmt.Errorf("chunk offsets %v sizes %v out of bounds of %v", s.Offsets, s.Sizes, s.GlobalShape)
		}
	}
	if want := s.NumElements() * int64(s.DType.Size()); int64(len(s.Data)) != want {
		return fmt.Errorf("chunk %v needs %d bytes, has %d", s.Sizes, want, len(s.Data))
	}
	return nil
}
