package s3_test

import (
	"bytes"
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/internal/detbytes"
	"github.com/ckptkit/ckptkit/internal/testkit/faultproxy"
)

// slowDown is the S3 error a throttled request gets.
const slowDown = `<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>`

// retryPolicy is the policy of the retry tests: 4 tries in all, fast.
var retryPolicy = backend.RetryPolicy{Attempts: 4, BaseDelay: time.Millisecond, MaxDelay: 5 * time.Millisecond}

// proxiedStore opens a scratch store on the S3 test server through a
// fault-injecting proxy; kv are extra URL parameters.
func proxiedStore(t *testing.T, kv ...string) (*backend.Store, *faultproxy.Proxy) {
	t.Helper()
	u, err := url.Parse(testURL(t))
	require.NoError(t, err)
	p, err := faultproxy.New("http://" + u.Query().Get("endpoint"))
	require.NoError(t, err)
	t.Cleanup(p.Close)
	st := openStoreAt(t, withParams(t, u.String(), "endpoint", p.Host()), kv...)
	t.Cleanup(p.Clear) // runs before the scratch clean-up, which must pass
	return st.WithRetry(retryPolicy), p
}

// isPart matches the UploadPart requests of part n.
func isPart(n string) func(*http.Request) bool {
	return func(r *http.Request) bool {
		q := r.URL.Query()
		return r.Method == http.MethodPut && q.Has("uploadId") && q.Get("partNumber") == n
	}
}

func isCreateUpload(r *http.Request) bool {
	return r.Method == http.MethodPost && r.URL.Query().Has("uploads")
}

func isPutOf(key string) func(*http.Request) bool {
	return func(r *http.Request) bool {
		return r.Method == http.MethodPut && strings.HasSuffix(r.URL.Path, "/"+key) && !r.URL.Query().Has("uploadId")
	}
}

// A throttled single PUT is sent RetryPolicy.Attempts times in all: the
// Store retries, minio-go does not retry under it.
func TestRetrySinglePutTriedAttemptsTimes(t *testing.T) {
	st, p := proxiedStore(t)
	rule := p.Add(&faultproxy.Rule{Match: isPutOf("small"), Status: http.StatusServiceUnavailable, Body: slowDown})
	err := st.PutBytes(context.Background(), "small", []byte("hello"), backend.PutOptions{})
	require.ErrorIs(t, err, backend.ErrTransient)
	assert.Equal(t, retryPolicy.Attempts, p.Count(rule), "PUT requests at the server")
}

// Regression (issue 12 item 6): a part that keeps failing was tried 3
// times per Store attempt, 4 attempts: 12 requests and 4 uploads. Part
// retries now draw from the Store's budget: 4 requests, one upload, and
// the Store does not start the upload again.
func TestRetryFailingPartTriedAttemptsTimesInAll(t *testing.T) {
	st, p := proxiedStore(t, "part_size", "5MiB", "multipart_threshold", "5MiB", "concurrency", "1")
	part2 := p.Add(&faultproxy.Rule{Match: isPart("2"), Status: http.StatusServiceUnavailable, Body: slowDown})
	creates := p.Add(&faultproxy.Rule{Match: isCreateUpload, Fail: func(int) bool { return false }})
	data := randomBytes(12 << 20)
	err := st.PutBytes(context.Background(), "big", data, backend.PutOptions{})
	require.ErrorIs(t, err, backend.ErrTransient)
	assert.Equal(t, retryPolicy.Attempts, p.Count(part2), "UploadPart requests of part 2 at the server")
	assert.Equal(t, 1, p.Count(creates), "multipart uploads started")
	p.Clear()
	ok, err := st.Exists(context.Background(), "big")
	require.NoError(t, err)
	assert.False(t, ok, "a failed upload publishes nothing")
	noIncompleteUploads(t, st)
}

// A part that fails transiently twice is retried as a part: the upload
// is not restarted, and the object is complete.
func TestRetryPartRecoversWithoutRestartingTheUpload(t *testing.T) {
	st, p := proxiedStore(t, "part_size", "5MiB", "multipart_threshold", "5MiB", "concurrency", "1")
	part2 := p.Add(&faultproxy.Rule{Match: isPart("2"), Fail: func(n int) bool { return n < 2 }, Status: http.StatusServiceUnavailable, Body: slowDown})
	creates := p.Add(&faultproxy.Rule{Match: isCreateUpload, Fail: func(int) bool { return false }})
	data := randomBytes(12 << 20)
	ctx := context.Background()
	// A non-rewindable body: only the part retries can save it.
	require.NoError(t, st.Put(ctx, "big", int64(len(data)), struct{ *bytes.Reader }{bytes.NewReader(data)}, backend.PutOptions{}))
	assert.Equal(t, 3, p.Count(part2), "UploadPart requests of part 2")
	assert.Equal(t, 1, p.Count(creates), "multipart uploads started")
	got, err := st.ReadAll(ctx, "big", 0)
	require.NoError(t, err)
	assert.True(t, bytes.Equal(data, got), "object reads back")
}

func randomBytes(n int) []byte { return detbytes.Bytes(7, n) }

// Regression (found by TestInterruptedCopyLeavesNothing under load): a
// cancellation that arrived after the server created a multipart upload but
// before its reply left an upload nobody knew the ID of, so nobody aborted
// it. The upload is now started on a context the caller cannot cancel.
func TestCancelWhileStartingAnUploadLeavesNone(t *testing.T) {
	st, p := proxiedStore(t, "part_size", "5MiB", "multipart_threshold", "5MiB")
	seen := make(chan struct{}, 1)
	p.Add(&faultproxy.Rule{Match: isCreateUpload, Fail: func(int) bool { return false }, Delay: 300 * time.Millisecond, Seen: seen})
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-seen; cancel() }()
	err := st.PutBytes(ctx, "big", randomBytes(12<<20), backend.PutOptions{})
	require.ErrorIs(t, err, context.Canceled)
	p.Clear()
	noIncompleteUploads(t, st)
	ok, err := st.Exists(context.Background(), "big")
	require.NoError(t, err)
	assert.False(t, ok)
}
