package bufpool_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/internal/bufpool"
)

func TestBoundedPoolBlocksAtItsBoundAndReuses(t *testing.T) {
	p := bufpool.NewBounded(1024, 2)
	ctx := context.Background()
	a, err := p.Get(ctx, 1024)
	require.NoError(t, err)
	b, err := p.Get(ctx, 10)
	require.NoError(t, err)
	assert.Len(t, b, 10)
	assert.Equal(t, 1024, cap(b))

	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	_, err = p.Get(short, 1024)
	require.ErrorIs(t, err, context.DeadlineExceeded, "a third buffer waits for one to come back")

	a[0] = 42
	p.Put(a)
	c, err := p.Get(ctx, 1024)
	require.NoError(t, err)
	assert.Equal(t, byte(42), c[0], "the returned buffer is reused")

	p.Forget() // b will not come back: another may be made
	d, err := p.Get(ctx, 1024)
	require.NoError(t, err)
	assert.Len(t, d, 1024)
}

func TestOversizedRequestsBypassThePool(t *testing.T) {
	p := bufpool.NewBounded(16, 1)
	ctx := context.Background()
	_, err := p.Get(ctx, 16)
	require.NoError(t, err)
	big, err := p.Get(ctx, 100) // does not wait for the bound
	require.NoError(t, err)
	assert.Len(t, big, 100)
	p.Put(big) // dropped, no slot freed
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	_, err = p.Get(short, 16)
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

func TestUnboundedPoolNeverBlocks(t *testing.T) {
	p := bufpool.New(64)
	ctx := context.Background()
	var bufs [][]byte
	for range 100 {
		b, err := p.Get(ctx, 64)
		require.NoError(t, err)
		bufs = append(bufs, b)
	}
	for _, b := range bufs {
		p.Put(b)
	}
	b, err := p.Get(ctx, 8)
	require.NoError(t, err)
	assert.Len(t, b, 8)
	assert.Equal(t, 64, cap(b))
}
