package diff

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/ckptkit/ckptkit/statedict"
)

// decoder returns the function reading element i of little-endian data of
// dtype as float64 values (two for complex64: real and imaginary).
func decoder(dt statedict.DType) (func(b []byte, i int) (re, im float64), error) {
	le := binary.LittleEndian
	switch dt {
	case statedict.Float32:
		return func(b []byte, i int) (float64, float64) {
			return float64(math.Float32frombits(le.Uint32(b[4*i:]))), 0
		}, nil
	case statedict.Float64:
		return func(b []byte, i int) (float64, float64) { return math.Float64frombits(le.Uint64(b[8*i:])), 0 }, nil
	case statedict.Float16:
		return func(b []byte, i int) (float64, float64) { return HalfToFloat64(le.Uint16(b[2*i:])), 0 }, nil
	case statedict.BFloat16:
		return func(b []byte, i int) (float64, float64) {
			return float64(math.Float32frombits(uint32(le.Uint16(b[2*i:])) << 16)), 0
		}, nil
	case statedict.Int64:
		return func(b []byte, i int) (float64, float64) { return float64(int64(le.Uint64(b[8*i:]))), 0 }, nil
	case statedict.Int32:
		return func(b []byte, i int) (float64, float64) { return float64(int32(le.Uint32(b[4*i:]))), 0 }, nil
	case statedict.Int16:
		return func(b []byte, i int) (float64, float64) { return float64(int16(le.Uint16(b[2*i:]))), 0 }, nil
	case statedict.Int8:
		return func(b []byte, i int) (float64, float64) { return float64(int8(b[i])), 0 }, nil
	case statedict.Uint8, statedict.Bool:
		return func(b []byte, i int) (float64, float64) { return float64(b[i]), 0 }, nil
	case statedict.Complex64:
		return func(b []byte, i int) (float64, float64) {
			return float64(math.Float32frombits(le.Uint32(b[8*i:]))), float64(math.Float32frombits(le.Uint32(b[8*i+4:])))
		}, nil
	}
	return nil, fmt.Errorf("%w: %q", ErrNotNumeric, dt)
}

// HalfToFloat64 decodes an IEEE 754 binary16 value.
func HalfToFloat64(h uint16) float64 {
	sign := 1.0
	if h&0x8000 != 0 {
		sign = -1
	}
	exp := int(h>>10) & 0x1f
	frac := float64(h & 0x3ff)
	switch exp {
	case 0:
		return sign * math.Ldexp(frac, -24) // subnormal: frac * 2^-14 / 1024
	case 0x1f:
		if frac != 0 {
			return math.NaN()
		}
		return sign * math.Inf(1)
	}
	return sign * math.Ldexp(1+frac/1024, exp-15)
}

// maxAbsDiff returns the largest |a[i]-b[i]| over the elements of two
// equally shaped tensors and how many elements differ by more than tol.
// Two NaNs at the same position are equal; a NaN against a number, or
// infinities of different sign, differ by +Inf. Complex values differ by
// the modulus of their difference.
func maxAbsDiff(dt statedict.DType, a, b []byte, tol float64) (maxDiff float64, over int64, err error) {
	dec, err := decoder(dt)
	if err != nil {
		return 0, 0, err
	}
	n := len(a) / dt.Size()
	for i := range n {
		ar, ai := dec(a, i)
		br, bi := dec(b, i)
		d := math.Max(elemDiff(ar, br), 0)
		if dt == statedict.Complex64 {
			d = math.Hypot(elemDiff(ar, br), elemDiff(ai, bi))
		}
		if d > maxDiff {
			maxDiff = d
		}
		if d > tol {
			over++
		}
	}
	return maxDiff, over, nil
}

func elemDiff(a, b float64) float64 {
	an, bn := math.IsNaN(a), math.IsNaN(b)
	switch {
	case an && bn:
		return 0
	case an || bn:
		return math.Inf(1)
	case a == b: // also equal infinities
		return 0
	}
	return math.Abs(a - b)
}
