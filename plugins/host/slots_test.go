package host_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/plugins/host"
)

// failAfter is a source that fails where its reader ends.
type failAfter struct {
	r io.Reader
}

func (f *failAfter) Read(p []byte) (int, error) {
	n, err := f.r.Read(p)
	if err == io.EOF {
		return n, errors.New("source broke")
	}
	return n, err
}

// TestFailedWritesReturnPutSlots: a write abandoned by a failing source
// publishes nothing, and its put slots return to the pool (in the
// background, once the plugin's handler returned), so two failed 32 MiB
// writes no longer strand all 8 slots.
func TestFailedWritesReturnPutSlots(t *testing.T) {
	skipWithoutShm(t)
	ps := discover(t, host.Config{Dir: pluginDir(t, "memplugin")})
	st := open(t, "memplug://strand/run")
	ctx := context.Background()
	for i := 0; i < 2; i++ {
		src := &failAfter{r: bytes.NewReader(randomBytes(13<<20, uint64(i)))}
		require.Error(t, st.Put(ctx, "broken", 32<<20, src, backend.PutOptions{}))
	}
	var free int
	require.Eventually(t, func() bool {
		var err error
		free, err = host.FreeSlots(ctx, ps[0])
		require.NoError(t, err)
		return free == 8
	}, 5*time.Second, 10*time.Millisecond)
	require.Equal(t, 8, free, "put slots stranded by failed writes")
	_, err := st.Stat(ctx, "broken")
	require.ErrorIs(t, err, backend.ErrNotFound)
	uses, err := host.UsesSharedMemory(ctx, ps[0])
	require.NoError(t, err)
	require.True(t, uses)
}

// TestCancelledWritesReturnPutSlots: writes cancelled mid-body return to
// the caller at once, publish nothing, and give their put slots back.
func TestCancelledWritesReturnPutSlots(t *testing.T) {
	skipWithoutShm(t)
	ps := discover(t, host.Config{Dir: pluginDir(t, "memplugin")})
	st := open(t, "memplug://strandc/run")
	ctx := context.Background()
	for i := 0; i < 3; i++ {
		cctx, cancel := context.WithCancel(ctx)
		src := &blockingSource{head: bytes.NewReader(randomBytes(13<<20, uint64(i))), ctx: cctx, release: make(chan struct{}), reached: make(chan struct{})}
		go func() { <-src.reached; cancel() }()
		start := time.Now()
		require.ErrorIs(t, st.Put(cctx, "cancelled", 32<<20, src, backend.PutOptions{}), context.Canceled)
		require.Less(t, time.Since(start), 2*time.Second)
		cancel()
	}
	require.Eventually(t, func() bool {
		free, err := host.FreeSlots(ctx, ps[0])
		require.NoError(t, err)
		return free == 8
	}, 5*time.Second, 10*time.Millisecond, "put slots stranded by cancelled writes")
	_, err := st.Stat(ctx, "cancelled")
	require.ErrorIs(t, err, backend.ErrNotFound)
	data := randomBytes(9<<20, 7)
	require.NoError(t, st.Put(ctx, "after", int64(len(data)), bytes.NewReader(data), backend.PutOptions{}))
	got, err := st.ReadAll(ctx, "after", 0)
	require.NoError(t, err)
	require.True(t, bytes.Equal(data, got))
}
