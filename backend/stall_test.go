package backend_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/ckpterr"
)

// The stall timeout comes from the URL option stall_timeout, else
// CKPTKIT_STALL_TIMEOUT, else the default; the option is the Store's (no
// driver sees it), it stays in the URLs the store prints, and a malformed
// value is a usage error.
func TestStallTimeoutFromURLAndEnvironment(t *testing.T) {
	ctx := context.Background()
	t.Setenv(backend.StallTimeoutEnv, "")
	st, err := backend.Open(ctx, "mem://stall/run")
	require.NoError(t, err)
	assert.Equal(t, backend.DefaultStallTimeout, st.StallTimeout())

	t.Setenv(backend.StallTimeoutEnv, "7s")
	st, err = backend.Open(ctx, "mem://stall/run")
	require.NoError(t, err)
	assert.Equal(t, 7*time.Second, st.StallTimeout())

	st, err = backend.Open(ctx, "mem://stall/run?stall_timeout=1500ms")
	require.NoError(t, err, "the mem driver, which takes no options, never sees it")
	assert.Equal(t, 1500*time.Millisecond, st.StallTimeout(), "the URL wins over the environment")
	assert.Equal(t, "mem://stall/run/k?stall_timeout=1500ms", st.URL("k"), "printed URLs reopen alike")
	again, err := backend.Open(ctx, st.URL("k"))
	require.NoError(t, err)
	assert.Equal(t, 1500*time.Millisecond, again.StallTimeout())

	st, err = backend.Open(ctx, "mem://stall/run?stall_timeout=0")
	require.NoError(t, err)
	assert.Zero(t, st.StallTimeout(), "0 turns the deadline off")
	assert.Equal(t, 2*time.Second, st.WithStallTimeout(2*time.Second).StallTimeout())

	for _, bad := range []string{"mem://stall/run?stall_timeout=soon", "mem://stall/run?stall_timeout=-1s"} {
		_, err = backend.Open(ctx, bad)
		require.Error(t, err, bad)
		assert.Equal(t, ckpterr.Usage, ckpterr.ClassOf(err), "%v", err)
		assert.Contains(t, err.Error(), "stall_timeout")
	}
	t.Setenv(backend.StallTimeoutEnv, "never")
	_, err = backend.Open(ctx, "mem://stall/run")
	require.Error(t, err)
	assert.Equal(t, ckpterr.Usage, ckpterr.ClassOf(err), "%v", err)
	assert.Contains(t, err.Error(), backend.StallTimeoutEnv)
}

// A StallError is transient (retried, exit code 5), never a cancellation.
func TestStallErrorIsTransient(t *testing.T) {
	err := error(&backend.StallError{Request: "PUT http://host/bucket/key", Waiting: "waiting for the response", Waited: 2 * time.Second})
	assert.ErrorIs(t, err, backend.ErrTransient)
	assert.Equal(t, ckpterr.Transient, ckpterr.ClassOf(err))
	assert.Equal(t, backend.CodeTransient, backend.CodeOf(err))
	assert.Contains(t, err.Error(), "storage stalled: no progress for 2s while waiting for the response")
}
