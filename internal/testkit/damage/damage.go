// Package damage damages stored checkpoints the way faulty storage does,
// for the tests of what must notice it (the conformance suite, the run's
// fallback tests). It sits low in the stack so that the conformance suite
// can use it.
package damage

import (
	"context"
	"fmt"
	"strings"

	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/loader"
)

// T is what the helpers need of a test: *testing.T and conformance.T
// implement it.
type T interface {
	require.TestingT
	Helper()
}

// FlipRankData flips a byte in the middle of rank's first data object of
// the checkpoint at st, keeping its size: the metadata still verifies, only
// reading the data (a load, a deep verify) finds it.
func FlipRankData(t T, st *backend.Store, rank int) {
	t.Helper()
	ctx := context.Background()
	c, err := loader.Open(ctx, st)
	require.NoError(t, err)
	prefix := fmt.Sprintf("rank-%05d-", rank)
	for _, o := range c.Metadata().Objects {
		if !strings.HasPrefix(o.Key, prefix) {
			continue
		}
		data, err := st.ReadAll(ctx, o.Key, 0)
		require.NoError(t, err, "read %s", st.URL(o.Key))
		data[len(data)/2] ^= 0x40
		require.NoError(t, st.PutBytes(ctx, o.Key, data, backend.PutOptions{}), "rewrite %s", st.URL(o.Key))
		return
	}
	require.Fail(t, fmt.Sprintf("no data object of rank %d (%s*) in %s", rank, prefix, st))
}
