package transfer_test

import (
	"context"
	"errors"
	"io"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/progress"
	"github.com/ckptkit/ckptkit/transfer"
)

var errDiskFull = errors.New("disk full")

// failNth is a driver whose n-th data-object Put (from 1) fails after
// reading its body, the others succeed.
type failNth struct {
	backend.Driver
	n    int32
	puts atomic.Int32
}

func (f *failNth) Put(ctx context.Context, key string, size int64, r io.Reader, opts backend.PutOptions) error {
	if strings.HasSuffix(key, ".data") && f.puts.Add(1) == f.n {
		_, _ = io.Copy(io.Discard, r)
		return errDiskFull
	}
	return f.Driver.Put(ctx, key, size, r, opts)
}

// A copy that fails midway removes the data objects it completed and says
// how far it got; the destination holds nothing.
func TestFailedCopyRemovesWhatItCopied(t *testing.T) {
	src := memStore(t)
	saved(t, src)
	dst := memStore(t)
	dst = dst.WithDriver(&failNth{Driver: dst.Driver(), n: 3})
	_, err := transfer.Copy(context.Background(), src, dst, transfer.Options{Parallel: 1})
	require.ErrorIs(t, err, errDiskFull)
	assert.Contains(t, err.Error(), "stopped after 2 of 3 data objects")
	assert.Contains(t, err.Error(), "the 2 copied data object(s) were removed")
	var left []string
	require.NoError(t, dst.List(context.Background(), "", func(o backend.ObjectInfo) error { left = append(left, o.Key); return nil }))
	assert.Empty(t, left)
}

// A cancelled copy says so, and leaves nothing either.
func TestCancelledCopyLeavesNothing(t *testing.T) {
	src := memStore(t)
	saved(t, src)
	dst := memStore(t)
	ctx, cancel := context.WithCancel(context.Background())
	var n atomic.Int64
	_, err := transfer.Copy(ctx, src, dst, transfer.Options{Parallel: 1, Progress: func(progress.Update) {
		if n.Add(1) == 2 {
			cancel()
		}
	}})
	require.ErrorIs(t, err, context.Canceled)
	assert.Contains(t, err.Error(), "the destination has no committed checkpoint")
	var left []string
	require.NoError(t, dst.List(context.Background(), "", func(o backend.ObjectInfo) error { left = append(left, o.Key); return nil }))
	assert.Empty(t, left)
}
