package mem_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gocloud.dev/gcerrors"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/backend/instrument"
	"github.com/ckptkit/ckptkit/backend/mem"
	"github.com/ckptkit/ckptkit/internal/testkit/storetest"
)

func TestNamedBucketsAreShared(t *testing.T) {
	ctx := context.Background()
	t.Cleanup(func() { mem.Reset("shared") })
	a := storetest.Open(t, "mem://shared/run1")
	require.NoError(t, a.PutBytes(ctx, "k", []byte("saved"), backend.PutOptions{}))

	b := storetest.Open(t, "mem://shared/run1")
	got, err := b.ReadAll(ctx, "k", 0)
	require.NoError(t, err)
	assert.Equal(t, "saved", string(got))

	// The URL path is the prefix: the whole bucket sees run1/k.
	whole := storetest.Open(t, "mem://shared")
	got, err = whole.ReadAll(ctx, "run1/k", 0)
	require.NoError(t, err)
	assert.Equal(t, "saved", string(got))

	// Closing a store does not drop a named bucket.
	require.NoError(t, a.Close())
	got, err = storetest.Open(t, "mem://shared/run1").ReadAll(ctx, "k", 0)
	require.NoError(t, err)
	assert.Equal(t, "saved", string(got))

	other := storetest.Open(t, "mem://other/run1")
	_, err = other.Stat(ctx, "k")
	assert.ErrorIs(t, err, backend.ErrNotFound)
	mem.Reset("other")
}

func TestAnonymousBucketsAreFresh(t *testing.T) {
	ctx := context.Background()
	a := storetest.Open(t, "mem://")
	require.NoError(t, a.PutBytes(ctx, "k", []byte("x"), backend.PutOptions{}))
	b := storetest.Open(t, "mem://")
	_, err := b.Stat(ctx, "k")
	assert.ErrorIs(t, err, backend.ErrNotFound)
}

func TestReset(t *testing.T) {
	ctx := context.Background()
	a := storetest.Open(t, "mem://resetme")
	require.NoError(t, a.PutBytes(ctx, "k", []byte("x"), backend.PutOptions{}))
	mem.Reset("resetme")
	t.Cleanup(func() { mem.Reset("resetme") })
	b := storetest.Open(t, "mem://resetme")
	_, err := b.Stat(ctx, "k")
	assert.ErrorIs(t, err, backend.ErrNotFound)
}

func TestURLPrefix(t *testing.T) {
	ctx := context.Background()
	t.Cleanup(func() { mem.Reset("pfx") })
	s := storetest.Open(t, "mem://pfx/a/b/")
	assert.Equal(t, "a/b/", s.Prefix())
	assert.Equal(t, "mem://pfx/a/b", s.String())
	c := instrument.Wrap(s.Driver())
	require.NoError(t, s.WithDriver(c).PutBytes(ctx, "k", []byte("x"), backend.PutOptions{}))
	assert.Equal(t, int64(1), c.CountKey(instrument.OpPut, "a/b/k"))

	_, err := backend.Open(ctx, "mem://pfx/../up")
	assert.ErrorIs(t, err, backend.ErrInvalidKey)
}

func TestErrorCode(t *testing.T) {
	d := mem.New()
	defer d.Close()
	ctx := context.Background()
	_, err := d.Stat(ctx, "missing")
	require.Error(t, err)
	assert.Equal(t, gcerrors.NotFound, gcerrors.Code(err))
	assert.Equal(t, backend.CodeNotFound, d.ErrorCode(err))
	_, err = d.NewRangeReader(ctx, "missing", 0, -1)
	assert.Equal(t, backend.CodeNotFound, d.ErrorCode(err))
	assert.Equal(t, backend.CodeCanceled, d.ErrorCode(context.Canceled))
	assert.Equal(t, backend.CodeAlreadyExists, d.ErrorCode(backend.ErrAlreadyExists))
	// Keys that are not UTF-8 are refused by the bucket.
	_, err = d.Stat(ctx, "\xff")
	assert.Equal(t, backend.CodeInvalidKey, d.ErrorCode(err))
}
