// Package statedict holds the in-memory form of training state: tensors
// (dtype, shape, little-endian row-major bytes), sharded tensors (a local
// chunk of a global shape) and opaque byte values, each under a flat dotted
// key (docs/FORMAT.md, "Keys"). It owns the one table of dtypes and their
// element sizes.
package statedict

import "sort"

// DType names an element type. The names are the ones docs/FORMAT.md uses.
type DType string

// Supported element types.
const (
	Float32  DType = "float32"
	Float16  DType = "float16"
	BFloat16 DType = "bfloat16"
	Float64  DType = "float64"
	Int64    DType = "int64"
	Int32    DType = "int32"
	Int16    DType = "int16"
	Int8     DType = "int8"
	Uint8    DType = "uint8"
	Bool     DType = "bool"
	// Complex64 is a pair of float32 (real, imaginary).
	Complex64 DType = "complex64"
)

// dtypeSizes is the one table of element sizes in bytes: every other
// package asks DType.Size (metadata.ElementSize for a dtype name).
var dtypeSizes = map[DType]int{
	Float32: 4, Float16: 2, BFloat16: 2, Float64: 8, Int64: 8, Int32: 4,
	Int16: 2, Int8: 1, Uint8: 1, Bool: 1, Complex64: 8,
}

// Size returns the element size in bytes, or 0 for an unknown dtype.
func (d DType) Size() int { return dtypeSizes[d] }

// Valid reports whether d is a supported dtype.
func (d DType) Valid() bool { return dtypeSizes[d] > 0 }

// DTypes lists every supported dtype, sorted by name.
func DTypes() []DType {
	out := make([]DType, 0, len(dtypeSizes))
	for d := range dtypeSizes {
		out = append(out, d)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// NumElements returns the product of shape (1 for a 0-dim shape), or -1 if a
// dimension is negative or the product overflows int64.
func NumElements(shape []int64) int64 {
	n := int64(1)
	for _, d := range shape {
		if d < 0 {
			return -1
		}
		if d != 0 && n > (1<<62)/d {
			return -1
		}
		n *= d
	}
	return n
}
