package metadata

import (
	"bytes"
	"testing"
	"time"

	gojson "github.com/goccy/go-json"
	"github.com/stretchr/testify/require"
)

// The spliced encoder writes exactly what the library's encoder writes for
// the whole checkpoint, escapes, non-ASCII, invalid UTF-8, HTML characters,
// encodings and nil slices included; and what it writes decodes back.
func TestEncodeMatchesLibraryEncoder(t *testing.T) {
	odd := []string{"model.plain", "model.q\"uote", "model.back\\slash", "model.ctl\x01\n\t", "model.é-ü-日本",
		"model.bad\xff\xfeutf8", "model.<html>&", "model.<q\"&>é", "model.sep\u2028\u2029", "model.del\x7f"}
	c := &Checkpoint{
		Format: FormatName, Version: VersionString(), Writer: "w \"x\" <y>", CreatedAt: time.Date(2026, 12, 1, 9, 0, 0, 123, time.UTC),
		WorldSize: 2, Objects: []ObjectEntry{{Key: "rank-00000-000.data", Size: 1 << 40}},
		Bytes:    []BytesEntry{{Key: "scheduler.x", Object: "rank-00000-000.data", Length: 3, CRC32C: 7}},
		Training: TrainingState{Iteration: 5, Optimizer: OptimizerSaved, Params: []string{"fc\"1"}},
	}
	for i, k := range odd {
		c.Tensors = append(c.Tensors, TensorEntry{Key: k, DType: "float32", Shape: []int64{int64(i), -1, 1 << 62}, Chunks: []Chunk{
			{Offsets: []int64{0, 0, 0}, Sizes: []int64{1, 2, 3}, Object: k, Offset: int64(i) << 33, Length: 12, CRC32C: 0xffffffff, Encoding: map[bool]string{true: "torch\"save"}[i%2 == 0]},
			{Offsets: nil, Sizes: []int64{}, Object: "o", CRC32C: 0},
		}})
	}
	c.Tensors = append(c.Tensors, TensorEntry{Key: "model.scalar", DType: "int64", Shape: []int64{}}, TensorEntry{Key: "model.nil"})
	got, err := encodeJSON(c)
	require.NoError(t, err)
	var want bytes.Buffer
	enc := gojson.NewEncoder(&want)
	enc.SetEscapeHTML(false)
	require.NoError(t, enc.Encode(c))
	require.Equal(t, want.String(), string(got))
}

func TestEncodeSplicesTensorsOnce(t *testing.T) {
	// A writer string that spells the member must not be taken for it.
	c := &Checkpoint{Format: FormatName, Version: VersionString(), Writer: `"tensors":[]`, WorldSize: 1,
		Tensors: []TensorEntry{{Key: "model.w", DType: "float32", Shape: []int64{1}, Chunks: []Chunk{{Offsets: []int64{0}, Sizes: []int64{1}, Object: "rank-00000-000.data", Length: 4}}}},
		Objects: []ObjectEntry{{Key: "rank-00000-000.data", Size: 4}}, Training: TrainingState{Optimizer: OptimizerNone}}
	out, err := Encode(c)
	require.NoError(t, err)
	back, err := Decode(out)
	require.NoError(t, err)
	require.Equal(t, `"tensors":[]`, back.Writer)
	require.Equal(t, c.Tensors, back.Tensors)
}
