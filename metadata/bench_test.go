package metadata_test

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/ckptkit/ckptkit/metadata"
)

// bigCheckpoint returns the metadata of entries chunk entries shaped like
// ckptbench's figure 4: entries/4 float32 tensors of shape [12, 16], each
// saved as 4 row chunks by 4 ranks, with realistic keys and CRCs.
func bigCheckpoint(entries int) *metadata.Checkpoint {
	const world, rows, cols = 4, 12, 16
	tensors := entries / world
	c := &metadata.Checkpoint{
		Writer: "ckptkit/bench", CreatedAt: time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC), WorldSize: world,
		Tensors:  make([]metadata.TensorEntry, 0, tensors),
		Training: metadata.TrainingState{Optimizer: metadata.OptimizerNone},
	}
	offsets := make([]int64, world)
	var x uint32 = 2463534242
	for t := 0; t < tensors; t++ {
		key := fmt.Sprintf("model.blocks.%d.layers.%d.%s.weight", t/1000, t%1000, [...]string{"attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2"}[t%4])
		te := metadata.TensorEntry{Key: key, DType: "float32", Shape: []int64{rows, cols}, Chunks: make([]metadata.Chunk, world)}
		for r := range world {
			x ^= x << 13
			x ^= x >> 17
			x ^= x << 5
			n := int64(rows / world * cols * 4)
			te.Chunks[r] = metadata.Chunk{Offsets: []int64{int64(r * rows / world), 0}, Sizes: []int64{rows / world, cols},
				Object: fmt.Sprintf("rank-%05d-000.data", r), Offset: offsets[r], Length: n, CRC32C: x}
			offsets[r] += n
		}
		c.Tensors = append(c.Tensors, te)
	}
	for r := range world {
		c.Objects = append(c.Objects, metadata.ObjectEntry{Key: fmt.Sprintf("rank-%05d-000.data", r), Size: offsets[r]})
	}
	return c
}

// BenchmarkDecode1M decodes the metadata of one million chunk entries
// (about 100 MB of JSON), the size docs/PERFORMANCE.md's figure 4 tracks.
func BenchmarkDecode1M(b *testing.B) {
	enc, err := metadata.Encode(bigCheckpoint(1 << 20))
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(enc)))
	b.ResetTimer()
	cpu := cpuTime()
	for range b.N {
		if _, err := metadata.Decode(enc); err != nil {
			b.Fatal(err)
		}
	}
	// CPU time (this process, all threads, garbage collection included) is
	// steadier than wall time on a shared machine.
	b.ReportMetric(float64(cpuTime()-cpu)/float64(b.N), "cpu-ns/op")
}

// cpuTime returns the process's user and system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkEncode1M encodes the metadata of one million chunk entries, with
// CPU time reported as in BenchmarkDecode1M.
func BenchmarkEncode1M(b *testing.B) {
	c := bigCheckpoint(1 << 20)
	if _, err := metadata.Encode(c); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	cpu := cpuTime()
	var n int
	for range b.N {
		enc, err := metadata.Encode(c)
		if err != nil {
			b.Fatal(err)
		}
		n = len(enc)
	}
	b.SetBytes(int64(n))
	b.ReportMetric(float64(cpuTime()-cpu)/float64(b.N), "cpu-ns/op")
}
