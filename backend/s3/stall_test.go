package s3_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/ckpterr"
	"github.com/ckptkit/ckptkit/internal/testkit/faultproxy"
)

const stallTimeout = 500 * time.Millisecond

// requireStalled checks err is the stall of a request on key of st:
// transient (never a cancellation), naming the object and the wait.
func requireStalled(t *testing.T, st *backend.Store, key string, err error) {
	t.Helper()
	require.ErrorIs(t, err, backend.ErrTransient)
	var se *backend.StallError
	require.ErrorAs(t, err, &se)
	assert.Equal(t, stallTimeout, se.Waited)
	assert.Equal(t, ckpterr.Transient, ckpterr.ClassOf(err))
	assert.NotErrorIs(t, err, context.Canceled)
	assert.Contains(t, err.Error(), st.URL(key))
	assert.Contains(t, err.Error(), "no progress for 500ms")
}

// Issue 30 item 2: a request the server accepts and never answers (a
// stopped server) fails after the stall timeout as transient, retried
// under the policy: each request of a write, a read and a part of a
// multipart upload is sent RetryPolicy.Attempts times, then the call fails
// naming the object and how long it waited; the multipart upload is
// aborted. A stall once is survived.
func TestStalledRequestsFailAsTransient(t *testing.T) {
	ctx := context.Background()
	st, p := proxiedStore(t, "part_size", "5MiB", "multipart_threshold", "5MiB", "concurrency", "1")
	st = st.WithStallTimeout(stallTimeout)
	require.NoError(t, st.PutBytes(ctx, "there", []byte("hello"), backend.PutOptions{}))

	put := p.Add(&faultproxy.Rule{Match: isPutOf("small"), Break: faultproxy.Stall})
	start := time.Now()
	err := st.PutBytes(ctx, "small", []byte("hello"), backend.PutOptions{})
	t.Logf("stalled PUT failed after %s: %v", time.Since(start).Round(time.Millisecond), err)
	requireStalled(t, st, "small", err)
	assert.Equal(t, retryPolicy.Attempts, p.Count(put), "PUTs at the proxy")

	get := p.Add(&faultproxy.Rule{Match: isGetOf("there"), Break: faultproxy.Stall})
	_, err = st.ReadAll(ctx, "there", 0)
	requireStalled(t, st, "there", err)
	assert.Equal(t, retryPolicy.Attempts, p.Count(get), "GETs at the proxy")

	part := p.Add(&faultproxy.Rule{Match: isPart("2"), Break: faultproxy.Stall})
	err = st.PutBytes(ctx, "big", randomBytes(12<<20), backend.PutOptions{})
	requireStalled(t, st, "big", err)
	assert.Equal(t, retryPolicy.Attempts, p.Count(part), "UploadPart requests of part 2")
	p.Clear()
	ok, err := st.Exists(ctx, "big")
	require.NoError(t, err)
	assert.False(t, ok, "a failed upload publishes nothing")
	noIncompleteUploads(t, st)

	once := p.Add(&faultproxy.Rule{Match: isPart("2"), Fail: func(n int) bool { return n == 0 }, Break: faultproxy.Stall})
	data := randomBytes(12 << 20)
	require.NoError(t, st.PutBytes(ctx, "big", data, backend.PutOptions{}))
	assert.Equal(t, 2, p.Count(once))
	got, err := st.ReadAll(ctx, "big", 0)
	require.NoError(t, err)
	assert.True(t, bytes.Equal(data, got))
}

// slowSource yields its bytes with a pause longer than the stall timeout
// in the middle: the caller's own time.
type slowSource struct {
	r      *bytes.Reader
	paused bool
}

func (s *slowSource) Read(p []byte) (int, error) {
	if !s.paused && int64(s.r.Len()) < s.r.Size()/2 {
		s.paused = true
		time.Sleep(3 * stallTimeout)
	}
	return s.r.Read(p[:min(len(p), 4096)])
}

// The caller's own time is not a stall: a source that pauses while the
// request body is sent, and a reader that pauses between reads of the
// response body, take longer than the stall timeout without failing.
func TestSlowCallerIsNotAStall(t *testing.T) {
	ctx := context.Background()
	st := openStore(t).WithStallTimeout(stallTimeout)
	data := randomBytes(1 << 20)
	require.NoError(t, st.Put(ctx, "k", int64(len(data)), &slowSource{r: bytes.NewReader(data)}, backend.PutOptions{}))
	rc, err := st.NewRangeReader(ctx, "k", 0, -1)
	require.NoError(t, err)
	defer rc.Close()
	head := make([]byte, 1000)
	_, err = io.ReadFull(rc, head)
	require.NoError(t, err)
	time.Sleep(3 * stallTimeout)
	rest, err := io.ReadAll(rc)
	require.NoError(t, err)
	assert.True(t, bytes.Equal(data, append(head, rest...)))
}

// isStatOf matches the HEAD requests of key.
func isStatOf(key string) func(*http.Request) bool {
	return func(r *http.Request) bool {
		return r.Method == http.MethodHead && len(r.URL.Path) > len(key) && r.URL.Path[len(r.URL.Path)-len(key)-1:] == "/"+key
	}
}

// A stall timeout of 0 turns the deadline off: a request held back
// longer than any deadline the test would set still succeeds.
func TestStallTimeoutOff(t *testing.T) {
	ctx := context.Background()
	st, p := proxiedStore(t)
	require.NoError(t, st.PutBytes(ctx, "k", []byte("v"), backend.PutOptions{}))
	p.Add(&faultproxy.Rule{Match: isStatOf("k"), Fail: func(int) bool { return false }, Delay: 3 * stallTimeout})
	_, err := st.WithStallTimeout(stallTimeout).Stat(ctx, "k")
	requireStalled(t, st, "k", err)
	_, err = st.WithStallTimeout(0).Stat(ctx, "k")
	require.NoError(t, err)
}
