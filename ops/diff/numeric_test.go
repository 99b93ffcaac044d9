package diff

import (
	"encoding/binary"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/statedict"
)

func le16(vs ...uint16) []byte {
	b := make([]byte, 2*len(vs))
	for i, v := range vs {
		binary.LittleEndian.PutUint16(b[2*i:], v)
	}
	return b
}

func le32f(vs ...float32) []byte {
	b := make([]byte, 4*len(vs))
	for i, v := range vs {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
	return b
}

func TestMaxAbsDiff(t *testing.T) {
	nan := float32(math.NaN())
	inf := float32(math.Inf(1))
	cases := []struct {
		name string
		dt   statedict.DType
		a, b []byte
		tol  float64
		max  float64
		over int64
	}{
		{"f32", statedict.Float32, le32f(1, 2, 3), le32f(1, 2.5, 2), 0.6, 1, 1},
		{"f32 nan==nan, inf==inf", statedict.Float32, le32f(nan, inf), le32f(nan, inf), 0, 0, 0},
		{"f32 nan vs number", statedict.Float32, le32f(nan, 1), le32f(1, 1), 0, math.Inf(1), 1},
		{"bf16 1.0 vs 1.5", statedict.BFloat16, le16(0x3f80), le16(0x3fc0), 0.4, 0.5, 1},
		{"f16 1.0 vs -2.0", statedict.Float16, le16(0x3c00), le16(0xc000), 0, 3, 1},
		{"i16", statedict.Int16, le16(0xffff), le16(0x0001), 1.5, 2, 1},
		{"i8", statedict.Int8, []byte{0x80}, []byte{0x7f}, 0, 255, 1},
		{"u8", statedict.Uint8, []byte{200, 1}, []byte{100, 1}, 0, 100, 1},
		{"bool", statedict.Bool, []byte{1, 0}, []byte{1, 1}, 0, 1, 1},
		{"c64 modulus", statedict.Complex64, le32f(0, 0), le32f(3, 4), 4.9, 5, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m, over, err := maxAbsDiff(tc.dt, tc.a, tc.b, tc.tol)
			require.NoError(t, err)
			assert.Equal(t, tc.max, m)
			assert.Equal(t, tc.over, over)
		})
	}
	_, _, err := maxAbsDiff("float8", nil, nil, 0)
	require.ErrorIs(t, err, ErrNotNumeric)
}
