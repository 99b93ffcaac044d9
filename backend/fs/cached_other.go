//go:build !linux

package fs

import (
	"os"
	"sync/atomic"
)

// cachedReader has no fast path on this platform: every read blocks.
type cachedReader struct{}

func (c *cachedReader) init(*os.File) {}

func (c *cachedReader) read(*atomic.Bool, []byte, int64) int { return 0 }
