package fs

import (
	"bytes"
	"context"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// dropCache writes data to a file in dir, makes it durable and drops it
// from the page cache, so that no byte of it is cached.
func dropCache(t *testing.T, dir string, data []byte) {
	t.Helper()
	f, err := os.Create(filepath.Join(dir, "obj"))
	require.NoError(t, err)
	defer f.Close()
	_, err = f.Write(data)
	require.NoError(t, err)
	require.NoError(t, f.Sync())
	require.NoError(t, unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED))
}

// The non-blocking path copies exactly what the page cache holds and stops
// at the first byte it does not; reads through the driver return the same
// bytes whichever path serves them: nothing cached, a cached prefix, all
// cached, ranges ending at the end of the file.
func TestCachedReadStopsWhereTheCacheEnds(t *testing.T) {
	dir := t.TempDir()
	// Larger than any device's read-ahead, so a read of its first 2 MiB
	// leaves most of it uncached.
	data := make([]byte, 64<<20)
	rng := rand.New(rand.NewPCG(5, 6))
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	dropCache(t, dir, data)
	d, err := New(dir)
	require.NoError(t, err)
	ctx := context.Background()

	f, err := os.Open(filepath.Join(dir, "obj"))
	require.NoError(t, err)
	defer f.Close()
	// No read-ahead through this handle: a read (blocking, or the
	// non-blocking one, which may start I/O for what it misses) brings in
	// just the pages it asks for and marks none for asynchronous
	// read-ahead. Without this, each non-blocking pass over a read-ahead
	// marker started more read-ahead, which a fast disk finished before
	// the next pass, so the "cached" prefix raced to the end of the file
	// (3 runs in 6 failed "67108864 is not less than 67108864").
	require.NoError(t, unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_RANDOM))
	var c cachedReader
	c.init(f)
	buf := make([]byte, len(data))
	switch n := c.read(&d.noCached, buf, 0); {
	case d.noCached.Load():
		t.Skip("this file system refuses RWF_NOWAIT reads: the blocking path serves everything")
	case n == len(data):
		t.Skip("this file system keeps the file in memory (tmpfs?): there is no uncached part to test")
	default:
		assert.Zero(t, n, "nothing is cached yet, so the non-blocking read copies nothing")
	}

	// A blocking read of the first 2 MiB caches them (and whatever the
	// kernel reads ahead); the non-blocking read copies at least those,
	// correctly, and stops before the end.
	_, err = f.ReadAt(buf[:2<<20], 0)
	require.NoError(t, err)
	clear(buf)
	n := c.read(&d.noCached, buf, 0)
	assert.GreaterOrEqual(t, n, 2<<20)
	assert.Less(t, n, len(data), "the uncached rest is left to the blocking read")
	assert.True(t, bytes.Equal(data[:n], buf[:n]))

	// Through the driver: a range starting in the cached part and ending
	// in the uncached one, then the whole (now cached) object, then a
	// range running into the end of the file.
	for _, r := range [][2]int64{{1 << 20, 8 << 20}, {0, -1}, {int64(len(data)) - 3000, 5000}} {
		rc, err := d.NewRangeReader(ctx, "obj", r[0], r[1])
		require.NoError(t, err)
		got, err := io.ReadAll(rc)
		require.NoError(t, err)
		require.NoError(t, rc.Close())
		end := int64(len(data))
		if r[1] >= 0 {
			end = min(end, r[0]+r[1])
		}
		assert.True(t, bytes.Equal(data[r[0]:end], got), "range %v", r)
	}
	// Everything is cached now, but how much of it a non-blocking read
	// serves is the kernel's choice: with other tests running it stopped
	// after 484 KiB of a fully read file (a read-ahead marker or a locked
	// folio makes RWF_NOWAIT give up), and the blocking read takes over,
	// as it must. So only the bytes it copies are checked here.
	require.NoError(t, unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_NORMAL))
	clear(buf)
	n = c.read(&d.noCached, buf, 0)
	assert.True(t, bytes.Equal(data[:n], buf[:n]))
	assert.Equal(t, 0, c.read(&d.noCached, buf[:10], int64(len(data))), "nothing past the end")
	assert.False(t, d.noCached.Load())
}
