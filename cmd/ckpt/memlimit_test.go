package main

import (
	"math"
	"os"
	"runtime"
	"runtime/debug"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// After each garbage collection the soft memory limit is the live heap +
// heapHeadroom (it was Go's default: no limit, a heap of twice the live
// one); a limit set by someone else (convert --max-memory) ends the hook.
func TestBoundHeapGrowthFollowsTheLiveHeap(t *testing.T) {
	if os.Getenv("GOMEMLIMIT") != "" {
		t.Skip("GOMEMLIMIT is set: the bound is off by design")
	}
	defer debug.SetMemoryLimit(math.MaxInt64)
	boundHeapGrowth()
	live := make([]byte, 64<<20)
	limitNear := func(want int64) bool {
		deadline := time.Now().Add(5 * time.Second)
		for time.Now().Before(deadline) {
			runtime.GC() // the finalizer runs after it, on its own goroutine
			time.Sleep(10 * time.Millisecond)
			if got := debug.SetMemoryLimit(-1); got >= want && got < want+32<<20 {
				return true
			}
		}
		return false
	}
	require.True(t, limitNear(64<<20+heapHeadroom), "limit %d MiB with 64 MiB live", debug.SetMemoryLimit(-1)>>20)
	runtime.KeepAlive(live)
	live = nil
	require.True(t, limitNear(heapHeadroom), "limit %d MiB once released", debug.SetMemoryLimit(-1)>>20)

	debug.SetMemoryLimit(1 << 40) // someone else's limit
	runtime.GC()
	time.Sleep(50 * time.Millisecond)
	runtime.GC()
	time.Sleep(50 * time.Millisecond)
	require.Equal(t, int64(1<<40), debug.SetMemoryLimit(-1), "left alone")
}
