package gcs_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/internal/faultproxy"
)

// Regression (issue 16): a connection reset, a reset inside the response
// headers and a body cut short were not transient on GCS either. The
// first broken upload is retried. (Downloads are not proxied here: the
// emulator does not serve object reads through the proxy.)
func TestBrokenConnectionsAreRetried(t *testing.T) {
	for name, b := range map[string]faultproxy.Break{
		"reset":          faultproxy.Reset,
		"broken headers": faultproxy.BrokenHeaders,
		"cut body":       faultproxy.CutBody,
	} {
		t.Run(name, func(t *testing.T) {
			st, p := proxiedStore(t)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			data := bytes.Repeat([]byte("0123456789abcdef"), 4096)
			up := p.Add(&faultproxy.Rule{Match: isUpload, Fail: func(n int) bool { return n == 0 }, Break: b})
			require.NoError(t, st.PutBytes(ctx, "obj", data, backend.PutOptions{}), "a broken upload is retried")
			assert.GreaterOrEqual(t, p.Count(up), 2)
			a, err := st.Stat(ctx, "obj")
			require.NoError(t, err)
			assert.Equal(t, int64(len(data)), a.Size)
		})
	}
}
