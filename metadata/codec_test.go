package metadata_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/metadata"
)

func sample() *metadata.Checkpoint {
	return &metadata.Checkpoint{
		WorldSize: 2,
		Tensors: []metadata.TensorEntry{
			{Key: "model.w", DType: "float32", Shape: []int64{4, 2}, Chunks: []metadata.Chunk{
				{Offsets: []int64{0, 0}, Sizes: []int64{2, 2}, Object: "rank-00000-000.data", Offset: 0, Length: 16, CRC32C: 7},
				{Offsets: []int64{2, 0}, Sizes: []int64{2, 2}, Object: "rank-00001-000.data", Offset: 0, Length: 16, CRC32C: 8},
			}},
			{Key: "model.b", DType: "bfloat16", Shape: []int64{}, Chunks: []metadata.Chunk{
				{Offsets: []int64{}, Sizes: []int64{}, Object: "rank-00000-000.data", Offset: 16, Length: 2, CRC32C: 9},
			}},
		},
		Bytes:    []metadata.BytesEntry{{Key: "scheduler.last_epoch", Object: "rank-00000-000.data", Offset: 18, Length: 1, CRC32C: 1}},
		Objects:  []metadata.ObjectEntry{{Key: "rank-00001-000.data", Size: 16}, {Key: "rank-00000-000.data", Size: 19}},
		Training: metadata.TrainingState{Iteration: 3, Optimizer: metadata.OptimizerNone},
	}
}

func TestEncodeDecodeRoundTrip(t *testing.T) {
	enc, err := metadata.Encode(sample())
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(string(enc), `{"format":"ckptkit","version":"1.1"`), "format and version come first: %s", enc[:40])
	c, err := metadata.Decode(enc)
	require.NoError(t, err)
	require.Equal(t, "model.b", c.Tensors[0].Key, "entries are sorted")
	require.Equal(t, "rank-00000-000.data", c.Objects[0].Key)
	require.Equal(t, uint32(8), c.Tensor("model.w").Chunks[1].CRC32C)
	require.Nil(t, c.Tensor("model.missing"))
	require.Equal(t, int64(1), c.BytesValue("scheduler.last_epoch").Length)
	again, err := metadata.Encode(c)
	require.NoError(t, err)
	require.Equal(t, string(enc), string(again), "encoding is canonical")
}

func mutate(t *testing.T, f func(s string) string) []byte {
	t.Helper()
	enc, err := metadata.Encode(sample())
	require.NoError(t, err)
	sealed, err := metadata.Seal([]byte(f(string(enc))))
	require.NoError(t, err)
	return sealed
}

func TestDecodeVersions(t *testing.T) {
	_, err := metadata.Decode(mutate(t, func(s string) string { return strings.Replace(s, `"version":"1.1"`, `"version":"2.0"`, 1) }))
	require.ErrorIs(t, err, metadata.ErrNewerFormat)
	require.Contains(t, err.Error(), "upgrade ckptkit")

	// A newer minor may add fields: they are ignored.
	c, err := metadata.Decode(mutate(t, func(s string) string {
		return strings.Replace(strings.Replace(s, `"version":"1.1"`, `"version":"1.7"`, 1), `"world_size":2`, `"world_size":2,"future":{"x":1}`, 1)
	}))
	require.NoError(t, err)
	require.Equal(t, 2, c.WorldSize)

	// In a version this reader fully knows, an unknown field is an error.
	_, err = metadata.Decode(mutate(t, func(s string) string { return strings.Replace(s, `"world_size":2`, `"world_size":2,"future":1`, 1) }))
	require.ErrorIs(t, err, metadata.ErrInvalid)

	// Format and version are found wherever they stand.
	_, err = metadata.Decode([]byte(`{"world_size":1,"tensors":[],"bytes":[],"objects":[],"training":{"iteration":0,"optimizer":"none","optimizer_state_entries":0},"writer":"x","created_at":"2026-01-01T00:00:00Z","version":"1.0","format":"ckptkit"}`))
	require.NoError(t, err)
}

func TestDecodeRefusesBadInput(t *testing.T) {
	for name, in := range map[string]string{
		"not json":      "nope",
		"not an object": `[1,2]`,
		"other format":  `{"format":"safetensors","version":"1.0"}`,
		"bad version":   `{"format":"ckptkit","version":"one"}`,
		"trailing data": `{"format":"ckptkit","version":"1.0","tensors":[],"bytes":[],"objects":[],"training":{"optimizer":"none"}} {}`,
	} {
		_, err := metadata.Decode([]byte(in))
		require.ErrorIs(t, err, metadata.ErrInvalid, name)
	}
}

func TestValidate(t *testing.T) {
	for name, f := range map[string]func(c *metadata.Checkpoint){
		"unknown dtype":        func(c *metadata.Checkpoint) { c.Tensors[0].DType = "float8" },
		"chunk out of bounds":  func(c *metadata.Checkpoint) { c.Tensors[0].Chunks[1].Offsets[0] = 3 },
		"chunk rank mismatch":  func(c *metadata.Checkpoint) { c.Tensors[0].Chunks[0].Sizes = []int64{2} },
		"raw length mismatch":  func(c *metadata.Checkpoint) { c.Tensors[0].Chunks[0].Length = 15 },
		"unlisted object":      func(c *metadata.Checkpoint) { c.Tensors[0].Chunks[0].Object = "gone.data" },
		"range outside object": func(c *metadata.Checkpoint) { c.Bytes[0].Offset = 19 },
		"duplicate key":        func(c *metadata.Checkpoint) { c.Bytes[0].Key = "model.w" },
		"bad optimizer record": func(c *metadata.Checkpoint) { c.Training.Optimizer = "maybe" },
		"negative dimension":   func(c *metadata.Checkpoint) { c.Tensors[0].Shape[1] = -2 },
	} {
		c := sample()
		f(c)
		_, err := metadata.Encode(c)
		require.ErrorIs(t, err, metadata.ErrInvalid, name)
	}
}

func TestDecodeIsBounded(t *testing.T) {
	_, err := metadata.Decode(make([]byte, metadata.MaxSize+1))
	require.ErrorIs(t, err, metadata.ErrInvalid)
	require.Contains(t, err.Error(), "limit")
}

// FuzzDecode: malformed metadata gives an error, never a panic, and what
// decodes re-encodes into a document that decodes. Each input is decoded
// as it is and, sealed afresh (metadata.Seal), once more: a mutated sealed
// document almost never carries its own CRC32C, so without the second pass
// the strict decoder and the validation behind the seal check would see
// only the unsealed 1.0 inputs.
func FuzzDecode(f *testing.F) {
	enc, err := metadata.Encode(sample())
	require.NoError(f, err)
	f.Add(enc)
	f.Add([]byte(`{"format":"ckptkit","version":"1.0"}`))
	// Seeds for the strict pass: unknown nested members of a newer minor,
	// escapes in names and strings.
	f.Add([]byte(strings.Replace(strings.Replace(string(enc), `"version":"1.1"`, `"version":"1.7"`, 1), `"world_size":2`, `"world_size":2,"x\u0079":[{"a":[1,-2e3,true,null]},"\ud83d\ude00"]`, 1)))
	f.Fuzz(func(t *testing.T, data []byte) {
		inputs := [][]byte{data}
		if sealed, err := metadata.Seal(data); err == nil {
			inputs = append(inputs, sealed)
		}
		for _, in := range inputs {
			c, err := metadata.Decode(in)
			if err != nil {
				continue
			}
			again, err := metadata.Encode(c)
			if err != nil {
				t.Fatalf("decoded metadata does not re-encode: %v", err)
			}
			if _, err := metadata.Decode(again); err != nil {
				t.Fatalf("re-encoded metadata does not decode: %v\n%s", err, again)
			}
		}
	})
}

// Regression (review): offset+length overflowed int64 and passed the
// bounds checks; a native chunk could claim a foreign encoding and skip
// its CRC check.
func TestValidateRefusesOverflowAndForeignEncodings(t *testing.T) {
	for name, f := range map[string]func(c *metadata.Checkpoint){
		"bytes offset overflow": func(c *metadata.Checkpoint) { c.Bytes[0].Offset = 1<<63 - 4; c.Bytes[0].Length = 10 },
		"chunk offset overflow": func(c *metadata.Checkpoint) {
			c.Tensors[0].Chunks[1].Offsets[0] = 1 << 62
			c.Tensors[0].Chunks[1].Sizes[0] = 1 << 62
		},
		"native chunk with a foreign encoding": func(c *metadata.Checkpoint) { c.Tensors[0].Chunks[0].Encoding = "torch-save" },
		"native bytes with a foreign encoding": func(c *metadata.Checkpoint) { c.Bytes[0].Encoding = "torch-save-bytes" },
	} {
		c := sample()
		f(c)
		_, err := metadata.Encode(c)
		require.ErrorIs(t, err, metadata.ErrInvalid, name)
	}
}

// The slot census round-trips (SetCensus, Encode, Decode, Census) and a
// census that breaks its rules is refused, naming the JSON path.
func TestSlotCensus(t *testing.T) {
	c := sample()
	c.Training.Optimizer = metadata.OptimizerSaved
	c.Training.Params = []string{"b", "w", "x"}
	c.Training.SetCensus(map[string][]string{"w": {"step", "row_var", "col_var"}, "b": {"variance", "step"}})
	require.Equal(t, [][]string{{"step", "variance"}, {"col_var", "row_var", "step"}}, c.Training.SlotSets)
	require.Equal(t, []int{0, 1, -1}, c.Training.ParamSlots)
	enc, err := metadata.Encode(c)
	require.NoError(t, err)
	require.Contains(t, string(enc), `"slot_sets":[["step","variance"],["col_var","row_var","step"]],"param_slots":[0,1,-1]`)
	got, err := metadata.Decode(enc)
	require.NoError(t, err)
	require.Equal(t, map[string][]string{"b": {"step", "variance"}, "w": {"col_var", "row_var", "step"}, "x": nil}, got.Training.Census())

	for _, bad := range []struct {
		edit func(*metadata.TrainingState)
		path string
	}{
		{func(ts *metadata.TrainingState) { ts.ParamSlots = ts.ParamSlots[:2] }, "$.training.param_slots has 2 entries for 3 params"},
		{func(ts *metadata.TrainingState) { ts.ParamSlots[2] = 2 }, "$.training.param_slots[2] is 2"},
		{func(ts *metadata.TrainingState) { ts.SlotSets[1] = []string{"step", "col_var"} }, "$.training.slot_sets[1][1]"},
		{func(ts *metadata.TrainingState) { ts.SlotSets = append(ts.SlotSets, []string{}) }, "$.training.slot_sets[2] is empty"},
	} {
		c := sample()
		c.Training.Params = []string{"b", "w", "x"}
		c.Training.SetCensus(map[string][]string{"w": {"step", "row_var", "col_var"}, "b": {"variance", "step"}})
		bad.edit(&c.Training)
		_, err := metadata.Encode(c)
		require.ErrorIs(t, err, metadata.ErrInvalid)
		require.Contains(t, err.Error(), bad.path)
	}
}
