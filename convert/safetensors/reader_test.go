package safetensors_test

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
)

// stTensor is one tensor of a parsed safetensors file.
type stTensor struct {
	DType string
	Shape []int64
	Data  []byte
}

// readSafetensors is an independent, test-only reader: it parses the file
// format from its specification (length, JSON header, data) and checks
// its invariants: 8-byte aligned data, offsets that tile the data section
// exactly, sizes that match dtype and shape.
func readSafetensors(t *testing.T, st *backend.Store, name string) (map[string]stTensor, map[string]string) {
	t.Helper()
	raw, err := st.ReadAll(context.Background(), name, 0)
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(raw), 8)
	n := binary.LittleEndian.Uint64(raw[:8])
	require.LessOrEqual(t, 8+n, uint64(len(raw)))
	require.Zero(t, (8+n)%8, "data section is 8-byte aligned")
	hdr := raw[8 : 8+n]
	require.Equal(t, byte('{'), hdr[0])
	var fields map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(hdr, &fields))
	data := raw[8+n:]
	sizes := map[string]int{"F32": 4, "F16": 2, "BF16": 2, "F64": 8, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1, "C64": 8}
	out := map[string]stTensor{}
	var meta map[string]string
	covered := make([]bool, len(data))
	for k, v := range fields {
		if k == "__metadata__" {
			require.NoError(t, json.Unmarshal(v, &meta))
			continue
		}
		var e struct {
			DType       string  `json:"dtype"`
			Shape       []int64 `json:"shape"`
			DataOffsets []int64 `json:"data_offsets"`
		}
		require.NoError(t, json.Unmarshal(v, &e), k)
		require.Len(t, e.DataOffsets, 2, k)
		require.NotNil(t, e.Shape, "%s: shape must be a list", k)
		size, ok := sizes[e.DType]
		require.True(t, ok, "%s: dtype %q", k, e.DType)
		numel := int64(1)
		for _, d := range e.Shape {
			numel *= d
		}
		b, end := e.DataOffsets[0], e.DataOffsets[1]
		require.True(t, 0 <= b && b <= end && end <= int64(len(data)), "%s offsets %v", k, e.DataOffsets)
		require.Equal(t, numel*int64(size), end-b, k)
		for i := b; i < end; i++ {
			require.False(t, covered[i], "%s overlaps another tensor", k)
			covered[i] = true
		}
		out[k] = stTensor{DType: e.DType, Shape: e.Shape, Data: data[b:end]}
	}
	for i, c := range covered {
		require.True(t, c, fmt.Sprintf("data byte %d belongs to no tensor", i))
	}
	return out, meta
}
