package metadata_test

import (
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/metadata"
	"github.com/ckptkit/ckptkit/statedict"
)

// edit applies replacements (old, new pairs, each replacing the first
// occurrence) to the encoding of sample(), failing if an old is absent,
// and seals the result again (metadata.Seal), so that the rule under test
// is reached; a document Seal refuses is returned unsealed.
func edit(t *testing.T, pairs ...string) []byte {
	t.Helper()
	enc, err := metadata.Encode(sample())
	require.NoError(t, err)
	s := string(enc)
	for i := 0; i < len(pairs); i += 2 {
		require.Contains(t, s, pairs[i], "the base document lacks %q", pairs[i])
		s = strings.Replace(s, pairs[i], pairs[i+1], 1)
	}
	if sealed, err := metadata.Seal([]byte(s)); err == nil {
		return sealed
	}
	return []byte(s)
}

const (
	v10       = `"version":"1.1"` // the version Encode writes
	v17       = `"version":"1.7"`
	firstW    = `"offsets":[0,0],"sizes":[2,2],"object":"rank-00000-000.data","offset":0,"length":16,"crc32c":7`
	firstWObj = `"object":"rank-00000-000.data","offset":0,"length":16`
	objects   = `"objects":[{"key":"rank-00000-000.data","size":19},{"key":"rank-00001-000.data","size":16}]`
	training  = `"training":{"iteration":3,"optimizer":"none","optimizer_state_entries":0}`
)

// Regression (issues 12 and 16): every document here was accepted, or
// refused with a misleading error, before the decoder enforced
// docs/FORMAT.md. Each must fail with ErrInvalid, and the message must
// name where (a JSON path, a key or an object).
func TestDecodeRefusesHostileMetadata(t *testing.T) {
	for _, tc := range []struct {
		name  string
		pairs []string
		want  string
	}{
		// Duplicate members: JSON libraries keep the last one silently.
		{"duplicate top-level member", []string{`"world_size":2`, `"world_size":2,"world_size":1`}, `$.world_size: duplicate member "world_size"`},
		{"duplicate chunk member", []string{`"length":16,"crc32c":7`, `"length":16,"length":16,"crc32c":7`}, `$.tensors[1].chunks[0].length: duplicate`},
		{"duplicate training member", []string{`"iteration":3`, `"iteration":3,"iteration":4`}, `$.training.iteration: duplicate`},
		{"duplicate spelled with an escape", []string{`"shape":[4,2]`, `"shape":[4,2],"sha\u0070e":[8,1]`}, `$.tensors[1].shape: duplicate member "shape"`},
		{"duplicate inside an unknown member of a newer minor", []string{v10, v17, `"world_size":2`, `"world_size":2,"future":{"a":1,"a":2}`}, `$.future.a: duplicate`},
		{"duplicate unknown member of a newer minor", []string{v10, v17, `"world_size":2`, `"world_size":2,"future":1,"future":2`}, `$.future: duplicate`},
		// Names are case-sensitive: JSON libraries fold case by default.
		{"case-mismatched tensor member", []string{`"shape":[4,2]`, `"shaPe":[4,2]`}, `member "shaPe" differs from "shape" only in case`},
		{"case-mismatched top-level member", []string{`"world_size"`, `"World_Size"`}, `"World_Size" differs from "world_size"`},
		{"case-mismatched member in a newer minor", []string{v10, v17, `"crc32c":7`, `"CRC32C":7`}, `"CRC32C" differs from "crc32c"`},
		// Unknown members in a version this reader fully knows.
		{"unknown top-level member", []string{`"world_size":2`, `"world_size":2,"future":1`}, `unknown member "future" in metadata`},
		{"unknown chunk member", []string{`"crc32c":7`, `"crc32c":7,"zstd":true`}, `$.tensors[1].chunks[0].zstd: unknown member "zstd" in chunk`},
		{"unknown training member", []string{`"iteration":3`, `"iteration":3,"epoch":1`}, `unknown member "epoch" in training`},
		// Required members and null.
		{"missing chunk crc32c", []string{`"length":16,"crc32c":7`, `"length":16`}, `$.tensors[1].chunks[0]: chunk lacks the required member "crc32c"`},
		{"missing world_size", []string{`"world_size":2,`, ``}, `lacks the required member "world_size"`},
		{"missing training", []string{`,` + training, ``}, `lacks the required member "training"`},
		{"missing training.optimizer", []string{`"optimizer":"none",`, ``}, `$.training: training lacks the required member "optimizer"`},
		{"missing object size", []string{`,"size":19`, ``}, `$.objects[0]: object lacks the required member "size"`},
		{"null length", []string{`"length":16,"crc32c":7`, `"length":null,"crc32c":7`}, `$.tensors[1].chunks[0].length: want an integer, found "null`},
		{"null training", []string{training, `"training":null`}, `$.training: want an object`},
		{"string for an integer", []string{`"length":16,"crc32c":7`, `"length":"16","crc32c":7`}, `want an integer`},
		{"number for a string", []string{`"dtype":"float32"`, `"dtype":4`}, `$.tensors[1].dtype: want a string`},
		{"object for an array", []string{`"bytes":[`, `"bytes":{"x":[`, `}],"objects"`, `}]},"objects"`}, `$.bytes: want an array`},
		// Strings.
		{"invalid UTF-8 in a key", []string{`"key":"model.w"`, "\"key\":\"model.\xffw\""}, `not valid UTF-8 (at byte`},
		{"lone surrogate escape in a key", []string{`"key":"model.w"`, `"key":"model.\ud800w"`}, `lone high surrogate \ud800`},
		{"lone low surrogate escape", []string{`"key":"model.w"`, `"key":"model.\udc00w"`}, `lone low surrogate`},
		{"raw control character in a key", []string{`"key":"model.w"`, "\"key\":\"model.\x01w\""}, `control character 0x01`},
		{"invalid escape", []string{`"key":"model.w"`, `"key":"model.\qw"`}, `invalid escape \q`},
		// Versions.
		{"version 0.9", []string{v10, `"version":"0.9"`}, `$.version "0.9" is below 1.0`},
		{"version 0.0", []string{v10, `"version":"0.0"`}, `below 1.0`},
		{"version with a leading zero", []string{v10, `"version":"01.0"`}, `not MAJOR.MINOR`},
		{"version with a sign", []string{v10, `"version":"+1.0"`}, `not MAJOR.MINOR`},
		{"version without minor", []string{v10, `"version":"1"`}, `not MAJOR.MINOR`},
		// Object keys: the backend's key rule, not "missing object".
		{"chunk object escaping the prefix", []string{firstWObj, `"object":"../x","offset":0,"length":16`}, `$.tensors[1].chunks[0] ("model.w").object: key "../x" has a ".." segment`},
		{"listed object escaping the prefix", []string{objects, `"objects":[{"key":"../x","size":1},{"key":"rank-00000-000.data","size":19},{"key":"rank-00001-000.data","size":16}]`}, `$.objects[0].key: key "../x" has a ".." segment`},
		{"absolute object key", []string{firstWObj, `"object":"/etc/passwd","offset":0,"length":16`}, `is absolute`},
		{"object key with NUL", []string{firstWObj, `"object":"a\u0000b","offset":0,"length":16`}, `NUL`},
		{"object key with an empty segment", []string{firstWObj, `"object":"a//b","offset":0,"length":16`}, `empty segment`},
		{"metadata object listed as data", []string{objects, `"objects":[{"key":"ckptkit.metadata.json","size":1},{"key":"rank-00000-000.data","size":19},{"key":"rank-00001-000.data","size":16}]`}, `is the metadata object`},
		// Integers out of range.
		{"negative object size", []string{`"size":16}`, `"size":-16}`}, `$.objects[1].size of "rank-00001-000.data" is negative`},
		{"negative chunk offset", []string{firstWObj, `"object":"rank-00000-000.data","offset":-1,"length":16`}, `$.tensors[1].chunks[0] ("model.w"): negative offset -1`},
		{"negative chunk length", []string{`"offset":18,"length":1`, `"offset":18,"length":-1`}, `$.bytes[0] ("scheduler.last_epoch"): negative offset 18 or length -1`},
		{"negative dimension", []string{`"shape":[4,2]`, `"shape":[4,-2]`}, `negative dimension`},
		{"negative box offset", []string{firstW, strings.Replace(firstW, `"offsets":[0,0]`, `"offsets":[-1,0]`, 1)}, `out of bounds`},
		{"negative iteration", []string{`"iteration":3`, `"iteration":-3`}, `$.training.iteration -3`},
		{"negative optimizer_state_entries", []string{`"optimizer_state_entries":0`, `"optimizer_state_entries":-1`}, `optimizer_state_entries -1`},
		{"world size 0", []string{`"world_size":2`, `"world_size":0`}, `$.world_size is 0, want at least 1`},
		{"shape over 2^63 bytes with an empty chunk", []string{
			`"shape":[4,2],"chunks":[{` + firstW + `},{"offsets":[2,0],"sizes":[2,2],"object":"rank-00001-000.data","offset":0,"length":16,"crc32c":8}]`,
			`"shape":[4611686018427387904],"chunks":[{"offsets":[0],"sizes":[0],"object":"rank-00000-000.data","offset":0,"length":0,"crc32c":0}]`,
		}, `shape [4611686018427387904] of float32 is over 2^63-1 bytes`},
		{"offset above int64", []string{`"offset":18`, `"offset":9223372036854775808`}, `offset`},
		{"crc32c above 32 bits", []string{`"crc32c":7`, `"crc32c":4294967296`}, `crc32c`},
		{"negative crc32c", []string{`"crc32c":7`, `"crc32c":-7`}, `crc32c`},
		{"fractional length", []string{`"length":16,"crc32c":7`, `"length":16.0,"crc32c":7`}, `length`},
		{"exponent length", []string{`"length":16,"crc32c":7`, `"length":1.6e1,"crc32c":7`}, `length`},
		{"unsorted params", []string{`"optimizer_state_entries":0`, `"optimizer_state_entries":0,"params":["w","b"]`}, `$.training.params[1]: params not sorted or duplicated at "b"`},
		{"duplicate params", []string{`"optimizer_state_entries":0`, `"optimizer_state_entries":0,"params":["b","b"]`}, `params not sorted or duplicated`},
		{"empty param name", []string{`"optimizer_state_entries":0`, `"optimizer_state_entries":0,"params":[""]`}, `$.training.params[0] "" is empty`},
		{"integer with a leading zero", []string{`"length":16,"crc32c":7`, `"length":016,"crc32c":7`}, `invalid`},
		{"byte order mark", []string{`{"format"`, "\ufeff{\"format\""}, `starts with a byte order mark`},
		// Order.
		{"tensors out of bytewise order", []string{`"key":"model.w"`, `"key":"model.B"`}, `$.tensors[1].key: tensors not sorted or duplicated at "model.B"`},
		{"trailing data after the seal", []string{"}\n", "}{}\n"}, `$.metadata_crc32c must be the document's last member`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := metadata.Decode(edit(t, tc.pairs...))
			require.ErrorIs(t, err, metadata.ErrInvalid)
			require.Contains(t, err.Error(), tc.want)
		})
	}
}

// The permissive side of the same rules: what FORMAT.md says a reader
// accepts.
func TestDecodeAcceptsWhatFormatAllows(t *testing.T) {
	// null for an array is an empty array.
	c, err := metadata.Decode(edit(t, `"bytes":[{"key":"scheduler.last_epoch","object":"rank-00000-000.data","offset":18,"length":1,"crc32c":1}]`, `"bytes":null`))
	require.NoError(t, err)
	require.Empty(t, c.Bytes)

	// Optional members may be absent; white space anywhere JSON allows it.
	c, err = metadata.Decode(edit(t, `{"format"`, "{ \n\t\"format\"", `"training":{`, `"training" : {"optimizer_prefix":"opt",`))
	require.NoError(t, err)
	require.Equal(t, "opt", c.Training.OptimizerPrefix)

	// Integers above 2^53 are exact.
	const big = 1<<53 + 1
	c, err = metadata.Decode(edit(t, `"size":16}`, `"size":`+strconv.Itoa(big+16)+`}`, `"offset":0,"length":16,"crc32c":8`, `"offset":`+strconv.Itoa(big)+`,"length":16,"crc32c":8`))
	require.NoError(t, err)
	require.Equal(t, int64(big), c.Tensor("model.w").Chunks[1].Offset)
	require.Equal(t, int64(big+16), c.Objects[1].Size)

	// A newer minor's unknown members are ignored, nested ones too.
	c, err = metadata.Decode(edit(t, v10, v17, `"crc32c":7`, `"crc32c":7,"zstd":{"level":[1,true,null,"x"]}`))
	require.NoError(t, err)
	require.Equal(t, uint32(7), c.Tensor("model.w").Chunks[0].CRC32C)

	// A tensor with a zero-size dimension may be huge in its other
	// dimensions and have no chunks.
	_, err = metadata.Decode(edit(t, `"shape":[],"chunks":[{"offsets":[],"sizes":[],"object":"rank-00000-000.data","offset":16,"length":2,"crc32c":9}]`,
		`"shape":[0,4611686018427387904,4611686018427387904],"chunks":[]`))
	require.NoError(t, err)
}

// Encode refuses what Decode would refuse: it never writes a document no
// reader accepts.
func TestEncodeRefusesWorldSizeZero(t *testing.T) {
	c := sample()
	c.WorldSize = 0
	_, err := metadata.Encode(c)
	require.ErrorIs(t, err, metadata.ErrInvalid)
	require.Contains(t, err.Error(), "$.world_size is 0")
}

// Encode never writes null for an array, whatever nil slices it is given.
func TestEncodeWritesEmptyArrays(t *testing.T) {
	c := &metadata.Checkpoint{WorldSize: 1, Training: metadata.TrainingState{Optimizer: metadata.OptimizerNone},
		Tensors: []metadata.TensorEntry{{Key: "empty", DType: "int8", Shape: []int64{0}}, {Key: "scalar", DType: "int8", Chunks: []metadata.Chunk{{Object: "o", Length: 1}}}},
		Objects: []metadata.ObjectEntry{{Key: "o", Size: 1}}}
	enc, err := metadata.Encode(c)
	require.NoError(t, err)
	require.NotContains(t, string(enc), "null")
	require.Contains(t, string(enc), `"bytes":[]`)
	require.Contains(t, string(enc), `"shape":[],"chunks":[{"offsets":[],"sizes":[]`)
	_, err = metadata.Decode(enc)
	require.NoError(t, err)
}

// formatDoc returns docs/FORMAT.md.
func formatDoc(t *testing.T) string {
	t.Helper()
	doc, err := os.ReadFile("../docs/FORMAT.md")
	require.NoError(t, err)
	return string(doc)
}

// Every ```json block of docs/FORMAT.md is a complete metadata document
// that decodes, so the examples cannot drift from the decoder.
func TestFormatDocExamplesDecode(t *testing.T) {
	blocks := regexp.MustCompile("(?s)```json\n(.*?)```").FindAllStringSubmatch(formatDoc(t), -1)
	require.NotEmpty(t, blocks, "FORMAT.md has no json example")
	for i, b := range blocks {
		c, err := metadata.Decode([]byte(b[1]))
		require.NoError(t, err, "example %d of docs/FORMAT.md:\n%s", i+1, b[1])
		require.NotEmpty(t, c.Tensors, "example %d", i+1)
	}
}

// The dtype table of docs/FORMAT.md is statedict's table.
func TestFormatDocDTypeTable(t *testing.T) {
	rows := regexp.MustCompile("(?m)^\\| `([a-z0-9]+)` \\| ([0-9]+) \\|").FindAllStringSubmatch(formatDoc(t), -1)
	got := map[string]int{}
	for _, r := range rows {
		got[r[1]], _ = strconv.Atoi(r[2])
	}
	want := map[string]int{}
	for _, d := range statedict.DTypes() {
		want[string(d)] = d.Size()
		require.Equal(t, int64(d.Size()), metadata.ElementSize(string(d)))
	}
	require.Equal(t, want, got)
}
