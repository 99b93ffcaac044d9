package memstore_test

import (
	"context"
	"strings"
	"testing"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/plugins/examples/memplugin/memstore"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestStoreInProcess(t *testing.T) {
	st, err := backend.NewStore(memstore.New(), "mem://t", "p")
	require.NoError(t, err)
	ctx := context.Background()
	require.NoError(t, st.PutBytes(ctx, "b", []byte("bee"), backend.PutOptions{}))
	require.NoError(t, st.PutBytes(ctx, "a", []byte("ay"), backend.PutOptions{IfNotExists: true}))
	assert.ErrorIs(t, st.PutBytes(ctx, "a", []byte("x"), backend.PutOptions{IfNotExists: true}), backend.ErrAlreadyExists)
	assert.ErrorIs(t, st.Put(ctx, "c", 5, strings.NewReader("abc"), backend.PutOptions{}), backend.ErrSizeMismatch)
	assert.ErrorIs(t, st.Put(ctx, "c", 2, strings.NewReader("abc"), backend.PutOptions{}), backend.ErrSizeMismatch)
	_, err = st.Stat(ctx, "c")
	assert.ErrorIs(t, err, backend.ErrNotFound)
	var keys []string
	require.NoError(t, st.List(ctx, "", func(o backend.ObjectInfo) error { keys = append(keys, o.Key); return nil }))
	assert.Equal(t, []string{"a", "b"}, keys)
	buf := make([]byte, 2)
	require.NoError(t, st.ReadRange(ctx, "b", 1, buf))
	assert.Equal(t, "ee", string(buf))

	cctx, cancel := context.WithCancel(ctx)
	cancel()
	err = st.PutBytes(cctx, "d", []byte("d"), backend.PutOptions{})
	assert.ErrorIs(t, err, context.Canceled)
	_, err = st.Stat(ctx, "d")
	assert.ErrorIs(t, err, backend.ErrNotFound)
}
