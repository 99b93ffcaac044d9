package instrument_test

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/backend/instrument"
	_ "github.com/ckptkit/ckptkit/backend/mem"
)

// TestListedEntries: Listed counts the entries both listings delivered,
// and ListDelimited is counted as its own operation under its prefix.
func TestListedEntries(t *testing.T) {
	ctx := context.Background()
	base, err := backend.Open(ctx, "mem:///listed")
	require.NoError(t, err)
	defer base.Close()
	c := instrument.Wrap(base.Driver())
	s := base.WithDriver(c)
	for _, k := range []string{"top", "run/step-1/a", "run/step-1/b", "run/step-2/a"} {
		require.NoError(t, s.PutBytes(ctx, k, []byte(k), backend.PutOptions{}))
	}
	var level []string
	require.NoError(t, s.ListDelimited(ctx, "run/", func(o backend.ObjectInfo) error { level = append(level, o.Key); return nil }))
	assert.ElementsMatch(t, []string{"run/step-1/", "run/step-2/"}, level)
	assert.Equal(t, int64(2), c.Listed())
	assert.Equal(t, int64(1), c.CountKey(instrument.OpListDelimited, "listed/run/"))
	assert.Zero(t, c.Count(instrument.OpList))
	require.NoError(t, s.List(ctx, "run/", func(backend.ObjectInfo) error { return nil }))
	assert.Equal(t, int64(2+3), c.Listed())
	c.Reset()
	assert.Zero(t, c.Listed())
}

func TestCounts(t *testing.T) {
	ctx := context.Background()
	base, err := backend.Open(ctx, "mem:///ckpt")
	require.NoError(t, err)
	defer base.Close()
	c := instrument.Wrap(base.Driver())
	s := base.WithDriver(c)

	require.NoError(t, s.PutBytes(ctx, "a", []byte("hello"), backend.PutOptions{}))
	require.NoError(t, s.PutBytes(ctx, "d/a", []byte("hi"), backend.PutOptions{}))
	got, err := s.ReadAll(ctx, "a", 0)
	require.NoError(t, err)
	assert.Equal(t, "hello", string(got))
	dst := make([]byte, 2)
	require.NoError(t, s.ReadRange(ctx, "a", 1, dst))
	_, err = s.Stat(ctx, "missing")
	assert.ErrorIs(t, err, backend.ErrNotFound, "errors are classified by the wrapped driver")
	require.NoError(t, s.List(ctx, "d/", func(backend.ObjectInfo) error { return nil }))
	require.NoError(t, s.Delete(ctx, "a"))

	assert.Equal(t, int64(2), c.Count(instrument.OpPut))
	assert.Equal(t, int64(2), c.Count(instrument.OpRead))
	assert.Equal(t, int64(1), c.Count(instrument.OpStat))
	assert.Equal(t, int64(1), c.Count(instrument.OpList))
	assert.Equal(t, int64(1), c.Count(instrument.OpDelete))
	assert.Equal(t, int64(7), c.Total())

	assert.Equal(t, int64(2), c.CountKey(instrument.OpRead, "ckpt/a"), "keys are driver-level")
	assert.Zero(t, c.CountKey(instrument.OpRead, "a"))
	assert.Equal(t, int64(1), c.CountKey(instrument.OpList, "ckpt/d/"))
	assert.Equal(t, int64(2), c.CountKeySuffix(instrument.OpPut, "a"))
	assert.Equal(t, int64(1), c.CountKeySuffix(instrument.OpPut, "/d/a"))
	assert.Equal(t, int64(1), c.CountKeySuffix(instrument.OpStat, "missing"))

	assert.Equal(t, int64(7), c.BytesWritten())
	assert.Equal(t, int64(5+2), c.BytesRead())
	assert.Equal(t, base.Capabilities(), s.Capabilities())
	assert.Same(t, base.Driver(), c.Unwrap())

	c.Reset()
	assert.Zero(t, c.Total())
	assert.Zero(t, c.CountKey(instrument.OpRead, "ckpt/a"))
	assert.Zero(t, c.BytesRead())
	assert.Zero(t, c.BytesWritten())
}

func TestFailedPutCountsConsumedBytes(t *testing.T) {
	ctx := context.Background()
	base, err := backend.Open(ctx, "mem://")
	require.NoError(t, err)
	defer base.Close()
	c := instrument.Wrap(base.Driver())
	err = base.WithDriver(c).Put(ctx, "k", 10, strings.NewReader("short"), backend.PutOptions{})
	assert.ErrorIs(t, err, backend.ErrSizeMismatch)
	assert.Equal(t, int64(1), c.Count(instrument.OpPut))
	assert.Equal(t, int64(5), c.BytesWritten())
}

func TestConcurrentUse(t *testing.T) {
	ctx := context.Background()
	base, err := backend.Open(ctx, "mem://")
	require.NoError(t, err)
	defer base.Close()
	c := instrument.Wrap(base.Driver())
	s := base.WithDriver(c)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			key := fmt.Sprintf("k%d", i)
			for range 25 {
				assert.NoError(t, s.PutBytes(ctx, key, []byte("abcd"), backend.PutOptions{}))
				rc, err := s.NewRangeReader(ctx, key, 0, -1)
				if assert.NoError(t, err) {
					_, _ = io.Copy(io.Discard, rc)
					_ = rc.Close()
				}
			}
		})
	}
	wg.Wait()
	assert.Equal(t, int64(200), c.Count(instrument.OpPut))
	assert.Equal(t, int64(200), c.Count(instrument.OpRead))
	assert.Equal(t, int64(25), c.CountKey(instrument.OpRead, "k3"))
	assert.Equal(t, int64(800), c.BytesRead())
	assert.Equal(t, int64(800), c.BytesWritten())
}
