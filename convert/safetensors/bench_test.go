package safetensors_test

import (
	"context"
	"fmt"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/catalog"
	"github.com/ckptkit/ckptkit/convert/safetensors"
	"github.com/ckptkit/ckptkit/internal/testkit/ckpttest"
	"github.com/ckptkit/ckptkit/saver"
	"github.com/ckptkit/ckptkit/statedict"
)

// heapSampler records the peak of live-and-unswept heap objects.
type heapSampler struct {
	stop chan struct{}
	done sync.WaitGroup
	peak uint64
}

func sampleHeap() *heapSampler {
	h := &heapSampler{stop: make(chan struct{})}
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	h.done.Add(1)
	go func() {
		defer h.done.Done()
		tick := time.NewTicker(200 * time.Microsecond)
		defer tick.Stop()
		for {
			metrics.Read(s)
			h.peak = max(h.peak, s[0].Value.Uint64())
			select {
			case <-h.stop:
				return
			case <-tick.C:
			}
		}
	}()
	return h
}

func (h *heapSampler) Stop() uint64 {
	close(h.stop)
	h.done.Wait()
	return h.peak
}

// BenchmarkConvertMemory converts a 64 MiB checkpoint (8 float32 tensors
// of 8 MiB, each saved as 4 row chunks of 2 MiB) on the fs backend with
// MaxMemory 16 MiB and reports the peak heap, which must stay under the
// cap. As the CLI does, the benchmark sets the Go soft memory limit to the
// cap.
func BenchmarkConvertMemory(b *testing.B) {
	const (
		capBytes = 16 << 20
		tensors  = 8
		rows     = 2048
		cols     = 1024
	)
	run := ckpttest.OpenURL(b, "file://"+b.TempDir())
	func() {
		s := &ckpttest.State{Tensors: map[string]*statedict.Tensor{}, Bytes: map[string][]byte{}}
		for i := range tensors {
			t := statedict.NewTensor(statedict.Float32, rows, cols)
			for j := range t.Data {
				t.Data[j] = byte(j*31 + i)
			}
			s.Tensors[fmt.Sprintf("model.layers.%d.weight", i)] = t
		}
		st, err := run.Sub(catalog.StepName(1))
		require.NoError(b, err)
		_, err = saver.SaveLocal(context.Background(), st, s.Shard(4), saver.Options{Iteration: 1})
		require.NoError(b, err)
	}()
	src := openStep(b, run, 1)
	out := sub(b, run, "hf")
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(capBytes))
	runtime.GC()

	var peak uint64
	b.SetBytes(tensors * rows * cols * 4)
	for b.Loop() {
		h := sampleHeap()
		_, err := safetensors.Convert(context.Background(), src, out, safetensors.Options{MaxMemory: capBytes, ShardSize: 32 << 20})
		peak = max(peak, h.Stop())
		require.NoError(b, err)
	}
	b.ReportMetric(float64(peak), "peak-heap-bytes")
	b.ReportMetric(float64(capBytes), "cap-bytes")
	b.ReportMetric(float64(tensors*rows*cols*4)/float64(capBytes), "ckpt/cap")
	if peak >= capBytes {
		b.Fatalf("peak heap %d bytes exceeds the %d-byte cap", peak, capBytes)
	}
}
