package torchdcp

import (
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestDecodeTensorStrides(t *testing.T) {
	storage := float32s(0, 1, 2, 3, 4, 5) // a 2x3 tensor [[0,1,2],[3,4,5]]
	cases := []struct {
		name           string
		offset         int64
		size, stride   []int64
		want           []byte
		storageNumel   int64
		storageEntries map[string][]byte
	}{
		{name: "contiguous", size: []int64{2, 3}, stride: []int64{3, 1}, want: storage},
		{name: "transposed", size: []int64{3, 2}, stride: []int64{1, 3}, want: float32s(0, 3, 1, 4, 2, 5)},
		{name: "storage offset", offset: 2, size: []int64{2, 2}, stride: []int64{2, 1}, want: float32s(2, 3, 4, 5)},
		{name: "column slice", offset: 1, size: []int64{2}, stride: []int64{3}, want: float32s(1, 4)},
		{name: "scalar", offset: 5, size: []int64{}, stride: []int64{}, want: float32s(5)},
		{name: "empty", size: []int64{0, 3}, stride: []int64{3, 1}, want: []byte{}},
		{name: "broadcast", size: []int64{3, 2}, stride: []int64{0, 1}, want: float32s(0, 1, 0, 1, 0, 1)},
		{name: "size-1 dim odd stride", size: []int64{1, 6}, stride: []int64{99, 1}, want: storage},
		{name: "3d permuted", size: []int64{3, 1, 2}, stride: []int64{1, 6, 3}, want: float32s(0, 3, 1, 4, 2, 5)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			pkl := tensorPickle("FloatStorage", 6, c.offset, c.size, c.stride)
			item := torchSave(t, "some_stem", pkl, map[string][]byte{"0": storage}, nil)
			dt, shape, raw, err := DecodeTensor(item)
			require.NoError(t, err)
			assert.Equal(t, "float32", dt)
			assert.Equal(t, c.size, shape)
			assert.Equal(t, c.want, raw)
		})
	}
}

func TestDecodeTensorDTypes(t *testing.T) {
	for class, dtype := range storageClasses {
		t.Run(class, func(t *testing.T) {
			es := map[string]int{"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4,
				"int16": 2, "int8": 1, "uint8": 1, "bool": 1, "complex64": 8}[dtype]
			storage := make([]byte, 3*es)
			for i := range storage {
				storage[i] = byte(i)
			}
			item := torchSave(t, "archive", tensorPickle(class, 3, 0, []int64{3}, []int64{1}), map[string][]byte{"0": storage}, nil)
			dt, shape, raw, err := DecodeTensor(item)
			require.NoError(t, err)
			assert.Equal(t, dtype, dt)
			assert.Equal(t, []int64{3}, shape)
			assert.Equal(t, storage, raw)
		})
	}
}

func TestDecodeTensorBigEndian(t *testing.T) {
	be := []byte{0x3f, 0x80, 0, 0, 0x40, 0, 0, 0} // 1.0, 2.0 big-endian
	item := torchSave(t, "archive", tensorPickle("FloatStorage", 2, 0, []int64{2}, []int64{1}),
		map[string][]byte{"0": be}, map[string][]byte{"byteorder": []byte("big")})
	_, _, raw, err := DecodeTensor(item)
	require.NoError(t, err)
	assert.Equal(t, float32s(1, 2), raw)

	// complex64 swaps each float32 half.
	item = torchSave(t, "archive", tensorPickle("ComplexFloatStorage", 1, 0, []int64{1}, []int64{1}),
		map[string][]byte{"0": be}, map[string][]byte{"byteorder": []byte("big")})
	_, _, raw, err = DecodeTensor(item)
	require.NoError(t, err)
	assert.Equal(t, float32s(1, 2), raw)
}

func TestDecodeTensorErrors(t *testing.T) {
	storage := float32s(0, 1, 2, 3)
	cases := map[string][]byte{
		"not a zip":         []byte("hello"),
		"no data.pkl":       torchSave(t, "a/b", nil, nil, nil),
		"missing storage":   torchSave(t, "a", tensorPickle("FloatStorage", 4, 0, []int64{4}, []int64{1}), nil, nil),
		"short storage":     torchSave(t, "a", tensorPickle("FloatStorage", 5, 0, []int64{5}, []int64{1}), map[string][]byte{"0": storage}, nil),
		"view past end":     torchSave(t, "a", tensorPickle("FloatStorage", 4, 1, []int64{4}, []int64{1}), map[string][]byte{"0": storage}, nil),
		"stride past end":   torchSave(t, "a", tensorPickle("FloatStorage", 4, 0, []int64{2, 2}, []int64{3, 1}), map[string][]byte{"0": storage}, nil),
		"negative stride":   torchSave(t, "a", tensorPickle("FloatStorage", 4, 3, []int64{4}, []int64{-1}), map[string][]byte{"0": storage}, nil),
		"rank mismatch":     torchSave(t, "a", tensorPickle("FloatStorage", 4, 0, []int64{4}, []int64{1, 1}), map[string][]byte{"0": storage}, nil),
		"huge broadcast":    torchSave(t, "a", tensorPickle("FloatStorage", 4, 0, []int64{1 << 20, 4}, []int64{0, 1}), map[string][]byte{"0": storage}, nil),
		"overflow shape":    torchSave(t, "a", tensorPickle("FloatStorage", 4, 0, []int64{1 << 40, 1 << 40}, []int64{0, 0}), map[string][]byte{"0": storage}, nil),
		"not a tensor":      torchSave(t, "a", newPickle(2).int(3).stop(), nil, nil),
		"bad byteorder":     torchSave(t, "a", tensorPickle("FloatStorage", 4, 0, []int64{4}, []int64{1}), map[string][]byte{"0": storage}, map[string][]byte{"byteorder": []byte("middle")}),
		"two data.pkl":      torchSave(t, "a", tensorPickle("FloatStorage", 4, 0, []int64{4}, []int64{1}), map[string][]byte{"0": storage}, map[string][]byte{"/b/data.pkl": nil}),
		"unknown storage":   torchSave(t, "a", newPickle(2).global("torch", "QUInt8Storage").stop(), nil, nil),
		"bad persistent id": torchSave(t, "a", newPickle(2).str("storage").op(opTuple1, opBinPersID).stop(), nil, nil),
	}
	for name, item := range cases {
		t.Run(name, func(t *testing.T) {
			_, _, _, err := DecodeTensor(item)
			require.Error(t, err)
			if name == "unknown storage" {
				require.ErrorIs(t, err, ErrForbiddenGlobal)
				return
			}
			require.ErrorIs(t, err, ErrMalformed)
		})
	}
}

func TestTensorChunkDecoderChecksMetadata(t *testing.T) {
	item := torchSave(t, "archive", tensorPickle("FloatStorage", 6, 0, []int64{2, 3}, []int64{3, 1}),
		map[string][]byte{"0": float32s(0, 1, 2, 3, 4, 5)}, nil)
	raw, err := decodeTensorItem(item, "float32", []int64{2, 3})
	require.NoError(t, err)
	assert.Len(t, raw, 24)
	_, err = decodeTensorItem(item, "float64", []int64{2, 3})
	require.ErrorIs(t, err, ErrItemMismatch)
	assert.Contains(t, err.Error(), "float64")
	_, err = decodeTensorItem(item, "float32", []int64{3, 2})
	require.ErrorIs(t, err, ErrItemMismatch)
	assert.Contains(t, err.Error(), "[3 2]")
}

func TestDecodeValue(t *testing.T) {
	p := newPickle(2).op(opEmptyDict, opMark)
	p.str("lr").float(0.5)
	p.int(3).op(opEmptyList, opMark).int(1).op(opNone, opNewTrue).op(opAppends)
	p.str("betas").float(0.9).float(0.999).op(opTuple2)
	p.str("raw").global("_codecs", "encode").str("\u00ffA").str("latin1").op(opTuple2, opReduce)
	p.str("od").global("collections", "OrderedDict").op(opEmptyTuple, opReduce)
	p.op(opSetItems)
	item := torchSave(t, "archive", p.stop(), nil, nil)
	v, err := DecodeValue(item)
	require.NoError(t, err)
	assert.Equal(t, map[string]any{
		"lr": 0.5, "3": []any{int64(1), nil, true}, "betas": []any{0.9, 0.999},
		"raw": []byte{0xff, 'A'}, "od": map[string]any{},
	}, v)
	out, err := decodeBytesItem(item, "", nil)
	require.NoError(t, err)
	assert.JSONEq(t, `{"lr":0.5,"3":[1,null,true],"betas":[0.9,0.999],"raw":"/0E=","od":{}}`, string(out))

	// Infinity has no JSON form: the raw item comes back.
	inf := torchSave(t, "archive", newPickle(2).float(math.Inf(1)).stop(), nil, nil)
	out, err = decodeBytesItem(inf, "", nil)
	require.NoError(t, err)
	assert.True(t, IsRawItem(out))

	// A tensor inside a value is opaque.
	f, err := os.ReadFile(filepath.Join("testdata", "nested_unflattened", "__0_0.distcp"))
	require.NoError(t, err)
	_, err = DecodeValue(f)
	require.ErrorIs(t, err, ErrOpaque)

	// A tuple-keyed dict is opaque.
	tk := torchSave(t, "archive", newPickle(2).op(opEmptyDict).int(1).int(2).op(opTuple2, opNone, opSetItem).stop(), nil, nil)
	_, err = DecodeValue(tk)
	require.ErrorIs(t, err, ErrOpaque)
}

// TestTruncatedInputs: every prefix of real items and metadata fails
// cleanly.
func TestTruncatedInputs(t *testing.T) {
	dense, err := os.ReadFile(filepath.Join("testdata", "dense", "__0_0.distcp"))
	require.NoError(t, err)
	item := dense[8253 : 8253+1259]
	for n := 0; n < len(item); n++ {
		_, _, _, err := DecodeTensor(item[:n])
		require.Error(t, err, "prefix %d", n)
		_, err = DecodeValue(item[:n])
		require.Error(t, err, "prefix %d", n)
	}
	meta, err := os.ReadFile(filepath.Join("testdata", "nested_unflattened", ".metadata"))
	require.NoError(t, err)
	for n := 0; n < len(meta); n++ {
		_, err := DecodeMetadata(meta[:n])
		require.ErrorIs(t, err, ErrMalformed, "prefix %d", n)
	}
	// Flipping each byte of the pickle never panics.
	for i := range meta {
		m := append([]byte(nil), meta...)
		m[i] ^= 0x5a
		_, _ = DecodeMetadata(m)
	}
}
