package metadata_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/metadata"
)

// The decoder decodes in one pass of its own; every document it accepts
// must decode exactly as the standard library decodes it (the library is
// lenient where FORMAT.md is strict, never different where both accept).
func TestDecodeAgreesWithEncodingJSON(t *testing.T) {
	base := sample()
	base.Writer = "ckptkit/test \u00e9\u4e16 \"quoted\" back\\slash tab\t nl\n \U0001F600"
	base.CreatedAt = time.Date(2026, 12, 1, 8, 0, 0, 123456789, time.FixedZone("", 3600))
	base.Tensors[0].Key = "model.w\u00e9"
	base.Tensors[0].Chunks[0].Encoding = ""
	base.Training = metadata.TrainingState{Iteration: 1 << 40, Optimizer: metadata.OptimizerSaved, OptimizerPrefix: "opt",
		OptimizerSlots: []string{"step", "exp_avg"}, OptimizerStateEntries: 2, SchedulerPrefix: "sched", ModelPrefix: "model", Params: []string{"b", "w\u00e9"}}
	base.Tensors[1].Chunks[0].CRC32C = 1<<32 - 1
	enc, err := metadata.Encode(base)
	require.NoError(t, err)
	unsealed := strings.Replace(string(enc), `"version":"1.1"`, `"version":"1.0"`, 1)
	unsealed = unsealed[:strings.LastIndex(unsealed, `,"metadata_crc32c"`)] + "}\n"
	var pretty bytes.Buffer
	require.NoError(t, json.Indent(&pretty, []byte(unsealed), "", "  \t"))
	docs := map[string]string{
		"as encoded":    string(enc),
		"pretty, 1.0":   pretty.String(),
		"escaped names": strings.Replace(strings.Replace(unsealed, `"offsets"`, `"\u006fffsets"`, -1), `"key":"model.b"`, `"key":"model.\u0062"`, 1),
		"escapes":       strings.Replace(unsealed, `"dtype":"float32"`, `"dtype":"\u0066loat\u00332"`, 1),
		"null arrays":   strings.Replace(strings.Replace(unsealed, `"bytes":[{`, `"bytes":[{`, 1), `"optimizer_slots":["step","exp_avg"]`, `"optimizer_slots":null`, 1),
		"newer minor with unknown members": strings.Replace(strings.Replace(unsealed, `"version":"1.0"`, `"version":"1.9"`, 1),
			`"world_size":2`, `"world_size":2,"future":{"a":[1,-2.5e3,true,false,null,{"b":"\ud83d\ude00"}]},"later":"x"`, 1),
		"members out of order": strings.Replace(unsealed, `"format":"ckptkit","version":"1.0",`, `"version":"1.0","format":"ckptkit",`, 1),
	}
	sealed, err := metadata.Seal([]byte(docs["newer minor with unknown members"]))
	require.NoError(t, err)
	docs["newer minor with unknown members"] = string(sealed)
	for name, doc := range docs {
		t.Run(name, func(t *testing.T) {
			got, err := metadata.Decode([]byte(doc))
			require.NoError(t, err)
			want := new(metadata.Checkpoint)
			require.NoError(t, json.Unmarshal([]byte(doc), want))
			require.Equal(t, want, got)
		})
	}
}

// hugeDoc encodes n chunk entries as one tensor of n chunks (tensors 1)
// or as n tensors of one chunk.
func hugeDoc(t testing.TB, n int, oneTensor bool) []byte {
	c := &metadata.Checkpoint{Writer: "ckptkit/test", WorldSize: 1, Training: metadata.TrainingState{Optimizer: metadata.OptimizerNone}}
	const obj = "rank-00000-000.data"
	if oneTensor {
		te := metadata.TensorEntry{Key: "model.w", DType: "float32", Shape: []int64{int64(n)}, Chunks: make([]metadata.Chunk, n)}
		for i := range n {
			te.Chunks[i] = metadata.Chunk{Offsets: []int64{int64(i)}, Sizes: []int64{1}, Object: obj, Offset: 4 * int64(i), Length: 4, CRC32C: uint32(i * 2654435761)}
		}
		c.Tensors = []metadata.TensorEntry{te}
	} else {
		for i := range n {
			c.Tensors = append(c.Tensors, metadata.TensorEntry{Key: fmt.Sprintf("model.layers.%09d.weight", i), DType: "float32", Shape: []int64{4},
				Chunks: []metadata.Chunk{{Offsets: []int64{0}, Sizes: []int64{4}, Object: obj, Offset: 16 * int64(i), Length: 16, CRC32C: uint32(i * 2654435761)}}})
		}
	}
	c.Objects = []metadata.ObjectEntry{{Key: obj, Size: 16 * int64(n)}}
	enc, err := metadata.Encode(c)
	require.NoError(t, err)
	return enc
}

// Regression (issue 16, memory far above input): decoding allocated about
// 3x the document in 4 allocations per chunk entry. Now the decoded value
// is at most 1.3x the document (Go's slice and string headers: a tensor of
// one chunk decodes to about 1.26x its compact JSON), everything allocated
// at most 1.5x (long arrays are allocated at their counted length), in a
// few allocations per thousand entries.
func TestDecodeMemoryIsProportionalToTheDocument(t *testing.T) {
	const n = 200_000
	for _, oneTensor := range []bool{true, false} {
		t.Run(fmt.Sprintf("one tensor %v", oneTensor), func(t *testing.T) {
			doc := hugeDoc(t, n, oneTensor)
			var before, after, released runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			c, err := metadata.Decode(doc)
			require.NoError(t, err)
			runtime.GC()
			runtime.ReadMemStats(&after)
			runtime.KeepAlive(c)
			c = nil
			runtime.GC()
			runtime.ReadMemStats(&released)
			allocated := after.TotalAlloc - before.TotalAlloc
			kept := int64(after.HeapAlloc) - int64(released.HeapAlloc)
			allocs := after.Mallocs - before.Mallocs
			t.Logf("%d-byte document: %d bytes allocated in %d allocations, %d kept", len(doc), allocated, allocs, kept)
			require.LessOrEqual(t, float64(allocated), 1.5*float64(len(doc)), "bytes allocated")
			require.LessOrEqual(t, float64(kept), 1.3*float64(len(doc)), "bytes kept by the decoded value")
			require.LessOrEqual(t, allocs, uint64(n/100), "allocations")
		})
	}
}

// A long string costs one copy of its bytes, escaped or not.
func TestDecodeOfALongStringCostsOneCopy(t *testing.T) {
	for _, w := range []string{strings.Repeat("w", 8<<20), strings.Repeat("w\u00e9\\", 4<<20)} {
		c := sample()
		c.Writer = w
		doc, err := metadata.Encode(c)
		require.NoError(t, err)
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		got, err := metadata.Decode(doc)
		require.NoError(t, err)
		runtime.ReadMemStats(&after)
		require.Equal(t, w, got.Writer)
		allocated := after.TotalAlloc - before.TotalAlloc
		require.LessOrEqual(t, allocated, uint64(len(doc))+1<<20, "one copy of a %d-byte string (%d bytes encoded)", len(w), len(doc))
	}
}
