package main

import (
	"math"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
)

// heapHeadroom is how far the Go heap of a ckpt process may grow above the
// heap that was live at the last garbage collection (see boundHeapGrowth).
const heapHeadroom = 96 << 20

// boundHeapGrowth keeps the process's memory within the live heap plus
// heapHeadroom, instead of Go's default of twice the live heap: after each
// garbage collection it sets the runtime's soft memory limit to what the
// collection found live plus the headroom. A checkpoint's metadata (its
// bytes and their decoded form, about the same size) is what a command
// keeps live, so peak memory stays near 2x the metadata object + 256 MiB
// whatever the document holds (docs/RELIABILITY.md), where the default
// pacing allowed 4x. The headroom leaves room below that bound for the
// runtime's own memory. It does nothing when GOMEMLIMIT is set, and stops as
// soon as something else sets a limit (ckpt convert --max-memory).
func boundHeapGrowth() {
	if os.Getenv("GOMEMLIMIT") != "" {
		return
	}
	last := debug.SetMemoryLimit(-1)
	if last != math.MaxInt64 {
		return
	}
	sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	var hook func(*gcMark)
	hook = func(*gcMark) {
		if debug.SetMemoryLimit(-1) != last {
			return // someone else's limit: leave it
		}
		metrics.Read(sample)
		if sample[0].Value.Kind() == metrics.KindUint64 {
			last = int64(sample[0].Value.Uint64()) + heapHeadroom
			debug.SetMemoryLimit(last)
		}
		runtime.SetFinalizer(&gcMark{}, hook)
	}
	runtime.SetFinalizer(&gcMark{}, hook)
}

// gcMark is garbage whose finalizer runs after the collection that found
// it unreachable: large enough and with a pointer, so that it is not
// batched with other tiny objects.
type gcMark struct {
	_ *int
	_ [4]int64
}
