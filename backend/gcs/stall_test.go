package gcs_test

import (
	"bytes"
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/ckpterr"
	"github.com/ckptkit/ckptkit/internal/testkit/faultproxy"
	"github.com/ckptkit/ckptkit/internal/testkit/storetest"
)

// Issue 30 item 2 on GCS: an upload request the emulator accepts and never
// answers fails after the stall timeout as transient, naming the object
// and the wait, and is retried under the policy: RetryPolicy.Attempts
// requests, every session cancelled and its marker removed. A read that
// stalls once is survived.
func TestStalledRequestsFailAsTransient(t *testing.T) {
	const stallTimeout = 500 * time.Millisecond
	ctx := context.Background()
	st, p := proxiedStore(t, "chunk_size", "256KiB")
	st = st.WithStallTimeout(stallTimeout)
	data := bytes.Repeat([]byte("0123456789abcdef"), 40<<10) // 640 KiB: resumable
	require.NoError(t, st.PutBytes(ctx, "there", data, backend.PutOptions{}))

	chunks := p.Add(&faultproxy.Rule{Match: func(r *http.Request) bool { return isSessionRequest(r) && r.Method != http.MethodDelete },
		Break: faultproxy.Stall})
	start := time.Now()
	err := st.PutBytes(ctx, "big", data, backend.PutOptions{})
	t.Logf("stalled upload failed after %s: %v", time.Since(start).Round(time.Millisecond), err)
	require.ErrorIs(t, err, backend.ErrTransient)
	var se *backend.StallError
	require.ErrorAs(t, err, &se)
	assert.Equal(t, stallTimeout, se.Waited)
	assert.Equal(t, ckpterr.Transient, ckpterr.ClassOf(err))
	assert.NotErrorIs(t, err, context.Canceled)
	assert.Contains(t, err.Error(), st.URL("big"))
	assert.Contains(t, err.Error(), "no progress for 500ms")
	assert.NotRegexp(t, "upload_id=[0-9a-f]", err.Error(), "the session URI is a credential")
	assert.Equal(t, retryPolicy.Attempts, p.Count(chunks), "chunk requests at the proxy")
	p.Clear()
	ok, err := st.Exists(ctx, "big")
	require.NoError(t, err)
	assert.False(t, ok, "a failed upload publishes nothing")
	assert.Empty(t, storetest.Uploads(t, st), "no session marker left")

	get := p.Add(&faultproxy.Rule{Match: isDownloadOf(st, "there"), Fail: func(n int) bool { return n == 0 }, Break: faultproxy.Stall})
	got, err := st.ReadAll(ctx, "there", -1)
	require.NoError(t, err)
	assert.Equal(t, data, got)
	assert.Equal(t, 2, p.Count(get))
}
