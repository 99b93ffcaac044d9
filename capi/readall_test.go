package main

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/backend/instrument"
	"github.com/ckptkit/ckptkit/internal/testkit/ckpttest"
)

// ckpt_read_all with an offset (Python's Store.read(key, offset)) is
// Store.ReadAllFrom: one ranged read that transfers only the bytes from the
// offset on, on every backend.
func TestReadAllFromTransfersOnlyFromTheOffset(t *testing.T) {
	ctx := context.Background()
	data := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	for _, b := range ckpttest.BackendsWithGCS(t) {
		t.Run(b.Name, func(t *testing.T) {
			st := b.Open(t)
			require.NoError(t, st.PutBytes(ctx, "obj", data, backend.PutOptions{}))
			cnt := instrument.Wrap(st.Driver())
			st = st.WithDriver(cnt)
			for _, off := range []int64{0, 1, 1000, int64(len(data)) - 1, int64(len(data))} {
				cnt.Reset()
				got, err := st.ReadAllFrom(ctx, "obj", off, 0)
				require.NoError(t, err, "offset %d", off)
				assert.Equal(t, data[off:], got, "offset %d", off)
				assert.Equal(t, int64(len(data))-off, cnt.BytesRead(), "bytes transferred from offset %d", off)
			}
			// Past the end: nothing, as Python's data[offset:] gives.
			got, err := st.ReadAllFrom(ctx, "obj", int64(len(data))+1, 0)
			require.NoError(t, err)
			assert.Empty(t, got)
		})
	}
}
